//! The file backend: one file per object under `DIR/obj/`, named `<oid>.<stamp>`.
//!
//! The stamp is the last epoch in which the object was written. Every write at epoch `E` reaches
//! every holder of `E`, so among copies the highest stamp is the newest data; recovery compares
//! stamps to decide who must pull (see `node::recovery`).
//!
//! Crash safety: a new object is built in `obj/.tmp/`, `sync_all`ed, renamed into place and the
//! directory fsynced, so a crash never leaves a zero-length or half-created object that is later
//! served. Later writes go in place (`pwrite`); like a disk's sectors, each 4 KiB page of a write
//! lands whole or not at all, and `flush` makes every earlier write durable (`fdatasync` of each
//! file written since the last flush, then the directory). The store is synchronous: callers run
//! it on a blocking pool.

use std::collections::{HashMap, HashSet};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, RwLock};

use objstore_proto::oid::ObjectId;

use super::{ObjMeta, ObjectBackend, StoreError};

const LOCK_SHARDS: usize = 256;

/// Objects as files in a directory (see the module documentation).
pub struct FileStore {
    dir: PathBuf,
    tmp: PathBuf,
    index: Mutex<HashMap<ObjectId, ObjMeta>>,
    dirty: Mutex<HashSet<ObjectId>>,
    locks: Vec<RwLock<()>>,
    /// Held for the whole of a flush: a flush that finds nothing dirty because an earlier one
    /// took it must still wait until that one has synced it.
    flushing: Mutex<()>,
}

/// Removes a temporary file unless disarmed (the write that made it succeeded).
struct DeleteOnDrop(Option<PathBuf>);

impl Drop for DeleteOnDrop {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = fs::remove_file(p);
        }
    }
}

fn parse_name(name: &str) -> Option<(ObjectId, u32)> {
    let (oid, stamp) = name.split_once('.')?;
    if oid.len() != 16 {
        return None;
    }
    Some((
        ObjectId(u64::from_str_radix(oid, 16).ok()?),
        stamp.parse().ok()?,
    ))
}

fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
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
        let mut index: HashMap<ObjectId, ObjMeta> = HashMap::new();
        for e in fs::read_dir(dir)? {
            let e = e?;
            let name = e.file_name();
            let Some(name) = name.to_str() else { continue };
            if name == ".tmp" {
                continue;
            }
            let Some((oid, stamp)) = parse_name(name) else {
                tracing::warn!("ignoring unexpected file {:?} in object store", e.path());
                continue;
            };
            // A crash between installing a new copy and unlinking the old leaves two names.
            match index.get(&oid) {
                Some(m) if m.stamp >= stamp => {
                    let _ = fs::remove_file(e.path());
                }
                Some(m) => {
                    let _ = fs::remove_file(dir.join(format!("{oid}.{}", m.stamp)));
                    index.insert(oid, ObjMeta { stamp });
                }
                None => {
                    index.insert(oid, ObjMeta { stamp });
                }
            }
        }
        Ok(FileStore {
            dir: dir.to_path_buf(),
            tmp,
            index: Mutex::new(index),
            dirty: Mutex::default(),
            locks: (0..LOCK_SHARDS).map(|_| RwLock::new(())).collect(),
            flushing: Mutex::new(()),
        })
    }

    fn lock(&self, oid: ObjectId) -> &RwLock<()> {
        &self.locks[(oid.0 ^ (oid.0 >> 32)) as usize % LOCK_SHARDS]
    }

    fn path(&self, oid: ObjectId, stamp: u32) -> PathBuf {
        self.dir.join(format!("{oid}.{stamp}"))
    }

    /// The crash-safe recipe: tmp file, sync_all, rename, fsync the directory, then drop the
    /// replaced copy. Caller holds the object's write lock.
    fn install(
        &self,
        oid: ObjectId,
        offset: u64,
        data: &[u8],
        stamp: u32,
        old_stamp: Option<u32>,
    ) -> Result<(), StoreError> {
        let tmp_path = self
            .tmp
            .join(format!("{oid}.{stamp}.{}", rand::random::<u32>()));
        let mut guard = DeleteOnDrop(Some(tmp_path.clone()));
        let f = File::create(&tmp_path).map_err(|e| StoreError::io(oid, "create", e))?;
        f.write_all_at(data, offset)
            .map_err(|e| StoreError::io(oid, "write", e))?;
        f.sync_all().map_err(|e| StoreError::io(oid, "sync", e))?;
        let final_path = self.path(oid, stamp);
        fs::rename(&tmp_path, &final_path).map_err(|e| StoreError::io(oid, "rename", e))?;
        guard.0 = None;
        fsync_dir(&self.dir).map_err(|e| StoreError::io(oid, "sync dir", e))?;
        if let Some(old) = old_stamp.filter(|&s| s != stamp) {
            let _ = fs::remove_file(self.path(oid, old));
        }
        self.index.lock().unwrap().insert(oid, ObjMeta { stamp });
        self.dirty.lock().unwrap().remove(&oid);
        Ok(())
    }
}

impl ObjectBackend for FileStore {
    fn meta(&self, oid: ObjectId) -> Option<ObjMeta> {
        self.index.lock().unwrap().get(&oid).copied()
    }

    /// Every object held here with its stamp.
    fn list(&self) -> Vec<(ObjectId, u32)> {
        let idx = self.index.lock().unwrap();
        let mut v: Vec<_> = idx.iter().map(|(o, m)| (*o, m.stamp)).collect();
        v.sort_unstable();
        v
    }

    fn len(&self) -> usize {
        self.index.lock().unwrap().len()
    }

    /// Reads `len` bytes at `offset`; bytes past the end of the file read as zeros.
    fn read(&self, oid: ObjectId, offset: u64, len: usize) -> Result<Vec<u8>, StoreError> {
        let _g = self.lock(oid).read().unwrap();
        let meta = self.meta(oid).ok_or(StoreError::NotFound(oid))?;
        let mut f =
            File::open(self.path(oid, meta.stamp)).map_err(|e| StoreError::io(oid, "open", e))?;
        // read_to_end fills uninitialised capacity; bytes past the end of the file are zeros.
        let mut buf = Vec::with_capacity(len);
        f.seek(SeekFrom::Start(offset))
            .and_then(|_| (&mut f).take(len as u64).read_to_end(&mut buf))
            .map_err(|e| StoreError::io(oid, "read", e))?;
        buf.resize(len, 0);
        Ok(buf)
    }

    /// Reads a whole object and its stamp (for recovery).
    fn read_whole(&self, oid: ObjectId) -> Result<(Vec<u8>, u32), StoreError> {
        let _g = self.lock(oid).read().unwrap();
        let meta = self.meta(oid).ok_or(StoreError::NotFound(oid))?;
        let data =
            fs::read(self.path(oid, meta.stamp)).map_err(|e| StoreError::io(oid, "read", e))?;
        Ok((data, meta.stamp))
    }

    /// Writes `data` at `offset`, creating the object if needed, and stamps it with `epoch`.
    fn write(&self, oid: ObjectId, offset: u64, data: &[u8], epoch: u32) -> Result<(), StoreError> {
        let _g = self.lock(oid).write().unwrap();
        match self.meta(oid) {
            None => self.install(oid, offset, data, epoch, None),
            Some(m) => {
                let path = self.path(oid, m.stamp);
                let f = OpenOptions::new()
                    .write(true)
                    .open(&path)
                    .map_err(|e| StoreError::io(oid, "open", e))?;
                f.write_all_at(data, offset)
                    .map_err(|e| StoreError::io(oid, "write", e))?;
                if m.stamp < epoch {
                    fs::rename(&path, self.path(oid, epoch))
                        .map_err(|e| StoreError::io(oid, "rename", e))?;
                    self.index
                        .lock()
                        .unwrap()
                        .insert(oid, ObjMeta { stamp: epoch });
                }
                self.dirty.lock().unwrap().insert(oid);
                Ok(())
            }
        }
    }

    /// Replaces the whole object with `data` at `stamp`, crash-safely, unless the copy here is
    /// already at least that new (recovery must never overwrite a later write). Returns whether
    /// it installed.
    fn put_if_newer(&self, oid: ObjectId, data: &[u8], stamp: u32) -> Result<bool, StoreError> {
        let _g = self.lock(oid).write().unwrap();
        let old = self.meta(oid).map(|m| m.stamp);
        if old.is_some_and(|s| s >= stamp) {
            return Ok(false);
        }
        self.install(oid, 0, data, stamp, old)?;
        Ok(true)
    }

    /// Removes an object; removing a missing object is not an error.
    fn remove(&self, oid: ObjectId) -> Result<(), StoreError> {
        let _g = self.lock(oid).write().unwrap();
        let Some(m) = self.index.lock().unwrap().remove(&oid) else {
            return Ok(());
        };
        self.dirty.lock().unwrap().remove(&oid);
        match fs::remove_file(self.path(oid, m.stamp)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(StoreError::io(oid, "remove", e)),
        }
    }

    /// Makes every write before this call durable.
    fn flush(&self) -> Result<(), StoreError> {
        // Flushes one at a time: every write before this call is either still dirty (synced
        // here) or was taken by an earlier flush, which has finished once this lock is ours.
        let _one_at_a_time = self.flushing.lock().unwrap_or_else(|e| e.into_inner());
        let dirty: Vec<ObjectId> = self.dirty.lock().unwrap().drain().collect();
        for (i, &oid) in dirty.iter().enumerate() {
            let _g = self.lock(oid).read().unwrap();
            let Some(m) = self.meta(oid) else { continue };
            let res = File::open(self.path(oid, m.stamp)).and_then(|f| f.sync_data());
            if let Err(e) = res {
                // Keep what is not yet durable dirty so the next flush tries again.
                self.dirty
                    .lock()
                    .unwrap()
                    .extend(dirty[i..].iter().copied());
                return Err(StoreError::io(oid, "sync", e));
            }
        }
        fsync_dir(&self.dir).map_err(|e| StoreError::io(ObjectId(0), "sync dir", e))
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

#[cfg(test)]
mod tests {
    use super::*;
    use objstore_proto::oid::{ObjIndex, Vid};

    #[test]
    fn write_read_stamp_remove() {
        let d = tempfile::tempdir().unwrap();
        let s = FileStore::open(d.path()).unwrap();
        let oid = ObjectId::data(Vid(1), ObjIndex(2));
        assert!(matches!(s.read(oid, 0, 4), Err(StoreError::NotFound(_))));
        s.write(oid, 4096, b"hello", 3).unwrap();
        assert_eq!(s.read(oid, 4094, 9).unwrap(), b"\0\0hello\0\0");
        assert_eq!(s.meta(oid).unwrap().stamp, 3);
        s.write(oid, 0, b"x", 5).unwrap();
        assert_eq!(s.meta(oid).unwrap().stamp, 5);
        s.flush().unwrap();
        drop(s);
        let s = FileStore::open(d.path()).unwrap();
        assert_eq!(s.list(), vec![(oid, 5)]);
        assert_eq!(s.read(oid, 0, 1).unwrap(), b"x");
        s.remove(oid).unwrap();
        assert!(s.is_empty());
        s.remove(oid).unwrap();
    }

    #[test]
    fn reopen_keeps_newest_copy_and_clears_tmp() {
        let d = tempfile::tempdir().unwrap();
        let oid = ObjectId::data(Vid(9), ObjIndex(0));
        {
            let s = FileStore::open(d.path()).unwrap();
            assert!(s.put_if_newer(oid, b"new", 7).unwrap());
            assert!(!s.put_if_newer(oid, b"older", 6).unwrap());
        }
        fs::write(d.path().join(format!("{oid}.4")), b"old").unwrap();
        fs::write(d.path().join(".tmp/junk"), b"partial").unwrap();
        let s = FileStore::open(d.path()).unwrap();
        assert_eq!(s.read_whole(oid).unwrap(), (b"new".to_vec(), 7));
        assert!(!d.path().join(format!("{oid}.4")).exists());
        assert!(!d.path().join(".tmp/junk").exists());
    }

    /// A flush that starts while an earlier one is still syncing what it took must not return
    /// before that sync: its caller's writes may be among them. (Before the fix, the second
    /// flush found nothing dirty and returned at once.)
    #[test]
    fn a_flush_waits_for_an_earlier_flush_still_syncing() {
        let d = tempfile::tempdir().unwrap();
        let s = FileStore::open(d.path()).unwrap();
        let (x, y) = (
            ObjectId::data(Vid(1), ObjIndex(0)),
            ObjectId::data(Vid(1), ObjIndex(1)),
        );
        for oid in [x, y] {
            s.write(oid, 0, b"created", 1).unwrap();
            s.write(oid, 0, b"written", 1).unwrap();
        }
        // The first flush will stop at x until the test lets go of its lock.
        let s = &s;
        let held = s.lock(x).write().unwrap();
        std::thread::scope(move |scope| {
            let first = scope.spawn(move || s.flush());
            // It has taken both objects: nothing is dirty now.
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while !s.dirty.lock().unwrap().is_empty() {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the first flush never started"
                );
                std::thread::yield_now();
            }
            let (tx, rx) = std::sync::mpsc::channel();
            scope.spawn(move || tx.send(s.flush().is_ok()).unwrap());
            assert!(
                rx.recv_timeout(std::time::Duration::from_millis(300))
                    .is_err(),
                "a flush returned while an earlier one had not synced x yet"
            );
            drop(held);
            assert!(first.join().unwrap().is_ok());
            assert!(rx.recv().unwrap());
        });
    }
}
