//! Reads through the cache: hits served from cached blocks (on the FUSE thread when they
//! need no waiting), misses fetched from the cluster by the blocks they need (more ahead for
//! sequential reads), one fetch per range however many readers wait for it, and the fetched
//! data handed to the fill path.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use cache_control::CacheMode;
use futures::future::{BoxFuture, FutureExt, Shared};
use objstore_client::{VdiError, Volume};

use super::{io_err, CachedVdi, Missed};
use crate::fill::FillJob;
use crate::object::{CachedObject, BLOCK};
use crate::space::Pinned;
use crate::stats::Counters;
use crate::{Backend, CacheError};

/// Sequential misses fetch this far ahead (within the object).
const READ_AHEAD: u64 = 1 << 20;

/// A read starting within this distance of where the current sequential run has reached
/// continues it: readers with several requests in flight have them served out of order.
const STREAM_SLACK: u64 = 4 << 20;

/// A fetch other readers may join: its error is shared with them all.
type Fetch = Shared<BoxFuture<'static, Result<Bytes, Arc<VdiError>>>>;

/// A fetch from the cluster in flight (and until its fill lands): later reads of its range
/// wait for it instead of fetching again.
pub(super) struct Inflight {
    id: u64,
    start: u64,
    end: u64,
    /// [`crate::fill::Fills::bypass_writes`] when the fetch started: after a bypassing
    /// write it may hold older bytes, so later reads do not join it.
    bypass: u64,
    fetch: Fetch,
}

/// What a read is, for the pieces it is cut into.
#[derive(Clone, Copy)]
pub(super) struct ReadKind {
    /// It starts where the last one ended (small ones read ahead).
    sequential: bool,
    /// The id of the stream it is part of ([`CachedVdi::in_stream`]).
    stream: Option<u64>,
}

pub(super) type InflightMap = std::collections::HashMap<u32, Vec<Inflight>>;

/// Forgets fetch `id` of object `idx`.
pub(super) fn forget_fetch(map: &Mutex<InflightMap>, idx: u32, id: u64) {
    let mut map = map.lock().unwrap();
    if let Some(v) = map.get_mut(&idx) {
        v.retain(|f| f.id != id);
        if v.is_empty() {
            map.remove(&idx);
        }
    }
}

impl<B: Backend> CachedVdi<B> {
    /// Serves a read wholly from cached blocks without waiting, or says what it found (for
    /// [`CachedVdi::read_missed`]). Called on the FUSE thread: a hit costs no hop to the
    /// runtime.
    pub fn read_hit(&self, offset: u64, len: u64) -> Result<Vec<u8>, Missed> {
        if !self.gate_open.load(Ordering::Acquire)
            || self.mode() == CacheMode::Off
            || self.inner.attach.any_lost.load(Ordering::Relaxed)
        {
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
    fn cached_range(&self, idx: u32, off: u64, n: u64) -> Result<Pinned, Option<Pinned>> {
        let o = self.peek(idx).ok_or(None)?;
        let (b0, b1) = CachedObject::block_range(off, n);
        let st = o.state.lock().unwrap();
        // Blocks not checked since a restart are checked on the async path.
        if !st.valid.all(b0, b1) || st.needs_check(b0, b1) {
            drop(st);
            // A miss leaves the object's place in the LRU alone: only what the cache
            // serves makes it recently used.
            return Err(Some(o));
        }
        drop(st);
        self.promote(idx);
        Ok(o)
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
        self.check_lock()?;
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
        looked: Option<Option<Pinned>>,
    ) -> Result<Bytes, CacheError> {
        let os = self.object_size;
        let key = (self.vid(), idx);
        let base = idx as u64 * os;
        let obj = looked.unwrap_or_else(|| self.peek(idx));
        let (b0, b1) = CachedObject::block_range(off, n);
        if let Some(o) = &obj {
            self.check_blocks(o, b0, b1)?;
        }
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
        if !self.vdi.is_allocated(idx as u64) && !cached_any {
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
            let bypass = self.inner.fills.bypass_writes.load(Ordering::SeqCst);
            let joined = inflight.get(&idx).and_then(|here| {
                here.iter()
                    .find(|f| f.start <= off && off + n <= f.end && f.bypass == bypass)
                    .map(|f| (f.id, f.start, f.fetch.clone(), None))
            });
            match joined {
                Some(j) => Ok(j),
                None if how
                    .stream
                    .is_some_and(|id| !self.inner.fills.admission.streamed_before(key, id)) =>
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
                    name: self.vdi.name(),
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
}

/// The bytes of a read whose pieces (object, offset in it, length, offset in the read) are
/// all cached, copied without waiting for the disk: `Err(o)` when object `o` has a piece
/// out of the page cache (the async path reads it then).
fn copy_hit(
    found: impl IntoIterator<Item = (Pinned, u64, u64, usize)>,
    len: u64,
) -> Result<Vec<u8>, Pinned> {
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
async fn read_cached(o: &Pinned, off: u64, n: u64) -> Result<Vec<u8>, CacheError> {
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
