//! Counters per VDI and the VDIs' modes, as `cachectl stats` reports them and as every
//! request reads them (one atomic per VDI, not the records' lock).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cache_control::{CacheMode, CacheStats, VdiStats};

use crate::{Backend, Inner};

/// Counters and mode cells of the VDIs this cache has seen.
#[derive(Default)]
pub(crate) struct Stats {
    pub(crate) counters: Mutex<HashMap<u32, Arc<Counters>>>,
    /// The modes of VDIs with handles, as their requests read them ([`Inner::mode_cell`]).
    pub(crate) mode_cells: Mutex<HashMap<u32, Arc<ModeCell>>>,
    /// When a writeback write last went straight to the cluster because the cache was full
    /// ([`crate::object::clock_ms`]; 0: not in such an episode, see [`crate::full`]).
    pub(crate) full_at: AtomicU64,
}

#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) hits: AtomicU64,
    pub(crate) hit_bytes: AtomicU64,
    pub(crate) misses: AtomicU64,
    pub(crate) miss_bytes: AtomicU64,
    pub(crate) fills: AtomicU64,
    pub(crate) fill_bytes: AtomicU64,
    pub(crate) evictions: AtomicU64,
    pub(crate) evicted_bytes: AtomicU64,
    pub(crate) skipped_fills: AtomicU64,
    pub(crate) busy_skipped_fills: AtomicU64,
    pub(crate) stream_bypasses: AtomicU64,
    pub(crate) pushed_bytes: AtomicU64,
    pub(crate) full_writethroughs: AtomicU64,
    pub(crate) full_writethrough_bytes: AtomicU64,
    /// Cached blocks found corrupt after a restart ([`crate::sums`]).
    pub(crate) corrupt_blocks: AtomicU64,
    /// Locks handed over to another mount, and taken over from one ([`crate::handover`]).
    pub(crate) handovers_given: AtomicU64,
    pub(crate) handovers_taken: AtomicU64,
}

impl Counters {
    pub(crate) fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }
}

/// A VDI's mode in one atomic ([`Inner::mode_cell`]).
pub(crate) struct ModeCell(std::sync::atomic::AtomicU8);

impl ModeCell {
    pub(crate) fn new(mode: CacheMode) -> ModeCell {
        ModeCell(std::sync::atomic::AtomicU8::new(mode as u8))
    }

    pub(crate) fn set(&self, mode: CacheMode) {
        self.0.store(mode as u8, Ordering::SeqCst);
    }

    pub(crate) fn get(&self) -> CacheMode {
        match self.0.load(Ordering::SeqCst) {
            m if m == CacheMode::Writeback as u8 => CacheMode::Writeback,
            m if m == CacheMode::Writethrough as u8 => CacheMode::Writethrough,
            _ => CacheMode::Off,
        }
    }
}

impl<B: Backend> Inner<B> {
    pub(crate) fn counters(&self, vid: u32) -> Arc<Counters> {
        self.stats
            .counters
            .lock()
            .unwrap()
            .entry(vid)
            .or_default()
            .clone()
    }

    pub(crate) fn mode_of(&self, vid: u32) -> CacheMode {
        self.dir
            .records
            .read()
            .unwrap()
            .get(&vid)
            .and_then(|r| r.mode)
            .unwrap_or(self.cfg.mode)
    }

    /// VDI `vid`'s mode as one atomic that follows [`Inner::mode_of`]: what a request
    /// reads, instead of the records' lock, which every core's requests would pass.
    pub(crate) fn mode_cell(&self, vid: u32) -> Arc<ModeCell> {
        // Read under the cells' lock, which `save_record` takes after changing the record:
        // a mode changed meanwhile is in the record read here, or stored in the cell there.
        let mut cells = self.stats.mode_cells.lock().unwrap();
        cells
            .entry(vid)
            .or_insert_with(|| Arc::new(ModeCell::new(self.mode_of(vid))))
            .clone()
    }

    pub(crate) fn stats(&self) -> CacheStats {
        let mut per: HashMap<u32, VdiStats> = HashMap::new();
        let mut oldest_dirty = std::time::Duration::ZERO;
        for (k, o) in self.space.objects.lock().unwrap().iter() {
            let st = o.state.lock().unwrap();
            if let Some(t) = st.dirty_since {
                oldest_dirty = oldest_dirty.max(t.elapsed());
            }
            let e = per.entry(k.0).or_default();
            e.used += o.bytes_of(st.valid.count());
            e.dirty += o.bytes_of(st.dirty.count());
        }
        for (vid, c) in self.stats.counters.lock().unwrap().iter() {
            let e = per.entry(*vid).or_default();
            let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
            e.hits = g(&c.hits);
            e.hit_bytes = g(&c.hit_bytes);
            e.misses = g(&c.misses);
            e.miss_bytes = g(&c.miss_bytes);
            e.fills = g(&c.fills);
            e.fill_bytes = g(&c.fill_bytes);
            e.evictions = g(&c.evictions);
            e.evicted_bytes = g(&c.evicted_bytes);
            e.skipped_fills = g(&c.skipped_fills);
            e.busy_skipped_fills = g(&c.busy_skipped_fills);
            e.stream_bypasses = g(&c.stream_bypasses);
            e.pushed_bytes = g(&c.pushed_bytes);
            e.full_writethroughs = g(&c.full_writethroughs);
            e.full_writethrough_bytes = g(&c.full_writethrough_bytes);
            e.corrupt_blocks = g(&c.corrupt_blocks);
            e.handovers_given = g(&c.handovers_given);
            e.handovers_taken = g(&c.handovers_taken);
        }
        let records = self.dir.records.read().unwrap();
        let mut vdis: Vec<VdiStats> = per
            .into_iter()
            .map(|(vid, mut s)| {
                s.name = records
                    .get(&vid)
                    .map(|r| r.name.clone())
                    .unwrap_or(format!("{vid:x}"));
                s.mode = Some(
                    records
                        .get(&vid)
                        .and_then(|r| r.mode)
                        .unwrap_or(self.cfg.mode),
                );
                s
            })
            .collect();
        vdis.sort_by(|a, b| a.name.cmp(&b.name));
        let mut total = VdiStats {
            name: "total".into(),
            ..Default::default()
        };
        for v in &vdis {
            total.used += v.used;
            total.dirty += v.dirty;
            total.hits += v.hits;
            total.hit_bytes += v.hit_bytes;
            total.misses += v.misses;
            total.miss_bytes += v.miss_bytes;
            total.fills += v.fills;
            total.fill_bytes += v.fill_bytes;
            total.evictions += v.evictions;
            total.evicted_bytes += v.evicted_bytes;
            total.skipped_fills += v.skipped_fills;
            total.busy_skipped_fills += v.busy_skipped_fills;
            total.stream_bypasses += v.stream_bypasses;
            total.pushed_bytes += v.pushed_bytes;
            total.full_writethroughs += v.full_writethroughs;
            total.full_writethrough_bytes += v.full_writethrough_bytes;
            total.corrupt_blocks += v.corrupt_blocks;
            total.handovers_given += v.handovers_given;
            total.handovers_taken += v.handovers_taken;
        }
        let dirty = self.space.dirty.load(Ordering::SeqCst);
        CacheStats {
            dir: self.cfg.dir.display().to_string(),
            size: self.space.size.load(Ordering::SeqCst),
            used: self.space.used.load(Ordering::SeqCst),
            dirty,
            flush_backlog: dirty,
            fill_backlog: self.fills.fills_queued.load(Ordering::SeqCst),
            max_dirty: self.cfg.max_dirty,
            max_dirty_age_secs: self.cfg.max_dirty_age.as_secs(),
            sequential_cutoff: self.cfg.sequential_cutoff,
            fills_limited: self.fills.cpu.busy(),
            default_mode: Some(self.cfg.mode),
            push_errors: self.pushes.push_errors.load(Ordering::Relaxed),
            last_push_error: self.pushes.last_push_error.lock().unwrap().clone(),
            push_retries: self.pushes.push_retries.load(Ordering::Relaxed),
            oldest_dirty_ms: oldest_dirty.as_millis() as u64,
            total,
            vdis,
        }
    }
}
