//! Repair after a change that failed on some owner: the primary brings every owner of the
//! object back to one version, in the background, retrying until it succeeds, the epoch
//! changes (recovery then compares versions anyway) or this node is no longer the primary.
//!
//! A failed change may have been applied by some owners and not others (the primary itself
//! among either). Reads go to the primary first and fall back to the others, so until the
//! owners agree a read could see the change and a later one not: the repair makes them agree
//! without waiting for the next write to the object. The newest version among the owners wins
//! (a change that failed but was applied somewhere counts as in flight, and an in-flight change
//! may take effect); a copy of that version that is not suspect wins over a suspect one.
//!
//! Also the repair of a copy a failed `fdatasync` lost: `Flush` restores it from another
//! owner before answering ([`Node::restore_lost`]), and listings mark it lost meanwhile.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::replicate::FORWARD_TIMEOUT;
use super::server::Failure;
use super::Node;
use crate::store::{ObjState, StoreError, Version};
use objstore_proto::frame::{Frame, Header, Opcode, ResultCode};
use objstore_proto::oid::ObjectId;

const REPAIR_FIRST: Duration = Duration::from_millis(200);
const REPAIR_MAX: Duration = Duration::from_secs(5);

impl Node {
    /// Starts repairing `oid` in the background unless a repair of it for this epoch is
    /// already running (one for an older epoch ends on its own).
    pub(super) fn schedule_repair(self: &Arc<Self>, epoch: u32, oid: ObjectId) {
        if self.repairing.lock().unwrap().insert(oid, epoch) == Some(epoch) {
            return;
        }
        let node = self.clone();
        self.spawn(async move {
            let mut wait = REPAIR_FIRST;
            loop {
                tokio::time::sleep(wait).await;
                if node.epoch().view.epoch != epoch {
                    break;
                }
                match node.repair(epoch, oid).await {
                    Ok(()) => break,
                    Err(why) => tracing::debug!("repair of {oid}: {why}; retrying"),
                }
                wait = (wait * 2).min(REPAIR_MAX);
            }
            let mut repairing = node.repairing.lock().unwrap();
            if repairing.get(&oid) == Some(&epoch) {
                repairing.remove(&oid);
            }
        });
    }

    /// One attempt (see the module documentation).
    async fn repair(&self, epoch: u32, oid: ObjectId) -> Result<(), String> {
        let ep = self.epoch();
        let cfg = self.config().ok_or("not formatted")?;
        if ep.view.epoch != epoch {
            return Ok(());
        }
        let owners = ep.ring.replicas(oid, cfg.copies as usize);
        if owners.first().map(|n| n.id) != Some(self.me.id) {
            return Ok(());
        }
        let others: Vec<SocketAddr> = owners[1..].iter().map(|n| n.addr).collect();
        // The copy here is compared and sent only once recovered: a change that went through
        // a stand-in (this node's disk full, see `acting`) left it older than the stand-in's
        // until a pull brings that here. (Seed 20382 with `full_restarts`: the primary's
        // pending copy never took the change its replicas failed, and they kept the older.)
        self.ensure_recovered(oid)
            .await
            .map_err(|why| format!("the copy here is not recovered: {why:?}"))?;
        let _ordered = self.obj_lock(oid).lock().await;
        let mut states = Vec::new();
        for &a in &others {
            states.push((a, self.stat_peer(a, epoch, oid).await?));
        }
        // Take the newest version an owner holds, if it is newer than this copy.
        let local = self.store.meta(oid);
        let newest = states
            .iter()
            .filter_map(|(a, s)| s.map(|s| (*a, s)))
            .filter(|(_, s)| local.is_none_or(|l| l.replaced_by(*s)))
            .max_by_key(|(_, s)| (s.version, !s.suspect));
        if let Some((from, _)) = newest {
            self.take_from(from, epoch, oid).await?;
        }
        // Then send this copy to every owner whose copy is older (or suspect).
        let Some(mine) = self.store.meta(oid) else {
            return Ok(());
        };
        let store = self.store.clone();
        let whole = super::server::blocking(self, move || store.read_whole(oid))
            .await
            .map_err(|f| f.message)?;
        for (a, s) in states {
            if s.is_some_and(|s| !s.replaced_by(mine)) {
                continue;
            }
            let mut h = Header::request(Opcode::PeerPut, 0, epoch);
            h.oid = oid.0;
            h.offset = whole.1.version.0;
            h.aux = whole.1.flags();
            let f = self.peer_call(a, h, Bytes::from(whole.0.clone())).await?;
            if f.header.result_code() != ResultCode::Ok {
                return Err(format!("{a}: {}", f.message()));
            }
        }
        tracing::info!("object {oid}: owners back at one version ({mine:?}) after a failed change");
        Ok(())
    }

    /// What owner `addr` holds of `oid` (None: nothing).
    pub(super) async fn stat_peer(
        &self,
        addr: SocketAddr,
        epoch: u32,
        oid: ObjectId,
    ) -> Result<Option<ObjState>, String> {
        let mut h = Header::request(Opcode::StatObj, 0, epoch);
        h.oid = oid.0;
        let f = self.peer_call(addr, h, Bytes::new()).await?;
        match f.header.result_code() {
            ResultCode::Ok => Ok(Some(ObjState::from_wire(f.header.offset, f.header.aux))),
            // Nothing there (or not recovered there yet): it takes this copy.
            ResultCode::NotFound => Ok(None),
            _ => Err(format!("{addr}: {}", f.message())),
        }
    }

    /// Which of `candidates` (this node skipped) hold `oid` at `want` or newer and can give
    /// it (a lost copy cannot), newest first and a suspect copy after a sound one of the same
    /// version: the sources to restore a copy here from.
    pub(super) async fn holders_from(
        &self,
        candidates: impl IntoIterator<Item = SocketAddr>,
        epoch: u32,
        oid: ObjectId,
        want: Version,
    ) -> Vec<SocketAddr> {
        let mut held = Vec::new();
        for a in candidates {
            if a == self.me.addr {
                continue;
            }
            if let Ok(Some(st)) = self.stat_peer(a, epoch, oid).await {
                if st.version >= want && !st.lost {
                    held.push((a, st));
                }
            }
        }
        held.sort_by_key(|(_, st)| std::cmp::Reverse((st.version, !st.suspect)));
        held.into_iter().map(|(a, _)| a).collect()
    }

    /// One request to a peer; Err (the connection dropped) only when no answer came.
    async fn peer_call(
        &self,
        addr: SocketAddr,
        h: Header,
        payload: Bytes,
    ) -> Result<Frame, String> {
        self.peer_call_within(addr, h, payload, FORWARD_TIMEOUT)
            .await
    }

    /// [`Node::peer_call`] waiting up to `timeout` for the answer.
    pub(super) async fn peer_call_within(
        &self,
        addr: SocketAddr,
        h: Header,
        payload: Bytes,
        timeout: Duration,
    ) -> Result<Frame, String> {
        let conn = self
            .peers
            .get(addr, timeout)
            .await
            .map_err(|e| e.to_string())?;
        match conn.call(h, payload, timeout).await {
            Ok(f) => Ok(f),
            Err(e) => {
                self.peers.drop_conn(addr).await;
                Err(e.to_string())
            }
        }
    }

    /// Installs `addr`'s copy of `oid` here.
    async fn take_from(&self, addr: SocketAddr, epoch: u32, oid: ObjectId) -> Result<(), String> {
        let mut h = Header::request(Opcode::PeerRead, 0, epoch);
        h.oid = oid.0;
        let f = self.peer_call(addr, h, Bytes::new()).await?;
        if f.header.result_code() != ResultCode::Ok {
            return Err(format!("{addr}: {}", f.message()));
        }
        let state = ObjState::from_wire(f.header.offset, f.header.aux);
        let (data, note) = super::ec::split_pulled(oid, &f.payload, state.version)
            .ok_or_else(|| format!("{addr}: a malformed strip"))?;
        let store = self.store.clone();
        let _replica = self.replica_lock(oid).lock().await;
        let note = self.pulled_note(oid, note, state.version);
        let installed = super::server::blocking(self, move || {
            let installed = store.put_if_newer(oid, &data, state)?;
            if let (true, Some(note)) = (installed, note) {
                store.set_note(oid, &note)?;
                store.sync_object(oid)?;
            }
            Ok(installed)
        })
        .await
        .map_err(|f| f.message)?;
        if installed {
            self.recovery.restored(oid, state.version);
        }
        Ok(())
    }
}

/// Tries of [`Node::restore_lost`] for one copy before a flush fails, and the pause between.
const RESTORE_TRIES: u32 = 3;
const RESTORE_PAUSE: std::time::Duration = std::time::Duration::from_millis(200);

impl Node {
    /// Restores copies whose data a failed flush may have lost: each is held (its I/O waits
    /// meanwhile; the local copy stays, unreadable, so nothing treats the object as new) and
    /// pulled again from an owner holding at least the version lost (`want`). Err names the
    /// first that no owner up holds that new: the data the flush was to make durable is not
    /// here, the flush must fail, and the object stays held until such a copy is found; the
    /// recovery round plans it again (and keeps what remains once no node holds that data).
    pub(super) async fn restore_lost(&self, lost: &[(ObjectId, Version)]) -> Result<(), ObjectId> {
        let mut first_err = None;
        // First of all, for every copy before the first wait: from now on nothing uses it as
        // it is (the store already refuses it; this makes its I/O wait, `Busy`).
        for &(oid, want) in lost {
            self.recovery.lose(oid, want);
        }
        for &(oid, want) in lost {
            // A few tries: an owner may not answer in the moment (an epoch changing, a heal),
            // and another restorer of the same copy may finish meanwhile.
            let mut restored = false;
            for attempt in 0..RESTORE_TRIES {
                if attempt > 0 {
                    tokio::time::sleep(RESTORE_PAUSE).await;
                }
                if self.restore_one(oid, want).await {
                    restored = true;
                    break;
                }
            }
            if restored {
                tracing::info!(
                    "object {oid} restored from another replica (its copy here was lost)"
                );
            } else {
                let want = self.recovery.lost(oid).unwrap_or(want);
                tracing::error!(
                    "object {oid}: its data at {want:?} is lost here (a failed fdatasync or a bad copy) and no other owner up gives it; it stays unreadable here and is planned again"
                );
                self.recovery.plan_again();
                first_err.get_or_insert(oid);
            }
        }
        match first_err {
            Some(oid) => Err(oid),
            None => Ok(()),
        }
    }

    /// One try of [`Node::restore_lost`] for `oid`: holds it, asks the owners of the current
    /// epoch which holds the version lost (`want`, or a later one lost since) and pulls it.
    /// True once no copy here counts as lost: restored by this pull, or by another restorer
    /// of the same copy (a check restoring it, whose hold this one replaced) meanwhile.
    async fn restore_one(&self, oid: ObjectId, want: Version) -> bool {
        let Some(want) = self.recovery.lost(oid).map(|w| w.max(want)) else {
            return true;
        };
        let ep = self.epoch();
        let epoch = ep.view.epoch;
        let copies = self.config().map(|c| c.copies as usize).unwrap_or(1);
        let hold = self.recovery.hold(oid, ObjState::live(want));
        let owners: Vec<SocketAddr> = ep
            .ring
            .replicas(oid, copies)
            .iter()
            .map(|n| n.addr)
            .collect();
        let sources = self.holders_from(owners, epoch, oid, want).await;
        self.recovery.release(oid, &hold, sources);
        // Restored only when a copy at least as new as the one lost is installed (either
        // restorer's install clears `lost`).
        let pulled = self.ensure_recovered(oid).await.is_ok();
        let restored = self.recovery.lost(oid).is_none();
        if restored && !pulled {
            let have = self.store.meta(oid).map(|s| s.version);
            self.recovery.drop_failed_pull(oid, have);
        }
        restored
    }

    /// `Flush`: every write before it made durable here. Copies whose `fdatasync` failed, now
    /// or at an earlier flush, and that are not restored yet, are restored from the other
    /// owners first (installed durably), or the flush fails: an `fdatasync` error is never
    /// followed by a success for the same data.
    pub(super) async fn flush_here(&self) -> Result<(), Failure> {
        let store = self.store.clone();
        let mut lost = match self.blocking(move || store.flush()).await {
            Ok(Ok(())) => Vec::new(),
            Ok(Err(StoreError::SyncFailed { oids, source })) => {
                tracing::error!(
                    "flush could not make {} object(s) durable ({source}); restoring them from other replicas",
                    oids.len()
                );
                oids
            }
            Ok(Err(e)) => return Err(e.into()),
            Err(e) => return Err(super::server::task_failure(e)),
        };
        for (oid, want) in self.recovery.lost_copies() {
            if !lost.iter().any(|(o, _)| *o == oid) {
                lost.push((oid, want));
            }
        }
        if lost.is_empty() {
            return Ok(());
        }
        self.restore_lost(&lost).await.map_err(|oid| {
            Failure::new(
                ResultCode::Io,
                format!(
                    "object {oid} could not be made durable here and no replica could restore it"
                ),
            )
        })
    }

    /// What a `PeerList` without a request answers: every copy here with its state, a copy
    /// lost by a failed flush and not restored shown at the version lost and marked lost
    /// ([`ObjState::lost`]).
    pub(super) fn listing(&self) -> Vec<(ObjectId, ObjState)> {
        self.with_lost(self.store.list(), |_| true)
    }

    /// `list` (sorted by id) with this node's lost copies that `wanted` accepts shown lost.
    pub(super) fn with_lost(
        &self,
        mut list: Vec<(ObjectId, ObjState)>,
        wanted: impl Fn(ObjectId) -> bool,
    ) -> Vec<(ObjectId, ObjState)> {
        for (oid, want) in self.recovery.lost_copies() {
            if wanted(oid) {
                show_lost(&mut list, oid, want);
            }
        }
        list
    }
}

/// Shows `oid` lost at version `want` in `list` (sorted by id): its entry replaced, or added.
pub(super) fn show_lost(list: &mut Vec<(ObjectId, ObjState)>, oid: ObjectId, want: Version) {
    let lost = ObjState {
        lost: true,
        ..ObjState::live(want)
    };
    match list.binary_search_by_key(&oid, |(o, _)| *o) {
        Ok(i) => list[i].1 = lost,
        Err(i) => list.insert(i, (oid, lost)),
    }
}
