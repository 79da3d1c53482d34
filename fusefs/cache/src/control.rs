//! What the control socket (in sheepfs) asks of the cache: stats, flush, evict, resize,
//! mode.

use std::sync::atomic::Ordering;

use cache_control::{CacheMode, CacheStats};

use crate::{Backend, Cache, PushError};

impl<B: Backend> Cache<B> {
    /// Counters and sizes of the whole cache and of every VDI it holds or counted.
    pub fn stats(&self) -> CacheStats {
        self.inner.stats()
    }

    /// The id of the VDI named `name` as this cache knows it (None: nothing was ever
    /// cached of it).
    pub fn vid_of(&self, name: &str) -> Option<u32> {
        self.inner.vid_of(name)
    }

    /// VDI `vid`'s cache mode (its own, or the default).
    pub fn mode_of(&self, vid: u32) -> CacheMode {
        self.inner.mode_of(vid)
    }

    /// Whether this cache holds VDI `vid`'s attachment lock.
    pub fn is_attached(&self, vid: u32) -> bool {
        self.inner
            .attach
            .attached
            .lock()
            .unwrap()
            .contains_key(&vid)
    }

    /// Drops cached data of `vid` (every VDI if None): clean data only, or dirty data too
    /// if `discard_dirty` (the caller flushed first otherwise). Returns (bytes dropped,
    /// dirty bytes thrown away).
    pub fn evict(&self, vid: Option<u32>, discard_dirty: bool) -> (u64, u64) {
        let inner = &self.inner;
        let dirty_before = inner.space.dirty.load(Ordering::SeqCst);
        let vids: Vec<u32> = match vid {
            Some(v) => vec![v],
            None => inner.dir.records.read().unwrap().keys().copied().collect(),
        };
        let mut bytes = 0;
        for v in vids {
            bytes += inner.drop_vdi(v, discard_dirty);
        }
        let discarded = if discard_dirty {
            dirty_before.saturating_sub(inner.space.dirty.load(Ordering::SeqCst))
        } else {
            0
        };
        (bytes, discarded)
    }

    /// Sets the cache's size bound and makes room down to it (pushing dirty data if it must);
    /// false if the cache could not shrink to it within the client's timeout.
    pub async fn resize(&self, size: u64) -> bool {
        let inner = &self.inner;
        inner.space.size.store(size, Ordering::SeqCst);
        inner.fills.admission.resize(size);
        inner.reserve(0).await
    }

    /// Records VDI `vid`'s new mode (the caller flushed it first when it leaves writeback);
    /// `off` drops its clean cached data. Writes that went straight to the cluster in the
    /// old mode (off, writethrough) may not be flushed on the nodes yet: the next fsync
    /// flushes the cluster even if it pushes nothing.
    pub fn set_mode(&self, vid: u32, mode: CacheMode) {
        let inner = &self.inner;
        let rec = inner.dir.records.read().unwrap().get(&vid).cloned();
        if let Some(mut r) = rec {
            r.mode = Some(mode);
            inner.save_record(&r);
        }
        if mode == CacheMode::Off {
            inner.drop_vdi(vid, false);
        }
        inner.pushes.unflushed.store(true, Ordering::SeqCst);
    }

    /// Pushes every dirty block of `vid` (all VDIs if None) and flushes the cluster.
    pub async fn flush(
        &self,
        vid: Option<u32>,
        progress: impl Fn(u64, u64),
    ) -> Result<u64, PushError> {
        self.inner.flush(vid, progress).await
    }
}
