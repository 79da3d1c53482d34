//! Writes through the cache: kept dirty (writeback) or passed on and kept clean
//! (writethrough), or passed on with what they overwrite forgotten (off); discards.

use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use cache_control::CacheMode;
use objstore_client::{VdiError, Volume};

use super::{io_err, CachedVdi};
use crate::closing::Admit;
use crate::full::disk_full;
use crate::object::{CachedObject, State, BLOCK};
use crate::space::Pinned;
use crate::stats::Counters;
use crate::{Backend, CacheError, Inner, Pause};

impl<B: Backend> CachedVdi<B> {
    /// A writeback write that needs no waiting (one object, no partial block to fetch, room
    /// without eviction), done on the FUSE thread; false if it must take the slow path.
    pub fn write_fast(&self, offset: u64, data: &[u8]) -> bool {
        if !self.gate_open.load(Ordering::Acquire)
            || self.mode() != CacheMode::Writeback
            || offset + data.len() as u64 > self.vdi.size()
            || self.inner.attach.any_lost.load(Ordering::Relaxed)
        {
            return false;
        }
        let os = self.object_size;
        let Some((idx, off, n)) = self.one_piece(offset, data.len() as u64) else {
            return false;
        };
        // Counted as under way until it returns (the unmount waits for it).
        let Admit::Cache(_under_way) = self.inner.writeback_write() else {
            return false;
        };
        let key = (self.vid(), idx);
        let obj_end = os.min(self.vdi.size() - idx as u64 * os);
        let (b0, b1) = CachedObject::block_range(off, n);
        let existing = (self.inner.space.objects.lock().unwrap())
            .get(&key)
            .map(|o| self.inner.space.pin(o));
        let edges_ok = |st: Option<&State>| {
            // A partly written block not checked since a restart takes the slow path.
            let ok = |b: usize| st.is_some_and(|st| st.valid.get(b) && !st.needs_check(b, b + 1));
            (off % BLOCK == 0 || ok(b0))
                && ((off + n) % BLOCK == 0 || off + n >= obj_end || ok(b1 - 1))
        };
        let new_blocks = match &existing {
            Some(o) => {
                let st = o.state.lock().unwrap();
                if !edges_ok(Some(&st)) {
                    return false;
                }
                (b0..b1).filter(|&b| !st.valid.get(b)).count()
            }
            None if edges_ok(None) => b1 - b0,
            None => return false,
        };
        let reserved = new_blocks as u64 * BLOCK;
        if !self.inner.try_reserve(reserved) {
            return false;
        }
        let Some(o) = existing.or_else(|| self.inner.object_now(key, os, true)) else {
            self.inner.settle(reserved, 0);
            return false;
        };
        let _writing = o.writing.lock().unwrap();
        let mut st = o.state.lock().unwrap();
        if !edges_ok(Some(&st)) {
            drop(st);
            self.inner.settle(reserved, 0);
            return false;
        }
        let dirty_count = &self.inner.space.dirty;
        let res = commit(&o, &mut st, off, data, &[], true, dirty_count);
        // Blocks it made valid stay so (in memory) even if their bits could not be saved.
        let added = *res.as_ref().unwrap_or(&0);
        let res = res.and_then(|_| o.save(&st));
        drop(st);
        self.inner.settle(reserved, added as u64 * BLOCK);
        match res {
            Ok(()) => {
                Counters::add(&self.counters.fills, 1);
                Counters::add(&self.counters.fill_bytes, n);
                if self.inner.space.dirty.load(Ordering::Relaxed) > self.inner.cfg.max_dirty {
                    self.inner.pushes.wake_flusher.notify_one();
                }
                true
            }
            Err(e) => {
                // Nothing acknowledged: the slow path retries and reports (a full disk is
                // logged there once per episode).
                if disk_full(&e) {
                    tracing::debug!("writing the cache: {e}");
                } else {
                    tracing::warn!("writing the cache: {e}");
                }
                false
            }
        }
    }

    /// Writes `data` at `offset` per the VDI's mode.
    pub async fn write(&self, offset: u64, data: Bytes) -> Result<(), CacheError> {
        self.pass_gate().await;
        self.check_lock()?;
        if self.inner.closing.closed() {
            return Err(CacheError::Closed);
        }
        match self.mode() {
            CacheMode::Off => {
                // A push in flight would land its older bytes over this write.
                let held = self.cached_in(offset, data.len() as u64);
                let _pushes = hold_pushes(&held).await;
                self.bypassing(self.vdi.write_at(offset, data.clone()))
                    .await?;
                self.invalidate(offset, data.len() as u64);
                Ok(())
            }
            CacheMode::Writethrough => {
                self.bypassing(self.vdi.write_at(offset, data.clone()))
                    .await?;
                self.store(offset, data, false).await
            }
            CacheMode::Writeback => {
                if offset + data.len() as u64 > self.vdi.size() {
                    return Err(VdiError::OutOfRange {
                        name: self.vdi.name(),
                        offset,
                        len: data.len() as u64,
                        size: self.vdi.size(),
                    }
                    .into());
                }
                match self.inner.writeback_write() {
                    Admit::Cache(_under_way) => self.store(offset, data, true).await?,
                    // The unmount is pushing the last dirty data: nothing new stays here.
                    Admit::Cluster => {
                        for (idx, off, n, at) in self.pieces(offset, data.len() as u64) {
                            let piece = data.slice(at..at + n as usize);
                            self.to_cluster(idx, off, piece, false).await?;
                        }
                    }
                    Admit::Refuse => return Err(CacheError::Closed),
                }
                if self.inner.space.dirty.load(Ordering::Relaxed) > self.inner.cfg.max_dirty {
                    self.inner.pushes.wake_flusher.notify_one();
                }
                Ok(())
            }
        }
    }

    /// Puts written data into the cache; `dirty` for writeback. Partial blocks not yet cached
    /// are read from the cluster first (writeback) or left uncached (writethrough). A piece
    /// the cache cannot take goes to the cluster (writeback) or only updates what is cached
    /// (writethrough: the cluster has it already); see [`crate::full`].
    async fn store(&self, offset: u64, data: Bytes, dirty: bool) -> Result<(), CacheError> {
        for (idx, off, n, at) in self.pieces(offset, data.len() as u64) {
            let piece = data.slice(at..at + n as usize);
            match self.store_piece(idx, off, &piece, dirty).await? {
                None => self.inner.cache_took_write(),
                Some(why) if dirty => {
                    let n = piece.len() as u64;
                    self.inner.wrote_through_full(&self.counters, n, &why);
                    self.to_cluster(idx, off, piece, true).await?
                }
                Some(_) => self.update_cached(idx, off, &piece, false)?,
            }
        }
        Ok(())
    }

    /// [`CachedVdi::store`] of the piece of a write in object `idx`; `Some(why)` if the
    /// cache could not take it (nothing stored then, and no room kept).
    async fn store_piece(
        &self,
        idx: u32,
        off: u64,
        piece: &[u8],
        dirty: bool,
    ) -> Result<Option<String>, CacheError> {
        let os = self.object_size;
        let key = (self.vid(), idx);
        let base = idx as u64 * os;
        let n = piece.len() as u64;
        let (b0, b1) = CachedObject::block_range(off, n);
        // One more try after freeing disk space, if the cache's disk is full.
        let mut freed_disk = false;
        loop {
            let new_blocks = {
                let o = self.inner.object(key, os, false).await;
                o.map(|o| {
                    let st = o.state.lock().unwrap();
                    (b0..b1).filter(|&b| !st.valid.get(b)).count()
                })
                .unwrap_or(b1 - b0)
            };
            let bytes = new_blocks as u64 * BLOCK;
            if !self.inner.reserve(bytes).await {
                return Ok(Some("no room could be made within the timeout".into()));
            }
            let reserved = Reserved {
                inner: &self.inner,
                bytes,
            };
            let Some(o) = self.inner.object(key, os, true).await else {
                // Most likely its disk is full (the reason is logged).
                drop(reserved);
                if !freed_disk {
                    freed_disk = true;
                    if self.inner.free_disk().await {
                        continue;
                    }
                }
                return Ok(Some("its files could not be created".into()));
            };
            // Edge blocks only partly written need their other bytes (fetched before taking
            // the object's lock, written under it).
            let obj_end = os.min(self.vdi.size().saturating_sub(base));
            let mut edges = Vec::new();
            if !off.is_multiple_of(BLOCK) {
                edges.push(b0);
            }
            if !(off + n).is_multiple_of(BLOCK) && (off + n) < obj_end && !edges.contains(&(b1 - 1))
            {
                edges.push(b1 - 1);
            }
            // Bytes of partly written blocks are kept: they must be good ones.
            for &b in &edges {
                self.check_blocks(&o, b, b + 1)?;
            }
            let mut old_blocks = Vec::new();
            for &b in &edges {
                if dirty && !o.state.lock().unwrap().valid.get(b) {
                    let bs = b as u64 * BLOCK;
                    let be = (bs + BLOCK).min(obj_end);
                    old_blocks.push((b, self.vdi.read_at(base + bs, be - bs).await?));
                }
            }
            // Data and bits change together under the object's locks, so a concurrent fill
            // can never put older bytes over this write. Nothing is marked before the data
            // is written: a failure leaves the bits as they were.
            let committed = {
                let _writing = o.writing.lock().unwrap();
                let mut st = o.state.lock().unwrap();
                let mut skip = Vec::new();
                let mut written = Ok(());
                for &b in &edges {
                    if st.valid.get(b) {
                        continue;
                    }
                    match old_blocks.iter().find(|(ob, _)| *ob == b) {
                        Some((_, old)) => {
                            written = o.write_data(old, b as u64 * BLOCK);
                            if written.is_err() {
                                break;
                            }
                        }
                        None => skip.push(b), // writethrough: leave partial blocks uncached
                    }
                }
                written
                    .and_then(|_| {
                        let dirty_count = &self.inner.space.dirty;
                        commit(&o, &mut st, off, piece, &skip, dirty, dirty_count)
                    })
                    .map(|r| (r, o.save(&st)))
            };
            let (added, saved) = match committed {
                Ok(r) => r,
                Err(e) => {
                    drop(o);
                    drop(reserved);
                    if disk_full(&e) && !freed_disk {
                        freed_disk = true;
                        if self.inner.free_disk().await {
                            continue;
                        }
                    }
                    return Ok(Some(format!("writing the cache: {e}")));
                }
            };
            self.inner.client.pause(Pause::WriteStored).await;
            reserved.settle(added as u64 * BLOCK);
            saved.map_err(io_err("writing cache metadata", key))?;
            Counters::add(&self.counters.fills, 1);
            Counters::add(&self.counters.fill_bytes, n);
            return Ok(None);
        }
    }

    /// Forgets cached blocks of a range (they are no longer what the cluster holds).
    fn invalidate(&self, offset: u64, len: u64) {
        self.forget_blocks(offset, len, false);
    }

    /// Forgets the blocks a range touches, partly covered ones included; only those whose
    /// bytes the cluster holds too (valid and not dirty) when `clean_only`.
    fn forget_blocks(&self, offset: u64, len: u64, clean_only: bool) {
        for (idx, off, n, _) in self.pieces(offset, len) {
            let Some(o) = self.peek(idx) else { continue };
            let (b0, b1) = CachedObject::block_range(off, n);
            // After any fill in progress, which may have started before the change.
            let _writing = o.writing.lock().unwrap();
            let mut st = o.state.lock().unwrap();
            let before = (st.valid.count(), st.dirty.count());
            if clean_only {
                for b in b0..b1 {
                    if !st.dirty.get(b) {
                        st.valid.set_range(b, b + 1, false);
                    }
                }
            } else {
                st.valid.set_range(b0, b1, false);
                st.dirty.set_range(b0, b1, false);
            }
            if st.dirty.is_empty() {
                st.dirty_since = None;
            }
            let after = (st.valid.count(), st.dirty.count());
            if after != before {
                let _ = o.save(&st);
            }
            // Counted down with the bits, under the object's lock (see [`commit`]).
            let space = &self.inner.space;
            space
                .used
                .fetch_sub((before.0 - after.0) as u64 * BLOCK, Ordering::SeqCst);
            space.undirty((before.1 - after.1) as u64 * BLOCK);
        }
    }

    /// Discard: the range reads as zeros afterwards, here and in the cluster. Whole cached
    /// blocks inside it are forgotten; cached blocks it covers only partly get zeros in that
    /// part and keep their other bytes (and dirty state).
    ///
    /// Order, so that a discard that fails (or a kill -9 in the middle) never leaves the cache
    /// and the cluster disagreeing, nor loses an acknowledged write: first the clean blocks it
    /// touches are forgotten (the cluster holds their bytes), then the cluster discards, and
    /// only once it has are the dirty blocks forgotten (whole) or zeroed in part (they stay
    /// dirty, so the zeros reach the cluster with their other bytes). A discard that fails
    /// leaves the dirty blocks as they were.
    ///
    /// A push of a cached object in the range that is in flight is waited for, and none
    /// starts until the cluster has the discard: the push's older bytes never land after
    /// the zeros, and it never writes into an object the discard removes.
    pub async fn discard(&self, offset: u64, len: u64) -> Result<(), CacheError> {
        self.pass_gate().await;
        self.check_lock()?;
        if self.inner.closing.closed() {
            return Err(CacheError::Closed);
        }
        let held = self.cached_in(offset, len);
        let _pushes = hold_pushes(&held).await;
        self.forget_blocks(offset, len, true);
        self.bypassing(self.vdi.discard(offset, len)).await?;
        let end = offset + len;
        let first_whole = offset.next_multiple_of(BLOCK);
        let last_whole = end / BLOCK * BLOCK;
        if first_whole < last_whole {
            self.invalidate(first_whole, last_whole - first_whole);
        }
        let os = self.object_size;
        let edges = [
            (offset, first_whole.min(end)),
            (last_whole.max(offset), end),
        ];
        for (s, e) in edges {
            if s >= e {
                continue;
            }
            let (idx, off) = ((s / os) as u32, s % os);
            if let Some(o) = self.peek(idx) {
                let _writing = o.writing.lock().unwrap();
                let st = o.state.lock().unwrap();
                if st.valid.get((off / BLOCK) as usize) {
                    o.write_data(&vec![0u8; (e - s) as usize], off)
                        .map_err(io_err("writing the cache", o.key))?;
                }
            }
        }
        Ok(())
    }

    /// The cached objects of a range, in index order (pinned).
    pub(super) fn cached_in(&self, offset: u64, len: u64) -> Vec<Pinned> {
        self.pieces(offset, len)
            .filter_map(|(idx, ..)| self.peek(idx))
            .collect()
    }
}

/// Bytes [`Inner::reserve`]d for a write, given back unless [`Reserved::settle`]d with what
/// the write really added (so no early return leaks them).
struct Reserved<'a, B: Backend> {
    inner: &'a Inner<B>,
    bytes: u64,
}

impl<B: Backend> Reserved<'_, B> {
    fn settle(mut self, added: u64) {
        self.inner.settle(self.bytes, added);
        self.bytes = 0;
    }
}

impl<B: Backend> Drop for Reserved<'_, B> {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.inner.settle(self.bytes, 0);
        }
    }
}

/// Waits for the pushes of `objects` in flight and keeps new ones from starting while the
/// guards live: for changes that reach the cluster without the cache (a discard, a write
/// that bypasses it), which a push of older bytes must not follow. Taken in the objects'
/// order, as every caller lists them by index.
pub(super) async fn hold_pushes(objects: &[Pinned]) -> Vec<tokio::sync::MutexGuard<'_, ()>> {
    let mut guards = Vec::with_capacity(objects.len());
    for o in objects {
        guards.push(o.pushing.lock().await);
    }
    guards
}

/// Writes `piece` at `off` into the object and marks its blocks (all but `skip`) valid, and
/// dirty when `dirty`; the caller holds the object's state lock (`st`) and saves it after.
/// Returns the blocks made valid.
///
/// The blocks made dirty are counted in `dirty_count` (the cache's dirty byte counter) here,
/// under the state lock, as every change of dirty bits is: whoever clears them (a push, a
/// discard, an eviction) counts them down under the same lock, so never before they were
/// counted up. Counted after the lock, a push in between counted down bytes not yet counted
/// (the counter stops at 0) and the count-up then left bytes counted that no block held.
fn commit(
    o: &CachedObject,
    st: &mut State,
    off: u64,
    piece: &[u8],
    skip: &[usize],
    dirty: bool,
    dirty_count: &AtomicU64,
) -> std::io::Result<usize> {
    let n = piece.len() as u64;
    let (b0, b1) = CachedObject::block_range(off, n);
    let s0 = if skip.contains(&b0) {
        ((b0 as u64 + 1) * BLOCK).min(off + n)
    } else {
        off
    };
    let e0 = if skip.contains(&(b1 - 1)) {
        ((b1 as u64 - 1) * BLOCK).max(s0)
    } else {
        off + n
    };
    let write_data = || match s0 < e0 {
        true => o.write_data(&piece[(s0 - off) as usize..(e0 - off) as usize], s0),
        false => Ok(()),
    };
    let (mut added, mut dirtied) = (0, 0);
    // Cached clean blocks are marked dirty on disk before their bytes change: a crash in
    // between must not leave a clean block whose bytes the cluster never had (its next read
    // would differ from the cluster's, and an eviction would bring the old bytes back). A
    // block left dirty with its old bytes is only pushed again.
    let clean: Vec<usize> = match dirty {
        true => (b0..b1)
            .filter(|&b| !skip.contains(&b) && st.valid.get(b) && !st.dirty.get(b))
            .collect(),
        false => Vec::new(),
    };
    if clean.is_empty() {
        write_data()?;
    } else {
        for &b in &clean {
            st.dirty.set_range(b, b + 1, true);
        }
        if let Err(e) = o.save(st).and_then(|_| write_data()) {
            // Nothing acknowledged, nothing counted: the caller sends the write to the
            // cluster, and its bytes into these blocks.
            for &b in &clean {
                st.dirty.set_range(b, b + 1, false);
            }
            let _ = o.save(st);
            return Err(e);
        }
        dirtied += clean.len();
    }
    for b in (b0..b1).filter(|b| !skip.contains(b)) {
        if !st.valid.get(b) {
            st.valid.set_range(b, b + 1, true);
            added += 1;
        }
        if dirty && !st.dirty.get(b) {
            st.dirty.set_range(b, b + 1, true);
            dirtied += 1;
        }
        // A push in flight read the block before this write: it stays dirty and goes out
        // again. Writethrough too: its bytes are in the cluster already, but a block still
        // dirty from writeback may be on its way there with older ones.
        if let Some(r) = st.rewritten.as_mut() {
            r.set_range(b, b + 1, true);
        }
        // A quarantined block written whole holds good bytes again.
        if let Some(q) = st.quarantined.as_mut() {
            if s0 <= b as u64 * BLOCK && (b as u64 + 1) * BLOCK <= e0 {
                q.set_range(b, b + 1, false);
            }
        }
    }
    if dirty && st.dirty_since.is_none() {
        st.dirty_since = Some(std::time::Instant::now());
    }
    dirty_count.fetch_add(dirtied as u64 * BLOCK, Ordering::SeqCst);
    Ok(added)
}
