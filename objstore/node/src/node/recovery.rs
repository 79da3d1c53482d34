//! Recovery: after every new epoch, bring this node's objects up to what the epoch makes it
//! responsible for, then drop what it no longer owns once every owner holds its copies.
//!
//! 1. **Plan.** List `(oid, stamp)` from every reachable node of this epoch and the previous one.
//!    For each object this node owns now, if some node has a higher stamp than the local copy (or
//!    there is no local copy), it goes to `pending` with the nodes holding the newest stamp.
//!    Object I/O waits until the plan exists, so no request touches a copy not yet judged.
//! 2. **Pull.** Pending objects are copied whole from a newest holder and installed only if still
//!    newer than the local copy. A request for a pending object pulls it first. A pull that
//!    fails (sources unreachable, the local disk full) leaves the object pending: requests for
//!    it get `Busy` at once (never the stale or missing local copy, and no pull of their own),
//!    and the round retries it with backoff; the epoch is recovered here only when nothing is
//!    pending.
//! 3. **Collect.** When every node of the epoch reports it has recovered this epoch, objects this
//!    node does not own are removed. Any new epoch abandons the current round and starts over.
//!
//! A node that comes back with old copies lists lower stamps than the survivors that took the
//! writes it missed, so it pulls before it serves: no read returns data older than the newest
//! acknowledged write.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{Notify, OnceCell};

use super::{Epoch, Node};
use crate::store::StoreError;
use objstore_proto::api::{RecoveryState, RecoveryStatus};
use objstore_proto::frame::{Header, Opcode, ResultCode};
use objstore_proto::oid::ObjectId;

const PEER_TIMEOUT: Duration = Duration::from_secs(10);
const PULL_PARALLEL: usize = 4;
const PLAN_WAIT: Duration = Duration::from_secs(10);
/// The first wait before failed pulls are tried again, doubling up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(5);

struct Pull {
    stamp: u32,
    sources: Vec<SocketAddr>,
    result: OnceCell<Result<(), PullFailed>>,
}

/// Why a pending object could not be pulled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PullFailed {
    /// The local disk has no room for it.
    NoSpace,
    /// No source gave it (unreachable, or it failed to store for another reason).
    Unavailable,
}

pub(super) struct Recovery {
    /// The newest epoch whose plan exists; `planned_set` wakes its waiters. (Not a `watch`:
    /// tokio wakes a watch's waiters in a random order, a Notify's in a fixed one, which the
    /// fault simulator needs to replay a seed.)
    planned: AtomicU32,
    planned_set: Notify,
    recovered: AtomicU32,
    pending: Mutex<HashMap<ObjectId, Arc<Pull>>>,
    tombstones: Mutex<HashSet<ObjectId>>,
    status: Mutex<RecoveryStatus>,
}

impl Default for Recovery {
    fn default() -> Self {
        Recovery {
            planned: AtomicU32::new(0),
            planned_set: Notify::new(),
            recovered: AtomicU32::new(0),
            pending: Mutex::default(),
            tombstones: Mutex::default(),
            status: Mutex::default(),
        }
    }
}

impl Recovery {
    pub(super) fn status(&self) -> RecoveryStatus {
        self.status.lock().unwrap().clone()
    }

    pub(super) fn recovered_epoch(&self) -> u32 {
        self.recovered.load(Ordering::SeqCst)
    }

    pub(super) fn is_pending(&self, oid: ObjectId) -> bool {
        self.pending.lock().unwrap().contains_key(&oid)
    }

    /// Waits until the plan for `epoch` exists. False on timeout.
    pub(super) async fn wait_planned(&self, epoch: u32) -> bool {
        // The usual case on every request: planned long ago, no waiting machinery.
        if self.planned.load(Ordering::SeqCst) >= epoch {
            return true;
        }
        let planned = async {
            loop {
                let set = self.planned_set.notified();
                tokio::pin!(set);
                set.as_mut().enable();
                if self.planned.load(Ordering::SeqCst) >= epoch {
                    return;
                }
                set.await;
            }
        };
        tokio::time::timeout(PLAN_WAIT, planned).await.is_ok()
    }

    fn set_planned(&self, epoch: u32) {
        self.planned.store(epoch, Ordering::SeqCst);
        self.planned_set.notify_waiters();
    }

    /// A removed object must not come back through recovery from a stale holder.
    pub(super) fn removed(&self, oid: ObjectId) {
        self.tombstones.lock().unwrap().insert(oid);
        self.pending.lock().unwrap().remove(&oid);
    }

    pub(super) fn written(&self, oid: ObjectId) {
        self.tombstones.lock().unwrap().remove(&oid);
    }

    /// Makes failed pulls of `oids` pullable again (the next `Node::ensure_recovered` pulls);
    /// returns those still pending (a request may have pulled some meanwhile).
    fn retry(&self, oids: Vec<ObjectId>) -> Vec<ObjectId> {
        let mut pending = self.pending.lock().unwrap();
        oids.into_iter()
            .filter(|oid| match pending.get_mut(oid) {
                Some(p) => {
                    if p.result.get().is_some_and(Result::is_err) {
                        *p = Arc::new(Pull {
                            stamp: p.stamp,
                            sources: p.sources.clone(),
                            result: OnceCell::new(),
                        });
                    }
                    true
                }
                None => false,
            })
            .collect()
    }

    fn update(&self, f: impl FnOnce(&mut RecoveryStatus)) {
        f(&mut self.status.lock().unwrap());
    }
}

impl Node {
    /// Pulls `oid` now if it is still pending; waits if another task is pulling it. Ok when
    /// the local copy may be used: nothing to pull, or the pull succeeded. A failed pull leaves
    /// the object pending with its failure, which later requests get at once (no pull each:
    /// its local copy, stale or missing, must be neither served nor written into); only the
    /// recovery round tries it again (`Recovery::retry`), with backoff.
    pub(super) async fn ensure_recovered(&self, oid: ObjectId) -> Result<(), PullFailed> {
        let Some(pull) = self.recovery.pending.lock().unwrap().get(&oid).cloned() else {
            return Ok(());
        };
        let res = *pull.result.get_or_init(|| self.pull(oid, &pull)).await;
        if res.is_ok() {
            let mut pending = self.recovery.pending.lock().unwrap();
            if pending.get(&oid).is_some_and(|p| Arc::ptr_eq(p, &pull)) {
                pending.remove(&oid);
            }
        }
        res
    }

    async fn pull(&self, oid: ObjectId, pull: &Pull) -> Result<(), PullFailed> {
        let mut no_space = false;
        if !self.pull_delay.is_zero() {
            tokio::time::sleep(self.pull_delay).await;
        }
        for &src in &pull.sources {
            let mut h = Header::request(Opcode::PeerRead, 0, self.epoch().view.epoch);
            h.oid = oid.0;
            let res = match self.peers.get(src, PEER_TIMEOUT).await {
                Ok(c) => c.call(h, Bytes::new(), PEER_TIMEOUT).await,
                Err(e) => Err(e),
            };
            let frame = match res {
                Ok(f) if f.header.result_code() == ResultCode::Ok => f,
                Ok(f) => {
                    tracing::debug!(
                        "pull {oid} from {src}: {:?} {}",
                        f.header.result_code(),
                        f.message()
                    );
                    continue;
                }
                Err(e) => {
                    self.peers.drop_conn(src).await;
                    tracing::debug!("pull {oid} from {src}: {e}");
                    continue;
                }
            };
            let stamp = frame.header.aux;
            let store = self.store.clone();
            let put = self
                .blocking(move || store.put_if_newer(oid, &frame.payload, stamp))
                .await
                .expect("store task");
            match put {
                Ok(_) => {
                    self.recovery.update(|s| s.done += 1);
                    return Ok(());
                }
                Err(e) => {
                    no_space |= matches!(e, StoreError::NoSpace);
                    tracing::warn!("recovering {oid}: {e}");
                }
            }
        }
        tracing::warn!(
            "could not recover object {oid} (stamp {}) from any of {:?}; it stays pending",
            pull.stamp,
            pull.sources
        );
        Err(if no_space {
            PullFailed::NoSpace
        } else {
            PullFailed::Unavailable
        })
    }

    /// Lists `(oid, stamp)` from a peer.
    async fn list_peer(&self, addr: SocketAddr, epoch: u32) -> Option<Vec<(ObjectId, u32)>> {
        let h = Header::request(Opcode::PeerList, 0, epoch);
        let conn = self.peers.get(addr, PEER_TIMEOUT).await.ok()?;
        let f = match conn.call(h, Bytes::new(), PEER_TIMEOUT).await {
            Ok(f) if f.header.result_code() == ResultCode::Ok => f,
            _ => {
                self.peers.drop_conn(addr).await;
                return None;
            }
        };
        Some(
            f.payload
                .chunks_exact(12)
                .map(|c| {
                    (
                        ObjectId(u64::from_be_bytes(c[..8].try_into().unwrap())),
                        u32::from_be_bytes(c[8..].try_into().unwrap()),
                    )
                })
                .collect(),
        )
    }

    /// Whether every owner of `oid` in `ep` holds it at `stamp` or newer (asked of each).
    async fn owners_hold(&self, ep: &Epoch, oid: ObjectId, stamp: u32, copies: usize) -> bool {
        let owners: Vec<SocketAddr> = ep
            .ring
            .replicas(oid, copies)
            .iter()
            .map(|n| n.addr)
            .collect();
        let stats = futures::future::join_all(owners.iter().map(|&a| async move {
            let mut h = Header::request(Opcode::StatObj, 0, ep.view.epoch);
            h.oid = oid.0;
            let conn = self.peers.get(a, PEER_TIMEOUT).await.ok()?;
            match conn.call(h, Bytes::new(), PEER_TIMEOUT).await {
                Ok(f) if f.header.result_code() == ResultCode::Ok => Some(f.header.aux),
                Ok(_) => None,
                Err(_) => {
                    self.peers.drop_conn(a).await;
                    None
                }
            }
        }))
        .await;
        !owners.is_empty() && stats.iter().all(|s| s.is_some_and(|s| s >= stamp))
    }

    async fn peer_recovered(&self, addr: SocketAddr, epoch: u32) -> u32 {
        let h = Header::request(Opcode::PeerStatus, 0, epoch);
        let Ok(conn) = self.peers.get(addr, PEER_TIMEOUT).await else {
            return 0;
        };
        match conn.call(h, Bytes::new(), PEER_TIMEOUT).await {
            Ok(f) if f.header.result_code() == ResultCode::Ok => f.header.aux,
            _ => 0,
        }
    }

    /// Builds the pending set for `ep`. None if the epoch changed meanwhile.
    async fn plan(&self, ep: &Epoch, copies: usize) -> Option<HashMap<ObjectId, Arc<Pull>>> {
        let e = ep.view.epoch;
        let mut sources: Vec<SocketAddr> = ep.view.nodes.iter().map(|n| n.addr).collect();
        let d = self.driver.clone();
        if let Ok(Ok(Some(prev))) = self.blocking(move || d.view_at(e - 1)).await {
            sources.extend(prev.nodes.iter().map(|n| n.addr));
        }
        sources.sort();
        sources.dedup();
        sources.retain(|a| *a != self.me.addr);
        let listings =
            futures::future::join_all(sources.iter().map(|&a| self.list_peer(a, e))).await;
        // oid -> (newest stamp, holders of it)
        let mut best: HashMap<ObjectId, (u32, Vec<SocketAddr>)> = HashMap::new();
        for (addr, list) in sources.iter().zip(listings) {
            for (oid, stamp) in list.into_iter().flatten() {
                let b = best.entry(oid).or_insert((stamp, Vec::new()));
                if stamp > b.0 {
                    *b = (stamp, Vec::new());
                }
                if stamp == b.0 {
                    b.1.push(*addr);
                }
            }
        }
        if self.epoch().view.epoch != e {
            return None;
        }
        let tombstones = self.recovery.tombstones.lock().unwrap().clone();
        let mut pending = HashMap::new();
        for (oid, (stamp, holders)) in best {
            if tombstones.contains(&oid) || !ep.ring.holds(self.me.id, oid, copies) {
                continue;
            }
            if self.store.meta(oid).is_some_and(|m| m.stamp >= stamp) {
                continue;
            }
            pending.insert(
                oid,
                Arc::new(Pull {
                    stamp,
                    sources: holders,
                    result: OnceCell::new(),
                }),
            );
        }
        Some(pending)
    }

    /// One round of recovery for `ep`; returns early when the epoch changes.
    async fn recover_epoch(&self, ep: Arc<Epoch>) {
        let e = ep.view.epoch;
        let changed = || self.epoch().view.epoch != e;
        self.recovery.update(|s| {
            *s = RecoveryStatus {
                epoch: e,
                ..Default::default()
            }
        });
        let Some(cfg) = self.config() else {
            // Nothing can be stored before the format.
            self.recovery.set_planned(e);
            self.recovery.recovered.store(e, Ordering::SeqCst);
            self.recovery.update(|s| s.state = RecoveryState::Done);
            return;
        };
        let copies = cfg.copies as usize;
        let Some(pending) = self.plan(&ep, copies).await else {
            return;
        };
        let total = pending.len() as u64;
        if total > 0 {
            tracing::info!("epoch {e}: recovering {total} object(s)");
        }
        // Sorted: the order of pulls must not depend on the map's random seed (the simulator
        // replays a seed exactly).
        let mut oids: Vec<ObjectId> = pending.keys().copied().collect();
        oids.sort();
        *self.recovery.pending.lock().unwrap() = pending;
        self.recovery.update(|s| {
            s.total = total;
            s.state = RecoveryState::Recovering;
        });
        self.recovery.set_planned(e);

        // Pull everything; what failed is retried with backoff until it succeeds or the epoch
        // changes. The epoch counts as recovered here only once nothing is left, so no other
        // node drops a copy this node has not got yet.
        use futures::StreamExt;
        let mut backoff = RETRY_FIRST;
        loop {
            let mut failed = Vec::new();
            let mut work = futures::stream::iter(oids)
                .map(|oid| async move { (oid, self.ensure_recovered(oid).await.is_ok()) })
                .buffer_unordered(PULL_PARALLEL);
            while let Some((oid, ok)) = work.next().await {
                if changed() {
                    return;
                }
                if !ok {
                    failed.push(oid);
                }
            }
            drop(work);
            self.recovery.update(|s| s.failed = failed.len() as u64);
            if failed.is_empty() {
                break;
            }
            tracing::warn!(
                "epoch {e}: {} object(s) could not be recovered; retrying in {backoff:?}",
                failed.len()
            );
            tokio::time::sleep(backoff).await;
            if changed() {
                return;
            }
            backoff = (backoff * 2).min(RETRY_MAX);
            oids = self.recovery.retry(failed);
        }
        self.recovery.recovered.store(e, Ordering::SeqCst);
        self.recovery
            .update(|s| s.state = RecoveryState::Collecting);
        if total > 0 {
            tracing::info!("epoch {e}: recovery done");
        }

        // Collect: wait until every owner has recovered this epoch.
        loop {
            if changed() {
                return;
            }
            let others: Vec<SocketAddr> = ep
                .view
                .nodes
                .iter()
                .filter(|n| n.id != self.me.id)
                .map(|n| n.addr)
                .collect();
            let got =
                futures::future::join_all(others.iter().map(|&a| self.peer_recovered(a, e))).await;
            if got.iter().all(|&r| r >= e) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let mut removed = 0;
        let mut kept = 0;
        for (oid, stamp) in self.store.list() {
            if changed() {
                return;
            }
            if ep.ring.holds(self.me.id, oid, copies) {
                continue;
            }
            // Every owner said it recovered the epoch; still, this copy goes only once each
            // owner shows it holds this version or a newer one.
            if !self.owners_hold(&ep, oid, stamp, copies).await {
                kept += 1;
                continue;
            }
            let store = self.store.clone();
            if let Ok(Ok(())) = self.blocking(move || store.remove(oid)).await {
                removed += 1;
            }
        }
        if removed > 0 {
            tracing::info!("epoch {e}: dropped {removed} object(s) now held by others");
        }
        if kept > 0 {
            tracing::warn!(
                "epoch {e}: kept {kept} object(s) this node no longer owns: not every owner holds them yet"
            );
        }
        self.recovery.update(|s| {
            s.removed = removed;
            s.state = RecoveryState::Done;
        });
    }
}

/// The recovery task: one round per epoch, restarted whenever the epoch changes.
pub(super) async fn run(node: Arc<Node>) {
    let mut rx = node.subscribe();
    loop {
        let ep = rx.borrow_and_update().clone();
        let round = node.recover_epoch(ep);
        tokio::select! {
            biased;
            _ = round => {
                if rx.changed().await.is_err() {
                    return;
                }
            }
            r = rx.changed() => {
                if r.is_err() {
                    return;
                }
            }
        }
    }
}
