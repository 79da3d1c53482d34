//! Harness for end-to-end tests: spawns real binaries, polls for readiness (never a fixed
//! sleep), and always kills what it started, pass or fail.
//!
//! - [`Proc`]: a child process killed (SIGKILL) and reaped on drop; its stderr goes to a log
//!   file whose tail is printed if the test is panicking.
//! - [`wait_until`]: polls a condition with a deadline.
//! - [`free_port`]: a loopback port nobody listens on.
//! - [`cluster::Cluster`]: a local cluster of real `sheep` processes driven through real `dog`.
//! - [`mount::Mount`]: a real `sheepfs` mount, unmounted and killed on drop.
//! - [`replicas::check`]: every copy of every object of a VDI read from disk and compared.

pub mod build;
pub mod cluster;
pub mod mount;
pub mod replicas;

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running child process, killed on drop.
pub struct Proc {
    name: String,
    child: Option<Child>,
    log: PathBuf,
}

impl Proc {
    /// Starts `cmd` with stdout and stderr appended to `log`.
    pub fn spawn(name: &str, mut cmd: Command, log: &Path) -> Proc {
        let out = File::options()
            .create(true)
            .append(true)
            .open(log)
            .unwrap_or_else(|e| panic!("open log {}: {e}", log.display()));
        let err = out.try_clone().expect("clone log handle");
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("start {name}: {e}"));
        Proc {
            name: name.to_string(),
            child: Some(child),
            log: log.to_path_buf(),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    pub fn log(&self) -> &Path {
        &self.log
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// SIGKILL and reap.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, then wait up to `grace` for it to exit (SIGKILL after that). Returns whether it
    /// exited on its own.
    pub fn terminate(&mut self, grace: Duration) -> bool {
        let Some(mut c) = self.child.take() else {
            return true;
        };
        // SAFETY: sending a signal to our own child.
        unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = c.try_wait() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = c.kill();
        let _ = c.wait();
        false
    }

    /// The last `bytes` of the log.
    pub fn log_tail(&self, bytes: u64) -> String {
        log_tail(&self.log, bytes)
    }
}

/// The last `bytes` of a file, lossily decoded.
pub fn log_tail(path: &Path, bytes: u64) -> String {
    let Ok(mut f) = File::open(path) else {
        return String::new();
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(bytes)));
    let mut buf = Vec::new();
    let _ = f.read_to_end(&mut buf);
    String::from_utf8_lossy(&buf).into_owned()
}

/// The first panic message in a log (the line and the two after it), if any: a backtrace
/// after it can push it out of the tail.
pub fn first_panic(path: &Path) -> Option<String> {
    let text = std::fs::read(path).ok()?;
    let text = String::from_utf8_lossy(&text);
    let mut lines = text.lines().skip_while(|l| !l.contains("panicked at"));
    let first = lines.next()?;
    Some(
        std::iter::once(first)
            .chain(lines.take(2))
            .collect::<Vec<_>>()
            .join("\n"),
    )
}

impl Drop for Proc {
    fn drop(&mut self) {
        if std::thread::panicking() {
            if let Some(p) = first_panic(&self.log) {
                eprintln!("---- {} (pid {}) panicked ----\n{p}", self.name, self.pid());
            }
            eprintln!(
                "---- {} (pid {}) log tail ----\n{}",
                self.name,
                self.pid(),
                self.log_tail(3000)
            );
        }
        self.kill9();
    }
}

/// Polls `cond` every 50 ms until it holds; panics naming `what` after `timeout`.
pub fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return;
        }
        if Instant::now() >= deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind an ephemeral port")
}

/// Deterministic pseudo-random bytes (xorshift), so a failing test can be replayed.
pub fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}
