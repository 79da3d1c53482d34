//! The file backend: one file per object under `DIR/obj/`, named `<oid>.<version>` (both in
//! hex), and a tombstone as an empty file `<oid>.<version>.del`.
//!
//! The version in a name is the version of the bytes the file is known to hold durably: a write
//! changes the version in memory only, and `flush` renames the file to the version it synced.
//! The first write after a flush first renames the file to `<oid>.<version>.w` ("being
//! written"), and the flush that syncs it renames it back. A write of the version alone (no
//! bytes: an erasure-coded strip a change left alone) changes no byte, so it leaves the file
//! unmarked; after a crash the file is its old version, whose bytes are the same, and its
//! sync is the rename only (an unmarked file holds no bytes newer than its name). So a crash may leave a file holding
//! bytes newer than its name says (a kill leaves the page cache to the kernel), never older, and
//! such a file is marked: reopened, it is *suspect* ([`ObjState::suspect`]), and recovery makes
//! every replica take one reference copy before any serves it (replicas killed together may
//! each hold a different subset of the writes in flight). A node that comes back lists the
//! older version and pulls the object again if another node has a newer one. Version
//! bookkeeping costs a rename per object per flush interval, not a disk write per request.
//! (After a power cut the marker is as safe as the journal's order: ext4 commits renames
//! within seconds and writes dirty data back after 30 s.)
//!
//! Crash safety: a whole object installed (recovery, a copy-on-write target), a new inode, an
//! object written over a tombstone, and a tombstone are built in `obj/.tmp/`, `sync_all`ed,
//! renamed into place and the directory fsynced, so a crash never leaves a zero-length or
//! half-created object that is later served. A data object that a write creates where the store
//! holds nothing of it is written straight to `<oid>.0.n` without a sync, like any write into
//! the page cache: the next flush syncs it, names it after its version and fsyncs the
//! directory; reopened before that (a kill, a crash) the file is removed, as if the write had
//! never reached the disk (nothing older hides under it; see [`super::creates_unsynced`]).
//! Later writes go in place (`pwrite`); like a disk's sectors, each
//! 4 KiB page of a write lands whole or not at all, and `flush` makes every earlier write durable
//! (`fdatasync` of each file written since the last flush, its rename, then the directory). An
//! `fdatasync` that fails is reported for that object and the object is not retried: the node
//! restores it from another replica. `sync_object` (an erasure-coded strip's change, synced
//! before it is answered) of an object or note a running flush took waits for that flush,
//! which syncs it (else it answered before the bytes, or the undo, were durable). The store is
//! synchronous: callers run it on a blocking pool.
//!
//! Checksums (`layout`): every file starts with a header region holding one sum per 4 KiB
//! block, and the object's bytes follow, so one `fdatasync` makes both durable. A write
//! updates the sums of the blocks it touches; a read checks every block it returns, and a
//! mismatch marks the copy bad ([`StoreError::Corrupt`]) until it is restored. A marked
//! (suspect) file may hold bytes and sums out of step after a crash: it is read unchecked, and
//! its sums are recomputed from its bytes when it is settled or kept (`accept_lost`).

use std::collections::{HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, RwLock};

use objstore_proto::oid::ObjectId;

use super::{shard_of, sums, ObjState, ObjectBackend, Part, StoreError, Version, INDEX_SHARDS};

const LOCK_SHARDS: usize = 256;

/// Objects as files in a directory (see the module documentation).
pub struct FileStore {
    dir: PathBuf,
    tmp: PathBuf,
    /// The objects' entries, in [`INDEX_SHARDS`] maps by [`shard_of`]: a listing holds one
    /// shard's lock at a time, never the whole index.
    index: Vec<Mutex<HashMap<ObjectId, Packed>>>,
    dirty: Mutex<HashSet<ObjectId>>,
    locks: Vec<RwLock<()>>,
    /// Held for the whole of a flush: a flush that finds nothing dirty because an earlier one
    /// took it must still wait until that one has synced it.
    flushing: Mutex<()>,
    /// Objects unreadable until restored: their last fdatasync failed (None), or a block of
    /// theirs did not match its sum (that block).
    bad: Mutex<HashMap<ObjectId, Option<u64>>>,
    /// Objects put in the index since the store opened ([`ObjectBackend::created`]).
    created: std::sync::atomic::AtomicU64,
    /// The objects' notes ([`ObjectBackend::set_note`]).
    notes: Notes,
}

/// The error a read of a bad copy (see [`FileStore::bad`]) gets.
fn bad_copy(oid: ObjectId, why: Option<u64>) -> StoreError {
    match why {
        Some(block) => StoreError::Corrupt { oid, block },
        None => StoreError::Lost(oid),
    }
}

impl FileStore {
    /// Opens (creating if needed) the store in `dir`, indexing the objects there and removing
    /// leftovers of interrupted writes.
    pub fn open(dir: &Path) -> io::Result<FileStore> {
        let tmp = dir.join(".tmp");
        fs::create_dir_all(&tmp)?;
        for e in fs::read_dir(&tmp)? {
            let _ = fs::remove_file(e?.path());
        }
        layout::open_format(dir, &tmp)?;
        let mut index: Vec<Mutex<HashMap<ObjectId, Packed>>> =
            (0..INDEX_SHARDS).map(|_| Mutex::default()).collect();
        for (oid, e) in names::read_index(dir)? {
            index[shard_of(oid)]
                .get_mut()
                .unwrap()
                .insert(oid, e.into());
        }
        Ok(FileStore {
            dir: dir.to_path_buf(),
            tmp,
            index,
            dirty: Mutex::default(),
            locks: (0..LOCK_SHARDS).map(|_| RwLock::new(())).collect(),
            flushing: Mutex::new(()),
            bad: Mutex::default(),
            created: Default::default(),
            notes: Notes::open(dir)?,
        })
    }

    fn lock(&self, oid: ObjectId) -> &RwLock<()> {
        &self.locks[(oid.0 ^ (oid.0 >> 32)) as usize % LOCK_SHARDS]
    }

    /// The index shard that holds `oid`'s entry, locked.
    fn idx(&self, oid: ObjectId) -> std::sync::MutexGuard<'_, HashMap<ObjectId, Packed>> {
        self.index[shard_of(oid)].lock().unwrap()
    }

    /// Puts `oid`'s entry in the index, counting it in `created` if it was not there.
    fn put_entry(&self, oid: ObjectId, e: Entry) {
        if self.idx(oid).insert(oid, e.into()).is_none() {
            (self.created).fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    fn entry(&self, oid: ObjectId) -> Option<Entry> {
        self.idx(oid).get(&oid).map(Packed::unpack)
    }

    /// Changes `oid`'s entry in the index with `f`, if it has one.
    fn update(&self, oid: ObjectId, f: impl FnOnce(&mut Entry)) {
        if let Some(p) = self.idx(oid).get_mut(&oid) {
            let mut e = p.unpack();
            f(&mut e);
            *p = e.into();
        }
    }

    /// A bad copy (see [`FileStore::bad`]) is not read: its error.
    fn check_bad(&self, oid: ObjectId) -> Result<(), StoreError> {
        match self.bad.lock().unwrap().get(&oid) {
            Some(why) => Err(bad_copy(oid, *why)),
            None => Ok(()),
        }
    }

    /// Passes `res` on; a checksum mismatch in it first marks the copy bad, so that nothing
    /// reads it again and a copy of the same version may replace it.
    fn note_corrupt<T>(&self, res: Result<T, StoreError>) -> Result<T, StoreError> {
        if let Err(StoreError::Corrupt { oid, block }) = &res {
            tracing::error!("object {oid}: block {block} does not match its checksum; the copy here is bad until restored");
            self.bad.lock().unwrap().entry(*oid).or_insert(Some(*block));
        }
        res
    }

    /// Recomputes and syncs the sums of the file of `e` from its bytes.
    fn reseal(&self, oid: ObjectId, e: &Entry) -> Result<(), StoreError> {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(self.path(oid, e))
            .map_err(|e| StoreError::io(oid, "open", e))?;
        layout::reseal(&f, oid)
    }

    /// [`ObjectBackend::sync_bytes`] with the object's lock held.
    fn sync_bytes_locked(&self, oid: ObjectId) -> Result<(), StoreError> {
        let Some(e) = self.entry(oid).filter(|e| !e.state.deleted) else {
            return Ok(());
        };
        if let Err(source) = File::open(self.path(oid, &e)).and_then(|f| f.sync_data()) {
            // As a failed flush: the dirty pages may be gone, and the copy with them.
            tracing::error!("fdatasync of object {oid} failed: {source}");
            self.bad.lock().unwrap().insert(oid, None);
            self.dirty.lock().unwrap().remove(&oid);
            return Err(StoreError::SyncFailed {
                oids: vec![(oid, e.state.version)],
                source,
            });
        }
        Ok(())
    }

    /// [`ObjectBackend::write`] with the object's write lock held.
    fn write_locked(
        &self,
        oid: ObjectId,
        offset: u64,
        data: &[u8],
        sums: Option<&[u32]>,
        version: Version,
    ) -> Result<(), StoreError> {
        // A lost copy takes no write: its bytes are not those of its version, and a write
        // would move its version past the one lost, which the copy restoring it must reach.
        if self.bad.lock().unwrap().get(&oid) == Some(&None) {
            return Err(StoreError::Lost(oid));
        }
        match self.entry(oid) {
            Some(e) if !e.state.deleted && data.is_empty() => {
                // The version alone: the bytes on disk are those of the new version as much
                // as of the old, so the file is not marked, and after a crash it is the old
                // version, not suspect. The next sync names it (without an fdatasync).
                self.update(oid, |x| x.state.version = version);
                if e.state.version != version {
                    self.dirty.lock().unwrap().insert(oid);
                }
                Ok(())
            }
            Some(mut e) if !e.state.deleted => {
                if !e.marked {
                    // Marked before the bytes change: a crash from here on leaves the mark.
                    let marked = Entry { marked: true, ..e };
                    fs::rename(self.path(oid, &e), self.path(oid, &marked))
                        .map_err(|err| StoreError::io(oid, "rename", err))?;
                    e = marked;
                    self.update(oid, |x| x.marked = true);
                }
                let f = OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(self.path(oid, &e))
                    .map_err(|e| StoreError::io(oid, "open", e))?;
                // A corrupt copy is written too (it stays bad until replaced), but an edge
                // block that does not check is never given a fresh sum.
                self.note_corrupt(layout::write(&f, oid, offset, data, sums, !e.state.suspect))?;
                let end = offset + data.len() as u64;
                self.update(oid, |e| {
                    e.state.version = version;
                    e.len = e.len.map(|l| l.max(end));
                });
                self.dirty.lock().unwrap().insert(oid);
                Ok(())
            }
            None if super::creates_unsynced(oid) => {
                self.create(oid, &[(offset, data, sums)], version)
            }
            old => self.install(oid, offset, data, sums, ObjState::live(version), old),
        }
    }

    /// A new data object where the store holds nothing of it, like a write into the page
    /// cache: `<oid>.0.n`, not synced, durable at the next flush (which names it after its
    /// version and fsyncs the directory). Reopened before that, it is dropped. Holds `parts`
    /// (offset, data, sums), written through one open file. Caller holds the object's write
    /// lock.
    fn create(
        &self,
        oid: ObjectId,
        parts: &[Part<'_>],
        version: Version,
    ) -> Result<(), StoreError> {
        let e = Entry {
            state: ObjState::live(version),
            disk: Version::NONE,
            marked: true,
            len: Some(
                parts
                    .iter()
                    .map(|p| p.0 + p.1.len() as u64)
                    .max()
                    .unwrap_or(0),
            ),
        };
        let path = self.path(oid, &e);
        let mut guard = DeleteOnDrop(Some(path.clone()));
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .map_err(|e| StoreError::io(oid, "create", e))?;
        layout::create_parts(&f, oid, parts)?;
        guard.0 = None;
        self.put_entry(oid, e);
        self.dirty.lock().unwrap().insert(oid);
        Ok(())
    }

    /// Removes the file of `e` (already gone is fine) and every trace of `oid` here. Caller
    /// holds the object's write lock.
    fn drop_copy(&self, oid: ObjectId, e: &Entry) -> Result<(), StoreError> {
        match fs::remove_file(self.path(oid, e)) {
            Ok(()) => {}
            Err(err) if err.kind() == io::ErrorKind::NotFound => {}
            Err(err) => return Err(StoreError::io(oid, "remove", err)),
        }
        self.idx(oid).remove(&oid);
        self.dirty.lock().unwrap().remove(&oid);
        self.bad.lock().unwrap().remove(&oid);
        Ok(())
    }

    /// The file an entry's bytes (or tombstone) are in now.
    fn path(&self, oid: ObjectId, e: &Entry) -> PathBuf {
        self.dir
            .join(file_name(oid, e.disk, e.state.deleted, e.marked))
    }

    /// The crash-safe recipe: tmp file, sync_all, rename, fsync the directory, then drop the
    /// replaced file. `data` lands at `offset` (a tombstone has none), with `sums` as
    /// [`layout::write`] takes them. Caller holds the object's write lock.
    fn install(
        &self,
        oid: ObjectId,
        offset: u64,
        data: &[u8],
        sums: Option<&[u32]>,
        state: ObjState,
        old: Option<Entry>,
    ) -> Result<(), StoreError> {
        let state = ObjState {
            suspect: false,
            lost: false,
            ..state
        };
        let name = file_name(oid, state.version, state.deleted, false);
        let tmp_path = self.tmp.join(format!("{name}.{}", rand::random::<u32>()));
        let mut guard = DeleteOnDrop(Some(tmp_path.clone()));
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&tmp_path)
            .map_err(|e| StoreError::io(oid, "create", e))?;
        if !state.deleted {
            layout::create(&f, oid, offset, data, sums)?;
        }
        f.sync_all().map_err(|e| StoreError::io(oid, "sync", e))?;
        let final_path = self.dir.join(&name);
        fs::rename(&tmp_path, &final_path).map_err(|e| StoreError::io(oid, "rename", e))?;
        guard.0 = None;
        fsync_dir(&self.dir).map_err(|e| StoreError::io(oid, "sync dir", e))?;
        if let Some(old) = old {
            let old_path = self.path(oid, &old);
            if old_path != final_path {
                let _ = fs::remove_file(old_path);
            }
        }
        self.put_entry(
            oid,
            Entry {
                state,
                disk: state.version,
                marked: false,
                len: Some(if state.deleted {
                    0
                } else {
                    offset + data.len() as u64
                }),
            },
        );
        self.dirty.lock().unwrap().remove(&oid);
        self.bad.lock().unwrap().remove(&oid);
        Ok(())
    }
}

impl ObjectBackend for FileStore {
    fn meta(&self, oid: ObjectId) -> Option<ObjState> {
        self.entry(oid).map(|e| e.state)
    }

    fn list(&self) -> Vec<(ObjectId, ObjState)> {
        super::shards_list(&self.index, |e: &Packed| e.state())
    }

    fn list_part(&self, part: u32, parts: u32) -> Vec<(ObjectId, ObjState)> {
        super::shards_part(&self.index, part, parts, |e: &Packed| e.state())
    }

    fn len(&self) -> usize {
        super::shards_live(&self.index, |e: &Packed| e.state())
    }

    fn created(&self) -> Option<u64> {
        Some(self.created.load(std::sync::atomic::Ordering::SeqCst))
    }

    fn index_bytes(&self) -> Option<u64> {
        Some(super::shards_bytes(&self.index))
    }

    fn read(&self, oid: ObjectId, offset: u64, len: usize) -> Result<Vec<u8>, StoreError> {
        let _g = self.lock(oid).read().unwrap();
        self.check_bad(oid)?;
        let e = self
            .entry(oid)
            .filter(|e| !e.state.deleted)
            .ok_or(StoreError::NotFound(oid))?;
        let f = File::open(self.path(oid, &e)).map_err(|e| StoreError::io(oid, "open", e))?;
        self.note_corrupt(layout::read(&f, oid, offset, len, !e.state.suspect))
    }

    fn object_len(&self, oid: ObjectId) -> Option<u64> {
        let e = self.entry(oid).filter(|e| !e.state.deleted)?;
        if let Some(len) = e.len {
            return Some(len);
        }
        let _g = self.lock(oid).read().unwrap();
        let e = self.entry(oid).filter(|e| !e.state.deleted)?;
        let len = fs::metadata(self.path(oid, &e))
            .ok()?
            .len()
            .saturating_sub(sums::HEADER_LEN);
        self.update(oid, |x| x.len = Some(len));
        Some(len)
    }

    fn is_durable(&self, oid: ObjectId) -> bool {
        self.entry(oid)
            .is_some_and(|e| !e.state.deleted && !e.marked && e.disk == e.state.version)
    }

    fn sync_bytes(&self, oid: ObjectId) -> Result<(), StoreError> {
        let _g = self.lock(oid).read().unwrap();
        self.sync_bytes_locked(oid)
    }

    fn read_whole(&self, oid: ObjectId) -> Result<(Vec<u8>, ObjState), StoreError> {
        let _g = self.lock(oid).read().unwrap();
        self.check_bad(oid)?;
        let e = self.entry(oid).ok_or(StoreError::NotFound(oid))?;
        if e.state.deleted {
            return Ok((Vec::new(), e.state));
        }
        let f = File::open(self.path(oid, &e)).map_err(|e| StoreError::io(oid, "open", e))?;
        let data = self.note_corrupt(layout::read_all(&f, oid, !e.state.suspect))?;
        Ok((data, e.state))
    }

    fn write(
        &self,
        oid: ObjectId,
        offset: u64,
        data: &[u8],
        sums: Option<&[u32]>,
        version: Version,
    ) -> Result<(), StoreError> {
        let _g = self.lock(oid).write().unwrap();
        self.write_locked(oid, offset, data, sums, version)
    }

    fn write_parts(
        &self,
        oid: ObjectId,
        parts: &[Part<'_>],
        sync_last: bool,
        version: Version,
    ) -> Result<(), StoreError> {
        let _g = self.lock(oid).write().unwrap();
        if self.entry(oid).is_none() && super::creates_unsynced(oid) {
            return self.create(oid, parts, version);
        }
        let mut written = false;
        let res = super::parts_in_turn(
            parts,
            sync_last,
            || self.sync_bytes_locked(oid),
            |offset, data, sums| {
                self.write_locked(oid, offset, data, sums, version)?;
                written = true;
                Ok(())
            },
        );
        match res {
            Err(e) if written && !matches!(e, StoreError::SyncFailed { .. }) => {
                // Some parts in and not the others: the copy is neither the version it had
                // nor the new one. Lost, as after a failed sync: restored from another owner.
                tracing::error!("object {oid}: a change failed halfway here: {e}");
                let at = self.entry(oid).map_or(version, |e| e.state.version);
                self.bad.lock().unwrap().insert(oid, None);
                self.dirty.lock().unwrap().remove(&oid);
                Err(StoreError::SyncFailed {
                    oids: vec![(oid, at)],
                    source: std::io::Error::other(e.to_string()),
                })
            }
            res => res,
        }
    }

    /// Only into an existing object (creating one is [`ObjectBackend::create_now`]'s) whose
    /// lock is free: an in-place `pwrite` into the page cache.
    fn write_now(
        &self,
        oid: ObjectId,
        offset: u64,
        data: &[u8],
        sums: Option<&[u32]>,
        version: Version,
    ) -> Option<Result<(), StoreError>> {
        let _g = self.lock(oid).try_write().ok()?;
        if self.entry(oid).is_none_or(|e| e.state.deleted) {
            return None;
        }
        Some(self.write_locked(oid, offset, data, sums, version))
    }

    /// Only where nothing of `oid` is here and its creation needs no sync (a data object):
    /// a new file written through the page cache, as a write creating it makes one.
    fn create_now(
        &self,
        oid: ObjectId,
        parts: &[Part<'_>],
        version: Version,
    ) -> Option<Result<(), StoreError>> {
        let _g = self.lock(oid).try_write().ok()?;
        if self.entry(oid).is_some() || !super::creates_unsynced(oid) {
            return None;
        }
        if self.bad.lock().unwrap().get(&oid) == Some(&None) {
            return Some(Err(StoreError::Lost(oid)));
        }
        Some(self.create(oid, parts, version))
    }

    fn put_if_newer(
        &self,
        oid: ObjectId,
        data: &[u8],
        state: ObjState,
    ) -> Result<bool, StoreError> {
        let _g = self.lock(oid).write().unwrap();
        let old = self.entry(oid);
        // A copy whose last sync failed is replaced by any copy at least as new.
        let bad = self.bad.lock().unwrap().contains_key(&oid);
        if old.is_some_and(|e| {
            !(e.state.replaced_by(state) || (bad && state.version >= e.state.version))
        }) {
            return Ok(false);
        }
        self.install(oid, 0, data, None, state, old)?;
        self.notes.remove(oid)?;
        Ok(true)
    }

    fn settle(&self, oid: ObjectId) -> Result<(), StoreError> {
        let _g = self.lock(oid).write().unwrap();
        let Some(e) = self.entry(oid).filter(|e| e.state.suspect) else {
            return Ok(());
        };
        let dirty = self.dirty.lock().unwrap().contains(&oid);
        let after = Entry {
            state: ObjState {
                suspect: false,
                ..e.state
            },
            marked: dirty || e.state.version != e.disk,
            ..e
        };
        // Its bytes are the reference now: their sums are recomputed (and synced) first.
        self.reseal(oid, &e)?;
        let (from, to) = (self.path(oid, &e), self.path(oid, &after));
        if from != to {
            fs::rename(&from, &to).map_err(|err| StoreError::io(oid, "rename", err))?;
        }
        self.put_entry(oid, after);
        Ok(())
    }

    fn accept_lost(&self, oid: ObjectId) -> Result<Option<ObjState>, StoreError> {
        let _g = self.lock(oid).write().unwrap();
        let Some(e) = self.entry(oid) else {
            self.bad.lock().unwrap().remove(&oid);
            return Ok(None);
        };
        let Some(why) = self.bad.lock().unwrap().get(&oid).copied() else {
            return Ok(Some(e.state));
        };
        if why.is_none() && e.disk == Version::NONE && !e.state.deleted {
            // Created since its last flush, which failed: nothing of it was ever durable. (Its
            // name reappearing after a crash is removed at open, so no directory fsync.)
            self.drop_copy(oid, &e)?;
            return Ok(None);
        }
        // After a failed sync the file holds what its last successful sync made durable (its
        // name's version) and maybe some later pages; a corrupt copy keeps its version. Either
        // is kept suspect, marked as such on disk, its sums recomputed from its bytes.
        let after = Entry {
            state: ObjState {
                version: if why.is_some() {
                    e.state.version
                } else {
                    e.disk
                },
                suspect: true,
                ..e.state
            },
            marked: true,
            ..e
        };
        if !e.state.deleted {
            self.reseal(oid, &e)?;
        }
        let (from, to) = (self.path(oid, &e), self.path(oid, &after));
        if from != to {
            fs::rename(&from, &to).map_err(|err| StoreError::io(oid, "rename", err))?;
            fsync_dir(&self.dir).map_err(|err| StoreError::io(oid, "sync dir", err))?;
        }
        self.put_entry(oid, after);
        self.bad.lock().unwrap().remove(&oid);
        Ok(Some(after.state))
    }

    fn mark_lost(&self, oid: ObjectId) {
        if self.entry(oid).is_some() {
            self.bad.lock().unwrap().entry(oid).or_insert(None);
        }
    }

    fn forget(&self, oid: ObjectId) -> Result<(), StoreError> {
        let _g = self.lock(oid).write().unwrap();
        let Some(e) = self.entry(oid) else {
            return Ok(());
        };
        self.notes.remove(oid)?;
        self.drop_copy(oid, &e)?;
        fsync_dir(&self.dir).map_err(|e| StoreError::io(oid, "sync dir", e))
    }

    fn flush(&self) -> Result<(), StoreError> {
        // Notes first: after a crash a note is never older than the bytes it describes.
        self.notes.sync()?;
        self.flush_dirty()
    }

    fn sync_object(&self, oid: ObjectId) -> Result<(), StoreError> {
        self.sync_object_now(oid)
    }

    fn note(&self, oid: ObjectId) -> Option<Vec<u8>> {
        self.notes.get(oid)
    }

    fn note_prefix(&self, oid: ObjectId, len: usize) -> Option<Vec<u8>> {
        self.notes.prefix(oid, len)
    }

    fn set_note(&self, oid: ObjectId, note: &[u8]) -> Result<(), StoreError> {
        self.notes.set(oid, note)
    }

    /// (total, free) bytes of the file system holding the store.
    fn capacity(&self) -> io::Result<(u64, u64)> {
        use std::os::unix::ffi::OsStrExt;
        let c = std::ffi::CString::new(self.dir.as_os_str().as_bytes())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: c is a valid NUL-terminated path and s a valid out-pointer.
        if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let frsize = s.f_frsize as u64;
        Ok((s.f_blocks as u64 * frsize, s.f_bavail as u64 * frsize))
    }
}

mod entry;
mod flush;
mod layout;
mod names;
mod notes;
use entry::{Entry, Packed};
use layout::DeleteOnDrop;
use names::{file_name, fsync_dir, parse_name};
use notes::Notes;

#[cfg(test)]
mod checks;

#[cfg(test)]
mod tests;
