//! Attachment locks of the mount without a cache: a read-write open takes the VDI's
//! cluster-wide lock (`objstore_client::lock`), as the cache's attach does, so a second
//! writer (another mount, cached or not, on this host or another) is refused with the same
//! EBUSY and the same log line. The lock is held while a file of the VDI is open read-write
//! here, and released when the last one is closed (a mount without a cache keeps nothing to
//! come back to).
//!
//! Each lock is bound to a lease of `--lock-ttl`, renewed by [`PlainLocks::keeper`] every
//! third of it. A lease that ended while the mount lived is taken back with the same
//! generation if nobody attached since; otherwise the lock is *lost*: writes, discards and
//! fsyncs of the VDI fail with EIO until a read-write open takes the lock again. `sheepfs --no-lock` opens read-write without the lock (and then bumps the VDI's
//! generation on the first write, as `dog vdi write` does).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use objcache::{chain, CacheError};
use objstore_client::lock::{self, LockInfo, Renewal};
use objstore_client::{Client, Vdi};

struct Held {
    info: LockInfo,
    vid: u32,
    /// Files of the VDI open read-write on this mount.
    writers: usize,
}

/// The locks this mount holds for its read-write files (no cache).
pub(crate) struct PlainLocks {
    client: Arc<Client>,
    /// `host/mount:PATH`: a remount at the same place after a crash takes its lock back at
    /// once instead of waiting out the lease.
    owner: String,
    host: String,
    ttl: Duration,
    /// By VDI name; taken across the cluster calls, so opens, releases and renewals of locks
    /// run one at a time.
    held: tokio::sync::Mutex<HashMap<String, Held>>,
    /// VDIs (by id) whose lock was lost while files of them were open read-write.
    lost: Mutex<HashSet<u32>>,
    /// Whether `lost` may be non-empty (read on every write without taking its lock).
    any_lost: AtomicBool,
}

impl PlainLocks {
    pub(crate) fn new(client: Arc<Client>, mountpoint: &str, ttl: Duration) -> PlainLocks {
        let host = lock::local_host();
        PlainLocks {
            client,
            owner: format!("{host}/mount:{mountpoint}"),
            host,
            ttl,
            held: tokio::sync::Mutex::default(),
            lost: Mutex::default(),
            any_lost: AtomicBool::new(false),
        }
    }

    /// For a read-write open of `vdi`: takes its lock, or counts one more writer if this
    /// mount holds it. Refused ([`lock::LockError::Held`]) if another owner holds it. A lock
    /// this mount lost is taken again if it can be (the VDI's files here write again), as
    /// the cache attaches a lost VDI again.
    pub(crate) async fn open_rw(&self, vdi: &Vdi) -> Result<(), CacheError> {
        let h = vdi.header();
        let (name, vid) = (h.name, h.vid.0);
        let mut held = self.held.lock().await;
        let lost = self.is_lost(vid);
        if let Some(h) = held.get_mut(&name).filter(|_| !lost) {
            h.writers += 1;
            return Ok(());
        }
        let info =
            lock::acquire(&self.client, &name, &self.owner, &self.host, Some(self.ttl)).await?;
        if lost {
            tracing::info!("VDI '{name}' locked again after its lock was lost");
        }
        self.forget_lost(vid);
        let writers = held.get(&name).map_or(0, |h| h.writers) + 1;
        held.insert(name, Held { info, vid, writers });
        Ok(())
    }

    /// A read-write file of `name` (VDI id `vid`) was closed: the last one releases the
    /// lock. Nothing if the lock was released already (the VDI deleted through this mount,
    /// and perhaps created again since: another id).
    pub(crate) async fn close_rw(&self, name: &str, vid: u32) {
        let mut held = self.held.lock().await;
        let Some(h) = held.get_mut(name).filter(|h| h.vid == vid) else {
            return;
        };
        h.writers -= 1;
        if h.writers > 0 {
            return;
        }
        held.remove(name);
        self.forget_lost(vid);
        if let Err(e) = lock::release(&self.client, name, &self.owner).await {
            tracing::warn!(
                "releasing the lock of '{name}': {} (it frees itself within {:?})",
                chain(&e),
                self.ttl
            );
        }
    }

    /// Before this mount deletes VDI `name`, which no file of it holds open any more:
    /// releases its lock now rather than when the last close's release task runs, so the
    /// delete does not find the VDI attached by this mount.
    pub(crate) async fn forget(&self, name: &str) {
        let mut held = self.held.lock().await;
        if let Some(h) = held.remove(name) {
            self.forget_lost(h.vid);
            if let Err(e) = lock::release(&self.client, name, &self.owner).await {
                tracing::warn!("releasing the lock of '{name}': {}", chain(&e));
            }
        }
    }

    /// At unmount: releases every lock still held (a file closed just before, its release
    /// task not run yet).
    pub(crate) async fn release_all(&self) {
        let mut held = self.held.lock().await;
        for (name, h) in held.drain() {
            self.forget_lost(h.vid);
            if let Err(e) = lock::release(&self.client, &name, &self.owner).await {
                tracing::warn!(
                    "releasing the lock of '{name}': {} (it frees itself within {:?})",
                    chain(&e),
                    self.ttl
                );
            }
        }
    }

    /// Whether the lock of VDI `vid` was lost while files of it are open read-write here.
    pub(crate) fn is_lost(&self, vid: u32) -> bool {
        self.any_lost.load(Ordering::Acquire) && self.lost.lock().unwrap().contains(&vid)
    }

    fn forget_lost(&self, vid: u32) {
        let mut lost = self.lost.lock().unwrap();
        lost.remove(&vid);
        if lost.is_empty() {
            self.any_lost.store(false, Ordering::Release);
        }
    }

    /// Renews the leases every third of the TTL, for as long as the mount lives.
    pub(crate) async fn keeper(self: Arc<Self>) {
        let period = (self.ttl / 3).max(Duration::from_millis(100));
        loop {
            tokio::time::sleep(period).await;
            let mut held = self.held.lock().await;
            for (name, h) in held.iter_mut() {
                match lock::keepalive(&self.client, &h.info).await {
                    Ok(Renewal::Alive) => {}
                    Ok(Renewal::Retaken(now)) => {
                        tracing::warn!(
                            "the lease of VDI '{name}''s lock had ended (the cluster was out of reach for its TTL, or the lock was broken); nobody attached it since: lock taken back, generation {}",
                            now.gen
                        );
                        h.info = now;
                    }
                    Ok(Renewal::Lost(holder)) => {
                        let now = Renewal::lost_to(holder.as_ref());
                        tracing::error!(
                            "lost the lock of VDI '{name}' (generation {}): its lease ended and {now}; writes to it through this mount now fail with EIO until a read-write open locks it again",
                            h.info.gen
                        );
                        // Still counted as writers (their closes come); no longer renewed.
                        self.lost.lock().unwrap().insert(h.vid);
                        self.any_lost.store(true, Ordering::Release);
                        h.info.lease = None;
                    }
                    Err(e) => tracing::warn!(
                        "renewing the lease of VDI '{name}''s lock: {} (retried in {period:?}; the lock is lost if this lasts {:?})",
                        chain(&e),
                        self.ttl
                    ),
                }
            }
        }
    }
}
