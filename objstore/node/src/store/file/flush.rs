//! The file backend's flush: each object written since the last one is synced and renamed after
//! the version synced (see the parent module's documentation).

use std::fs::{self, File};
use std::io;

use objstore_proto::oid::ObjectId;

use super::names::fsync_dir;
use super::{Entry, FileStore};
use crate::store::{StoreError, Version};

impl FileStore {
    /// [`ObjectBackend::flush`]: every object written since the last flush synced and named
    /// after the version synced, then the directory.
    pub(super) fn flush_dirty(&self) -> Result<(), StoreError> {
        // Flushes one at a time: every write before this call is either still dirty (synced
        // here) or was taken by an earlier flush, which has finished once this lock is ours.
        let _one_at_a_time = self.flushing.lock().unwrap_or_else(|e| e.into_inner());
        let mut dirty: Vec<ObjectId> = self.dirty.lock().unwrap().drain().collect();
        dirty.sort_unstable();
        let mut failed = Vec::new();
        let mut first_err = None;
        for oid in dirty {
            if let Err((version, err)) = self.sync_one(oid) {
                failed.push((oid, version));
                first_err.get_or_insert(err);
            }
        }
        if let Some(source) = first_err {
            return Err(StoreError::SyncFailed {
                oids: failed,
                source,
            });
        }
        fsync_dir(&self.dir).map_err(|e| StoreError::io(ObjectId(0), "sync dir", e))
    }

    /// [`ObjectBackend::sync_object`]: its note, then the object synced and named after its
    /// version, then the directory if the name changed.
    pub(super) fn sync_object_now(&self, oid: ObjectId) -> Result<(), StoreError> {
        self.notes.sync_one(oid)?;
        if !self.dirty.lock().unwrap().remove(&oid) {
            // Not dirty: synced by a flush that is over, or taken by one still syncing it.
            // Answering before that one is done would acknowledge bytes not yet durable (an
            // erasure-coded strip whose client flushed while it was being changed): wait for
            // it. A flush whose fdatasync of it failed left the copy lost.
            drop(self.flushing.lock().unwrap_or_else(|e| e.into_inner()));
            if self.bad.lock().unwrap().get(&oid) == Some(&None) {
                return Err(StoreError::Lost(oid));
            }
            return Ok(());
        }
        match self.sync_one(oid) {
            Ok(false) => Ok(()),
            Ok(true) => fsync_dir(&self.dir).map_err(|e| StoreError::io(oid, "sync dir", e)),
            Err((version, source)) => Err(StoreError::SyncFailed {
                oids: vec![(oid, version)],
                source,
            }),
        }
    }

    /// Syncs one object written since the last flush and names its file after the version
    /// synced. Ok(whether it renamed the file: the directory then needs a sync); on failure
    /// the copy is lost (marked bad), and the version it had and the error are returned.
    fn sync_one(&self, oid: ObjectId) -> Result<bool, (Version, io::Error)> {
        // Sync under the read lock (writes wait, so the bytes synced are those of
        // `synced`), then name the file after that version.
        let synced = {
            let _g = self.lock(oid).read().unwrap();
            let Some(e) = self.entry(oid).filter(|e| !e.state.deleted) else {
                return Ok(false);
            };
            // An unmarked file holds no bytes newer than its name (its version alone
            // changed since): nothing to sync but the name.
            let synced = if e.marked {
                File::open(self.path(oid, &e)).and_then(|f| f.sync_data())
            } else {
                Ok(())
            };
            if let Err(err) = synced {
                // Not retried: after a failed fdatasync the kernel may have dropped the
                // dirty pages, so a later sync would succeed without the data.
                tracing::error!("fdatasync of object {oid} failed: {err}");
                self.bad.lock().unwrap().insert(oid, None);
                return Err((e.state.version, err));
            }
            e.state.version
        };
        let _g = self.lock(oid).write().unwrap();
        let Some(e) = self.entry(oid).filter(|e| !e.state.deleted) else {
            return Ok(false);
        };
        // The mark stays while the file holds writes newer than its name (written again
        // since the sync) or while the copy is suspect.
        let after = Entry {
            disk: synced,
            marked: e.state.version != synced || e.state.suspect,
            ..e
        };
        let (from, to) = (self.path(oid, &e), self.path(oid, &after));
        if from == to {
            return Ok(false);
        }
        if let Err(err) = fs::rename(&from, &to) {
            self.bad.lock().unwrap().insert(oid, None);
            return Err((e.state.version, err));
        }
        self.update(oid, |x| {
            x.disk = after.disk;
            x.marked = after.marked;
        });
        Ok(true)
    }
}
