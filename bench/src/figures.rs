//! The JSON file of every figure a run produced (`target/bench/<name>.json`), shared by the
//! runner, the report, the charts and `bench compare`.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};

pub const REPORT_VERSION: u32 = 1;

/// One run of the harness.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    pub version: u32,
    /// UTC, `YYYY-MM-DDTHH:MM:SSZ`.
    pub started: String,
    pub finished: String,
    /// The exact command line that produced this report.
    pub command: String,
    pub machine: Machine,
    pub config: Config,
    pub figures: Vec<Figure>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Machine {
    pub cpus: usize,
    pub mem_gib: f64,
    pub cpu_model: String,
    pub kernel: String,
    /// Filesystem type of the disk the scratch directory is on (e.g. "ext4").
    pub fs: String,
    pub fio_version: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Config {
    pub nodes: usize,
    pub copies: usize,
    pub object_size: u64,
    /// Size of the file/VDI the fio jobs run on.
    pub file_mib: u64,
    /// Seconds per timed fio job.
    pub runtime_s: u64,
    /// Runs of each key figure (the others run once).
    pub rounds: usize,
    /// "full", "quick" or "smoke".
    pub profile: String,
    /// The membership driver: "local" or "etcd" (reports before it: local).
    #[serde(default = "local")]
    pub membership: String,
}

fn local() -> String {
    "local".into()
}

/// One measured figure.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Figure {
    /// Unique and stable across runs: `compare` matches figures by it.
    /// Shape: `<group>/<job>/<target>`, e.g. `iops/randread-4k-libaio-qd16/warm`.
    pub id: String,
    /// "iops", "throughput", "objsize", "sweep", "cache", "flush", "scaling", "metadata", "dog".
    pub group: String,
    /// The workload, e.g. "randread-4k-libaio-qd16", "read-64k", "mix-4k-psync-nj4".
    pub job: String,
    /// What it ran against: "raw", "bindfs", "off" (sheepfs, no cache), "cold", "warm",
    /// "writeback", "cp", "dog", ...
    pub target: String,
    /// "IOPS", "MiB/s", "s", "ms", "%", "MiB".
    pub unit: String,
    /// Median of `runs`.
    pub value: f64,
    /// Every run, in order (at least one).
    pub runs: Vec<f64>,
    pub higher_is_better: bool,
    /// `id` of the figure this one is divided by (usually the bindfs one of the same job).
    pub reference: Option<String>,
    /// `value / reference.value`.
    pub ratio: Option<f64>,
    /// Workload parameters: rw, bs (bytes), iodepth, numjobs, engine ("libaio"/"psync"),
    /// hit_pct, nodes, copies, object_size (bytes), ...
    pub params: BTreeMap<String, serde_json::Value>,
    /// CPU seconds (user + system) of sheepfs and every sheep during the job, per GiB moved.
    pub cpu_s_per_gib: Option<f64>,
    /// Peak RSS (KiB) during the job per process: "sheepfs", "sheep0", "sheep1", ...
    pub peak_rss_kib: BTreeMap<String, u64>,
    /// The issue target this figure is checked against, e.g. "≥ 0.9× bindfs".
    pub goal: Option<String>,
    /// Whether the goal was met (None without a goal).
    pub goal_met: Option<bool>,
    /// The ratio the goal checks (e.g. ÷ cache off for cold figures, where `ratio` is ÷
    /// bindfs); None for a fixed bound.
    #[serde(default)]
    pub goal_ratio: Option<f64>,
}

impl Figure {
    /// A figure with one or more runs; value is their median.
    pub fn new(group: &str, job: &str, target: &str, unit: &str, runs: Vec<f64>) -> Figure {
        Figure {
            id: format!("{group}/{job}/{target}"),
            group: group.into(),
            job: job.into(),
            target: target.into(),
            unit: unit.into(),
            value: median(&runs),
            runs,
            higher_is_better: !matches!(unit, "s" | "ms"),
            reference: None,
            ratio: None,
            params: BTreeMap::new(),
            cpu_s_per_gib: None,
            peak_rss_kib: BTreeMap::new(),
            goal: None,
            goal_met: None,
            goal_ratio: None,
        }
    }

    /// (min, max) of the runs.
    pub fn spread(&self) -> (f64, f64) {
        self.runs
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &v| {
                (lo.min(v), hi.max(v))
            })
    }
}

/// Median (mean of the middle two for an even count); NaN for none.
pub fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

impl Report {
    pub fn load(path: &Path) -> Result<Report> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let r: Report = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a bench report", path.display()))?;
        anyhow::ensure!(
            r.version == REPORT_VERSION,
            "{}: report version {} (this bench reads {})",
            path.display(),
            r.version,
            REPORT_VERSION
        );
        Ok(r)
    }

    pub fn save(&self, path: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self)?;
        std::fs::write(path, text + "\n").with_context(|| format!("writing {}", path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_odd_even_empty() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert!(median(&[]).is_nan());
    }

    #[test]
    fn figure_id_and_spread() {
        let f = Figure::new(
            "iops",
            "randread-4k-libaio-qd1",
            "warm",
            "IOPS",
            vec![3.0, 1.0, 2.0],
        );
        assert_eq!(f.id, "iops/randread-4k-libaio-qd1/warm");
        assert_eq!(f.value, 2.0);
        assert_eq!(f.spread(), (1.0, 3.0));
        assert!(f.higher_is_better);
        assert!(!Figure::new("metadata", "create", "dog", "s", vec![1.0]).higher_is_better);
    }
}
