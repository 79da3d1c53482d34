//! The memory backend: objects in a map, for in-process tests and the fault simulator.
//!
//! It keeps two states: what readers see now (`live`) and what would survive a crash
//! (`durable`). A write changes `live` only; `flush` copies every object written since the last
//! flush to `durable`; creating an object, `put_if_newer` and `forget` are durable at once (the
//! file backend's install and unlink are followed by a directory fsync). [`MemStore::crashed`] returns a store
//! holding only the durable state, as the files would be after a power cut.
//!
//! Faults: [`MemStore::fail`] makes chosen operations fail with EIO (or ENOSPC) until cleared. A
//! failed flush loses what it could not sync, as a failed `fdatasync` may: those objects go back
//! to their durable state and the flush names them.
//!
//! Holds: [`MemStore::hold`] makes writes (or removes) of one object wait, their calling
//! threads blocked before they change anything, until [`MemStore::release`]: a change caught
//! in flight inside the store, as a slow disk would keep it. Only for nodes whose store calls
//! run on threads of their own (`MemCluster`), never inline ones (the simulator).

use std::collections::{BTreeMap, HashSet};
use std::io;
use std::sync::{Condvar, Mutex};

use objstore_proto::oid::ObjectId;

use super::{ObjState, ObjectBackend, StoreError, Version};

/// An object's bytes and state (a tombstone has no bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Obj {
    data: Vec<u8>,
    state: ObjState,
}

/// Operations a fault can target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    Read,
    Write,
    Remove,
    Flush,
}

/// What a failing operation reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// An I/O error (EIO).
    Io,
    /// A full disk (ENOSPC).
    NoSpace,
}

#[derive(Default)]
struct State {
    live: BTreeMap<ObjectId, Obj>,
    durable: BTreeMap<ObjectId, Obj>,
    /// Written since the last flush.
    dirty: HashSet<ObjectId>,
    faults: Vec<(Op, Fault)>,
    /// Objects whose last flush failed: unreadable until restored.
    bad: HashSet<ObjectId>,
}

/// Operations held until released, and how many calls wait on them.
#[derive(Default)]
struct Holds {
    state: Mutex<HoldState>,
    changed: Condvar,
}

#[derive(Default)]
struct HoldState {
    on: Vec<(Op, ObjectId)>,
    waiting: usize,
}

/// See the module documentation.
pub struct MemStore {
    state: Mutex<State>,
    capacity: u64,
    holds: Holds,
}

impl Default for MemStore {
    fn default() -> Self {
        MemStore::new(1 << 40)
    }
}

impl MemStore {
    /// An empty store that reports `capacity` bytes.
    pub fn new(capacity: u64) -> MemStore {
        MemStore {
            state: Mutex::default(),
            capacity,
            holds: Holds::default(),
        }
    }

    /// A store holding only what this one had made durable: the state after a crash.
    pub fn crashed(&self) -> MemStore {
        let st = self.state.lock().unwrap();
        MemStore {
            state: Mutex::new(State {
                live: st.durable.clone(),
                durable: st.durable.clone(),
                ..State::default()
            }),
            capacity: self.capacity,
            holds: Holds::default(),
        }
    }

    /// The store a killed process leaves (`kill -9`): the bytes survive in the kernel's page
    /// cache, but a copy written since its last flush comes back at its last flushed version,
    /// suspect, as the file backend's marked files do.
    pub fn killed(&self) -> MemStore {
        let st = self.state.lock().unwrap();
        let mut live = st.live.clone();
        for oid in &st.dirty {
            if let (Some(o), Some(d)) = (live.get_mut(oid), st.durable.get(oid)) {
                o.state.version = d.state.version;
                o.state.suspect = true;
            }
        }
        MemStore {
            state: Mutex::new(State {
                durable: live.clone(),
                live,
                ..State::default()
            }),
            capacity: self.capacity,
            holds: Holds::default(),
        }
    }

    /// Makes `op` fail with `fault` until [`MemStore::clear_faults`].
    pub fn fail(&self, op: Op, fault: Fault) {
        self.state.lock().unwrap().faults.push((op, fault));
    }

    pub fn clear_faults(&self) {
        self.state.lock().unwrap().faults.clear();
    }

    /// Makes `op` (`Write` or `Remove`, whole-object installs included) on `oid` wait before it
    /// changes anything, until [`MemStore::release`]. The waiting call blocks its thread.
    pub fn hold(&self, op: Op, oid: ObjectId) {
        self.holds.state.lock().unwrap().on.push((op, oid));
    }

    /// How many calls wait on a hold now.
    pub fn held(&self) -> usize {
        self.holds.state.lock().unwrap().waiting
    }

    /// Ends every hold: the calls waiting on them go on.
    pub fn release(&self) {
        self.holds.state.lock().unwrap().on.clear();
        self.holds.changed.notify_all();
    }

    /// Waits while `op` on `oid` is held.
    fn pass(&self, op: Op, oid: ObjectId) {
        let mut h = self.holds.state.lock().unwrap();
        if !h.on.contains(&(op, oid)) {
            return;
        }
        h.waiting += 1;
        while h.on.contains(&(op, oid)) {
            h = self.holds.changed.wait(h).unwrap();
        }
        h.waiting -= 1;
    }

    /// Overwrites a stored object's bytes behind the node's back (a flipped bit on the disk).
    pub fn corrupt(&self, oid: ObjectId, at: usize) -> bool {
        let mut guard = self.state.lock().unwrap();
        let st: &mut State = &mut guard;
        let mut hit = false;
        for map in [&mut st.live, &mut st.durable] {
            if let Some(o) = map.get_mut(&oid).filter(|o| at < o.data.len()) {
                o.data[at] ^= 0xff;
                hit = true;
            }
        }
        hit
    }

    /// An object whose last flush failed reads as an I/O error until it is restored.
    fn check_bad(st: &State, oid: ObjectId) -> Result<(), StoreError> {
        if st.bad.contains(&oid) {
            return Err(StoreError::Io {
                oid,
                op: "read",
                source: io::Error::other(
                    "its last fdatasync failed: it is being restored from a replica",
                ),
            });
        }
        Ok(())
    }

    fn check(st: &State, op: Op, oid: ObjectId) -> Result<(), StoreError> {
        match st.faults.iter().find(|(o, _)| *o == op) {
            None => Ok(()),
            Some((_, Fault::NoSpace)) => Err(StoreError::NoSpace),
            Some((_, Fault::Io)) => Err(StoreError::Io {
                oid,
                op: match op {
                    Op::Read => "read",
                    Op::Write => "write",
                    Op::Remove => "remove",
                    Op::Flush => "sync",
                },
                source: io::Error::from_raw_os_error(libc::EIO),
            }),
        }
    }
}

impl ObjectBackend for MemStore {
    fn meta(&self, oid: ObjectId) -> Option<ObjState> {
        let st = self.state.lock().unwrap();
        st.live.get(&oid).map(|o| o.state)
    }

    fn list(&self) -> Vec<(ObjectId, ObjState)> {
        let st = self.state.lock().unwrap();
        st.live.iter().map(|(k, o)| (*k, o.state)).collect()
    }

    fn len(&self) -> usize {
        let st = self.state.lock().unwrap();
        st.live.values().filter(|o| !o.state.deleted).count()
    }

    fn read(&self, oid: ObjectId, offset: u64, len: usize) -> Result<Vec<u8>, StoreError> {
        let st = self.state.lock().unwrap();
        MemStore::check(&st, Op::Read, oid)?;
        MemStore::check_bad(&st, oid)?;
        let o = st
            .live
            .get(&oid)
            .filter(|o| !o.state.deleted)
            .ok_or(StoreError::NotFound(oid))?;
        let mut out = vec![0u8; len];
        let start = (offset as usize).min(o.data.len());
        let end = (start + len).min(o.data.len());
        out[..end - start].copy_from_slice(&o.data[start..end]);
        Ok(out)
    }

    fn read_whole(&self, oid: ObjectId) -> Result<(Vec<u8>, ObjState), StoreError> {
        let st = self.state.lock().unwrap();
        MemStore::check(&st, Op::Read, oid)?;
        MemStore::check_bad(&st, oid)?;
        let o = st.live.get(&oid).ok_or(StoreError::NotFound(oid))?;
        Ok((o.data.clone(), o.state))
    }

    fn write(
        &self,
        oid: ObjectId,
        offset: u64,
        data: &[u8],
        version: Version,
    ) -> Result<(), StoreError> {
        self.pass(Op::Write, oid);
        let mut st = self.state.lock().unwrap();
        MemStore::check(&st, Op::Write, oid)?;
        let created = st.live.get(&oid).is_none_or(|o| o.state.deleted);
        if created {
            st.live.insert(
                oid,
                Obj {
                    data: Vec::new(),
                    state: ObjState::live(version),
                },
            );
        }
        let o = st.live.get_mut(&oid).expect("just inserted");
        let end = offset as usize + data.len();
        if o.data.len() < end {
            o.data.resize(end, 0);
        }
        o.data[offset as usize..end].copy_from_slice(data);
        o.state.version = version;
        if created {
            // The file backend creates an object with the crash-safe recipe: durable at once.
            let o = o.clone();
            st.durable.insert(oid, o);
        } else {
            st.dirty.insert(oid);
        }
        Ok(())
    }

    fn put_if_newer(
        &self,
        oid: ObjectId,
        data: &[u8],
        state: ObjState,
    ) -> Result<bool, StoreError> {
        let op = if state.deleted { Op::Remove } else { Op::Write };
        self.pass(op, oid);
        let mut st = self.state.lock().unwrap();
        MemStore::check(&st, op, oid)?;
        // A copy whose last flush failed is replaced by any copy at least as new.
        let bad = st.bad.contains(&oid);
        if st.live.get(&oid).is_some_and(|o| {
            !(o.state.replaced_by(state) || (bad && state.version >= o.state.version))
        }) {
            return Ok(false);
        }
        let o = Obj {
            data: if state.deleted {
                Vec::new()
            } else {
                data.to_vec()
            },
            state: ObjState {
                suspect: false,
                lost: false,
                ..state
            },
        };
        st.live.insert(oid, o.clone());
        st.durable.insert(oid, o);
        st.dirty.remove(&oid);
        st.bad.remove(&oid);
        Ok(true)
    }

    fn settle(&self, oid: ObjectId) -> Result<(), StoreError> {
        let mut guard = self.state.lock().unwrap();
        let st: &mut State = &mut guard;
        for map in [&mut st.live, &mut st.durable] {
            if let Some(o) = map.get_mut(&oid) {
                o.state.suspect = false;
            }
        }
        Ok(())
    }

    fn accept_lost(&self, oid: ObjectId) -> Result<Option<ObjState>, StoreError> {
        let mut guard = self.state.lock().unwrap();
        let st: &mut State = &mut guard;
        if st.bad.remove(&oid) {
            // The live state went back to the durable one when the flush failed.
            for map in [&mut st.live, &mut st.durable] {
                if let Some(o) = map.get_mut(&oid) {
                    o.state.suspect = true;
                }
            }
        }
        Ok(st.live.get(&oid).map(|o| o.state))
    }

    fn forget(&self, oid: ObjectId) -> Result<(), StoreError> {
        let mut st = self.state.lock().unwrap();
        MemStore::check(&st, Op::Remove, oid)?;
        st.live.remove(&oid);
        st.durable.remove(&oid);
        st.dirty.remove(&oid);
        st.bad.remove(&oid);
        Ok(())
    }

    fn flush(&self) -> Result<(), StoreError> {
        let mut st = self.state.lock().unwrap();
        let mut dirty: Vec<ObjectId> = st.dirty.drain().collect();
        dirty.sort_unstable();
        if let Err(e) = MemStore::check(&st, Op::Flush, ObjectId(0)) {
            // What the failed sync held is gone: back to the durable state, and unreadable
            // until the node restores it.
            let mut failed = Vec::with_capacity(dirty.len());
            for oid in &dirty {
                let lost = st
                    .live
                    .get(oid)
                    .map(|o| o.state.version)
                    .unwrap_or_default();
                failed.push((*oid, lost));
                match st.durable.get(oid).cloned() {
                    Some(o) => st.live.insert(*oid, o),
                    None => st.live.remove(oid),
                };
                st.bad.insert(*oid);
            }
            let source = match e {
                StoreError::Io { source, .. } => source,
                _ => io::Error::from_raw_os_error(libc::ENOSPC),
            };
            return Err(StoreError::SyncFailed {
                oids: failed,
                source,
            });
        }
        for oid in dirty {
            if let Some(o) = st.live.get(&oid).cloned() {
                st.durable.insert(oid, o);
            }
        }
        Ok(())
    }

    fn capacity(&self) -> io::Result<(u64, u64)> {
        let st = self.state.lock().unwrap();
        let used: u64 = st.live.values().map(|o| o.data.len() as u64).sum();
        Ok((self.capacity, self.capacity.saturating_sub(used)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use objstore_proto::oid::{ObjIndex, Vid};

    #[test]
    fn crash_keeps_only_flushed_writes() {
        let s = MemStore::default();
        let a = ObjectId::data(Vid(1), ObjIndex(0));
        s.write(a, 0, b"first", Version(1)).unwrap();
        s.write(a, 0, b"FIRST", Version(2)).unwrap();
        assert_eq!(s.crashed().read(a, 0, 5).unwrap(), b"first");
        s.flush().unwrap();
        s.write(a, 0, b"later", Version(3)).unwrap();
        let c = s.crashed();
        assert_eq!(c.read(a, 0, 5).unwrap(), b"FIRST");
        assert_eq!(c.meta(a).unwrap().version, Version(2));
        assert_eq!(s.read(a, 3, 4).unwrap(), b"er\0\0");
    }

    #[test]
    fn faults_fail_the_chosen_operation() {
        let s = MemStore::default();
        let a = ObjectId::data(Vid(1), ObjIndex(0));
        s.write(a, 0, b"x", Version(1)).unwrap();
        s.write(a, 0, b"z", Version(2)).unwrap();
        s.fail(Op::Flush, Fault::Io);
        // The failed flush names the object and loses its unsynced write.
        match s.flush() {
            Err(StoreError::SyncFailed { oids, .. }) => assert_eq!(oids, vec![(a, Version(2))]),
            other => panic!("{other:?}"),
        }
        // Unreadable until restored.
        assert!(matches!(s.read(a, 0, 1), Err(StoreError::Io { .. })));
        assert!(s.put_if_newer(a, b"x", ObjState::live(Version(2))).unwrap());
        assert_eq!(s.read(a, 0, 1).unwrap(), b"x");
        s.fail(Op::Write, Fault::NoSpace);
        assert!(matches!(
            s.write(a, 0, b"y", Version(3)),
            Err(StoreError::NoSpace)
        ));
        assert_eq!(s.read(a, 0, 1).unwrap(), b"x");
        s.clear_faults();
        s.flush().unwrap();
        assert!(s.corrupt(a, 0));
        assert_ne!(s.read(a, 0, 1).unwrap(), b"x");
    }

    #[test]
    fn a_hold_keeps_a_write_waiting_until_released() {
        let s = std::sync::Arc::new(MemStore::default());
        let a = ObjectId::data(Vid(1), ObjIndex(0));
        let b = ObjectId::data(Vid(1), ObjIndex(1));
        s.write(a, 0, b"x", Version(1)).unwrap();
        s.hold(Op::Write, a);
        let w = std::thread::spawn({
            let s = s.clone();
            move || s.write(a, 0, b"y", Version(2))
        });
        while s.held() == 0 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        // Other objects, reads and listings go on; the held write changed nothing yet.
        s.write(b, 0, b"z", Version(1)).unwrap();
        assert_eq!(s.read(a, 0, 1).unwrap(), b"x");
        assert_eq!(s.meta(a).unwrap().version, Version(1));
        s.release();
        w.join().unwrap().unwrap();
        assert_eq!(s.held(), 0);
        assert_eq!(s.read(a, 0, 1).unwrap(), b"y");
        assert_eq!(s.meta(a).unwrap().version, Version(2));
    }
}
