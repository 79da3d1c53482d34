//! A VDI seen through the cache: reads served from cached blocks or fetched by the range they
//! need, writes kept (writeback) or passed on (writethrough), per the VDI's mode.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use futures::future::{BoxFuture, FutureExt, Shared};

use bytes::{Bytes, BytesMut};
use objstore_client::{Vdi, VdiError};

use crate::object::Key;
use crate::CacheError;

use super::object::State;
use super::object::{CachedObject, BLOCK};
use super::{Counters, FillJob, Inner, ModeCell};
use cache_control::CacheMode;

/// Sequential misses fetch this far ahead (within the object).
const READ_AHEAD: u64 = 1 << 20;

/// A read starting within this distance of where the current sequential run has reached
/// continues it: readers with several requests in flight have them served out of order.
const STREAM_SLACK: u64 = 4 << 20;

/// A fetch other readers may join: its error is shared with them all.
type Fetch = Shared<BoxFuture<'static, Result<Bytes, Arc<VdiError>>>>;

/// A fetch from the cluster in flight (and until its fill lands): later reads of its range
/// wait for it instead of fetching again.
struct Inflight {
    id: u64,
    start: u64,
    end: u64,
    /// [`Inner::bypass_writes`] when the fetch started: after a bypassing write it may hold
    /// older bytes, so later reads do not join it.
    bypass: u64,
    fetch: Fetch,
}

/// What a read is, for the pieces it is cut into.
#[derive(Clone, Copy)]
struct ReadKind {
    /// It starts where the last one ended (small ones read ahead).
    sequential: bool,
    /// The id of the stream it is part of ([`CachedVdi::in_stream`]).
    stream: Option<u64>,
}

/// What [`CachedVdi::read_hit`] found of a read it could not serve from the cache: for a
/// read within one object, its index and the object if cached.
#[derive(Default)]
pub struct Missed(Option<(u32, Option<Arc<CachedObject>>)>);

pub struct CachedVdi {
    inner: Arc<Inner>,
    vdi: Arc<Vdi>,
    /// The VDI's id and object size (fixed; read on every request, where the header's lock
    /// would be taken).
    vid: u32,
    object_size: u64,
    /// Its mode ([`Inner::mode_cell`]).
    mode: Arc<ModeCell>,
    counters: Arc<Counters>,
    /// Where the last read ended: a read starting there is sequential.
    last_end: AtomicU64,
    /// The current sequential run of reads: (start, furthest end, id). Longer than the
    /// sequential cutoff, it is a stream (a copy, a backup, a scan), whose misses are cached
    /// only in objects another stream passed through before. The id is taken when it
    /// becomes one (0 until then: random reads, each a run of its own, take none).
    run: Mutex<(u64, u64, u64)>,
    /// Fetches in flight per object index.
    inflight: Arc<Mutex<InflightMap>>,
    next_fetch: AtomicU64,
    /// False while the cache takes the VDI over from plain handles whose requests are still
    /// in flight ([`CachedVdi::gated`]): until [`CachedVdi::open_gate`], requests wait.
    gate_open: AtomicBool,
    gate: tokio::sync::watch::Sender<bool>,
}

type InflightMap = std::collections::HashMap<u32, Vec<Inflight>>;

/// Forgets fetch `id` of object `idx`.
fn forget_fetch(map: &Mutex<InflightMap>, idx: u32, id: u64) {
    let mut map = map.lock().unwrap();
    if let Some(v) = map.get_mut(&idx) {
        v.retain(|f| f.id != id);
        if v.is_empty() {
            map.remove(&idx);
        }
    }
}

/// A failed read or write of the cache's files of object `key`.
fn io_err(what: &'static str, key: Key) -> impl FnOnce(std::io::Error) -> CacheError {
    move |source| CacheError::Io { what, key, source }
}

impl CachedVdi {
    pub(super) fn new(inner: Arc<Inner>, vdi: Arc<Vdi>) -> CachedVdi {
        let vid = vdi.header().vid;
        let object_size = vdi.object_size() as u64;
        let counters = inner.counters(vid);
        let mode = inner.mode_cell(vid);
        let run = Mutex::new((0, 0, 0));
        CachedVdi {
            inner,
            vdi,
            vid,
            object_size,
            mode,
            counters,
            last_end: AtomicU64::new(u64::MAX),
            run,
            inflight: Arc::default(),
            next_fetch: AtomicU64::new(1),
            gate_open: AtomicBool::new(true),
            gate: tokio::sync::watch::Sender::new(true),
        }
    }

    /// A handle whose requests wait until [`CachedVdi::open_gate`]: for taking a VDI over
    /// from plain handles (straight to the cluster, outside the cache) once their requests in
    /// flight are done, so that none of them lands after the cache read or wrote its blocks.
    pub(super) fn gated(inner: Arc<Inner>, vdi: Arc<Vdi>) -> CachedVdi {
        let c = CachedVdi::new(inner, vdi);
        c.close_gate();
        c
    }

    /// Makes requests wait until [`CachedVdi::open_gate`] (see [`CachedVdi::gated`]); only on
    /// a handle no request has used yet.
    pub fn close_gate(&self) {
        self.gate_open.store(false, Ordering::SeqCst);
        self.gate.send_replace(false);
    }

    /// Lets requests in (see [`CachedVdi::gated`]). The plain handles' writes may not be
    /// flushed on the nodes yet: the next fsync flushes the cluster even if it pushes nothing.
    pub fn open_gate(&self) {
        self.inner.unflushed.store(true, Ordering::SeqCst);
        self.gate_open.store(true, Ordering::SeqCst);
        self.gate.send_replace(true);
    }

    /// Waits for the gate to open; free once it has.
    async fn pass_gate(&self) {
        if self.gate_open.load(Ordering::Acquire) {
            return;
        }
        let mut rx = self.gate.subscribe();
        // The sender lives as long as self: this returns once the gate is open.
        let _ = rx.wait_for(|open| *open).await;
    }

    pub fn vdi(&self) -> &Arc<Vdi> {
        &self.vdi
    }

    fn vid(&self) -> u32 {
        self.vid
    }

    fn mode(&self) -> CacheMode {
        self.mode.get()
    }

    /// The pieces of a range, one per object it touches: (object index, offset in the
    /// object, length, offset in the range).
    fn pieces(&self, offset: u64, len: u64) -> impl Iterator<Item = (u32, u64, u64, usize)> {
        objstore_proto::extent::extents(offset, len, self.object_size)
            .map(|e| (e.index as u32, e.offset, e.len, e.at))
    }

    /// The one piece of a non-empty range within one object (object index, offset in it,
    /// length); None if the range is empty or spans objects.
    fn one_piece(&self, offset: u64, len: u64) -> Option<(u32, u64, u64)> {
        let os = self.object_size;
        (len > 0 && offset % os + len <= os).then_some(((offset / os) as u32, offset % os, len))
    }

    /// Serves a read wholly from cached blocks without waiting, or says what it found (for
    /// [`CachedVdi::read_missed`]). Called on the FUSE thread: a hit costs no hop to the
    /// runtime.
    pub fn read_hit(&self, offset: u64, len: u64) -> Result<Vec<u8>, Missed> {
        if !self.gate_open.load(Ordering::Acquire) || self.mode() == CacheMode::Off {
            return Err(Missed::default());
        }
        // Every piece is checked before the buffer is allocated: a miss costs none.
        let out = match self.one_piece(offset, len) {
            Some((idx, off, n)) => {
                let o = self
                    .cached_range(idx, off, n)
                    .map_err(|o| Missed(Some((idx, o))))?;
                copy_hit([(o, off, n, 0)], len).map_err(|o| Missed(Some((idx, Some(o)))))?
            }
            None => {
                let found = self
                    .pieces(offset, len)
                    .map(|(idx, off, n, at)| {
                        self.cached_range(idx, off, n).map(|o| (o, off, n, at))
                    })
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|_| Missed::default())?;
                copy_hit(found, len).map_err(|_| Missed::default())?
            }
        };
        self.last_end.store(offset + len, Ordering::Relaxed);
        Counters::add(&self.counters.hits, 1);
        Counters::add(&self.counters.hit_bytes, len);
        Ok(out)
    }

    /// Object `idx` if it holds every block of `n` bytes at `off` (now the most recently
    /// used), else what the cache has of it. Holding the reference keeps the object from
    /// eviction while it is read.
    fn cached_range(
        &self,
        idx: u32,
        off: u64,
        n: u64,
    ) -> Result<Arc<CachedObject>, Option<Arc<CachedObject>>> {
        let o = self.peek(idx).ok_or(None)?;
        let (b0, b1) = CachedObject::block_range(off, n);
        if !o.state.lock().unwrap().valid.all(b0, b1) {
            // A miss leaves the object's place in the LRU alone: only what the cache
            // serves makes it recently used.
            return Err(Some(o));
        }
        self.promote(idx);
        Ok(o)
    }

    /// Makes object `idx` the most recently used.
    fn promote(&self, idx: u32) {
        self.inner
            .objects
            .lock()
            .unwrap()
            .promote(&(self.vid(), idx));
    }

    /// Reads `len` bytes at `offset` after [`CachedVdi::read_hit`] could not serve them: the
    /// object it looked up is not looked up again (`Missed::default()`: nothing looked up).
    pub async fn read_missed(
        &self,
        offset: u64,
        len: u64,
        missed: Missed,
    ) -> Result<Bytes, CacheError> {
        self.pass_gate().await;
        if self.mode() == CacheMode::Off {
            return Ok(self.vdi.read_at(offset, len).await?);
        }
        let sequential = self.last_end.swap(offset + len, Ordering::Relaxed) == offset;
        let how = ReadKind {
            sequential,
            stream: self.in_stream(offset, len),
        };
        if let Some((idx, off, n)) = self.one_piece(offset, len) {
            let looked = missed.0.filter(|(i, _)| *i == idx).map(|(_, o)| o);
            return self.read_piece(idx, off, n, how, looked).await;
        }
        let pieces: Vec<_> = self.pieces(offset, len).collect();
        let mut out = BytesMut::zeroed(len as usize);
        let parts = futures::future::join_all(
            pieces
                .iter()
                .map(|&(idx, off, n, _)| self.read_piece(idx, off, n, how, None)),
        )
        .await;
        for (&(_, _, n, at), part) in pieces.iter().zip(parts) {
            out[at..at + n as usize].copy_from_slice(&part?);
        }
        Ok(out.freeze())
    }

    /// The stream a read of `len` bytes at `offset` belongs to, if any: a sequential run
    /// (allowing for requests served out of order) longer than the sequential cutoff.
    fn in_stream(&self, offset: u64, len: u64) -> Option<u64> {
        let cutoff = self.inner.cfg.sequential_cutoff;
        if cutoff == 0 {
            return None;
        }
        let mut run = self.run.lock().unwrap();
        let end = offset + len;
        if offset.abs_diff(run.1) > STREAM_SLACK {
            *run = (offset, end, 0);
        } else {
            *run = (run.0.min(offset), run.1.max(end), run.2);
        }
        if run.1 - run.0 <= cutoff {
            return None;
        }
        if run.2 == 0 {
            run.2 = self.inner.next_stream();
        }
        Some(run.2)
    }

    /// Reads `n` bytes at `off` in object `idx`; `looked`: the object as the caller found it
    /// in the cache just before (Some(None): not there), else it is looked up here. A hit
    /// makes the object the most recently used; a miss leaves its place alone.
    async fn read_piece(
        &self,
        idx: u32,
        off: u64,
        n: u64,
        how: ReadKind,
        looked: Option<Option<Arc<CachedObject>>>,
    ) -> Result<Bytes, CacheError> {
        let os = self.object_size;
        let key = (self.vid(), idx);
        let base = idx as u64 * os;
        let obj = looked.unwrap_or_else(|| self.peek(idx));
        let (b0, b1) = CachedObject::block_range(off, n);
        // (whether it holds the range, whether it holds anything)
        let (hit, cached_any) = obj.as_ref().map_or((false, false), |o| {
            let st = o.state.lock().unwrap();
            (st.valid.all(b0, b1), !st.valid.is_empty())
        });
        if let (true, Some(o)) = (hit, &obj) {
            self.promote(idx);
            o.touch();
            let buf = read_cached(o, off, n).await?;
            Counters::add(&self.counters.hits, 1);
            Counters::add(&self.counters.hit_bytes, n);
            return Ok(Bytes::from(buf));
        }
        if self.vdi.object(idx as u64).is_none() && !cached_any {
            // A hole: zeros without a request, and nothing worth caching.
            return Ok(Bytes::from(vec![0u8; n as usize]));
        }
        // Miss: wait for a fetch already covering the range, or fetch the blocks the read
        // needs (more ahead when small reads are sequential).
        let obj_end = os.min(self.vdi.size().saturating_sub(base));
        let fstart = b0 as u64 * BLOCK;
        let mut fend = (b1 as u64 * BLOCK).min(obj_end);
        if how.sequential && n < READ_AHEAD {
            fend = (fend + READ_AHEAD).min(obj_end);
        }
        // Join a fetch in flight that covers the range (started after the last bypassing
        // write), or start one if the range is to be kept; all under the fetch table's lock,
        // so two readers of a range never both fetch it. That lock is taken before the
        // admission's and the LRU's (in `keeps`), never after them (the CPU pressure's, in
        // `fill_affordable`, is only ever tried). A range not kept is told by the counter
        // that says why.
        let planned = {
            let mut inflight = self.inflight.lock().unwrap();
            let bypass = self.inner.bypass_writes.load(Ordering::SeqCst);
            let joined = inflight.get(&idx).and_then(|here| {
                here.iter()
                    .find(|f| f.start <= off && off + n <= f.end && f.bypass == bypass)
                    .map(|f| (f.id, f.start, f.fetch.clone(), None))
            });
            match joined {
                Some(j) => Ok(j),
                None if how
                    .stream
                    .is_some_and(|id| !self.inner.admission.streamed_before(key, id)) =>
                {
                    Err(&self.counters.stream_bypasses)
                }
                None if !self.inner.keeps(key, b0, fend - fstart) => {
                    Err(&self.counters.skipped_fills)
                }
                // Asked only of ranges to be kept: most misses of a full cache are not,
                // and read no clock for the CPU pressure.
                None if !self.inner.fill_affordable(fend - fstart) => {
                    Err(&self.counters.busy_skipped_fills)
                }
                None => {
                    let vdi = self.vdi.clone();
                    let fetch: Fetch = async move {
                        vdi.read_at(base + fstart, fend - fstart)
                            .await
                            .map_err(Arc::new)
                    }
                    .boxed()
                    .shared();
                    let id = self.next_fetch.fetch_add(1, Ordering::Relaxed);
                    inflight.entry(idx).or_default().push(Inflight {
                        id,
                        start: fstart,
                        end: fend,
                        bypass,
                        fetch: fetch.clone(),
                    });
                    Counters::add(&self.counters.miss_bytes, fend - fstart);
                    Ok((id, fstart, fetch, Some(bypass)))
                }
            }
        };
        let (fid, fstart, fetch, mine) = match planned {
            Ok(p) => p,
            Err(not_kept) => {
                // Fetched for this reader alone, only what it asked for.
                Counters::add(&self.counters.misses, 1);
                Counters::add(&self.counters.miss_bytes, n);
                Counters::add(not_kept, 1);
                let fetched = self.vdi.read_at(base + off, n).await?;
                return self.with_cached(obj.as_deref(), fetched, off, b0, b1);
            }
        };
        Counters::add(&self.counters.misses, 1);
        let fetched = match fetch.await {
            Ok(f) => f,
            Err(e) => {
                if mine.is_some() {
                    forget_fetch(&self.inflight, idx, fid);
                }
                return Err(CacheError::Fetch {
                    name: self.vdi.header().name,
                    source: e,
                });
            }
        };
        let mine_part = fetched.slice((off - fstart) as usize..(off - fstart + n) as usize);
        let part = self.with_cached(obj.as_deref(), mine_part, off, b0, b1)?;
        // Fill the cache off the reader's path (once per fetch); the fetch stays visible to
        // other readers until its blocks are in the cache.
        if let Some(bypass) = mine {
            let inflight = self.inflight.clone();
            self.inner.queue_fill(FillJob {
                key,
                object_size: os,
                start: fstart,
                data: fetched,
                bypass,
                counters: self.counters.clone(),
                done: Box::new(move || forget_fetch(&inflight, idx, fid)),
            });
        }
        Ok(part)
    }

    /// `fetched` (read from the cluster at `off`, blocks `b0..b1`) as it is, or with the
    /// blocks `o` holds of it laid over it: cached blocks, possibly dirty, are newer than the
    /// cluster's.
    fn with_cached(
        &self,
        o: Option<&CachedObject>,
        fetched: Bytes,
        off: u64,
        b0: usize,
        b1: usize,
    ) -> Result<Bytes, CacheError> {
        match o.filter(|o| o.state.lock().unwrap().valid.any(b0, b1)) {
            None => Ok(fetched),
            Some(o) => self.overlay_cached(o, fetched, off, b0, b1),
        }
    }

    /// `fetched` with the blocks the cache holds laid over it (see [`CachedVdi::with_cached`]).
    fn overlay_cached(
        &self,
        o: &CachedObject,
        fetched: Bytes,
        off: u64,
        b0: usize,
        b1: usize,
    ) -> Result<Bytes, CacheError> {
        let n = fetched.len() as u64;
        let mut buf = fetched.to_vec();
        {
            let st = o.state.lock().unwrap();
            for b in b0..b1 {
                if st.valid.get(b) {
                    let bs = (b as u64 * BLOCK).max(off);
                    let be = ((b as u64 + 1) * BLOCK).min(off + n);
                    let mut tmp = vec![0u8; (be - bs) as usize];
                    o.read_data(&mut tmp, bs)
                        .map_err(io_err("reading the cache", o.key))?;
                    buf[(bs - off) as usize..(be - off) as usize].copy_from_slice(&tmp);
                }
            }
        }
        Ok(Bytes::from(buf))
    }

    /// A writeback write that needs no waiting (one object, no partial block to fetch, room
    /// without eviction), done on the FUSE thread; false if it must take the slow path.
    pub fn write_fast(&self, offset: u64, data: &[u8]) -> bool {
        if !self.gate_open.load(Ordering::Acquire)
            || self.mode() != CacheMode::Writeback
            || offset + data.len() as u64 > self.vdi.size()
        {
            return false;
        }
        let os = self.object_size;
        let Some((idx, off, n)) = self.one_piece(offset, data.len() as u64) else {
            return false;
        };
        let key = (self.vid(), idx);
        let obj_end = os.min(self.vdi.size() - idx as u64 * os);
        let (b0, b1) = CachedObject::block_range(off, n);
        let existing = self.inner.objects.lock().unwrap().get(&key).cloned();
        let edges_ok = |st: Option<&State>| {
            let ok = |b: usize| st.is_some_and(|st| st.valid.get(b));
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
        let res = commit(&o, &mut st, off, data, &[], true).and_then(|r| o.save(&st).map(|_| r));
        drop(st);
        match res {
            Ok((added, dirtied)) => {
                self.inner.settle(reserved, added as u64 * BLOCK);
                self.inner
                    .dirty
                    .fetch_add(dirtied as u64 * BLOCK, Ordering::SeqCst);
                Counters::add(&self.counters.fills, 1);
                Counters::add(&self.counters.fill_bytes, n);
                if self.inner.dirty.load(Ordering::Relaxed) > self.inner.cfg.max_dirty {
                    self.inner.wake_flusher.notify_one();
                }
                true
            }
            Err(e) => {
                // Nothing acknowledged: the slow path retries and reports.
                tracing::warn!("writing the cache: {e}");
                self.inner.settle(reserved, 0);
                false
            }
        }
    }

    /// Writes `data` at `offset` per the VDI's mode.
    pub async fn write(&self, offset: u64, data: Bytes) -> Result<(), CacheError> {
        self.pass_gate().await;
        match self.mode() {
            CacheMode::Off => {
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
                        name: self.vdi.header().name,
                        offset,
                        len: data.len() as u64,
                        size: self.vdi.size(),
                    }
                    .into());
                }
                self.store(offset, data, true).await?;
                if self.inner.dirty.load(Ordering::Relaxed) > self.inner.cfg.max_dirty {
                    self.inner.wake_flusher.notify_one();
                }
                Ok(())
            }
        }
    }

    /// Puts written data into the cache; `dirty` for writeback. Partial blocks not yet cached
    /// are read from the cluster first (writeback) or left uncached (writethrough).
    async fn store(&self, offset: u64, data: Bytes, dirty: bool) -> Result<(), CacheError> {
        let os = self.object_size;
        for (idx, off, n, at) in self.pieces(offset, data.len() as u64) {
            let key = (self.vid(), idx);
            let base = idx as u64 * os;
            let piece = &data[at..at + n as usize];
            let (b0, b1) = CachedObject::block_range(off, n);
            let new_blocks = {
                let o = self.inner.object(key, os, false).await;
                o.map(|o| {
                    let st = o.state.lock().unwrap();
                    (b0..b1).filter(|&b| !st.valid.get(b)).count()
                })
                .unwrap_or(b1 - b0)
            };
            let reserved = new_blocks as u64 * BLOCK;
            let room = self.inner.reserve(reserved).await;
            let o = if room {
                self.inner.object(key, os, true).await
            } else {
                None
            };
            let Some(o) = o else {
                if room {
                    self.inner.settle(reserved, 0);
                }
                if dirty {
                    // No room (the cluster is not taking dirty data, or the cache disk failed):
                    // write through instead, which fails with the cluster's error if it is
                    // down, and bring blocks cached earlier up to date.
                    self.bypassing(self.vdi.write_at(base + off, Bytes::copy_from_slice(piece)))
                        .await?;
                    self.update_cached(idx, off, piece);
                }
                continue;
            };
            // Edge blocks only partly written need their other bytes (fetched before taking
            // the object's lock, written under it).
            let obj_end = os.min(self.vdi.size().saturating_sub(base));
            let mut edges = Vec::new();
            if off % BLOCK != 0 {
                edges.push(b0);
            }
            if (off + n) % BLOCK != 0 && (off + n) < obj_end && !edges.contains(&(b1 - 1)) {
                edges.push(b1 - 1);
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
            // can never put older bytes over this write.
            let _writing = o.writing.lock().unwrap();
            let mut st = o.state.lock().unwrap();
            let mut skip = Vec::new();
            for &b in &edges {
                if st.valid.get(b) {
                    continue;
                }
                match old_blocks.iter().find(|(ob, _)| *ob == b) {
                    Some((_, old)) => o
                        .write_data(old, b as u64 * BLOCK)
                        .map_err(io_err("writing the cache", key))?,
                    None => skip.push(b), // writethrough: leave partial blocks uncached
                }
            }
            let (added, dirtied) = commit(&o, &mut st, off, piece, &skip, dirty)
                .map_err(io_err("writing the cache", key))?;
            let saved = o.save(&st);
            drop(st);
            self.inner.settle(reserved, added as u64 * BLOCK);
            saved.map_err(io_err("writing cache metadata", key))?;
            self.inner
                .dirty
                .fetch_add(dirtied as u64 * BLOCK, Ordering::SeqCst);
            Counters::add(&self.counters.fills, 1);
            Counters::add(&self.counters.fill_bytes, n);
        }
        Ok(())
    }

    /// The cached object holding `idx`, without touching its LRU position.
    fn peek(&self, idx: u32) -> Option<Arc<CachedObject>> {
        self.inner
            .objects
            .lock()
            .unwrap()
            .peek(&(self.vid(), idx))
            .cloned()
    }

    /// Forgets cached blocks of a range (they are no longer what the cluster holds).
    fn invalidate(&self, offset: u64, len: u64) {
        for (idx, off, n, _) in self.pieces(offset, len) {
            let Some(o) = self.peek(idx) else { continue };
            let (b0, b1) = CachedObject::block_range(off, n);
            // After any fill in progress, which may have started before the change.
            let _writing = o.writing.lock().unwrap();
            let mut st = o.state.lock().unwrap();
            let before = (st.valid.count(), st.dirty.count());
            st.valid.set_range(b0, b1, false);
            st.dirty.set_range(b0, b1, false);
            let _ = o.save(&st);
            let after = (st.valid.count(), st.dirty.count());
            drop(st);
            self.inner
                .used
                .fetch_sub((before.0 - after.0) as u64 * BLOCK, Ordering::SeqCst);
            self.inner
                .dirty
                .fetch_sub((before.1 - after.1) as u64 * BLOCK, Ordering::SeqCst);
        }
    }

    /// Discard: the range reads as zeros afterwards, here and in the cluster. Whole cached
    /// blocks inside it are forgotten; cached blocks it covers only partly get zeros in that
    /// part and keep their other bytes (and dirty state).
    pub async fn discard(&self, offset: u64, len: u64) -> Result<(), CacheError> {
        self.pass_gate().await;
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
        Ok(self.bypassing(self.vdi.discard(offset, len)).await?)
    }

    /// Runs a change that reaches the cluster without going through the cache. The counter
    /// moves before and after it, so no fetch that overlapped it is cached or joined.
    async fn bypassing<T>(&self, change: impl std::future::Future<Output = T>) -> T {
        self.inner.bypass_writes.fetch_add(1, Ordering::SeqCst);
        let r = change.await;
        self.inner.bypass_writes.fetch_add(1, Ordering::SeqCst);
        r
    }

    /// Puts `data` (just written to the cluster at `off` of object `idx`) into the blocks of
    /// it that are cached; blocks not cached stay so.
    fn update_cached(&self, idx: u32, off: u64, data: &[u8]) {
        let Some(o) = self.peek(idx) else { return };
        let (b0, b1) = CachedObject::block_range(off, data.len() as u64);
        let _writing = o.writing.lock().unwrap();
        let st = o.state.lock().unwrap();
        for b in b0..b1 {
            if !st.valid.get(b) {
                continue;
            }
            let s = (b as u64 * BLOCK).max(off);
            let e = ((b as u64 + 1) * BLOCK).min(off + data.len() as u64);
            let slice = &data[(s - off) as usize..(e - off) as usize];
            if let Err(err) = o.write_data(slice, s) {
                tracing::warn!("updating the cache after a write-through: {err}");
            }
        }
    }

    /// fsync: this VDI's dirty data to the cluster, flushed there.
    pub async fn flush(&self) -> Result<(), CacheError> {
        self.pass_gate().await;
        if self.mode() == CacheMode::Writeback {
            let vid = self.vid();
            self.inner
                .flush(Some(vid), |_, _| {})
                .await
                .map_err(|source| CacheError::Push {
                    name: self.vdi.header().name,
                    source,
                })?;
            return Ok(());
        }
        Ok(self.vdi.flush().await?)
    }
}

/// The bytes of a read whose pieces (object, offset in it, length, offset in the read) are
/// all cached, copied without waiting for the disk: `Err(o)` when object `o` has a piece
/// out of the page cache (the async path reads it then).
fn copy_hit(
    found: impl IntoIterator<Item = (Arc<CachedObject>, u64, u64, usize)>,
    len: u64,
) -> Result<Vec<u8>, Arc<CachedObject>> {
    let mut out = vec![0u8; len as usize];
    for (o, off, n, at) in found {
        if !o
            .read_data_nowait(&mut out[at..at + n as usize], off)
            .unwrap_or(false)
        {
            return Err(o);
        }
        o.touch();
    }
    Ok(out)
}

/// `n` cached bytes at `off`: from the page cache directly, else from the disk on the
/// blocking pool (a runtime thread never waits for the disk). Holding `o` keeps the object
/// from eviction meanwhile.
async fn read_cached(o: &Arc<CachedObject>, off: u64, n: u64) -> Result<Vec<u8>, CacheError> {
    let mut buf = vec![0u8; n as usize];
    if o.read_data_nowait(&mut buf, off)
        .map_err(io_err("reading the cache", o.key))?
    {
        return Ok(buf);
    }
    let key = o.key;
    let o = o.clone();
    tokio::task::spawn_blocking(move || o.read_data(&mut buf, off).map(|()| buf))
        .await
        .map_err(|e| io_err("reading the cache", key)(std::io::Error::other(e)))?
        .map_err(io_err("reading the cache", key))
}

/// Writes `piece` at `off` into the object and marks its blocks (all but `skip`) valid, and
/// dirty when `dirty`; the caller holds the object's state lock (`st`) and saves it after.
/// Returns (blocks made valid, blocks made dirty).
fn commit(
    o: &CachedObject,
    st: &mut State,
    off: u64,
    piece: &[u8],
    skip: &[usize],
    dirty: bool,
) -> std::io::Result<(usize, usize)> {
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
    if s0 < e0 {
        o.write_data(&piece[(s0 - off) as usize..(e0 - off) as usize], s0)?;
    }
    let (mut added, mut dirtied) = (0, 0);
    for b in (b0..b1).filter(|b| !skip.contains(b)) {
        if !st.valid.get(b) {
            st.valid.set_range(b, b + 1, true);
            added += 1;
        }
        if dirty {
            if !st.dirty.get(b) {
                st.dirty.set_range(b, b + 1, true);
                dirtied += 1;
            }
            if let Some(r) = st.rewritten.as_mut() {
                r.set_range(b, b + 1, true);
            }
        }
    }
    if dirty && st.dirty_since.is_none() {
        st.dirty_since = Some(std::time::Instant::now());
    }
    Ok((added, dirtied))
}

/// Writes the blocks of the data fetched at `start` (`parts`, one after the other: fetches
/// that continue each other) that are not cached yet, each run of consecutive such blocks
/// at once ([`CachedObject::write_fill_data`]); returns how many blocks were added, and
/// whether the object's bitmaps just became unsaved (the caller has them written later: see
/// [`super::object::State::unsaved`]).
/// Nothing is written unless `fresh()` (asked once no write to the object can come between
/// the check and the marking) says the data is still what the cluster holds.
///
/// The object's write lock is held throughout, its state lock only to pick the blocks and
/// to mark them: readers of the object never wait for the disk write (a 4 MiB fill takes
/// milliseconds, and a sequential reader wants the object being filled next).
pub(super) fn write_fill(
    o: &CachedObject,
    start: u64,
    parts: &[&[u8]],
    fresh: impl Fn() -> bool,
) -> (u64, bool) {
    let len: u64 = parts.iter().map(|p| p.len() as u64).sum();
    let (b0, b1) = CachedObject::block_range(start, len);
    let end = start + len;
    // Only whole blocks are cached, or the short block that ends the data (the VDI's end:
    // fetches are block-aligned everywhere else).
    let fits = |b: usize| (b as u64 + 1) * BLOCK <= end || b + 1 == b1;
    let _writing = o.writing.lock().unwrap();
    if !fresh() {
        return (0, false);
    }
    let mut runs = Vec::new();
    {
        let st = o.state.lock().unwrap();
        let mut b = b0;
        while b < b1 {
            if st.valid.get(b) || !fits(b) {
                b += 1; // a write got there first
                continue;
            }
            let mut e = b + 1;
            while e < b1 && !st.valid.get(e) && fits(e) {
                e += 1;
            }
            runs.push((b, e));
            b = e;
        }
    }
    // Nobody else writes these blocks meanwhile: writers hold the write lock, and a block
    // that is not valid is read by nobody.
    let mut written = Vec::new();
    for (b, e) in runs {
        let s = b as u64 * BLOCK - start;
        let t = (e as u64 * BLOCK).min(end) - start;
        if o.write_fill_data(&slice_parts(parts, s, t), b as u64 * BLOCK)
            .is_err()
        {
            break;
        }
        written.push((b, e));
    }
    let mut st = o.state.lock().unwrap();
    let mut added = 0u64;
    for (b, e) in written {
        st.valid.set_range(b, e, true);
        added += (e - b) as u64;
    }
    let newly_unsaved = added > 0 && !std::mem::replace(&mut st.unsaved, true);
    (added, newly_unsaved)
}

/// Bytes `[s, t)` of `parts` taken one after the other.
fn slice_parts<'a>(parts: &[&'a [u8]], s: u64, t: u64) -> Vec<&'a [u8]> {
    let mut out = Vec::new();
    let mut at = 0u64;
    for p in parts {
        let (ps, pe) = (at, at + p.len() as u64);
        at = pe;
        if pe <= s || ps >= t {
            continue;
        }
        out.push(&p[(s.max(ps) - ps) as usize..(t.min(pe) - ps) as usize]);
    }
    out
}
