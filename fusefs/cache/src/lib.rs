//! The object cache: a directory on fast local disk, bounded in bytes, LRU, between sheepfs
//! and the cluster.
//!
//! ```text
//! DIR/state.json            {cache_id, boot_id, clean}: how the last mount ended
//! DIR/control.sock          cachectl's socket (0600), served by sheepfs (`cache_control`)
//! DIR/index/                sled: last access per object (rebuilt from files when lost)
//! DIR/vdis/<vid>.json       {name, vid, gen, mode}: the lock generation the cache matches
//! DIR/obj/<vid>/<idx>.data  cached bytes (sparse)
//! DIR/obj/<vid>/<idx>.meta  valid and dirty bitmaps, one bit per 4 KiB block
//! ```
//! Invariants:
//! - A block is dirty only if it is valid; dirty blocks are never evicted or dropped except by
//!   an explicit `evict --discard-dirty`.
//! - After a kill -9 of sheepfs the files are trusted (the host's page cache holds them) and
//!   the dirty blocks are pushed at the next mount. After the host went down while mounted
//!   (another boot id, not marked clean) nothing is trusted: everything is dropped, losing
//!   only writes never fsynced, as on any disk.
//! - A VDI's cached data is used only while this cache holds its attachment lock and the lock's
//!   generation equals the one recorded when the data was cached: if another host attached the
//!   VDI since, the data is dropped on attach.

mod admit;
mod bitmap;
mod error;
mod object;
mod pressure;
mod spare;
mod vdi;

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use lru::LruCache;
use objstore_client::{lock, Client, Vdi};
use serde::{Deserialize, Serialize};
use tokio::sync::Notify;

use cache_control::{CacheMode, CacheStats, VdiStats};
use object::{CachedObject, Key, BLOCK};

pub use error::{chain, CacheError, PushError};
pub use vdi::{CachedVdi, Missed};

#[derive(Debug, Clone)]
pub struct CacheConfig {
    pub dir: PathBuf,
    pub size: u64,
    pub mode: CacheMode,
    pub max_dirty: u64,
    pub max_dirty_age: Duration,
    /// Sequential runs longer than this are streams, cached on their second pass (0: on
    /// their first); see [`CachedVdi`]'s stream tracking.
    pub sequential_cutoff: u64,
}

#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    hit_bytes: AtomicU64,
    misses: AtomicU64,
    miss_bytes: AtomicU64,
    fills: AtomicU64,
    fill_bytes: AtomicU64,
    evictions: AtomicU64,
    evicted_bytes: AtomicU64,
    skipped_fills: AtomicU64,
    busy_skipped_fills: AtomicU64,
    stream_bypasses: AtomicU64,
    pushed_bytes: AtomicU64,
}

impl Counters {
    fn add(c: &AtomicU64, n: u64) {
        c.fetch_add(n, Ordering::Relaxed);
    }
}

/// A VDI's mode in one atomic ([`Inner::mode_cell`]).
struct ModeCell(std::sync::atomic::AtomicU8);

impl ModeCell {
    fn new(mode: CacheMode) -> ModeCell {
        ModeCell(std::sync::atomic::AtomicU8::new(mode as u8))
    }

    fn set(&self, mode: CacheMode) {
        self.0.store(mode as u8, Ordering::SeqCst);
    }

    fn get(&self) -> CacheMode {
        match self.0.load(Ordering::SeqCst) {
            m if m == CacheMode::Writeback as u8 => CacheMode::Writeback,
            m if m == CacheMode::Writethrough as u8 => CacheMode::Writethrough,
            _ => CacheMode::Off,
        }
    }
}

/// Bytes of fetched data waiting to be written into the cache, at most: past it a fetched
/// range is simply not cached, so a slow cache disk never slows the reads themselves.
const FILL_BUDGET: u64 = 16 << 20;

/// A fetched range shorter than this (a random read) is written into the cache by the
/// runtime thread that fetched it, right after its reader has the reply, when no other fill
/// is queued: a buffered write of a few KiB costs less than waking the fill thread (at
/// iodepth 1 that wake-up was a fifth of a miss's CPU). It goes to the fill thread after all
/// when that would mean creating the object's files or evicting; longer ranges (which start
/// their writeback, so a runtime thread never does), and ranges arriving while others wait
/// (the fill thread is awake then), always do.
const INLINE_FILL: u64 = object::WRITEBACK_FILL;
/// The most the fill thread writes at once (queued ranges that continue each other, merged).
const MAX_FILL_BATCH: u64 = 4 << 20;
/// Queued ranges the fill thread takes at once to look for ranges to merge.
const MAX_FILL_JOBS: usize = 64;

/// A range fetched on a miss, to be written into the cache (by the fill thread, or right on
/// the runtime thread that fetched it: see [`INLINE_FILL`]).
struct FillJob {
    key: Key,
    object_size: u64,
    start: u64,
    data: bytes::Bytes,
    /// [`Inner::bypass_writes`] when the fetch started.
    bypass: u64,
    counters: Arc<Counters>,
    /// Runs once the job is done or dropped.
    done: Box<dyn FnOnce() + Send>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct VdiRecord {
    name: String,
    vid: u32,
    /// The lock generation the cached data belongs to.
    gen: u64,
    /// This cache released that lock cleanly (all pushed): if the next lock generation is
    /// ours again, nobody else attached in between.
    #[serde(default)]
    released: bool,
    mode: Option<CacheMode>,
}

#[derive(Serialize, Deserialize)]
struct DirState {
    cache_id: String,
    boot_id: String,
    clean: bool,
}

pub(crate) struct Inner {
    _dir_lock: std::fs::File,
    cfg: CacheConfig,
    size: AtomicU64,
    obj_dir: PathBuf,
    client: Arc<Client>,
    owner: String,
    host: String,
    objects: Mutex<LruCache<Key, Arc<CachedObject>>>,
    used: AtomicU64,
    dirty: AtomicU64,
    records: RwLock<HashMap<u32, VdiRecord>>,
    /// VDIs attached read-write (lock held) by this mount.
    attached: Mutex<HashMap<u32, Arc<Vdi>>>,
    counters: Mutex<HashMap<u32, Arc<Counters>>>,
    /// The modes of VDIs with handles, as their requests read them ([`Inner::mode_cell`]).
    mode_cells: Mutex<HashMap<u32, Arc<ModeCell>>>,
    push_errors: AtomicU64,
    last_push_error: Mutex<Option<String>>,
    /// When the index last recorded the objects' last uses ([`object::clock_ms`]).
    index_saved_at: AtomicU64,
    /// Objects whose bitmaps fills changed since they were last written (weak: eviction
    /// does not wait for the flusher).
    unsaved: Mutex<Vec<std::sync::Weak<CachedObject>>>,
    index: Option<sled::Tree>,
    wake_flusher: Notify,
    push_lock: tokio::sync::Mutex<()>,
    /// Bumped by every write that reaches the cluster without updating the cache (partial
    /// blocks in writethrough, mode off): a fill fetched before it must not be cached.
    pub(crate) bypass_writes: AtomicU64,
    /// Bytes fetched on misses that wait to be written into the cache.
    pub(crate) fills_queued: AtomicU64,
    /// Pushes since the cluster was last flushed.
    unflushed: std::sync::atomic::AtomicBool,
    fill_tx: std::sync::mpsc::Sender<FillJob>,
    fill_rx: Mutex<Option<std::sync::mpsc::Receiver<FillJob>>>,
    /// Keys whose files are being created or retired: a key's files are made only once
    /// those of the object it had before are gone (retiring renames them by path, which would
    /// otherwise take the new object's files).
    creating: Mutex<HashSet<Key>>,
    /// Signalled when a key leaves `creating`.
    created: std::sync::Condvar,
    /// Which fetched ranges may displace cached data once the cache is full, and which
    /// objects streams passed through.
    admission: admit::Admission,
    /// Whether the host's CPUs are busy (small misses are then not filled).
    cpu: pressure::CpuPressure,
    /// The next stream id ([`Inner::next_stream`]).
    streams: AtomicU64,
    /// Emptied files of evicted objects, reused for new ones.
    spares: spare::Spares,
}

/// A handle on the cache, shared by the filesystem, the flusher and the control socket.
#[derive(Clone)]
pub struct Cache {
    inner: Arc<Inner>,
}

fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn write_json_atomic<T: Serialize>(path: &Path, v: &T) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    let f = std::fs::File::create(&tmp)?;
    serde_json::to_writer_pretty(&f, v).map_err(std::io::Error::other)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)?;
    if let Some(d) = path.parent() {
        std::fs::File::open(d)?.sync_all()?;
    }
    Ok(())
}

fn key_bytes(k: Key) -> [u8; 8] {
    let mut b = [0u8; 8];
    b[..4].copy_from_slice(&k.0.to_be_bytes());
    b[4..].copy_from_slice(&k.1.to_be_bytes());
    b
}

/// Opens the sled index, recreating it if it is missing or unreadable: it only holds what the
/// cache files can rebuild.
fn open_index(dir: &Path) -> Option<sled::Tree> {
    let path = dir.join("index");
    let open = || {
        sled::Config::new()
            .path(&path)
            .open()
            .and_then(|db| db.open_tree("atime"))
    };
    match open() {
        Ok(t) => Some(t),
        Err(e) => {
            tracing::warn!(
                "cache index {} is unreadable ({e}): rebuilding it",
                path.display()
            );
            let _ = std::fs::remove_dir_all(&path);
            match open() {
                Ok(t) => Some(t),
                Err(e) => {
                    tracing::warn!(
                        "cache index unavailable ({e}): LRU order starts from directory order"
                    );
                    None
                }
            }
        }
    }
}

impl Cache {
    /// Opens the cache directory: checks how the last mount ended, loads or drops what is
    /// there, and marks the directory in use.
    pub fn open(cfg: CacheConfig, client: Arc<Client>) -> Result<Cache, CacheError> {
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
        let obj_dir = dir.join("obj");
        let host = hostname();
        let (fill_tx, fill_rx) = std::sync::mpsc::channel();
        let inner = Inner {
            _dir_lock: dir_lock,
            size: AtomicU64::new(cfg.size),
            obj_dir: obj_dir.clone(),
            client,
            owner: format!("{host}/{cache_id}"),
            host,
            objects: Mutex::new(LruCache::unbounded()),
            used: AtomicU64::new(0),
            dirty: AtomicU64::new(0),
            records: RwLock::default(),
            attached: Mutex::default(),
            counters: Mutex::default(),
            mode_cells: Mutex::default(),
            push_errors: AtomicU64::new(0),
            last_push_error: Mutex::new(None),
            index_saved_at: AtomicU64::new(0),
            unsaved: Mutex::default(),
            index: open_index(&dir),
            wake_flusher: Notify::new(),
            push_lock: tokio::sync::Mutex::new(()),
            bypass_writes: AtomicU64::new(0),
            fills_queued: AtomicU64::new(0),
            unflushed: std::sync::atomic::AtomicBool::new(false),
            fill_tx,
            fill_rx: Mutex::new(Some(fill_rx)),
            admission: admit::Admission::new(cfg.size),
            cpu: pressure::CpuPressure::new(),
            streams: AtomicU64::new(1),
            spares: spare::Spares::open(dir.join("spare")),
            creating: Mutex::default(),
            created: std::sync::Condvar::new(),
            cfg,
        };
        let keys = object::scan(&obj_dir);
        if !trusted {
            tracing::warn!(
                "cache {}: the host went down while it was mounted; its {} cached object(s) cannot be trusted and are dropped (writes never fsynced are lost, as on any disk)",
                dir.display(),
                keys.len()
            );
            for k in &keys {
                object::remove_key(&obj_dir, *k);
            }
        } else {
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
                inner.records.write().unwrap().insert(r.vid, r);
            }
        }
        write_json_atomic(
            &state_path,
            &DirState {
                cache_id,
                boot_id: boot,
                clean: false,
            },
        )
        .map_err(derr("write state"))?;
        tracing::info!(
            "cache {}: {} of {} used, {} dirty",
            dir.display(),
            objstore_proto::size::format_size(inner.used.load(Ordering::Relaxed)),
            objstore_proto::size::format_size(inner.cfg.size),
            objstore_proto::size::format_size(inner.dirty.load(Ordering::Relaxed)),
        );
        Ok(Cache {
            inner: Arc::new(inner),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.inner.cfg.dir
    }

    /// Starts the flusher and the fill thread, and attaches every VDI that still has
    /// unpushed writes from an earlier mount so they are pushed.
    pub fn start(&self, rt: &tokio::runtime::Handle) -> Result<(), CacheError> {
        rt.spawn(flusher(self.inner.clone()));
        if let Some(rx) = self.inner.fill_rx.lock().unwrap().take() {
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
            .objects
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, o)| !o.state.lock().unwrap().dirty.is_empty())
            .map(|(k, _)| k.0)
            .collect();
        pending.extend(
            self.inner
                .records
                .read()
                .unwrap()
                .values()
                .filter(|r| !r.released)
                .map(|r| r.vid),
        );
        for vid in pending {
            let name = self
                .inner
                .records
                .read()
                .unwrap()
                .get(&vid)
                .map(|r| r.name.clone());
            let inner = self.inner.clone();
            rt.spawn(async move {
                let Some(name) = name else {
                    tracing::error!("cache holds unpushed writes of VDI id {vid:x} but no record of its name; they stay in the cache");
                    return;
                };
                match inner.attach(&name).await {
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

    /// Opens VDI `name` through the cache. Read-write opens attach it (take its lock);
    /// read-only opens of a VDI this mount has not attached bypass the cache, and so do
    /// opens of a VDI in mode `off` that is not attached. An attached VDI in mode `off` is
    /// opened through the cache, which then drops what its writes overwrite.
    pub async fn open_vdi(&self, name: &str, rw: bool) -> Result<Option<CachedVdi>, CacheError> {
        let vdi = Arc::new(Vdi::open(self.inner.client.clone(), name).await?);
        let vid = vdi.header().vid;
        let attached = self.inner.attached.lock().unwrap().get(&vid).cloned();
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
    pub async fn take_over(&self, vid: u32, name: &str) -> Result<CachedVdi, CacheError> {
        let attached = self.inner.attached.lock().unwrap().get(&vid).cloned();
        let vdi = match attached {
            Some(v) => v,
            None => self.inner.attach(name).await?,
        };
        Ok(CachedVdi::gated(self.inner.clone(), vdi))
    }

    /// Pushes every dirty block of `vid` (all VDIs if None) and flushes the cluster.
    pub async fn flush(
        &self,
        vid: Option<u32>,
        progress: impl Fn(u64, u64),
    ) -> Result<u64, PushError> {
        self.inner.flush(vid, progress).await
    }

    /// Unmount: push everything, make the files durable, release locks, mark the directory
    /// clean. Returns the dirty bytes left (0 unless the cluster could not take them).
    pub async fn shutdown(&self) -> u64 {
        let inner = &self.inner;
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
        let left = inner.dirty.load(Ordering::SeqCst);
        inner.save_unsaved();
        let objs: Vec<Arc<CachedObject>> = inner
            .objects
            .lock()
            .unwrap()
            .iter()
            .map(|(_, o)| o.clone())
            .collect();
        for o in objs {
            if let Err(e) = o.sync() {
                tracing::warn!("syncing cached object {:?}: {e}", o.key);
            }
        }
        inner.save_index();
        let attached: Vec<(u32, Arc<Vdi>)> = inner.attached.lock().unwrap().drain().collect();
        for (vid, v) in attached {
            if inner.dirty_of(vid) > 0 {
                tracing::error!(
                    "VDI '{}' keeps unpushed writes in the cache: its lock stays held; they are pushed at the next mount",
                    v.header().name
                );
                continue;
            }
            match lock::release(&inner.client, &v.header().name, &inner.owner).await {
                Ok(()) => {
                    let rec = inner.records.read().unwrap().get(&vid).cloned();
                    if let Some(mut r) = rec {
                        r.released = true;
                        inner.save_record(&r);
                    }
                }
                Err(e) => tracing::warn!("releasing the lock of '{}': {e}", v.header().name),
            }
        }
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

    /// Counters and sizes of the whole cache and of every VDI it holds or counted.
    pub fn stats(&self) -> CacheStats {
        self.inner.stats()
    }

    /// The id of the VDI named `name` as this cache knows it (None: nothing was ever
    /// cached of it).
    pub fn vid_of(&self, name: &str) -> Option<u32> {
        self.inner.vid_of(name)
    }

    /// VDI `vid`'s cache mode (its own, or the default).
    pub fn mode_of(&self, vid: u32) -> CacheMode {
        self.inner.mode_of(vid)
    }

    /// Whether this cache holds VDI `vid`'s attachment lock.
    pub fn is_attached(&self, vid: u32) -> bool {
        self.inner.attached.lock().unwrap().contains_key(&vid)
    }

    /// Drops cached data of `vid` (every VDI if None): clean data only, or dirty data too
    /// if `discard_dirty` (the caller flushed first otherwise). Returns (bytes dropped,
    /// dirty bytes thrown away).
    pub fn evict(&self, vid: Option<u32>, discard_dirty: bool) -> (u64, u64) {
        let inner = &self.inner;
        let dirty_before = inner.dirty.load(Ordering::SeqCst);
        let vids: Vec<u32> = match vid {
            Some(v) => vec![v],
            None => inner.records.read().unwrap().keys().copied().collect(),
        };
        let mut bytes = 0;
        for v in vids {
            bytes += inner.drop_vdi(v, discard_dirty);
        }
        let discarded = if discard_dirty {
            dirty_before.saturating_sub(inner.dirty.load(Ordering::SeqCst))
        } else {
            0
        };
        (bytes, discarded)
    }

    /// Sets the cache's size bound and makes room down to it (pushing dirty data if it must);
    /// false if the cache could not shrink to it within the client's timeout.
    pub async fn resize(&self, size: u64) -> bool {
        let inner = &self.inner;
        inner.size.store(size, Ordering::SeqCst);
        inner.admission.resize(size);
        inner.reserve(0).await
    }

    /// Records VDI `vid`'s new mode (the caller flushed it first when it leaves writeback);
    /// `off` drops its clean cached data. Writes that went straight to the cluster in the
    /// old mode (off, writethrough) may not be flushed on the nodes yet: the next fsync
    /// flushes the cluster even if it pushes nothing.
    pub fn set_mode(&self, vid: u32, mode: CacheMode) {
        let inner = &self.inner;
        let rec = inner.records.read().unwrap().get(&vid).cloned();
        if let Some(mut r) = rec {
            r.mode = Some(mode);
            inner.save_record(&r);
        }
        if mode == CacheMode::Off {
            inner.drop_vdi(vid, false);
        }
        inner.unflushed.store(true, Ordering::SeqCst);
    }

    /// Before a VDI is deleted: drops what is cached of it (dirty data too: it is being
    /// deleted), detaches it and releases its lock.
    pub async fn forget_vdi(&self, name: &str) {
        let inner = &self.inner;
        let Some(vid) = inner.vid_of(name) else {
            return;
        };
        inner.drop_vdi(vid, true);
        inner.attached.lock().unwrap().remove(&vid);
        inner.forget_record(vid);
        if let Err(e) = lock::release(&inner.client, name, &inner.owner).await {
            tracing::warn!("releasing the lock of '{name}': {e}");
        }
    }
}

fn rand_u64() -> u64 {
    let mut b = [0u8; 8];
    if let Ok(mut f) = std::fs::File::open("/dev/urandom") {
        use std::io::Read;
        let _ = f.read_exact(&mut b);
    }
    u64::from_le_bytes(b) ^ now_ms()
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

impl Inner {
    fn load_objects(&self, keys: Vec<Key>) {
        let mut loaded: Vec<(u64, Arc<CachedObject>)> = Vec::new();
        for k in keys {
            match CachedObject::load(&self.obj_dir, k) {
                Ok(o) => {
                    let st = o.state.lock().unwrap();
                    self.used
                        .fetch_add(o.bytes_of(st.valid.count()), Ordering::Relaxed);
                    self.dirty
                        .fetch_add(o.bytes_of(st.dirty.count()), Ordering::Relaxed);
                    drop(st);
                    let atime = self
                        .index
                        .as_ref()
                        .and_then(|t| t.get(key_bytes(k)).ok().flatten())
                        .and_then(|v| v.as_ref().try_into().ok().map(u64::from_be_bytes))
                        .unwrap_or(0);
                    loaded.push((atime, Arc::new(o)));
                }
                Err(why) => {
                    tracing::warn!("dropping cached object {k:?}: {}", chain(&why));
                    object::remove_key(&self.obj_dir, k);
                }
            }
        }
        loaded.sort_by_key(|(t, _)| *t);
        let mut objects = self.objects.lock().unwrap();
        for (_, o) in loaded {
            objects.put(o.key, o);
        }
    }

    /// Records in the index when each object used since the last save was last used (as wall
    /// time, for the LRU order of the next mount).
    fn save_index(&self) {
        let Some(t) = &self.index else { return };
        let now = object::clock_ms();
        let since = self.index_saved_at.swap(now, Ordering::Relaxed);
        let wall = now_ms();
        let used: Vec<(Key, u64)> = self
            .objects
            .lock()
            .unwrap()
            .iter()
            // 0: loaded at mount and unused since, its recorded time stands.
            .filter(|(_, o)| o.used_at() > 0 && o.used_at() >= since)
            // Used after `now` was read (on another thread): now.
            .map(|(k, o)| (*k, wall.saturating_sub(now.saturating_sub(o.used_at()))))
            .collect();
        for (k, at) in used {
            let _ = t.insert(key_bytes(k), &at.to_be_bytes());
        }
        let _ = t.flush();
    }

    /// How long the least recently used object has gone unused, in milliseconds (None: the
    /// cache holds none). What a displacing fill would evict first, unless it is dirty or
    /// being read.
    fn lru_idle_ms(&self) -> Option<u64> {
        let objects = self.objects.lock().unwrap();
        let (_, o) = objects.peek_lru()?;
        Some(object::clock_ms().saturating_sub(o.used_at()))
    }

    fn counters(&self, vid: u32) -> Arc<Counters> {
        self.counters
            .lock()
            .unwrap()
            .entry(vid)
            .or_default()
            .clone()
    }

    fn mode_of(&self, vid: u32) -> CacheMode {
        self.records
            .read()
            .unwrap()
            .get(&vid)
            .and_then(|r| r.mode)
            .unwrap_or(self.cfg.mode)
    }

    /// VDI `vid`'s mode as one atomic that follows [`Inner::mode_of`]: what a request
    /// reads, instead of the records' lock, which every core's requests would pass.
    fn mode_cell(&self, vid: u32) -> Arc<ModeCell> {
        // Read under the cells' lock, which `save_record` takes after changing the record:
        // a mode changed meanwhile is in the record read here, or stored in the cell there.
        let mut cells = self.mode_cells.lock().unwrap();
        cells
            .entry(vid)
            .or_insert_with(|| Arc::new(ModeCell::new(self.mode_of(vid))))
            .clone()
    }

    fn save_record(&self, r: &VdiRecord) {
        let path = self
            .cfg
            .dir
            .join("vdis")
            .join(format!("{:06x}.json", r.vid));
        if let Err(e) = write_json_atomic(&path, r) {
            tracing::warn!("saving cache record of '{}': {e}", r.name);
        }
        self.records.write().unwrap().insert(r.vid, r.clone());
        if let Some(cell) = self.mode_cells.lock().unwrap().get(&r.vid) {
            cell.set(r.mode.unwrap_or(self.cfg.mode));
        }
    }

    /// Forgets VDI `vid` (deleted): its record, counters and mode.
    fn forget_record(&self, vid: u32) {
        self.records.write().unwrap().remove(&vid);
        self.counters.lock().unwrap().remove(&vid);
        self.mode_cells.lock().unwrap().remove(&vid);
        let _ = std::fs::remove_file(self.cfg.dir.join("vdis").join(format!("{vid:06x}.json")));
    }

    fn dirty_of(&self, vid: u32) -> u64 {
        self.objects
            .lock()
            .unwrap()
            .iter()
            .filter(|(k, _)| k.0 == vid)
            .map(|(_, o)| o.bytes_of(o.state.lock().unwrap().dirty.count()))
            .sum()
    }

    /// Takes the VDI's lock and makes the cache match it: data cached under another lock
    /// generation is dropped (refused if it holds unpushed writes).
    async fn attach(&self, name: &str) -> Result<Arc<Vdi>, CacheError> {
        let vdi = Arc::new(Vdi::open(self.client.clone(), name).await?);
        let vid = vdi.header().vid;
        let info = lock::acquire(&self.client, name, &self.owner, &self.host).await?;
        // Its writes (pushes, and mode `off`'s writes, which invalidate what they overwrite)
        // keep this cache coherent: they leave the generation alone.
        vdi.set_under_lock();
        // A record of the same name under another id is a deleted VDI: forget it.
        let stale: Vec<u32> = self
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
        let rec = self.records.read().unwrap().get(&vid).cloned();
        let matches = rec.as_ref().is_some_and(|r| {
            r.name == name && (r.gen == info.gen || (r.released && info.gen == r.gen + 1))
        });
        if !matches {
            let dirty = self.dirty_of(vid);
            if dirty > 0 {
                let ours = rec.as_ref().map(|r| r.gen).unwrap_or(0);
                let _ = lock::release(&self.client, name, &self.owner).await;
                return Err(CacheError::Conflict {
                    name: name.to_string(),
                    ours,
                    theirs: info.gen,
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
        if !matches
            || rec
                .as_ref()
                .is_some_and(|r| r.gen != info.gen || r.released)
        {
            self.save_record(&VdiRecord {
                name: name.to_string(),
                vid,
                gen: info.gen,
                released: false,
                mode: rec.and_then(|r| r.mode),
            });
        }
        let mut attached = self.attached.lock().unwrap();
        Ok(attached.entry(vid).or_insert(vdi).clone())
    }

    /// Removes cached objects of `vid` (dirty ones only if `discard_dirty`) and forgets
    /// which of its objects streams passed through (after an evict, a stream over the VDI is
    /// a first pass again); returns the bytes dropped.
    fn drop_vdi(&self, vid: u32, discard_dirty: bool) -> u64 {
        self.admission.forget_streams(vid);
        let victims: Vec<Arc<CachedObject>> = {
            let mut objects = self.objects.lock().unwrap();
            let keys: Vec<Key> = objects
                .iter()
                .filter(|(k, o)| {
                    k.0 == vid
                        && Arc::strong_count(o) == 1
                        && (discard_dirty || o.state.lock().unwrap().dirty.is_empty())
                })
                .map(|(k, _)| *k)
                .collect();
            keys.iter()
                .filter_map(|k| self.take_out(&mut objects, *k))
                .collect()
        };
        victims.iter().map(|o| self.forget(o)).sum()
    }

    /// Takes `key`'s object out of the LRU (whose lock the caller holds) for
    /// [`Inner::forget`]; until that is done, nobody creates the key's files again.
    fn take_out(
        &self,
        objects: &mut LruCache<Key, Arc<CachedObject>>,
        key: Key,
    ) -> Option<Arc<CachedObject>> {
        let o = objects.pop(&key)?;
        self.creating.lock().unwrap().insert(key);
        Some(o)
    }

    /// Accounting and files of an object [`Inner::take_out`] took out of the LRU; returns its
    /// bytes.
    fn forget(&self, o: &CachedObject) -> u64 {
        let st = o.state.lock().unwrap();
        let bytes = o.bytes_of(st.valid.count());
        let dirty = o.bytes_of(st.dirty.count());
        drop(st);
        self.used.fetch_sub(bytes, Ordering::SeqCst);
        self.dirty.fetch_sub(dirty, Ordering::SeqCst);
        o.retire(&self.spares);
        if let Some(t) = &self.index {
            let _ = t.remove(key_bytes(o.key));
        }
        self.creating.lock().unwrap().remove(&o.key);
        self.created.notify_all();
        bytes
    }

    /// Makes room for `bytes` more and counts them as used (the caller settles the difference
    /// with [`Inner::settle`] once it knows how many it really added): evicts least recently
    /// used objects without dirty blocks; when only dirty ones remain, pushes the oldest first.
    /// False if no room could be made within the client's timeout (nothing is counted then).
    async fn reserve(&self, bytes: u64) -> bool {
        let deadline = Instant::now() + self.client.options().timeout;
        loop {
            let size = self.size.load(Ordering::SeqCst);
            let fits = self
                .used
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |u| {
                    (u + bytes <= size).then_some(u + bytes)
                })
                .is_ok();
            if fits {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            if self.evict_one() {
                continue;
            }
            // Everything left is dirty or in use: push the least recently used dirty object.
            let oldest = self
                .objects
                .lock()
                .unwrap()
                .iter()
                .rev()
                .find(|(_, o)| {
                    let st = o.state.lock().unwrap();
                    !st.dirty.is_empty() && st.rewritten.is_none()
                })
                .map(|(_, o)| o.clone());
            match oldest {
                Some(o) => {
                    if let Err(e) = self.push_object(&o).await {
                        self.push_failed(chain(&e));
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
                None => tokio::time::sleep(Duration::from_millis(5)).await,
            }
        }
    }

    /// An id for a sequential run of reads that became a stream, unique in this cache (never 0).
    fn next_stream(&self) -> u64 {
        self.streams.fetch_add(1, Ordering::Relaxed)
    }

    /// Whether a range of `len` bytes from block `block` of `key`, about to be fetched on a
    /// miss, is to be kept in the cache: always while there is room, else per admission
    /// (which remembers this miss). Asked before the fetch, so a range that will not be
    /// kept is fetched for its reader alone, with nothing registered or queued. A range
    /// admitted here and then not filled because the CPUs are busy is forgotten by
    /// admission: its next miss is a first one again.
    fn keeps(&self, key: Key, block: usize, len: u64) -> bool {
        let pending = self.used.load(Ordering::SeqCst) + self.fills_queued.load(Ordering::SeqCst);
        // Eviction frees whole objects: "full" starts an eighth below the size, so the room
        // one eviction makes does not let every next miss in.
        let size = self.size.load(Ordering::SeqCst);
        let full = pending + len > size - size / 8;
        // Whether the range would displace cached data (only then is the data it would
        // displace weighed against it).
        let displaces = pending + len > size;
        let idle = || displaces.then(|| self.lru_idle_ms()).flatten();
        !full || self.admission.admit(key, block, idle)
    }

    /// Whether CPU allows filling a range of `len` bytes about to be fetched on a miss: a
    /// small one (a random read) only while the host's CPUs are not busy ([`pressure`]);
    /// longer ones always.
    fn fill_affordable(&self, len: u64) -> bool {
        len >= pressure::SMALL_FILL || self.cpu.allows_small_fill()
    }

    /// Has a fetched range that [`Inner::keeps`] admitted written into the cache (see
    /// [`INLINE_FILL`] for where), or drops it when too much waits already.
    fn queue_fill(self: &Arc<Self>, job: FillJob) {
        let len = job.data.len() as u64;
        let queued = self.fills_queued.fetch_add(len, Ordering::SeqCst);
        if queued + len > FILL_BUDGET {
            // The fill worker is too far behind: not cached.
            self.fills_queued.fetch_sub(len, Ordering::SeqCst);
            Counters::add(&job.counters.skipped_fills, 1);
            return (job.done)();
        }
        if len < INLINE_FILL && queued == 0 {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                // Runs on this thread once the current task (the read) is done.
                let inner = self.clone();
                rt.spawn(async move {
                    if fill_one(&inner, std::slice::from_ref(&job), true) {
                        inner.fill_done(job);
                    } else {
                        inner.to_fill_thread(job);
                    }
                });
                return;
            }
        }
        self.to_fill_thread(job);
    }

    fn to_fill_thread(&self, job: FillJob) {
        if let Err(e) = self.fill_tx.send(job) {
            self.fill_done(e.0);
        }
    }

    /// A queued fill is over (done, or dropped).
    fn fill_done(&self, job: FillJob) {
        self.fills_queued
            .fetch_sub(job.data.len() as u64, Ordering::SeqCst);
        (job.done)();
    }

    /// Writes the bitmaps that fills changed (deferred from the fills themselves).
    fn save_unsaved(&self) {
        let unsaved = std::mem::take(&mut *self.unsaved.lock().unwrap());
        for o in unsaved.iter().filter_map(std::sync::Weak::upgrade) {
            if let Err(e) = o.save_if_unsaved() {
                tracing::warn!("saving the bitmaps of cached object {:?}: {e}", o.key);
            }
        }
    }

    /// Makes room for `bytes` by evicting clean objects only (never waits on the network);
    /// false if that is not enough.
    fn reserve_now(&self, bytes: u64) -> bool {
        loop {
            if self.try_reserve(bytes) {
                return true;
            }
            if !self.evict_one() {
                return false;
            }
        }
    }

    /// Evicts the least recently used object that nobody is using (the LRU holds the only
    /// reference) and that has no dirty blocks; the check and the removal happen under the
    /// same lock as the lookups that hand out references. False if there is none.
    fn evict_one(&self) -> bool {
        let victim = {
            let mut objects = self.objects.lock().unwrap();
            let key = objects
                .iter()
                .rev()
                .find(|(_, o)| {
                    Arc::strong_count(o) == 1 && o.state.lock().unwrap().dirty.is_empty()
                })
                .map(|(k, _)| *k);
            key.and_then(|k| self.take_out(&mut objects, k))
        };
        let Some(o) = victim else { return false };
        let freed = self.forget(&o);
        let c = self.counters(o.key.0);
        Counters::add(&c.evictions, 1);
        Counters::add(&c.evicted_bytes, freed);
        true
    }

    /// Reserves `bytes` only if they fit without evicting anything.
    fn try_reserve(&self, bytes: u64) -> bool {
        let size = self.size.load(Ordering::SeqCst);
        self.used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |u| {
                (u + bytes <= size).then_some(u + bytes)
            })
            .is_ok()
    }

    /// After [`Inner::reserve`]d `reserved` bytes, `added` were really added.
    fn settle(&self, reserved: u64, added: u64) {
        if reserved > added {
            self.used.fetch_sub(reserved - added, Ordering::SeqCst);
        } else {
            self.used.fetch_add(added - reserved, Ordering::SeqCst);
        }
    }

    /// The cached object for `key`, created if `create` (after making room).
    async fn object(&self, key: Key, object_size: u64, create: bool) -> Option<Arc<CachedObject>> {
        self.object_now(key, object_size, create)
    }

    /// [`Inner::object`] without waiting (nothing in it waits).
    fn object_now(&self, key: Key, object_size: u64, create: bool) -> Option<Arc<CachedObject>> {
        if let Some(o) = self.objects.lock().unwrap().get(&key) {
            o.touch();
            return Some(o.clone());
        }
        if !create {
            return None;
        }
        // One creator per key (two would share its files), and the files are made without
        // holding the LRU's lock, which every read and write takes.
        loop {
            let objects = self.objects.lock().unwrap();
            if let Some(existing) = objects.peek(&key) {
                return Some(existing.clone());
            }
            let mut creating = self.creating.lock().unwrap();
            if creating.insert(key) {
                break;
            }
            drop(objects);
            // Another thread is making or retiring this key's files: sleep until it is done
            // (spinning took the CPU it needed to finish).
            while creating.contains(&key) {
                creating = self.created.wait(creating).unwrap();
            }
        }
        let created = CachedObject::create(&self.obj_dir, key, object_size, &self.spares);
        let mut objects = self.objects.lock().unwrap();
        self.creating.lock().unwrap().remove(&key);
        self.created.notify_all();
        let o = match created {
            Ok(o) => Arc::new(o),
            Err(e) => {
                tracing::warn!("creating cache object {key:?}: {e}");
                return None;
            }
        };
        objects.put(key, o.clone());
        Some(o)
    }

    fn push_failed(&self, why: String) {
        tracing::warn!("cache push failed: {why} (the data stays dirty and is retried)");
        self.push_errors.fetch_add(1, Ordering::Relaxed);
        *self.last_push_error.lock().unwrap() = Some(why);
    }

    /// Pushes one object's dirty blocks to the cluster (not flushed there). Blocks written
    /// again while the push is in flight stay dirty.
    async fn push_object(&self, o: &CachedObject) -> Result<u64, PushError> {
        let vdi = self
            .attached
            .lock()
            .unwrap()
            .get(&o.key.0)
            .cloned()
            .ok_or(PushError::NotAttached { vid: o.key.0 })?;
        let _one = o.pushing.lock().await;
        let snapshot = {
            let mut st = o.state.lock().unwrap();
            if st.dirty.is_empty() {
                return Ok(0);
            }
            st.rewritten = Some(object::State::empty_like(&st.dirty));
            st.dirty.clone()
        };
        let base = o.key.1 as u64 * o.object_size;
        let mut pushed = 0u64;
        let mut result = Ok(());
        for (s, e) in snapshot.runs() {
            let off = s as u64 * BLOCK;
            let len = ((e - s) as u64 * BLOCK).min(o.object_size - off);
            // Pooled: a push of 4 MiB runs would otherwise fault in fresh memory each time.
            let mut buf = objstore_proto::pagebuf::PageBuf::zeroed(len as usize);
            if let Err(source) = o.read_data(buf.as_mut(), off) {
                result = Err(PushError::ReadCache { key: o.key, source });
                break;
            }
            // Never past the end of the VDI (its last object may be partial).
            let end = (base + off + len).min(vdi.size());
            if end <= base + off {
                continue;
            }
            buf.truncate((end - base - off) as usize);
            if let Err(source) = vdi.write_at(base + off, buf.freeze()).await {
                result = Err(PushError::Write {
                    name: vdi.header().name,
                    source,
                });
                break;
            }
            pushed += end - base - off;
        }
        let mut st = o.state.lock().unwrap();
        let rewritten = st.rewritten.take().expect("push in flight");
        result?;
        let clean = snapshot.minus(&rewritten);
        let cleaned = clean.count();
        st.dirty = st.dirty.minus(&clean);
        if st.dirty.is_empty() {
            st.dirty_since = None;
        }
        if let Err(e) = o.save(&st) {
            tracing::warn!("saving cache metadata of {:?}: {e}", o.key);
        }
        drop(st);
        self.dirty.fetch_sub(o.bytes_of(cleaned), Ordering::SeqCst);
        if pushed > 0 {
            self.unflushed.store(true, Ordering::SeqCst);
        }
        Counters::add(&self.counters(o.key.0).pushed_bytes, pushed);
        Ok(pushed)
    }

    /// Pushes every dirty object of `vid` (or all), then flushes the cluster.
    async fn flush(&self, vid: Option<u32>, progress: impl Fn(u64, u64)) -> Result<u64, PushError> {
        let _one = self.push_lock.lock().await;
        let dirty: Vec<Arc<CachedObject>> = self
            .objects
            .lock()
            .unwrap()
            .iter()
            .filter(|(k, o)| {
                vid.is_none_or(|v| k.0 == v) && !o.state.lock().unwrap().dirty.is_empty()
            })
            .map(|(_, o)| o.clone())
            .collect();
        let total: u64 = dirty
            .iter()
            .map(|o| o.bytes_of(o.state.lock().unwrap().dirty.count()))
            .sum();
        let mut done = 0u64;
        progress(0, total);
        use futures::StreamExt;
        // After a failure no new push starts (the ones under way finish): with the cluster
        // gone, each would wait out the client's timeout in turn.
        let failed = std::sync::atomic::AtomicBool::new(false);
        let mut pushes = futures::stream::iter(dirty)
            .map(|o| {
                let failed = &failed;
                async move {
                    if failed.load(Ordering::SeqCst) {
                        return Ok(0);
                    }
                    self.push_object(&o).await
                }
            })
            .buffer_unordered(4);
        let mut first_err = None;
        while let Some(r) = pushes.next().await {
            match r {
                Ok(n) => {
                    done += n;
                    progress(done.min(total), total);
                }
                Err(e) => {
                    failed.store(true, Ordering::SeqCst);
                    self.push_failed(chain(&e));
                    first_err.get_or_insert(e);
                }
            }
        }
        drop(pushes);
        if let Some(e) = first_err {
            return Err(e);
        }
        // Nothing pushed since the last cluster flush: nothing to make durable.
        if !self.unflushed.swap(false, Ordering::SeqCst) {
            return Ok(done);
        }
        self.client.flush().await.map_err(|e| {
            self.unflushed.store(true, Ordering::SeqCst);
            let e = PushError::ClusterFlush(e);
            self.push_failed(chain(&e));
            e
        })?;
        Ok(done)
    }

    fn stats(&self) -> CacheStats {
        let mut per: HashMap<u32, VdiStats> = HashMap::new();
        for (k, o) in self.objects.lock().unwrap().iter() {
            let st = o.state.lock().unwrap();
            let e = per.entry(k.0).or_default();
            e.used += o.bytes_of(st.valid.count());
            e.dirty += o.bytes_of(st.dirty.count());
        }
        for (vid, c) in self.counters.lock().unwrap().iter() {
            let e = per.entry(*vid).or_default();
            let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
            e.hits = g(&c.hits);
            e.hit_bytes = g(&c.hit_bytes);
            e.misses = g(&c.misses);
            e.miss_bytes = g(&c.miss_bytes);
            e.fills = g(&c.fills);
            e.fill_bytes = g(&c.fill_bytes);
            e.evictions = g(&c.evictions);
            e.evicted_bytes = g(&c.evicted_bytes);
            e.skipped_fills = g(&c.skipped_fills);
            e.busy_skipped_fills = g(&c.busy_skipped_fills);
            e.stream_bypasses = g(&c.stream_bypasses);
            e.pushed_bytes = g(&c.pushed_bytes);
        }
        let records = self.records.read().unwrap();
        let mut vdis: Vec<VdiStats> = per
            .into_iter()
            .map(|(vid, mut s)| {
                s.name = records
                    .get(&vid)
                    .map(|r| r.name.clone())
                    .unwrap_or(format!("{vid:x}"));
                s.mode = Some(
                    records
                        .get(&vid)
                        .and_then(|r| r.mode)
                        .unwrap_or(self.cfg.mode),
                );
                s
            })
            .collect();
        vdis.sort_by(|a, b| a.name.cmp(&b.name));
        let mut total = VdiStats {
            name: "total".into(),
            ..Default::default()
        };
        for v in &vdis {
            total.used += v.used;
            total.dirty += v.dirty;
            total.hits += v.hits;
            total.hit_bytes += v.hit_bytes;
            total.misses += v.misses;
            total.miss_bytes += v.miss_bytes;
            total.fills += v.fills;
            total.fill_bytes += v.fill_bytes;
            total.evictions += v.evictions;
            total.evicted_bytes += v.evicted_bytes;
            total.skipped_fills += v.skipped_fills;
            total.busy_skipped_fills += v.busy_skipped_fills;
            total.stream_bypasses += v.stream_bypasses;
            total.pushed_bytes += v.pushed_bytes;
        }
        let dirty = self.dirty.load(Ordering::SeqCst);
        CacheStats {
            dir: self.cfg.dir.display().to_string(),
            size: self.size.load(Ordering::SeqCst),
            used: self.used.load(Ordering::SeqCst),
            dirty,
            flush_backlog: dirty,
            max_dirty: self.cfg.max_dirty,
            max_dirty_age_secs: self.cfg.max_dirty_age.as_secs(),
            sequential_cutoff: self.cfg.sequential_cutoff,
            fills_limited: self.cpu.busy(),
            default_mode: Some(self.cfg.mode),
            push_errors: self.push_errors.load(Ordering::Relaxed),
            last_push_error: self.last_push_error.lock().unwrap().clone(),
            total,
            vdis,
        }
    }

    fn vid_of(&self, name: &str) -> Option<u32> {
        self.records
            .read()
            .unwrap()
            .values()
            .find(|r| r.name == name)
            .map(|r| r.vid)
    }
}

/// The fill worker: writes fetched ranges into the cache, off every reader's path. It takes
/// what is queued at once (up to [`MAX_FILL_JOBS`] more than the first) and writes ranges
/// that continue each other in one object (a sequential read and its read-ahead, whose
/// fetches finish in any order) together, up to [`MAX_FILL_BATCH`]: one pass over the
/// object's bits, and one writeback started for the whole run.
fn fill_worker(inner: &Inner, rx: std::sync::mpsc::Receiver<FillJob>) {
    while let Ok(first) = rx.recv() {
        let mut jobs = vec![first];
        jobs.extend(rx.try_iter().take(MAX_FILL_JOBS));
        jobs.sort_by_key(|j| (j.key, j.start));
        let mut jobs = jobs.into_iter().peekable();
        while let Some(job) = jobs.next() {
            let mut len = job.data.len() as u64;
            let mut run = vec![job];
            while let Some(next) =
                jobs.next_if(|n| len < MAX_FILL_BATCH && continues(run.last().expect("one"), n))
            {
                len += next.data.len() as u64;
                run.push(next);
            }
            fill_one(inner, &run, false);
            for job in run {
                inner.fill_done(job);
            }
        }
    }
}

/// Whether `b` starts where `a` ends, in the same object and fetched under the same bypass
/// count (so they can be filled as one range).
fn continues(a: &FillJob, b: &FillJob) -> bool {
    a.key == b.key && a.bypass == b.bypass && a.start + a.data.len() as u64 == b.start
}

/// Writes fetched ranges that continue each other (`jobs`, in order, in one object) into the
/// cache. With `quick`, only if that needs neither creating the object's files nor evicting
/// (false then, and nothing done): what may block for long is left to the fill thread.
fn fill_one(inner: &Inner, jobs: &[FillJob], quick: bool) -> bool {
    let job = &jobs[0];
    if inner.bypass_writes.load(Ordering::SeqCst) != job.bypass {
        return true; // a write bypassed the cache meanwhile: this data may be stale
    }
    let parts: Vec<&[u8]> = jobs.iter().map(|j| &j.data[..]).collect();
    let len: u64 = parts.iter().map(|p| p.len() as u64).sum();
    let (b0, b1) = CachedObject::block_range(job.start, len);
    let existing = inner.object_now(job.key, job.object_size, false);
    let missing = match &existing {
        Some(o) => {
            let st = o.state.lock().unwrap();
            (b0..b1).filter(|&b| !st.valid.get(b)).count()
        }
        None => b1 - b0,
    };
    if missing == 0 {
        return true;
    }
    let reserved = missing as u64 * BLOCK;
    let o = if quick {
        // Holding `existing` keeps it from eviction while it is written.
        match existing {
            Some(o) if inner.try_reserve(reserved) => o,
            _ => return false,
        }
    } else {
        drop(existing);
        if !inner.reserve_now(reserved) {
            // Only dirty data is left to evict: these ranges are just not cached.
            Counters::add(&job.counters.skipped_fills, jobs.len() as u64);
            return true;
        }
        // Looked up again: making room may have evicted it.
        match inner.object_now(job.key, job.object_size, true) {
            Some(o) => o,
            None => {
                inner.settle(reserved, 0);
                return true;
            }
        }
    };
    // Checked again once no write can come between: a write that bypassed the cache after
    // the check above has its blocks forgotten after this fill, one before it is seen here.
    let fresh = || inner.bypass_writes.load(Ordering::SeqCst) == job.bypass;
    let (added, newly_unsaved) = vdi::write_fill(&o, job.start, &parts, fresh);
    if newly_unsaved {
        inner.unsaved.lock().unwrap().push(Arc::downgrade(&o));
    }
    inner.settle(reserved, added * BLOCK);
    if added > 0 {
        Counters::add(&job.counters.fills, jobs.len() as u64);
        Counters::add(&job.counters.fill_bytes, added * BLOCK);
    }
    true
}

/// The background flusher: keeps dirty bytes under `max_dirty` and pushes data dirty for
/// longer than `max_dirty_age`, with backoff after failures. Also saves the LRU index.
async fn flusher(inner: Arc<Inner>) {
    let mut backoff = Duration::from_secs(1);
    loop {
        tokio::select! {
            _ = inner.wake_flusher.notified() => {}
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
        inner.save_index();
        inner.save_unsaved();
        let now = Instant::now();
        let over = inner.dirty.load(Ordering::SeqCst) > inner.cfg.max_dirty;
        let mut due: Vec<(Instant, Arc<CachedObject>)> = inner
            .objects
            .lock()
            .unwrap()
            .iter()
            .filter_map(|(_, o)| {
                let st = o.state.lock().unwrap();
                let since = st.dirty_since?;
                (over || now.duration_since(since) >= inner.cfg.max_dirty_age)
                    .then(|| (since, o.clone()))
            })
            .collect();
        if due.is_empty() {
            continue;
        }
        due.sort_by_key(|(t, _)| *t);
        let one = inner.push_lock.lock().await;
        let mut failed = false;
        for (_, o) in due {
            if let Err(e) = inner.push_object(&o).await {
                inner.push_failed(chain(&e));
                failed = true;
                break;
            }
            if over && inner.dirty.load(Ordering::SeqCst) <= inner.cfg.max_dirty / 2 {
                break;
            }
        }
        drop(one);
        if failed {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(30));
        } else {
            backoff = Duration::from_secs(1);
        }
    }
}
