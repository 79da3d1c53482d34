//! The node's object store behind one trait, so that the node runs over real files or, in
//! tests and the fault simulator, over memory.
//!
//! - [`file`](mod@file): one file per object under `DIR/obj/`, named `<oid>.<stamp>` (production).
//! - [`mem`]: objects in memory, with a volatile and a durable state so a test can crash a
//!   node and keep only what was flushed, and with injectable I/O errors.
//!
//! The contract every backend keeps:
//! - Every object carries an [`ObjState`]: its version, and whether that version is a delete (a
//!   tombstone, which has no bytes but keeps its version so an older copy never comes back).
//! - `write` sets the object's version; on a missing or deleted object it creates the object
//!   first (bytes not written read as zeros). The caller (the node) checks versions before it
//!   writes; the store does not order writes.
//! - `put_if_newer` installs a whole object or a tombstone only over an older version (or over
//!   a suspect copy of the same version).
//! - After a kill, a copy that had writes not yet flushed comes back *suspect* at its last
//!   flushed version ([`ObjState::suspect`]); `settle` makes it the reference.
//! - A write is durable once a later `flush` returned Ok; a crash may lose writes not yet
//!   flushed (and the version they set: the version that survives is never newer than the bytes
//!   that survive), never a flushed one, and never leaves an object half-created. A `write`
//!   that creates a data object where none was ([`creates_unsynced`]) is like any write: the
//!   object is durable at the next `flush`, and a crash or a kill before it drops the object
//!   whole (it never existed durably; nothing older is hidden under it). Creating an inode
//!   object or an object over a tombstone, `put_if_newer` and `forget` are durable when they
//!   return. A failed `flush` leaves such a new object lost at the version it had, with
//!   nothing durable: `accept_lost` drops it.
//! - A `flush` that could not make some objects durable says which ([`StoreError::SyncFailed`]);
//!   their data may be gone and a later flush does not make it durable again: from then on they
//!   are *lost* ([`StoreError::Lost`]): neither read nor written until `put_if_newer` or
//!   `forget`, and the node restores them from another replica; when no replica holds that
//!   data, `accept_lost` keeps what remains. A lost copy keeps the version it lost (its `meta`
//!   shows it), so no later write can take that version again for other bytes, and only a
//!   whole copy at least that new replaces it.
//! - Every block's checksum is verified on every read ([`sums`]): a block that does not match
//!   is never returned; the read fails with [`StoreError::Corrupt`] and the copy is unreadable
//!   (like a copy a failed flush lost) until `put_if_newer` installs a copy at least as new, or
//!   `accept_lost` keeps it. A *suspect* copy is not checked (a crash may leave its bytes and
//!   sums out of step); `settle` and `accept_lost` recompute its sums from its bytes.
//! - The backend is synchronous: the node calls it on tokio's blocking pool.

pub mod file;
pub mod mem;
pub mod meta;
pub mod sums;

use std::io;

use thiserror::Error;

use objstore_proto::oid::ObjectId;
pub use objstore_proto::version::{ObjState, Version};

pub use file::FileStore;
pub use mem::MemStore;

#[derive(Debug, Error)]
#[non_exhaustive]
pub enum StoreError {
    #[error("object {0} not found")]
    NotFound(ObjectId),
    #[error("no space left on the node's disk")]
    NoSpace,
    #[error("could not make {} object(s) durable ({}): their data may be lost here", oids.len(), first_oids(oids))]
    SyncFailed {
        /// Each object whose sync failed, with the version its data had: the copy is
        /// unreadable here until it is restored at that version or a newer one.
        oids: Vec<(ObjectId, Version)>,
        #[source]
        source: io::Error,
    },
    /// The copy here lost its data (a failed `fdatasync`, or a read that failed with an I/O
    /// error) and is not restored yet: it is neither read nor written until a whole copy
    /// replaces it ([`ObjectBackend::put_if_newer`]) or the node keeps what remains
    /// ([`ObjectBackend::accept_lost`]). Not a new disk error: the one that lost it was counted.
    #[error("object {0}: its copy here was lost (a failed fdatasync or read) and is being restored from a replica")]
    Lost(ObjectId),
    /// A block's checksum does not match its bytes: the copy is bad here.
    #[error("object {oid} is corrupt here: block {block} does not match its checksum")]
    Corrupt { oid: ObjectId, block: u64 },
    #[error("{op} of object {oid} failed")]
    Io {
        oid: ObjectId,
        op: &'static str,
        #[source]
        source: io::Error,
    },
}

impl StoreError {
    /// An I/O error of `op` on `oid`; ENOSPC becomes [`StoreError::NoSpace`].
    pub fn io(oid: ObjectId, op: &'static str, source: io::Error) -> StoreError {
        if source.raw_os_error() == Some(libc::ENOSPC) {
            StoreError::NoSpace
        } else {
            StoreError::Io { oid, op, source }
        }
    }
}

/// One part of a change written as several ([`ObjectBackend::write_parts`]): offset, data,
/// and the data's block sums when given.
pub type Part<'a> = (u64, &'a [u8], Option<&'a [u32]>);

/// The parts of [`ObjectBackend::write_parts`] written in turn with `write`, `sync` run
/// before the last when `sync_last` (and there is more than one).
pub(crate) fn parts_in_turn(
    parts: &[Part<'_>],
    sync_last: bool,
    mut sync: impl FnMut() -> Result<(), StoreError>,
    mut write: impl FnMut(u64, &[u8], Option<&[u32]>) -> Result<(), StoreError>,
) -> Result<(), StoreError> {
    let n = parts.len();
    for (i, &(offset, data, sums)) in parts.iter().enumerate() {
        if sync_last && i + 1 == n && n > 1 {
            sync()?;
        }
        write(offset, data, sums)?;
    }
    Ok(())
}

/// Whether a `write` creating `oid` where the store holds nothing of it (not even a
/// tombstone) may leave it unsynced until the next flush: data objects only. An inode is
/// created durable at once: the VDI table names it as soon as its creation returns, and a
/// crash must not leave a name pointing at nothing. (Over a tombstone, a crash that dropped
/// the new object would bring back no tombstone either, so older copies elsewhere could
/// return: that creation stays synced too.)
pub fn creates_unsynced(oid: ObjectId) -> bool {
    !oid.is_inode()
}

fn first_oids(oids: &[(ObjectId, Version)]) -> String {
    let mut s: Vec<String> = oids.iter().take(3).map(|(o, _)| o.to_string()).collect();
    if oids.len() > 3 {
        s.push("...".into());
    }
    s.join(", ")
}

/// What [`ObjectBackend::verify`] found: a copy that reads back whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub state: ObjState,
    /// [`objstore_proto::check::digest`] of its bytes (of nothing for a tombstone).
    pub digest: String,
    /// Bytes read.
    pub bytes: u64,
}

/// Index shards of a backend ([`shard_of`]): the unit of a listing's lock hold, and of its
/// parts ([`ObjectBackend::list_part`]).
pub const INDEX_SHARDS: usize = 1024;

/// The index shard of `oid`: its id's bits mixed (consecutive objects of a VDI spread over
/// every shard), then mapped to one of [`INDEX_SHARDS`] shards whose sizes grow evenly (in
/// ratio) from the first to twice as many in the last. A hash table doubles its slots when it
/// fills, so equal shards would all be full or all half empty at once, and the index's bytes
/// per object would swing 2x with the object count; shards spread over one doubling are at
/// every fill at once, and the index costs the same per object at every count.
pub fn shard_of(oid: ObjectId) -> usize {
    let x = oid.0.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    // Shard i takes [2^(i/N) - 1, 2^((i+1)/N) - 1) of [0, 1).
    let u = (x >> 11) as f64 / (1u64 << 53) as f64;
    (((1.0 + u).log2() * INDEX_SHARDS as f64) as usize).min(INDEX_SHARDS - 1)
}

/// The shards of part `part` of `parts` (`parts` at most [`INDEX_SHARDS`], `part` below it):
/// consecutive, and together every shard once.
pub fn shard_range(part: u32, parts: u32) -> std::ops::Range<usize> {
    let parts = (parts.max(1) as usize).min(INDEX_SHARDS);
    let part = (part as usize).min(parts);
    part * INDEX_SHARDS / parts..(part + 1) * INDEX_SHARDS / parts
}

/// An index in [`INDEX_SHARDS`] maps by [`shard_of`], one lock each: the file and the
/// metadata-only backends' index.
pub(crate) type Shards<E> = [std::sync::Mutex<std::collections::HashMap<ObjectId, E>>];

/// [`ObjectBackend::list_part`] of a sharded index whose entries have state `state`: one
/// shard's lock at a time.
pub(crate) fn shards_part<E>(
    index: &Shards<E>,
    part: u32,
    parts: u32,
    state: impl Fn(&E) -> ObjState,
) -> Vec<(ObjectId, ObjState)> {
    let mut v = Vec::new();
    for shard in &index[shard_range(part, parts)] {
        let shard = shard.lock().unwrap();
        v.extend(shard.iter().map(|(o, e)| (*o, state(e))));
    }
    v
}

/// [`ObjectBackend::list`] of a sharded index.
pub(crate) fn shards_list<E>(
    index: &Shards<E>,
    state: impl Fn(&E) -> ObjState,
) -> Vec<(ObjectId, ObjState)> {
    let mut v = shards_part(index, 0, 1, state);
    v.sort_unstable_by_key(|(o, _)| *o);
    v
}

/// [`ObjectBackend::len`] of a sharded index: entries that are not tombstones.
pub(crate) fn shards_live<E>(index: &Shards<E>, state: impl Fn(&E) -> ObjState) -> usize {
    (index.iter())
        .map(|s| {
            s.lock()
                .unwrap()
                .values()
                .filter(|e| !state(e).deleted)
                .count()
        })
        .sum()
}

/// The bytes a sharded index's hash tables take: each table's buckets (its capacity is 7/8
/// of them) times one entry and one control byte. The objects' own bytes are not counted.
pub(crate) fn shards_bytes<E>(index: &Shards<E>) -> u64 {
    let slot = std::mem::size_of::<(ObjectId, E)>() as u64 + 1;
    (index.iter())
        .map(|s| {
            let cap = s.lock().unwrap().capacity() as u64;
            let buckets = if cap == 0 {
                0
            } else {
                (cap * 8 / 7).next_power_of_two()
            };
            buckets * slot
        })
        .sum()
}

/// Where a node keeps its objects. See the module documentation for the contract.
pub trait ObjectBackend: Send + Sync + 'static {
    /// The object's state here (tombstones included), if it is held here.
    fn meta(&self, oid: ObjectId) -> Option<ObjState>;
    /// Every object held here with its state (tombstones included), sorted by id.
    fn list(&self) -> Vec<(ObjectId, ObjState)>;
    /// Part `part` of `parts` of [`ObjectBackend::list`], in no order: the objects whose
    /// [`shard_of`] falls in [`shard_range`]`(part, parts)`. The parts of one `parts` hold
    /// every object once. A backend with a sharded index holds one shard's lock at a time,
    /// so a listing never stops the node's requests for more than a short slice.
    fn list_part(&self, part: u32, parts: u32) -> Vec<(ObjectId, ObjState)> {
        let range = shard_range(part, parts);
        let mut v = self.list();
        v.retain(|(oid, _)| range.contains(&shard_of(*oid)));
        v
    }
    /// How many objects with data are held here (tombstones not counted).
    fn len(&self) -> usize;
    /// How many objects were put in this store's index since it was opened (an object
    /// removed and put again counts again; a change of one held counts nothing). Two equal
    /// readings mean no object appeared in between: what a node needs to reuse its objects'
    /// order on the ring across its peers' listings. None: not counted (never reused).
    fn created(&self) -> Option<u64> {
        None
    }
    /// Memory the in-memory index of the objects takes, in bytes (None: the backend keeps
    /// none of its own). Reported by the scale bench.
    fn index_bytes(&self) -> Option<u64> {
        None
    }
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Reads `len` bytes at `offset`; bytes past the object's end read as zeros. A missing or
    /// deleted object is [`StoreError::NotFound`].
    fn read(&self, oid: ObjectId, offset: u64, len: usize) -> Result<Vec<u8>, StoreError>;
    /// The object's length in bytes (None: missing, or a tombstone). Cheap: the node asks it
    /// on every read and write of a data object, to find partial copy-on-write targets
    /// ([`objstore_proto::cowrec`]), which are longer than the object size.
    fn object_len(&self, oid: ObjectId) -> Option<u64>;
    /// Whether the copy of `oid` here survives a crash as it is now: live, and no write since
    /// its last flush (a partial copy-on-write target is made only from such a source: it
    /// must never outlive the bytes it reads).
    fn is_durable(&self, oid: ObjectId) -> bool;
    /// Makes the bytes written to `oid` so far durable without declaring its version durable:
    /// after a crash the copy may come back suspect at its last flushed version, holding
    /// these bytes (a data object created since the last flush is still dropped whole). The
    /// node syncs a partial target's new blocks before it sets their bits, so that a bit
    /// never reaches the disk before its block.
    fn sync_bytes(&self, oid: ObjectId) -> Result<(), StoreError>;
    /// Reads a whole object and its state (for recovery); a tombstone has no bytes.
    fn read_whole(&self, oid: ObjectId) -> Result<(Vec<u8>, ObjState), StoreError>;
    /// Reads a whole copy back and hashes it (`CheckObj`, the scrub). An error is a bad copy:
    /// a read that failed, or (for a backend that keeps checksums) bytes that do not match
    /// them. The default reads through [`ObjectBackend::read_whole`], which catches only read
    /// errors; a flipped byte shows as a digest that differs from the other copies'.
    fn verify(&self, oid: ObjectId) -> Result<Verified, StoreError> {
        let (data, state) = self.read_whole(oid)?;
        Ok(Verified {
            state,
            digest: objstore_proto::check::digest(&data),
            bytes: data.len() as u64,
        })
    }
    /// Writes `data` at `offset`, creating the object if it is missing or deleted, and sets its
    /// version to `version`. `sums`, when given for a write of whole blocks ([`sums::given`]),
    /// are the sums of `data`'s blocks as the primary computed them: the store keeps them
    /// instead of summing again (a byte damaged on its way here then fails its check on read);
    /// sums that do not fit the write are ignored.
    fn write(
        &self,
        oid: ObjectId,
        offset: u64,
        data: &[u8],
        sums: Option<&[u32]>,
        version: Version,
    ) -> Result<(), StoreError>;
    /// [`ObjectBackend::write`] of each part in turn (offset, data, sums), all at `version`,
    /// as one change: no read sees some parts and not others. The parts of a partial
    /// copy-on-write target's change: its blocks, then its record. With `sync_last`, the
    /// bytes of the parts before the last are made durable ([`ObjectBackend::sync_bytes`])
    /// before the last is written, so a crash never keeps the last without the others. Else,
    /// like separate writes, a crash may keep some parts and not others, except where the
    /// object is created here (then they land together or not at all, as any creation). An
    /// error after some parts are in leaves the copy lost in the file backend, reported as
    /// [`StoreError::SyncFailed`].
    fn write_parts(
        &self,
        oid: ObjectId,
        parts: &[Part<'_>],
        sync_last: bool,
        version: Version,
    ) -> Result<(), StoreError> {
        // Separate calls: atomic to readers only where nothing runs between them (the memory
        // backend under the simulator, inline on one thread); the file backend holds the
        // object's lock across them.
        parts_in_turn(
            parts,
            sync_last,
            || self.sync_bytes(oid),
            |offset, data, sums| self.write(oid, offset, data, sums, version),
        )
    }
    /// [`ObjectBackend::write`] if it can be done at once, without waiting for another thread
    /// (an object lock held by a flush, say): None when it cannot, and nothing was done. The
    /// node calls it for small writes on its async tasks, sparing them a hop to the blocking
    /// pool; the default never can.
    fn write_now(
        &self,
        _oid: ObjectId,
        _offset: u64,
        _data: &[u8],
        _sums: Option<&[u32]>,
        _version: Version,
    ) -> Option<Result<(), StoreError>> {
        None
    }
    /// [`ObjectBackend::write_parts`] of an object this store holds nothing of, if it can be
    /// done at once (the object's lock free, a creation that needs no sync): None when it
    /// cannot, and nothing was done. The node calls it for the few blocks of a new partial
    /// copy-on-write target on its async tasks; the default never can.
    fn create_now(
        &self,
        _oid: ObjectId,
        _parts: &[Part<'_>],
        _version: Version,
    ) -> Option<Result<(), StoreError>> {
        None
    }
    /// Replaces the whole object with `data` at `state` (a tombstone if `state.deleted`; then
    /// `data` is ignored) unless the copy here is at least that new and not suspect
    /// ([`ObjState::replaced_by`]). The copy installed is not suspect. Returns whether it
    /// installed.
    fn put_if_newer(&self, oid: ObjectId, data: &[u8], state: ObjState)
        -> Result<bool, StoreError>;
    /// Declares a suspect copy ([`ObjState::suspect`]) the reference its replicas copy: it is
    /// no longer suspect. No-op for a copy that is not suspect.
    fn settle(&self, oid: ObjectId) -> Result<(), StoreError>;
    /// Keeps what remains of a copy whose data a failed `flush` lost (see the module
    /// documentation), when no other node holds that data: the copy becomes readable again as
    /// a suspect copy ([`ObjState::suspect`]) at the last version made durable here, whose
    /// bytes may hold some of the lost writes. Returns its state, None when nothing remains.
    /// For a copy not lost, returns its state unchanged.
    fn accept_lost(&self, oid: ObjectId) -> Result<Option<ObjState>, StoreError>;
    /// Declares the copy of `oid` here lost although no flush failed: a read of it failed with
    /// an I/O error, so its bytes cannot be vouched for. From then on it is handled as a copy a
    /// failed `flush` lost (see the module documentation): unreadable until `put_if_newer`
    /// (any copy at least as new replaces it) or `forget`. No-op for an object not held here.
    fn mark_lost(&self, oid: ObjectId);
    /// Drops every trace of an object (a copy this node no longer owns, or one it must fetch
    /// again); forgetting a missing object is not an error.
    fn forget(&self, oid: ObjectId) -> Result<(), StoreError>;
    /// Makes every write before this call durable.
    fn flush(&self) -> Result<(), StoreError>;
    /// Makes `oid` durable as it is now: its note, then its bytes and version, as a flush would
    /// make them (a strip's change is on stable storage before its holder answers). A sync
    /// that fails loses the copy as a failed flush does. The default flushes everything.
    fn sync_object(&self, _oid: ObjectId) -> Result<(), StoreError> {
        self.flush()
    }
    /// The note kept with `oid` ([`ObjectBackend::set_note`]), if any.
    fn note(&self, _oid: ObjectId) -> Option<Vec<u8>> {
        None
    }
    /// The first `len` bytes of `oid`'s note (all of it if shorter): what a reader of a note's
    /// head needs, without its tail (an erasure-coded strip's undo, up to a strip's size).
    fn note_prefix(&self, oid: ObjectId, len: usize) -> Option<Vec<u8>> {
        self.note(oid).map(|mut n| {
            n.truncate(len);
            n
        })
    }
    /// Keeps `note` with `oid` in place of the one before: a few bytes the node keeps beside an
    /// object's own (an erasure-coded strip's last change and what undoes it). A note set
    /// before a write lasts at least as long as that write's bytes: a kill keeps both, a
    /// crash keeps the note as of the last flush, which syncs notes before objects; a note torn
    /// by a crash reads as none. `put_if_newer` (when it installs) and `forget` drop the note.
    fn set_note(&self, oid: ObjectId, _note: &[u8]) -> Result<(), StoreError> {
        Err(StoreError::Io {
            oid,
            op: "note",
            source: io::Error::new(io::ErrorKind::Unsupported, "this store keeps no notes"),
        })
    }
    /// (total, free) bytes of the medium.
    fn capacity(&self) -> io::Result<(u64, u64)>;
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::sync::Mutex;

    /// The file store's index ([`shards_bytes`] of its 32-byte entries) costs under 64 bytes an
    /// object at every count from 100,000 to 2 million, not only on average (issue 43).
    #[test]
    fn index_under_64_bytes_an_object_at_every_count() {
        let index: Vec<Mutex<HashMap<ObjectId, [u64; 3]>>> =
            (0..INDEX_SHARDS).map(|_| Mutex::default()).collect();
        let (mut lo, mut hi) = (f64::MAX, 0f64);
        for i in 0..2_000_000u64 {
            let oid = ObjectId::data(
                objstore_proto::oid::Vid((i % 97) as u32 + 1),
                objstore_proto::oid::ObjIndex((i / 97) as u32),
            );
            index[shard_of(oid)].lock().unwrap().insert(oid, [0; 3]);
            if i >= 100_000 && i % 25_000 == 0 {
                let per = shards_bytes(&index) as f64 / (i + 1) as f64;
                (lo, hi) = (lo.min(per), hi.max(per));
            }
        }
        eprintln!("index: {lo:.1} to {hi:.1} bytes an object");
        assert!(hi < 64.0, "{lo:.1} to {hi:.1} bytes an object");
        // Shards differ at most 2x, a listing's slice with them.
        let sizes: Vec<usize> = index.iter().map(|s| s.lock().unwrap().len()).collect();
        let (min, max) = (sizes.iter().min().unwrap(), sizes.iter().max().unwrap());
        assert!(*max < 3 * *min, "shards of {min} to {max} objects");
    }
}
