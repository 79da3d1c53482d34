//! The `etcd` driver: nodes on many hosts share an etcd cluster.
//!
//! ```text
//! PREFIX/cluster_id              created once, in a transaction (create if absent)
//! PREFIX/nodes/<id, 16 hex>      a live node's NodeInfo (JSON), bound to the node's lease
//! PREFIX/epoch                   the newest epoch number (decimal)
//! PREFIX/epochs/<epoch, 10 dec>  one View (JSON) per epoch, written once
//! PREFIX/kv/<key>                the key-value store (format, VDI table, locks, recovery records)
//! ```
//!
//! - **Liveness** is the node's lease (TTL `--lease-ttl`, default 5 s), renewed every third of
//!   the TTL over one keepalive stream. A node that stops renewing (killed, hung, cut off) loses
//!   its lease; etcd deletes its `nodes/` key.
//! - **Epochs** are made by whichever live node first sees the `nodes/` set differ from the
//!   newest view: a watch on `PREFIX/` tells every node at once, and each tries one
//!   transaction "if `epoch` is still N: `epoch` = N+1, `epochs/N+1` = the view". One wins; the
//!   others read its result. Two nodes never make two epochs with one number.
//! - **Compare-and-swap** of the key-value store is one transaction (compare the value, or the
//!   key's version 0 for "absent"), so two hosts never create one VDI name twice.
//! - **Fencing**: [`Driver::member_until`] is the send time of the newest renewal etcd
//!   confirmed plus the TTL. etcd drops the lease no sooner than that, so until then no epoch
//!   without this node exists; past it the node serves no I/O (no split brain).
//! - Calls come from the node's blocking threads. The driver owns a small tokio runtime on its
//!   own thread (the gRPC client, the keepalive and watch tasks live there); each call is
//!   handed to it and waited for, bounded by [`CALL_TIMEOUT`].

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, GetOptions, PutOptions, Txn, TxnOp, WatchOptions,
};
use tokio::sync::watch;

use super::{Driver, DriverError, DriverOptions};
use objstore_proto::view::{NodeInfo, View};

/// The longest a single call (a read, a transaction, a lease grant) may take.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(3);
/// Pause before opening a watch or keepalive stream again after it failed.
const RETRY: Duration = Duration::from_millis(500);

/// `etcd://HOST:PORT[,HOST:PORT...][/PREFIX]` without its scheme.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdSpec {
    /// `http://HOST:PORT` for each member given.
    pub endpoints: Vec<String>,
    /// Every key of this cluster starts with it; `/sheep` when none is given.
    pub prefix: String,
}

impl EtcdSpec {
    pub fn parse(rest: &str) -> Result<EtcdSpec, DriverError> {
        let bad = || DriverError::UnknownDriver(format!("etcd://{rest}"));
        let (hosts, prefix) = match rest.split_once('/') {
            Some((h, p)) => (h, format!("/{}", p.trim_matches('/'))),
            None => (rest, "/sheep".to_string()),
        };
        if prefix == "/" || hosts.is_empty() {
            return Err(bad());
        }
        let mut endpoints = Vec::new();
        for h in hosts.split(',') {
            let (host, port) = h.rsplit_once(':').ok_or_else(bad)?;
            if host.is_empty() || port.parse::<u16>().is_err() {
                return Err(bad());
            }
            endpoints.push(format!("http://{h}"));
        }
        Ok(EtcdSpec { endpoints, prefix })
    }
}

/// What the node's tasks and its calls share.
struct Inner {
    /// One client per endpoint: the balanced channel of one client for all keeps sending some
    /// calls to a dead member. A call that could not reach `clients[current]` moves on to the
    /// next ([`is_unsent`]).
    clients: Vec<Client>,
    current: AtomicUsize,
    prefix: String,
    /// For messages: the endpoints as given.
    endpoints: String,
    ttl: Duration,
    /// Instants are kept as milliseconds since this one (atomics).
    base: Instant,
    /// [`Driver::member_until`] in ms since `base`, once `joined`.
    until_ms: AtomicU64,
    joined: AtomicBool,
    /// etcd answered the newest keepalive (for logging transitions once).
    reachable: AtomicBool,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    me: Option<NodeInfo>,
    /// This node's lease while it is a member.
    lease: Option<i64>,
    /// etcd said the lease ended: the next tick joins again.
    lease_lost: bool,
    /// The newest view seen.
    view: View,
    /// Stops the tasks of the current lease.
    stop_lease: Option<watch::Sender<bool>>,
}

pub struct EtcdDriver {
    inner: Arc<Inner>,
    rt: tokio::runtime::Handle,
    /// Dropping it ends the runtime thread (and every task: a dropped driver stops renewing).
    _stop: tokio::sync::oneshot::Sender<()>,
    watch_started: AtomicBool,
}

fn unreachable(endpoints: &str, reason: impl ToString) -> DriverError {
    DriverError::Unreachable {
        endpoints: endpoints.to_string(),
        reason: reason.to_string(),
    }
}

/// A call that never reached a working member (connection refused, no leader there): nothing
/// was applied, so it is safe to send again to another member.
fn is_unsent(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::TransportError(_) => true,
        etcd_client::Error::GRpcStatus(s) if s.code() == tonic::Code::Unavailable => {
            let m = s.message();
            m.contains("connect") || m.contains("no leader") || m.contains("not capable")
        }
        _ => false,
    }
}

/// Errors of the store itself (not of reaching it) that a caller can act on.
fn is_lease_not_found(e: &etcd_client::Error) -> bool {
    let m = e.to_string();
    m.contains("requested lease not found") || m.contains("lease not found")
}

impl Inner {
    /// The client of the member in use.
    fn client(&self) -> Client {
        self.clients[self.current.load(Ordering::SeqCst) % self.clients.len()].clone()
    }

    /// Moves on to the next member after `from` failed (unless another call already did).
    fn rotate(&self, from: usize) {
        let _ = self.current.compare_exchange(
            from,
            (from + 1) % self.clients.len(),
            Ordering::SeqCst,
            Ordering::SeqCst,
        );
    }

    fn key(&self, rel: &str) -> String {
        format!("{}/{rel}", self.prefix)
    }

    fn err(&self, e: etcd_client::Error) -> DriverError {
        match &e {
            etcd_client::Error::GRpcStatus(s)
                if matches!(
                    s.code(),
                    tonic::Code::InvalidArgument | tonic::Code::ResourceExhausted
                ) =>
            {
                DriverError::Refused {
                    endpoints: self.endpoints.clone(),
                    op: "a request",
                    reason: s.message().to_string(),
                }
            }
            _ => unreachable(&self.endpoints, e),
        }
    }

    fn now_ms(&self) -> u64 {
        self.base.elapsed().as_millis() as u64
    }

    /// Notes a confirmed renewal sent at `sent` (ms since base) for `ttl_s` seconds.
    fn renewed(&self, sent: u64, ttl_s: i64) {
        let until = sent + (ttl_s.max(0) as u64) * 1000;
        self.until_ms.fetch_max(until, Ordering::SeqCst);
        self.joined.store(true, Ordering::SeqCst);
        if !self.reachable.swap(true, Ordering::SeqCst) {
            tracing::info!(
                "etcd {}: reachable again; membership lease renewed",
                self.endpoints
            );
        }
    }

    fn unreachable_now(&self, why: &str) {
        if self.reachable.swap(false, Ordering::SeqCst) {
            let left = self
                .until_ms
                .load(Ordering::SeqCst)
                .saturating_sub(self.now_ms());
            tracing::warn!(
                "etcd {} unreachable ({why}): membership changes wait; this node serves I/O for {} ms more (its lease), then only once etcd answers again",
                self.endpoints,
                left
            );
        }
    }

    async fn get_view(&self, epoch: u32, rev: i64) -> Result<View, etcd_client::Error> {
        if epoch == 0 {
            return Ok(View::default());
        }
        let opts = (rev > 0).then(|| GetOptions::new().with_revision(rev));
        let resp = self
            .client()
            .kv_client()
            .get(self.key(&format!("epochs/{epoch:010}")), opts)
            .await?;
        match resp.kvs().first() {
            Some(kv) => serde_json::from_slice(kv.value()).map_err(|e| {
                etcd_client::Error::InvalidArgs(format!("epoch {epoch} holds a bad view: {e}"))
            }),
            None => Err(etcd_client::Error::InvalidArgs(format!(
                "epoch {epoch} is named by {}/epoch but missing",
                self.prefix
            ))),
        }
    }

    /// Reads the live node set and the newest view at one revision; makes the next epoch when
    /// they differ (one transaction, retried a few times against other nodes doing the same).
    async fn reconcile(&self) -> Result<View, etcd_client::Error> {
        let mut kv = self.client().kv_client();
        for _ in 0..16 {
            let nodes = kv
                .get(self.key("nodes/"), Some(GetOptions::new().with_prefix()))
                .await?;
            let rev = nodes.header().map(|h| h.revision()).unwrap_or(0);
            let mut live: Vec<NodeInfo> = Vec::new();
            for n in nodes.kvs() {
                match serde_json::from_slice(n.value()) {
                    Ok(info) => live.push(info),
                    Err(e) => tracing::warn!(
                        "etcd: ignoring a bad node record {}: {e}",
                        String::from_utf8_lossy(n.key())
                    ),
                }
            }
            live.sort_by_key(|n| n.id);
            let ep = kv
                .get(
                    self.key("epoch"),
                    Some(GetOptions::new().with_revision(rev)),
                )
                .await?;
            let (cur_epoch, cur_raw) = match ep.kvs().first() {
                Some(kv) => {
                    let s = String::from_utf8_lossy(kv.value()).to_string();
                    let n = s.trim().parse::<u32>().map_err(|_| {
                        etcd_client::Error::InvalidArgs(format!(
                            "{}/epoch holds {s:?}, not an epoch number",
                            self.prefix
                        ))
                    })?;
                    (n, Some(s))
                }
                None => (0, None),
            };
            let cur = self.get_view(cur_epoch, rev).await?;
            if cur.nodes == live {
                self.adopt(&cur);
                return Ok(cur);
            }
            let next = View {
                epoch: cur_epoch + 1,
                nodes: live,
            };
            let cmp = match &cur_raw {
                Some(raw) => Compare::value(self.key("epoch"), CompareOp::Equal, raw.as_bytes()),
                None => Compare::version(self.key("epoch"), CompareOp::Equal, 0),
            };
            let txn = Txn::new().when([cmp]).and_then([
                TxnOp::put(self.key("epoch"), next.epoch.to_string(), None),
                TxnOp::put(
                    self.key(&format!("epochs/{:010}", next.epoch)),
                    serde_json::to_vec_pretty(&next).expect("serializable"),
                    None,
                ),
            ]);
            if kv.txn(txn).await?.succeeded() {
                tracing::info!(
                    "membership (etcd): epoch {} with {} node(s)",
                    next.epoch,
                    next.nodes.len()
                );
                self.adopt(&next);
                return Ok(next);
            }
            // Another node made that epoch: read again.
        }
        Err(etcd_client::Error::InvalidArgs(
            "epoch transactions kept losing to other nodes".into(),
        ))
    }

    fn adopt(&self, v: &View) {
        let mut st = self.state.lock().unwrap();
        if v.epoch > st.view.epoch {
            st.view = v.clone();
        }
    }

    /// Grants a lease, registers `me` under it and starts renewing it.
    async fn register(self: &Arc<Self>, me: &NodeInfo) -> Result<(), etcd_client::Error> {
        let sent = self.now_ms();
        let ttl = self.ttl.as_secs().max(1) as i64;
        let grant = self.client().lease_client().grant(ttl, None).await?;
        let lease = grant.id();
        self.client()
            .kv_client()
            .put(
                self.key(&format!("nodes/{:016x}", me.id)),
                serde_json::to_vec(me).expect("serializable"),
                Some(PutOptions::new().with_lease(lease)),
            )
            .await?;
        self.renewed(sent, grant.ttl());
        let (tx, rx) = watch::channel(false);
        let old = {
            let mut st = self.state.lock().unwrap();
            st.me = Some(me.clone());
            st.lease = Some(lease);
            st.lease_lost = false;
            st.stop_lease.replace(tx)
        };
        if let Some(old) = old {
            let _ = old.send(true);
        }
        tokio::spawn(keepalive(self.clone(), lease, rx));
        Ok(())
    }
}

/// Renews `lease` every third of the TTL until told to stop or etcd says it ended.
async fn keepalive(inner: Arc<Inner>, lease: i64, mut stop: watch::Receiver<bool>) {
    let period = (inner.ttl / 3).max(Duration::from_millis(300));
    let mut stream = None;
    loop {
        if *stop.borrow() {
            return;
        }
        let started = Instant::now();
        let sent = inner.now_ms();
        let member = inner.current.load(Ordering::SeqCst);
        // Opening the stream renews once (and fails with "lease not found" when it ended);
        // each later round sends one renewal and reads its answer: the TTL, 0 once ended.
        let round = async {
            match stream.as_mut() {
                None => match inner.client().lease_client().keep_alive(lease).await {
                    Ok(s) => {
                        stream = Some(s);
                        Ok(Some(inner.ttl.as_secs() as i64))
                    }
                    Err(e) if is_lease_not_found(&e) => Ok(Some(0)),
                    Err(e) => Err(e),
                },
                Some((keeper, s)) => {
                    keeper.keep_alive().await?;
                    Ok(s.message().await?.map(|r| r.ttl()))
                }
            }
        };
        match tokio::time::timeout(period.max(Duration::from_secs(1)), round).await {
            Ok(Ok(Some(ttl))) if ttl > 0 => inner.renewed(sent, ttl),
            Ok(Ok(Some(_))) => {
                tracing::error!(
                    "etcd {}: this node's lease {lease:x} ended (not renewed within {:?}): the cluster dropped this node; it serves no I/O and joins again",
                    inner.endpoints,
                    inner.ttl
                );
                inner.state.lock().unwrap().lease_lost = true;
                return;
            }
            Ok(Ok(None)) => {
                inner.unreachable_now("keepalive stream closed");
                stream = None;
            }
            Ok(Err(e)) => {
                inner.unreachable_now(&e.to_string());
                inner.rotate(member);
                stream = None;
            }
            Err(_) => {
                inner.unreachable_now("keepalive timed out");
                inner.rotate(member);
                stream = None;
            }
        }
        let wait = period.saturating_sub(started.elapsed());
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = stop.changed() => return,
        }
    }
}

/// Watches `PREFIX/` and reconciles membership at every change of `nodes/` or `epoch`.
async fn watch_membership(inner: Arc<Inner>) {
    let nodes = inner.key("nodes/");
    let epoch = inner.key("epoch");
    let mut from = 0i64;
    loop {
        let mut opts = WatchOptions::new().with_prefix();
        if from > 0 {
            opts = opts.with_start_revision(from);
        }
        let member = inner.current.load(Ordering::SeqCst);
        let stream = inner
            .client()
            .watch_client()
            .watch(format!("{}/", inner.prefix), Some(opts))
            .await;
        let mut stream = match stream {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!("etcd watch: {e}");
                inner.rotate(member);
                tokio::time::sleep(RETRY).await;
                continue;
            }
        };
        // Anything may have changed while no watch ran.
        if let Err(e) = inner.reconcile().await {
            tracing::debug!("etcd reconcile: {e}");
        }
        while let Ok(Some(resp)) = stream.message().await {
            if resp.canceled() {
                if resp.compact_revision() > 0 {
                    from = resp.compact_revision();
                }
                break;
            }
            if let Some(h) = resp.header() {
                from = from.max(h.revision() + 1);
            }
            let relevant = resp.events().iter().any(|e| {
                e.kv()
                    .map(|kv| {
                        kv.key().starts_with(nodes.as_bytes())
                            || kv.key().starts_with(epoch.as_bytes())
                    })
                    .unwrap_or(false)
            });
            if relevant {
                if let Err(e) = inner.reconcile().await {
                    tracing::warn!("membership (etcd): {e}");
                }
            }
        }
        // The stream ended: its member died, lost its leader, or the history was compacted.
        inner.rotate(member);
        tokio::time::sleep(RETRY).await;
    }
}

impl EtcdDriver {
    pub fn open(spec: &EtcdSpec, opts: DriverOptions) -> Result<EtcdDriver, DriverError> {
        let endpoints = spec.endpoints.join(",");
        let (handle_tx, handle_rx) = mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("etcd".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        let _ = handle_tx.send(Err(e));
                        return;
                    }
                };
                let _ = handle_tx.send(Ok(rt.handle().clone()));
                rt.block_on(async {
                    let _ = stop_rx.await;
                });
            })
            .map_err(|e| unreachable(&endpoints, format!("cannot start its thread: {e}")))?;
        let rt = handle_rx
            .recv()
            .map_err(|_| unreachable(&endpoints, "its thread died"))?
            .map_err(|e| unreachable(&endpoints, format!("cannot start its runtime: {e}")))?;
        let eps = spec.endpoints.clone();
        let connect = ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(2))
            .with_keep_alive(Duration::from_secs(1), Duration::from_secs(2))
            .with_keep_alive_while_idle(true)
            .with_require_leader(true);
        let clients = run_on(&rt, &endpoints, async move {
            let mut clients = Vec::new();
            for ep in eps {
                clients.push(Client::connect([ep], Some(connect.clone())).await?);
            }
            Ok::<_, etcd_client::Error>(clients)
        })?
        .map_err(|e| unreachable(&endpoints, e))?;
        Ok(EtcdDriver {
            inner: Arc::new(Inner {
                clients,
                current: AtomicUsize::new(0),
                prefix: spec.prefix.clone(),
                endpoints,
                ttl: opts.lease_ttl.max(Duration::from_secs(1)),
                base: Instant::now(),
                until_ms: AtomicU64::new(0),
                joined: AtomicBool::new(false),
                reachable: AtomicBool::new(true),
                state: Mutex::default(),
            }),
            rt,
            _stop: stop_tx,
            watch_started: AtomicBool::new(false),
        })
    }

    /// Runs `f` on the driver's runtime and waits for it, at most [`CALL_TIMEOUT`].
    /// A call that reached no working member is sent again to the next one ([`is_unsent`]);
    /// one that got no answer in time moves later calls on to the next member.
    fn call<T: Send + 'static>(
        &self,
        f: impl Fn(Arc<Inner>) -> Fut<T> + Send + 'static,
    ) -> Result<T, DriverError> {
        let inner = self.inner.clone();
        let i2 = inner.clone();
        let at = Arc::new(AtomicUsize::new(0));
        let at2 = at.clone();
        let attempts = async move {
            let mut tries = 0;
            loop {
                let from = i2.current.load(Ordering::SeqCst);
                at2.store(from, Ordering::SeqCst);
                match f(i2.clone()).await {
                    Err(e) if is_unsent(&e) && tries + 1 < 2 * i2.clients.len() => {
                        tracing::debug!("etcd member {from}: {e}; trying the next one");
                        i2.rotate(from);
                        tries += 1;
                    }
                    r => return r,
                }
            }
        };
        match run_on(&self.rt, &inner.endpoints, async move {
            tokio::time::timeout(CALL_TIMEOUT, attempts).await
        })? {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(inner.err(e)),
            Err(_) => {
                inner.rotate(at.load(Ordering::SeqCst));
                Err(unreachable(
                    &inner.endpoints,
                    format!("no answer within {CALL_TIMEOUT:?}"),
                ))
            }
        }
    }

    fn kv_key(&self, key: &str) -> String {
        self.inner.key(&format!("kv/{key}"))
    }

    fn cas(
        &self,
        key: &str,
        expected: Option<&[u8]>,
        new: Option<&[u8]>,
        lease: Option<i64>,
    ) -> Result<bool, DriverError> {
        let k = self.kv_key(key);
        let cmp = match expected {
            Some(v) => Compare::value(k.clone(), CompareOp::Equal, v.to_vec()),
            None => Compare::version(k.clone(), CompareOp::Equal, 0),
        };
        let op = match new {
            Some(v) => TxnOp::put(
                k.clone(),
                v.to_vec(),
                lease.map(|l| PutOptions::new().with_lease(l)),
            ),
            None => TxnOp::delete(k.clone(), None),
        };
        let txn = Txn::new().when([cmp]).and_then([op]);
        let res = self.call(move |inner| {
            let txn = txn.clone();
            Box::pin(async move {
                inner
                    .client()
                    .kv_client()
                    .txn(txn)
                    .await
                    .map(|r| r.succeeded())
            })
        });
        match res {
            Err(DriverError::Unreachable { reason, .. })
                if lease.is_some() && reason.contains("requested lease not found") =>
            {
                Ok(false)
            }
            r => r,
        }
    }
}

type Fut<T> = std::pin::Pin<Box<dyn Future<Output = Result<T, etcd_client::Error>> + Send>>;

/// Runs a future on `rt` from a thread outside it and waits for its result.
fn run_on<T: Send + 'static>(
    rt: &tokio::runtime::Handle,
    endpoints: &str,
    fut: impl Future<Output = T> + Send + 'static,
) -> Result<T, DriverError> {
    let (tx, rx) = mpsc::sync_channel(1);
    rt.spawn(async move {
        let _ = tx.send(fut.await);
    });
    rx.recv()
        .map_err(|_| unreachable(endpoints, "the driver's runtime stopped"))
}

impl Drop for EtcdDriver {
    fn drop(&mut self) {
        if let Some(stop) = self.inner.state.lock().unwrap().stop_lease.take() {
            let _ = stop.send(true);
        }
    }
}

impl Driver for EtcdDriver {
    fn describe(&self) -> String {
        format!(
            "etcd://{}{} (lease TTL {}s)",
            self.inner
                .endpoints
                .split(',')
                .map(|e| e.trim_start_matches("http://"))
                .collect::<Vec<_>>()
                .join(","),
            self.inner.prefix,
            self.inner.ttl.as_secs()
        )
    }

    fn cluster_id(&self) -> Result<String, DriverError> {
        self.call(|inner| {
            Box::pin(async move {
                let key = inner.key("cluster_id");
                let id = format!("{:016x}", rand::random::<u64>());
                let txn = Txn::new()
                    .when([Compare::version(key.clone(), CompareOp::Equal, 0)])
                    .and_then([TxnOp::put(key.clone(), id, None)]);
                inner.client().kv_client().txn(txn).await?;
                let resp = inner.client().kv_client().get(key, None).await?;
                let kv = resp.kvs().first().ok_or_else(|| {
                    etcd_client::Error::InvalidArgs("cluster id vanished after its creation".into())
                })?;
                Ok(String::from_utf8_lossy(kv.value()).trim().to_string())
            })
        })
    }

    fn join(&self, me: &NodeInfo) -> Result<View, DriverError> {
        let me = me.clone();
        let start_watch = !self.watch_started.swap(true, Ordering::SeqCst);
        self.call(move |inner| {
            let me = me.clone();
            Box::pin(async move {
                inner.register(&me).await?;
                if start_watch {
                    tokio::spawn(watch_membership(inner.clone()));
                }
                loop {
                    let v = inner.reconcile().await?;
                    if v.node(me.id) == Some(&me) {
                        return Ok(v);
                    }
                }
            })
        })
    }

    fn tick(&self) -> Result<View, DriverError> {
        let (lost, me) = {
            let st = self.inner.state.lock().unwrap();
            (st.lease_lost, st.me.clone())
        };
        if let (true, Some(me)) = (lost, me) {
            tracing::warn!("membership (etcd): joining again with a new lease");
            self.call(move |inner| {
                let me = me.clone();
                Box::pin(async move {
                    inner.register(&me).await?;
                    inner.reconcile().await
                })
            })
            .map_err(|e| match e {
                DriverError::Unreachable { .. } => DriverError::LeaseExpired,
                e => e,
            })?;
        }
        Ok(self.inner.state.lock().unwrap().view.clone())
    }

    fn leave(&self) -> Result<(), DriverError> {
        let (lease, stop) = {
            let mut st = self.inner.state.lock().unwrap();
            st.me = None;
            (st.lease.take(), st.stop_lease.take())
        };
        if let Some(stop) = stop {
            let _ = stop.send(true);
        }
        self.inner.joined.store(false, Ordering::SeqCst);
        if let Some(lease) = lease {
            self.call(move |inner| {
                Box::pin(async move {
                    inner.client().lease_client().revoke(lease).await?;
                    inner.reconcile().await
                })
            })?;
        }
        Ok(())
    }

    fn view_at(&self, epoch: u32) -> Result<Option<View>, DriverError> {
        self.call(move |inner| {
            Box::pin(async move {
                if epoch == 0 {
                    return Ok(Some(View::default()));
                }
                let resp = inner
                    .client()
                    .kv_client()
                    .get(inner.key(&format!("epochs/{epoch:010}")), None)
                    .await?;
                match resp.kvs().first() {
                    None => Ok(None),
                    Some(kv) => serde_json::from_slice(kv.value()).map(Some).map_err(|e| {
                        etcd_client::Error::InvalidArgs(format!("epoch {epoch}: bad view: {e}"))
                    }),
                }
            })
        })
    }

    fn kv_get(&self, key: &str) -> Result<Option<Vec<u8>>, DriverError> {
        let k = self.kv_key(key);
        self.call(move |inner| {
            let k = k.clone();
            Box::pin(async move {
                let resp = inner.client().kv_client().get(k, None).await?;
                Ok(resp.kvs().first().map(|kv| kv.value().to_vec()))
            })
        })
    }

    fn kv_cas(
        &self,
        key: &str,
        expected: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<bool, DriverError> {
        self.cas(key, expected, new, None)
    }

    fn kv_list(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, DriverError> {
        let base = self.kv_key("");
        let k = self.kv_key(prefix);
        self.call(move |inner| {
            let (k, base) = (k.clone(), base.clone());
            Box::pin(async move {
                let resp = inner
                    .client()
                    .kv_client()
                    .get(k, Some(GetOptions::new().with_prefix()))
                    .await?;
                let mut out = Vec::new();
                for kv in resp.kvs() {
                    let key = String::from_utf8_lossy(kv.key());
                    if let Some(rel) = key.strip_prefix(&base) {
                        out.push((rel.to_string(), kv.value().to_vec()));
                    }
                }
                out.sort();
                Ok(out)
            })
        })
    }

    fn kv_cas_leased(
        &self,
        key: &str,
        expected: Option<&[u8]>,
        new: &[u8],
        lease: u64,
    ) -> Result<bool, DriverError> {
        self.cas(key, expected, Some(new), Some(lease as i64))
    }

    fn lease_grant(&self, ttl: Duration) -> Result<u64, DriverError> {
        let secs = ttl.as_secs().max(1) as i64;
        self.call(move |inner| {
            Box::pin(async move {
                let r = inner.client().lease_client().grant(secs, None).await?;
                Ok(r.id() as u64)
            })
        })
    }

    fn lease_keepalive(&self, lease: u64) -> Result<bool, DriverError> {
        self.call(move |inner| {
            Box::pin(async move {
                // Opening the stream renews once; it fails when the lease ended.
                match inner.client().lease_client().keep_alive(lease as i64).await {
                    Ok(_) => Ok(true),
                    Err(e) if is_lease_not_found(&e) => Ok(false),
                    Err(e) => Err(e),
                }
            })
        })
    }

    fn lease_revoke(&self, lease: u64) -> Result<(), DriverError> {
        self.call(move |inner| {
            Box::pin(async move {
                match inner.client().lease_client().revoke(lease as i64).await {
                    Ok(_) => Ok(()),
                    Err(e) if is_lease_not_found(&e) => Ok(()),
                    Err(e) => Err(e),
                }
            })
        })
    }

    fn member_until(&self) -> Option<Instant> {
        self.inner.joined.load(Ordering::SeqCst).then(|| {
            self.inner.base + Duration::from_millis(self.inner.until_ms.load(Ordering::SeqCst))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spec_parsing() {
        let s = EtcdSpec::parse("127.0.0.1:2379").unwrap();
        assert_eq!(s.endpoints, vec!["http://127.0.0.1:2379"]);
        assert_eq!(s.prefix, "/sheep");
        let s = EtcdSpec::parse("a:1,b:2/x/y/").unwrap();
        assert_eq!(s.endpoints, vec!["http://a:1", "http://b:2"]);
        assert_eq!(s.prefix, "/x/y");
        for bad in ["", "/p", "a", "a:", ":1", "a:99999", "a:1/", "a:1,,b:2"] {
            assert!(EtcdSpec::parse(bad).is_err(), "{bad:?} should be refused");
        }
    }
}
