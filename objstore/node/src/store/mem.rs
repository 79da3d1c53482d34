//! The memory backend: objects in a map, for in-process tests and the fault simulator.
//!
//! It keeps two states: what readers see now (`live`) and what would survive a crash
//! (`durable`). A write changes `live` only; `flush` copies every object written since the last
//! flush to `durable`, a new data object included (until then a crash or a kill drops it, as
//! the file backend drops its unsynced file); creating an inode or an object over a tombstone,
//! `put_if_newer` and `forget` are durable at once (the file backend's install and unlink are
//! followed by a directory fsync). [`MemStore::crashed`] returns a store
//! holding only the durable state, as the files would be after a power cut.
//!
//! Faults: [`MemStore::fail`] (or [`MemStore::fail_object`], for one object) makes chosen operations fail with EIO (or ENOSPC) until cleared. A
//! failed flush loses what it could not sync, as a failed `fdatasync` may: those objects go back
//! to their durable state and the flush names them.
//!
//! Checksums: each object keeps the sums of its 4 KiB blocks ([`super::sums`]) as the file
//! backend does, checked on every read of a copy that is not suspect; [`MemStore::corrupt`]
//! flips a stored byte behind them, as a bad disk would; [`MemStore::rewrite`] changes bytes
//! and their sums together, as no checksum can catch.
//!
//! Holds: [`MemStore::hold`] makes writes (or removes) of one object wait, their calling
//! threads blocked before they change anything, until [`MemStore::release`]: a change caught
//! in flight inside the store, as a slow disk would keep it. Only for nodes whose store calls
//! run on threads of their own (`MemCluster`), never inline ones (the simulator).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io;
use std::sync::{Condvar, Mutex};

use objstore_proto::oid::ObjectId;

use super::sums::{self, BLOCK};
use super::{ObjState, ObjectBackend, StoreError, Version};

/// An object's bytes, the sums of its blocks, and its state (a tombstone has no bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Obj {
    data: Vec<u8>,
    sums: Vec<u32>,
    state: ObjState,
}

impl Obj {
    fn new(data: Vec<u8>, state: ObjState) -> Obj {
        Obj {
            sums: sums::sums_of(&data),
            data,
            state,
        }
    }

    /// Checks the blocks that bytes `offset..offset+len` touch (not on a suspect copy).
    fn check(&self, oid: ObjectId, offset: u64, len: usize) -> Result<(), StoreError> {
        if self.state.suspect || len == 0 {
            return Ok(());
        }
        let (first, end) = sums::blocks(offset, len);
        let lo = (first as usize * BLOCK).min(self.data.len());
        let hi = (end as usize * BLOCK).min(self.data.len());
        let t =
            &self.sums[(first as usize).min(self.sums.len())..(end as usize).min(self.sums.len())];
        match sums::first_bad(first, &self.data[lo..hi], t) {
            Some(block) => Err(StoreError::Corrupt { oid, block }),
            None => Ok(()),
        }
    }

    /// Checks the blocks a write of `len` bytes at `offset` covers only in part.
    fn check_edges(&self, oid: ObjectId, offset: u64, len: usize) -> Result<(), StoreError> {
        let b = BLOCK as u64;
        let end = offset + len as u64;
        if !offset.is_multiple_of(b) {
            self.check(oid, offset, 1)?;
        }
        if !end.is_multiple_of(b) && len > 0 {
            self.check(oid, end - 1, 1)?;
        }
        Ok(())
    }

    /// Writes `data` at `offset` and the sums of the blocks it touches (`given` as they are
    /// when they fit the write, as the file backend takes them).
    fn write(&mut self, offset: usize, data: &[u8], given: Option<&[u32]>) {
        let end = offset + data.len();
        if self.data.len() < end {
            self.data.resize(end, 0);
        }
        self.data[offset..end].copy_from_slice(data);
        let (first, last) = sums::blocks(offset as u64, data.len());
        if self.sums.len() < last as usize {
            self.sums.resize(last as usize, 0);
        }
        if let Some(t) = sums::given(offset as u64, data.len(), given) {
            self.sums[first as usize..last as usize].copy_from_slice(t);
            return;
        }
        for b in first as usize..last as usize {
            let hi = ((b + 1) * BLOCK).min(self.data.len());
            self.sums[b] = sums::sum(&self.data[b * BLOCK..hi]);
        }
    }
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
    /// Of those, the ones whose bytes a write changed (not its version alone): a kill leaves
    /// them suspect, as the file backend's marked files.
    moved: HashSet<ObjectId>,
    faults: Vec<(Op, Fault)>,
    /// Faults of one object only (a bad sector under one file).
    object_faults: Vec<(Op, ObjectId, Fault)>,
    /// Objects unreadable until restored: their last flush failed (None), or a block of
    /// theirs did not match its sum (that block).
    bad: HashMap<ObjectId, Option<u64>>,
    /// Objects put in `live` since the store was made ([`ObjectBackend::created`]).
    created: u64,
    /// Notes ([`ObjectBackend::set_note`]) as readers see them, and as a crash leaves them.
    notes: HashMap<ObjectId, Vec<u8>>,
    durable_notes: HashMap<ObjectId, Vec<u8>>,
}

impl State {
    /// Puts `o` in `live`, counting it in `created` if `oid` was not there.
    fn put_live(&mut self, oid: ObjectId, o: Obj) {
        if self.live.insert(oid, o).is_none() {
            self.created += 1;
        }
    }
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

    /// Makes `op` fail with `fault` until [`MemStore::clear_faults`].
    pub fn fail(&self, op: Op, fault: Fault) {
        self.state.lock().unwrap().faults.push((op, fault));
    }

    /// Makes `op` on `oid` only fail with `fault` until [`MemStore::clear_faults`].
    pub fn fail_object(&self, op: Op, oid: ObjectId, fault: Fault) {
        self.state
            .lock()
            .unwrap()
            .object_faults
            .push((op, oid, fault));
    }

    pub fn clear_faults(&self) {
        let mut st = self.state.lock().unwrap();
        st.faults.clear();
        st.object_faults.clear();
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

    /// Overwrites `bytes` of a stored object at `at` and the sums of the blocks they touch,
    /// behind the node's back: wrong bytes that pass every checksum (a bug above the store, a
    /// misdirected write), found only by comparing copies or parity. False if the object is
    /// not here or shorter than `at + bytes.len()`.
    pub fn rewrite(&self, oid: ObjectId, at: usize, bytes: &[u8]) -> bool {
        let mut guard = self.state.lock().unwrap();
        let st: &mut State = &mut guard;
        let mut hit = false;
        for map in [&mut st.live, &mut st.durable] {
            if let Some(o) = map.get_mut(&oid).filter(|o| {
                at.checked_add(bytes.len())
                    .is_some_and(|e| e <= o.data.len())
            }) {
                o.write(at, bytes, None);
                hit = true;
            }
        }
        hit
    }

    /// An object whose last flush failed reads as lost until it is restored; one found
    /// corrupt, as corrupt.
    fn check_bad(st: &State, oid: ObjectId) -> Result<(), StoreError> {
        match st.bad.get(&oid) {
            None => Ok(()),
            Some(Some(block)) => Err(StoreError::Corrupt { oid, block: *block }),
            Some(None) => Err(StoreError::Lost(oid)),
        }
    }

    /// Passes `res` on; a checksum mismatch in it marks the copy bad first.
    fn note_corrupt<T>(st: &mut State, res: Result<T, StoreError>) -> Result<T, StoreError> {
        if let Err(StoreError::Corrupt { oid, block }) = &res {
            st.bad.entry(*oid).or_insert(Some(*block));
        }
        res
    }

    fn check(st: &State, op: Op, oid: ObjectId) -> Result<(), StoreError> {
        let one = st
            .object_faults
            .iter()
            .find(|(o, id, _)| *o == op && *id == oid)
            .map(|(o, _, f)| (*o, *f));
        match st.faults.iter().copied().find(|(o, _)| *o == op).or(one) {
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

/// What a failed sync of `oid` leaves: back to its durable bytes, and lost until the node
/// restores it. The copy keeps the version lost, as the file backend's index does: no later
/// write may take that version again for other bytes. Returns it, None for no such object.
fn lose(st: &mut State, oid: ObjectId) -> Option<(ObjectId, Version)> {
    let lost = st.live.get(&oid).map(|o| o.state)?;
    // Created since the last flush: nothing durable, no bytes, the version lost.
    let o = st
        .durable
        .get(&oid)
        .cloned()
        .unwrap_or_else(|| Obj::new(Vec::new(), lost));
    st.put_live(
        oid,
        Obj {
            state: ObjState {
                version: lost.version,
                ..o.state
            },
            ..o
        },
    );
    st.bad.insert(oid, None);
    Some((oid, lost.version))
}

/// The error of a sync that failed with `e` and lost `failed`.
fn sync_failed(failed: Vec<(ObjectId, Version)>, e: StoreError) -> StoreError {
    let source = match e {
        StoreError::Io { source, .. } => source,
        _ => io::Error::from_raw_os_error(libc::ENOSPC),
    };
    StoreError::SyncFailed {
        oids: failed,
        source,
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

    fn created(&self) -> Option<u64> {
        Some(self.state.lock().unwrap().created)
    }

    fn read(&self, oid: ObjectId, offset: u64, len: usize) -> Result<Vec<u8>, StoreError> {
        let mut st = self.state.lock().unwrap();
        MemStore::check(&st, Op::Read, oid)?;
        MemStore::check_bad(&st, oid)?;
        let o = st
            .live
            .get(&oid)
            .filter(|o| !o.state.deleted)
            .ok_or(StoreError::NotFound(oid))?;
        let checked = o.check(oid, offset, len);
        MemStore::note_corrupt(&mut st, checked)?;
        let o = &st.live[&oid];
        let mut out = vec![0u8; len];
        let start = (offset as usize).min(o.data.len());
        let end = (start + len).min(o.data.len());
        out[..end - start].copy_from_slice(&o.data[start..end]);
        Ok(out)
    }

    fn object_len(&self, oid: ObjectId) -> Option<u64> {
        let st = self.state.lock().unwrap();
        st.live
            .get(&oid)
            .filter(|o| !o.state.deleted)
            .map(|o| o.data.len() as u64)
    }

    fn is_durable(&self, oid: ObjectId) -> bool {
        let st = self.state.lock().unwrap();
        !st.dirty.contains(&oid)
            && st
                .live
                .get(&oid)
                .is_some_and(|o| !o.state.deleted && !o.state.suspect)
            && st.live.get(&oid) == st.durable.get(&oid)
    }

    fn sync_bytes(&self, oid: ObjectId) -> Result<(), StoreError> {
        let mut guard = self.state.lock().unwrap();
        let st: &mut State = &mut guard;
        if let Err(e) = MemStore::check(st, Op::Flush, oid) {
            st.dirty.remove(&oid);
            let failed = lose(st, oid).into_iter().collect();
            return Err(sync_failed(failed, e));
        }
        // The bytes become durable under the last flushed version, suspect (the file backend's
        // marked name); a data object created since the last flush stays droppable.
        if let (Some(live), Some(d)) = (st.live.get(&oid), st.durable.get_mut(&oid)) {
            if !live.state.deleted && !d.state.deleted {
                let version = d.state.version;
                *d = live.clone();
                d.state.version = version;
                d.state.suspect = true;
            }
        }
        Ok(())
    }

    fn read_whole(&self, oid: ObjectId) -> Result<(Vec<u8>, ObjState), StoreError> {
        let mut st = self.state.lock().unwrap();
        MemStore::check(&st, Op::Read, oid)?;
        MemStore::check_bad(&st, oid)?;
        let o = st.live.get(&oid).ok_or(StoreError::NotFound(oid))?;
        let checked = o.check(oid, 0, o.data.len());
        MemStore::note_corrupt(&mut st, checked)?;
        let o = &st.live[&oid];
        Ok((o.data.clone(), o.state))
    }

    fn write(
        &self,
        oid: ObjectId,
        offset: u64,
        data: &[u8],
        sums: Option<&[u32]>,
        version: Version,
    ) -> Result<(), StoreError> {
        self.pass(Op::Write, oid);
        let mut st = self.state.lock().unwrap();
        MemStore::check(&st, Op::Write, oid)?;
        if st.bad.get(&oid) == Some(&None) {
            return Err(StoreError::Lost(oid));
        }
        let missing = !st.live.contains_key(&oid);
        let created = missing || st.live[&oid].state.deleted;
        if created {
            st.put_live(oid, Obj::new(Vec::new(), ObjState::live(version)));
        }
        // An edge block that does not check is never given a fresh sum.
        let checked = st.live[&oid].check_edges(oid, offset, data.len());
        MemStore::note_corrupt(&mut st, checked)?;
        let o = st.live.get_mut(&oid).expect("just inserted");
        o.write(offset as usize, data, sums);
        o.state.version = version;
        if created && !(missing && super::creates_unsynced(oid)) {
            // Over a tombstone, or an inode: the crash-safe recipe, durable at once.
            let o = o.clone();
            st.durable.insert(oid, o);
        } else {
            // A new data object is durable at the next flush; until then a crash drops it.
            st.dirty.insert(oid);
            if !data.is_empty() {
                st.moved.insert(oid);
            }
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
        let bad = st.bad.contains_key(&oid);
        if st.live.get(&oid).is_some_and(|o| {
            !(o.state.replaced_by(state) || (bad && state.version >= o.state.version))
        }) {
            return Ok(false);
        }
        let o = Obj::new(
            if state.deleted {
                Vec::new()
            } else {
                data.to_vec()
            },
            ObjState {
                suspect: false,
                lost: false,
                ..state
            },
        );
        st.put_live(oid, o.clone());
        st.durable.insert(oid, o);
        st.notes.remove(&oid);
        st.durable_notes.remove(&oid);
        st.dirty.remove(&oid);
        st.bad.remove(&oid);
        Ok(true)
    }

    fn settle(&self, oid: ObjectId) -> Result<(), StoreError> {
        let mut guard = self.state.lock().unwrap();
        let st: &mut State = &mut guard;
        for map in [&mut st.live, &mut st.durable] {
            if let Some(o) = map.get_mut(&oid).filter(|o| o.state.suspect) {
                // Its bytes are the reference now: their sums are recomputed.
                o.state.suspect = false;
                o.sums = sums::sums_of(&o.data);
            }
        }
        Ok(())
    }

    fn accept_lost(&self, oid: ObjectId) -> Result<Option<ObjState>, StoreError> {
        let mut guard = self.state.lock().unwrap();
        let st: &mut State = &mut guard;
        if let Some(why) = st.bad.remove(&oid) {
            if why.is_none() && !st.durable.contains_key(&oid) {
                // Created since its last flush, which failed: nothing of it was ever durable.
                st.live.remove(&oid);
                st.dirty.remove(&oid);
                return Ok(None);
            }
            // The live bytes went back to the durable ones when a flush failed: so does the
            // version; a corrupt copy keeps its bytes and version. Either is kept suspect, its
            // sums recomputed from its bytes.
            let durable = st.durable.get(&oid).map(|o| o.state.version);
            for map in [&mut st.live, &mut st.durable] {
                if let Some(o) = map.get_mut(&oid) {
                    if let (None, Some(v)) = (why, durable) {
                        o.state.version = v;
                    }
                    o.state.suspect = true;
                    o.sums = sums::sums_of(&o.data);
                }
            }
        }
        Ok(st.live.get(&oid).map(|o| o.state))
    }

    fn mark_lost(&self, oid: ObjectId) {
        let mut st = self.state.lock().unwrap();
        if st.live.contains_key(&oid) {
            st.bad.entry(oid).or_insert(None);
        }
    }

    fn forget(&self, oid: ObjectId) -> Result<(), StoreError> {
        let mut st = self.state.lock().unwrap();
        MemStore::check(&st, Op::Remove, oid)?;
        st.live.remove(&oid);
        st.durable.remove(&oid);
        st.dirty.remove(&oid);
        st.bad.remove(&oid);
        st.notes.remove(&oid);
        st.durable_notes.remove(&oid);
        Ok(())
    }

    fn flush(&self) -> Result<(), StoreError> {
        let mut st = self.state.lock().unwrap();
        let mut dirty: Vec<ObjectId> = st.dirty.drain().collect();
        st.moved.clear();
        dirty.sort_unstable();
        if let Err(e) = MemStore::check(&st, Op::Flush, ObjectId(0)) {
            // What the failed sync held is gone: back to the durable bytes, and lost until the
            // node restores it. The copy keeps the version lost, as the file backend's index
            // does: no later write may take that version again for other bytes.
            let failed = dirty.iter().filter_map(|&oid| lose(&mut st, oid)).collect();
            return Err(sync_failed(failed, e));
        }
        for oid in dirty {
            if let Some(o) = st.live.get(&oid).cloned() {
                st.durable.insert(oid, o);
            }
        }
        st.durable_notes = st.notes.clone();
        Ok(())
    }

    fn sync_object(&self, oid: ObjectId) -> Result<(), StoreError> {
        let mut st = self.state.lock().unwrap();
        let was_dirty = st.dirty.remove(&oid);
        st.moved.remove(&oid);
        if let Err(e) = MemStore::check(&st, Op::Flush, oid) {
            let failed = if was_dirty {
                lose(&mut st, oid).into_iter().collect()
            } else {
                Vec::new()
            };
            return Err(sync_failed(failed, e));
        }
        if was_dirty {
            if let Some(o) = st.live.get(&oid).cloned() {
                st.durable.insert(oid, o);
            }
        }
        match st.notes.get(&oid).cloned() {
            Some(n) => st.durable_notes.insert(oid, n),
            None => st.durable_notes.remove(&oid),
        };
        Ok(())
    }

    fn note(&self, oid: ObjectId) -> Option<Vec<u8>> {
        self.state.lock().unwrap().notes.get(&oid).cloned()
    }

    fn set_note(&self, oid: ObjectId, note: &[u8]) -> Result<(), StoreError> {
        self.pass(Op::Write, oid);
        let mut st = self.state.lock().unwrap();
        MemStore::check(&st, Op::Write, oid)?;
        st.notes.insert(oid, note.to_vec());
        Ok(())
    }

    fn capacity(&self) -> io::Result<(u64, u64)> {
        let st = self.state.lock().unwrap();
        let used: u64 = st.live.values().map(|o| o.data.len() as u64).sum();
        Ok((self.capacity, self.capacity.saturating_sub(used)))
    }
}

mod crash;
#[cfg(test)]
mod tests;
