//! Child processes that never outlive what started them.
//!
//! Every [`Proc`] runs in its own process group (so a Ctrl-C on the terminal reaches only
//! the harness, which then stops things in order) with a parent-death signal
//! (`PR_SET_PDEATHSIG`, SIGKILL unless told otherwise): a test runner killed with SIGKILL
//! leaves no `sheep` or `sheepfs` behind. The kernel sends that signal when the *thread* that
//! spawned the child exits, so start a process on the thread that owns it (a test's own
//! thread, or the runner's main thread).
//!
//! On drop a process is stopped as its [`ProcOptions`] say; dropped while the thread panics,
//! it is killed with its whole group at once and the end of its log is printed.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::{or_panic, Error, Result};
use crate::{first_panic, log_tail};

/// How a [`Proc`] is tied to its parent and stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcOptions {
    /// The signal the child gets when the thread that spawned it dies.
    pub death_signal: libc::c_int,
    /// Drop without a panic: `None` kills the group at once (SIGKILL); `Some(grace)` sends
    /// SIGTERM and waits up to `grace` for the process to exit before killing the group.
    pub stop_grace: Option<Duration>,
}

impl Default for ProcOptions {
    /// Killed at once, by its parent's drop or death.
    fn default() -> ProcOptions {
        ProcOptions {
            death_signal: libc::SIGKILL,
            stop_grace: None,
        }
    }
}

/// A running child process, stopped on drop.
pub struct Proc {
    name: String,
    child: Option<Child>,
    log: PathBuf,
    opts: ProcOptions,
}

impl Proc {
    /// Starts `cmd` with stdout and stderr appended to `log`, killed on drop.
    pub fn try_spawn(name: &str, cmd: Command, log: &Path) -> Result<Proc> {
        Proc::try_spawn_with(name, cmd, log, ProcOptions::default())
    }

    /// Like [`Proc::try_spawn`]; panics if the process cannot start.
    #[track_caller]
    pub fn spawn(name: &str, cmd: Command, log: &Path) -> Proc {
        or_panic(Proc::try_spawn(name, cmd, log))
    }

    /// Starts `cmd` with stdout and stderr appended to `log`, tied to this thread and stopped
    /// as `opts` says.
    pub fn try_spawn_with(
        name: &str,
        mut cmd: Command,
        log: &Path,
        opts: ProcOptions,
    ) -> Result<Proc> {
        let out = File::options()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|e| Error::io(format!("opening the log {}", log.display()), e))?;
        let err = out
            .try_clone()
            .map_err(|e| Error::io(format!("duplicating the handle of {}", log.display()), e))?;
        cmd.stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0);
        die_with_parent(&mut cmd, opts.death_signal);
        let child = cmd.spawn().map_err(|e| {
            Error::io(
                format!("starting {name} ({})", cmd.get_program().to_string_lossy()),
                e,
            )
        })?;
        Ok(Proc {
            name: name.to_string(),
            child: Some(child),
            log: log.to_path_buf(),
            opts,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn options(&self) -> ProcOptions {
        self.opts
    }

    /// Its pid, or 0 once stopped.
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

    /// [`Error::Exited`] with the end of its log if the process has exited (or was stopped).
    pub fn check_alive(&mut self) -> Result<()> {
        let Some(c) = self.child.as_mut() else {
            return Err(Error::Unexpected {
                what: self.name.clone(),
                detail: "was stopped".into(),
            });
        };
        match c.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(Error::Exited {
                name: self.name.clone(),
                status,
                log: self.log.clone(),
                tail: log_tail(&self.log, 2000),
            }),
            Err(e) => Err(Error::io(format!("waiting for {}", self.name), e)),
        }
    }

    /// SIGKILL to its process group, and reap it.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            kill_group(&c);
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, then wait up to `grace` for it to exit (SIGKILL to its group after that).
    /// Returns whether it exited on its own.
    pub fn terminate(&mut self, grace: Duration) -> bool {
        let Some(mut c) = self.child.take() else {
            return true;
        };
        // SAFETY: signalling our own child, not yet reaped.
        unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = c.try_wait() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        kill_group(&c);
        let _ = c.kill();
        let _ = c.wait();
        false
    }

    /// Sends `sig` to the process (not its group).
    pub fn signal(&self, sig: libc::c_int) {
        if let Some(c) = self.child.as_ref() {
            // SAFETY: signalling our own child, not yet reaped.
            unsafe { libc::kill(c.id() as libc::pid_t, sig) };
        }
    }

    /// Waits up to `timeout` for the process to exit on its own, and reaps it; None if it is
    /// still running then (or was stopped already).
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            let c = self.child.as_mut()?;
            if let Ok(Some(status)) = c.try_wait() {
                self.child = None;
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The last `bytes` of the log.
    pub fn log_tail(&self, bytes: u64) -> String {
        log_tail(&self.log, bytes)
    }
}

/// How much of a process's log a failed test prints (its warnings before that too).
const TAIL_BYTES: u64 = 3000;

/// SIGKILL to the group `c` leads (its own: see [`Proc::try_spawn_with`]). Called before `c`
/// is reaped, so the group id cannot belong to anyone else yet.
fn kill_group(c: &Child) {
    // SAFETY: a negative pid names the process group; ours, as the child is not reaped.
    unsafe { libc::kill(-(c.id() as libc::pid_t), libc::SIGKILL) };
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.child.is_none() {
            return;
        }
        if std::thread::panicking() {
            if let Some(p) = first_panic(&self.log) {
                eprintln!("---- {} (pid {}) panicked ----\n{p}", self.name, self.pid());
            }
            if let Some(w) = crate::earlier_warnings(&self.log, TAIL_BYTES, 40) {
                eprintln!(
                    "---- {} (pid {}) earlier warnings ----\n{w}",
                    self.name,
                    self.pid()
                );
            }
            eprintln!(
                "---- {} (pid {}) log tail ----\n{}",
                self.name,
                self.pid(),
                self.log_tail(TAIL_BYTES)
            );
            self.kill9();
            return;
        }
        match self.opts.stop_grace {
            None => self.kill9(),
            Some(grace) => {
                if !self.terminate(grace) {
                    eprintln!("{} did not stop within {grace:?}: killed", self.name);
                }
            }
        }
    }
}

/// Makes the child `cmd` starts receive `signal` when the thread that starts it exits (the
/// test runner killed, or the test's thread gone), so no tool outlives its test.
pub fn die_with_parent(cmd: &mut Command, signal: libc::c_int) {
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: between fork and exec this only makes async-signal-safe calls (prctl,
    // getppid) and builds an error without allocating.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, signal as libc::c_ulong) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The parent died before the prctl: nobody would send the signal.
            if libc::getppid() != parent {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// Runs `cmd` to completion (stdin /dev/null and stdout captured unless `cmd` redirects
/// them); its stdout, or [`Error::Failed`] naming `what` with its stderr.
pub fn output(mut cmd: Command, what: &str) -> Result<Vec<u8>> {
    let out = cmd
        .output()
        .map_err(|e| Error::io(format!("starting {what}"), e))?;
    crate::wait::check_interrupt()?;
    if !out.status.success() {
        return Err(Error::Failed {
            what: what.into(),
            status: out.status,
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(out.stdout)
}

/// Runs `cmd` with `data` on its stdin (fed from a thread, so a command that writes before it
/// reads cannot deadlock) and returns what it printed and how it exited.
pub fn output_with_stdin(mut cmd: Command, data: &[u8]) -> std::process::Output {
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the command");
    let mut stdin = child.stdin.take().expect("piped stdin");
    let data = data.to_vec();
    let feeder = std::thread::spawn(move || {
        use std::io::Write;
        let _ = stdin.write_all(&data);
    });
    let out = child.wait_with_output().expect("the command's output");
    feeder.join().expect("the stdin feeder");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether a process with this pid exists (a zombie counts until reaped).
    fn exists(pid: libc::pid_t) -> bool {
        // SAFETY: signal 0 only checks.
        unsafe { libc::kill(pid, 0) == 0 }
    }

    #[test]
    fn runs_in_its_own_group_and_takes_its_group_down() {
        let d = tempfile::tempdir().unwrap();
        let log = d.path().join("sh.log");
        let pidfile = d.path().join("grandchild");
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg(format!("sleep 600 & echo $! > {}; wait", pidfile.display()));
        let mut p = Proc::try_spawn("sh", cmd, &log).unwrap();
        let pid = p.pid() as libc::pid_t;
        // SAFETY: getpgid has no preconditions.
        assert_eq!(unsafe { libc::getpgid(pid) }, pid);
        let mut grandchild = 0;
        crate::try_wait_until("the grandchild's pid", Duration::from_secs(10), || {
            grandchild = std::fs::read_to_string(&pidfile)
                .ok()
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(0);
            Ok(grandchild > 0)
        })
        .unwrap();
        p.check_alive().unwrap();
        p.kill9();
        // The grandchild was killed with the group; init reaps it.
        crate::try_wait_until("the grandchild to go", Duration::from_secs(10), || {
            Ok(!exists(grandchild))
        })
        .unwrap();
        assert!(p.check_alive().is_err());
    }

    #[test]
    fn dies_with_the_thread_that_started_it() {
        let d = tempfile::tempdir().unwrap();
        let log = d.path().join("orphan.log");
        let pid = std::thread::spawn(move || {
            let mut cmd = Command::new("sleep");
            cmd.arg("600");
            let p = Proc::try_spawn("orphan", cmd, &log).unwrap();
            let pid = p.pid();
            // Never stopped by us: only the parent-death signal can end it.
            std::mem::forget(p);
            pid
        })
        .join()
        .unwrap();
        // Killed, it stays a zombie until reaped: the state in /proc/PID/stat says which.
        let state = || {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| s.rsplit_once(')').map(|(_, r)| r.trim().chars().next()))
                .flatten()
        };
        crate::try_wait_until("the orphan to die", Duration::from_secs(10), || {
            Ok(matches!(state(), Some('Z') | None))
        })
        .unwrap();
        // SAFETY: reaping our own zombie child.
        unsafe { libc::waitpid(pid as libc::pid_t, std::ptr::null_mut(), 0) };
    }

    #[test]
    fn an_exit_is_reported_with_the_log() {
        let d = tempfile::tempdir().unwrap();
        let log = d.path().join("x.log");
        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg("echo going away; exit 3");
        let mut p = Proc::try_spawn("x", cmd, &log).unwrap();
        crate::try_wait_until("x to exit", Duration::from_secs(10), || Ok(!p.running())).unwrap();
        let e = p.check_alive().unwrap_err();
        assert!(e.to_string().contains("going away"), "{e}");
        let e = Proc::try_spawn("y", Command::new("/nonexistent/y"), &log)
            .err()
            .unwrap();
        assert!(e.chain().contains("starting y"), "{}", e.chain());
    }

    #[test]
    fn graceful_stop_sends_sigterm_first() {
        let d = tempfile::tempdir().unwrap();
        let log = d.path().join("t.log");
        let mut cmd = Command::new("sh");
        cmd.arg("-c")
            .arg("trap 'echo got term; exit 0' TERM; echo ready; while :; do sleep 0.05; done");
        let opts = ProcOptions {
            death_signal: libc::SIGTERM,
            stop_grace: Some(Duration::from_secs(10)),
        };
        let p = Proc::try_spawn_with("t", cmd, &log, opts).unwrap();
        crate::try_wait_until("t to start", Duration::from_secs(10), || {
            Ok(log_tail(&log, 100).contains("ready"))
        })
        .unwrap();
        drop(p);
        assert!(log_tail(&log, 100).contains("got term"));
    }

    #[test]
    fn output_names_a_failing_command() {
        let mut cmd = Command::new("sh");
        cmd.arg("-c").arg("echo nope >&2; exit 1");
        let e = output(cmd, "sh nope").unwrap_err();
        assert!(e.to_string().starts_with("sh nope failed"), "{e}");
        assert!(e.to_string().ends_with("nope"), "{e}");
    }
}
