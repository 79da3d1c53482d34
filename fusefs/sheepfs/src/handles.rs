//! Open VDIs: the one handle per open VDI that every request takes, straight to the cluster
//! (plain) or through the cache; opening, sharing and releasing it; taking a plain one over
//! into the cache when `cachectl mode` gives its VDI a caching mode; errors logged once and
//! turned into errno.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::OwnedRwLockReadGuard;

use bytes::Bytes;
use fuser::{Errno, FileAttr, FileHandle, FileType, INodeNo};
use objstore_client::vdi::VdiInfo;
use objstore_client::{lock::LockError, Client, Vdi, VdiError};
use objstore_proto::Vid;

use objcache::{chain, Cache, CacheError, CachedVdi};

use crate::cachelocks::CacheLocks;
use crate::errno;
use crate::locks::PlainLocks;
use crate::names::{is_snapshot, Names};

/// An open VDI: straight to the cluster (with its requests in flight, counted), or through
/// the cache.
#[derive(Clone)]
pub(crate) enum Disk {
    Plain(Arc<Vdi>, Arc<InFlight>),
    Cached(Arc<CachedVdi>),
}

/// Requests in flight on a plain handle, each holding a [`HandlePin`]: taking the handle
/// over into the cache waits for them ([`InFlight::drained`]).
#[derive(Default)]
pub(crate) struct InFlight {
    pins: AtomicUsize,
    /// Signalled when the last pin goes.
    idle: tokio::sync::Notify,
}

/// One request's hold on a plain handle (see [`InFlight`]).
pub(crate) struct HandlePin(Arc<InFlight>);

impl InFlight {
    fn pin(self: &Arc<Self>) -> HandlePin {
        self.pins.fetch_add(1, Ordering::SeqCst);
        HandlePin(self.clone())
    }

    /// Returns once no request holds a pin. New pins are no longer handed out by then:
    /// the handle was replaced under the open table's lock, which pins are taken under.
    async fn drained(&self) {
        loop {
            // Registered before the check: a pin dropped after it still wakes this.
            let idle = self.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if self.pins.load(Ordering::SeqCst) == 0 {
                return;
            }
            idle.await;
        }
    }
}

impl Drop for HandlePin {
    fn drop(&mut self) {
        if self.0.pins.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// A request's handle: the disk, pinned if it is a plain one, and holding its VDI's gate
/// open ([`OpenVdi::gate`]) until the request is answered.
pub(crate) struct InUse {
    disk: Disk,
    _pin: Option<HandlePin>,
    _gate: Option<OwnedRwLockReadGuard<()>>,
}

impl InUse {
    /// Pins `disk` for one request; taken under the open table's lock.
    fn of(disk: &Disk, gate: Option<OwnedRwLockReadGuard<()>>) -> InUse {
        let pin = match disk {
            Disk::Plain(_, inflight) => Some(inflight.pin()),
            Disk::Cached(_) => None,
        };
        InUse {
            disk: disk.clone(),
            _pin: pin,
            _gate: gate,
        }
    }
}

impl std::ops::Deref for InUse {
    type Target = Disk;
    fn deref(&self) -> &Disk {
        &self.disk
    }
}

impl Disk {
    pub(crate) fn vdi(&self) -> &Arc<Vdi> {
        match self {
            Disk::Plain(v, _) => v,
            Disk::Cached(c) => c.vdi(),
        }
    }

    pub(crate) async fn write(&self, offset: u64, data: Bytes) -> Result<(), CacheError> {
        match self {
            Disk::Plain(v, _) => Ok(v.write_at(offset, data).await?),
            Disk::Cached(c) => c.write(offset, data).await,
        }
    }

    pub(crate) async fn flush(&self) -> Result<(), CacheError> {
        match self {
            Disk::Plain(v, _) => Ok(v.flush().await?),
            Disk::Cached(c) => c.flush().await,
        }
    }

    pub(crate) async fn discard(&self, offset: u64, len: u64) -> Result<(), CacheError> {
        match self {
            Disk::Plain(v, _) => Ok(v.discard(offset, len).await?),
            Disk::Cached(c) => c.discard(offset, len).await,
        }
    }
}

/// The errno for a request that failed through the cache (or a plain handle's, as a
/// [`CacheError::Vdi`]), logged once with its causes.
pub(crate) fn cache_fail(op: &str, what: &str, e: &CacheError) -> Errno {
    let errno = errno::from_cache(e);
    let held = matches!(
        e,
        CacheError::Lock(LockError::Held { .. }) | CacheError::Conflict { .. }
    );
    if held {
        tracing::error!("{op} {what}: {}", chain(e));
    } else if errno == Errno::ENOENT {
        tracing::debug!("{op} {what}: {}", chain(e));
    } else {
        tracing::warn!("{op} {what}: {}", chain(e));
    }
    errno
}

pub(crate) struct OpenVdi {
    pub(crate) disk: Disk,
    pub(crate) handles: usize,
    /// Handles open read-write.
    pub(crate) writers: usize,
    /// Every request of the VDI holds it shared (an [`InUse`]) until it is answered; a
    /// snapshot or rollback by this mount holds it exclusively while it switches `disk` to
    /// the VDI's new inode, so requests in flight are done first and new ones wait.
    pub(crate) gate: Arc<tokio::sync::RwLock<()>>,
    /// Why requests fail (EIO), if they do: the VDI moved to a new inode that could not be
    /// opened, so the handle left would read or write the old one.
    pub(crate) stale: Option<String>,
}

impl OpenVdi {
    fn new(disk: Disk) -> OpenVdi {
        OpenVdi {
            disk,
            handles: 0,
            writers: 0,
            gate: Arc::default(),
            stale: None,
        }
    }
}

impl OpenVdi {
    /// Makes `cached` the handle every request takes if the VDI has a plain one. Returns the
    /// plain handle's requests in flight when a read-write file of it is open, so writes of
    /// it may be in flight: `cached` then lets requests in only at [`hand_over`].
    pub(crate) fn upgrade(&mut self, cached: &Arc<CachedVdi>) -> Option<Arc<InFlight>> {
        let Disk::Plain(_, inflight) = &self.disk else {
            return None;
        };
        let plain = (self.writers > 0).then(|| inflight.clone());
        if plain.is_some() {
            cached.close_gate();
        }
        self.disk = Disk::Cached(cached.clone());
        plain
    }
}

/// State shared by the FUSE threads, the tasks answering them and the control socket.
pub(crate) struct Shared {
    pub(crate) client: Arc<Client>,
    pub(crate) cache: Option<Cache>,
    /// Inode numbers by name, learnt from lookup, readdir and create.
    pub(crate) names: Mutex<Names>,
    /// The open VDIs, by inode number.
    pub(crate) open: Mutex<HashMap<u64, OpenVdi>>,
    /// Held shared by opens, exclusively by a snapshot or rollback switching a VDI to its
    /// new inode ([`crate::switch`]): no handle of the old inode is made meanwhile.
    pub(crate) switching: tokio::sync::RwLock<()>,
    /// Signalled whenever a VDI's last handle is released (an `rm` waits for it).
    pub(crate) closed: tokio::sync::Notify,
    pub(crate) next_fh: AtomicU64,
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    pub(crate) mounted_at: SystemTime,
    /// Without a cache (and without `--no-lock`): the locks of the VDIs open read-write.
    pub(crate) locks: Option<Arc<PlainLocks>>,
    /// With a cache in cooperative lock mode: hand-overs of the locks the cache holds.
    pub(crate) cache_locks: Option<Arc<CacheLocks>>,
    pub(crate) rt: tokio::runtime::Handle,
}

fn secs(t: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(t)
}

impl Shared {
    /// The attributes of file `ino` showing VDI (or snapshot) `info`; snapshots are
    /// read-only (0444).
    pub(crate) fn file_attr(&self, ino: u64, info: &VdiInfo) -> FileAttr {
        let t = secs(info.created);
        FileAttr {
            ino: INodeNo(ino),
            size: info.size,
            blocks: info.used.min(info.size.next_multiple_of(512)) / 512,
            atime: t,
            mtime: t,
            ctime: t,
            crtime: t,
            kind: FileType::RegularFile,
            perm: if info.tag.is_some() { 0o444 } else { 0o644 },
            nlink: 1,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }

    pub(crate) fn dir_attr(&self) -> FileAttr {
        FileAttr {
            ino: INodeNo::ROOT,
            size: 0,
            blocks: 0,
            atime: self.mounted_at,
            mtime: self.mounted_at,
            ctime: self.mounted_at,
            crtime: self.mounted_at,
            kind: FileType::Directory,
            perm: 0o755,
            nlink: 2,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }

    pub(crate) fn name_of(&self, ino: u64) -> Result<String, Errno> {
        let names = self.names.lock().unwrap();
        names.name(ino).map(str::to_string).ok_or(Errno::ENOENT)
    }

    /// The inode number of `name` (given now if it has none).
    pub(crate) fn ino(&self, name: &str) -> u64 {
        self.names.lock().unwrap().ino(name)
    }

    /// The handle of open VDI `ino`, pinned for one request: None while a snapshot or
    /// rollback switches it (wait with [`Shared::opened_wait`]); EBADF if it is not open.
    pub(crate) fn try_opened(&self, ino: u64) -> Result<Option<InUse>, Errno> {
        let open = self.open.lock().unwrap();
        let o = open.get(&ino).ok_or(Errno::EBADF)?;
        if o.stale.is_some() {
            return Err(Errno::EIO);
        }
        Ok(match o.gate.clone().try_read_owned() {
            Ok(g) => Some(InUse::of(&o.disk, Some(g))),
            Err(_) => None,
        })
    }

    /// [`Shared::try_opened`], waiting for a snapshot or rollback of the VDI to be done.
    pub(crate) async fn opened_wait(&self, ino: u64) -> Result<InUse, Errno> {
        loop {
            let gate = {
                let open = self.open.lock().unwrap();
                open.get(&ino).ok_or(Errno::EBADF)?.gate.clone()
            };
            let g = gate.clone().read_owned().await;
            let open = self.open.lock().unwrap();
            let o = open.get(&ino).ok_or(Errno::EBADF)?;
            if let Some(why) = &o.stale {
                tracing::warn!("{why}");
                return Err(Errno::EIO);
            }
            // Closed and opened again meanwhile: the new entry's gate.
            if Arc::ptr_eq(&o.gate, &gate) {
                return Ok(InUse::of(&o.disk, Some(g)));
            }
        }
    }

    /// The request's handle: `now` ([`Shared::try_opened`]) or, when that was None, once the
    /// VDI's switch is done.
    pub(crate) async fn in_use(&self, ino: u64, now: Option<InUse>) -> Result<InUse, Errno> {
        match now {
            Some(d) => Ok(d),
            None => self.opened_wait(ino).await,
        }
    }

    /// The open handle of file `ino` for its attributes only (no request made on it).
    pub(crate) fn peek(&self, ino: u64) -> Option<Arc<Vdi>> {
        let open = self.open.lock().unwrap();
        open.get(&ino).map(|o| o.disk.vdi().clone())
    }

    pub(crate) fn is_open(&self, name: &str) -> bool {
        let ino = self.names.lock().unwrap().known(name);
        ino.is_some_and(|ino| self.open.lock().unwrap().contains_key(&ino))
    }

    /// The attributes of file `name` (a VDI or a snapshot), from the open handle if there is
    /// one; with its inode number.
    pub(crate) async fn stat(&self, name: &str) -> Result<(u64, VdiInfo), VdiError> {
        let ino = self.ino(name);
        let info = match self.peek(ino) {
            Some(v) => v.info(),
            None => Vdi::open(self.client.clone(), name).await?.info(),
        };
        Ok((ino, info))
    }

    /// A new handle on `name`: through the cache when there is one (a read-write open attaches
    /// the VDI), else straight to the cluster.
    /// In cooperative lock mode a read-write open of a VDI another mount holds is not
    /// refused: it gets a plain handle whose first write asks for the lock.
    pub(crate) async fn make_disk(&self, name: &str, rw: bool) -> Result<Disk, Errno> {
        let mut away = false;
        if let Some(cache) = &self.cache {
            match cache.open_vdi(name, rw).await {
                Ok(Some(c)) => return Ok(Disk::Cached(Arc::new(c))),
                Ok(None) => {}
                Err(CacheError::Lock(LockError::Held { host, owner, .. }))
                    if self.cache_locks.is_some() =>
                {
                    tracing::info!(
                        "VDI '{name}' opened read-write while {host} (owner {owner}) holds its lock: read from the cluster until the first write here asks for it"
                    );
                    away = true;
                }
                Err(e) => return Err(cache_fail("open", name, &e)),
            }
        }
        match Vdi::open(self.client.clone(), name).await {
            Ok(v) => {
                if let (Some(cl), true) = (&self.cache_locks, away) {
                    cl.away.set(v.header().vid.0, true);
                }
                Ok(Disk::Plain(Arc::new(v), Arc::default()))
            }
            Err(e) => Err(fail("open", name, &e)),
        }
    }

    /// Opens (or shares) the handle of `name`; returns its inode number. Every open reads the
    /// inode afresh, so it sees what other clients allocated or resized before it. Snapshots
    /// open read-only (EROFS otherwise).
    pub(crate) async fn open_vdi(&self, name: &str, rw: bool) -> Result<(u64, InUse), Errno> {
        if rw && is_snapshot(name) {
            tracing::debug!("open {name} for writing: snapshots are read-only");
            return Err(Errno::EROFS);
        }
        let _no_switch = self.switching.read().await;
        let fresh = self.make_disk(name, rw).await?;
        // Without a cache every handle is plain: a read-write one takes the lock.
        let locked = match (&self.locks, &fresh) {
            (Some(locks), Disk::Plain(v, _)) if rw => {
                if let Err(e) = locks.open_rw(v).await {
                    return Err(cache_fail("open", name, &e));
                }
                true
            }
            _ => false,
        };
        let ino = self.ino(name);
        self.moved_away(ino, &fresh).await;
        let mut replaced = None;
        let shared = {
            let mut open = self.open.lock().unwrap();
            let entry = open
                .entry(ino)
                .or_insert_with(|| OpenVdi::new(fresh.clone()));
            // A read-write open upgrades a shared plain handle to the cached one (the cache
            // holds the lock now, if another mount had it).
            if let Disk::Cached(cached) = &fresh {
                replaced = entry.upgrade(cached);
                if let Some(cl) = &self.cache_locks {
                    cl.away.set(cached.vdi().header().vid.0, false);
                }
            }
            entry.handles += 1;
            entry.writers += rw as usize;
            if locked {
                // Its writes are made under the lock: they leave the generation alone.
                entry.disk.vdi().set_under_lock();
            }
            // Opens hold `switching`: nothing holds the gate exclusively.
            InUse::of(&entry.disk, None)
        };
        if let (Some(plain), Disk::Cached(cached)) = (replaced, &fresh) {
            hand_over(plain, cached, name).await;
        }
        if !Arc::ptr_eq(shared.vdi(), fresh.vdi()) {
            if let Err(e) = shared.vdi().refresh().await {
                self.release(ino, rw);
                return Err(fail("open", name, &e));
            }
        }
        Ok((ino, shared))
    }

    /// Before a new handle of file `ino` is shared with its open one: if the VDI moved to
    /// another inode since that was opened (snapshot, rollback or delete and create, through
    /// `dog` or another host: never while this mount's cache holds its lock), a plain open
    /// handle is replaced by `fresh`, once its requests in flight are done. Requests that
    /// would still go to the old inode would read a frozen snapshot, or a freed one.
    async fn moved_away(&self, ino: u64, fresh: &Disk) {
        let vid = fresh.vdi().header().vid;
        let gate = {
            let open = self.open.lock().unwrap();
            match open.get(&ino) {
                Some(o)
                    if matches!(o.disk, Disk::Plain(..)) && o.disk.vdi().header().vid != vid =>
                {
                    o.gate.clone()
                }
                _ => return,
            }
        };
        let _quiet = gate.write().await;
        let mut open = self.open.lock().unwrap();
        if let Some(o) = open.get_mut(&ino) {
            if matches!(o.disk, Disk::Plain(..)) && o.disk.vdi().header().vid != vid {
                tracing::info!(
                    "VDI '{}' moved to inode {:x} since it was opened here (a snapshot or a rollback): its open files go on with it",
                    fresh.vdi().full_name(),
                    vid.0
                );
                o.disk = fresh.clone();
                o.stale = None;
            }
        }
    }

    pub(crate) fn release(&self, ino: u64, rw: bool) {
        let mut open = self.open.lock().unwrap();
        if let Some(o) = open.get_mut(&ino) {
            if let (Some(locks), true) = (&self.locks, rw) {
                let (locks, h) = (locks.clone(), o.disk.vdi().header());
                self.rt
                    .spawn(async move { locks.close_rw(&h.name, h.vid.0).await });
            }
            o.handles -= 1;
            o.writers = o.writers.saturating_sub(rw as usize);
            if o.handles == 0 {
                if let Some(cl) = &self.cache_locks {
                    cl.away.set(o.disk.vdi().header().vid.0, false);
                }
                open.remove(&ino);
                self.closed.notify_waiters();
            }
        }
    }

    /// Waits until no handle of `name` is open on this mount; false if one still is at
    /// `deadline`.
    pub(crate) async fn closed_by(&self, name: &str, deadline: tokio::time::Instant) -> bool {
        loop {
            // Registered before the check: a release right after it still wakes this.
            let closed = self.closed.notified();
            tokio::pin!(closed);
            closed.as_mut().enable();
            if !self.is_open(name) {
                return true;
            }
            if tokio::time::timeout_at(deadline, closed).await.is_err() {
                return !self.is_open(name);
            }
        }
    }

    /// After `cachectl mode` gave VDI `vid` a caching mode: if it is open read-write here
    /// through plain handles (it was in mode `off`, unattached, when opened), attaches it and
    /// makes the cached handle the one every request takes. The cached handle lets requests
    /// in only once every request of the plain handle is done and the VDI's allocation is
    /// read afresh, so no plain write lands after the cache read or wrote its blocks. False
    /// if there was nothing to take over.
    pub(crate) async fn take_over(&self, vid: u32) -> Result<bool, CacheError> {
        match self.attach_open(vid).await? {
            Some((plain, cached, name)) => hand_over(plain, &cached, &name).await,
            None => return Ok(false),
        }
        Ok(true)
    }

    /// [`Shared::take_over`] up to its wait: attaches VDI `vid` and makes a gated cached
    /// handle the open file's. Returns what [`hand_over`] must then wait for and open (the
    /// caller may be a request pinning the plain handle: it must not wait itself); None if
    /// there was nothing to take over.
    pub(crate) async fn attach_open(
        &self,
        vid: u32,
    ) -> Result<Option<(Arc<InFlight>, Arc<CachedVdi>, String)>, CacheError> {
        let found = (self.open.lock().unwrap().iter())
            .find(|(_, o)| o.disk.vdi().header().vid == Vid(vid))
            .map(|(ino, o)| (*ino, o.writers > 0 && matches!(o.disk, Disk::Plain(..))));
        let ino = match found {
            Some((ino, true)) => ino,
            _ => return Ok(None),
        };
        let name = self
            .name_of(ino)
            .map_err(|_| CacheError::Vdi(VdiError::NotFound(vid.to_string())))?;
        let Some(cache) = &self.cache else {
            return Ok(None);
        };
        let cached = Arc::new(cache.take_over(vid, &name).await?);
        let plain = match self.open.lock().unwrap().get_mut(&ino) {
            Some(o) => o.upgrade(&cached),
            None => None,
        };
        match plain {
            Some(plain) => Ok(Some((plain, cached, name))),
            // Closed meanwhile (the VDI stays attached, as after any read-write open), a
            // read-write open took it through the cache first, or no writer is left.
            None => {
                cached.open_gate();
                Ok(None)
            }
        }
    }

    /// Why writes, discards and fsyncs of open VDI `disk` are refused, if they are: it is a
    /// snapshot (read-only), or its lock (taken without a cache) was lost.
    pub(crate) fn refused(&self, disk: &Disk) -> Option<CacheError> {
        if let Some(s) = disk.vdi().snapshot() {
            return Some(CacheError::Vdi(VdiError::ReadOnly(s.to_string())));
        }
        let locks = self.locks.as_ref()?;
        let h = disk.vdi().header();
        locks
            .is_lost(h.vid.0)
            .then_some(CacheError::LockLost { name: h.name })
    }

    /// Before a write or discard of `disk` (cooperative lock mode): if another
    /// mount holds the VDI's lock, asks for it and waits until it is handed over.
    pub(crate) async fn take_lock(&self, disk: &Disk) -> Result<(), CacheError> {
        match (&self.locks, &self.cache_locks, disk) {
            (Some(locks), _, Disk::Plain(v, _)) => locks.take(v).await,
            (_, Some(cl), Disk::Plain(v, _)) => self.take_cached_lock(cl, v).await,
            _ => Ok(()),
        }
    }

    /// Whether another mount holds the lock of VDI `vid`, open here (cooperative mode).
    pub(crate) fn is_away(&self, vid: u32) -> bool {
        self.locks.as_ref().is_some_and(|l| l.is_away(vid))
            || self
                .cache_locks
                .as_ref()
                .is_some_and(|l| l.away.contains(vid))
    }

    /// A read through plain handle `v`: while another mount holds the VDI's lock (it is open
    /// read-write here, cooperative mode), the map entries of the range are read afresh
    /// first, so the read sees the objects the holder made.
    pub(crate) async fn read_plain(
        &self,
        v: &Vdi,
        offset: u64,
        len: u64,
    ) -> Result<Bytes, CacheError> {
        if self.is_away(v.header().vid.0) {
            v.reload_entries(offset, len).await?;
        }
        Ok(v.read_at(offset, len).await?)
    }

    pub(crate) fn client(&self) -> &Arc<Client> {
        &self.client
    }

    pub(crate) fn new_fh(&self) -> FileHandle {
        FileHandle(self.next_fh.fetch_add(1, Ordering::Relaxed))
    }
}

/// Lets `cached` (gated, see `CachedVdi::gated`) take requests once every request of the
/// plain handle it replaces is done (`plain`: their pins) and the VDI's inode is read
/// afresh, so that a read of an object the plain handle allocated is not taken for a hole.
pub(crate) async fn hand_over(plain: Arc<InFlight>, cached: &CachedVdi, name: &str) {
    while tokio::time::timeout(Duration::from_secs(10), plain.drained())
        .await
        .is_err()
    {
        tracing::warn!(
            "taking '{name}' into the cache: still waiting for requests sent straight to the cluster"
        );
    }
    let mut attempt = 0u32;
    while let Err(e) = cached.vdi().refresh().await {
        attempt += 1;
        tracing::warn!(
            "taking '{name}' into the cache: reading its inode (attempt {attempt}): {e}"
        );
        tokio::time::sleep(Duration::from_secs(u64::from(attempt.min(5)))).await;
    }
    cached.open_gate();
    tracing::info!(
        "VDI '{name}' is now read and written through the cache (its open file was taken over)"
    );
}

/// Logs a failed operation once, with its cause, and returns the errno for the caller.
pub(crate) fn fail(op: &str, what: &str, e: &VdiError) -> Errno {
    let errno = errno::from_vdi(e);
    if errno == Errno::ENOENT {
        tracing::debug!("{op} {what}: {e}");
    } else {
        tracing::warn!("{op} {what}: {e}");
    }
    errno
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn drained_waits_for_the_last_pin() {
        let inflight = Arc::new(InFlight::default());
        inflight.drained().await; // none: at once
        let a = inflight.pin();
        let b = inflight.pin();
        let waiter = tokio::spawn({
            let inflight = inflight.clone();
            async move { inflight.drained().await }
        });
        drop(a);
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "one pin is left");
        drop(b);
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("woken by the last pin")
            .unwrap();
    }
}
