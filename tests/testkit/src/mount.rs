//! A real FUSE mount (`sheepfs`, or any daemon that mounts in the foreground such as
//! `bindfs -f`) started as a [`Proc`]: ready once the kernel lists the mount, and always
//! unmounted and stopped on drop.
//!
//! A start that fails (the daemon exits, or the mount does not appear in time) kills the
//! daemon's group and then detaches the mount point if a mount appeared meanwhile, so no
//! failed start leaves a mount behind.
//!
//! Drop, as the daemon's [`ProcOptions`] say: killed at once (tests: the mount is detached
//! lazily, then SIGKILL), or stopped gracefully (`bench run`: unmounted, then SIGTERM and up
//! to `stop_grace` for sheepfs to push its cache).
//!
//! If the harness itself is killed, the parent-death signal takes the daemon down, but a
//! FUSE mount outlives its daemon (ENOTCONN until someone unmounts it). So, unless
//! [`MountOptions::sentinel`] is off, each mount has a sentinel: a small `sh` in its own
//! process group, blocked reading a pipe only the harness holds. When the harness dies the
//! pipe closes and the sentinel detaches the mount point; a drop kills the sentinel first,
//! so it never touches a later mount on the same path.

use std::ffi::CString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Duration;

use crate::{or_panic, try_wait_until, wait_until, Error, Proc, ProcOptions, Result};

/// Whether `path` is a mount point in this namespace.
pub fn is_mounted(path: &Path) -> bool {
    mounts_under(path).iter().any(|m| m == path)
}

/// Mount points at or below `dir`, deepest first.
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut v: Vec<PathBuf> = text
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(PathBuf::from)
        .filter(|m| m.starts_with(dir))
        .collect();
    v.sort_by_key(|m| std::cmp::Reverse(m.components().count()));
    v
}

fn c_path(path: &Path) -> Option<CString> {
    CString::new(path.as_os_str().as_encoded_bytes()).ok()
}

/// Detaches whatever is mounted at `path` (MNT_DETACH never blocks).
pub fn detach(path: &Path) {
    if let Some(c) = c_path(path) {
        // SAFETY: a valid NUL-terminated path.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
}

/// Unmounts `dir`: a plain unmount, lazily if it is busy, then `fusermount3 -uz` if it is
/// still there (never blocks).
pub fn unmount(dir: &Path) {
    let Some(c) = c_path(dir) else {
        return;
    };
    // SAFETY: a valid NUL-terminated path.
    let ok = unsafe { libc::umount2(c.as_ptr(), 0) } == 0;
    if !ok && is_mounted(dir) {
        detach(dir);
    }
    if is_mounted(dir) {
        let _ = Command::new("fusermount3")
            .arg("-uz")
            .arg(dir)
            .stderr(Stdio::null())
            .status();
    }
}

/// How [`Mount::try_spawn`] waits and stops.
#[derive(Debug, Clone, Copy)]
pub struct MountOptions {
    pub proc: ProcOptions,
    /// How long the mount may take to appear.
    pub timeout: Duration,
    /// Detach the mount point if this process dies without dropping the mount (see the
    /// module's doc). Off for a daemon that unmounts itself on its death signal.
    pub sentinel: bool,
}

impl Default for MountOptions {
    /// What tests use: 20 s to mount, killed at once on drop, a sentinel.
    fn default() -> MountOptions {
        MountOptions {
            proc: ProcOptions::default(),
            timeout: Duration::from_secs(20),
            sentinel: true,
        }
    }
}

/// Detaches a mount point once the pipe it reads closes: when this process dies.
struct Sentinel {
    child: Child,
    /// The pipe's only writer; never written to.
    _pipe: ChildStdin,
}

impl Sentinel {
    fn start(dir: &Path) -> Result<Sentinel> {
        let (child, pipe) = spawn_sentinel(dir)?;
        Ok(Sentinel { child, _pipe: pipe })
    }
}

/// `sh` waiting for EOF on its stdin, then detaching `dir`; and the pipe's write end.
fn spawn_sentinel(dir: &Path) -> Result<(Child, ChildStdin)> {
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(r#"read -r _; umount -l -- "$0" 2>/dev/null || fusermount3 -uz -- "$0""#)
        .arg(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        // Out of the terminal's reach: a Ctrl-C that kills the harness must not kill it.
        .process_group(0);
    let mut child = cmd
        .spawn()
        .map_err(|e| Error::io("starting the mount's sentinel (sh)", e))?;
    let pipe = child.stdin.take().expect("stdin is piped");
    Ok((child, pipe))
}

impl Drop for Sentinel {
    /// Killed before its pipe closes, so it never unmounts anything.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Fields drop in order: the sentinel goes before the daemon.
pub struct Mount {
    sentinel: Option<Sentinel>,
    proc: Option<Proc>,
    pub dir: PathBuf,
}

impl Mount {
    /// Mounts the cluster at `cluster` on `dir` (created if missing) with `extra` options;
    /// panics if that fails.
    #[track_caller]
    pub fn start(sheepfs: &Path, cluster: &str, dir: &Path, log: &Path, extra: &[&str]) -> Mount {
        or_panic(Mount::try_start(sheepfs, cluster, dir, log, extra))
    }

    /// `sheepfs --cluster CLUSTER DIR --foreground EXTRA...` with `RUST_LOG=info`, its output
    /// in `log`; `dir` is created if missing.
    pub fn try_start(
        sheepfs: &Path,
        cluster: &str,
        dir: &Path,
        log: &Path,
        extra: &[&str],
    ) -> Result<Mount> {
        let spawn = |dir: &Path| {
            let mut cmd = Command::new(sheepfs);
            crate::auth::with_key(&mut cmd)
                .arg("--cluster")
                .arg(cluster)
                .arg(dir)
                .arg("--foreground")
                .args(extra)
                .env("RUST_LOG", "info");
            cmd
        };
        Mount::try_spawn("sheepfs", spawn, dir, log, MountOptions::default())
    }

    /// Starts the daemon `command` makes for the canonical mount point (`dir`, created if
    /// missing), its output in `log`, and waits until the kernel lists the mount.
    pub fn try_spawn(
        name: &str,
        command: impl FnOnce(&Path) -> Command,
        dir: &Path,
        log: &Path,
        opts: MountOptions,
    ) -> Result<Mount> {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::io(format!("creating the mount point {}", dir.display()), e))?;
        let dir = dir
            .canonicalize()
            .map_err(|e| Error::io(format!("resolving {}", dir.display()), e))?;
        let sentinel = opts.sentinel.then(|| Sentinel::start(&dir)).transpose()?;
        let mut proc = Proc::try_spawn_with(name, command(&dir), log, opts.proc)?;
        let what = format!("{name} to mount {}", dir.display());
        let ready = try_wait_until(&what, opts.timeout, || {
            proc.check_alive()?;
            Ok(is_mounted(&dir))
        });
        if let Err(e) = ready {
            let tail = proc.log_tail(2000);
            drop(sentinel);
            proc.kill9();
            // A mount made after the deadline, or just before the daemon died.
            if is_mounted(&dir) {
                detach(&dir);
            }
            return Err(match e {
                Error::Exited { .. } | Error::Interrupted => e,
                e => e.context(format!(
                    "{name} did not mount; end of {}:\n{tail}",
                    log.display()
                )),
            });
        }
        Ok(Mount {
            sentinel,
            proc: Some(proc),
            dir,
        })
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The daemon's pid, or 0 once it is stopped.
    pub fn pid(&self) -> u32 {
        self.proc.as_ref().map(|p| p.pid()).unwrap_or(0)
    }

    pub fn log_tail(&self) -> String {
        self.proc
            .as_ref()
            .map(|p| p.log_tail(4000))
            .unwrap_or_default()
    }

    /// [`Error::Exited`] with the end of its log if the daemon has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        match self.proc.as_mut() {
            Some(p) => p.check_alive(),
            None => Err(Error::Unexpected {
                what: format!("the mount on {}", self.dir.display()),
                detail: "was stopped".into(),
            }),
        }
    }

    /// `umount`; returns its exit status and stderr.
    pub fn umount(&self) -> (bool, String) {
        let out = Command::new("umount")
            .arg(&self.dir)
            .output()
            .expect("run umount");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// Unmounts and waits for sheepfs to exit on its own.
    pub fn unmount_and_wait(&mut self) {
        self.sentinel = None;
        let (ok, err) = self.umount();
        assert!(ok, "umount {}: {err}", self.dir.display());
        if let Some(p) = self.proc.as_mut() {
            wait_until(
                "sheepfs to exit after umount",
                Duration::from_secs(10),
                || !p.running(),
            );
        }
        self.proc = None;
    }

    /// Sends `sig` to the daemon (it keeps the mount: see [`Mount::wait_exit`]).
    pub fn signal(&mut self, sig: libc::c_int) {
        if let Some(p) = self.proc.as_ref() {
            p.signal(sig);
        }
    }

    /// Waits up to `timeout` for the daemon to exit on its own (after a signal, an unmount);
    /// panics if it does not. Returns its exit status; the mount is no longer this value's.
    #[track_caller]
    pub fn wait_exit(&mut self, timeout: Duration) -> std::process::ExitStatus {
        self.sentinel = None;
        let p = self.proc.as_mut().expect("a running daemon");
        let Some(status) = p.wait_exit(timeout) else {
            panic!(
                "{} did not exit within {timeout:?}; its log ends:\n{}",
                p.name(),
                p.log_tail(3000)
            );
        };
        self.proc = None;
        status
    }

    pub fn kill9(&mut self) {
        self.sentinel = None;
        if let Some(p) = self.proc.as_mut() {
            p.kill9();
        }
        detach(&self.dir);
        self.proc = None;
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        // Only a mount this value still owns: after unmount_and_wait or kill9 the same path
        // may already hold a newer mount.
        self.sentinel = None;
        let Some(proc) = self.proc.as_ref() else {
            return;
        };
        let graceful = proc.options().stop_grace.is_some() && !std::thread::panicking();
        if graceful {
            unmount(&self.dir);
        } else if is_mounted(&self.dir) {
            detach(&self.dir);
        }
        // Proc's own drop stops it (and prints its log if the thread is panicking).
        self.proc = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tmpfs on a fresh directory, or `None` where this process may not mount.
    fn tmpfs() -> Option<tempfile::TempDir> {
        let d = tempfile::tempdir().unwrap();
        let path = c_path(d.path()).unwrap();
        let fstype = CString::new("tmpfs").unwrap();
        // SAFETY: valid NUL-terminated strings, no data.
        let rc = unsafe {
            libc::mount(
                fstype.as_ptr(),
                path.as_ptr(),
                fstype.as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        (rc == 0).then_some(d)
    }

    #[test]
    fn the_sentinel_detaches_when_its_pipe_closes_and_never_once_killed() {
        let Some(d) = tmpfs() else {
            eprintln!("skipped: cannot mount a tmpfs here");
            return;
        };
        assert!(is_mounted(d.path()));
        // Killed first (a drop): the mount stays.
        let (mut child, pipe) = spawn_sentinel(d.path()).unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        drop(pipe);
        assert!(is_mounted(d.path()));
        // Its pipe closed (the harness died): the mount goes.
        let (mut child, pipe) = spawn_sentinel(d.path()).unwrap();
        drop(pipe);
        child.wait().unwrap();
        let mounted = is_mounted(d.path());
        detach(d.path());
        assert!(!mounted, "the sentinel left the mount");
    }

    #[test]
    fn a_daemon_that_never_mounts_is_killed_and_named() {
        let d = tempfile::tempdir().unwrap();
        let log = d.path().join("never.log");
        let opts = MountOptions {
            timeout: Duration::from_millis(300),
            ..MountOptions::default()
        };
        let sleeper = |_: &Path| {
            let mut c = Command::new("sh");
            c.arg("-c").arg("echo not mounting; sleep 600");
            c
        };
        let e = Mount::try_spawn("never", sleeper, &d.path().join("mnt"), &log, opts)
            .err()
            .unwrap();
        let text = e.chain();
        assert!(text.contains("never did not mount"), "{text}");
        assert!(text.contains("not mounting"), "{text}");
        assert!(text.contains("timed out"), "{text}");
        let quitter = |_: &Path| {
            let mut c = Command::new("sh");
            c.arg("-c").arg("echo bad option; exit 2");
            c
        };
        let e = Mount::try_spawn("quitter", quitter, &d.path().join("mnt"), &log, opts)
            .err()
            .unwrap();
        assert!(e.to_string().contains("bad option"), "{e}");
    }
}
