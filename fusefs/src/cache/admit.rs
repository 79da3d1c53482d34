//! Admission into a full cache: a fetched range may displace cached data only on its second
//! miss within a while (a "ghost" list of recent misses as long as the cache holds blocks),
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
use std::sync::Mutex;

use lru::LruCache;

use super::object::{clock_ms, Key, BLOCK};

/// Ghost entries kept at most (about 16 MiB of memory).
const MAX_GHOSTS: usize = 256 * 1024;
const MIN_GHOSTS: usize = 1024;

pub(super) struct Admission {
    /// Recent misses and when they happened ([`clock_ms`]).
    ghosts: Mutex<LruCache<(Key, usize), u64>>,
}

fn capacity(cache_size: u64) -> NonZeroUsize {
    let n = ((cache_size / BLOCK) as usize).clamp(MIN_GHOSTS, MAX_GHOSTS);
    NonZeroUsize::new(n).expect("at least MIN_GHOSTS")
}

impl Admission {
    pub fn new(cache_size: u64) -> Admission {
        Admission {
            ghosts: Mutex::new(LruCache::new(capacity(cache_size))),
        }
    }

    /// Follows a new cache size.
    pub fn resize(&self, cache_size: u64) {
        self.ghosts.lock().unwrap().resize(capacity(cache_size));
    }

    /// Whether the range fetched from block `block` of object `key` may displace cached data:
    /// true when it missed before, is still remembered, and came back within `idle()`
    /// milliseconds (how long the data it would displace has gone unused; None: nothing to
    /// displace). Otherwise this miss is remembered.
    pub fn admit(&self, key: Key, block: usize, idle: impl FnOnce() -> Option<u64>) -> bool {
        let now = clock_ms();
        let mut ghosts = self.ghosts.lock().unwrap();
        let Some(missed_at) = ghosts.pop(&(key, block)) else {
            ghosts.put((key, block), now);
            return false;
        };
        drop(ghosts);
        if idle().is_none_or(|idle| idle >= now.saturating_sub(missed_at)) {
            return true;
        }
        // Not now: the next miss is measured from this one.
        self.ghosts.lock().unwrap().put((key, block), now);
        false
    }

    /// Forgets which objects of VDI `vid` streams passed through, so that the next stream
    /// over them is a first pass again. Its remembered misses stay: like the ghost lists
    /// of ARC, they are there to tell data that comes back once it is gone.
    pub fn forget_streams(&self, vid: u32) {
        let mut ghosts = self.ghosts.lock().unwrap();
        let keys: Vec<_> = ghosts
            .iter()
            .map(|(k, _)| *k)
            .filter(|&((v, _), b)| v == vid && b == STREAM)
            .collect();
        for k in keys {
            ghosts.pop(&k);
        }
    }

    /// Whether a long sequential stream other than `stream` (an id unique to a stream)
    /// passed through object `key` before, and is still remembered among the misses: the
    /// misses of a stream are cached on its second pass. On a first pass, the object is
    /// remembered as passed by `stream`.
    pub fn streamed_before(&self, key: Key, stream: u64) -> bool {
        let mut ghosts = self.ghosts.lock().unwrap();
        match ghosts.get(&(key, STREAM)) {
            Some(&by) => by != stream,
            None => {
                ghosts.put((key, STREAM), stream);
                false
            }
        }
    }
}

/// The ghost "block" that marks an object a stream passed through (no block has this index);
/// its value is the stream's id, where block entries hold the time of their miss.
const STREAM: usize = usize::MAX;

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
    fn remembers_as_many_misses_as_the_cache_has_blocks() {
        let a = Admission::new(MIN_GHOSTS as u64 * BLOCK);
        for b in 0..=MIN_GHOSTS {
            assert!(!a.admit((1, 0), b, NOTHING_TO_DISPLACE));
        }
        // The oldest miss was pushed out, the newest is remembered.
        assert!(!a.admit((1, 0), 0, NOTHING_TO_DISPLACE));
        assert!(a.admit((1, 0), MIN_GHOSTS, NOTHING_TO_DISPLACE));
    }

    #[test]
    fn displaces_only_data_idle_longer_than_the_reuse_interval() {
        let a = Admission::new(64 << 20);
        assert!(!a.admit((1, 0), 0, || panic!("no victim asked on a first miss")));
        std::thread::sleep(std::time::Duration::from_millis(30));
        // Came back after >= 30 ms; the victim was used 5 ms ago: kept out, remembered again.
        assert!(!a.admit((1, 0), 0, || Some(5)));
        // Back at once now; the victim is idle for longer: admitted.
        assert!(a.admit((1, 0), 0, || Some(10)));
        // A victim idle for longer than the interval, at a second miss after a pause.
        assert!(!a.admit((1, 0), 1, NOTHING_TO_DISPLACE));
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(a.admit((1, 0), 1, || Some(60_000)));
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
        assert_eq!(a.ghosts.lock().unwrap().cap().get(), 4096);
    }
}
