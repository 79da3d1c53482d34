//! The node's membership inside etcd: registering under a lease, renewing it, watching
//! `PREFIX/` and making the next epoch when the live set changed.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Client, Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, WatchOptions};
use tokio::sync::watch;

use super::{is_lease_not_found, unreachable, Inner, ATTEMPT_TIMEOUT, RETRY};
use crate::membership::DriverError;
use objstore_proto::view::{NodeInfo, View};

impl Inner {
    /// The client of the member in use.
    pub(super) fn client(&self) -> Client {
        self.clients[self.current.load(Ordering::SeqCst) % self.clients.len()].clone()
    }

    /// Moves on to the next member after `from` failed (unless another call already did).
    pub(super) fn rotate(&self, from: usize) {
        let _ = self.current.compare_exchange(
            from,
            (from + 1) % self.clients.len(),
            Ordering::SeqCst,
            Ordering::SeqCst,
        );
    }

    pub(super) fn key(&self, rel: &str) -> String {
        format!("{}/{rel}", self.prefix)
    }

    pub(super) fn err(&self, e: etcd_client::Error) -> DriverError {
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

    pub(super) fn now_ms(&self) -> u64 {
        self.base.elapsed().as_millis() as u64
    }

    /// Notes a confirmed renewal sent at `sent` (ms since base) for `ttl_s` seconds.
    pub(super) fn renewed(&self, sent: u64, ttl_s: i64) {
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

    pub(super) fn unreachable_now(&self, why: &str) {
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

    pub(super) async fn get_view(&self, epoch: u32, rev: i64) -> Result<View, etcd_client::Error> {
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
    pub(super) async fn reconcile(&self) -> Result<View, etcd_client::Error> {
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

    /// [`Inner::reconcile`] for the watch: tried at each member in turn until one answers. A
    /// change the watch reported must not be dropped because the member in use just died (the
    /// node would keep an old view until the next change, maybe for good).
    async fn reconcile_until_answered(&self) {
        let mut tries = 0usize;
        loop {
            let member = self.current.load(Ordering::SeqCst);
            let why = match tokio::time::timeout(ATTEMPT_TIMEOUT, self.reconcile()).await {
                Ok(Ok(_)) => return,
                Ok(Err(e)) => e.to_string(),
                Err(_) => format!("no answer within {ATTEMPT_TIMEOUT:?}"),
            };
            tries += 1;
            if tries == self.clients.len() {
                tracing::warn!(
                    "membership (etcd): no member could read the new membership ({why}); trying again every {RETRY:?}"
                );
            } else {
                tracing::debug!("etcd member {member}: reconcile: {why}; trying the next one");
            }
            self.rotate(member);
            if tries >= self.clients.len() {
                tokio::time::sleep(RETRY).await;
            }
        }
    }

    pub(super) fn adopt(&self, v: &View) {
        let mut st = self.state.lock().unwrap();
        if v.epoch > st.view.epoch {
            st.view = v.clone();
        }
    }

    /// Grants a lease, registers `me` under it and starts renewing it.
    pub(super) async fn register(
        self: &Arc<Self>,
        me: &NodeInfo,
    ) -> Result<(), etcd_client::Error> {
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
pub(super) async fn keepalive(inner: Arc<Inner>, lease: i64, mut stop: watch::Receiver<bool>) {
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
pub(super) async fn watch_membership(inner: Arc<Inner>) {
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
        inner.reconcile_until_answered().await;
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
                inner.reconcile_until_answered().await;
            }
        }
        // The stream ended: its member died, lost its leader, or the history was compacted.
        inner.rotate(member);
        tokio::time::sleep(RETRY).await;
    }
}
