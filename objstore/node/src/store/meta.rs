//! The metadata-only backend: each object's state and length, no bytes. For the scale harness
//! (issue 43: `objstore/node/tests/scale.rs`, `bench run --only scale`), which runs recovery
//! over millions of objects a node, where only versions matter.
//!
//! Reads return zeros (an object's bytes are all zeros, whatever was written); every change is
//! durable at once (`flush` has nothing to do, a crash loses nothing). Not for copy-on-write:
//! a partial target's record reads as zeros. The index is sharded as the file backend's
//! ([`super::shard_of`]), one lock a shard.

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use objstore_proto::oid::ObjectId;

use super::{shard_of, ObjState, ObjectBackend, StoreError, Version, INDEX_SHARDS};

/// One object: its state and its length in bytes (0 for a tombstone).
#[derive(Debug, Clone, Copy)]
struct Meta {
    state: ObjState,
    len: u64,
}

/// Versions and lengths in memory, no bytes.
pub struct MetaStore {
    shards: Vec<Mutex<HashMap<ObjectId, Meta>>>,
    /// Objects put in the index since the store was made ([`ObjectBackend::created`]).
    created: AtomicU64,
}

impl Default for MetaStore {
    fn default() -> Self {
        MetaStore {
            shards: (0..INDEX_SHARDS).map(|_| Mutex::default()).collect(),
            created: AtomicU64::new(0),
        }
    }
}

impl MetaStore {
    /// Puts `objects` in at once, each `len` bytes at its state (replacing what was there):
    /// how a harness fills a node with millions of objects without a request each.
    pub fn fill(&self, objects: impl IntoIterator<Item = (ObjectId, ObjState)>, len: u64) {
        let mut by_shard: Vec<Vec<(ObjectId, ObjState)>> = vec![Vec::new(); INDEX_SHARDS];
        for (oid, st) in objects {
            by_shard[shard_of(oid)].push((oid, st));
        }
        for (shard, objs) in self.shards.iter().zip(by_shard) {
            let mut m = shard.lock().unwrap();
            m.reserve(objs.len());
            for (oid, state) in objs {
                let len = if state.deleted { 0 } else { len };
                if m.insert(oid, Meta { state, len }).is_none() {
                    self.created.fetch_add(1, Ordering::SeqCst);
                }
            }
        }
    }

    fn get(&self, oid: ObjectId) -> Option<Meta> {
        self.shards[shard_of(oid)]
            .lock()
            .unwrap()
            .get(&oid)
            .copied()
    }

    fn live(&self, oid: ObjectId) -> Result<Meta, StoreError> {
        match self.get(oid) {
            Some(m) if !m.state.deleted => Ok(m),
            _ => Err(StoreError::NotFound(oid)),
        }
    }
}

impl ObjectBackend for MetaStore {
    fn meta(&self, oid: ObjectId) -> Option<ObjState> {
        self.get(oid).map(|m| m.state)
    }

    fn list(&self) -> Vec<(ObjectId, ObjState)> {
        super::shards_list(&self.shards, |m: &Meta| m.state)
    }

    fn list_part(&self, part: u32, parts: u32) -> Vec<(ObjectId, ObjState)> {
        super::shards_part(&self.shards, part, parts, |m: &Meta| m.state)
    }

    fn len(&self) -> usize {
        super::shards_live(&self.shards, |m: &Meta| m.state)
    }

    fn index_bytes(&self) -> Option<u64> {
        Some(super::shards_bytes(&self.shards))
    }

    fn created(&self) -> Option<u64> {
        Some(self.created.load(Ordering::SeqCst))
    }

    fn read(&self, oid: ObjectId, _offset: u64, len: usize) -> Result<Vec<u8>, StoreError> {
        self.live(oid)?;
        Ok(vec![0; len])
    }

    fn object_len(&self, oid: ObjectId) -> Option<u64> {
        self.live(oid).ok().map(|m| m.len)
    }

    fn is_durable(&self, oid: ObjectId) -> bool {
        self.live(oid).is_ok()
    }

    fn sync_bytes(&self, _oid: ObjectId) -> Result<(), StoreError> {
        Ok(())
    }

    fn read_whole(&self, oid: ObjectId) -> Result<(Vec<u8>, ObjState), StoreError> {
        match self.get(oid) {
            Some(m) if m.state.deleted => Ok((Vec::new(), m.state)),
            Some(m) => Ok((vec![0; m.len as usize], m.state)),
            None => Err(StoreError::NotFound(oid)),
        }
    }

    fn write(
        &self,
        oid: ObjectId,
        offset: u64,
        data: &[u8],
        _sums: Option<&[u32]>,
        version: Version,
    ) -> Result<(), StoreError> {
        let mut shard = self.shards[shard_of(oid)].lock().unwrap();
        let end = offset + data.len() as u64;
        let m = shard.entry(oid).or_insert_with(|| {
            self.created.fetch_add(1, Ordering::SeqCst);
            Meta {
                state: ObjState::live(version),
                len: 0,
            }
        });
        let len = if m.state.deleted { end } else { m.len.max(end) };
        *m = Meta {
            state: ObjState::live(version),
            len,
        };
        Ok(())
    }

    fn put_if_newer(
        &self,
        oid: ObjectId,
        data: &[u8],
        state: ObjState,
    ) -> Result<bool, StoreError> {
        let mut shard = self.shards[shard_of(oid)].lock().unwrap();
        if shard.get(&oid).is_some_and(|m| !m.state.replaced_by(state)) {
            return Ok(false);
        }
        let state = ObjState {
            suspect: false,
            lost: false,
            ..state
        };
        let len = if state.deleted { 0 } else { data.len() as u64 };
        if shard.insert(oid, Meta { state, len }).is_none() {
            self.created.fetch_add(1, Ordering::SeqCst);
        }
        Ok(true)
    }

    fn settle(&self, oid: ObjectId) -> Result<(), StoreError> {
        if let Some(m) = self.shards[shard_of(oid)].lock().unwrap().get_mut(&oid) {
            m.state.suspect = false;
        }
        Ok(())
    }

    fn accept_lost(&self, oid: ObjectId) -> Result<Option<ObjState>, StoreError> {
        Ok(self.meta(oid))
    }

    fn mark_lost(&self, _oid: ObjectId) {}

    fn forget(&self, oid: ObjectId) -> Result<(), StoreError> {
        self.shards[shard_of(oid)].lock().unwrap().remove(&oid);
        Ok(())
    }

    fn flush(&self) -> Result<(), StoreError> {
        Ok(())
    }

    fn capacity(&self) -> io::Result<(u64, u64)> {
        Ok((u64::MAX, u64::MAX))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_versions_and_lengths_and_reads_zeros() {
        let s = MetaStore::default();
        let a = ObjectId(7);
        s.write(a, 4096, &[1; 100], None, Version(5)).unwrap();
        assert_eq!(s.meta(a), Some(ObjState::live(Version(5))));
        assert_eq!(s.object_len(a), Some(4196));
        assert_eq!(s.read(a, 0, 8).unwrap(), vec![0; 8]);
        assert!(!s.put_if_newer(a, &[], ObjState::live(Version(4))).unwrap());
        assert!(s
            .put_if_newer(a, &[], ObjState::tombstone(Version(6)))
            .unwrap());
        assert!(matches!(s.read(a, 0, 1), Err(StoreError::NotFound(_))));
        assert_eq!(s.len(), 0);
        s.fill(
            (0..1000).map(|i| (ObjectId(i), ObjState::live(Version(1)))),
            1 << 20,
        );
        assert_eq!(
            s.len(),
            1000,
            "the tombstone of object 7 is replaced by the fill"
        );
        let parts: usize = (0..16).map(|p| s.list_part(p, 16).len()).sum();
        assert_eq!(parts, 1000);
        assert_eq!(s.list().len(), 1000);
    }
}
