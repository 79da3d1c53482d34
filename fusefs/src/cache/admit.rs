//! Admission into a full cache: a fetched range may displace cached data only on its second
//! miss within a while (a "ghost" list of recent misses as long as the cache holds blocks).
//!
//! While the cache has room, everything fetched is kept. Once it is full, caching every miss
//! would evict as fast as it fills: with reads spread wider than the cache (low hit ratios)
//! each miss would pay for writing data that is evicted before it is read again, and the cache
//! would be slower than no cache. Remembering misses costs a few dozen bytes each and lets
//! ranges that come back in, while one-off reads pass through.

use std::num::NonZeroUsize;
use std::sync::Mutex;

use lru::LruCache;

use super::object::{Key, BLOCK};

/// Ghost entries kept at most (about 16 MiB of memory).
const MAX_GHOSTS: usize = 256 * 1024;
const MIN_GHOSTS: usize = 1024;

pub(super) struct Admission {
    ghosts: Mutex<LruCache<(Key, usize), ()>>,
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
    /// true when it missed before and is still remembered; otherwise it is remembered now.
    pub fn admit(&self, key: Key, block: usize) -> bool {
        let mut ghosts = self.ghosts.lock().unwrap();
        if ghosts.pop(&(key, block)).is_some() {
            return true;
        }
        ghosts.put((key, block), ());
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_miss_is_admitted_once() {
        let a = Admission::new(64 << 20);
        assert!(!a.admit((1, 2), 3));
        assert!(a.admit((1, 2), 3));
        // Admitted ranges are forgotten: a third miss starts over.
        assert!(!a.admit((1, 2), 3));
        assert!(!a.admit((1, 2), 4));
        assert!(!a.admit((2, 2), 3));
    }

    #[test]
    fn remembers_as_many_misses_as_the_cache_has_blocks() {
        let a = Admission::new(MIN_GHOSTS as u64 * BLOCK);
        for b in 0..=MIN_GHOSTS {
            assert!(!a.admit((1, 0), b));
        }
        // The oldest miss was pushed out, the newest is remembered.
        assert!(!a.admit((1, 0), 0));
        assert!(a.admit((1, 0), MIN_GHOSTS));
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
