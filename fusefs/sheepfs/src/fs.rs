//! The `fuser::Filesystem` of `sheepfs`.
//!
//! Every operation moves its reply into a tokio task and returns, so the FUSE threads never
//! wait on the network and many requests are in flight at once. A reply dropped unanswered (a
//! panicking task) answers EIO.
//!
//! Inode numbers: the root is 1; the VDI with id `vid` is `vid + 1`. Open files bypass the
//! page cache (`FOPEN_DIRECT_IO`), so a read never returns pages that went stale when the VDI
//! was written through another path (`dog`, another host); direct writes to one file run in
//! parallel (`FOPEN_PARALLEL_DIRECT_WRITES`).

use std::collections::HashMap;
use std::ffi::OsStr;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, OpenFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};
use objstore_client::vdi::{self, VdiInfo};
use objstore_client::{lock::LockError, Client, Vdi, VdiError};
use objstore_proto::size::format_size;

use objcache::{chain, Cache, CacheError, CachedVdi, Missed};

use crate::errno;

/// An open VDI: straight to the cluster, or through the cache.
#[derive(Clone)]
pub enum Disk {
    Plain(Arc<Vdi>),
    Cached(Arc<CachedVdi>),
}

impl Disk {
    pub fn vdi(&self) -> &Arc<Vdi> {
        match self {
            Disk::Plain(v) => v,
            Disk::Cached(c) => c.vdi(),
        }
    }

    async fn write(&self, offset: u64, data: Bytes) -> Result<(), CacheError> {
        match self {
            Disk::Plain(v) => Ok(v.write_at(offset, data).await?),
            Disk::Cached(c) => c.write(offset, data).await,
        }
    }

    async fn flush(&self) -> Result<(), CacheError> {
        match self {
            Disk::Plain(v) => Ok(v.flush().await?),
            Disk::Cached(c) => c.flush().await,
        }
    }

    async fn discard(&self, offset: u64, len: u64) -> Result<(), CacheError> {
        match self {
            Disk::Plain(v) => Ok(v.discard(offset, len).await?),
            Disk::Cached(c) => c.discard(offset, len).await,
        }
    }
}

/// The errno for a request that failed through the cache (or a plain handle's, as a
/// [`CacheError::Vdi`]), logged once with its causes.
fn cache_fail(op: &str, what: &str, e: &CacheError) -> Errno {
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

const TTL: Duration = Duration::from_secs(1);
const MAX_WRITE: u32 = 1 << 20;
/// How long `rm` of an open VDI waits for it to be closed (a release still on its way)
/// before it is refused with EBUSY.
const UNLINK_WAIT: Duration = Duration::from_secs(1);
const MAX_READAHEAD: u32 = 128 << 10;
/// Requests the kernel keeps in flight (fuser's default is 16; aio depth beyond it queues).
const MAX_BACKGROUND: u16 = 128;

const FALLOC_KEEP_SIZE: i32 = 0x01;
const FALLOC_PUNCH_HOLE: i32 = 0x02;
const FALLOC_ZERO_RANGE: i32 = 0x10;

fn ino_of(vid: u32) -> u64 {
    vid as u64 + 1
}

struct OpenVdi {
    disk: Disk,
    handles: usize,
    /// Handles open read-write.
    writers: usize,
}

impl OpenVdi {
    /// Makes `cached` the handle every request takes if the VDI has a plain one. Returns the
    /// plain handle when a read-write file of it is open, so writes of it may be in flight:
    /// `cached` then lets requests in only at [`hand_over`].
    fn upgrade(&mut self, cached: &Arc<CachedVdi>) -> Option<Arc<Vdi>> {
        let Disk::Plain(plain) = &self.disk else {
            return None;
        };
        let plain = (self.writers > 0).then(|| plain.clone());
        if plain.is_some() {
            cached.close_gate();
        }
        self.disk = Disk::Cached(cached.clone());
        plain
    }
}

/// State shared by the FUSE threads, the tasks answering them and the control socket.
pub(crate) struct Shared {
    client: Arc<Client>,
    cache: Option<Cache>,
    /// ino → VDI name, learnt from lookup, readdir and create.
    names: Mutex<HashMap<u64, String>>,
    open: Mutex<HashMap<u64, OpenVdi>>,
    next_fh: AtomicU64,
    uid: u32,
    gid: u32,
    mounted_at: SystemTime,
}

pub struct SheepFs {
    rt: tokio::runtime::Handle,
    sh: Arc<Shared>,
}

fn secs(t: u64) -> SystemTime {
    UNIX_EPOCH + Duration::from_secs(t)
}

impl Shared {
    fn file_attr(&self, info: &VdiInfo) -> FileAttr {
        let t = secs(info.created);
        FileAttr {
            ino: INodeNo(ino_of(info.vid)),
            size: info.size,
            blocks: info.used.min(info.size.next_multiple_of(512)) / 512,
            atime: t,
            mtime: t,
            ctime: t,
            crtime: t,
            kind: FileType::RegularFile,
            perm: 0o644,
            nlink: 1,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: 4096,
            flags: 0,
        }
    }

    fn dir_attr(&self) -> FileAttr {
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

    fn name_of(&self, ino: u64) -> Result<String, Errno> {
        self.names
            .lock()
            .unwrap()
            .get(&ino)
            .cloned()
            .ok_or(Errno::ENOENT)
    }

    fn opened(&self, ino: u64) -> Option<Disk> {
        self.open.lock().unwrap().get(&ino).map(|o| o.disk.clone())
    }

    fn is_open(&self, name: &str) -> bool {
        self.open
            .lock()
            .unwrap()
            .values()
            .any(|o| o.disk.vdi().header().name == name)
    }

    /// The VDI's attributes, from the open handle if there is one.
    async fn stat(&self, name: &str) -> Result<VdiInfo, VdiError> {
        let open = self
            .open
            .lock()
            .unwrap()
            .values()
            .find(|o| o.disk.vdi().header().name == name)
            .map(|o| o.disk.vdi().clone());
        let info = match open {
            Some(v) => v.info(),
            None => Vdi::open(self.client.clone(), name).await?.info(),
        };
        self.names
            .lock()
            .unwrap()
            .insert(ino_of(info.vid), name.to_string());
        Ok(info)
    }

    /// A new handle on `name`: through the cache when there is one (a read-write open attaches
    /// the VDI), else straight to the cluster.
    async fn make_disk(&self, name: &str, rw: bool) -> Result<Disk, Errno> {
        if let Some(cache) = &self.cache {
            match cache.open_vdi(name, rw).await {
                Ok(Some(c)) => return Ok(Disk::Cached(Arc::new(c))),
                Ok(None) => {}
                Err(e) => return Err(cache_fail("open", name, &e)),
            }
        }
        match Vdi::open(self.client.clone(), name).await {
            Ok(v) => Ok(Disk::Plain(Arc::new(v))),
            Err(e) => Err(fail("open", name, &e)),
        }
    }

    /// Opens (or shares) the handle of `name`; returns its inode number. Every open reads the
    /// inode afresh, so it sees what other clients allocated or resized before it.
    async fn open_vdi(&self, name: &str, rw: bool) -> Result<(u64, Disk), Errno> {
        let fresh = self.make_disk(name, rw).await?;
        let ino = ino_of(fresh.vdi().header().vid);
        let mut replaced = None;
        let shared = {
            let mut open = self.open.lock().unwrap();
            let entry = open.entry(ino).or_insert(OpenVdi {
                disk: fresh.clone(),
                handles: 0,
                writers: 0,
            });
            // A read-write open upgrades a shared plain handle to the cached one.
            if let Disk::Cached(cached) = &fresh {
                replaced = entry.upgrade(cached);
            }
            entry.handles += 1;
            entry.writers += rw as usize;
            entry.disk.clone()
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
        self.names.lock().unwrap().insert(ino, name.to_string());
        Ok((ino, shared))
    }

    fn release(&self, ino: u64, rw: bool) {
        let mut open = self.open.lock().unwrap();
        if let Some(o) = open.get_mut(&ino) {
            o.handles -= 1;
            o.writers = o.writers.saturating_sub(rw as usize);
            if o.handles == 0 {
                open.remove(&ino);
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
        let ino = ino_of(vid);
        let name = match self.open.lock().unwrap().get(&ino) {
            Some(o) if o.writers > 0 && matches!(o.disk, Disk::Plain(_)) => {
                o.disk.vdi().header().name
            }
            _ => return Ok(false),
        };
        let Some(cache) = &self.cache else {
            return Ok(false);
        };
        let cached = Arc::new(cache.take_over(vid, &name).await?);
        let plain = match self.open.lock().unwrap().get_mut(&ino) {
            Some(o) => o.upgrade(&cached),
            None => None,
        };
        match plain {
            Some(plain) => hand_over(plain, &cached, &name).await,
            // Closed meanwhile (the VDI stays attached, as after any read-write open), a
            // read-write open took it through the cache first, or no writer is left.
            None => cached.open_gate(),
        }
        Ok(true)
    }

    pub(crate) fn client(&self) -> &Arc<Client> {
        &self.client
    }

    fn new_fh(&self) -> FileHandle {
        FileHandle(self.next_fh.fetch_add(1, Ordering::Relaxed))
    }
}

/// Lets `cached` (gated, see `CachedVdi::gated`) take requests once every request of `plain`,
/// the handle it replaces, is done (each holds a clone of it) and the VDI's inode is read
/// afresh, so that a read of an object `plain` allocated is not taken for a hole.
async fn hand_over(plain: Arc<Vdi>, cached: &CachedVdi, name: &str) {
    let mut waited = 0u64;
    while Arc::strong_count(&plain) > 1 {
        tokio::time::sleep(Duration::from_millis(1)).await;
        waited += 1;
        if waited.is_multiple_of(10_000) {
            tracing::warn!(
                "taking '{name}' into the cache: still waiting for requests sent straight to the cluster"
            );
        }
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

fn open_flags() -> FopenFlags {
    FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES
}

fn utf8(name: &OsStr) -> Result<String, Errno> {
    name.to_str().map(str::to_string).ok_or(Errno::EINVAL)
}

/// Logs a failed operation once, with its cause, and returns the errno for the caller.
fn fail(op: &str, what: &str, e: &VdiError) -> Errno {
    let errno = errno::from_vdi(e);
    if errno == Errno::ENOENT {
        tracing::debug!("{op} {what}: {e}");
    } else {
        tracing::warn!("{op} {what}: {e}");
    }
    errno
}

impl SheepFs {
    pub fn new(client: Arc<Client>, cache: Option<Cache>, rt: tokio::runtime::Handle) -> SheepFs {
        // SAFETY: getuid/getgid cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        let sh = Arc::new(Shared {
            client,
            cache,
            names: Mutex::default(),
            open: Mutex::default(),
            next_fh: AtomicU64::new(1),
            uid,
            gid,
            mounted_at: SystemTime::now(),
        });
        SheepFs { rt, sh }
    }

    /// Binds the cache's control socket (mode 0600, replacing a stale one) and serves it
    /// on the runtime. Nothing to do without a cache.
    pub fn serve_control(&self) -> std::io::Result<()> {
        let Some(cache) = &self.sh.cache else {
            return Ok(());
        };
        let listener = crate::socket::bind(cache.dir())?;
        self.rt.spawn(crate::socket::serve(
            self.sh.clone(),
            cache.clone(),
            listener,
        ));
        Ok(())
    }

    /// Runs `f` on the runtime; the FUSE thread returns at once.
    fn spawn<F, Fut>(&self, f: F)
    where
        F: FnOnce(Arc<Shared>) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.rt.spawn(f(self.sh.clone()));
    }
}

impl Filesystem for SheepFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        if let Err(max) = config.set_max_write(MAX_WRITE) {
            tracing::warn!("kernel caps max_write at {max}");
        }
        let _ = config.set_max_readahead(MAX_READAHEAD);
        let want = InitFlags::FUSE_ASYNC_DIO | InitFlags::FUSE_ASYNC_READ;
        if let Err(missing) = config.add_capabilities(want) {
            tracing::warn!("kernel lacks {missing:?}: O_DIRECT aio will run one request at a time");
        }
        if let Err(max) = config.set_max_background(MAX_BACKGROUND) {
            tracing::warn!("kernel caps max_background at {max}");
        }
        let _ = config.set_congestion_threshold(MAX_BACKGROUND * 3 / 4);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if parent != INodeNo::ROOT {
            return reply.error(Errno::ENOENT);
        }
        let name = match utf8(name) {
            Ok(n) => n,
            Err(_) => return reply.error(Errno::ENOENT),
        };
        if vdi::validate_name(&name).is_err() {
            return reply.error(Errno::ENOENT);
        }
        self.spawn(move |sh| async move {
            match sh.stat(&name).await {
                Ok(info) => reply.entry(&TTL, &sh.file_attr(&info), Generation(0)),
                Err(e) => reply.error(fail("lookup", &name, &e)),
            }
        });
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        if ino == INodeNo::ROOT {
            return reply.attr(&TTL, &self.sh.dir_attr());
        }
        if let Some(d) = self.sh.opened(ino.0) {
            return reply.attr(&TTL, &self.sh.file_attr(&d.vdi().info()));
        }
        self.spawn(move |sh| async move {
            let name = match sh.name_of(ino.0) {
                Ok(n) => n,
                Err(e) => return reply.error(e),
            };
            match sh.stat(&name).await {
                Ok(info) if ino_of(info.vid) == ino.0 => reply.attr(&TTL, &sh.file_attr(&info)),
                // Deleted and created again under the same name: a new file.
                Ok(_) => reply.error(Errno::ENOENT),
                Err(e) => reply.error(fail("getattr", &name, &e)),
            }
        });
    }

    #[allow(clippy::too_many_arguments)]
    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        if ino == INodeNo::ROOT {
            return reply.attr(&TTL, &self.sh.dir_attr());
        }
        self.spawn(move |sh| async move {
            let name = match sh.name_of(ino.0) {
                Ok(n) => n,
                Err(e) => return reply.error(e),
            };
            let vdi = match sh.opened(ino.0) {
                Some(d) => d.vdi().clone(),
                None => match Vdi::open(sh.client.clone(), &name).await {
                    Ok(v) => Arc::new(v),
                    Err(e) => return reply.error(fail("setattr", &name, &e)),
                },
            };
            if let Some(size) = size {
                let cur = vdi.size();
                if size < cur {
                    tracing::error!(
                        "refusing to shrink VDI '{name}' from {} to {}: VDIs only grow \
                         (qemu-img create on an existing VDI truncates it first; delete it instead)",
                        format_size(cur),
                        format_size(size)
                    );
                    return reply.error(Errno::EINVAL);
                }
                if let Err(e) = vdi.grow(size).await {
                    return reply.error(fail("resize", &name, &e));
                }
            }
            reply.attr(&TTL, &sh.file_attr(&vdi.info()));
        });
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        if parent != INodeNo::ROOT {
            return reply.error(Errno::ENOENT);
        }
        let name = match utf8(name) {
            Ok(n) => n,
            Err(_) => return reply.error(Errno::ENOENT),
        };
        self.spawn(move |sh| async move {
            // The kernel sends the release of a closed file on its own time: an `rm` right
            // after the last close can arrive first. Give that release a moment.
            let deadline = tokio::time::Instant::now() + UNLINK_WAIT;
            while sh.is_open(&name) {
                if tokio::time::Instant::now() >= deadline {
                    tracing::warn!("refusing to delete VDI '{name}': it is open on this mount");
                    return reply.error(Errno::EBUSY);
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            if let Some(cache) = &sh.cache {
                // Deleting: what this mount cached of it (dirty too) goes, and so does its lock.
                cache.forget_vdi(&name).await;
            }
            match vdi::delete(&sh.client, &name).await {
                Ok(()) => {
                    sh.names.lock().unwrap().retain(|_, n| *n != name);
                    tracing::info!("deleted VDI '{name}'");
                    reply.ok()
                }
                Err(e) => reply.error(fail("unlink", &name, &e)),
            }
        });
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if ino == INodeNo::ROOT {
            return reply.error(Errno::EISDIR);
        }
        let rw = flags.0 & libc::O_ACCMODE != libc::O_RDONLY;
        self.spawn(move |sh| async move {
            let name = match sh.name_of(ino.0) {
                Ok(n) => n,
                Err(e) => return reply.error(e),
            };
            match sh.open_vdi(&name, rw).await {
                Ok((got, _)) if got == ino.0 => reply.opened(sh.new_fh(), open_flags()),
                Ok((got, _)) => {
                    sh.release(got, rw);
                    reply.error(Errno::ENOENT)
                }
                Err(e) => reply.error(e),
            }
        });
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        _mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let rw = flags & libc::O_ACCMODE != libc::O_RDONLY;
        if parent != INodeNo::ROOT {
            return reply.error(Errno::ENOENT);
        }
        let name = match utf8(name) {
            Ok(n) => n,
            Err(e) => return reply.error(e),
        };
        self.spawn(move |sh| async move {
            if let Err(e) = vdi::create(&sh.client, &name, 0).await {
                return reply.error(fail("create", &name, &e));
            }
            tracing::info!("created VDI '{name}'");
            match sh.open_vdi(&name, rw).await {
                Ok((_, d)) => reply.created(
                    &TTL,
                    &sh.file_attr(&d.vdi().info()),
                    Generation(0),
                    sh.new_fh(),
                    open_flags(),
                ),
                Err(e) => reply.error(e),
            }
        });
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyData,
    ) {
        let Some(disk) = self.sh.opened(ino.0) else {
            return reply.error(Errno::EBADF);
        };
        let mut missed = Missed::default();
        if let Disk::Cached(c) = &disk {
            let end = c.vdi().size();
            let len = (size as u64).min(end.saturating_sub(offset));
            if len > 0 {
                match c.read_hit(offset, len) {
                    Ok(data) => return reply.data(&data),
                    Err(m) => missed = m,
                }
            }
        }
        self.rt.spawn(async move {
            let end = disk.vdi().size();
            if offset >= end {
                return reply.data(&[]);
            }
            let len = (size as u64).min(end - offset);
            let read = match &disk {
                Disk::Plain(v) => v.read_at(offset, len).await.map_err(CacheError::from),
                Disk::Cached(c) => c.read_missed(offset, len, missed).await,
            };
            match read {
                Ok(data) => reply.data(&data),
                Err(e) => reply.error(cache_fail("read", &disk.vdi().header().name, &e)),
            }
        });
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyWrite,
    ) {
        let Some(disk) = self.sh.opened(ino.0) else {
            return reply.error(Errno::EBADF);
        };
        if let Disk::Cached(c) = &disk {
            if c.write_fast(offset, data) {
                return reply.written(data.len() as u32);
            }
        }
        let data = Bytes::copy_from_slice(data);
        self.rt.spawn(async move {
            let end = disk.vdi().size();
            if offset >= end {
                return reply.error(Errno::ENOSPC);
            }
            // Like a block device: the part inside the disk is written, the rest refused.
            let n = (data.len() as u64).min(end - offset) as usize;
            match disk.write(offset, data.slice(..n)).await {
                Ok(()) => reply.written(n as u32),
                Err(e) => reply.error(cache_fail("write", &disk.vdi().header().name, &e)),
            }
        });
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: fuser::LockOwner,
        reply: ReplyEmpty,
    ) {
        // close(2) does not promise durability (fsync does): without a cache every
        // acknowledged write is already on every replica; with one, dirty data is pushed by
        // the flusher, fsync, cachectl flush or unmount.
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let Some(disk) = self.sh.opened(ino.0) else {
            return reply.error(Errno::EBADF);
        };
        self.rt.spawn(async move {
            match disk.flush().await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(cache_fail("fsync", &disk.vdi().header().name, &e)),
            }
        });
    }

    fn release(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.sh
            .release(ino.0, flags.0 & libc::O_ACCMODE != libc::O_RDONLY);
        reply.ok();
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if ino != INodeNo::ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        self.spawn(move |sh| async move {
            let list = match vdi::list_names(&sh.client).await {
                Ok(l) => l,
                Err(e) => return reply.error(fail("readdir", "/", &e)),
            };
            let mut entries = vec![
                (1u64, FileType::Directory, ".".to_string()),
                (1u64, FileType::Directory, "..".to_string()),
            ];
            {
                let mut names = sh.names.lock().unwrap();
                for (name, vid) in list {
                    names.insert(ino_of(vid), name.clone());
                    entries.push((ino_of(vid), FileType::RegularFile, name));
                }
            }
            for (i, (ino, kind, name)) in entries.into_iter().enumerate().skip(offset as usize) {
                if reply.add(INodeNo(ino), i as u64 + 1, kind, name) {
                    break;
                }
            }
            reply.ok();
        });
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        self.spawn(move |sh| async move {
            let view = match sh.client.refresh().await {
                Ok(v) => v,
                Err(e) => {
                    tracing::warn!("statfs: {e}");
                    return reply.error(errno::from_client(&e));
                }
            };
            let (mut total, mut free) = (0u64, 0u64);
            for (_, s) in sh.client.node_statuses(&view).await {
                if let Ok(s) = s {
                    total += s.disk_total;
                    free += s.disk_free;
                }
            }
            // Raw capacity divided by the copy count: what VDIs can still take.
            let copies = view.info.config.map(|c| c.copies.max(1)).unwrap_or(1) as u64;
            let vdis = vdi::list_names(&sh.client)
                .await
                .map(|l| l.len())
                .unwrap_or(0);
            const BS: u64 = 4096;
            reply.statfs(
                total / copies / BS,
                free / copies / BS,
                free / copies / BS,
                vdis as u64,
                (objstore_proto::oid::MAX_VID as u64).saturating_sub(vdis as u64),
                BS as u32,
                255,
                BS as u32,
            );
        });
    }

    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: fuser::ReplyXattr,
    ) {
        reply.error(Errno::ENODATA);
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, size: u32, reply: fuser::ReplyXattr) {
        if size == 0 {
            reply.size(0);
        } else {
            reply.data(&[]);
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _flags: fuser::IoctlFlags,
        _cmd: u32,
        _in_data: &[u8],
        _out_size: u32,
        reply: fuser::ReplyIoctl,
    ) {
        // Not a block device: no BLK* ioctls (qemu probes a few and falls back).
        reply.error(Errno::ENOTTY);
    }

    fn access(&self, _req: &Request, _ino: INodeNo, _mask: fuser::AccessFlags, reply: ReplyEmpty) {
        reply.ok();
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let Some(disk) = self.sh.opened(ino.0) else {
            return reply.error(Errno::EBADF);
        };
        self.rt.spawn(async move {
            let vdi = disk.vdi().clone();
            let size = vdi.size();
            let name = vdi.header().name;
            let res = if mode & (FALLOC_PUNCH_HOLE | FALLOC_ZERO_RANGE) != 0 {
                // Discard as qemu sends it (discard=unmap): whole objects dropped, parts zeroed.
                let end = offset.saturating_add(length).min(size);
                if offset >= end {
                    Ok(())
                } else {
                    disk.discard(offset, end - offset).await
                }
            } else if mode & !FALLOC_KEEP_SIZE == 0 {
                // Preallocation: space is taken on write; grow the VDI unless KEEP_SIZE.
                let end = offset.saturating_add(length);
                if mode & FALLOC_KEEP_SIZE == 0 && end > size {
                    vdi.grow(end).await.map_err(CacheError::from)
                } else {
                    Ok(())
                }
            } else {
                return reply.error(Errno::EOPNOTSUPP);
            };
            match res {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(cache_fail("fallocate", &name, &e)),
            }
        });
    }
}
