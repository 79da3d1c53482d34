//! The cache's life: opening its directory at mount (how the last mount ended decides what
//! is trusted), starting its workers, and shutting down at unmount (everything pushed, files
//! durable, locks released, the directory marked clean).

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use objstore_client::Volume;

use crate::attach::{lock_keeper, Attachments};
use crate::dir::{boot_id, hostname, rand_u64, write_json_atomic, CacheDir, DirState, VdiRecord};
use crate::fill::{fill_worker, Fills};
use crate::object;
use crate::push::{flusher, Pushes};
use crate::space::{Pinned, Space};
use crate::stats::Stats;
use crate::{chain, Backend, Cache, CacheConfig, CacheError, Inner};

impl<B: Backend> Cache<B> {
    /// Opens the cache directory: checks how the last mount ended, loads or drops what is
    /// there, and marks the directory in use.
    pub fn open(cfg: CacheConfig, client: B) -> Result<Cache<B>, CacheError> {
        let dir = cfg.dir.clone();
        let derr = |what: &'static str| {
            let dir = dir.clone();
            move |source| CacheError::Dir { dir, what, source }
        };
        for sub in ["obj", "vdis"] {
            std::fs::create_dir_all(dir.join(sub)).map_err(derr("create"))?;
        }
        {
            use std::os::unix::fs::PermissionsExt;
            // Cached VDI data is nobody else's business.
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
                .map_err(derr("chmod"))?;
        }
        let dir_lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join("lock"))
            .map_err(derr("open lock"))?;
        use std::os::unix::io::AsRawFd;
        // SAFETY: flock on a valid descriptor, held for the life of the cache.
        if unsafe { libc::flock(dir_lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Err(CacheError::InUse { dir });
        }
        let state_path = dir.join("state.json");
        let boot = boot_id();
        let prev: Option<DirState> = std::fs::read(&state_path)
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok());
        let cache_id = prev
            .as_ref()
            .map(|p| p.cache_id.clone())
            .unwrap_or_else(|| format!("{:016x}", rand_u64()));
        let trusted = match &prev {
            None => true,
            Some(p) => p.clean || p.boot_id == boot,
        };
        let host = hostname();
        let inner = Inner {
            client,
            dir: CacheDir {
                _lock: dir_lock,
                records: RwLock::default(),
            },
            space: Space::new(&dir, cfg.size),
            attach: Attachments::new(
                format!("{host}/{cache_id}"),
                host,
                Some(dir.join(cache_control::SOCKET_NAME).display().to_string()),
            ),
            fills: Fills::new(cfg.size),
            pushes: Pushes::default(),
            stats: Stats::default(),
            closing: Default::default(),
            reattaching: tokio::sync::watch::Sender::new(0),
            cfg,
        };
        let keys = object::scan(&inner.space.obj_dir);
        if !trusted {
            tracing::warn!(
                "cache {}: the host went down while it was mounted; its {} cached object(s) cannot be trusted and are dropped (writes never fsynced are lost, as on any disk)",
                dir.display(),
                keys.len()
            );
            for k in &keys {
                object::remove_key(&inner.space.obj_dir, *k);
            }
        } else {
            if prev.as_ref().is_some_and(|p| !p.sums) {
                crate::files::drop_sums(&inner.space.obj_dir);
            }
            inner.load_objects(keys);
        }
        for e in std::fs::read_dir(dir.join("vdis"))
            .map_err(derr("list"))?
            .flatten()
        {
            if let Some(r) = std::fs::read(e.path())
                .ok()
                .and_then(|b| serde_json::from_slice::<VdiRecord>(&b).ok())
            {
                inner.dir.records.write().unwrap().insert(r.vid, r);
            }
        }
        write_json_atomic(
            &state_path,
            &DirState {
                cache_id,
                boot_id: boot,
                clean: false,
                sums: true,
            },
        )
        .map_err(derr("write state"))?;
        tracing::info!(
            "cache {}: {} of {} used, {} dirty",
            dir.display(),
            objstore_proto::size::format_size(inner.space.used.load(Ordering::Relaxed)),
            objstore_proto::size::format_size(inner.cfg.size),
            objstore_proto::size::format_size(inner.space.dirty.load(Ordering::Relaxed)),
        );
        Ok(Cache {
            inner: Arc::new(inner),
        })
    }

    /// Starts the flusher and the fill thread, and attaches every VDI that still has
    /// unpushed writes from an earlier mount so they are pushed.
    pub fn start(&self, rt: &tokio::runtime::Handle) -> Result<(), CacheError> {
        rt.spawn(flusher(self.inner.clone()));
        rt.spawn(lock_keeper(
            Arc::downgrade(&self.inner),
            self.inner.cfg.lock_ttl,
        ));
        if let Some(rx) = self.inner.fills.fill_rx.lock().unwrap().take() {
            // One fill thread. Two kept the disk busier on a first sequential read (more of it
            // cached), but cold random reads at depth 16 fell to about 0.6x cache-off in some
            // harness rounds (2 of 3, 1 of 2, 1 of 3; none with one thread).
            let inner = self.inner.clone();
            std::thread::Builder::new()
                .name("cache-fill".into())
                .spawn(move || fill_worker(&inner, rx))
                .map_err(|source| CacheError::Dir {
                    dir: self.inner.cfg.dir.clone(),
                    what: "starting the fill thread",
                    source,
                })?;
        }
        // VDIs with unpushed writes, and VDIs the last mount attached without releasing (a
        // kill -9): attach them again so the writes are pushed and the locks end up released.
        let mut pending: HashSet<u32> = self
            .inner
            .space
            .objects
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, o)| !o.state.lock().unwrap().dirty.is_empty())
            .map(|(k, _)| k.0)
            .collect();
        pending.extend(
            self.inner
                .dir
                .records
                .read()
                .unwrap()
                .values()
                .filter(|r| !r.released)
                .map(|r| r.vid),
        );
        self.inner.reattaching.send_replace(pending.len());
        for vid in pending {
            let name = self
                .inner
                .dir
                .records
                .read()
                .unwrap()
                .get(&vid)
                .map(|r| r.name.clone());
            let inner = self.inner.clone();
            rt.spawn(async move {
                let Some(name) = name else {
                    inner.reattaching.send_modify(|n| *n -= 1);
                    tracing::error!("cache holds unpushed writes of VDI id {vid:x} but no record of its name; they stay in the cache");
                    return;
                };
                let attached = inner.attach(&name).await;
                inner.reattaching.send_modify(|n| *n -= 1);
                match attached {
                    Ok(_) => {
                        tracing::info!("pushing unpushed writes of VDI '{name}' left by the last mount");
                        match inner.flush(Some(vid), |_, _| {}).await {
                            Ok(n) => tracing::info!(
                                "pushed {} left by the last mount",
                                objstore_proto::size::format_size(n)
                            ),
                            Err(e) => tracing::warn!(
                                "pushing what the last mount left: {e} (the flusher retries)"
                            ),
                        }
                    }
                    Err(e) => inner.push_failed(format!("attaching '{name}' to push its writes: {}", chain(&e))),
                }
            });
        }
        Ok(())
    }

    /// Unmount: push everything, make the files durable, release locks, mark the directory
    /// clean. Returns the dirty bytes left (0 unless the cluster could not take them).
    pub async fn shutdown(&self) -> u64 {
        let inner = &self.inner;
        // Files may still be open and written (a signal detaches the mount): from here on
        // their writes go to the cluster, and no write adds dirty data after this push.
        inner.start_closing().await;
        for attempt in 1..=3 {
            match inner.flush(None, |_, _| {}).await {
                Ok(_) => break,
                Err(e) => {
                    inner.push_failed(format!(
                        "unmount push (attempt {attempt} of 3): {}",
                        chain(&e)
                    ));
                    tokio::time::sleep(Duration::from_secs(attempt)).await;
                }
            }
        }
        let left = inner.space.dirty.load(Ordering::SeqCst);
        inner.save_unsaved();
        let objs: Vec<Pinned> = inner
            .space
            .objects
            .lock()
            .unwrap()
            .iter()
            .map(|(_, o)| inner.space.pin(o))
            .collect();
        for o in objs {
            if let Err(e) = o.sync() {
                tracing::warn!("syncing cached object {:?}: {e}", o.key);
            }
        }
        // Before the clean mark below, which makes the next mount trust these files.
        if let Err(e) = inner.space.sync_dirs() {
            tracing::warn!("syncing the cache's directories: {e}");
        }
        inner.save_index();
        // No renewal from here on: the locks are released, or made persistent.
        let _renewals = inner.attach.renewing.lock().await;
        let attached: Vec<(u32, Arc<B::Volume>)> =
            inner.attach.attached.lock().unwrap().drain().collect();
        for (vid, v) in attached {
            inner.attach.unheld(vid);
            if inner.dirty_of(vid) > 0 {
                // Its lease would end with this mount: the lock is made persistent instead
                // (same generation), so that no other host attaches over the unpushed writes.
                let kept = inner
                    .client
                    .acquire(
                        &v.name(),
                        &inner.attach.owner,
                        &inner.attach.host,
                        None,
                        None,
                        None,
                    )
                    .await;
                match kept {
                    Ok(_) => tracing::error!(
                        "VDI '{}' keeps unpushed writes in the cache: its lock stays held (persistent, no lease); they are pushed at the next mount",
                        v.name()
                    ),
                    Err(e) => tracing::error!(
                        "VDI '{}' keeps unpushed writes in the cache, and its lock could not be made persistent ({}): it frees itself when its lease ends; they are pushed at the next mount unless another host attaches first",
                        v.name(),
                        chain(&e)
                    ),
                }
                continue;
            }
            match inner.client.release(&v.name(), &inner.attach.owner).await {
                Ok(()) => {
                    let rec = inner.dir.records.read().unwrap().get(&vid).cloned();
                    if let Some(mut r) = rec {
                        r.released = true;
                        inner.save_record(&r);
                    }
                }
                Err(e) => tracing::warn!("releasing the lock of '{}': {e}", v.name()),
            }
        }
        // The locks are released: writes still coming (open files) are refused.
        inner.refuse_writes();
        let state_path = inner.cfg.dir.join("state.json");
        if let Ok(mut st) = std::fs::read(&state_path)
            .map_err(|_| ())
            .and_then(|b| serde_json::from_slice::<DirState>(&b).map_err(|_| ()))
        {
            st.clean = true;
            let _ = write_json_atomic(&state_path, &st);
        }
        left
    }
}
