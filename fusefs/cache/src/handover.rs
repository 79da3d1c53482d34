//! Handing an attached VDI's lock over to another mount that asked for it (sheepfs
//! `--lock-mode cooperative`, as RBD's exclusive lock does). The holder's side:
//!
//! 1. The caller (sheepfs) keeps the VDI's requests out: those in flight finish, new ones
//!    wait, and after the hand-over they go straight to the cluster.
//! 2. Every dirty block of the VDI is pushed and the cluster flushed, its map entries
//!    included ([`Cache::give_lock`]), so the mount that takes the lock reads every write
//!    acknowledged here.
//! 3. The VDI is detached (no push of it starts, one under way is waited for) and fetches in
//!    flight are made stale (they are never cached).
//! 4. The lock is released; the asker takes it with a new generation. A later write here
//!    asks for it back, and attaching again finds the generation moved on.
//! 5. Every cached block of the VDI is dropped (after the release, so the asker does not
//!    wait for the files to go): this cache then holds nothing of the VDI, so it can serve no
//!    block that the other mount's writes made stale. Until then nothing is served from them
//!    either: the VDI is detached and the caller's handles of it go to the cluster.
//!
//! If any step fails the lock stays here, attached, with what is still cached (a failed push
//! keeps its dirty data): the asker waits and the request is answered at the next look.

use std::sync::atomic::Ordering;
use std::time::Duration;

use objstore_client::Volume;

use crate::stats::Counters;
use crate::{Backend, Cache, CacheError};

/// A lock this cache holds: VDI `name` (id `vid`) at generation `gen`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldLock {
    pub name: String,
    pub vid: u32,
    pub gen: u64,
}

/// Who this cache is to the cluster's locks, for taking one that another mount hands over.
#[derive(Debug, Clone)]
pub struct LockIdentity {
    pub owner: String,
    pub host: String,
    pub ttl: Duration,
    /// The mount's control socket, recorded in the lock.
    pub control: Option<String>,
}

/// What [`Cache::give_lock`] did.
#[derive(Debug, Clone, Copy, Default)]
pub struct Given {
    /// Dirty bytes pushed to the cluster first.
    pub pushed: u64,
    /// Cached bytes of the VDI dropped.
    pub dropped: u64,
}

impl<B: Backend> Cache<B> {
    /// The locks this cache holds (its attached VDIs that are not lost).
    pub fn held_locks(&self) -> Vec<HeldLock> {
        let inner = &self.inner;
        let attached: Vec<u32> = (inner.attach.attached.lock().unwrap().keys())
            .copied()
            .collect();
        let held = inner.attach.held.lock().unwrap();
        attached
            .into_iter()
            .filter_map(|vid| {
                held.get(&vid).map(|i| HeldLock {
                    name: i.vdi.clone(),
                    vid,
                    gen: i.gen,
                })
            })
            .collect()
    }

    pub fn lock_identity(&self) -> LockIdentity {
        let a = &self.inner.attach;
        LockIdentity {
            owner: a.owner.clone(),
            host: a.host.clone(),
            ttl: self.inner.cfg.lock_ttl,
            control: a.control.clone(),
        }
    }

    /// Counts a lock of VDI `vid` taken over from another mount (`cachectl stats`).
    pub fn count_taken(&self, vid: u32) {
        Counters::add(&self.inner.counters(vid).handovers_taken, 1);
    }

    /// Gives VDI `name`'s lock, held here at generation `gen`, to the mount that asked for
    /// it (see the module doc; the caller keeps the VDI's requests out). None if this cache
    /// does not hold it at that generation (nothing done).
    pub async fn give_lock(&self, name: &str, gen: u64) -> Result<Option<Given>, CacheError> {
        let inner = &self.inner;
        let Some(vid) = self
            .held_locks()
            .into_iter()
            .find(|h| h.name == name && h.gen == gen)
        else {
            return Ok(None);
        };
        let vid = vid.vid;
        let (pushed, _pushes) = inner
            .flush_to_let_go(vid, name, "hand its lock over")
            .await?;
        if let Some(vol) = inner.attached_volume(vid) {
            // Writes that went past the cache (mode writethrough or off, a full cache) and
            // every map entry: durable before the other mount reads.
            vol.flush().await?;
        }
        let round = inner.attach.renewing.lock().await;
        let detached = inner.detach_quiet(vid).await;
        // A fetch that started before this is not cached when it lands.
        inner.fills.bypass_writes.fetch_add(1, Ordering::SeqCst);
        if let Err(e) = inner.client.release(name, &inner.attach.owner).await {
            if let Some(v) = detached {
                inner.attach.attached.lock().unwrap().insert(vid, v);
            }
            return Err(e.into());
        }
        inner.attach.unheld(vid);
        drop(round);
        // Dropped once the lock is released, not before: the asker need not wait for the
        // files to go. Nothing is served from them meanwhile (the VDI is detached, the
        // caller's handles of it go to the cluster), and attaching again drops what is left.
        let dropped = inner.drop_all_clean(vid).await;
        let rec = inner.dir.records.read().unwrap().get(&vid).cloned();
        if let Some(mut r) = rec {
            r.released = true;
            inner.save_record(&r);
        }
        Counters::add(&inner.counters(vid).handovers_given, 1);
        Ok(Some(Given { pushed, dropped }))
    }

    /// VDI `vid`'s lock was lost (its lease ended while this mount was cut off or stopped,
    /// and another mount took it): in cooperative mode that is a hand-over without a
    /// request, so the VDI is no longer failed here once what this cache held of it is
    /// dropped: nothing of it is served from here until it is attached again, at a new
    /// generation. Refused (its dirty bytes returned) while it holds writes never pushed:
    /// the other mount may have written over them, and only an operator can decide (they
    /// stay, and the VDI stays failed, as in exclusive mode). Returns the bytes dropped.
    pub fn forget_lost(&self, vid: u32) -> Result<u64, u64> {
        let inner = &self.inner;
        let dirty = inner.dirty_of(vid);
        if dirty > 0 {
            return Err(dirty);
        }
        {
            let mut lost = inner.attach.lost.lock().unwrap();
            lost.remove(&vid);
            if lost.is_empty() {
                inner.attach.any_lost.store(false, Ordering::Release);
            }
        }
        // A fetch that started before this is not cached when it lands.
        inner.fills.bypass_writes.fetch_add(1, Ordering::SeqCst);
        Ok(inner.drop_vdi(vid, false))
    }
}

/// How often a snapshot or a hand-over flushes again when writes came in while it flushed
/// (the caller keeps writes out, so once is the rule).
const FLUSH_ROUNDS: usize = 3;

impl<B: Backend> crate::Inner<B> {
    /// Pushes every dirty block of `vid` and flushes the cluster, then takes the push lock
    /// (returned: no push starts while it is held) once nothing of `vid` is dirty. `why`
    /// says what for, in the error if writes keep coming.
    pub(crate) async fn flush_to_let_go(
        &self,
        vid: u32,
        name: &str,
        why: &str,
    ) -> Result<(u64, tokio::sync::MutexGuard<'_, ()>), CacheError> {
        let mut flushed = 0;
        for _ in 0..FLUSH_ROUNDS {
            let push = self.flush(Some(vid), |_, _| {}).await;
            flushed += push.map_err(|source| CacheError::Push {
                name: name.to_string(),
                source,
            })?;
            let pushes = self.pushes.push_lock.lock().await;
            if self.dirty_of(vid) == 0 {
                return Ok((flushed, pushes));
            }
        }
        Err(CacheError::Vdi(objstore_client::VdiError::Unavailable {
            name: name.to_string(),
            reason: format!(
                "writes kept coming while its cache was flushed to {why}; nothing was done"
            ),
        }))
    }

    /// Drops every cached block of `vid`, waiting (a while) for fills that pin objects of it;
    /// returns the bytes dropped. Dirty data is kept (the caller pushed it).
    async fn drop_all_clean(&self, vid: u32) -> u64 {
        let mut dropped = self.drop_vdi(vid, false);
        for _ in 0..200 {
            if !self.holds_any(vid) {
                return dropped;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
            dropped += self.drop_vdi(vid, false);
        }
        tracing::warn!(
            "VDI {vid:x}: cached objects still in use after its lock was handed over; they are dropped when it is attached again (a new generation)"
        );
        dropped
    }

    /// Whether any object of `vid` is cached.
    fn holds_any(&self, vid: u32) -> bool {
        (self.space.objects.lock().unwrap().iter()).any(|(k, _)| k.0 == vid)
    }
}
