//! The file backend's notes ([`crate::store::ObjectBackend::set_note`]): one small file per
//! object under `DIR/.notes/`, named after the object id in hex.
//!
//! ```text
//! [crc32c of the rest: u32 BE][length: u32 BE][note ...]
//! ```
//! A note is written in place with one `pwrite` and no sync, before the object's write it
//! describes: a kill keeps both in the page cache. A flush syncs every note set since the last
//! one before it syncs the objects, so after a crash a note is never older than the bytes it
//! describes. A note torn by a crash fails its check and reads as none. `put_if_newer` and
//! `forget` remove it.
//!
//! The first [`PREFIX`] bytes of the notes read or set lately are kept in memory (an LRU of
//! [`PREFIXES`]): a strip's note starts with its head (what a strip read answers and what a
//! `Settle` checks), and its tail, the undo, can be as large as the strip, so reading the head
//! from the file would read it all to check its crc.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use objstore_proto::oid::ObjectId;

use super::names::fsync_dir;
use crate::store::StoreError;

/// The notes' directory in the store's.
pub(super) const DIR: &str = ".notes";

/// Bytes of a note's start kept in memory.
pub(super) const PREFIX: usize = 64;
/// Notes whose start is kept in memory.
const PREFIXES: usize = 1 << 16;

pub(super) struct Notes {
    dir: PathBuf,
    /// The first [`PREFIX`] bytes of notes read (and checked whole) or set lately.
    prefixes: Mutex<lru::LruCache<ObjectId, Vec<u8>>>,
    /// Notes set since the last flush.
    pub(super) dirty: Mutex<HashSet<ObjectId>>,
    /// Notes whose file was created since the directory was last synced.
    pub(super) fresh: Mutex<HashSet<ObjectId>>,
    /// Held by [`Notes::sync`] from taking the dirty notes until they are synced.
    syncing: Mutex<()>,
}

impl Notes {
    pub(super) fn open(store: &Path) -> io::Result<Notes> {
        let dir = store.join(DIR);
        fs::create_dir_all(&dir)?;
        Ok(Notes {
            dir,
            prefixes: Mutex::new(lru::LruCache::new(
                std::num::NonZeroUsize::new(PREFIXES).expect("not zero"),
            )),
            dirty: Mutex::default(),
            fresh: Mutex::default(),
            syncing: Mutex::default(),
        })
    }

    fn path(&self, oid: ObjectId) -> PathBuf {
        self.dir.join(format!("{oid}"))
    }

    pub(super) fn get(&self, oid: ObjectId) -> Option<Vec<u8>> {
        let note = self.read_checked(oid);
        let mut prefixes = self.prefixes.lock().unwrap();
        match &note {
            Some(n) => {
                prefixes.put(oid, n[..n.len().min(PREFIX)].to_vec());
            }
            None => {
                prefixes.pop(&oid);
            }
        }
        note
    }

    /// The first `len` bytes of `oid`'s note: from memory when kept there, else from the file.
    pub(super) fn prefix(&self, oid: ObjectId, len: usize) -> Option<Vec<u8>> {
        if len <= PREFIX {
            if let Some(p) = self.prefixes.lock().unwrap().get(&oid) {
                return Some(p[..len.min(p.len())].to_vec());
            }
        }
        let mut note = self.get(oid)?;
        note.truncate(len);
        Some(note)
    }

    fn read_checked(&self, oid: ObjectId) -> Option<Vec<u8>> {
        let b = fs::read(self.path(oid)).ok()?;
        let sum = u32::from_be_bytes(b.get(..4)?.try_into().ok()?);
        let len = u32::from_be_bytes(b.get(4..8)?.try_into().ok()?) as usize;
        let note = b.get(8..8usize.checked_add(len)?)?;
        (crc_fast::crc32_iscsi(&b[4..8 + len]) == sum).then(|| note.to_vec())
    }

    pub(super) fn set(&self, oid: ObjectId, note: &[u8]) -> Result<(), StoreError> {
        // Forgotten first: a set that fails half way leaves the file to say what it holds.
        self.prefixes.lock().unwrap().pop(&oid);
        let mut b = Vec::with_capacity(8 + note.len());
        b.extend_from_slice(&[0; 4]);
        b.extend_from_slice(&(note.len() as u32).to_be_bytes());
        b.extend_from_slice(note);
        let sum = crc_fast::crc32_iscsi(&b[4..]);
        b[..4].copy_from_slice(&sum.to_be_bytes());
        let path = self.path(oid);
        let f = match OpenOptions::new().write(true).open(&path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                self.fresh.lock().unwrap().insert(oid);
                OpenOptions::new()
                    .create(true)
                    .write(true)
                    .truncate(false)
                    .open(&path)
            }
            f => f,
        }
        .map_err(|e| StoreError::io(oid, "open note", e))?;
        f.write_all_at(&b, 0)
            .map_err(|e| StoreError::io(oid, "write note", e))?;
        // A shorter note (an undo dropped: `StripOp::Settle`) gives its old tail's space back.
        // The length and crc in front make a tail a crash leaves unread, so the order is safe.
        let old_len = f.metadata().map_or(0, |m| m.len());
        if old_len > b.len() as u64 {
            f.set_len(b.len() as u64)
                .map_err(|e| StoreError::io(oid, "shorten note", e))?;
        }
        self.dirty.lock().unwrap().insert(oid);
        (self.prefixes.lock().unwrap()).put(oid, note[..note.len().min(PREFIX)].to_vec());
        Ok(())
    }

    pub(super) fn remove(&self, oid: ObjectId) -> Result<(), StoreError> {
        self.prefixes.lock().unwrap().pop(&oid);
        self.dirty.lock().unwrap().remove(&oid);
        match fs::remove_file(self.path(oid)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                Err(StoreError::io(oid, "remove note", e))
            }
            _ => Ok(()),
        }
    }

    /// Syncs `oid`'s note if it was set since the last sync, and the directory if the note's
    /// file is new.
    pub(super) fn sync_one(&self, oid: ObjectId) -> Result<(), StoreError> {
        if !self.dirty.lock().unwrap().remove(&oid) {
            // Not dirty: synced by a `sync` that is over, or taken by one still syncing it,
            // which must be done before the caller overwrites what the note undoes (else a
            // power cut may keep the new bytes and lose the undo). One that failed set it
            // dirty again.
            drop(self.syncing.lock().unwrap_or_else(|e| e.into_inner()));
            if !self.dirty.lock().unwrap().remove(&oid) {
                return Ok(());
            }
        }
        let fresh = self.fresh.lock().unwrap().remove(&oid);
        let res = File::open(self.path(oid))
            .and_then(|f| f.sync_data())
            .and_then(|()| if fresh { fsync_dir(&self.dir) } else { Ok(()) });
        match res {
            Err(e) if e.kind() != io::ErrorKind::NotFound => {
                // Set again so the next sync tries once more; this one fails.
                self.dirty.lock().unwrap().insert(oid);
                if fresh {
                    self.fresh.lock().unwrap().insert(oid);
                }
                Err(StoreError::SyncFailed {
                    oids: Vec::new(),
                    source: e,
                })
            }
            _ => Ok(()),
        }
    }

    /// Syncs every note set since the last call, then the directory.
    pub(super) fn sync(&self) -> Result<(), StoreError> {
        // Held until every note taken is synced: see `sync_one`.
        let _syncing = self.syncing.lock().unwrap_or_else(|e| e.into_inner());
        let dirty: Vec<ObjectId> = self.dirty.lock().unwrap().drain().collect();
        if dirty.is_empty() {
            return Ok(());
        }
        for &oid in &dirty {
            match File::open(self.path(oid)).and_then(|f| f.sync_data()) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    // Set again so the next flush tries once more; this one fails.
                    self.dirty.lock().unwrap().extend(dirty.iter().copied());
                    return Err(StoreError::SyncFailed {
                        oids: Vec::new(),
                        source: e,
                    });
                }
            }
        }
        // Every note file created so far is named by the sync below.
        self.fresh.lock().unwrap().clear();
        fsync_dir(&self.dir).map_err(|e| StoreError::io(dirty[0], "sync notes", e))
    }
}
