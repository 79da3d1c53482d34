//! fio jobs: their command line (always `--direct=1 --output-format=json`) and the parsing of
//! fio's JSON into what a figure needs.

use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};
use serde_json::Value;

use super::proc::check_interrupt;
use super::settings::size_label;

/// fio's I/O engine, with its queue depth or job count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    /// `--ioengine=sync --numjobs=1`.
    Sync,
    /// `--ioengine=psync --numjobs=N`.
    Psync(u32),
    /// `--ioengine=libaio --iodepth=N`.
    Libaio(u32),
}

impl Engine {
    fn name(self) -> &'static str {
        match self {
            Engine::Sync => "sync",
            Engine::Psync(_) => "psync",
            Engine::Libaio(_) => "libaio",
        }
    }

    fn iodepth(self) -> u32 {
        match self {
            Engine::Libaio(d) => d,
            _ => 1,
        }
    }

    fn numjobs(self) -> u32 {
        match self {
            Engine::Psync(n) => n,
            _ => 1,
        }
    }

    /// The engine part of a job name: `sync`, `psync-nj4`, `libaio-qd16`.
    pub fn label(self) -> String {
        match self {
            Engine::Sync => "sync".into(),
            Engine::Psync(n) => format!("psync-nj{n}"),
            Engine::Libaio(d) => format!("libaio-qd{d}"),
        }
    }
}

/// One fio workload; the file and its size come from where it runs.
#[derive(Debug, Clone, PartialEq)]
pub struct FioJob {
    /// fio's `--rw`: `randread`, `randrw`, `read`, `write`, `randwrite`.
    pub rw: &'static str,
    pub bs: u64,
    pub engine: Engine,
    /// Percentage of reads for `randrw`.
    pub rwmixread: Option<u32>,
    /// Run for the run's `--runtime` (looping over the file); otherwise one pass of the file.
    pub time_based: bool,
    /// fsync the file at the end, inside the measured time (`--end_fsync=1`).
    pub end_fsync: bool,
    /// Times the job is measured in a round, each after its own preparation, each a run of
    /// the figure: a short job (one pass of a cold file takes half a second) measured once
    /// is mostly this machine's noise.
    pub passes: usize,
}

impl FioJob {
    /// A time-based job.
    pub fn timed(rw: &'static str, bs: u64, engine: Engine) -> FioJob {
        FioJob {
            rw,
            bs,
            engine,
            rwmixread: None,
            time_based: true,
            end_fsync: false,
            passes: 1,
        }
    }

    /// Whether the job reads (and so wants its target warmed first).
    pub fn reads(&self) -> bool {
        self.rw.contains("read") || self.rw == "randrw"
    }

    /// Whether the job writes (and so leaves data for the kernel or the cache to write back).
    pub fn writes(&self) -> bool {
        self.rw.contains("write") || self.rw.ends_with("rw")
    }

    /// Figure parameters: rw, bs, iodepth, numjobs, engine.
    pub fn params(&self) -> Vec<(&'static str, Value)> {
        let mut p = vec![
            ("rw", Value::from(self.rw)),
            ("bs", Value::from(self.bs)),
            ("iodepth", Value::from(self.engine.iodepth())),
            ("numjobs", Value::from(self.engine.numjobs())),
            ("engine", Value::from(self.engine.name())),
        ];
        if let Some(m) = self.rwmixread {
            p.push(("rwmixread", Value::from(m)));
        }
        if self.end_fsync {
            p.push(("end_fsync", Value::from(true)));
        }
        if self.passes > 1 {
            p.push(("passes", Value::from(self.passes)));
        }
        p
    }

    /// fio's arguments for this job on `file` of `size` bytes.
    pub fn args(&self, file: &Path, size: u64, runtime_s: u64) -> Vec<String> {
        let mut a = vec![
            format!("--name=bench-{}-{}", self.rw, size_label(self.bs)),
            format!("--filename={}", file.display()),
            format!("--size={size}"),
            format!("--rw={}", self.rw),
            format!("--bs={}", self.bs),
            format!("--ioengine={}", self.engine.name()),
            format!("--iodepth={}", self.engine.iodepth()),
            format!("--numjobs={}", self.engine.numjobs()),
            "--direct=1".into(),
            "--group_reporting".into(),
            "--output-format=json".into(),
        ];
        if let Some(m) = self.rwmixread {
            a.push(format!("--rwmixread={m}"));
        }
        if self.end_fsync {
            a.push("--end_fsync=1".into());
        }
        if self.time_based {
            a.push(format!("--runtime={runtime_s}"));
            a.push("--time_based".into());
        }
        a
    }

    /// Runs fio and parses its report.
    pub fn run(&self, file: &Path, size: u64, runtime_s: u64) -> Result<FioResult> {
        let args = self.args(file, size, runtime_s);
        let out = Command::new("fio")
            .args(&args)
            .output()
            .context("starting fio (is it installed? scripts/install-deps.sh)")?;
        check_interrupt()?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let why = if stderr.trim().is_empty() {
                &stdout
            } else {
                &stderr
            };
            let why: String = why.trim().chars().take(2000).collect();
            bail!("fio {} failed ({}): {why}", args.join(" "), out.status);
        }
        FioResult::parse(&stdout).with_context(|| format!("fio {}", args.join(" ")))
    }
}

/// What a fio run did, reads and writes together.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FioResult {
    pub iops: f64,
    pub mib_s: f64,
    pub io_bytes: u64,
}

impl FioResult {
    /// Parses `--output-format=json` output (fio may print notes before the JSON).
    pub fn parse(text: &str) -> Result<FioResult> {
        let start = text.find('{').context("fio printed no JSON report")?;
        let v: Value =
            serde_json::from_str(&text[start..]).context("fio's JSON report does not parse")?;
        let jobs = v["jobs"]
            .as_array()
            .filter(|j| !j.is_empty())
            .context("fio's JSON report has no jobs")?;
        let mut r = FioResult {
            iops: 0.0,
            mib_s: 0.0,
            io_bytes: 0,
        };
        for job in jobs {
            let error = job["error"].as_i64().unwrap_or(0);
            if error != 0 {
                bail!("fio job failed with error {error} ({})", errno_text(error));
            }
            for side in ["read", "write"] {
                let s = &job[side];
                r.iops += s["iops"].as_f64().unwrap_or(0.0);
                r.mib_s += s["bw_bytes"].as_f64().unwrap_or(0.0) / (1 << 20) as f64;
                r.io_bytes += s["io_bytes"].as_u64().unwrap_or(0);
            }
        }
        if r.io_bytes == 0 {
            bail!("fio moved no data");
        }
        Ok(r)
    }
}

fn errno_text(errno: i64) -> String {
    std::io::Error::from_raw_os_error(errno as i32).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const REPORT: &str = r#"note: both iodepth >= 1 and synchronous I/O engine are selected
{
  "fio version" : "fio-3.33",
  "jobs" : [
    { "jobname" : "t", "error" : 0,
      "read" : { "io_bytes" : 4194304, "bw_bytes" : 2097152, "iops" : 512.5 },
      "write" : { "io_bytes" : 1048576, "bw_bytes" : 524288, "iops" : 128.0 } }
  ]
}"#;

    #[test]
    fn parses_reads_and_writes_together() {
        let r = FioResult::parse(REPORT).unwrap();
        assert_eq!(r.io_bytes, 5 << 20);
        assert_eq!(r.iops, 640.5);
        assert_eq!(r.mib_s, 2.5);
    }

    #[test]
    fn which_jobs_read_and_write() {
        let job = |rw| FioJob::timed(rw, 4096, Engine::Libaio(1));
        for (rw, reads, writes) in [
            ("randread", true, false),
            ("read", true, false),
            ("randwrite", false, true),
            ("write", false, true),
            ("randrw", true, true),
        ] {
            assert_eq!((job(rw).reads(), job(rw).writes()), (reads, writes), "{rw}");
        }
    }

    #[test]
    fn bad_reports_are_errors() {
        assert!(FioResult::parse("").is_err());
        assert!(FioResult::parse("{\"jobs\": []}").is_err());
        assert!(FioResult::parse("{\"jobs\": [").is_err());
        let failed = r#"{"jobs": [{"error": 5, "read": {"io_bytes": 1}}]}"#;
        assert!(FioResult::parse(failed)
            .unwrap_err()
            .to_string()
            .contains("error 5"));
        let idle = r#"{"jobs": [{"error": 0, "read": {"io_bytes": 0}}]}"#;
        assert!(FioResult::parse(idle).is_err());
    }

    #[test]
    fn args_of_a_psync_mix() {
        let mut j = FioJob::timed("randrw", 4096, Engine::Psync(4));
        j.rwmixread = Some(80);
        let a = j.args(Path::new("/m/f"), 1 << 30, 10).join(" ");
        for want in [
            "--filename=/m/f",
            "--size=1073741824",
            "--ioengine=psync",
            "--numjobs=4",
            "--rwmixread=80",
            "--runtime=10 --time_based",
            "--direct=1",
        ] {
            assert!(a.contains(want), "{a} lacks {want}");
        }
        assert_eq!(Engine::Libaio(16).label(), "libaio-qd16");
        assert!(j.reads());
        assert!(!FioJob::timed("write", 4096, Engine::Sync).reads());
    }
}
