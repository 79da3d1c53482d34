//! A real `sheepfs` mount for end-to-end tests: started in the foreground as a [`Proc`],
//! ready once the kernel lists the mount, and always unmounted (lazily if busy) and killed on
//! drop.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::{wait_until, Proc};

/// Whether `path` is a mount point in this namespace.
pub fn is_mounted(path: &Path) -> bool {
    let want = path.to_string_lossy().to_string();
    std::fs::read_to_string("/proc/self/mountinfo")
        .map(|t| {
            t.lines()
                .any(|l| l.split(' ').nth(4) == Some(want.as_str()))
        })
        .unwrap_or(false)
}

/// Detaches whatever is mounted at `path` (MNT_DETACH never blocks).
pub fn detach(path: &Path) {
    if let Ok(c) = std::ffi::CString::new(path.to_string_lossy().as_bytes()) {
        // SAFETY: a valid NUL-terminated path.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
}

pub struct Mount {
    proc: Option<Proc>,
    pub dir: PathBuf,
}

impl Mount {
    /// Mounts the cluster at `cluster` on `dir` (created if missing) with `extra` options.
    pub fn start(sheepfs: &Path, cluster: &str, dir: &Path, log: &Path, extra: &[&str]) -> Mount {
        std::fs::create_dir_all(dir).expect("create mount point");
        let dir = dir.canonicalize().expect("canonical mount point");
        let mut cmd = Command::new(sheepfs);
        cmd.arg("--cluster")
            .arg(cluster)
            .arg(&dir)
            .arg("--foreground")
            .args(extra)
            .env("RUST_LOG", "info");
        let mut proc = Proc::spawn("sheepfs", cmd, log);
        wait_until("sheepfs to mount", Duration::from_secs(20), || {
            assert!(proc.running(), "sheepfs exited: {}", proc.log_tail(2000));
            is_mounted(&dir)
        });
        Mount {
            proc: Some(proc),
            dir,
        }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    pub fn pid(&self) -> u32 {
        self.proc.as_ref().map(|p| p.pid()).unwrap_or(0)
    }

    pub fn log_tail(&self) -> String {
        self.proc
            .as_ref()
            .map(|p| p.log_tail(4000))
            .unwrap_or_default()
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

    pub fn kill9(&mut self) {
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
        if self.proc.is_some() && is_mounted(&self.dir) {
            detach(&self.dir);
        }
        // Proc's own drop kills it (and prints its log if the test is failing).
        self.proc = None;
    }
}
