//! The whole harness end to end at the smoke profile: `bench run` starts real clusters and
//! mounts from the binaries beside this test (`cargo build --workspace --bins` first), then
//! `bench report` draws the charts (with `--features charts`; without, as in `make test`, it
//! checks that `--charts` says how to get them and that the tables come without). Checks the
//! shape of what comes out, never a figure's value.
//!
//! Needs root (or FUSE for the user), fio and bindfs, as `make test` provides.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use serde_json::Value;

/// `target/<profile>`, where `cargo build --bins` put sheep, dog, sheepfs and cachectl.
fn bin_dir() -> PathBuf {
    let bins = testkit::cluster::Bins::fresh();
    bins.sheep.parent().expect("binary directory").to_path_buf()
}

/// A `bench` process, stopped (SIGTERM: it then cleans up after itself) if the test fails.
/// Its output goes to a log, shown if it fails.
struct Bench(Option<Child>, PathBuf);

impl Bench {
    fn start(log: &Path, args: &[&str]) -> Bench {
        let out = File::create(log).expect("create the bench log");
        let child = Command::new(env!("CARGO_BIN_EXE_bench"))
            .args(args)
            .stdout(out.try_clone().expect("log handle"))
            .stderr(out)
            .spawn()
            .expect("start bench");
        Bench(Some(child), log.into())
    }

    /// Waits for a successful exit within `limit`.
    fn finish(mut self, what: &str, limit: Duration) {
        let mut child = self.0.take().expect("running");
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = child.try_wait().expect("wait for bench") {
                let log = std::fs::read_to_string(&self.1).unwrap_or_default();
                assert!(status.success(), "bench {what} failed: {status}\n{log}");
                return;
            }
            if Instant::now() > deadline {
                self.0 = Some(child);
                let log = std::fs::read_to_string(&self.1).unwrap_or_default();
                panic!("bench {what} did not finish within {limit:?}\n{log}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Bench {
    fn drop(&mut self) {
        let Some(mut child) = self.0.take() else {
            return;
        };
        // SAFETY: signalling our own child, not yet reaped.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(120);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

fn files_with(dir: &Path, ext: &str) -> usize {
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.path().extension().is_some_and(|x| x == ext))
                .count()
        })
        .unwrap_or(0)
}

/// The report's structure: every group has figures, every figure has runs and a finite value.
fn check_report(report: &Value) {
    assert_eq!(report["version"], 1);
    assert_eq!(report["config"]["profile"], "smoke");
    let figures = report["figures"].as_array().expect("figures");
    for group in [
        "iops",
        "sweep",
        "throughput",
        "cache",
        "flush",
        "dog",
        "objsize",
        "scaling",
        "metadata",
        "handover",
        "raid",
    ] {
        assert!(
            figures.iter().any(|f| f["group"] == group),
            "no figure in group {group}"
        );
    }
    for f in figures {
        let id = f["id"].as_str().expect("id");
        let runs = f["runs"].as_array().expect("runs");
        assert!(!runs.is_empty(), "{id}: no runs");
        assert!(
            runs.iter().all(|r| r.as_f64().is_some_and(f64::is_finite)),
            "{id}: {runs:?}"
        );
        assert!(
            f["value"].as_f64().is_some_and(f64::is_finite),
            "{id}: value"
        );
        let parts: Vec<&str> = id.split('/').collect();
        assert_eq!(
            parts,
            [&f["group"], &f["job"], &f["target"]].map(|v| v.as_str().unwrap())
        );
    }
}

#[test]
fn smoke_profile_runs_every_group_and_reports() {
    let bins = bin_dir();
    let tmp = tempfile::tempdir().expect("temp dir");
    let json = tmp.path().join("smoke.json");
    let charts = tmp.path().join("charts");
    let md = tmp.path().join("smoke.md");
    let p = |p: &Path| p.to_str().expect("utf-8 path").to_string();
    Bench::start(
        &tmp.path().join("run.log"),
        &[
            "run",
            "--profile",
            "smoke",
            "--bin-dir",
            &p(&bins),
            "--out",
            &p(&json),
            "--work-dir",
            &p(tmp.path()),
        ],
    )
    .finish("run", Duration::from_secs(300));
    let text = std::fs::read_to_string(&json).expect("bench run wrote its JSON");
    let report: Value = serde_json::from_str(&text).expect("the report is JSON");
    check_report(&report);
    let leftovers: Vec<_> = std::fs::read_dir(tmp.path())
        .expect("temp dir")
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("bench-run-"))
        .collect();
    assert!(leftovers.is_empty(), "bench run left its scratch directory");

    let args = [
        "report",
        &p(&json),
        "--markdown",
        &p(&md),
        "--charts",
        &p(&charts),
    ];
    if !cfg!(feature = "charts") {
        // make test builds bench without plotters: --charts says how to get them, and the
        // tables come without.
        let out = Command::new(env!("CARGO_BIN_EXE_bench"))
            .args(args)
            .output()
            .expect("run bench report");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("--features charts"),
            "{err}"
        );
        assert!(!md.exists(), "bench report wrote markdown before failing");
        Bench::start(&tmp.path().join("report.log"), &args[..4])
            .finish("report", Duration::from_secs(120));
        assert!(md.is_file(), "no markdown written");
        return;
    }
    Bench::start(&tmp.path().join("report.log"), &args).finish("report", Duration::from_secs(120));
    assert!(md.is_file(), "no markdown written");
    assert!(
        files_with(&charts, "svg") > 0,
        "no SVG chart in {}",
        charts.display()
    );
    assert!(
        files_with(&charts, "png") > 0,
        "no PNG chart in {}",
        charts.display()
    );
}
