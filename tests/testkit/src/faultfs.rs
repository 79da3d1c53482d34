//! An error-injecting FUSE passthrough: a directory mirrored at a mount point, every
//! operation done on the backing directory, except that reads, writes or fsyncs of chosen
//! files answer EIO once armed. A sick disk for real processes on a machine without
//! device-mapper (`/dev/mapper/control` missing): put a `sheep` data directory on it.
//!
//! Arming: [`FaultMount::arm`] from the test, or a control file (given at mount time) that
//! another process writes: one rule a line, `OP SUBSTRING`, OP one of `read`, `write`, `fsync`,
//! `all`; a rule matches a file whose path under the mount contains SUBSTRING (`all obj/`
//! fails every object file). The file is read again whenever it changes; empty disarms.
//!
//! Every open file bypasses the page cache (`FOPEN_DIRECT_IO`), so each read and write
//! reaches this process and can fail. Locks (`flock`) stay local to the kernel. Root only
//! (it mounts). Unmounted lazily on drop, so a process still holding files there does not
//! keep the test from ending.

use std::collections::HashMap;
use std::ffi::{CString, OsStr};
use std::fs::{self, File, OpenOptions};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo,
    MountOption, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, Request, TimeOrNow, WriteFlags,
};

use crate::{Error, Result};

const TTL: Duration = Duration::from_secs(1);

/// Operations a rule fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultOp {
    Read,
    Write,
    Fsync,
    All,
}

impl FaultOp {
    fn covers(self, op: FaultOp) -> bool {
        self == FaultOp::All || self == op
    }

    fn parse(s: &str) -> Option<FaultOp> {
        Some(match s {
            "read" => FaultOp::Read,
            "write" => FaultOp::Write,
            "fsync" => FaultOp::Fsync,
            "all" => FaultOp::All,
            _ => return None,
        })
    }
}

/// Fail `FaultOp` on paths containing the string.
type Rule = (FaultOp, String);
/// A control file's modification time and length: it changed when they did.
type Stamp = (SystemTime, u64);

/// The armed rules and how many EIOs they gave.
#[derive(Default)]
pub struct Faults {
    armed: Mutex<Vec<(FaultOp, String)>>,
    control: Option<PathBuf>,
    /// The control file's rules and the (mtime, length) they were read at.
    from_file: Mutex<(Option<Stamp>, Vec<Rule>)>,
    hits: AtomicU64,
}

impl Faults {
    fn file_rules(&self) -> Vec<(FaultOp, String)> {
        let Some(ctl) = &self.control else {
            return Vec::new();
        };
        let mtime = fs::metadata(ctl)
            .and_then(|m| Ok((m.modified()?, m.len())))
            .ok();
        let mut cached = self.from_file.lock().unwrap();
        if cached.0 != mtime {
            let text = fs::read_to_string(ctl).unwrap_or_default();
            cached.1 = text
                .lines()
                .filter_map(|l| {
                    let (op, sub) = l.trim().split_once(' ')?;
                    Some((FaultOp::parse(op)?, sub.trim().to_string()))
                })
                .collect();
            cached.0 = mtime;
        }
        cached.1.clone()
    }

    /// Whether `op` on `path` (relative to the mount) fails; counts the hit.
    fn fails(&self, op: FaultOp, path: &Path) -> bool {
        let p = path.to_string_lossy();
        let hit = self
            .armed
            .lock()
            .unwrap()
            .iter()
            .chain(self.file_rules().iter())
            .any(|(o, sub)| o.covers(op) && p.contains(sub.as_str()));
        if hit {
            self.hits.fetch_add(1, Ordering::Relaxed);
        }
        hit
    }
}

struct Inodes {
    paths: HashMap<u64, PathBuf>,
    inos: HashMap<PathBuf, u64>,
    next: u64,
}

impl Inodes {
    fn ino(&mut self, rel: &Path) -> u64 {
        if let Some(i) = self.inos.get(rel) {
            return *i;
        }
        let i = self.next;
        self.next += 1;
        self.paths.insert(i, rel.to_path_buf());
        self.inos.insert(rel.to_path_buf(), i);
        i
    }
}

struct FaultFs {
    backing: PathBuf,
    faults: Arc<Faults>,
    inodes: Mutex<Inodes>,
    files: Mutex<HashMap<u64, (File, PathBuf)>>,
    next_fh: AtomicU64,
}

fn errno(e: std::io::Error) -> Errno {
    Errno::from_i32(e.raw_os_error().unwrap_or(libc::EIO))
}

fn time(secs: i64, nsecs: i64) -> SystemTime {
    if secs >= 0 {
        UNIX_EPOCH + Duration::new(secs as u64, nsecs as u32)
    } else {
        UNIX_EPOCH
    }
}

fn attr(ino: u64, m: &fs::Metadata) -> FileAttr {
    let kind = if m.is_dir() {
        FileType::Directory
    } else if m.file_type().is_symlink() {
        FileType::Symlink
    } else {
        FileType::RegularFile
    };
    FileAttr {
        ino: INodeNo(ino),
        size: m.size(),
        blocks: m.blocks(),
        atime: time(m.atime(), m.atime_nsec()),
        mtime: time(m.mtime(), m.mtime_nsec()),
        ctime: time(m.ctime(), m.ctime_nsec()),
        crtime: UNIX_EPOCH,
        kind,
        perm: (m.mode() & 0o7777) as u16,
        nlink: m.nlink() as u32,
        uid: m.uid(),
        gid: m.gid(),
        rdev: m.rdev() as u32,
        blksize: 4096,
        flags: 0,
    }
}

impl FaultFs {
    fn rel(&self, ino: INodeNo) -> std::result::Result<PathBuf, Errno> {
        if ino == INodeNo::ROOT {
            return Ok(PathBuf::new());
        }
        self.inodes
            .lock()
            .unwrap()
            .paths
            .get(&ino.0)
            .cloned()
            .ok_or(Errno::ENOENT)
    }

    fn child(&self, parent: INodeNo, name: &OsStr) -> std::result::Result<PathBuf, Errno> {
        Ok(self.rel(parent)?.join(name))
    }

    fn entry(&self, rel: &Path) -> std::result::Result<FileAttr, Errno> {
        let m = fs::symlink_metadata(self.backing.join(rel)).map_err(errno)?;
        let ino = if rel.as_os_str().is_empty() {
            1
        } else {
            self.inodes.lock().unwrap().ino(rel)
        };
        Ok(attr(ino, &m))
    }

    fn forget_path(&self, rel: &Path) {
        let mut i = self.inodes.lock().unwrap();
        if let Some(ino) = i.inos.remove(rel) {
            i.paths.remove(&ino);
        }
    }

    /// `unlink` and `rmdir`: `rm` on the backing path, then the inode is forgotten.
    fn remove(
        &self,
        parent: INodeNo,
        name: &OsStr,
        rm: impl FnOnce(&Path) -> std::io::Result<()>,
        reply: ReplyEmpty,
    ) {
        match self.child(parent, name).and_then(|rel| {
            rm(&self.backing.join(&rel)).map_err(errno)?;
            self.forget_path(&rel);
            Ok(())
        }) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn open_fh(&self, file: File, rel: PathBuf) -> FileHandle {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.files.lock().unwrap().insert(fh, (file, rel));
        FileHandle(fh)
    }

    fn with_file<T>(
        &self,
        fh: FileHandle,
        op: FaultOp,
        f: impl FnOnce(&File) -> std::io::Result<T>,
    ) -> std::result::Result<T, Errno> {
        let files = self.files.lock().unwrap();
        let (file, rel) = files.get(&fh.0).ok_or(Errno::EBADF)?;
        if self.faults.fails(op, rel) {
            return Err(Errno::EIO);
        }
        f(file).map_err(errno)
    }
}

fn options(flags: i32) -> OpenOptions {
    let mut o = OpenOptions::new();
    match flags & libc::O_ACCMODE {
        libc::O_RDONLY => o.read(true),
        libc::O_WRONLY => o.write(true),
        _ => o.read(true).write(true),
    };
    o.custom_flags(flags & !(libc::O_ACCMODE | libc::O_CREAT | libc::O_EXCL | libc::O_DIRECT));
    o
}

impl Filesystem for FaultFs {
    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match self.child(parent, name).and_then(|p| self.entry(&p)) {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.rel(ino).and_then(|p| self.entry(&p)) {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
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
        let res = self.rel(ino).and_then(|rel| {
            let p = self.backing.join(&rel);
            if let Some(size) = size {
                if self.faults.fails(FaultOp::Write, &rel) {
                    return Err(Errno::EIO);
                }
                OpenOptions::new()
                    .write(true)
                    .open(&p)
                    .and_then(|f| f.set_len(size))
                    .map_err(errno)?;
            }
            if let Some(mode) = mode {
                fs::set_permissions(&p, fs::Permissions::from_mode(mode & 0o7777))
                    .map_err(errno)?;
            }
            self.entry(&rel)
        });
        match res {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    fn mkdir(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let res = self.child(parent, name).and_then(|rel| {
            let p = self.backing.join(&rel);
            fs::create_dir(&p).map_err(errno)?;
            let _ = fs::set_permissions(&p, fs::Permissions::from_mode(mode & 0o7777));
            self.entry(&rel)
        });
        match res {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.remove(parent, name, |p| fs::remove_file(p), reply)
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        self.remove(parent, name, |p| fs::remove_dir(p), reply)
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        _flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let res = self.child(parent, name).and_then(|from| {
            let to = self.child(newparent, newname)?;
            fs::rename(self.backing.join(&from), self.backing.join(&to)).map_err(errno)?;
            // The inode follows its file; whatever `to` named before is gone.
            self.forget_path(&to);
            let mut i = self.inodes.lock().unwrap();
            if let Some(ino) = i.inos.remove(&from) {
                i.paths.insert(ino, to.clone());
                i.inos.insert(to, ino);
            }
            Ok(())
        });
        match res {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let res = self.rel(ino).and_then(|rel| {
            let f = options(flags.0)
                .open(self.backing.join(&rel))
                .map_err(errno)?;
            Ok(self.open_fh(f, rel))
        });
        match res {
            Ok(fh) => reply.opened(fh, FopenFlags::FOPEN_DIRECT_IO),
            Err(e) => reply.error(e),
        }
    }

    fn create(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let res = self.child(parent, name).and_then(|rel| {
            let mut o = options(flags);
            o.create(true).mode(mode & 0o7777);
            if flags & libc::O_EXCL != 0 {
                o.create_new(true);
            }
            let f = o.open(self.backing.join(&rel)).map_err(errno)?;
            let a = self.entry(&rel)?;
            Ok((a, self.open_fh(f, rel)))
        });
        match res {
            Ok((a, fh)) => reply.created(&TTL, &a, Generation(0), fh, FopenFlags::FOPEN_DIRECT_IO),
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyData,
    ) {
        let res = self.with_file(fh, FaultOp::Read, |f| {
            let mut buf = vec![0u8; size as usize];
            let mut got = 0;
            while got < buf.len() {
                let n = f.read_at(&mut buf[got..], offset + got as u64)?;
                if n == 0 {
                    break;
                }
                got += n;
            }
            buf.truncate(got);
            Ok(buf)
        });
        match res {
            Ok(b) => reply.data(&b),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyWrite,
    ) {
        match self.with_file(fh, FaultOp::Write, |f| f.write_all_at(data, offset)) {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: fuser::LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        datasync: bool,
        reply: ReplyEmpty,
    ) {
        let res = self.with_file(fh, FaultOp::Fsync, |f| {
            if datasync {
                f.sync_data()
            } else {
                f.sync_all()
            }
        });
        match res {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.files.lock().unwrap().remove(&fh.0);
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
        let rel = match self.rel(ino) {
            Ok(r) => r,
            Err(e) => return reply.error(e),
        };
        let rd = match fs::read_dir(self.backing.join(&rel)) {
            Ok(rd) => rd,
            Err(e) => return reply.error(errno(e)),
        };
        let mut entries = vec![
            (ino.0, FileType::Directory, OsStr::new(".").to_os_string()),
            (ino.0, FileType::Directory, OsStr::new("..").to_os_string()),
        ];
        for e in rd.flatten() {
            let name = e.file_name();
            let kind = match e.file_type() {
                Ok(t) if t.is_dir() => FileType::Directory,
                Ok(t) if t.is_symlink() => FileType::Symlink,
                _ => FileType::RegularFile,
            };
            let i = self.inodes.lock().unwrap().ino(&rel.join(&name));
            entries.push((i, kind, name));
        }
        for (i, (ino, kind, name)) in entries.into_iter().enumerate().skip(offset as usize) {
            if reply.add(INodeNo(ino), i as u64 + 1, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let res = self.rel(ino).and_then(|rel| {
            if self.faults.fails(FaultOp::Fsync, &rel) {
                return Err(Errno::EIO);
            }
            File::open(self.backing.join(&rel))
                .and_then(|d| d.sync_all())
                .map_err(errno)
        });
        match res {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let c = CString::new(self.backing.as_os_str().as_bytes()).unwrap_or_default();
        // SAFETY: statvfs fills a zeroed struct from a valid NUL-terminated path.
        let mut s: libc::statvfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::statvfs(c.as_ptr(), &mut s) } != 0 {
            return reply.error(errno(std::io::Error::last_os_error()));
        }
        reply.statfs(
            s.f_blocks,
            s.f_bfree,
            s.f_bavail,
            s.f_files,
            s.f_ffree,
            s.f_bsize as u32,
            s.f_namemax as u32,
            s.f_frsize as u32,
        );
    }
}

/// A mounted `FaultFs` (see the module documentation); unmounted on drop.
pub struct FaultMount {
    mountpoint: PathBuf,
    faults: Arc<Faults>,
    session: Option<fuser::BackgroundSession>,
}

impl FaultMount {
    /// Mirrors `backing` at `mountpoint` (both created if missing); `control`: the control
    /// file other processes arm faults through, if any.
    pub fn mount(backing: &Path, mountpoint: &Path, control: Option<&Path>) -> Result<FaultMount> {
        for d in [backing, mountpoint] {
            fs::create_dir_all(d).map_err(|e| Error::io(format!("creating {}", d.display()), e))?;
        }
        let faults = Arc::new(Faults {
            control: control.map(Path::to_path_buf),
            ..Faults::default()
        });
        let fs = FaultFs {
            backing: backing.to_path_buf(),
            faults: faults.clone(),
            inodes: Mutex::new(Inodes {
                paths: HashMap::new(),
                inos: HashMap::new(),
                next: 2,
            }),
            files: Mutex::default(),
            next_fh: AtomicU64::new(1),
        };
        let mut cfg = fuser::Config::default();
        cfg.mount_options = vec![
            MountOption::FSName("faultfs".into()),
            MountOption::NoSuid,
            MountOption::NoDev,
        ];
        let session = fuser::spawn_mount(fs, mountpoint, &cfg)
            .map_err(|e| Error::io(format!("mounting faultfs on {}", mountpoint.display()), e))?;
        Ok(FaultMount {
            mountpoint: mountpoint.to_path_buf(),
            faults,
            session: Some(session),
        })
    }

    /// Makes `op` on every file whose path under the mount contains `substring` fail with EIO.
    pub fn arm(&self, op: FaultOp, substring: &str) {
        self.faults
            .armed
            .lock()
            .unwrap()
            .push((op, substring.to_string()));
    }

    /// Removes every rule armed through [`FaultMount::arm`].
    pub fn disarm(&self) {
        self.faults.armed.lock().unwrap().clear();
    }

    /// How many operations failed with an injected EIO so far.
    pub fn hits(&self) -> u64 {
        self.faults.hits.load(Ordering::Relaxed)
    }
}

impl Drop for FaultMount {
    fn drop(&mut self) {
        // Lazily: a process may still hold files there (its harness stops it after us).
        if let Ok(c) = CString::new(self.mountpoint.as_os_str().as_bytes()) {
            // SAFETY: a valid NUL-terminated path.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
        // The session thread ends once the kernel lets go of the connection.
        if let Some(s) = self.session.take() {
            std::mem::forget(s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_from_the_api_and_the_control_file_match_by_op_and_path() {
        let dir = tempfile::tempdir().unwrap();
        let ctl = dir.path().join("faults");
        let f = Faults {
            control: Some(ctl.clone()),
            ..Faults::default()
        };
        let obj = Path::new("obj/0000000700000001.1");
        assert!(!f.fails(FaultOp::Read, obj));
        fs::write(&ctl, "read 0000000700000001\nbogus line\nfsync obj/\n").unwrap();
        assert!(f.fails(FaultOp::Read, obj));
        assert!(!f.fails(FaultOp::Write, obj));
        assert!(f.fails(FaultOp::Fsync, Path::new("obj/0000000700000002.1")));
        assert!(!f.fails(FaultOp::Read, Path::new("node.json")));
        f.armed
            .lock()
            .unwrap()
            .push((FaultOp::All, "node.json".into()));
        assert!(f.fails(FaultOp::Write, Path::new("node.json")));
        assert_eq!(f.hits.load(Ordering::Relaxed), 3);
    }
}
