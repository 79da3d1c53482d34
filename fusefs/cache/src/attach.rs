//! Attachment: a VDI is read and written through the cache only while this cache holds its
//! lock in the cluster, and its cached data only while the lock's generation is the one the
//! data was cached under (another host attached it since: the data is dropped, or refused
//! if it holds unpushed writes).
//!
//! Each lock is bound to a lease of `lock_ttl` ([`crate::CacheConfig::lock_ttl`]), renewed by
//! [`lock_keeper`] every third of it: if this mount dies its locks free themselves. A lease
//! that ended while the mount lived (the cluster out of reach for a TTL, or the lock broken)
//! is taken back with the same generation if nobody attached since; otherwise the VDI is
//! *lost*: detached, and every write, discard and flush through it fails (EIO) until it is
//! attached again, since another host may have written it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use cache_control::CacheMode;
use objstore_client::lock::{LockInfo, Renewal};
use objstore_client::Volume;

use crate::dir::VdiRecord;
use crate::{Backend, Cache, CacheError, CachedVdi, Inner};

/// The VDIs this mount attached, and who it is to the cluster's locks.
pub(crate) struct Attachments<V> {
    /// VDIs attached read-write (lock held) by this mount.
    pub(crate) attached: Mutex<HashMap<u32, Arc<V>>>,
    /// The lock records of the attached VDIs (their leases).
    pub(crate) held: Mutex<HashMap<u32, LockInfo>>,
    /// VDIs whose lock was lost while attached (another attachment came): writes fail.
    pub(crate) lost: Mutex<HashMap<u32, String>>,
    /// Whether `lost` may be non-empty (read on every write without taking its lock).
    pub(crate) any_lost: AtomicBool,
    /// Held by [`lock_keeper`] through each round of renewals, and by whoever releases a lock
    /// (so that a renewal never takes back a lock being released).
    pub(crate) renewing: tokio::sync::Mutex<()>,
    /// `host/cache id`: the lock owner.
    pub(crate) owner: String,
    pub(crate) host: String,
    /// The mount's control socket, recorded in the locks ([`LockInfo::control`]).
    pub(crate) control: Option<String>,
}

impl<V> Attachments<V> {
    pub(crate) fn new(owner: String, host: String, control: Option<String>) -> Attachments<V> {
        Attachments {
            attached: Mutex::default(),
            held: Mutex::default(),
            lost: Mutex::default(),
            any_lost: AtomicBool::new(false),
            renewing: tokio::sync::Mutex::new(()),
            owner,
            host,
            control,
        }
    }

    /// The name of VDI `vid` if its lock was lost while attached.
    pub(crate) fn lost(&self, vid: u32) -> Option<String> {
        if !self.any_lost.load(Ordering::Acquire) {
            return None;
        }
        self.lost.lock().unwrap().get(&vid).cloned()
    }

    /// Forgets `vid`'s lock (released, or lost).
    pub(crate) fn unheld(&self, vid: u32) {
        self.held.lock().unwrap().remove(&vid);
    }
}

impl<B: Backend> Inner<B> {
    /// The volume of VDI `vid` while this cache has it attached.
    pub(crate) fn attached_volume(&self, vid: u32) -> Option<Arc<B::Volume>> {
        self.attach.attached.lock().unwrap().get(&vid).cloned()
    }

    /// Takes the VDI's lock and makes the cache match it: data cached under another lock
    /// generation is dropped (refused if it holds unpushed writes).
    pub(crate) async fn attach(&self, name: &str) -> Result<Arc<B::Volume>, CacheError> {
        let vdi = Arc::new(self.client.open(name).await?);
        let vid = vdi.vid().0;
        // Data cached from another cluster (created anew since, with a VDI of the same name
        // or id) is never pushed into this one: set aside first ([`crate::orphan`]).
        let cluster = self.client.cluster_id();
        let foreign: Vec<VdiRecord> = (self.dir.records.read().unwrap().values())
            .filter(|r| (r.vid == vid || r.name == name) && Self::foreign(r, &cluster))
            .cloned()
            .collect();
        for r in foreign {
            self.set_aside(&r, &cluster)?;
        }
        // The generation this cache's data was cached under, taken back if nobody attached
        // since (this mount was killed or cut off for longer than the lock's TTL).
        let resume = (self.dir.records.read().unwrap().get(&vid))
            .filter(|r| r.name == name)
            .map(|r| r.gen);
        let info = (self.client)
            .acquire(
                name,
                &self.attach.owner,
                &self.attach.host,
                Some(self.cfg.lock_ttl),
                resume,
                self.attach.control.as_deref(),
            )
            .await?;
        let gen = info.gen;
        self.attach.held.lock().unwrap().insert(vid, info);
        {
            let mut lost = self.attach.lost.lock().unwrap();
            if lost.remove(&vid).is_some() {
                tracing::info!("VDI '{name}' attached again after its lock was lost");
                if lost.is_empty() {
                    self.attach.any_lost.store(false, Ordering::Release);
                }
            }
        }
        // Its writes (pushes, and mode `off`'s writes, which invalidate what they overwrite)
        // keep this cache coherent: they leave the generation alone.
        self.client.under_lock(&vdi);
        // A record of the same name under another id is a deleted VDI: forget it.
        let stale: Vec<u32> = self
            .dir
            .records
            .read()
            .unwrap()
            .values()
            .filter(|r| r.name == name && r.vid != vid)
            .map(|r| r.vid)
            .collect();
        for old in stale {
            let dropped = self.drop_vdi(old, true);
            tracing::info!(
                "VDI '{name}' was deleted and created again: dropped {} cached of the old one",
                objstore_proto::size::format_size(dropped)
            );
            self.forget_record(old);
        }
        let rec = self.dir.records.read().unwrap().get(&vid).cloned();
        let matches = rec
            .as_ref()
            .is_some_and(|r| r.name == name && (r.gen == gen || (r.released && gen == r.gen + 1)));
        if !matches {
            let dirty = self.dirty_of(vid);
            if dirty > 0 {
                let ours = rec.as_ref().map(|r| r.gen).unwrap_or(0);
                let _round = self.attach.renewing.lock().await;
                self.attach.unheld(vid);
                let _ = self.client.release(name, &self.attach.owner).await;
                return Err(CacheError::Conflict {
                    name: name.to_string(),
                    ours,
                    theirs: gen,
                });
            }
            let dropped = self.drop_vdi(vid, true);
            if dropped > 0 {
                tracing::info!(
                    "VDI '{name}' was attached elsewhere, or written without its lock, since it was cached here: dropped {} of cached data",
                    objstore_proto::size::format_size(dropped)
                );
            }
        }
        let cluster = (!cluster.is_empty()).then_some(cluster);
        let stale = |r: &VdiRecord| r.gen != gen || r.released || r.cluster != cluster;
        if !matches || rec.as_ref().is_some_and(stale) {
            self.save_record(&VdiRecord {
                name: name.to_string(),
                vid,
                gen,
                released: false,
                mode: rec.and_then(|r| r.mode),
                cluster,
            });
        }
        let mut attached = self.attach.attached.lock().unwrap();
        Ok(attached.entry(vid).or_insert(vdi).clone())
    }
}

impl<B: Backend> Cache<B> {
    /// Opens VDI `name` through the cache. Read-write opens attach it (take its lock);
    /// read-only opens of a VDI this mount has not attached bypass the cache, and so do
    /// opens of a VDI in mode `off` that is not attached. An attached VDI in mode `off` is
    /// opened through the cache, which then drops what its writes overwrite.
    pub async fn open_vdi(&self, name: &str, rw: bool) -> Result<Option<CachedVdi<B>>, CacheError> {
        let vdi = Arc::new(self.inner.client.open(name).await?);
        let vid = vdi.vid().0;
        let attached = self.inner.attached_volume(vid);
        if self.inner.mode_of(vid) == CacheMode::Off && attached.is_none() {
            return Ok(None);
        }
        let vdi = match attached {
            Some(v) => {
                v.refresh().await?;
                v
            }
            None if rw => self.inner.attach(name).await?,
            None => return Ok(None),
        };
        Ok(Some(CachedVdi::new(self.inner.clone(), vdi)))
    }

    /// A handle on VDI `vid` (named `name`) for taking over its open file from plain handles
    /// (after `cachectl mode` set a caching mode): attaches the VDI, and its requests wait until
    /// [`CachedVdi::open_gate`], which the caller calls once the plain handles' requests in
    /// flight are done.
    pub async fn take_over(&self, vid: u32, name: &str) -> Result<CachedVdi<B>, CacheError> {
        let attached = self.inner.attached_volume(vid);
        let vdi = match attached {
            Some(v) => v,
            None => self.inner.attach(name).await?,
        };
        Ok(CachedVdi::gated(self.inner.clone(), vdi))
    }

    /// Deletes a VDI through `delete` (given this cache's lock owner: the VDI may be attached
    /// here), and only once that succeeded drops what is cached of it (dirty data too),
    /// detaches it and forgets its record. While `delete` runs no push of the VDI runs or
    /// starts (one landing after it would make its objects again), and its lease is not
    /// renewed; if it fails, the VDI stays attached with its cached data, dirty data
    /// included, and its lease is renewed again.
    pub async fn delete_vdi<E, F>(
        &self,
        name: &str,
        delete: impl FnOnce(String) -> F,
    ) -> Result<(), E>
    where
        F: std::future::Future<Output = Result<(), E>>,
    {
        let inner = &self.inner;
        let owner = inner.attach.owner.clone();
        let Some(vid) = inner.vid_of(name) else {
            return delete(owner).await;
        };
        let _pushes = inner.pushes.push_lock.lock().await;
        // Its lease is not renewed meanwhile (a renewal after the delete would find the lock
        // gone and take the VDI for lost); the other VDIs' renewals go on.
        let held = {
            let _round = inner.attach.renewing.lock().await;
            inner.attach.held.lock().unwrap().remove(&vid)
        };
        let detached = inner.detach_quiet(vid).await;
        if let Err(e) = delete(owner).await {
            if let Some(v) = detached {
                inner.attach.attached.lock().unwrap().insert(vid, v);
            }
            if let Some(h) = held {
                // Renewed again (taken back at its generation if its lease ended meanwhile).
                inner.attach.held.lock().unwrap().insert(vid, h);
            }
            return Err(e);
        }
        let dropped = inner.drop_vdi(vid, true);
        inner.forget_record(vid);
        tracing::info!(
            "dropped {} cached of deleted VDI '{name}'",
            objstore_proto::size::format_size(dropped)
        );
        Ok(())
    }
}

/// Renews the leases of this mount's locks every third of their TTL, for as long as the
/// cache lives (see the module doc).
pub(crate) async fn lock_keeper<B: Backend>(
    inner: std::sync::Weak<Inner<B>>,
    ttl: std::time::Duration,
) {
    let period = (ttl / 3).max(std::time::Duration::from_millis(100));
    loop {
        tokio::time::sleep(period).await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        let _round = inner.attach.renewing.lock().await;
        let held: Vec<(u32, LockInfo)> = inner
            .attach
            .held
            .lock()
            .unwrap()
            .iter()
            .map(|(v, i)| (*v, i.clone()))
            .collect();
        for (vid, info) in held {
            // Released meanwhile (by a release that waited for the previous round)?
            if !(inner.attach.held.lock().unwrap())
                .get(&vid)
                .is_some_and(|h| *h == info)
            {
                continue;
            }
            match inner.client.keepalive(&info).await {
                Ok(Renewal::Alive) => {}
                Ok(Renewal::Retaken(now)) => {
                    tracing::warn!(
                        "the lease of VDI '{}''s lock had ended (the cluster was out of reach for its TTL, or the lock was broken); nobody attached it since: lock taken back, generation {}",
                        info.vdi,
                        now.gen
                    );
                    inner.attach.held.lock().unwrap().insert(vid, now);
                }
                Ok(Renewal::Lost(holder)) => inner.lock_lost(vid, &info, holder),
                Err(e) => tracing::warn!(
                    "renewing the lease of VDI '{}''s lock: {} (retried in {:?}; the lock is lost if this lasts {:?})",
                    info.vdi,
                    crate::chain(&e),
                    period,
                    ttl
                ),
            }
        }
    }
}

impl<B: Backend> Inner<B> {
    /// Detaches `vid`: a push that wants to make room then fails (and leaves the data dirty)
    /// instead of starting, and the pushes of it under way are waited for. Returns what it
    /// was attached as, for the caller to put back if its change fails.
    pub(crate) async fn detach_quiet(&self, vid: u32) -> Option<Arc<B::Volume>> {
        let detached = self.attach.attached.lock().unwrap().remove(&vid);
        let objects: Vec<crate::space::Pinned> = (self.space.objects.lock().unwrap())
            .iter()
            .filter(|(k, _)| k.0 == vid)
            .map(|(_, o)| self.space.pin(o))
            .collect();
        for o in &objects {
            drop(o.pushing.lock().await);
        }
        detached
    }

    /// The lock of `vid` ended and another attachment came: detach, fail writes.
    fn lock_lost(&self, vid: u32, info: &LockInfo, holder: Option<LockInfo>) {
        let now = Renewal::lost_to(holder.as_ref());
        tracing::error!(
            "lost the lock of VDI '{}' (generation {}): its lease ended and {now}; writes to it through this mount now fail with EIO ({} unpushed here stay in the cache: see 'cachectl evict {} --discard-dirty')",
            info.vdi,
            info.gen,
            objstore_proto::size::format_size(self.dirty_of(vid)),
            info.vdi,
        );
        self.attach.unheld(vid);
        self.attach
            .lost
            .lock()
            .unwrap()
            .insert(vid, info.vdi.clone());
        self.attach.any_lost.store(true, Ordering::Release);
        self.attach.attached.lock().unwrap().remove(&vid);
    }
}
