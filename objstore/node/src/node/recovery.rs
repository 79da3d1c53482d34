//! Recovery: after every new epoch, bring this node's objects up to what the epoch makes it
//! responsible for, then drop what it no longer owns once every owner holds its copies.
//!
//! 1. **Plan.** List `(oid, version)` (tombstones included) from every reachable node of this
//!    epoch and the previous one, and judge from the cluster's history which objects those
//!    listings can vouch for ([`super::history`]). For each object this node owns now: if its
//!    newest version may be only on nodes that are down, it *waits* (its I/O gets `Busy`, and
//!    the node says for whom); otherwise, if some node has a higher version than the local copy
//!    (or there is no local copy), it goes to `pending` with the nodes holding the newest
//!    version. Object I/O waits until the plan exists, so no request touches a copy not yet
//!    judged.
//! 2. **Pull.** Pending objects (or tombstones) are copied whole from a newest holder and
//!    installed only if still newer than the local copy. A request for a pending object pulls
//!    it first. A pull that fails (sources unreachable, the local disk full) leaves the object
//!    pending: requests for it get `Busy` (or `NoSpace`) at once, never the stale or missing
//!    local copy, and the round retries it with backoff, then plans again (a source may have
//!    lost or dropped its copy since the plan; the new listings find the holders). While
//!    objects wait for nodes that are down, the round plans again every few seconds (a forced
//!    recovery is seen that way).
//! 3. **Record.** Only when nothing is pending or waiting is the epoch recovered here; the node
//!    records that in the cluster store (`recovered/<epoch>`), which makes an epoch clean once
//!    all its members did.
//! 4. **Collect.** When every node of the epoch reports it has recovered this epoch, copies this
//!    node does not own are dropped, each only once every owner shows it holds that version or a
//!    newer one. Any new epoch abandons the current round and starts over.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use tokio::sync::{Notify, OnceCell};

mod listing;
mod plan;
mod pull;
mod sweep;

use super::history::{self, Safety};
use super::{Epoch, Node};
use crate::store::{ObjState, Version};
use objstore_proto::api::{RecoveryState, RecoveryStatus};
use objstore_proto::oid::ObjectId;
use plan::Plan;
use pull::Pulled;

pub(super) const PEER_TIMEOUT: Duration = Duration::from_secs(10);
const PLAN_WAIT: Duration = Duration::from_secs(10);
/// The first wait before failed pulls are tried again, doubling up to [`RETRY_MAX`].
pub(super) const RETRY_FIRST: Duration = Duration::from_millis(500);
pub(super) const RETRY_MAX: Duration = Duration::from_secs(5);
/// How long a listing is retried while its node has not reached the epoch yet.
const LIST_BEHIND_WAIT: Duration = Duration::from_secs(3);
/// How long one page of a listing may take. Object I/O of a new epoch waits for its plan,
/// which waits for every listing: a node that hangs (stopped, not yet dropped) must cost a
/// short pause, not [`PEER_TIMEOUT`]. A page holds at most [`PAGE_ENTRIES`] entries.
const LIST_TIMEOUT: Duration = Duration::from_secs(2);
/// The most entries a page of a listing holds (17 bytes each: 17 MiB, under the frame cap).
/// A peer asked for its whole listing at once answers it when it fits, else says in how many
/// parts to ask ([`objstore_proto::version::ListRequest`]): a node holding few of this node's
/// objects costs one request, one holding millions a pass more.
pub(super) const PAGE_ENTRIES: usize = 1 << 20;

pub(super) struct Pull {
    pub(super) want: ObjState,
    pub(super) sources: Vec<SocketAddr>,
    pub(super) result: OnceCell<Result<(), PullFailed>>,
}

/// Why a pending object cannot be used yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum PullFailed {
    /// The local disk has no room for it.
    NoSpace,
    /// No source gave it (unreachable, or it failed to store for another reason).
    Unavailable,
    /// Its newest version may be only on these nodes, which are down; they could have taken
    /// writes up to `epoch`.
    Waiting { nodes: Vec<SocketAddr>, epoch: u32 },
}

pub(super) struct Recovery {
    /// The newest epoch whose plan exists; `planned_set` wakes its waiters. (Not a `watch`:
    /// tokio wakes a watch's waiters in a random order, a Notify's in a fixed one, which the
    /// fault simulator needs to replay a seed.)
    planned: AtomicU32,
    planned_set: Notify,
    recovered: AtomicU32,
    pub(super) pending: Mutex<HashMap<ObjectId, Arc<Pull>>>,
    /// Copies this node lost with a failed fdatasync and could not restore, with the version
    /// lost: until a copy at least that new is found, they stay pending (their I/O waits) in
    /// every plan, so this node never serves or writes over an older copy as if it were
    /// current.
    lost: Mutex<HashMap<ObjectId, Version>>,
    /// Wakes the recovery task to plan the current epoch again (a copy lost outside a round,
    /// by a failed flush, that the flush could not restore).
    replan: Notify,
    safety: RwLock<Arc<Safety>>,
    status: Mutex<RecoveryStatus>,
}

impl Default for Recovery {
    fn default() -> Self {
        Recovery {
            planned: AtomicU32::new(0),
            planned_set: Notify::new(),
            recovered: AtomicU32::new(0),
            pending: Mutex::default(),
            lost: Mutex::default(),
            replan: Notify::new(),
            safety: RwLock::new(Arc::new(Safety::all())),
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

    /// `oid` was installed whole at `version`, newer than the copy here: no pull is needed any
    /// more, unless the copy here had lost a newer version (it then stays pending).
    pub(super) fn settled(&self, oid: ObjectId, version: Version) {
        if self.restored(oid, version) {
            self.pending.lock().unwrap().remove(&oid);
        }
    }

    /// A copy of `oid` at `version` was installed here: a copy lost at that version or an
    /// older one is restored. False while the copy here is still lost (it lost a newer one).
    pub(super) fn restored(&self, oid: ObjectId, version: Version) -> bool {
        let mut lost = self.lost.lock().unwrap();
        match lost.get(&oid) {
            Some(want) if version < *want => false,
            Some(_) => {
                lost.remove(&oid);
                true
            }
            None => true,
        }
    }

    /// This node no longer counts its copy of `oid` as lost (it kept what remains, or dropped
    /// the copy).
    pub(super) fn unlose(&self, oid: ObjectId) {
        self.lost.lock().unwrap().remove(&oid);
    }

    /// Whether some copy here is lost and not restored.
    pub(super) fn any_lost(&self) -> bool {
        !self.lost.lock().unwrap().is_empty()
    }

    /// Holds `oid` pending with no source, so its I/O waits (`Busy`) while the caller finds
    /// where to pull it from ([`Recovery::release`]).
    pub(super) fn hold(&self, oid: ObjectId, want: ObjState) -> Arc<Pull> {
        let hold = Arc::new(Pull {
            want,
            sources: Vec::new(),
            result: OnceCell::new(),
        });
        self.pending.lock().unwrap().insert(oid, hold.clone());
        hold
    }

    /// Remembers that this node's copy of `oid` lost the data of version `want`.
    pub(super) fn lose(&self, oid: ObjectId, want: Version) {
        let mut lost = self.lost.lock().unwrap();
        let w = lost.entry(oid).or_insert(want);
        *w = (*w).max(want);
    }

    /// The version this node's copy of `oid` lost, while it is not restored.
    pub(super) fn lost(&self, oid: ObjectId) -> Option<Version> {
        self.lost.lock().unwrap().get(&oid).copied()
    }

    /// Every copy lost and not restored, with the version lost.
    pub(super) fn lost_copies(&self) -> Vec<(ObjectId, Version)> {
        let mut v: Vec<_> = self
            .lost
            .lock()
            .unwrap()
            .iter()
            .map(|(o, w)| (*o, *w))
            .collect();
        v.sort_unstable();
        v
    }

    /// Plans the current epoch again once the round in progress (if any) ends.
    pub(super) fn plan_again(&self) {
        self.replan.notify_one();
    }

    /// Drops a failed pull of `oid` that wants no newer a version than `have` (the copy here,
    /// installed meanwhile by another pull): it would keep the object's I/O waiting for
    /// nothing until the next plan. A pull still running, or wanting more, stays.
    pub(super) fn drop_failed_pull(&self, oid: ObjectId, have: Option<Version>) {
        let mut pending = self.pending.lock().unwrap();
        let stale = pending.get(&oid).is_some_and(|p| {
            p.result.get().is_some_and(Result::is_err) && have.is_some_and(|h| p.want.version <= h)
        });
        if stale {
            pending.remove(&oid);
        }
    }

    /// Replaces `hold` (if still there) by a pull from `sources`.
    pub(super) fn release(&self, oid: ObjectId, hold: &Arc<Pull>, sources: Vec<SocketAddr>) {
        let mut pending = self.pending.lock().unwrap();
        if pending.get(&oid).is_some_and(|p| Arc::ptr_eq(p, hold)) {
            let pull = Arc::new(Pull {
                want: hold.want,
                sources,
                result: OnceCell::new(),
            });
            pending.insert(oid, pull);
        }
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
                            want: p.want,
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

    pub(super) fn update(&self, f: impl FnOnce(&mut RecoveryStatus)) {
        f(&mut self.status.lock().unwrap());
    }
}

impl Node {
    /// Whether this node knows the newest version of strip key `key` (see
    /// [`Safety::knows_strip`]).
    pub(super) fn knows_strip(&self, key: ObjectId) -> bool {
        self.recovery.safety.read().unwrap().knows_strip(key)
    }

    /// Whether this node may vouch for the copy it holds of strip key `key`, known to hold
    /// every change before epoch `current` (see [`Safety::knows_present_strip`]).
    pub(super) fn knows_present_strip(&self, key: ObjectId, current: u32) -> bool {
        (self.recovery.safety.read().unwrap()).knows_present_strip(key, self.me.id, current)
    }

    /// [`Safety::installed_current`] now, for this node.
    pub(super) fn installed_current(&self, key: ObjectId, current: u32) -> u32 {
        (self.recovery.safety.read().unwrap()).installed_current(key, self.me.id, current)
    }

    /// [`Safety::stripe_waiting_for`] now.
    pub(super) fn stripe_waiting_for(
        &self,
        oid: ObjectId,
        width: usize,
        min: usize,
    ) -> Option<(Vec<std::net::SocketAddr>, u32)> {
        (self.recovery.safety.read().unwrap()).stripe_waiting_for(oid, width, min)
    }

    /// Ok when the local copy of `oid` may be used: it is not waiting for nodes that are down,
    /// and nothing is to be pulled, or the pull succeeded (waiting if another task is pulling).
    /// A failed pull leaves the object pending with its failure, which later requests get at
    /// once (its local copy, stale or missing, must be neither served nor written into); only
    /// the recovery round tries it again (`Recovery::retry`), with backoff.
    pub(super) async fn ensure_recovered(&self, oid: ObjectId) -> Result<(), PullFailed> {
        let safety = self.recovery.safety.read().unwrap().clone();
        if !safety.safe(oid) {
            let (nodes, epoch) = safety.waiting_for(Some(oid));
            return Err(PullFailed::Waiting { nodes, epoch });
        }
        let Some(pull) = self.recovery.pending.lock().unwrap().get(&oid).cloned() else {
            // A copy lost by a failed flush is never used as it is, even in the moment before
            // it is held pending (a flush restoring it, the next plan).
            if self.recovery.lost(oid).is_some() {
                return Err(PullFailed::Unavailable);
            }
            return Ok(());
        };
        let res = pull
            .result
            .get_or_init(|| self.pull(oid, &pull))
            .await
            .clone();
        if res.is_ok() {
            let mut pending = self.recovery.pending.lock().unwrap();
            match pending.get(&oid) {
                Some(p) if Arc::ptr_eq(p, &pull) => {
                    pending.remove(&oid);
                }
                // A change went through a stand-in while this pull ran (see `acting`): the
                // copy installed may be older than the change, so the object stays pending
                // until a pull of the version it made. (Seed 25764 with `full_restarts`: the
                // round took the earlier pull for the end of the object's recovery, recorded
                // the epoch recovered and never pulled again; the copy here stayed older.)
                Some(p) if p.result.get() == Some(&Err(PullFailed::NoSpace)) => {
                    return Err(PullFailed::NoSpace);
                }
                _ => {}
            }
        }
        res
    }

    /// One round of recovery for `ep`; returns early when the epoch changes.
    async fn recover_epoch(self: &Arc<Self>, ep: Arc<Epoch>) {
        let e = ep.view.epoch;
        let changed = || self.epoch().view.epoch != e;
        self.recovery.update(|s| {
            *s = RecoveryStatus {
                epoch: e,
                data_lost: s.data_lost,
                ..Default::default()
            }
        });
        // The record of who takes changes in this epoch exists from its start, empty: a node
        // absent from it took none (see `history`).
        let d = self.driver.clone();
        match self
            .blocking(move || history::record_changed(&*d, e, None))
            .await
        {
            Ok(Ok(())) => {}
            Ok(Err(err)) => tracing::debug!("epoch {e}: creating its record of changes: {err}"),
            Err(err) => tracing::debug!("epoch {e}: creating its record of changes: {err}"),
        }
        let Some(cfg) = self.config() else {
            // Nothing can be stored before the format.
            *self.recovery.safety.write().unwrap() = Arc::new(Safety::all());
            self.recovery.set_planned(e);
            self.record_recovered(e).await;
            self.recovery.recovered.store(e, Ordering::SeqCst);
            self.recovery.update(|s| s.state = RecoveryState::Done);
            return;
        };
        let copies = cfg.copies as usize;
        let mut wait = RETRY_FIRST;
        loop {
            let (pending, safety, waiting, unsettled, unlisted) =
                match self.plan(&ep, copies, cfg.min_copies() as usize).await {
                    Plan::Changed => return,
                    Plan::Retry => {
                        tokio::time::sleep(wait).await;
                        wait = (wait * 2).min(RETRY_MAX);
                        if changed() {
                            return;
                        }
                        continue;
                    }
                    Plan::Ready {
                        pending,
                        safety,
                        waiting,
                        unsettled,
                        unlisted,
                    } => (pending, safety, waiting, unsettled, unlisted),
                };
            let total = pending.len() as u64;
            if total > 0 {
                tracing::info!("epoch {e}: recovering {total} object(s)");
            }
            let sourceless = pending.values().filter(|p| p.sources.is_empty()).count();
            let complete =
                safety.is_complete() && unlisted.is_empty() && sourceless == 0 && unsettled == 0;
            let (mut waiting_for, waiting_epoch) = safety.waiting_for(None);
            waiting_for.extend(unlisted.iter().copied());
            waiting_for.sort();
            waiting_for.dedup();
            // A pending object with no source (a lost copy no node up holds) waits like the
            // objects the history rule holds back: the round plans again for it.
            let mut oids: Vec<ObjectId> = pending
                .iter()
                .filter(|(_, p)| !p.sources.is_empty())
                .map(|(o, _)| *o)
                .collect();
            oids.sort_unstable();
            *self.recovery.pending.lock().unwrap() = pending;
            *self.recovery.safety.write().unwrap() = safety;
            self.recovery.update(|s| {
                s.total = total;
                s.done = 0;
                s.incomplete = waiting;
                s.waiting_for = waiting_for.clone();
                s.waiting_epoch = waiting_epoch;
                s.state = RecoveryState::Recovering;
            });
            self.recovery.set_planned(e);
            match self.pull_all(e, oids).await {
                Pulled::All => {}
                Pulled::Changed => return,
                Pulled::Failed(n) => {
                    // The sources planned may be gone (a node that lost its copy, or dropped
                    // it since): the next plan lists every node again and finds the holders.
                    tracing::warn!(
                        "epoch {e}: {n} object(s) still not recovered from the sources planned: planning again"
                    );
                    if !self.pause_before_planning(e, &mut wait).await {
                        return;
                    }
                    continue;
                }
            }
            // A flush may have lost a copy while the round pulled: not done until it is back.
            if complete && !self.recovery.any_lost() {
                if total > 0 {
                    tracing::info!("epoch {e}: recovery done");
                }
                break;
            }
            if unlisted.is_empty() && waiting == 0 {
                tracing::info!(
                    "epoch {e}: {unsettled} object(s) wait for other nodes to settle copies lost by failed fdatasyncs, or for copies lost here: planning again"
                );
            } else if unlisted.is_empty() {
                tracing::warn!(
                    "epoch {e}: {waiting} object(s) here may have newer copies only on {} (down; they may hold objects written at epoch {waiting_epoch}): their I/O waits; 'dog cluster recover --force' accepts the loss",
                    waiting_for
                        .iter()
                        .map(|a| a.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                );
            } else {
                tracing::info!(
                    "epoch {e}: no listing from {unlisted:?} (members of this epoch): planning again"
                );
            }
            if !self.pause_before_planning(e, &mut wait).await {
                return;
            }
        }
        self.recovery.recovered.store(e, Ordering::SeqCst);
        self.recovery
            .update(|s| s.state = RecoveryState::Collecting);
        self.collect(&ep, copies).await;
        // The epoch is recorded recovered here only once every stripe this node is the
        // primary of is whole in it: a strip key is never waited for above (its one holder
        // may be down), so without the sweep a clean epoch could have a strip's holder
        // lacking it, and a later holder would take "nothing" for "never made" from that
        // epoch on (seed 70627 with crashes and SIM_EC=2:1: a stripe went back over an
        // acknowledged write).
        let mut wait = RETRY_FIRST;
        let mut paused = false;
        while !self.ec_sweep(&ep).await {
            if !self.pause_before_planning(e, &mut wait).await {
                return;
            }
            paused = true;
        }
        if paused {
            self.recovery.update(|s| s.state = RecoveryState::Done);
        }
        self.record_recovered(e).await;
    }

    /// Waits `wait` (then doubles it, up to [`RETRY_MAX`]) before the round for epoch `e`
    /// plans again, showing it as waiting; false when the epoch changed meanwhile.
    async fn pause_before_planning(&self, e: u32, wait: &mut Duration) -> bool {
        self.recovery.update(|s| s.state = RecoveryState::Waiting);
        tokio::time::sleep(*wait).await;
        *wait = (*wait * 2).min(RETRY_MAX);
        self.epoch().view.epoch == e
    }

    /// Writes this node into the epoch's recovery record, retrying while the store fails.
    async fn record_recovered(&self, e: u32) {
        for attempt in 0..10 {
            let d = self.driver.clone();
            let id = self.me.id;
            match self
                .blocking(move || history::record_recovered(&*d, e, id))
                .await
            {
                Ok(Ok(())) => return,
                Ok(Err(err)) => tracing::warn!("epoch {e}: recording recovery failed: {err}"),
                Err(err) => tracing::warn!("epoch {e}: recording recovery failed: {err}"),
            }
            tokio::time::sleep(RETRY_FIRST * (attempt + 1)).await;
        }
    }
}

/// The recovery task: one round per epoch, restarted whenever the epoch changes, and run
/// again for the same epoch when [`Recovery::plan_again`] asks.
pub(super) async fn run(node: Arc<Node>) {
    let mut rx = node.subscribe();
    loop {
        let ep = rx.borrow_and_update().clone();
        let round = node.recover_epoch(ep);
        tokio::select! {
            biased;
            r = rx.changed() => {
                if r.is_err() {
                    return;
                }
            }
            _ = round => {
                // Wait for the next epoch, or plan this one again when asked.
                tokio::select! {
                    biased;
                    r = rx.changed() => {
                        if r.is_err() {
                            return;
                        }
                    }
                    _ = node.recovery.replan.notified() => {}
                }
            }
        }
    }
}
