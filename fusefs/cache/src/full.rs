//! A full cache: what a writeback write does when the cache cannot take it.
//!
//! The cache cannot grow when its size bound is reached and nothing can be evicted or pushed
//! in time ([`Inner::reserve`] gives up), or when the file system under it refuses to
//! (`ENOSPC`, `EDQUOT`) although the bound is not reached. A write is never failed for that:
//! - on a full disk, clean objects are evicted first, and when only dirty ones are left the
//!   least recently used is pushed and then evicted ([`Inner::free_disk`]); the write then
//!   tries the cache again, once;
//! - if that does not help, the write goes straight to the cluster (and fails only if the
//!   cluster does). Its bytes are also written into the blocks of its range that are
//!   cached, which become dirty ([`CachedVdi::write_through_full`]), so that no read or push
//!   of this cache ever puts older bytes over it.
//!
//! Each such write counts in the VDI's `full_writethroughs` and `full_writethrough_bytes`;
//! the first of an episode is logged, and so is its end: the first write the cache takes
//! once none went to the cluster for [`EPISODE_END`].

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::object::clock_ms;
use crate::stats::Counters;
use crate::{chain, Backend, Inner};

/// How long after the last write sent to the cluster a write the cache takes ends the
/// episode (and the next write sent to the cluster is logged again).
const EPISODE_END: Duration = Duration::from_secs(10);

/// Whether a failed write into the cache's files means its disk is full.
pub(crate) fn disk_full(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
}

impl<B: Backend> Inner<B> {
    /// The cache's disk is full: frees the files of one object, a clean one if there is
    /// one, else the least recently used dirty one once it is pushed. False if nothing could
    /// be freed (everything in use, or the push failed).
    pub(crate) async fn free_disk(&self) -> bool {
        if self.evict_one() {
            return true;
        }
        let Some(o) = self.oldest_dirty() else {
            return false;
        };
        if let Err(e) = self.push_object(&o).await {
            self.push_failed(chain(&e));
            return false;
        }
        drop(o);
        self.evict_one()
    }

    /// A writeback write of `bytes` went to the cluster because the cache could not take it
    /// (`why`): counted, and logged if it starts an episode.
    pub(crate) fn wrote_through_full(&self, counters: &Counters, bytes: u64, why: &str) {
        Counters::add(&counters.full_writethroughs, 1);
        Counters::add(&counters.full_writethrough_bytes, bytes);
        if self.stats.full_at.swap(clock_ms(), Ordering::SeqCst) == 0 {
            tracing::warn!(
                "cache {} is full ({why}): writes it cannot take go straight to the cluster until it has room",
                self.cfg.dir.display()
            );
        }
    }

    /// A write was taken by the cache: ends an episode of [`Inner::wrote_through_full`] once
    /// no write went to the cluster for [`EPISODE_END`] (a cache that is just full takes
    /// some writes and not others: each pushed and evicted object makes room for a few).
    pub(crate) fn cache_took_write(&self) {
        let last = self.stats.full_at.load(Ordering::Relaxed);
        if last == 0 || clock_ms().saturating_sub(last) < EPISODE_END.as_millis() as u64 {
            return;
        }
        if (self.stats.full_at)
            .compare_exchange(last, 0, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            tracing::info!(
                "cache {} has room again: writes are cached again",
                self.cfg.dir.display()
            );
        }
    }
}
