//! Changes of objects, ordered by their primary.
//!
//! A client sends a write or a remove to the object's primary (its first owner in the epoch).
//! The primary, holding the object's lock, gives the change the next version
//! ([`Version::next`]), applies it and forwards it to every other owner at the same time
//! (`PeerWrite` for a write, with the version it applies on; `PeerPut` of a tombstone for a
//! remove, and of the whole object for a `Put`). A replica applies a forwarded write only if
//! its copy is exactly at that base version; otherwise it answers `Diverged` and the primary
//! sends it the whole object at the new version (`PeerPut`). So every replica holding a version holds the same bytes, whoever wrote
//! and whatever failed before. The client's answer is Ok only when every owner holds the new
//! version; a change that failed somewhere is reported failed, and the version it used is
//! remembered so the next change of that object goes above it (the replicas converge on it).
//!
//! Fencing: a change registers under the epoch it was checked against ([`Node::enter`]) before
//! the check, and a node answers the recovery listing of a new epoch only once no change of an
//! older epoch is still being applied ([`Node::drain_before`]), so a listing never misses a
//! change that an old epoch's owners are about to acknowledge.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;

use super::acting::Acting;
use super::server::Failure;
use super::{Epoch, Node};
use crate::store::{sums, ObjState, Version};
use objstore_proto::frame::{Header, Opcode, ResultCode};
use objstore_proto::oid::ObjectId;
use objstore_proto::payload::{peer_cow_prefix, peer_write_prefix};
use objstore_proto::view::ClusterConfig;

pub(super) const LOCK_SHARDS: usize = 1024;
/// How long the primary waits for a replica. Shorter than a client's per-request timeout, so a
/// replica that hangs costs the client a retry (on the next epoch, once membership has dropped
/// the silent node), not an error.
/// Writes up to this size go into the store on the request's task when it can take them at
/// once (an in-place write into the page cache costs less than a hop to the blocking pool).
pub(super) const INLINE_WRITE: usize = 64 << 10;
pub(super) const FORWARD_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a listing waits for changes of older epochs to finish.
const DRAIN_WAIT: Duration = Duration::from_secs(10);

/// What the primary applies.
pub(super) enum Change {
    Write {
        offset: u64,
        data: Bytes,
    },
    /// A whole new object, durable on every owner when the change is acknowledged (a store
    /// creates a data object a `Write` makes without a sync: see
    /// [`crate::store::creates_unsynced`]): `PeerPut` to the replicas.
    Put {
        data: Bytes,
    },
    Remove,
    /// Whole blocks of a partial copy-on-write target ([`objstore_proto::cowrec`]) written
    /// and marked present: with `source`, the change creates the target (a missing object)
    /// with that source; without, it fills blocks of an existing one (`PeerCow` to the
    /// replicas; see [`Node::apply_cow_store`]).
    Cow {
        offset: u64,
        data: Bytes,
        source: Option<ObjectId>,
        object_size: u64,
    },
}

impl Change {
    /// What a `Put` or a `Remove` installs at version `new` (`put_if_newer`, `PeerPut`).
    fn installs(&self, new: Version) -> (ObjState, Bytes) {
        match self {
            Change::Put { data } => (ObjState::live(new), data.clone()),
            _ => (ObjState::tombstone(new), Bytes::new()),
        }
    }
}

/// Changes in progress by epoch, and a wakeup for [`Node::drain_before`].
#[derive(Default)]
pub(super) struct Inflight {
    by_epoch: Mutex<BTreeMap<u32, usize>>,
    done: tokio::sync::Notify,
}

/// A change in progress; dropping it ends it.
pub(super) struct Entered<'a> {
    node: &'a Node,
    epoch: u32,
}

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        let mut m = self.node.inflight.by_epoch.lock().unwrap();
        if let Some(n) = m.get_mut(&self.epoch) {
            *n -= 1;
            if *n == 0 {
                m.remove(&self.epoch);
            }
        }
        drop(m);
        self.node.inflight.done.notify_waiters();
    }
}

/// How one replica took a forwarded change.
enum Forwarded {
    Applied,
    /// Its copy is not at the base version: it needs the whole object.
    Diverged(SocketAddr),
    Failed(Failure),
}

/// A replica's failure as the primary reports it to the client.
fn replica_failure(addr: SocketAddr, code: ResultCode, message: String) -> Failure {
    match code {
        ResultCode::NoSpace | ResultCode::Io | ResultCode::InvalidRequest => {
            Failure::new(code, format!("replica {addr}: {message}"))
        }
        _ => Failure::new(ResultCode::Busy, format!("replica {addr}: {message}")),
    }
}

/// A change refused because `oid` is at `base`, not at the version the client expected; the
/// answer carries `base` so the client retries from it.
pub(super) fn conflict(oid: ObjectId, base: Version, expected: Version) -> Failure {
    let mut f = Failure::new(
        ResultCode::Conflict,
        format!("object {oid} is at {base:?}, the change expects {expected:?}"),
    );
    f.version = Some(base);
    f
}

/// The block sums a `PeerWrite` carries, if any: only for whole blocks, one a block.
pub(super) fn given_sums(
    offset: u64,
    data: &[u8],
    sums: Vec<u32>,
) -> Result<Option<Arc<[u32]>>, Failure> {
    if sums.is_empty() {
        return Ok(None);
    }
    if sums::given(offset, data.len(), Some(&sums)).is_none() {
        return Err(Failure::invalid(format!(
            "PeerWrite carries {} block sum(s) for {} bytes at offset {offset}: sums come only \
             with whole {}-byte blocks, one a block",
            sums.len(),
            data.len(),
            sums::BLOCK
        )));
    }
    Ok(Some(sums.into()))
}

fn shard(oid: ObjectId) -> usize {
    let h = oid.0.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (h >> 32) as usize % LOCK_SHARDS
}

impl Node {
    /// The primary's lock for `oid`.
    pub(super) fn obj_lock(&self, oid: ObjectId) -> &tokio::sync::Mutex<()> {
        &self.obj_locks[shard(oid)]
    }

    /// The primary's lock of erasure-coded object `oid` (see `Node::ec_locks`).
    pub(super) fn ec_lock(&self, oid: ObjectId) -> &tokio::sync::RwLock<()> {
        &self.ec_locks[shard(oid)]
    }

    /// A replica's lock for `oid`: a different lock from the primary's, since a node is
    /// primary of some objects and replica of others in one shard, and two primaries
    /// forwarding to each other must never wait on each other's lock.
    pub(super) fn replica_lock(&self, oid: ObjectId) -> &tokio::sync::Mutex<()> {
        &self.replica_locks[shard(oid)]
    }

    /// Registers a change checked against `epoch`; call before checking it.
    pub(super) fn enter(&self, epoch: u32) -> Entered<'_> {
        *self
            .inflight
            .by_epoch
            .lock()
            .unwrap()
            .entry(epoch)
            .or_default() += 1;
        Entered { node: self, epoch }
    }

    /// Waits until no change checked against an epoch before `epoch` is in progress. False if
    /// that took too long.
    pub(super) async fn drain_before(&self, epoch: u32) -> bool {
        let deadline = tokio::time::Instant::now() + DRAIN_WAIT;
        loop {
            let done = self.inflight.done.notified();
            tokio::pin!(done);
            done.as_mut().enable();
            let busy = self
                .inflight
                .by_epoch
                .lock()
                .unwrap()
                .range(..epoch)
                .next()
                .is_some();
            if !busy {
                return true;
            }
            if tokio::time::timeout_at(deadline, done).await.is_err() {
                return false;
            }
        }
    }

    /// The other owners of `oid` in `ep` if this node is its primary, with the checks a change
    /// needs: this node is the primary, and enough owners are up.
    pub(super) fn primary_of(
        &self,
        ep: &Epoch,
        cfg: &ClusterConfig,
        oid: ObjectId,
    ) -> Result<Vec<SocketAddr>, Failure> {
        let owners = ep.ring.replicas(oid, cfg.copies as usize);
        if owners.first().map(|n| n.id) != Some(self.me.id) {
            return Err(Failure::invalid(format!(
                "{} is not the primary of object {oid} in epoch {}",
                self.me.addr, ep.view.epoch
            )));
        }
        let min = cfg.min_copies() as usize;
        if owners.len() < min {
            return Err(Failure::new(
                ResultCode::Busy,
                format!(
                    "object {oid} has {} owner(s) up and writes need {min} (min-copies): waiting for nodes to join",
                    owners.len()
                ),
            ));
        }
        Ok(owners[1..].iter().map(|n| n.addr).collect())
    }

    /// Applies `change` to `oid` as its primary (see the module documentation).
    pub(super) async fn change(
        self: &Arc<Self>,
        ep: &Epoch,
        oid: ObjectId,
        others: &[SocketAddr],
        expected: Version,
        change: Change,
        acting: &Acting,
    ) -> Result<Version, Failure> {
        // The primary sums a write of whole blocks once, for its own copy and every replica's.
        let sums = match &change {
            Change::Write { offset, data } | Change::Cow { offset, data, .. }
                if sums::whole_blocks(*offset, data.len()) =>
            {
                Some(self.block_sums(data.clone()).await?)
            }
            _ => None,
        };
        let _ordered = self.obj_lock(oid).lock().await;
        // Through a stand-in, the change applies on its copy, not on this node's (see
        // `acting`); a pull installing here waits until the pull pending wants the change.
        let (base, _stand_in_order) = match acting {
            Acting::Here => (
                self.store.meta(oid).map(|c| c.version).unwrap_or_default(),
                None,
            ),
            Acting::Through(s) => {
                let order = self.replica_lock(oid).lock().await;
                self.still_standing_in(oid, s)?;
                (s.state.version, Some(order))
            }
        };
        if expected != base {
            // The client last saw the object at another version (or saw none, and there is
            // one): this is an attempt it gave up on, arriving late, or the object changed
            // since. Never applied over it; the client retries from `base`.
            return Err(conflict(oid, base, expected));
        }
        let new = self.version_floor(oid, base).next(ep.view.epoch);
        let epoch = ep.view.epoch;

        let store = self.store.clone();
        let local = async {
            if let Acting::Through(s) = acting {
                return match self
                    .forward(s.addr, epoch, oid, (base, new), &change, sums.as_deref())
                    .await
                {
                    Forwarded::Applied => {
                        let state = match change {
                            Change::Remove => ObjState::tombstone(new),
                            _ => ObjState::live(new),
                        };
                        self.relayed(oid, state, s.addr);
                        Ok(())
                    }
                    Forwarded::Diverged(_) => Err(Failure::new(
                        ResultCode::NoSpace,
                        format!(
                            "object {oid} is not recovered here (no space left on the node's disk) and its copy on {} is not at {base:?}",
                            s.addr
                        ),
                    )),
                    Forwarded::Failed(f) => Err(f),
                };
            }
            match &change {
                Change::Write { offset, data } => {
                    self.write_store(oid, *offset, data.clone(), sums.clone(), new)
                        .await
                }
                Change::Put { .. } | Change::Remove => {
                    let (state, data) = change.installs(new);
                    super::server::blocking(self, move || {
                        store.put_if_newer(oid, &data, state).map(|_| ())
                    })
                    .await
                }
                Change::Cow {
                    offset,
                    data,
                    source,
                    object_size,
                } => {
                    self.apply_cow_store(
                        oid,
                        *offset,
                        data.clone(),
                        sums.clone(),
                        *source,
                        new,
                        *object_size,
                    )
                    .await
                }
            }
        };
        let remote = futures::future::join_all(
            others
                .iter()
                .map(|&a| self.forward(a, epoch, oid, (base, new), &change, sums.as_deref())),
        );
        let (local, remote) = tokio::join!(local, remote);

        let mut failure = local.err();
        if failure.is_none() {
            for r in remote {
                let r = match r {
                    Forwarded::Diverged(addr) => self.push(addr, epoch, oid).await,
                    other => other,
                };
                if let Forwarded::Failed(f) = r {
                    failure.get_or_insert(f);
                }
            }
        }
        match failure {
            None => {
                self.issued.lock().unwrap().remove(&oid);
                Ok(new)
            }
            Some(f) => {
                self.raise_floor(oid, new);
                // Some owners may hold the change and others not: bring them to one version
                // now rather than at the object's next write.
                self.schedule_repair(epoch, oid);
                Err(self.retry_io(f))
            }
        }
    }

    /// The sums of `data`'s blocks (on the blocking pool when it is large).
    async fn block_sums(&self, data: Bytes) -> Result<Arc<[u32]>, Failure> {
        if data.len() <= INLINE_WRITE {
            return Ok(sums::sums_of(&data).into());
        }
        super::server::blocking(self, move || Ok(sums::sums_of(&data).into())).await
    }

    /// Sends `change` (from version `base` to `new`) to the replica at `addr`, with the
    /// primary's block sums of a write when it has them.
    async fn forward(
        &self,
        addr: SocketAddr,
        epoch: u32,
        oid: ObjectId,
        (base, new): (Version, Version),
        change: &Change,
        sums: Option<&[u32]>,
    ) -> Forwarded {
        let conn = match self.peers.get(addr, FORWARD_TIMEOUT).await {
            Ok(c) => c,
            Err(e) => return Forwarded::Failed(Failure::new(ResultCode::Busy, e.to_string())),
        };
        let res = match change {
            Change::Write { offset, data } | Change::Cow { offset, data, .. } => {
                let sums = sums.unwrap_or_default();
                let (op, prefix) = match change {
                    Change::Cow { source, .. } => {
                        (Opcode::PeerCow, peer_cow_prefix(base, new, sums, *source))
                    }
                    _ => (Opcode::PeerWrite, peer_write_prefix(base, new, sums)),
                };
                let mut h = Header::request(op, 0, epoch);
                h.oid = oid.0;
                h.offset = *offset;
                h.length = data.len() as u32;
                h.aux = sums.len() as u32;
                conn.call_with_prefix(h, prefix, data.clone(), FORWARD_TIMEOUT)
                    .await
            }
            Change::Put { .. } | Change::Remove => {
                let (state, data) = change.installs(new);
                let mut h = Header::request(Opcode::PeerPut, 0, epoch);
                h.oid = oid.0;
                h.offset = state.version.0;
                h.aux = state.flags();
                conn.call(h, data, FORWARD_TIMEOUT).await
            }
        };
        match res {
            Ok(f) => match f.header.result_code() {
                ResultCode::Ok => Forwarded::Applied,
                ResultCode::Diverged => Forwarded::Diverged(addr),
                code => Forwarded::Failed(replica_failure(addr, code, f.message())),
            },
            Err(e) => {
                self.peers.drop_conn(addr).await;
                Forwarded::Failed(Failure::new(
                    ResultCode::Busy,
                    format!("replica {addr}: {e}"),
                ))
            }
        }
    }

    /// Sends this node's whole copy of `oid` to a replica that diverged.
    async fn push(&self, addr: SocketAddr, epoch: u32, oid: ObjectId) -> Forwarded {
        let store = self.store.clone();
        let (data, state) = match super::server::blocking(self, move || store.read_whole(oid)).await
        {
            Ok(r) => r,
            Err(f) => return Forwarded::Failed(f),
        };
        tracing::info!("replica {addr} diverged on object {oid}: sending it whole at {state:?}");
        let mut h = Header::request(Opcode::PeerPut, 0, epoch);
        h.oid = oid.0;
        h.offset = state.version.0;
        h.aux = state.flags();
        let res = match self.peers.get(addr, FORWARD_TIMEOUT).await {
            Ok(c) => c.call(h, Bytes::from(data), FORWARD_TIMEOUT).await,
            Err(e) => Err(e),
        };
        match res {
            Ok(f) if f.header.result_code() == ResultCode::Ok => Forwarded::Applied,
            Ok(f) => {
                if f.header.result_code() == ResultCode::Conflict {
                    // It holds a newer version than this one: go above it next time.
                    self.raise_floor(oid, Version(f.header.offset));
                }
                Forwarded::Failed(replica_failure(addr, f.header.result_code(), f.message()))
            }
            Err(e) => {
                self.peers.drop_conn(addr).await;
                Forwarded::Failed(Failure::new(
                    ResultCode::Busy,
                    format!("replica {addr}: {e}"),
                ))
            }
        }
    }

    /// A replica's side of `PeerWrite`: apply only on exactly the base version, and only into
    /// blocks a plain write may fill (a primary standing in for a full disk has no copy to
    /// tell a partial copy-on-write target by: see `acting`).
    pub(super) async fn apply_forwarded(
        &self,
        oid: ObjectId,
        offset: u64,
        data: Bytes,
        sums: Option<Arc<[u32]>>,
        (base, new): (Version, Version),
        object_size: u64,
    ) -> Result<(), Failure> {
        let _ordered = self.replica_lock(oid).lock().await;
        self.check_base(oid, base, "write")?;
        if !self.plain_write_fits(oid, object_size, offset, data.len())? {
            return Err(Failure::new(
                ResultCode::Diverged,
                format!("object {oid} is a partial copy-on-write target here and the write fills absent blocks"),
            ));
        }
        self.write_store(oid, offset, data, sums, new).await
    }

    /// A forwarded change applies only on a copy exactly at `base` and not suspect; else
    /// `Diverged` (the primary sends the whole object). Caller holds the replica lock.
    fn check_base(&self, oid: ObjectId, base: Version, what: &str) -> Result<(), Failure> {
        let local = self.store.meta(oid).unwrap_or_default();
        if local.version != base || local.suspect {
            return Err(Failure::new(
                ResultCode::Diverged,
                format!(
                    "object {oid} is at {:?}{} here, the {what} applies on {base:?}",
                    local.version,
                    if local.suspect { " (suspect)" } else { "" }
                ),
            ));
        }
        Ok(())
    }

    /// A replica's side of `PeerCow`: apply only on exactly the base version (see
    /// [`Node::apply_forwarded`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn apply_forwarded_cow(
        self: &Arc<Self>,
        oid: ObjectId,
        offset: u64,
        data: Bytes,
        sums: Option<Arc<[u32]>>,
        source: Option<ObjectId>,
        (base, new): (Version, Version),
        object_size: u64,
    ) -> Result<(), Failure> {
        let _ordered = self.replica_lock(oid).lock().await;
        self.check_base(oid, base, "copy-on-write")?;
        self.apply_cow_store(oid, offset, data, sums, source, new, object_size)
            .await
    }

    /// A write into the local store (with the primary's block sums when it has them): a small
    /// one at once on this task when the store can do it without waiting
    /// ([`crate::store::ObjectBackend::write_now`] in place,
    /// [`crate::store::ObjectBackend::create_now`] creating a data object), else on the
    /// blocking pool.
    async fn write_store(
        &self,
        oid: ObjectId,
        offset: u64,
        data: Bytes,
        sums: Option<Arc<[u32]>>,
        new: Version,
    ) -> Result<(), Failure> {
        if data.len() <= INLINE_WRITE {
            // Into the object in place, or creating it (a data object, through the page
            // cache), when its lock is free.
            let now = self
                .store
                .write_now(oid, offset, &data, sums.as_deref(), new)
                .or_else(|| {
                    self.store
                        .create_now(oid, &[(offset, &data[..], sums.as_deref())], new)
                });
            if let Some(r) = now {
                return r.map_err(Failure::from);
            }
        }
        let store = self.store.clone();
        super::server::blocking(self, move || {
            store.write(oid, offset, &data, sums.as_deref(), new)
        })
        .await
    }

    /// A replica's side of `PeerPut`: install a whole object or tombstone if it is newer.
    /// Returns the local version when it is not.
    pub(super) async fn apply_put(
        &self,
        oid: ObjectId,
        data: Bytes,
        state: ObjState,
    ) -> Result<(), (Failure, Version)> {
        let _ordered = self.replica_lock(oid).lock().await;
        let store = self.store.clone();
        let installed =
            super::server::blocking(self, move || store.put_if_newer(oid, &data, state))
                .await
                .map_err(|f| (f, Version::NONE))?;
        if installed {
            self.recovery.settled(oid, state.version);
            return Ok(());
        }
        let local = self.store.meta(oid).map(|c| c.version).unwrap_or_default();
        Err((
            Failure::new(
                ResultCode::Conflict,
                format!("object {oid} is at {local:?} here, not older than {state:?}"),
            ),
            local,
        ))
    }
}

impl Node {
    /// The version the next change of `oid` goes above: `cur`, or a version given to a change
    /// that failed somewhere (or that a replica said it holds), if higher.
    pub(super) fn version_floor(&self, oid: ObjectId, cur: Version) -> Version {
        let issued = self.issued.lock().unwrap();
        issued.get(&oid).copied().unwrap_or_default().max(cur)
    }

    /// Keeps `v` as a floor for the next change of `oid` (a change at `v` failed somewhere).
    pub(super) fn raise_floor(&self, oid: ObjectId, v: Version) {
        let mut issued = self.issued.lock().unwrap();
        let floor = issued.entry(oid).or_default();
        *floor = (*floor).max(v);
    }
}
