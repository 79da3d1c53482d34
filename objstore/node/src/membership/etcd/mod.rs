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
//!   own thread (the gRPC clients, the keepalive and watch tasks live there); each call is
//!   handed to it and waited for, bounded by [`CALL_TIMEOUT`].
//! - **Failover**: one gRPC client per member. A call that reached no working member, or got
//!   no answer within [`ATTEMPT_TIMEOUT`], goes to the next one (a compare-and-swap first
//!   checks whether its unanswered attempt landed); the keepalive and the watch move on when
//!   their stream fails, and the read of the membership a watch event asks for goes from member
//!   to member until one answers (a change is never dropped because one member just died).

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::{Duration, Instant};

use etcd_client::{Client, Compare, CompareOp, ConnectOptions, GetOptions, PutOptions, Txn, TxnOp};
use tokio::sync::watch;

use super::{Driver, DriverError, DriverOptions};
use objstore_proto::view::{NodeInfo, View};

/// The longest a single call (a read, a transaction, a lease grant) may take.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(3);
/// How long one member may take to answer before the call goes to the next.
const ATTEMPT_TIMEOUT: Duration = Duration::from_millis(1200);
/// Pause before opening a watch or keepalive stream again after it failed.
const RETRY: Duration = Duration::from_millis(500);
/// Pause of a call after every member refused it unsent (no leader, connection refused).
const UNSENT_PAUSE: Duration = Duration::from_millis(100);

mod spec;
mod tasks;

pub use spec::EtcdSpec;
use tasks::watch_membership;

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
    /// The membership watch runs (started by the first join).
    watching: AtomicBool,
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
                watching: AtomicBool::new(false),
                reachable: AtomicBool::new(true),
                state: Mutex::default(),
            }),
            rt,
            _stop: stop_tx,
        })
    }

    /// Runs `f` on the driver's runtime and waits for it, at most [`CALL_TIMEOUT`].
    /// A call that reached no working member is sent again to the next one ([`is_unsent`]),
    /// pausing [`UNSENT_PAUSE`] after each round of all members (an election after a member's
    /// death answers "no leader" everywhere until it ends), for as long as the call's time
    /// allows; one without an answer within [`ATTEMPT_TIMEOUT`] too, at most twice a member,
    /// with `maybe_applied` set (a member that died or lost its leader mid-call may or may not
    /// have applied it: a compare-and-swap checks before sending again).
    fn call<T: Send + 'static>(
        &self,
        f: impl Fn(Arc<Inner>, bool) -> Fut<T> + Send + 'static,
    ) -> Result<T, DriverError> {
        let inner = self.inner.clone();
        let i2 = inner.clone();
        let at = Arc::new(AtomicUsize::new(0));
        let at2 = at.clone();
        let attempts = async move {
            let started = tokio::time::Instant::now();
            let mut tries = 0;
            let mut silent = 0;
            let mut maybe_applied = false;
            loop {
                let from = i2.current.load(Ordering::SeqCst);
                at2.store(from, Ordering::SeqCst);
                let round_done = (tries + 1) % i2.clients.len() == 0;
                let pause = if round_done {
                    UNSENT_PAUSE
                } else {
                    Duration::ZERO
                };
                let time_left = || started.elapsed() + pause + UNSENT_PAUSE < CALL_TIMEOUT;
                match tokio::time::timeout(ATTEMPT_TIMEOUT, f(i2.clone(), maybe_applied)).await {
                    Ok(Err(e)) if is_unsent(&e) && time_left() => {
                        tracing::debug!("etcd member {from}: {e}; trying the next one");
                        tokio::time::sleep(pause).await;
                    }
                    Err(_) if silent + 1 < 2 * i2.clients.len() => {
                        silent += 1;
                        tracing::debug!("etcd member {from}: no answer; trying the next one");
                        maybe_applied = true;
                    }
                    Ok(r) => return r,
                    Err(_) => {
                        return Err(etcd_client::Error::InvalidArgs(format!(
                            "no answer from any member within {ATTEMPT_TIMEOUT:?}"
                        )))
                    }
                }
                i2.rotate(from);
                tries += 1;
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
        let want = new.map(|v| v.to_vec());
        let res = self.call(move |inner, maybe_applied| {
            let (txn, k, want) = (txn.clone(), k.clone(), want.clone());
            Box::pin(async move {
                if maybe_applied {
                    // The attempt before got no answer: if the key already holds what this
                    // call writes (bound to its lease), it landed.
                    let cur = inner.client().kv_client().get(k, None).await?;
                    let landed = match (cur.kvs().first(), &want) {
                        (Some(kv), Some(v)) => {
                            kv.value() == v.as_slice() && lease.is_none_or(|l| kv.lease() == l)
                        }
                        (None, None) => true,
                        _ => false,
                    };
                    if landed {
                        return Ok(true);
                    }
                }
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
        self.call(|inner, _| {
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
        self.call(move |inner, _| {
            let me = me.clone();
            Box::pin(async move {
                inner.register(&me).await?;
                if !inner.watching.swap(true, Ordering::SeqCst) {
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
            self.call(move |inner, _| {
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
            self.call(move |inner, _| {
                Box::pin(async move {
                    inner.client().lease_client().revoke(lease).await?;
                    inner.reconcile().await
                })
            })?;
        }
        Ok(())
    }

    fn view_at(&self, epoch: u32) -> Result<Option<View>, DriverError> {
        self.call(move |inner, _| {
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
        self.call(move |inner, _| {
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
        self.call(move |inner, _| {
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
        self.call(move |inner, _| {
            Box::pin(async move {
                let r = inner.client().lease_client().grant(secs, None).await?;
                Ok(r.id() as u64)
            })
        })
    }

    fn lease_keepalive(&self, lease: u64) -> Result<bool, DriverError> {
        self.call(move |inner, _| {
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
        self.call(move |inner, _| {
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
