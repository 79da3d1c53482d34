//! The runner's side of the processes it starts (which testkit starts and stops: every
//! daemon in its own process group, tied to the runner by a parent-death signal, stopped in
//! order on drop).
//!
//! - [`check_interrupt`]: SIGINT/SIGTERM set a flag that every wait checks
//!   (`testkit::install_interrupt_handlers`).
//! - [`Usage`]: CPU ticks and peak RSS of watched processes, read from `/proc`.

use std::collections::BTreeMap;

use anyhow::{Context, Result};
pub use testkit::check_interrupt;

/// Whether `name` is an executable in `$PATH`.
pub fn in_path(name: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
        .unwrap_or(false)
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
}
