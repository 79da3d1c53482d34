//! What `sheepfs` checks before mounting, and the FUSE session configuration.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use fuser::{Config, MountOption, SessionACL};
use thiserror::Error;

#[derive(Debug, Error)]
#[non_exhaustive]
pub enum MountError {
    #[error("mount point {0} does not exist")]
    Missing(PathBuf),
    #[error("mount point {0} is not a directory")]
    NotDir(PathBuf),
    #[error("mount point {0} is already a mount point (is sheepfs already mounted there, or a dead mount left by a crash? umount it, or umount -l)")]
    Busy(PathBuf),
    #[error("mount point {0} is not empty")]
    NotEmpty(PathBuf),
    #[error("mount point {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Whether `path` (absolute, canonical) is listed as a mount point of this process's namespace.
fn listed_in_mountinfo(path: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let want = path.to_string_lossy();
    text.lines().any(|l| {
        // Field 5 is the mount point, with spaces etc. octal-escaped.
        l.split(' ').nth(4).is_some_and(|m| {
            m.replace("\\040", " ")
                .replace("\\011", "\t")
                .replace("\\012", "\n")
                == want.as_ref()
        })
    })
}

/// Checks that `path` is an empty directory that nothing is mounted on; returns it canonical.
pub fn check_mountpoint(path: &Path) -> Result<PathBuf, MountError> {
    let io = |source| MountError::Io {
        path: path.to_path_buf(),
        source,
    };
    let canon = match path.canonicalize() {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(MountError::Missing(path.to_path_buf()))
        }
        // A dead FUSE mount answers ENOTCONN: it is a mount point.
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => {
            return Err(MountError::Busy(path.to_path_buf()))
        }
        Err(e) => return Err(io(e)),
    };
    let meta = match std::fs::metadata(&canon) {
        Ok(m) => m,
        Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => return Err(MountError::Busy(canon)),
        Err(e) => return Err(io(e)),
    };
    if !meta.is_dir() {
        return Err(MountError::NotDir(canon));
    }
    let parent_dev = canon
        .parent()
        .and_then(|p| std::fs::metadata(p).ok())
        .map(|m| m.dev());
    if parent_dev.is_some_and(|d| d != meta.dev()) || listed_in_mountinfo(&canon) {
        return Err(MountError::Busy(canon));
    }
    if std::fs::read_dir(&canon).map_err(io)?.next().is_some() {
        return Err(MountError::NotEmpty(canon));
    }
    Ok(canon)
}

/// FUSE session settings: several threads each with its own /dev/fuse fd.
pub fn config(allow_other: bool, threads: usize) -> Config {
    let mut c = Config::default();
    c.mount_options = vec![
        MountOption::FSName("sheepfs".into()),
        MountOption::Subtype("sheepfs".into()),
        MountOption::NoSuid,
        MountOption::NoDev,
        MountOption::NoAtime,
    ];
    if allow_other {
        // Other users get what the file modes (0644, owned by the mounting user) allow.
        c.mount_options.push(MountOption::DefaultPermissions);
    }
    c.acl = if allow_other {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    c.n_threads = Some(threads.max(1));
    c.clone_fd = true;
    c
}

/// How the FUSE threads are scheduled (`sheepfs --fuse-sched`). Under `SCHED_BATCH` a
/// guest that submits one request and waits for it finishes its submission and sleeps
/// first; the request is then served on the same CPU, without a switch back and forth or a
/// wake-up of an idle CPU. Both policies get the same share of CPU time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FuseSched {
    /// SCHED_BATCH: a woken FUSE thread does not preempt the task that submitted the request
    Batch,
    /// SCHED_OTHER, the default policy
    Normal,
}

/// Sets the calling thread's scheduling policy; threads it starts afterwards inherit it
/// (so call it on the thread that starts the FUSE session).
pub fn set_thread_sched(s: FuseSched) -> std::io::Result<()> {
    let policy = match s {
        FuseSched::Batch => libc::SCHED_BATCH,
        FuseSched::Normal => libc::SCHED_OTHER,
    };
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 is the calling thread; `param` is a valid sched_param for the call.
    if unsafe { libc::sched_setscheduler(0, policy, &param) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sched_is_inherited_by_new_threads() {
        let policy = || unsafe { libc::sched_getscheduler(0) };
        std::thread::spawn(move || {
            set_thread_sched(FuseSched::Batch).unwrap();
            assert_eq!(policy(), libc::SCHED_BATCH);
            let child = std::thread::spawn(policy).join().unwrap();
            assert_eq!(child, libc::SCHED_BATCH);
            set_thread_sched(FuseSched::Normal).unwrap();
            assert_eq!(policy(), libc::SCHED_OTHER);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn mountpoint_checks() {
        let d = tempfile::tempdir().unwrap();
        assert!(check_mountpoint(d.path()).is_ok());
        assert!(matches!(
            check_mountpoint(&d.path().join("nope")),
            Err(MountError::Missing(_))
        ));
        std::fs::write(d.path().join("f"), b"x").unwrap();
        assert!(matches!(
            check_mountpoint(d.path()),
            Err(MountError::NotEmpty(_))
        ));
        assert!(matches!(
            check_mountpoint(&d.path().join("f")),
            Err(MountError::NotDir(_))
        ));
        assert!(matches!(
            check_mountpoint(Path::new("/proc")),
            Err(MountError::Busy(_))
        ));
    }
}
