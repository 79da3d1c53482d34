//! Processes the runner starts and watches.
//!
//! - [`Daemon`]: a long-lived child (sheep, sheepfs, bindfs) in its own process group, so a
//!   Ctrl-C on the terminal reaches the runner (which then stops everything in order) and not
//!   the daemons; it also gets SIGTERM if the runner dies. Stopped (SIGTERM, then SIGKILL) on
//!   drop.
//! - [`interrupted`]: SIGINT/SIGTERM set a flag that every wait checks.
//! - [`Usage`]: CPU ticks and peak RSS of watched processes, read from `/proc`.

use std::collections::BTreeMap;
use std::fs::File;
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use testkit::log_tail;

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Makes SIGINT and SIGTERM set the flag [`check_interrupt`] reports, instead of killing the
/// runner before it could stop its daemons.
pub fn install_signal_handlers() {
    let handler: extern "C" fn(libc::c_int) = on_signal;
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { libc::signal(sig, handler as libc::sighandler_t) };
    }
}

/// An error once SIGINT or SIGTERM arrived.
pub fn check_interrupt() -> Result<()> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        bail!("interrupted");
    }
    Ok(())
}

/// Polls `cond` (every 2 ms at first, backing off to 50 ms, so readiness is timed closely)
/// until it holds; an error naming `what` after `timeout`, or at once when interrupted or
/// when `cond` fails.
pub fn wait_for(
    what: &str,
    timeout: Duration,
    mut cond: impl FnMut() -> Result<bool>,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(2);
    loop {
        check_interrupt()?;
        if cond()? {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> Result<u16> {
    let l = TcpListener::bind("127.0.0.1:0").context("binding a loopback port")?;
    Ok(l.local_addr()?.port())
}

/// Whether `name` is an executable in `$PATH`.
pub fn in_path(name: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
        .unwrap_or(false)
}

/// A long-lived child process, stopped on drop.
pub struct Daemon {
    name: String,
    child: Option<Child>,
    log: PathBuf,
}

impl Daemon {
    /// Starts `cmd` with stdout and stderr appended to `log`.
    pub fn spawn(name: &str, mut cmd: Command, log: &Path) -> Result<Daemon> {
        let out = File::options()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("opening {}", log.display()))?;
        let err = out.try_clone()?;
        cmd.stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0);
        // SAFETY: prctl is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
                Ok(())
            });
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {name} ({:?})", cmd.get_program()))?;
        Ok(Daemon {
            name: name.into(),
            child: Some(child),
            log: log.into(),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(Child::id).unwrap_or(0)
    }

    /// An error with the end of its log if the process has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        let status = match self.child.as_mut() {
            Some(c) => c.try_wait()?,
            None => bail!("{} was stopped", self.name),
        };
        match status {
            None => Ok(()),
            Some(s) => bail!(
                "{} exited ({s}); end of {}:\n{}",
                self.name,
                self.log.display(),
                log_tail(&self.log, 2000)
            ),
        }
    }

    /// SIGTERM, then SIGKILL if it has not exited within `grace`.
    pub fn stop(&mut self, grace: Duration) {
        let Some(mut c) = self.child.take() else {
            return;
        };
        // SAFETY: signalling our own, not yet reaped, child.
        unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = c.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!(
            "bench: {} did not stop within {grace:?}: killing it",
            self.name
        );
        let _ = c.kill();
        let _ = c.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        self.stop(Duration::from_secs(30));
    }
}

/// A process whose CPU time and peak RSS a figure accounts for.
#[derive(Debug, Clone)]
pub struct Watched {
    /// Key in the figure's `peak_rss_kib`: "sheepfs", "sheep0", "bindfs", ...
    pub label: String,
    pub pid: u32,
}

/// CPU ticks (utime + stime) of a process, from `/proc/PID/stat`.
fn cpu_ticks(pid: u32) -> Result<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces) start at field 3 (state).
    let rest = stat
        .rsplit_once(')')
        .map(|(_, r)| r)
        .context("malformed /proc/PID/stat")?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let field = |n: usize| -> Result<u64> {
        f.get(n - 3)
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("/proc/{pid}/stat has no field {n}"))
    };
    Ok(field(14)? + field(15)?)
}

/// VmHWM (peak resident set, KiB) of a process.
fn peak_rss_kib(pid: u32) -> Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .with_context(|| format!("/proc/{pid}/status has no VmHWM"))
}

/// Resets a process's VmHWM to its current RSS.
fn reset_peak_rss(pid: u32) -> Result<()> {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5")
        .with_context(|| format!("resetting the peak RSS of pid {pid} (/proc/{pid}/clear_refs)"))
}

fn ticks_per_second() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

/// CPU and memory of watched processes over one measured job.
pub struct Usage {
    procs: Vec<Watched>,
    ticks: Vec<u64>,
}

/// What [`Usage::end`] found.
pub struct UsageReport {
    pub cpu_s: f64,
    pub peak_rss_kib: BTreeMap<String, u64>,
}

impl Usage {
    /// Resets the peaks and notes the CPU ticks. Returns, per pid, the peak RSS reached before
    /// the reset (so the runner can track a process's peak over the whole run).
    pub fn begin(procs: &[Watched]) -> Result<(Usage, Vec<(u32, u64)>)> {
        let mut before = Vec::new();
        let mut ticks = Vec::new();
        for p in procs {
            let gone = || format!("{} (pid {}) is not running any more", p.label, p.pid);
            before.push((p.pid, peak_rss_kib(p.pid).with_context(gone)?));
            reset_peak_rss(p.pid)?;
            ticks.push(cpu_ticks(p.pid)?);
        }
        let u = Usage {
            procs: procs.to_vec(),
            ticks,
        };
        Ok((u, before))
    }

    /// CPU seconds used since [`Usage::begin`] and each process's peak RSS.
    pub fn end(&self) -> Result<UsageReport> {
        let mut used = 0;
        let mut peaks = BTreeMap::new();
        for (p, t0) in self.procs.iter().zip(&self.ticks) {
            used += cpu_ticks(p.pid)?.saturating_sub(*t0);
            peaks.insert(p.label.clone(), peak_rss_kib(p.pid)?);
        }
        Ok(UsageReport {
            cpu_s: used as f64 / ticks_per_second(),
            peak_rss_kib: peaks,
        })
    }
}

/// Peak RSS of one process now (for the whole-run peak figures).
pub fn peak_rss_now(pid: u32) -> Result<u64> {
    peak_rss_kib(pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_own_usage() {
        let me = Watched {
            label: "me".into(),
            pid: std::process::id(),
        };
        assert!(cpu_ticks(me.pid).is_ok());
        let (u, before) = Usage::begin(&[me]).unwrap();
        assert!(before[0].1 > 0);
        let mut x = 0u64;
        for i in 0..5_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        assert!(x != 1);
        let r = u.end().unwrap();
        assert!(r.cpu_s >= 0.0);
        assert!(r.peak_rss_kib["me"] > 0);
        assert!(cpu_ticks(u32::MAX).is_err());
    }

    #[test]
    fn wait_for_times_out_with_its_reason() {
        let e = wait_for("nothing", Duration::from_millis(10), || Ok(false)).unwrap_err();
        assert!(e.to_string().contains("waiting for nothing"));
        assert!(wait_for("x", Duration::from_secs(1), || bail!("boom")).is_err());
    }
}
