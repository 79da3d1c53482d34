//! The `fuser::Filesystem` of `sheepfs`.
//!
//! Every operation moves its reply into a tokio task and returns, so the FUSE threads never
//! wait on the network and many requests are in flight at once. A reply dropped unanswered (a
//! panicking task) answers EIO.
//!
//! Inode numbers: the root is 1; the VDI with id `vid` is `vid + 1`. Open files bypass the
//! page cache (`FOPEN_DIRECT_IO`), so a read never returns pages that went stale when the VDI
//! was written through another path (`dog`, another host); direct writes to one file run in
//! parallel (`FOPEN_PARALLEL_DIRECT_WRITES`). Shared mappings are allowed
//! (`FUSE_DIRECT_IO_ALLOW_MMAP`): the kernel keeps page cache for mapped pages only, keeps
//! it coherent with direct reads and writes, and writes dirty mapped pages back as ordinary
//! [`Filesystem::write`] requests, so they take the same path as `write(2)`.

use std::ffi::OsStr;
use std::future::Future;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use fuser::{
    Errno, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, OpenFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};
use objstore_client::vdi;
use objstore_client::{Client, Vdi};
use objstore_proto::size::format_size;

use objcache::{Cache, Missed};

use crate::cachelocks::Again;
use crate::errno;
use crate::handles::{cache_fail, fail, Disk, Shared};
use crate::handover::lock_sides;
use crate::locks::WriteLocks;
use crate::names::is_snapshot;

const TTL: Duration = Duration::from_secs(1);
const MAX_WRITE: u32 = 1 << 20;
/// How long `rm` of an open VDI waits for it to be closed (a release still on its way)
/// before it is refused with EBUSY.
const UNLINK_WAIT: Duration = Duration::from_secs(1);
const MAX_READAHEAD: u32 = 128 << 10;
/// Requests the kernel keeps in flight (fuser's default is 16; aio depth beyond it queues).
const MAX_BACKGROUND: u16 = 128;

pub struct SheepFs {
    rt: tokio::runtime::Handle,
    sh: Arc<Shared>,
}

fn open_flags() -> FopenFlags {
    FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES
}

fn utf8(name: &OsStr) -> Result<String, Errno> {
    name.to_str().map(str::to_string).ok_or(Errno::EINVAL)
}

impl SheepFs {
    /// `locks`: how read-write opens lock their VDIs (see [`WriteLocks`]; None: `--no-lock`).
    /// With a cache, the cache takes the locks itself and only the lock mode (cooperative:
    /// hand them over) and the hand-over timeout apply.
    pub fn new(
        client: Arc<Client>,
        cache: Option<Cache>,
        locks: Option<WriteLocks>,
        rt: tokio::runtime::Handle,
    ) -> SheepFs {
        // SAFETY: getuid/getgid cannot fail.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        let (locks, cache_locks, holder) = lock_sides(&client, cache.as_ref(), locks, &rt);
        let sh = Arc::new(Shared {
            client,
            cache,
            names: Mutex::default(),
            open: Mutex::default(),
            switching: tokio::sync::RwLock::new(()),
            closed: tokio::sync::Notify::new(),
            next_fh: AtomicU64::new(1),
            uid,
            gid,
            mounted_at: SystemTime::now(),
            locks,
            cache_locks,
            rt: rt.clone(),
        });
        if let Some(holder) = holder {
            rt.spawn(sh.clone().answer_requests(holder));
        }
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
        // Shared mappings of direct-I/O files (Linux 6.6+): the kernel writes dirty mapped
        // pages back before a direct read or write of their range, drops the range's pages
        // after a direct write, and sends their writeback as ordinary writes (docs/sheepfs.md).
        if let Err(missing) = config.add_capabilities(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP) {
            tracing::warn!(
                "kernel lacks {missing:?}: shared mmap of the files fails with ENODEV (Linux 6.6 or later allows it)"
            );
        }
        if let Err(max) = config.set_max_background(MAX_BACKGROUND) {
            tracing::warn!("kernel caps max_background at {max}");
        }
        let _ = config.set_congestion_threshold(MAX_BACKGROUND * 3 / 4);
        Ok(())
    }

    fn destroy(&mut self) {
        // The session ended (unmounted): nothing is open any more.
        if let Some(locks) = self.sh.locks.clone() {
            // The timer is made inside block_on: this thread is not a runtime thread.
            let released = self.rt.block_on(async move {
                tokio::time::timeout(Duration::from_secs(10), locks.release_all()).await
            });
            if released.is_err() {
                tracing::warn!("releasing the locks at unmount timed out: they free themselves when their leases end");
            }
        }
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if parent != INodeNo::ROOT {
            return reply.error(Errno::ENOENT);
        }
        let name = match utf8(name) {
            Ok(n) => n,
            Err(_) => return reply.error(Errno::ENOENT),
        };
        if vdi::split_snapshot(&name).is_err() {
            return reply.error(Errno::ENOENT);
        }
        self.spawn(move |sh| async move {
            match sh.stat(&name).await {
                Ok((ino, info)) => reply.entry(&TTL, &sh.file_attr(ino, &info), Generation(0)),
                Err(e) => reply.error(fail("lookup", &name, &e)),
            }
        });
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        if ino == INodeNo::ROOT {
            return reply.attr(&TTL, &self.sh.dir_attr());
        }
        if let Some(v) = self.sh.peek(ino.0) {
            return reply.attr(&TTL, &self.sh.file_attr(ino.0, &v.info()));
        }
        self.spawn(move |sh| async move {
            let name = match sh.name_of(ino.0) {
                Ok(n) => n,
                Err(e) => return reply.error(e),
            };
            match sh.stat(&name).await {
                Ok((_, info)) => reply.attr(&TTL, &sh.file_attr(ino.0, &info)),
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
            // Held to the end: a resize is a request on the open handle.
            let open = match sh.opened_wait(ino.0).await {
                Ok(d) => Some(d),
                Err(Errno::EBADF) => None,
                Err(e) => return reply.error(e),
            };
            let vdi = match &open {
                Some(d) => d.vdi().clone(),
                None => match Vdi::open(sh.client.clone(), &name).await {
                    Ok(v) => Arc::new(v),
                    Err(e) => return reply.error(fail("setattr", &name, &e)),
                },
            };
            if size.is_some() && vdi.snapshot().is_some() {
                tracing::debug!("truncate {name}: snapshots are read-only");
                return reply.error(Errno::EROFS);
            }
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
            reply.attr(&TTL, &sh.file_attr(ino.0, &vdi.info()));
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
        if is_snapshot(&name) {
            tracing::warn!("refusing to delete snapshot '{name}' through the mount: use 'dog vdi delete {name}'");
            return reply.error(Errno::EPERM);
        }
        self.spawn(move |sh| async move {
            // The kernel sends the release of a closed file on its own time: an `rm` right
            // after the last close can arrive first. Give that release a moment.
            let deadline = tokio::time::Instant::now() + UNLINK_WAIT;
            if !sh.closed_by(&name, deadline).await {
                tracing::warn!("refusing to delete VDI '{name}': it is open on this mount");
                return reply.error(Errno::EBUSY);
            }
            // Through the cache, what this mount cached of it (dirty too) goes only once the
            // cluster deleted it (its lock goes with it).
            let deleted = match &sh.cache {
                Some(cache) => {
                    let (client, n) = (&sh.client, &name);
                    let delete = |owner: String| async move {
                        vdi::delete_held(client, n, Some(&owner)).await
                    };
                    cache.delete_vdi(&name, delete).await
                }
                None => {
                    if let Some(locks) = &sh.locks {
                        locks.forget(&name).await;
                    }
                    vdi::delete(&sh.client, &name).await
                }
            };
            match deleted {
                Ok(()) => {
                    sh.names.lock().unwrap().forget(&name);
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
                Ok((ino, d)) => reply.created(
                    &TTL,
                    &sh.file_attr(ino, &d.vdi().info()),
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
        let now = match self.sh.try_opened(ino.0) {
            Ok(d) => d,
            Err(e) => return reply.error(e),
        };
        let mut missed = Missed::default();
        if let Some(Disk::Cached(c)) = now.as_deref() {
            let end = c.vdi().size();
            let len = (size as u64).min(end.saturating_sub(offset));
            if len > 0 {
                match c.read_hit(offset, len) {
                    Ok(data) => return reply.data(&data),
                    Err(m) => missed = m,
                }
            }
        }
        self.spawn(move |sh| async move {
            let mut disk = match sh.in_use(ino.0, now).await {
                Ok(d) => d,
                Err(e) => return reply.error(e),
            };
            let end = disk.vdi().size();
            if offset >= end {
                return reply.data(&[]);
            }
            let len = (size as u64).min(end - offset);
            let mut missed = Some(missed);
            loop {
                let read = match &*disk {
                    Disk::Plain(v, _) => sh.read_plain(v, offset, len).await,
                    Disk::Cached(c) => {
                        let m = missed.take().unwrap_or_default();
                        c.read_missed(offset, len, m).await
                    }
                };
                match read {
                    Ok(data) => return reply.data(&data),
                    Err(e) => match sh.again(ino.0, disk, &e).await {
                        Again::Retry(d) => disk = d,
                        Again::Stands(d) => {
                            return reply.error(cache_fail("read", &d.vdi().header().name, &e))
                        }
                        Again::Gone(errno) => return reply.error(errno),
                    },
                }
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
        let now = match self.sh.try_opened(ino.0) {
            Ok(d) => d,
            Err(e) => return reply.error(e),
        };
        if let Some(Disk::Cached(c)) = now.as_deref() {
            if c.write_fast(offset, data) {
                return reply.written(data.len() as u32);
            }
        }
        let data = Bytes::copy_from_slice(data);
        self.spawn(move |sh| async move {
            let mut disk = match sh.in_use(ino.0, now).await {
                Ok(d) => d,
                Err(e) => return reply.error(e),
            };
            loop {
                if let Some(e) = sh.refused(&disk) {
                    return reply.error(cache_fail("write", &disk.vdi().full_name(), &e));
                }
                if let Err(e) = sh.take_lock(&disk).await {
                    return reply.error(cache_fail("write", &disk.vdi().full_name(), &e));
                }
                let end = disk.vdi().size();
                if offset >= end {
                    return reply.error(Errno::ENOSPC);
                }
                // Like a block device: the part inside the disk is written, the rest refused.
                let n = (data.len() as u64).min(end - offset) as usize;
                match disk.write(offset, data.slice(..n)).await {
                    Ok(()) => return reply.written(n as u32),
                    Err(e) => match sh.again(ino.0, disk, &e).await {
                        Again::Retry(d) => disk = d,
                        Again::Stands(d) => {
                            return reply.error(cache_fail("write", &d.vdi().header().name, &e))
                        }
                        Again::Gone(errno) => return reply.error(errno),
                    },
                }
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
        let now = match self.sh.try_opened(ino.0) {
            Ok(d) => d,
            Err(e) => return reply.error(e),
        };
        self.spawn(move |sh| async move {
            let disk = match sh.in_use(ino.0, now).await {
                Ok(d) => d,
                Err(e) => return reply.error(e),
            };
            if disk.vdi().snapshot().is_some() {
                // Nothing to make durable: a snapshot never changes.
                return reply.ok();
            }
            if let Some(e) = sh.refused(&disk) {
                return reply.error(cache_fail("fsync", &disk.vdi().header().name, &e));
            }
            let mut disk = disk;
            loop {
                match disk.flush().await {
                    Ok(()) => return reply.ok(),
                    // Lost to another mount with nothing unpushed: every write acknowledged
                    // here is in the cluster; flushed there, plain.
                    Err(e) => match sh.again(ino.0, disk, &e).await {
                        Again::Retry(d) => disk = d,
                        Again::Stands(d) => {
                            return reply.error(cache_fail("fsync", &d.vdi().header().name, &e))
                        }
                        Again::Gone(errno) => return reply.error(errno),
                    },
                }
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
                for (name, _) in list {
                    entries.push((names.ino(&name), FileType::RegularFile, name));
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
        let now = match self.sh.try_opened(ino.0) {
            Ok(d) => d,
            Err(e) => return reply.error(e),
        };
        self.spawn(move |sh| async move {
            let disk = match sh.in_use(ino.0, now).await {
                Ok(d) => d,
                Err(e) => return reply.error(e),
            };
            if let Some(e) = sh.refused(&disk) {
                return reply.error(cache_fail("fallocate", &disk.vdi().full_name(), &e));
            }
            if let Err(e) = sh.take_lock(&disk).await {
                return reply.error(cache_fail("fallocate", &disk.vdi().full_name(), &e));
            }
            let Some(res) = crate::alloc::fallocate(&disk, offset, length, mode).await else {
                return reply.error(Errno::EOPNOTSUPP);
            };
            match res {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(cache_fail("fallocate", &disk.vdi().header().name, &e)),
            }
        });
    }
}
