//! Moving an attached VDI to a new inode without letting go of it: a snapshot or a rollback
//! taken by the mount that holds the VDI's lock (`cachectl snapshot | rollback`, or `dog vdi
//! snapshot | rollback` asking the mount). After either the VDI has a new id (its old inode is
//! the frozen snapshot, or is freed), and the cache keys what it holds by VDI id:
//!
//! 1. A snapshot first pushes every dirty block of the VDI and flushes the cluster (fsync
//!    semantics: the snapshot holds every write acknowledged before it). A rollback instead
//!    throws them away: what was written since the snapshot is what a rollback discards.
//! 2. The VDI is detached here: no push of it starts, one under way is waited for. The
//!    operation runs with this cache's lock owner, which the cluster lets through.
//! 3. Everything cached of the old id is dropped and its record forgotten. Clean data of a
//!    snapshot's old inode would still be right for the new one, but its files are keyed by
//!    id: it is fetched again on the next reads (`docs/sheepfs.md` has the cost). The new
//!    inode is attached under the same lock, generation and mode.
//!
//! The caller (sheepfs) keeps every request of the VDI out from before step 1 to after step 3,
//! and makes new handles afterwards ([`Cache::open_vdi`]): no handle of the old id writes
//! again, so nothing is ever written into a snapshot's objects, and no reader gets old cached
//! data mixed with new.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use objstore_client::{VdiError, Volume};

use crate::dir::VdiRecord;
use crate::{Backend, Cache, CacheError};

/// What [`Cache::switch_vdi`] did besides the operation.
#[derive(Debug)]
pub struct Switched<T> {
    /// What the operation returned.
    pub result: T,
    /// Whether the VDI was attached to this cache (else the cache had nothing to do).
    pub attached: bool,
    /// Dirty bytes pushed to the cluster first (snapshot).
    pub flushed: u64,
    /// Bytes cached of the old inode, dropped (dirty ones included).
    pub dropped: u64,
    /// Of them, dirty bytes never pushed that were thrown away (rollback).
    pub discarded_dirty: u64,
}

impl<B: Backend> Cache<B> {
    /// Runs `op` (given this cache's lock owner), a snapshot or a rollback of VDI `name`
    /// that gives it a new inode, and moves the cache's state of the VDI to that inode (see
    /// the module doc). `discard`: throw the VDI's dirty data away (a rollback) instead of
    /// pushing it first (a snapshot). If `op` fails, nothing changed: the VDI stays attached
    /// with what it had cached, dirty data included.
    pub async fn switch_vdi<T, F>(
        &self,
        name: &str,
        discard: bool,
        op: impl FnOnce(String) -> F,
    ) -> Result<Switched<T>, CacheError>
    where
        F: Future<Output = Result<T, VdiError>>,
    {
        let inner = &self.inner;
        let owner = inner.attach.owner.clone();
        let attached = (inner.vid_of(name)).filter(|v| inner.attached_volume(*v).is_some());
        let Some(vid) = attached else {
            // Not attached here: nothing cached of it is used before it is attached again,
            // and attaching drops the records of the name under an older id.
            let result = op(owner).await?;
            return Ok(Switched {
                result,
                attached: false,
                flushed: 0,
                dropped: 0,
                discarded_dirty: 0,
            });
        };
        if let Some(name) = inner.attach.lost(vid) {
            return Err(CacheError::LockLost { name });
        }
        let (flushed, _pushes) = if discard {
            (0, inner.pushes.push_lock.lock().await)
        } else {
            inner
                .flush_to_let_go(vid, name, "take the snapshot")
                .await?
        };
        let detached = inner.detach_quiet(vid).await;
        let result = match op(owner).await {
            Ok(r) => r,
            Err(e) => {
                if let Some(v) = detached {
                    inner.attach.attached.lock().unwrap().insert(vid, v);
                }
                return Err(e.into());
            }
        };
        let dirty = inner.dirty_of(vid);
        let mut dropped = inner.drop_vdi(vid, true);
        // An object a fill still pins is dropped once the fill is done.
        for _ in 0..200 {
            if inner.dirty_of(vid) == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
            dropped += inner.drop_vdi(vid, true);
        }
        let rec = inner.dir.records.read().unwrap().get(&vid).cloned();
        inner.forget_record(vid);
        let vol = open_again(&inner.client, name).await?;
        inner.client.under_lock(&vol);
        let new = vol.vid().0;
        let held = inner.attach.held.lock().unwrap().remove(&vid);
        let gen = match (&rec, &held) {
            (Some(r), _) => r.gen,
            (None, Some(h)) => h.gen,
            (None, None) => 0,
        };
        inner.save_record(&VdiRecord {
            name: name.to_string(),
            vid: new,
            gen,
            released: false,
            mode: rec.as_ref().and_then(|r| r.mode),
            cluster: rec.and_then(|r| r.cluster),
        });
        if let Some(h) = held {
            inner.attach.held.lock().unwrap().insert(new, h);
        }
        inner
            .attach
            .attached
            .lock()
            .unwrap()
            .insert(new, Arc::new(vol));
        tracing::info!(
            "VDI '{name}' moved to its new inode {new:x} (was {vid:x}): dropped {} cached of the old one",
            objstore_proto::size::format_size(dropped)
        );
        Ok(Switched {
            result,
            attached: true,
            flushed,
            dropped,
            discarded_dirty: dirty,
        })
    }
}

/// Opens `name` after the operation moved it, retrying for a while: the lock stays held (its
/// lease renewed) whatever happens, and the next read-write open attaches it if this fails.
async fn open_again<B: Backend>(client: &B, name: &str) -> Result<B::Volume, CacheError> {
    let mut attempt = 0u64;
    loop {
        match client.open(name).await {
            Ok(v) => return Ok(v),
            Err(e) if attempt >= 5 => return Err(e.into()),
            Err(e) => {
                attempt += 1;
                tracing::warn!("opening VDI '{name}' at its new inode (attempt {attempt}): {e}");
                tokio::time::sleep(Duration::from_millis(200 * attempt)).await;
            }
        }
    }
}
