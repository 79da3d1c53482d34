//! Disk health: the node counts its store's I/O errors, never serves a copy a read failed on,
//! and fences itself once errors come too fast.
//!
//! ```text
//!  node ──► HealthStore ──► the real backend (files, memory)
//!              │ each StoreError::Io / SyncFailed
//!              ▼
//!           Health: counters per kind, errors within the window
//!              ├─► a copy whose read failed: marked lost in the store (mark_lost) and sent
//!              │   to the node, which restores it from another replica (restore_lost)
//!              └─► `limit` errors within `window`: fenced (the node leaves the cluster)
//! ```
//!
//! Why leave rather than turn read-only: a read-only node would stay on the placement ring,
//! so its objects would keep one copy fewer than the cluster's `copies` for as long as it
//! stays, and every read of a copy on the sick disk risks another error. Leaving makes a new
//! epoch at once; recovery then places and restores its copies on the other nodes from the
//! healthy replicas, which is what the operator wants before replacing the disk. The fenced
//! process stays up, answering status (`dog node list`, `dog node stat`, `/metrics`) with why.
//!
//! Errors counted: every `StoreError::Io` (read, write, remove) and every `SyncFailed` (one per
//! failed flush). A read of a copy already known lost fails by design and is not counted
//! again; ENOSPC is a full disk, not a sick one, and is never counted.

use std::collections::{HashSet, VecDeque};
use std::io;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, Notify};

use crate::store::{ObjState, ObjectBackend, Part, StoreError, Version};
use objstore_proto::api::{DiskHealth, HealthState, IoErrorCounts};
use objstore_proto::oid::ObjectId;

/// `sheep --io-error-limit` default: errors within [`DEFAULT_WINDOW`] that fence the node.
pub const DEFAULT_LIMIT: u32 = 10;
/// `sheep --io-error-window` default.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(600);

/// When a node fences itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthOptions {
    /// I/O errors within `window` that fence the node; 0: never fenced (errors are still
    /// counted and copies restored).
    pub limit: u32,
    pub window: Duration,
}

impl Default for HealthOptions {
    fn default() -> Self {
        HealthOptions {
            limit: DEFAULT_LIMIT,
            window: DEFAULT_WINDOW,
        }
    }
}

impl HealthOptions {
    /// Never fenced: errors are counted and copies restored only.
    pub fn never_fenced() -> HealthOptions {
        HealthOptions {
            limit: 0,
            ..HealthOptions::default()
        }
    }
}

#[derive(Default)]
struct State {
    counts: IoErrorCounts,
    recent: VecDeque<Instant>,
    last_error: Option<String>,
    fenced: Option<String>,
    restored: u64,
    /// Copies reported lost and not restored yet: their reads fail by design.
    lost: HashSet<ObjectId>,
}

/// The node's disk health (see the module documentation).
pub struct Health {
    opts: HealthOptions,
    state: Mutex<State>,
    /// Wakes the node's health task when the limit is reached.
    fence: Notify,
    lost_tx: mpsc::UnboundedSender<(ObjectId, Version)>,
    lost_rx: Mutex<Option<mpsc::UnboundedReceiver<(ObjectId, Version)>>>,
}

impl Health {
    pub fn new(opts: HealthOptions) -> Health {
        let (lost_tx, lost_rx) = mpsc::unbounded_channel();
        Health {
            opts,
            state: Mutex::default(),
            fence: Notify::new(),
            lost_tx,
            lost_rx: Mutex::new(Some(lost_rx)),
        }
    }

    pub fn options(&self) -> HealthOptions {
        self.opts
    }

    /// Whether the node is fenced (serves no object I/O).
    pub fn is_fenced(&self) -> bool {
        self.state.lock().unwrap().fenced.is_some()
    }

    /// Why the node is fenced, if it is.
    pub fn fenced(&self) -> Option<String> {
        self.state.lock().unwrap().fenced.clone()
    }

    /// Whether a write that failed with an I/O error is worth retrying: the node whose disk
    /// failed is fenced after enough errors, and the write then goes to other owners.
    pub fn fences(&self) -> bool {
        self.opts.limit > 0
    }

    /// Counts one error of `kind` (`read`, `write`, `sync`, `remove`); true when it is the one
    /// that reaches the limit (the node must fence itself now).
    fn count(&self, kind: &str, what: String) -> bool {
        let mut st = self.state.lock().unwrap();
        match kind {
            "read" => st.counts.read += 1,
            "sync" => st.counts.sync += 1,
            "remove" => st.counts.remove += 1,
            _ => st.counts.write += 1,
        }
        let now = Instant::now();
        st.recent.push_back(now);
        Health::trim(&mut st, now, self.opts.window);
        tracing::error!("disk I/O error ({kind}): {what}");
        st.last_error = Some(what);
        if self.opts.limit > 0 && st.fenced.is_none() && st.recent.len() >= self.opts.limit as usize
        {
            st.fenced = Some(format!(
                "{} disk I/O errors within {} s (limit {}; last: {}): the node left the cluster and serves no object I/O; its copies are restored on the other nodes. Check the disk (dmesg, smartctl), replace it, then start sheep again on an empty data directory (see docs/operations.md, \"Sick disks\")",
                st.recent.len(),
                self.opts.window.as_secs(),
                self.opts.limit,
                st.last_error.as_deref().unwrap_or("")
            ));
            drop(st);
            self.fence.notify_one();
            return true;
        }
        false
    }

    fn trim(st: &mut State, now: Instant, window: Duration) {
        while st
            .recent
            .front()
            .is_some_and(|t| now.duration_since(*t) > window)
        {
            st.recent.pop_front();
        }
    }

    /// Fences the node now, for `why` (an operator's request, or the limit reached).
    pub fn fence_now(&self, why: String) {
        let mut st = self.state.lock().unwrap();
        if st.fenced.is_none() {
            st.fenced = Some(why);
            drop(st);
            self.fence.notify_one();
        }
    }

    /// Waits until the node is fenced.
    pub async fn wait_fenced(&self) {
        loop {
            let n = self.fence.notified();
            if self.is_fenced() {
                return;
            }
            n.await;
        }
    }

    /// The channel of copies found unreadable (taken once, by the node's health task).
    pub(crate) fn take_lost(&self) -> Option<mpsc::UnboundedReceiver<(ObjectId, Version)>> {
        self.lost_rx.lock().unwrap().take()
    }

    /// A copy found unreadable was restored from another replica.
    pub(crate) fn restored(&self, oid: ObjectId) {
        let mut st = self.state.lock().unwrap();
        st.lost.remove(&oid);
        st.restored += 1;
    }

    /// The copy of `oid` is back (installed whole, or forgotten): reads of it count again.
    fn replaced(&self, oid: ObjectId) {
        let mut st = self.state.lock().unwrap();
        if !st.lost.is_empty() {
            st.lost.remove(&oid);
        }
    }

    /// A read found the copy of `oid` unreadable, and it was neither restored nor replaced
    /// (installed whole, or forgotten) since.
    pub(crate) fn known_lost(&self, oid: ObjectId) -> bool {
        self.state.lock().unwrap().lost.contains(&oid)
    }

    /// What `NodeStatus` shows.
    pub fn status(&self) -> DiskHealth {
        let mut st = self.state.lock().unwrap();
        Health::trim(&mut st, Instant::now(), self.opts.window);
        DiskHealth {
            state: if st.fenced.is_some() {
                HealthState::Fenced
            } else if st.recent.is_empty() {
                HealthState::Ok
            } else {
                HealthState::Degraded
            },
            io_errors: st.counts,
            recent: st.recent.len() as u32,
            limit: self.opts.limit,
            window_secs: self.opts.window.as_secs(),
            last_error: st.last_error.clone(),
            fenced: st.fenced.clone(),
            restored: st.restored,
        }
    }
}

/// The node's store seen through [`Health`]: every call goes to the inner backend; errors are
/// counted, and a copy a read failed on is marked lost and handed to the node to restore.
pub struct HealthStore {
    inner: Arc<dyn ObjectBackend>,
    health: Arc<Health>,
}

impl HealthStore {
    pub fn new(inner: Arc<dyn ObjectBackend>, health: Arc<Health>) -> HealthStore {
        HealthStore { inner, health }
    }

    /// Counts `e` if it is an I/O error of a call of `kind` (`read`, `write`, `remove`,
    /// `sync`); a failed read also marks the copy lost.
    fn saw<T>(
        &self,
        oid: ObjectId,
        kind: &'static str,
        res: Result<T, StoreError>,
    ) -> Result<T, StoreError> {
        let e = match res {
            Ok(v) => return Ok(v),
            Err(e) => e,
        };
        match &e {
            StoreError::Io { op, source, .. } => {
                let read = kind == "read";
                if read && self.health.known_lost(oid) {
                    return Err(e);
                }
                let kind = if op.starts_with("sync") { "sync" } else { kind };
                self.health
                    .count(kind, format!("{op} of object {oid}: {}", chain(source)));
                if read {
                    if let Some(st) = self.inner.meta(oid).filter(|s| !s.deleted) {
                        self.inner.mark_lost(oid);
                        self.health.state.lock().unwrap().lost.insert(oid);
                        let _ = self.health.lost_tx.send((oid, st.version));
                    }
                }
            }
            StoreError::SyncFailed { oids, source } => {
                self.health.count(
                    "sync",
                    format!("fdatasync of {} object(s): {}", oids.len(), chain(source)),
                );
                let mut st = self.health.state.lock().unwrap();
                st.lost.extend(oids.iter().map(|(o, _)| *o));
            }
            _ => {}
        }
        Err(e)
    }
}

fn chain(e: &io::Error) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(x) = src {
        s.push_str(": ");
        s.push_str(&x.to_string());
        src = x.source();
    }
    s
}

impl ObjectBackend for HealthStore {
    fn meta(&self, oid: ObjectId) -> Option<ObjState> {
        self.inner.meta(oid)
    }
    fn list(&self) -> Vec<(ObjectId, ObjState)> {
        self.inner.list()
    }
    fn list_part(&self, part: u32, parts: u32) -> Vec<(ObjectId, ObjState)> {
        self.inner.list_part(part, parts)
    }
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn created(&self) -> Option<u64> {
        self.inner.created()
    }
    fn index_bytes(&self) -> Option<u64> {
        self.inner.index_bytes()
    }
    fn read(&self, oid: ObjectId, offset: u64, len: usize) -> Result<Vec<u8>, StoreError> {
        self.saw(oid, "read", self.inner.read(oid, offset, len))
    }
    fn read_whole(&self, oid: ObjectId) -> Result<(Vec<u8>, ObjState), StoreError> {
        self.saw(oid, "read", self.inner.read_whole(oid))
    }
    fn object_len(&self, oid: ObjectId) -> Option<u64> {
        self.inner.object_len(oid)
    }
    fn is_durable(&self, oid: ObjectId) -> bool {
        self.inner.is_durable(oid)
    }
    fn sync_bytes(&self, oid: ObjectId) -> Result<(), StoreError> {
        self.saw(oid, "sync", self.inner.sync_bytes(oid))
    }
    fn write(
        &self,
        oid: ObjectId,
        offset: u64,
        data: &[u8],
        sums: Option<&[u32]>,
        version: Version,
    ) -> Result<(), StoreError> {
        self.saw(
            oid,
            "write",
            self.inner.write(oid, offset, data, sums, version),
        )
    }
    fn write_parts(
        &self,
        oid: ObjectId,
        parts: &[Part<'_>],
        sync_last: bool,
        version: Version,
    ) -> Result<(), StoreError> {
        self.saw(
            oid,
            "write",
            self.inner.write_parts(oid, parts, sync_last, version),
        )
    }
    fn write_now(
        &self,
        oid: ObjectId,
        offset: u64,
        data: &[u8],
        sums: Option<&[u32]>,
        version: Version,
    ) -> Option<Result<(), StoreError>> {
        let r = self.inner.write_now(oid, offset, data, sums, version)?;
        Some(self.saw(oid, "write", r))
    }
    fn create_now(
        &self,
        oid: ObjectId,
        parts: &[Part<'_>],
        version: Version,
    ) -> Option<Result<(), StoreError>> {
        let r = self.inner.create_now(oid, parts, version)?;
        Some(self.saw(oid, "write", r))
    }
    fn put_if_newer(
        &self,
        oid: ObjectId,
        data: &[u8],
        state: ObjState,
    ) -> Result<bool, StoreError> {
        let r = self.saw(oid, "write", self.inner.put_if_newer(oid, data, state));
        if matches!(r, Ok(true)) {
            self.health.replaced(oid);
        }
        r
    }
    fn settle(&self, oid: ObjectId) -> Result<(), StoreError> {
        self.saw(oid, "write", self.inner.settle(oid))
    }
    fn accept_lost(&self, oid: ObjectId) -> Result<Option<ObjState>, StoreError> {
        let r = self.saw(oid, "write", self.inner.accept_lost(oid));
        if r.is_ok() {
            self.health.replaced(oid);
        }
        r
    }
    fn mark_lost(&self, oid: ObjectId) {
        self.inner.mark_lost(oid)
    }
    fn forget(&self, oid: ObjectId) -> Result<(), StoreError> {
        let r = self.saw(oid, "remove", self.inner.forget(oid));
        if r.is_ok() {
            self.health.replaced(oid);
        }
        r
    }
    fn flush(&self) -> Result<(), StoreError> {
        self.saw(ObjectId(0), "sync", self.inner.flush())
    }
    fn sync_object(&self, oid: ObjectId) -> Result<(), StoreError> {
        self.saw(oid, "sync", self.inner.sync_object(oid))
    }
    fn note(&self, oid: ObjectId) -> Option<Vec<u8>> {
        self.inner.note(oid)
    }
    fn note_prefix(&self, oid: ObjectId, len: usize) -> Option<Vec<u8>> {
        self.inner.note_prefix(oid, len)
    }
    fn set_note(&self, oid: ObjectId, note: &[u8]) -> Result<(), StoreError> {
        self.saw(oid, "write", self.inner.set_note(oid, note))
    }
    fn capacity(&self) -> io::Result<(u64, u64)> {
        self.inner.capacity()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::mem::{Fault, MemStore, Op};
    use objstore_proto::oid::{ObjIndex, Vid};

    fn setup(limit: u32) -> (Arc<MemStore>, Arc<Health>, HealthStore) {
        let mem = Arc::new(MemStore::default());
        let health = Arc::new(Health::new(HealthOptions {
            limit,
            window: Duration::from_secs(60),
        }));
        let store = HealthStore::new(mem.clone(), health.clone());
        (mem, health, store)
    }

    #[test]
    fn a_failed_read_is_counted_once_and_the_copy_marked_lost() {
        let (mem, health, store) = setup(0);
        let a = ObjectId::data(Vid(1), ObjIndex(0));
        store.write(a, 0, b"abc", None, Version(1)).unwrap();
        let mut lost = health.take_lost().unwrap();
        mem.fail_object(Op::Read, a, Fault::Io);
        assert!(matches!(store.read(a, 0, 3), Err(StoreError::Io { .. })));
        assert_eq!(lost.try_recv().unwrap(), (a, Version(1)));
        mem.clear_faults();
        // Lost now: reads fail by design, and are not counted again.
        assert!(store.read(a, 0, 3).is_err());
        assert!(store.read_whole(a).is_err());
        let h = health.status();
        assert_eq!(h.io_errors.read, 1);
        assert_eq!(h.state, HealthState::Degraded);
        assert!(lost.try_recv().is_err());
        // Restored at the same version: readable again.
        assert!(store
            .put_if_newer(a, b"abc", ObjState::live(Version(1)))
            .unwrap());
        assert_eq!(store.read(a, 0, 3).unwrap(), b"abc");
        // A full disk is not a sick one.
        mem.fail(Op::Write, Fault::NoSpace);
        assert!(store.write(a, 0, b"x", None, Version(2)).is_err());
        assert_eq!(health.status().io_errors.total(), 1);
        assert!(!health.is_fenced());
    }

    #[test]
    fn the_limit_fences_and_every_kind_counts() {
        let (mem, health, store) = setup(3);
        let a = ObjectId::data(Vid(1), ObjIndex(0));
        store.write(a, 0, b"abc", None, Version(1)).unwrap();
        mem.fail(Op::Write, Fault::Io);
        assert!(store.write(a, 0, b"x", None, Version(2)).is_err());
        mem.clear_faults();
        store.write(a, 0, b"y", None, Version(2)).unwrap();
        mem.fail(Op::Flush, Fault::Io);
        assert!(matches!(store.flush(), Err(StoreError::SyncFailed { .. })));
        assert!(!health.is_fenced());
        mem.clear_faults();
        mem.fail(Op::Remove, Fault::Io);
        assert!(store.forget(a).is_err());
        let h = health.status();
        assert_eq!(
            (h.io_errors.write, h.io_errors.sync, h.io_errors.remove),
            (1, 1, 1)
        );
        assert_eq!(h.state, HealthState::Fenced);
        let why = h.fenced.unwrap();
        assert!(why.contains("3 disk I/O errors"), "{why}");
        assert!(why.contains("docs/operations.md"), "{why}");
    }
}
