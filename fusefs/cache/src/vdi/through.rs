//! Writes that go to the cluster past the cache (a full cache, an unmount under way), and
//! the cached blocks they overwrite brought up to date.

use std::sync::atomic::Ordering;

use bytes::Bytes;
use objstore_client::Volume;

use super::{io_err, CachedVdi};
use crate::object::{CachedObject, BLOCK};
use crate::{Backend, CacheError};

impl<B: Backend> CachedVdi<B> {
    /// Writes the piece `piece` at `off` of object `idx` to the cluster, then into the
    /// blocks of it that are cached (dirty with `mark_dirty`: see [`crate::full`]). While it
    /// is written, no push of the cached object runs: none can put older bytes over it in
    /// the cluster after it. (An object cached only after the check is new: what it holds
    /// was written after this write started, or is marked dirty here with `mark_dirty`.)
    pub(super) async fn to_cluster(
        &self,
        idx: u32,
        off: u64,
        piece: Bytes,
        mark_dirty: bool,
    ) -> Result<(), CacheError> {
        let at = idx as u64 * self.object_size + off;
        let cached = self.cached_in(at, piece.len() as u64);
        let _no_push = super::write::hold_pushes(&cached).await;
        self.bypassing(self.vdi.write_at(at, piece.clone())).await?;
        self.update_cached(idx, off, &piece, mark_dirty)
    }

    /// Puts `data` (just written to the cluster at `off` of object `idx`) into the blocks of
    /// it that are cached; blocks not cached stay so. With `mark_dirty` they become dirty
    /// (see [`CachedVdi::to_cluster`]); otherwise dirty ones are marked rewritten for a push
    /// in flight. A clean block whose bytes cannot be written is forgotten; a
    /// dirty one fails the write.
    pub(super) fn update_cached(
        &self,
        idx: u32,
        off: u64,
        data: &[u8],
        mark_dirty: bool,
    ) -> Result<(), CacheError> {
        let Some(o) = self.peek(idx) else {
            return Ok(());
        };
        let (b0, b1) = CachedObject::block_range(off, data.len() as u64);
        // Blocks not checked since a restart are checked before their other bytes are kept
        // ([`crate::sums`]): bad clean ones are dropped, bad dirty ones stay quarantined.
        if o.state.lock().unwrap().needs_check(b0, b1) {
            let v = o.verify(b0, b1);
            self.inner.corrupt_found(&self.counters, &v);
        }
        let _writing = o.writing.lock().unwrap();
        let mut st = o.state.lock().unwrap();
        let (mut dirtied, mut forgotten, mut failed) = (0u64, 0u64, None);
        for b in b0..b1 {
            if !st.valid.get(b) {
                continue;
            }
            let s = (b as u64 * BLOCK).max(off);
            let e = ((b as u64 + 1) * BLOCK).min(off + data.len() as u64);
            let slice = &data[(s - off) as usize..(e - off) as usize];
            if let Err(err) = o.write_data(slice, s) {
                if st.dirty.get(b) {
                    failed.get_or_insert(err);
                } else {
                    st.valid.set_range(b, b + 1, false);
                    forgotten += 1;
                }
                continue;
            }
            if e - s == BLOCK {
                if let Some(q) = st.quarantined.as_mut() {
                    q.set_range(b, b + 1, false); // written whole: good bytes again
                }
            }
            if mark_dirty && !st.dirty.get(b) {
                st.dirty.set_range(b, b + 1, true);
                dirtied += 1;
            }
            if st.dirty.get(b) {
                if let Some(r) = st.rewritten.as_mut() {
                    r.set_range(b, b + 1, true);
                }
            }
        }
        if dirtied > 0 && st.dirty_since.is_none() {
            st.dirty_since = Some(std::time::Instant::now());
        }
        let saved = if dirtied + forgotten > 0 {
            o.save(&st)
        } else {
            Ok(())
        };
        let space = &self.inner.space;
        // Counted with the bits, under the object's lock (see `write::commit`).
        space.dirty.fetch_add(dirtied * BLOCK, Ordering::SeqCst);
        drop(st);
        if forgotten > 0 {
            space.used.fetch_sub(forgotten * BLOCK, Ordering::SeqCst);
            space.room.tell();
        }
        if let Some(source) = failed {
            return Err(CacheError::Io {
                what: "writing the cache after a write-through",
                key: o.key,
                source,
            });
        }
        saved.map_err(io_err("writing cache metadata", o.key))
    }
}
