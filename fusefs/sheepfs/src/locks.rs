//! Attachment locks of the mount without a cache: a read-write open takes the VDI's
//! cluster-wide lock (`objstore_client::lock`), as the cache's attach does. The lock is held
//! while a file of the VDI is open read-write here, and released when the last one is closed
//! (a mount without a cache keeps nothing to come back to).
//!
//! Two modes (`--lock-mode`):
//! - **cooperative** (the default, as RBD's exclusive lock): a read-write open never fails
//!   because another mount holds the lock. The lock is needed for a write: a mount that
//!   does not hold it asks the holder ([`lock::handover`]) and waits until it is handed over
//!   (at most `--handover-timeout`, then the write fails with EIO). A holder that is asked
//!   ([`Shared::answer_requests`](crate::handles::Shared)) waits for the VDI's requests in
//!   flight and holds new ones, flushes, and releases the lock; its own next write asks for
//!   it back. While another mount holds the lock, reads here read the map entries they need
//!   from the inode afresh, so they see what the holder wrote.
//! - **exclusive**: a second writer (another mount, cached or not, on this host or another)
//!   is refused with EBUSY at open, and the same log line.
//!
//! Each lock is bound to a lease of `--lock-ttl`, renewed by [`PlainLocks::keeper`] every
//! third of it. A lease that ended while the mount lived is taken back with the same
//! generation if nobody attached since; otherwise the lock is *lost*: in exclusive mode,
//! writes, discards and fsyncs of the VDI fail with EIO until a read-write open takes the
//! lock again; in cooperative mode the next write asks for it like any other. `sheepfs
//! --no-lock` opens read-write without the lock (and then bumps the VDI's generation on the
//! first write, as `dog vdi write` does).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use objcache::{chain, CacheError};
use objstore_client::lock::{self, LockError, LockInfo, Renewal};
use objstore_client::{Client, Vdi};

/// The attachment locks of a mount without a cache (`sheepfs` without `--no-lock`).
#[derive(Debug, Clone)]
pub struct WriteLocks {
    /// Names the mount in the lock's owner (`HOST/mount:PATH`).
    pub mountpoint: String,
    /// The leases' TTL (`--lock-ttl`).
    pub ttl: Duration,
    /// `--lock-mode`: cooperative (hand the lock over to a mount that asks) or exclusive.
    pub mode: LockMode,
    /// `--handover-timeout`: how long a write waits for another mount to hand the lock over.
    pub handover_timeout: Duration,
}

/// `sheepfs --lock-mode`: what a read-write open does while another mount holds the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LockMode {
    /// Opens; the first write asks the holder to hand the lock over.
    #[default]
    Cooperative,
    /// Refused with EBUSY (a second writer is a mistake).
    Exclusive,
}

struct Held {
    /// The lock, while this mount holds it; None while another mount has it (cooperative
    /// mode): the VDI's next write here asks for it.
    info: Option<LockInfo>,
    vid: u32,
    /// Files of the VDI open read-write on this mount.
    writers: usize,
}

/// A hand-over this mount was asked for: give the lock of `vdi` (id `vid`, held at `gen`)
/// to `to`.
pub(crate) struct Asked {
    pub(crate) vdi: String,
    pub(crate) vid: u32,
    pub(crate) gen: u64,
    pub(crate) to: String,
}

/// The requests of other owners than `owner` for the locks in `mine` (VDI name: its id and
/// the generation held), at the generation held. Nothing (and no cluster call) if `mine` is
/// empty.
pub(crate) async fn asked_of(
    client: &Client,
    owner: &str,
    mine: &HashMap<String, (u32, u64)>,
) -> Result<Vec<Asked>, LockError> {
    if mine.is_empty() {
        return Ok(Vec::new());
    }
    Ok(lock::handover::requests(client)
        .await?
        .into_iter()
        .filter_map(|r| {
            let &(vid, gen) = mine.get(&r.vdi)?;
            (r.owner != owner && r.gen == gen).then(|| Asked {
                vid,
                gen,
                to: format!("{} (owner {})", r.host, r.owner),
                vdi: r.vdi,
            })
        })
        .collect())
}

/// VDIs open here whose lock another mount holds (cooperative mode), and the one write per
/// VDI that asks for it back.
#[derive(Default)]
pub(crate) struct Away {
    /// By VDI id.
    set: Mutex<HashSet<u32>>,
    /// Whether `set` may be non-empty (read on every request without taking its lock).
    any: AtomicBool,
    /// Held by the one write of a VDI that asks for its lock (by VDI id); the others wait.
    taking: Mutex<HashMap<u32, Arc<tokio::sync::Mutex<()>>>>,
}

impl Away {
    pub(crate) fn contains(&self, vid: u32) -> bool {
        self.any.load(Ordering::Acquire) && self.set.lock().unwrap().contains(&vid)
    }

    pub(crate) fn set(&self, vid: u32, away: bool) {
        let mut set = self.set.lock().unwrap();
        if away {
            set.insert(vid);
            self.any.store(true, Ordering::Release);
        } else {
            set.remove(&vid);
            if set.is_empty() {
                self.any.store(false, Ordering::Release);
            }
        }
    }

    /// Waits for any other write of VDI `vid` asking for its lock; held while this one asks.
    pub(crate) async fn one_taker(&self, vid: u32) -> tokio::sync::OwnedMutexGuard<()> {
        let gate = self.taking.lock().unwrap().entry(vid).or_default().clone();
        gate.lock_owned().await
    }
}

/// The locks this mount holds for its read-write files (no cache).
pub(crate) struct PlainLocks {
    client: Arc<Client>,
    /// `host/mount:PATH`: a remount at the same place after a crash takes its lock back at
    /// once instead of waiting out the lease.
    owner: String,
    host: String,
    ttl: Duration,
    mode: LockMode,
    /// How long a write waits for another mount to hand the lock over.
    handover_timeout: Duration,
    /// By VDI name; taken across the cluster calls, so opens, releases and renewals of locks
    /// run one at a time (a write waiting for a hand-over does not hold it).
    held: tokio::sync::Mutex<HashMap<String, Held>>,
    /// VDIs (by id) whose lock was lost while files of them were open read-write
    /// (exclusive mode).
    lost: Mutex<HashSet<u32>>,
    /// Whether `lost` may be non-empty (read on every write without taking its lock).
    any_lost: AtomicBool,
    /// VDIs open read-write here whose lock another mount has (cooperative mode).
    pub(crate) away: Away,
}

impl PlainLocks {
    pub(crate) fn new(client: Arc<Client>, cfg: &WriteLocks) -> PlainLocks {
        let host = lock::local_host();
        PlainLocks {
            client,
            owner: format!("{host}/mount:{}", cfg.mountpoint),
            host,
            ttl: cfg.ttl,
            mode: cfg.mode,
            handover_timeout: cfg.handover_timeout,
            held: tokio::sync::Mutex::default(),
            lost: Mutex::default(),
            any_lost: AtomicBool::new(false),
            away: Away::default(),
        }
    }

    /// For a read-write open of `vdi`: takes its lock, or counts one more writer if this
    /// mount holds it. Another owner holding it: refused ([`lock::LockError::Held`]) in
    /// exclusive mode; in cooperative mode the file opens and its first write asks for the
    /// lock. A lock this mount lost is taken again if it can be (the VDI's files here write
    /// again), as the cache attaches a lost VDI again.
    pub(crate) async fn open_rw(&self, vdi: &Vdi) -> Result<(), CacheError> {
        let h = vdi.header();
        let (name, vid) = (h.name, h.vid.0);
        let mut held = self.held.lock().await;
        let lost = self.is_lost(vid);
        if let Some(h) = held.get_mut(&name).filter(|_| !lost) {
            h.writers += 1;
            return Ok(());
        }
        let info = match lock::acquire(&self.client, &name, &self.owner, &self.host, Some(self.ttl))
            .await
        {
            Ok(info) => Some(info),
            Err(LockError::Held { host, owner, .. }) if self.mode == LockMode::Cooperative => {
                tracing::info!(
                    "VDI '{name}' opened read-write while {host} (owner {owner}) holds its lock: the first write here asks for it"
                );
                None
            }
            Err(e) => return Err(e.into()),
        };
        if lost {
            tracing::info!("VDI '{name}' locked again after its lock was lost");
        }
        if let Some(i) = &info {
            tracing::info!(
                "took the lock of VDI '{name}' for a read-write open (generation {})",
                i.gen
            );
        }
        self.forget_lost(vid);
        self.set_away(vid, info.is_none());
        let writers = held.get(&name).map_or(0, |h| h.writers) + 1;
        held.insert(name, Held { info, vid, writers });
        Ok(())
    }

    /// Whether another mount has the lock of VDI `vid`, open read-write here (cooperative
    /// mode): its writes must [`PlainLocks::take`] it first, its reads read their map
    /// entries afresh.
    pub(crate) fn is_away(&self, vid: u32) -> bool {
        self.away.contains(vid)
    }

    fn set_away(&self, vid: u32, away: bool) {
        self.away.set(vid, away);
    }

    /// Before a write of `vdi` (cooperative mode): if another mount holds its lock, asks for
    /// it and waits until it is handed over, then reads the inode afresh (the holder wrote).
    /// Concurrent writes of the VDI wait for the one that asks.
    pub(crate) async fn take(&self, vdi: &Vdi) -> Result<(), CacheError> {
        let h = vdi.header();
        let (name, vid) = (h.name, h.vid.0);
        if !self.is_away(vid) {
            return Ok(());
        }
        let _one = self.away.one_taker(vid).await;
        if !self.is_away(vid) {
            return Ok(());
        }
        let start = Instant::now();
        let taken = lock::acquire_handed_over(
            &self.client,
            &name,
            &self.owner,
            &self.host,
            self.ttl,
            None,
            self.handover_timeout,
        )
        .await?;
        // The holder changed the VDI's objects since this mount last did.
        self.client.forget_versions(h.vid);
        // Everything the holder wrote: its map entries (its data is read from the cluster).
        vdi.refresh().await?;
        let mut held = self.held.lock().await;
        match held.get_mut(&name).filter(|h| h.vid == vid) {
            Some(h) => h.info = Some(taken.info.clone()),
            None => {
                // Every file of it closed meanwhile: not ours to keep.
                drop(held);
                let _ = lock::release(&self.client, &name, &self.owner).await;
                return Ok(());
            }
        }
        self.set_away(vid, false);
        match &taken.from {
            Some(from) => tracing::info!(
                "VDI '{name}': took the lock over from {} (owner {}, generation {}) for a write, in {:?}; generation {} now",
                from.host,
                from.owner,
                from.gen,
                start.elapsed(),
                taken.info.gen
            ),
            None => tracing::info!(
                "VDI '{name}': took its free lock for a write (generation {})",
                taken.info.gen
            ),
        }
        Ok(())
    }

    /// The hand-overs other mounts ask this one for: requests for a lock it holds, at the
    /// generation it holds it. Nothing (and no cluster call) while it holds none.
    pub(crate) async fn asked(&self) -> Result<Vec<Asked>, LockError> {
        let mine: HashMap<String, (u32, u64)> = {
            let held = self.held.lock().await;
            held.iter()
                .filter_map(|(n, h)| h.info.as_ref().map(|i| (n.clone(), (h.vid, i.gen))))
                .collect()
        };
        asked_of(&self.client, &self.owner, &mine).await
    }

    /// Releases the lock of `asked.vdi` for the mount that asked, once the caller made every
    /// write of it durable and holds its new ones. False if this mount no longer holds it at
    /// that generation (nothing done).
    pub(crate) async fn give(&self, asked: &Asked) -> Result<bool, LockError> {
        let mut held = self.held.lock().await;
        let Some(h) = held.get_mut(&asked.vdi) else {
            return Ok(false);
        };
        if h.info.as_ref().map(|i| i.gen) != Some(asked.gen) {
            return Ok(false);
        }
        lock::release(&self.client, &asked.vdi, &self.owner).await?;
        h.info = None;
        self.set_away(h.vid, true);
        Ok(true)
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
        let Some(h) = held.remove(name) else {
            return;
        };
        self.forget_lost(vid);
        self.set_away(vid, false);
        let Some(info) = h.info else {
            return; // another mount has it
        };
        match lock::release(&self.client, name, &self.owner).await {
            Ok(()) => tracing::info!(
                "released the lock of VDI '{name}' (generation {}): its last read-write file here was closed",
                info.gen
            ),
            Err(e) => tracing::warn!(
                "releasing the lock of '{name}': {} (it frees itself within {:?})",
                chain(&e),
                self.ttl
            ),
        }
    }

    /// Before this mount deletes VDI `name`, which no file of it holds open any more:
    /// releases its lock now rather than when the last close's release task runs, so the
    /// delete does not find the VDI attached by this mount.
    pub(crate) async fn forget(&self, name: &str) {
        let mut held = self.held.lock().await;
        if let Some(h) = held.remove(name) {
            self.forget_lost(h.vid);
            self.set_away(h.vid, false);
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
            self.set_away(h.vid, false);
            if h.info.is_none() {
                continue;
            }
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
                let Some(info) = &h.info else { continue };
                match lock::keepalive(&self.client, info).await {
                    Ok(Renewal::Alive) => {}
                    Ok(Renewal::Retaken(now)) => {
                        tracing::warn!(
                            "the lease of VDI '{name}''s lock had ended (the cluster was out of reach for its TTL, or the lock was broken); nobody attached it since: lock taken back, generation {}",
                            now.gen
                        );
                        h.info = Some(now);
                    }
                    Ok(Renewal::Lost(holder)) if self.mode == LockMode::Cooperative => {
                        let now = Renewal::lost_to(holder.as_ref());
                        tracing::warn!(
                            "lost the lock of VDI '{name}' (generation {}): its lease ended and {now}; the next write through this mount asks for it",
                            info.gen
                        );
                        h.info = None;
                        self.set_away(h.vid, true);
                    }
                    Ok(Renewal::Lost(holder)) => {
                        let now = Renewal::lost_to(holder.as_ref());
                        tracing::error!(
                            "lost the lock of VDI '{name}' (generation {}): its lease ended and {now}; writes to it through this mount now fail with EIO until a read-write open locks it again",
                            info.gen
                        );
                        // Still counted as writers (their closes come); no longer renewed.
                        self.lost.lock().unwrap().insert(h.vid);
                        self.any_lost.store(true, Ordering::Release);
                        h.info = None;
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
