//! Cooperative lock hand-over on a mount with a cache (`--lock-mode cooperative`, the
//! default). The cache holds the lock of every VDI it attached; a VDI stays attached after
//! its files close, until the unmount or until another mount asks for it.
//!
//! ```text
//!  holder (this mount, asked)                    asker (another mount)
//!  sees lock-req/<vdi> at its generation         write on a file whose lock is away:
//!  opens wait; the VDI's requests finish,        lock::acquire_handed_over (asks, waits)
//!  new ones wait (OpenVdi::gate)
//!  Cache::give_lock: push dirty blocks, flush,
//!  detach, drop every cached block, release ──▶  takes it (new generation), reads the
//!  open file goes on straight to the cluster      inode afresh, attaches it in its cache
//!  (reads read their map entries afresh)          (same owner), the write goes on; the
//!  its next write asks for the lock back          file's later requests go through the
//!                                                 cache once this write is done
//! ```
//!
//! No stale block: the holder drops what it cached before it lets go, and a mount serves a
//! cached block only while it holds the lock (a VDI it does not hold is read straight from
//! the cluster); attaching again at a new generation drops whatever was left.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use objcache::{chain, Cache, CacheError};
use objstore_client::lock::{self, LockError};
use objstore_client::{Client, Vdi};

use crate::handles::{hand_over, Disk, InUse, Shared};
use crate::locks::{asked_of, Asked, Away};

/// What to do after a request failed: see [`Shared::again`].
pub(crate) enum Again {
    /// Make it again on this handle.
    Retry(InUse),
    /// Its error stands (the handle it failed on).
    Stands(InUse),
    /// The file was closed meanwhile.
    Gone(fuser::Errno),
}

/// The hand-over side of a mount with a cache in cooperative mode.
pub(crate) struct CacheLocks {
    cache: Cache,
    client: Arc<Client>,
    /// `--handover-timeout`.
    handover_timeout: Duration,
    /// VDIs open here whose lock another mount has.
    pub(crate) away: Away,
}

impl CacheLocks {
    pub(crate) fn new(cache: Cache, client: Arc<Client>, handover_timeout: Duration) -> Self {
        CacheLocks {
            cache,
            client,
            handover_timeout,
            away: Away::default(),
        }
    }

    /// The hand-overs other mounts ask this one for (see [`asked_of`]).
    pub(crate) async fn asked(&self) -> Result<Vec<Asked>, LockError> {
        let mine: HashMap<String, (u32, u64)> = (self.cache.held_locks().into_iter())
            .map(|h| (h.name, (h.vid, h.gen)))
            .collect();
        asked_of(&self.client, &self.cache.lock_identity().owner, &mine).await
    }
}

impl Shared {
    /// Before a write of plain handle `v` on a mount with a cache: if another mount holds
    /// the VDI's lock, asks for it and waits until it is handed over, reads the inode afresh
    /// and attaches the VDI in the cache; the open file's later requests go through the
    /// cache once this one and the others in flight on `v` are done.
    pub(crate) async fn take_cached_lock(
        &self,
        cl: &CacheLocks,
        v: &Vdi,
    ) -> Result<(), CacheError> {
        let h = v.header();
        let (name, vid) = (h.name, h.vid.0);
        if !cl.away.contains(vid) {
            return Ok(());
        }
        let _one = cl.away.one_taker(vid).await;
        if !cl.away.contains(vid) {
            return Ok(());
        }
        let start = Instant::now();
        let id = cl.cache.lock_identity();
        let taken = lock::handover::acquire_handed_over(
            &self.client,
            &name,
            &id.owner,
            &id.host,
            id.ttl,
            id.control.as_deref(),
            cl.handover_timeout,
        )
        .await?;
        let release = |why: &str| {
            let (client, name, owner, why) = (
                self.client.clone(),
                name.clone(),
                id.owner.clone(),
                why.to_string(),
            );
            async move {
                tracing::warn!("VDI '{name}': {why}: its lock is released again");
                if let Err(e) = lock::release(&client, &name, &owner).await {
                    tracing::warn!("releasing the lock of '{name}': {}", chain(&e));
                }
            }
        };
        // This write, and the others that waited, go to the cluster under the lock; the
        // holder changed the VDI's objects since this mount last did.
        v.set_under_lock();
        self.client.forget_versions(h.vid);
        if let Err(e) = v.refresh().await {
            release("reading its inode after taking its lock failed").await;
            return Err(e.into());
        }
        match self.attach_open(vid).await {
            Ok(Some((plain, cached, name))) => {
                self.rt
                    .spawn(async move { hand_over(plain, &cached, &name).await });
            }
            // Every file of it closed meanwhile: not this mount's to keep.
            Ok(None) if !cl.cache.is_attached(vid) => {
                release("its files were closed while it was handed over").await
            }
            Ok(None) => {}
            Err(e) => {
                release(&format!("attaching it in the cache failed ({})", chain(&e))).await;
                return Err(e);
            }
        }
        cl.away.set(vid, false);
        cl.cache.count_taken(vid);
        let from = match &taken.from {
            Some(f) => format!("from {} (owner {}, generation {})", f.host, f.owner, f.gen),
            None => "(free)".to_string(),
        };
        tracing::info!(
            "VDI '{name}': took the lock over {from} for a write, in {:?}; generation {} now, read and written through the cache again",
            start.elapsed(),
            taken.info.gen
        );
        Ok(())
    }

    /// After a request on `disk` of file `ino` failed with `e`: in cooperative mode a lock
    /// the cache lost (its lease ended while this mount was cut off or stopped, and another
    /// mount took it) is a hand-over nobody asked for, not an error. The cache drops what it
    /// held of the VDI ([`Cache::forget_lost`]; not if it holds writes never pushed: those
    /// stay, and the error stands), the file goes on with a plain handle whose next write
    /// asks for the lock back, and true says to make the request again.
    async fn lost_to_plain(&self, ino: u64, disk: &Disk, e: &CacheError) -> bool {
        let (Some(cl), Disk::Cached(c), CacheError::LockLost { name }) =
            (&self.cache_locks, disk, e)
        else {
            return false;
        };
        let vid = c.vdi().header().vid.0;
        match cl.cache.forget_lost(vid) {
            Ok(dropped) if dropped > 0 => tracing::warn!(
                "VDI '{name}': its lock was taken by another mount while this one was out of reach for its lease; dropped {} cached, read from the cluster until a write here asks for the lock back",
                objstore_proto::size::format_size(dropped)
            ),
            Ok(_) => {}
            Err(dirty) => {
                tracing::error!(
                    "VDI '{name}': its lock was taken by another mount while this one held {} never pushed (see 'cachectl evict {name} --discard-dirty'): it stays failed here",
                    objstore_proto::size::format_size(dirty)
                );
                return false;
            }
        }
        let fresh = match Vdi::open(self.client.clone(), name).await {
            Ok(v) => Arc::new(v),
            Err(e) => {
                tracing::warn!("VDI '{name}': opening it to go on without the cache: {e}");
                return false;
            }
        };
        let mut open = self.open.lock().unwrap();
        let Some(o) = open.get_mut(&ino) else {
            return false;
        };
        if let Disk::Cached(now) = &o.disk {
            if Arc::ptr_eq(now, c) {
                o.disk = Disk::Plain(fresh, Arc::default());
                cl.away.set(vid, true);
            }
        }
        true
    }

    /// After a request on `disk` of file `ino` failed with `e`: whether to make it again, on
    /// the file's new plain handle, because the cache lost the VDI's lock to another mount
    /// ([`Shared::lost_to_plain`]). `disk` is let go before the new handle is taken (its
    /// hold on the VDI's gate would stop a hand-over waiting for the gate, and this with it).
    pub(crate) async fn again(&self, ino: u64, disk: InUse, e: &CacheError) -> Again {
        if !self.lost_to_plain(ino, &disk, e).await {
            return Again::Stands(disk);
        }
        drop(disk);
        match self.opened_wait(ino).await {
            Ok(d) => Again::Retry(d),
            Err(errno) => Again::Gone(errno),
        }
    }

    /// Gives the lock of `a.vdi` to the mount that asked (see the module doc). Whatever
    /// fails keeps the lock here: the asker waits, and this is tried again at the next look.
    pub(crate) async fn give_cached_lock(&self, cl: &CacheLocks, a: &Asked) {
        let start = Instant::now();
        // No open makes a handle of the VDI meanwhile (it would find it still attached).
        let _no_opens = self.switching.write().await;
        let ino = self.names.lock().unwrap().known(&a.vdi);
        let gate = ino.and_then(|ino| self.open.lock().unwrap().get(&ino).map(|o| o.gate.clone()));
        // Requests in flight finish first; new ones wait until this is dropped.
        let _quiet = match &gate {
            Some(g) => Some(g.clone().write_owned().await),
            None => None,
        };
        // What the open file goes on with: straight to the cluster.
        let plain = match &gate {
            Some(_) => match Vdi::open(self.client.clone(), &a.vdi).await {
                Ok(v) => Some(Arc::new(v)),
                Err(e) => {
                    tracing::warn!(
                        "VDI '{}': {} asks for its lock; opening it to go on without the cache failed: {e} (the lock stays here; tried again)",
                        a.vdi,
                        a.to
                    );
                    return;
                }
            },
            None => None,
        };
        let given = match cl.cache.give_lock(&a.vdi, a.gen).await {
            Ok(Some(g)) => g,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(
                    "VDI '{}': {} asks for its lock; pushing and flushing it first failed: {} (the lock stays here; tried again)",
                    a.vdi,
                    a.to,
                    chain(&e)
                );
                return;
            }
        };
        if let (Some(ino), Some(v)) = (ino, plain) {
            let mut open = self.open.lock().unwrap();
            if let Some(o) = open.get_mut(&ino) {
                if matches!(o.disk, Disk::Cached(_)) && o.disk.vdi().header().vid.0 == a.vid {
                    o.disk = Disk::Plain(v, Arc::default());
                    cl.away.set(a.vid, true);
                }
            }
        }
        tracing::info!(
            "VDI '{}': handed the lock (generation {}) over to {}, who asked for it; pushed {} first, dropped {} cached ({:?})",
            a.vdi,
            a.gen,
            a.to,
            objstore_proto::size::format_size(given.pushed),
            objstore_proto::size::format_size(given.dropped),
            start.elapsed()
        );
    }
}
