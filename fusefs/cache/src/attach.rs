//! Attachment: a VDI is read and written through the cache only while this cache holds its
//! lock in the cluster, and its cached data only while the lock's generation is the one the
//! data was cached under (another host attached it since: the data is dropped, or refused
//! if it holds unpushed writes).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cache_control::CacheMode;
use objstore_client::Volume;

use crate::dir::VdiRecord;
use crate::{Backend, Cache, CacheError, CachedVdi, Inner};

/// The VDIs this mount attached, and who it is to the cluster's locks.
pub(crate) struct Attachments<V> {
    /// VDIs attached read-write (lock held) by this mount.
    pub(crate) attached: Mutex<HashMap<u32, Arc<V>>>,
    /// `host/cache id`: the lock owner.
    pub(crate) owner: String,
    pub(crate) host: String,
}

impl<B: Backend> Inner<B> {
    /// The volume of VDI `vid` while this cache has it attached.
    fn attached_volume(&self, vid: u32) -> Option<Arc<B::Volume>> {
        self.attach.attached.lock().unwrap().get(&vid).cloned()
    }

    /// Takes the VDI's lock and makes the cache match it: data cached under another lock
    /// generation is dropped (refused if it holds unpushed writes).
    pub(crate) async fn attach(&self, name: &str) -> Result<Arc<B::Volume>, CacheError> {
        let vdi = Arc::new(self.client.open(name).await?);
        let vid = vdi.vid().0;
        let gen = (self.client)
            .acquire(name, &self.attach.owner, &self.attach.host)
            .await?;
        // Its writes (pushes, and mode `off`'s writes, which invalidate what they overwrite)
        // keep this cache coherent: they leave the generation alone.
        self.client.under_lock(&vdi);
        // A record of the same name under another id is a deleted VDI: forget it.
        let stale: Vec<u32> = self
            .dir
            .records
            .read()
            .unwrap()
            .values()
            .filter(|r| r.name == name && r.vid != vid)
            .map(|r| r.vid)
            .collect();
        for old in stale {
            let dropped = self.drop_vdi(old, true);
            tracing::info!(
                "VDI '{name}' was deleted and created again: dropped {} cached of the old one",
                objstore_proto::size::format_size(dropped)
            );
            self.forget_record(old);
        }
        let rec = self.dir.records.read().unwrap().get(&vid).cloned();
        let matches = rec
            .as_ref()
            .is_some_and(|r| r.name == name && (r.gen == gen || (r.released && gen == r.gen + 1)));
        if !matches {
            let dirty = self.dirty_of(vid);
            if dirty > 0 {
                let ours = rec.as_ref().map(|r| r.gen).unwrap_or(0);
                let _ = self.client.release(name, &self.attach.owner).await;
                return Err(CacheError::Conflict {
                    name: name.to_string(),
                    ours,
                    theirs: gen,
                });
            }
            let dropped = self.drop_vdi(vid, true);
            if dropped > 0 {
                tracing::info!(
                    "VDI '{name}' was attached elsewhere, or written without its lock, since it was cached here: dropped {} of cached data",
                    objstore_proto::size::format_size(dropped)
                );
            }
        }
        if !matches || rec.as_ref().is_some_and(|r| r.gen != gen || r.released) {
            self.save_record(&VdiRecord {
                name: name.to_string(),
                vid,
                gen,
                released: false,
                mode: rec.and_then(|r| r.mode),
            });
        }
        let mut attached = self.attach.attached.lock().unwrap();
        Ok(attached.entry(vid).or_insert(vdi).clone())
    }
}

impl<B: Backend> Cache<B> {
    /// Opens VDI `name` through the cache. Read-write opens attach it (take its lock);
    /// read-only opens of a VDI this mount has not attached bypass the cache, and so do
    /// opens of a VDI in mode `off` that is not attached. An attached VDI in mode `off` is
    /// opened through the cache, which then drops what its writes overwrite.
    pub async fn open_vdi(&self, name: &str, rw: bool) -> Result<Option<CachedVdi<B>>, CacheError> {
        let vdi = Arc::new(self.inner.client.open(name).await?);
        let vid = vdi.vid().0;
        let attached = self.inner.attached_volume(vid);
        if self.inner.mode_of(vid) == CacheMode::Off && attached.is_none() {
            return Ok(None);
        }
        let vdi = match attached {
            Some(v) => {
                v.refresh().await?;
                v
            }
            None if rw => self.inner.attach(name).await?,
            None => return Ok(None),
        };
        Ok(Some(CachedVdi::new(self.inner.clone(), vdi)))
    }

    /// A handle on VDI `vid` (named `name`) for taking over its open file from plain handles
    /// (after `cachectl mode` set a caching mode): attaches the VDI, and its requests wait until
    /// [`CachedVdi::open_gate`], which the caller calls once the plain handles' requests in
    /// flight are done.
    pub async fn take_over(&self, vid: u32, name: &str) -> Result<CachedVdi<B>, CacheError> {
        let attached = self.inner.attached_volume(vid);
        let vdi = match attached {
            Some(v) => v,
            None => self.inner.attach(name).await?,
        };
        Ok(CachedVdi::gated(self.inner.clone(), vdi))
    }

    /// Before a VDI is deleted: drops what is cached of it (dirty data too: it is being
    /// deleted), detaches it and releases its lock.
    pub async fn forget_vdi(&self, name: &str) {
        let inner = &self.inner;
        let Some(vid) = inner.vid_of(name) else {
            return;
        };
        inner.drop_vdi(vid, true);
        inner.attach.attached.lock().unwrap().remove(&vid);
        inner.forget_record(vid);
        if let Err(e) = inner.client.release(name, &inner.attach.owner).await {
            tracing::warn!("releasing the lock of '{name}': {e}");
        }
    }
}
