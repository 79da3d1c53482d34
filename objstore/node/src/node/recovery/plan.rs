//! Planning a recovery round (step 1 of [`super`]): the listings of the epoch's and the
//! previous epoch's nodes, the history's judgement of what they can vouch for, and for each
//! object this node owns whether it waits, is pulled, or is used as it is; copies lost with a
//! failed `fdatasync` are never a source, and are kept as they are once no node holds what
//! they lost.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::sync::OnceCell;

use super::sweep::{sweep, Input};
use super::Pull;
use crate::node::history::{self, Safety};
use crate::node::reference::{reference, Reference};
use crate::node::{Epoch, Node};
use crate::store::{ObjState, ObjectBackend, StoreError, Version};
use objstore_proto::oid::ObjectId;
use objstore_proto::version::ListRequest;

/// What planning gave.
pub(super) enum Plan {
    /// The epoch changed meanwhile.
    Changed,
    /// The cluster store could not be read; try again.
    Retry,
    Ready {
        pending: HashMap<ObjectId, Arc<Pull>>,
        safety: Arc<Safety>,
        /// Objects held or listed that wait for nodes that are down.
        waiting: u64,
        /// Objects of which another node lost a newer version and has not decided what
        /// remains: the round plans again.
        unsettled: u64,
        /// Members of the epoch whose listing did not come: their copies, maybe the newest
        /// of some objects, were not seen, so the round plans again until they answer.
        unlisted: Vec<SocketAddr>,
    },
}

impl Node {
    /// Builds the pending set for `ep` and judges which objects must wait.
    pub(super) async fn plan(&self, ep: &Arc<Epoch>, copies: usize, min_copies: usize) -> Plan {
        let started = std::time::Instant::now();
        let e = ep.view.epoch;
        let d = self.driver.clone();
        let prev = self
            .blocking(move || d.view_at(e - 1))
            .await
            .ok()
            .and_then(Result::ok)
            .flatten();
        let mut ids: HashMap<SocketAddr, u64> = HashMap::new();
        for n in ep
            .view
            .nodes
            .iter()
            .chain(prev.iter().flat_map(|p| &p.nodes))
        {
            ids.insert(n.addr, n.id);
        }
        ids.remove(&self.me.addr);
        let mut sources: Vec<SocketAddr> = ids.keys().copied().collect();
        sources.sort();
        // Only what this node holds in the epoch, and its lost copies it no longer holds (it
        // must learn whether a newer copy is held elsewhere before it drops or keeps them).
        let req = ListRequest {
            owner: self.me.id,
            copies: copies as u32,
            part: 0,
            parts: 1,
            extra: (self.recovery.lost_copies().into_iter())
                .map(|(oid, _)| oid)
                .filter(|&oid| !ep.ring.holds(self.me.id, oid, copies))
                .collect(),
        };
        let got = self.list_peers(ep, &sources, &req).await;
        let d = self.driver.clone();
        let hist = match self.blocking(move || history::load(&*d, e)).await {
            Ok(Ok(h)) => h,
            Ok(Err(err)) => {
                tracing::warn!("epoch {e}: cannot read the cluster's history: {err}");
                return Plan::Retry;
            }
            Err(err) => {
                tracing::warn!("epoch {e}: cannot read the cluster's history: {err}");
                return Plan::Retry;
            }
        };
        if self.epoch().view.epoch != e {
            return Plan::Changed;
        }
        let listings = got.lists;
        let known: u64 = listings.iter().flatten().map(|l| l.len() as u64).sum();
        let unlisted: Vec<SocketAddr> = sources
            .iter()
            .zip(&listings)
            .filter(|(a, l)| l.is_none() && ep.view.nodes.iter().any(|n| n.addr == **a))
            .map(|(a, _)| *a)
            .collect();
        let mut present: HashSet<u64> = HashSet::from([self.me.id]);
        let mut listed = Vec::with_capacity(sources.len());
        for (addr, list) in sources.iter().zip(listings) {
            let Some(list) = list else { continue };
            present.insert(ids[addr]);
            listed.push((*addr, list));
        }
        let safety = Arc::new(Safety::judge(&hist, e, &present, copies, min_copies));
        let input = Input {
            me: self.me.id,
            copies,
            ring: ep.ring.clone(),
            safety: safety.clone(),
            listings: listed,
            local: Vec::new(),
            lost_here: self.recovery.lost_copies().into_iter().collect(),
            extra: req.extra.iter().copied().collect(),
        };
        let store = self.store.clone();
        let found = match self
            .blocking(move || {
                sweep(Input {
                    local: store.list(),
                    ..input
                })
            })
            .await
        {
            Ok(found) => found,
            Err(err) => {
                tracing::warn!("epoch {e}: planning: {err}");
                return Plan::Retry;
            }
        };
        let mut pending = HashMap::new();
        let mut waiting = 0;
        let mut unsettled = 0;
        let all_listed = unlisted.is_empty() && safety.is_complete();
        for f in found {
            let (oid, owned, holders) = (f.oid, f.owned, f.holders);
            let lost_want = self.recovery.lost(oid);
            if !owned {
                if let Some(want) = lost_want {
                    self.drop_lost_unowned(e, oid, want, &holders, all_listed)
                        .await;
                }
                continue;
            }
            if !safety.safe(oid) {
                waiting += 1;
                continue;
            }
            let mut mine = f.mine;
            if let Some(want) = lost_want {
                // Only a copy at least as new as the one lost will do; none up: it waits,
                // unless every node that could hold one listed its copies and none has it
                // (the data is gone everywhere: the flush that lost it failed, so it was never
                // promised durable): then what remains here competes with the newest copy
                // there is, as a suspect copy.
                let sources: Vec<SocketAddr> = holders
                    .iter()
                    .filter(|(_, st)| st.version >= want)
                    .map(|(a, _)| *a)
                    .collect();
                if !sources.is_empty() || !all_listed {
                    if sources.is_empty() {
                        waiting += 1;
                    }
                    pending.insert(
                        oid,
                        Arc::new(Pull {
                            want: ObjState::live(want),
                            sources,
                            result: OnceCell::new(),
                        }),
                    );
                    continue;
                }
                match self.accept_lost(e, oid, want).await {
                    Some(st) => mine = st,
                    None => {
                        // Could not even keep what remains: it stays lost, planned again.
                        waiting += 1;
                        pending.insert(
                            oid,
                            Arc::new(Pull {
                                want: ObjState::live(want),
                                sources: Vec::new(),
                                result: OnceCell::new(),
                            }),
                        );
                        continue;
                    }
                }
            }
            // Another node lost a version newer than this copy and may yet keep what remains
            // of it: whatever is decided now, plan again once it has.
            if f.lost_elsewhere
                .is_some_and(|w| mine.is_none_or(|m| m.version < w))
            {
                unsettled += 1;
            }
            let chosen = reference(self.me.id, &ids, mine, &holders);
            let (suspect, want) = match &chosen {
                Reference::Mine => (mine.is_some_and(|m| m.suspect), mine.unwrap_or_default()),
                Reference::Pull(want, _) => (want.suspect, *want),
            };
            // The reference among suspect copies is the one on the lowest id of every holder,
            // and any copy that is not suspect wins over them: a node whose listing did not
            // come may hold either. Settled, or pulled (the pulled copy is installed as not
            // suspect), only once every node listed (seeds 4249 and 5192: two owners, each
            // missing the other's listing, both settled their own, different, suspect copy;
            // seeds 733 and 17 with power cuts: a node pulled another's suspect copy while the
            // one whose listing was missing held that version as it was synced); until then its
            // requests wait and the round plans again.
            if suspect && !all_listed {
                waiting += 1;
                pending.insert(
                    oid,
                    Arc::new(Pull {
                        want,
                        sources: Vec::new(),
                        result: OnceCell::new(),
                    }),
                );
                continue;
            }
            match chosen {
                Reference::Mine => {
                    if let Some(m) = mine.filter(|m| m.suspect) {
                        // Every copy of the newest version was being written when its node
                        // stopped: this one is the reference the others copy.
                        let store = self.store.clone();
                        let _ordered = self.replica_lock(oid).lock().await;
                        let settled = self.blocking(move || settle(&*store, oid, m, e)).await;
                        if !matches!(settled, Ok(Ok(()))) {
                            tracing::warn!("epoch {e}: could not settle suspect object {oid}");
                        }
                    }
                }
                Reference::Pull(want, sources) => {
                    pending.insert(
                        oid,
                        Arc::new(Pull {
                            want,
                            sources,
                            result: OnceCell::new(),
                        }),
                    );
                }
            }
        }
        self.recovery.update(|s| {
            s.plan_entries = got.entries;
            s.plan_digests = got.digests;
            s.plan_listed = known;
            s.plan_requests = got.requests;
            s.plan_ms = started.elapsed().as_millis() as u64;
        });
        Plan::Ready {
            pending,
            safety,
            waiting,
            unsettled,
            unlisted,
        }
    }

    /// Keeps what remains of this node's lost copy of `oid` (no node holds the version lost,
    /// `want`): it becomes a suspect copy at the version last made durable here. None when the
    /// store failed; the copy stays lost.
    async fn accept_lost(&self, e: u32, oid: ObjectId, want: Version) -> Option<Option<ObjState>> {
        let store = self.store.clone();
        let _ordered = self.replica_lock(oid).lock().await;
        match self.blocking(move || store.accept_lost(oid)).await {
            Ok(Ok(st)) => {
                tracing::error!(
                    "epoch {e}: object {oid}: no node holds the data this node lost at {want:?} (a failed fdatasync or a checksum mismatch); keeping what remains here ({st:?}) to compare with the other copies"
                );
                self.recovery.unlose(oid);
                self.recovery.update(|s| s.data_lost += 1);
                Some(st)
            }
            Ok(Err(err)) => {
                tracing::warn!("epoch {e}: object {oid}: keeping what remains failed: {err}");
                None
            }
            Err(err) => {
                tracing::warn!("epoch {e}: object {oid}: keeping what remains failed: {err}");
                None
            }
        }
    }

    /// A lost copy of an object this node no longer owns: dropped once a copy at least as new
    /// is held elsewhere (the owners recover from it), or kept as a suspect copy (which the
    /// owners then see) once every node listed and none holds one.
    async fn drop_lost_unowned(
        &self,
        e: u32,
        oid: ObjectId,
        want: Version,
        holders: &[(SocketAddr, ObjState)],
        all_listed: bool,
    ) {
        if holders.iter().any(|(_, st)| st.version >= want) {
            let store = self.store.clone();
            let _ordered = self.replica_lock(oid).lock().await;
            if matches!(self.blocking(move || store.forget(oid)).await, Ok(Ok(()))) {
                self.recovery.unlose(oid);
            }
        } else if all_listed {
            let _ = self.accept_lost(e, oid, want).await;
        }
    }
}

/// Makes this node's suspect copy `mine` of `oid` the reference its replicas copy, in epoch
/// `e`. A replicated object's copy is installed again at version `e.0`, newer than any made
/// before epoch `e` and older than every change its primary makes in it: its bytes may hold
/// writes made after its version (a power cut wrote back part of them), so under its own
/// version it would name other bytes than a copy of that version that came back as it was
/// synced, on a node down now (seed 142 with power cuts: that node returned and kept its
/// copy, the others this one, both not suspect at one version). A strip keeps its version
/// (its stripe's versions and notes decide it) and is only declared settled, as is a copy
/// already at a version of epoch `e`.
fn settle(
    store: &dyn ObjectBackend,
    oid: ObjectId,
    mine: ObjState,
    e: u32,
) -> Result<(), StoreError> {
    let settled = Version((e as u64) << 32);
    if oid.strip_index().is_some() || mine.deleted || mine.version >= settled {
        return store.settle(oid);
    }
    let (data, now) = store.read_whole(oid)?;
    if !now.suspect || now.deleted || now.version >= settled {
        // Changed since the plan listed it (a pull came first): settling is a no-op then.
        return store.settle(oid);
    }
    store.put_if_newer(oid, &data, ObjState::live(settled))?;
    Ok(())
}
