//! A VDI seen through the cache: reads served from cached blocks or fetched by the range they
//! need, writes kept (writeback) or passed on (writethrough), per the VDI's mode.
//!
//! - [`read`]: hits, misses, fetches in flight.
//! - [`write`]: writes, per mode, and discards.
//! - [`through`]: writes sent to the cluster past the cache (a full cache, an unmount).

mod read;
mod through;
mod write;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cache_control::CacheMode;
use objstore_client::Volume;

use crate::object::{CachedObject, Key};
use crate::space::Pinned;
use crate::stats::{Counters, ModeCell};
use crate::{Backend, CacheError, Inner};
use read::InflightMap;

/// What [`CachedVdi::read_hit`] found of a read it could not serve from the cache: for a
/// read within one object, its index and the object if cached.
#[derive(Default)]
pub struct Missed(Option<(u32, Option<Pinned>)>);

pub struct CachedVdi<B: Backend = Arc<objstore_client::Client>> {
    inner: Arc<Inner<B>>,
    vdi: Arc<B::Volume>,
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

/// A failed read or write of the cache's files of object `key`.
fn io_err(what: &'static str, key: Key) -> impl FnOnce(std::io::Error) -> CacheError {
    move |source| CacheError::Io { what, key, source }
}

impl<B: Backend> CachedVdi<B> {
    /// Checks blocks `[b0, b1)` of `o` if they were not checked since the cache was loaded
    /// from disk ([`crate::sums`]; nothing to do otherwise): corrupt clean blocks are dropped
    /// (read as misses then), and a range holding a quarantined block fails with EIO.
    pub(super) fn check_blocks(
        &self,
        o: &CachedObject,
        b0: usize,
        b1: usize,
    ) -> Result<(), CacheError> {
        if !o.state.lock().unwrap().needs_check(b0, b1) {
            return Ok(());
        }
        let v = o.verify(b0, b1);
        self.inner.corrupt_found(&self.counters, &v);
        if v.refused {
            return Err(CacheError::Io {
                what: "a cached block holding unpushed writes is corrupt (quarantined)",
                key: o.key,
                source: std::io::Error::from_raw_os_error(libc::EIO),
            });
        }
        Ok(())
    }

    pub(super) fn new(inner: Arc<Inner<B>>, vdi: Arc<B::Volume>) -> CachedVdi<B> {
        let vid = vdi.vid().0;
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
    pub(super) fn gated(inner: Arc<Inner<B>>, vdi: Arc<B::Volume>) -> CachedVdi<B> {
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
        self.inner.pushes.unflushed.store(true, Ordering::SeqCst);
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

    pub fn vdi(&self) -> &Arc<B::Volume> {
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

    /// Makes object `idx` the most recently used.
    fn promote(&self, idx: u32) {
        self.inner
            .space
            .objects
            .lock()
            .unwrap()
            .promote(&(self.vid(), idx));
    }

    /// The cached object holding `idx`, without touching its LRU position.
    fn peek(&self, idx: u32) -> Option<Pinned> {
        let objects = self.inner.space.objects.lock().unwrap();
        objects
            .peek(&(self.vid(), idx))
            .map(|o| self.inner.space.pin(o))
    }

    /// Runs a change that reaches the cluster without going through the cache. The counter
    /// moves before and after it, so no fetch that overlapped it is cached or joined.
    async fn bypassing<T>(&self, change: impl std::future::Future<Output = T>) -> T {
        self.inner
            .fills
            .bypass_writes
            .fetch_add(1, Ordering::SeqCst);
        let r = change.await;
        self.inner
            .fills
            .bypass_writes
            .fetch_add(1, Ordering::SeqCst);
        r
    }

    /// Fails once this mount lost the VDI's lock (another attachment came: see
    /// [`crate::attach`]): what this handle would write or read may be out of date.
    pub(crate) fn check_lock(&self) -> Result<(), CacheError> {
        match self.inner.attach.lost(self.vid()) {
            Some(name) => Err(CacheError::LockLost { name }),
            None => Ok(()),
        }
    }

    /// fsync: this VDI's dirty data to the cluster, flushed there.
    pub async fn flush(&self) -> Result<(), CacheError> {
        self.pass_gate().await;
        self.check_lock()?;
        if self.mode() == CacheMode::Writeback {
            let vid = self.vid();
            self.inner
                .flush(Some(vid), |_, _| {})
                .await
                .map_err(|source| CacheError::Push {
                    name: self.vdi.name(),
                    source,
                })?;
            return Ok(());
        }
        Ok(self.vdi.flush().await?)
    }
}
