//! A snapshot or a rollback of a VDI this mount may hold, asked over the control socket
//! (`cachectl snapshot | rollback`, or `dog vdi snapshot | rollback` finding the VDI attached
//! here). Either gives the VDI a new inode (id); the mount must go on with it, or it would
//! write into the frozen snapshot's objects, or serve the data a rollback discarded.
//!
//! ```text
//!  opens wait (Shared::switching) ─┐
//!  the VDI's requests wait, those in flight finish (OpenVdi::gate, held exclusively)
//!  Cache::switch_vdi: flush dirty data (snapshot) or drop it (rollback); the operation under
//!                     this cache's lock owner; the cache's state moved to the new inode
//!  the open file's handle replaced by one of the new inode
//!  requests go on ─────────────────┘
//! ```
//!
//! A rollback under an open file: the file goes on, reading and writing the rolled-back VDI
//! (no request sees a mix: they are all done before the switch or start after it, and nothing
//! cached of the old inode is kept). If the new inode cannot be opened, the file's requests
//! fail with EIO until it is opened again.

use std::sync::Arc;

use cache_control::Switched;
use objcache::{chain, Cache, CacheError};
use objstore_client::vdi::{self, VdiInfo};
use objstore_client::{Vdi, VdiError};

use crate::handles::{Disk, Shared};

/// A snapshot or a rollback, as the control socket asks it.
pub(crate) enum Op {
    Snapshot { vdi: String, tag: Option<String> },
    Rollback { snapshot: String },
}

impl Op {
    fn vdi(&self) -> Result<String, VdiError> {
        match self {
            Op::Snapshot { vdi, .. } => {
                vdi::validate_name(vdi)?;
                Ok(vdi.clone())
            }
            Op::Rollback { snapshot } => match vdi::split_snapshot(snapshot)? {
                (name, Some(_)) => Ok(name.to_string()),
                (name, None) => Err(VdiError::NotSnapshot(name.to_string())),
            },
        }
    }

    async fn run(
        &self,
        client: &Arc<objstore_client::Client>,
        owner: &str,
    ) -> Result<VdiInfo, VdiError> {
        match self {
            Op::Snapshot { vdi, tag } => {
                vdi::snapshot(client, vdi, tag.as_deref(), Some(owner)).await
            }
            Op::Rollback { snapshot } => vdi::rollback(client, snapshot, Some(owner)).await,
        }
    }
}

impl Shared {
    /// Runs `op` on the VDI it names and switches this mount to the VDI's new inode (see the
    /// module doc). Errors are for the control socket's reply.
    pub(crate) async fn switch(&self, cache: &Cache, op: Op) -> Result<Switched, String> {
        let name = op.vdi().map_err(|e| e.to_string())?;
        let rollback = matches!(op, Op::Rollback { .. });
        let _no_opens = self.switching.write().await;
        let ino = self.names.lock().unwrap().known(&name);
        let gate = ino.and_then(|ino| self.open.lock().unwrap().get(&ino).map(|o| o.gate.clone()));
        // Requests in flight finish first; new ones wait until this is dropped.
        let _quiet = match &gate {
            Some(g) => Some(g.clone().write_owned().await),
            None => None,
        };
        let open = ino.and_then(|ino| {
            let open = self.open.lock().unwrap();
            open.get(&ino).map(|o| (o.disk.clone(), o.writers > 0))
        });
        if let (Some((Disk::Plain(v, _), _)), false) = (&open, rollback) {
            // Written straight to the cluster (mode off): flushed there before the snapshot.
            v.flush().await.map_err(|e| {
                format!("flushing '{name}' before the snapshot failed, nothing was taken: {e}")
            })?;
        }
        let client = self.client.clone();
        let done = cache
            .switch_vdi(&name, rollback, |owner| async move { op.run(&client, &owner).await })
            .await
            .map_err(|e| match &e {
                CacheError::Push { .. } => format!(
                    "flushing '{name}' before the snapshot failed, nothing was taken (its data stays dirty and is retried): {}",
                    chain(&e)
                ),
                _ => chain(&e),
            })?;
        let info = &done.result;
        let mut new_vid = 0;
        if let (Some(ino), Some((disk, rw))) = (ino, &open) {
            let fresh = self.reopen(cache, &name, disk, *rw).await;
            let mut table = self.open.lock().unwrap();
            if let Some(o) = table.get_mut(&ino) {
                match fresh {
                    Ok(d) => {
                        new_vid = d.vdi().header().vid.0;
                        o.disk = d;
                        o.stale = None;
                    }
                    Err(e) => {
                        o.stale = Some(format!(
                            "VDI '{name}' moved to a new inode that this mount could not open ({e}): its open files fail with EIO until opened again"
                        ));
                        tracing::error!("{}", o.stale.as_deref().unwrap_or_default());
                    }
                }
            }
        }
        if rollback {
            new_vid = info.vid.0;
        }
        if new_vid == 0 {
            new_vid = match Vdi::open(self.client.clone(), &name).await {
                Ok(v) => v.header().vid.0,
                Err(_) => 0,
            };
        }
        let (snapshot, vid) = if rollback {
            (info.parent.clone().unwrap_or_default(), info.parent_vid.0)
        } else {
            (info.full_name(), info.vid.0)
        };
        let what = if rollback {
            "rolled back to"
        } else {
            "took snapshot"
        };
        tracing::info!(
            "{what} '{snapshot}' of VDI '{name}' (asked over the control socket); the VDI is now inode {new_vid:x}{}",
            if done.discarded_dirty > 0 {
                format!(
                    "; discarded {} of writes never pushed",
                    objstore_proto::size::format_size(done.discarded_dirty)
                )
            } else {
                String::new()
            }
        );
        Ok(Switched {
            vdi: name,
            snapshot,
            vid,
            new_vid,
            attached: done.attached,
            open: open.is_some(),
            flushed: done.flushed,
            dropped: done.dropped,
            discarded_dirty: done.discarded_dirty,
        })
    }

    /// A handle of `name`'s new inode to replace `old` (the open file's): through the cache
    /// if `old` was.
    async fn reopen(
        &self,
        cache: &Cache,
        name: &str,
        old: &Disk,
        rw: bool,
    ) -> Result<Disk, String> {
        if let Disk::Cached(_) = old {
            match cache.open_vdi(name, true).await {
                Ok(Some(c)) => return Ok(Disk::Cached(Arc::new(c))),
                Ok(None) => {}
                Err(e) => return Err(chain(&e)),
            }
        }
        let v = Vdi::open(self.client.clone(), name)
            .await
            .map_err(|e| e.to_string())?;
        if rw && matches!(old, Disk::Plain(..)) && self.locks.is_some() {
            v.set_under_lock();
        }
        Ok(Disk::Plain(Arc::new(v), Arc::default()))
    }
}
