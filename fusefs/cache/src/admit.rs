//! Admission into a full cache: a fetched range may displace cached data only on its second
//! miss within a while (a "ghost" table remembering about as many recent misses as the cache
//! holds blocks),
//! and only when it came back sooner than the data it would displace was last used.
//!
//! While the cache has room, everything fetched is kept. Once it is full, caching every miss
//! would evict as fast as it fills: with reads spread wider than the cache (low hit ratios)
//! each miss would pay for writing data that is evicted before it is read again, and the cache
//! would be slower than no cache. Remembering misses costs a few dozen bytes each and lets
//! ranges that come back in, while one-off reads pass through.
//!
//! A second miss alone is not enough: eviction frees a whole object (many blocks), so a range
//! is kept only when its reuse interval (between its last two misses) is shorter than the time
//! the least recently used object has gone unused. Reads spread evenly over more than the
//! cache keep every cached object in use and are not worth displacing it for (the cache keeps
//! serving what it holds instead of churning); when the reader moves on, what it left behind
//! goes idle and new ranges come in.

use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

use lru::LruCache;

use super::object::{clock_ms, Key, BLOCK};

/// Slots at most (4 MiB, allocated once: about 256 Ki misses remembered).
const MAX_GHOSTS: usize = 512 * 1024;
const MIN_GHOSTS: usize = 1024;

pub(super) struct Admission {
    /// Recent misses, one per slot: a range's miss goes to the slot its hash picks and
    /// replaces what was there, so about as many misses as there are slots in use are
    /// remembered. Each slot holds the upper half of the hash (the tag) and the time of the
    /// miss ([`clock_ms`], lower 32 bits); 0 is empty. No lock: every small miss of a full
    /// cache asks here, from every thread.
    ghosts: Box<[AtomicU64]>,
    /// How many slots are in use, minus one (a power of two minus one).
    mask: AtomicUsize,
    /// Objects long sequential streams passed through, and the stream that did.
    streams: Mutex<LruCache<Key, u64>>,
}

/// Objects whose streams are remembered for a cache of `cache_size` bytes: as many as it has
/// blocks, within bounds.
fn capacity(cache_size: u64) -> NonZeroUsize {
    let n = ((cache_size / BLOCK) as usize).clamp(MIN_GHOSTS, MAX_GHOSTS);
    NonZeroUsize::new(n).expect("at least MIN_GHOSTS")
}

/// Slots in use for a cache of `cache_size` bytes: twice as many as it has blocks (a miss
/// that lands in a taken slot pushes out what was there, so a table remembers fewer misses
/// than it has slots), within bounds, a power of two.
fn slots(cache_size: u64) -> usize {
    ((cache_size / BLOCK) as usize * 2)
        .clamp(MIN_GHOSTS, MAX_GHOSTS)
        .next_power_of_two()
}

/// A 64-bit hash of a block of an object (splitmix64's finalizer; fixed, so tests are
/// deterministic and the cost is a few multiplications).
fn hash(key: Key, block: usize) -> u64 {
    let mut x =
        ((key.0 as u64) << 32 | key.1 as u64) ^ (block as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A slot's value for a miss with hash `h` at `now` (never 0).
fn entry(h: u64, now: u64) -> u64 {
    (h & !0xffff_ffff) | (now & 0xffff_ffff).max(1)
}

impl Admission {
    pub fn new(cache_size: u64) -> Admission {
        Admission {
            ghosts: (0..MAX_GHOSTS).map(|_| AtomicU64::new(0)).collect(),
            mask: AtomicUsize::new(slots(cache_size) - 1),
            streams: Mutex::new(LruCache::new(capacity(cache_size))),
        }
    }

    /// Follows a new cache size.
    pub fn resize(&self, cache_size: u64) {
        self.mask.store(slots(cache_size) - 1, Ordering::Relaxed);
        self.streams.lock().unwrap().resize(capacity(cache_size));
    }

    /// Whether the range fetched from block `block` of object `key` may displace cached data:
    /// true when it missed before, is still remembered, and came back within `idle()`
    /// milliseconds (how long the data it would displace has gone unused; None: nothing to
    /// displace). Otherwise this miss is remembered.
    pub fn admit(&self, key: Key, block: usize, idle: impl FnOnce() -> Option<u64>) -> bool {
        self.admit_at(clock_ms(), key, block, idle)
    }

    /// [`Admission::admit`] at time `now` ([`clock_ms`]): the policy with time given, so tests
    /// choose the intervals instead of sleeping through them.
    fn admit_at(
        &self,
        now: u64,
        key: Key,
        block: usize,
        idle: impl FnOnce() -> Option<u64>,
    ) -> bool {
        let h = hash(key, block);
        let slot = &self.ghosts[h as usize & self.mask.load(Ordering::Relaxed)];
        let seen = slot.swap(entry(h, now), Ordering::Relaxed);
        if seen == 0 || seen >> 32 != h >> 32 {
            return false;
        }
        // Its last miss, as the same lower 32 bits of the clock (wraps after 49 days).
        let interval = (now as u32).wrapping_sub(seen as u32) as u64;
        if idle().is_none_or(|idle| idle >= interval) {
            // Admitted ranges are forgotten (unless another miss took the slot meanwhile).
            let _ = slot.compare_exchange(entry(h, now), 0, Ordering::Relaxed, Ordering::Relaxed);
            return true;
        }
        // Not now: the next miss is measured from this one (already in the slot).
        false
    }

    /// Forgets which objects of VDI `vid` streams passed through, so that the next stream
    /// over them is a first pass again. Its remembered misses stay: like the ghost lists
    /// of ARC, they are there to tell data that comes back once it is gone.
    pub fn forget_streams(&self, vid: u32) {
        let mut streams = self.streams.lock().unwrap();
        let keys: Vec<_> = streams
            .iter()
            .map(|(k, _)| *k)
            .filter(|&(v, _)| v == vid)
            .collect();
        for k in keys {
            streams.pop(&k);
        }
    }

    /// Whether a long sequential stream other than `stream` (an id unique to a stream)
    /// passed through object `key` before, and is still remembered: the misses of a stream
    /// are cached on its second pass. On a first pass, the object is remembered as passed
    /// by `stream`.
    pub fn streamed_before(&self, key: Key, stream: u64) -> bool {
        let mut streams = self.streams.lock().unwrap();
        match streams.get(&key) {
            Some(&by) => by != stream,
            None => {
                streams.put(key, stream);
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOTHING_TO_DISPLACE: fn() -> Option<u64> = || None;

    #[test]
    fn second_miss_is_admitted_once() {
        let a = Admission::new(64 << 20);
        let admit = |k, b| a.admit(k, b, NOTHING_TO_DISPLACE);
        assert!(!admit((1, 2), 3));
        assert!(admit((1, 2), 3));
        // Admitted ranges are forgotten: a third miss starts over.
        assert!(!admit((1, 2), 3));
        assert!(!admit((1, 2), 4));
        assert!(!admit((2, 2), 3));
    }

    #[test]
    fn remembers_about_as_many_misses_as_the_cache_has_blocks() {
        let blocks = 4096;
        let a = Admission::new(blocks as u64 * BLOCK);
        let miss = |b: usize| a.admit((1, (b / 1000) as u32), b % 1000, NOTHING_TO_DISPLACE);
        // As many misses as the cache has blocks: most are remembered at their second miss.
        assert!((0..blocks).all(|b| !miss(b)));
        let back = (0..blocks).filter(|&b| miss(b)).count();
        assert!(back > blocks / 2, "{back} of {blocks} remembered");
        // After sixteen times as many other misses, hardly any.
        assert!((0..blocks).all(|b| !miss(b)));
        for b in blocks..17 * blocks {
            miss(b);
        }
        let back = (0..blocks).filter(|&b| miss(b)).count();
        assert!(back < blocks / 100, "{back} of {blocks} still remembered");
    }

    #[test]
    fn displaces_only_data_idle_longer_than_the_reuse_interval() {
        let a = Admission::new(64 << 20);
        let t = 1_000_000;
        assert!(!a.admit_at(t, (1, 0), 0, || panic!("no victim asked on a first miss")));
        // Back 30 ms later; the victim was used 5 ms ago: kept out, remembered again.
        assert!(!a.admit_at(t + 30, (1, 0), 0, || Some(5)));
        // Back 2 ms after that; the victim is idle for 10 ms, longer: admitted.
        assert!(a.admit_at(t + 32, (1, 0), 0, || Some(10)));
        // Exactly as long as the interval is enough.
        assert!(!a.admit_at(t + 40, (1, 0), 1, NOTHING_TO_DISPLACE));
        assert!(a.admit_at(t + 47, (1, 0), 1, || Some(7)));
        // A victim idle for longer than the interval, at a second miss after a pause.
        assert!(!a.admit_at(t + 100, (1, 0), 2, NOTHING_TO_DISPLACE));
        assert!(a.admit_at(t + 120, (1, 0), 2, || Some(60_000)));
        // The real clock goes through the same policy.
        assert!(!a.admit((1, 0), 3, NOTHING_TO_DISPLACE));
        assert!(a.admit((1, 0), 3, || Some(60_000)));
    }

    #[test]
    fn a_stream_is_let_in_on_its_second_pass() {
        let a = Admission::new(64 << 20);
        // The first pass: none of its misses of an object, first or later.
        assert!(!a.streamed_before((1, 0), 7));
        assert!(!a.streamed_before((1, 0), 7));
        assert!(!a.streamed_before((1, 1), 7));
        // A second stream: every miss of an object the first one passed.
        assert!(a.streamed_before((1, 0), 8));
        assert!(a.streamed_before((1, 0), 8));
        assert!(!a.streamed_before((2, 0), 8));
        // Block misses of the object are remembered apart from its stream mark.
        assert!(!a.admit((1, 1), 0, NOTHING_TO_DISPLACE));
        assert!(a.streamed_before((1, 1), 9));
        // Forgetting a VDI's streams forgets no other VDI's, and none of its misses.
        assert!(!a.admit((1, 3), 0, NOTHING_TO_DISPLACE));
        a.forget_streams(1);
        assert!(!a.streamed_before((1, 0), 10));
        assert!(a.streamed_before((2, 0), 10));
        assert!(a.admit((1, 3), 0, NOTHING_TO_DISPLACE));
    }

    #[test]
    fn capacity_is_bounded() {
        assert_eq!(capacity(0).get(), MIN_GHOSTS);
        assert_eq!(capacity(1 << 50).get(), MAX_GHOSTS);
        let a = Admission::new(1 << 30);
        a.resize(16 << 20);
        assert_eq!(a.mask.load(Ordering::Relaxed), 8191);
        assert_eq!(slots(5000 * BLOCK), 16384);
        assert_eq!(slots(0), MIN_GHOSTS);
        assert_eq!(slots(1 << 50), MAX_GHOSTS);
    }
}
