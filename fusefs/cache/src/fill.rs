//! Fills: ranges fetched on misses, written into the cache off the readers' path (by the
//! fill thread, or inline when small), and what decides whether a fetched range is kept at
//! all (admission once the cache is full, CPU pressure, streams).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::object::{self, CachedObject, Key, BLOCK};
use crate::stats::Counters;
use crate::{admit, pressure, Backend, Inner};

/// Fetched ranges on their way into the cache.
pub(crate) struct Fills {
    pub(crate) fill_tx: std::sync::mpsc::Sender<FillJob>,
    /// Taken by the fill thread when it starts.
    pub(crate) fill_rx: Mutex<Option<std::sync::mpsc::Receiver<FillJob>>>,
    /// Bytes fetched on misses that wait to be written into the cache.
    pub(crate) fills_queued: AtomicU64,
    /// Bumped by every write that reaches the cluster without updating the cache (partial
    /// blocks in writethrough, mode off): a fill fetched before it must not be cached.
    pub(crate) bypass_writes: AtomicU64,
    /// Objects whose bitmaps fills changed since they were last written (weak: eviction
    /// does not wait for the flusher).
    pub(crate) unsaved: Mutex<Vec<std::sync::Weak<CachedObject>>>,
    /// Which fetched ranges may displace cached data once the cache is full, and which
    /// objects streams passed through.
    pub(crate) admission: admit::Admission,
    /// Whether the host's CPUs are busy (small misses are then not filled).
    pub(crate) cpu: pressure::CpuPressure,
    /// The next stream id ([`Inner::next_stream`]).
    pub(crate) streams: AtomicU64,
}

impl Fills {
    pub(crate) fn new(size: u64) -> Fills {
        let (fill_tx, fill_rx) = std::sync::mpsc::channel();
        Fills {
            fill_tx,
            fill_rx: Mutex::new(Some(fill_rx)),
            fills_queued: AtomicU64::new(0),
            bypass_writes: AtomicU64::new(0),
            unsaved: Mutex::default(),
            admission: admit::Admission::new(size),
            cpu: pressure::CpuPressure::new(),
            streams: AtomicU64::new(1),
        }
    }
}

/// Bytes of fetched data waiting to be written into the cache, at most: past it a fetched
/// range is simply not cached, so a slow cache disk never slows the reads themselves.
const FILL_BUDGET: u64 = 16 << 20;

/// A fetched range shorter than this (a random read) is written into the cache by the
/// runtime thread that fetched it, right after its reader has the reply, when no other fill
/// is queued: a buffered write of a few KiB costs less than waking the fill thread (at
/// iodepth 1 that wake-up was a fifth of a miss's CPU). It goes to the fill thread after all
/// when that would mean creating the object's files or evicting; longer ranges (which start
/// their writeback, so a runtime thread never does), and ranges arriving while others wait
/// (the fill thread is awake then), always do.
const INLINE_FILL: u64 = object::WRITEBACK_FILL;

/// The most the fill thread writes at once (queued ranges that continue each other, merged).
const MAX_FILL_BATCH: u64 = 4 << 20;

/// Queued ranges the fill thread takes at once to look for ranges to merge.
const MAX_FILL_JOBS: usize = 64;

/// A range fetched on a miss, to be written into the cache (by the fill thread, or right on
/// the runtime thread that fetched it: see [`INLINE_FILL`]).
pub(crate) struct FillJob {
    pub(crate) key: Key,
    pub(crate) object_size: u64,
    pub(crate) start: u64,
    pub(crate) data: bytes::Bytes,
    /// [`Fills::bypass_writes`] when the fetch started.
    pub(crate) bypass: u64,
    pub(crate) counters: Arc<Counters>,
    /// Runs once the job is done or dropped.
    pub(crate) done: Box<dyn FnOnce() + Send>,
}

impl<B: Backend> Inner<B> {
    /// An id for a sequential run of reads that became a stream, unique in this cache (never 0).
    pub(crate) fn next_stream(&self) -> u64 {
        self.fills.streams.fetch_add(1, Ordering::Relaxed)
    }

    /// Whether a range of `len` bytes from block `block` of `key`, about to be fetched on a
    /// miss, is to be kept in the cache: always while there is room, else per admission
    /// (which remembers this miss). Asked before the fetch, so a range that will not be
    /// kept is fetched for its reader alone, with nothing registered or queued. A range
    /// admitted here and then not filled because the CPUs are busy is forgotten by
    /// admission: its next miss is a first one again.
    pub(crate) fn keeps(&self, key: Key, block: usize, len: u64) -> bool {
        let pending =
            self.space.used.load(Ordering::SeqCst) + self.fills.fills_queued.load(Ordering::SeqCst);
        // Eviction frees whole objects: "full" starts an eighth below the size, so the room
        // one eviction makes does not let every next miss in.
        let size = self.space.size.load(Ordering::SeqCst);
        let full = pending + len > size - size / 8;
        // Whether the range would displace cached data (only then is the data it would
        // displace weighed against it).
        let displaces = pending + len > size;
        let idle = || displaces.then(|| self.lru_idle_ms()).flatten();
        !full || self.fills.admission.admit(key, block, idle)
    }

    /// Whether CPU allows filling a range of `len` bytes about to be fetched on a miss: a
    /// small one (a random read) only while the host's CPUs are not busy ([`pressure`]);
    /// longer ones always.
    pub(crate) fn fill_affordable(&self, len: u64) -> bool {
        len >= pressure::SMALL_FILL || self.fills.cpu.allows_small_fill()
    }

    /// Has a fetched range that [`Inner::keeps`] admitted written into the cache (see
    /// [`INLINE_FILL`] for where), or drops it when too much waits already.
    pub(crate) fn queue_fill(self: &Arc<Self>, job: FillJob) {
        let len = job.data.len() as u64;
        let queued = self.fills.fills_queued.fetch_add(len, Ordering::SeqCst);
        if queued + len > FILL_BUDGET {
            // The fill worker is too far behind: not cached.
            self.fills.fills_queued.fetch_sub(len, Ordering::SeqCst);
            Counters::add(&job.counters.skipped_fills, 1);
            return (job.done)();
        }
        if len < INLINE_FILL && queued == 0 {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                // Runs on this thread once the current task (the read) is done.
                let inner = self.clone();
                rt.spawn(async move {
                    if fill_one(&inner, std::slice::from_ref(&job), true) {
                        inner.fill_done(job);
                    } else {
                        inner.to_fill_thread(job);
                    }
                });
                return;
            }
        }
        self.to_fill_thread(job);
    }

    pub(crate) fn to_fill_thread(&self, job: FillJob) {
        if let Err(e) = self.fills.fill_tx.send(job) {
            self.fill_done(e.0);
        }
    }

    /// A queued fill is over (done, or dropped).
    pub(crate) fn fill_done(&self, job: FillJob) {
        self.fills
            .fills_queued
            .fetch_sub(job.data.len() as u64, Ordering::SeqCst);
        (job.done)();
    }

    /// Writes the bitmaps that fills changed (deferred from the fills themselves).
    pub(crate) fn save_unsaved(&self) {
        let unsaved = std::mem::take(&mut *self.fills.unsaved.lock().unwrap());
        for o in unsaved.iter().filter_map(std::sync::Weak::upgrade) {
            if let Err(e) = o.save_if_unsaved() {
                tracing::warn!("saving the bitmaps of cached object {:?}: {e}", o.key);
            }
        }
    }
}

/// The fill worker: writes fetched ranges into the cache, off every reader's path. It takes
/// what is queued at once (up to [`MAX_FILL_JOBS`] more than the first) and writes ranges
/// that continue each other in one object (a sequential read and its read-ahead, whose
/// fetches finish in any order) together, up to [`MAX_FILL_BATCH`]: one pass over the
/// object's bits, and one writeback started for the whole run.
pub(crate) fn fill_worker<B: Backend>(inner: &Inner<B>, rx: std::sync::mpsc::Receiver<FillJob>) {
    while let Ok(first) = rx.recv() {
        let mut jobs = vec![first];
        jobs.extend(rx.try_iter().take(MAX_FILL_JOBS));
        jobs.sort_by_key(|j| (j.key, j.start));
        let mut jobs = jobs.into_iter().peekable();
        while let Some(job) = jobs.next() {
            let mut len = job.data.len() as u64;
            let mut run = vec![job];
            while let Some(next) =
                jobs.next_if(|n| len < MAX_FILL_BATCH && continues(run.last().expect("one"), n))
            {
                len += next.data.len() as u64;
                run.push(next);
            }
            fill_one(inner, &run, false);
            for job in run {
                inner.fill_done(job);
            }
        }
    }
}

/// Whether `b` starts where `a` ends, in the same object and fetched under the same bypass
/// count (so they can be filled as one range).
fn continues(a: &FillJob, b: &FillJob) -> bool {
    a.key == b.key && a.bypass == b.bypass && a.start + a.data.len() as u64 == b.start
}

/// Writes fetched ranges that continue each other (`jobs`, in order, in one object) into the
/// cache. With `quick`, only if that needs neither creating the object's files nor evicting
/// (false then, and nothing done): what may block for long is left to the fill thread.
fn fill_one<B: Backend>(inner: &Inner<B>, jobs: &[FillJob], quick: bool) -> bool {
    let job = &jobs[0];
    if inner.fills.bypass_writes.load(Ordering::SeqCst) != job.bypass {
        return true; // a write bypassed the cache meanwhile: this data may be stale
    }
    let parts: Vec<&[u8]> = jobs.iter().map(|j| &j.data[..]).collect();
    let len: u64 = parts.iter().map(|p| p.len() as u64).sum();
    let (b0, b1) = CachedObject::block_range(job.start, len);
    let existing = inner.object_now(job.key, job.object_size, false);
    let missing = match &existing {
        Some(o) => {
            let st = o.state.lock().unwrap();
            (b0..b1).filter(|&b| !st.valid.get(b)).count()
        }
        None => b1 - b0,
    };
    if missing == 0 {
        return true;
    }
    let reserved = missing as u64 * BLOCK;
    let o = if quick {
        // Holding `existing` keeps it from eviction while it is written.
        match existing {
            Some(o) if inner.try_reserve(reserved) => o,
            _ => return false,
        }
    } else {
        drop(existing);
        if !inner.reserve_now(reserved) {
            // Only dirty data is left to evict: these ranges are just not cached.
            Counters::add(&job.counters.skipped_fills, jobs.len() as u64);
            return true;
        }
        // Looked up again: making room may have evicted it.
        match inner.object_now(job.key, job.object_size, true) {
            Some(o) => o,
            None => {
                inner.settle(reserved, 0);
                return true;
            }
        }
    };
    // Checked again once no write can come between: a write that bypassed the cache after
    // the check above has its blocks forgotten after this fill, one before it is seen here.
    let fresh = || inner.fills.bypass_writes.load(Ordering::SeqCst) == job.bypass;
    let (added, newly_unsaved) = write_fill(&o, job.start, &parts, fresh);
    if newly_unsaved {
        inner.fills.unsaved.lock().unwrap().push(o.downgrade());
    }
    inner.settle(reserved, added * BLOCK);
    if added > 0 {
        Counters::add(&job.counters.fills, jobs.len() as u64);
        Counters::add(&job.counters.fill_bytes, added * BLOCK);
    }
    true
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
pub(crate) fn write_fill(
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
