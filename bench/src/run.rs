//! `bench run`: starts real clusters and mounts, measures every figure of the selected groups
//! with fio and timed commands, and writes them as one JSON report ([`crate::figures`]).
//!
//! ```text
//!   settings (profile + flags) ─► plan ─► main cluster (plan.rs, main_rig.rs)
//!                                      ─► objsize / scaling clusters (stages.rs)
//!                                      ─► metadata cluster (metadata.rs)
//!                                      ─► handover cluster (handover.rs)
//!                                      ─► goals.rs (ratios, goals) ─► JSON
//! ```
//!
//! Everything started is stopped in order on success, on error and on Ctrl-C (the daemons
//! run in their own process group; the runner notices the signal between jobs): mounts are
//! unmounted and their daemons stopped (sheepfs pushes its cache) before the nodes, and the
//! scratch directory is removed.

mod cluster;
mod fio;
mod goals;
mod handover;
mod machine;
mod main_rig;
mod metadata;
mod plan;
mod proc;
mod raid;
mod record;
mod rig;
mod scale;
mod settings;
mod snapshot;
mod stages;

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::figures::{Config, Report, REPORT_VERSION};
use cluster::{mounts_under, unmount, Bins};
use record::Recorder;
use settings::{parse_size_arg, Group, Membership, Profile, Settings};
use stages::OffStage;

/// Options of `bench run`.
#[derive(clap::Args, Debug)]
pub struct RunArgs {
    /// How much to measure.
    #[arg(long, value_enum, default_value = "full")]
    pub profile: Profile,
    /// Nodes of the main cluster.
    #[arg(long, default_value_t = 3)]
    pub nodes: usize,
    /// Copies of every object.
    #[arg(long, default_value_t = 3)]
    pub copies: usize,
    /// Object size of the main cluster, e.g. 4M.
    #[arg(long, value_parser = parse_size_arg, default_value = "4M")]
    pub object_size: u64,
    /// File/VDI size of the fio jobs, e.g. 1G [profile default: full 1G, quick 256M, smoke 16M].
    #[arg(long, value_parser = parse_size_arg)]
    pub size: Option<u64>,
    /// Seconds per timed fio job [profile default: full 10, quick 2, smoke 1].
    #[arg(long)]
    pub runtime: Option<u64>,
    /// Runs of each key figure, one per round (the first read: 8 passes per round in the full
    /// profile, 2 in quick); with two or more, a goal checks the median of its per-round
    /// ratios [profile default: full 3, quick 1, smoke 1].
    #[arg(long)]
    pub rounds: Option<usize>,
    /// Where to write the JSON report.
    #[arg(long, default_value = "target/bench/bench.json")]
    pub out: PathBuf,
    /// Directory holding sheep, dog, sheepfs and cachectl [default: this executable's directory].
    #[arg(long)]
    pub bin_dir: Option<PathBuf>,
    /// Only these groups (comma-separated).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub only: Vec<Group>,
    /// Only the figures a goal checks and what they are compared with (of the --only groups),
    /// each run --rounds times: the goals table in a fraction of the full run's time. The
    /// objsize, scaling and metadata groups check no goal and are left out.
    #[arg(long)]
    pub key_only: bool,
    /// The cluster sizes of the scale group's join and kill figures, e.g. 10,50,200 (none: 0)
    /// [profile default: full and quick 10,50; smoke 10].
    #[arg(long, value_delimiter = ',')]
    pub scale_nodes: Option<Vec<usize>>,
    /// The membership driver of the clusters: local (a shared state directory) or etcd (a
    /// one-member etcd per cluster, from /usr/bin/etcd): compare the two with `bench compare`.
    #[arg(long, value_enum, default_value = "local")]
    pub membership: Membership,
    /// Scratch space; a fresh directory is made inside and removed after. It must be on the
    /// disk the cache should use [default: the target directory this executable is in].
    #[arg(long)]
    pub work_dir: Option<PathBuf>,
}

pub fn run(args: RunArgs) -> Result<()> {
    let s = Settings::resolve(&args)?;
    let bin_dir = match &args.bin_dir {
        Some(d) => d.clone(),
        None => exe_dir()?,
    };
    let bins = cluster::find_bins(&bin_dir)?;
    check_tools(&s)?;
    testkit::install_interrupt_handlers();
    let work = WorkDir::create(args.work_dir.as_deref())?;
    let started = machine::utc_now();
    let machine = machine::probe(work.path());
    if machine.fs.ends_with(machine::NO_JOURNAL) {
        eprintln!(
            "bench: note: the scratch directory {} is on ext4 without a journal: there a file \
             is created several times slower for up to 5 minutes after many were deleted \
             (ext4 skips inodes freed recently), so the figures that create objects (first \
             writes, new VDIs) are low in a run that starts within 5 minutes of another run's \
             end; wait, or pass --work-dir on a filesystem with a journal",
            work.path().display()
        );
    }
    let mut rec = Recorder::default();
    // Every daemon has stopped when measure returns: the logs kept on failure are complete.
    let result = measure(&s, &bins, work.path(), &mut rec)
        .map_err(|e| with_logs(e, work.path(), &args.out.with_extension("logs")));
    drop(work);
    let mut figures = rec.into_figures();
    goals::finish(&mut figures, s.copies);
    let report = Report {
        version: REPORT_VERSION,
        started,
        finished: machine::utc_now(),
        command: machine::command_line(),
        machine,
        config: config(&s),
        figures,
    };
    write(&report, result, &args.out)
}

fn config(s: &Settings) -> Config {
    Config {
        nodes: s.nodes,
        copies: s.copies,
        object_size: s.object_size,
        file_mib: s.size >> 20,
        runtime_s: s.runtime_s,
        rounds: s.rounds,
        profile: s.profile.name().into(),
        membership: s.membership.name().into(),
    }
}

/// Saves the report to `out`, or after a failure what was measured to `<out>.partial.json`.
fn write(report: &Report, result: Result<()>, out: &Path) -> Result<()> {
    let n = report.figures.len();
    match result {
        Ok(()) => {
            save(report, out)?;
            eprintln!("bench: wrote {n} figures to {}", out.display());
            Ok(())
        }
        Err(e) if n > 0 => {
            let partial = out.with_extension("partial.json");
            save(report, &partial)?;
            let msg = format!(
                "stopped; the {n} figures measured so far are in {}",
                partial.display()
            );
            Err(e.context(msg))
        }
        Err(e) => Err(e),
    }
}

/// `err`, saying where the logs of the run are once copied out of the scratch directory.
fn with_logs(err: anyhow::Error, work: &Path, dest: &Path) -> anyhow::Error {
    match keep_logs(work, dest) {
        Ok(n) if n > 0 => err.context(format!("{n} logs are in {}", dest.display())),
        _ => err,
    }
}

/// Every stage of the selected groups, in order.
fn measure(s: &Settings, bins: &Bins, work: &Path, rec: &mut Recorder) -> Result<()> {
    let main = plan::MainPlan::build(s);
    let objsize = s.runs(Group::Objsize).then(|| OffStage::objsize(s));
    let scaling = s.runs(Group::Scaling).then(|| OffStage::scaling(s));
    let raid = s.runs(Group::Raid).then(|| raid::RaidStage::new(s));
    let rss = if s.runs(Group::Cache) { 2 } else { 0 };
    let runs = |steps: &[plan::Step]| steps.iter().map(plan::Step::passes).sum::<usize>();
    let main_runs = runs(&main.key) * s.rounds + runs(&main.rest) + rss;
    if s.runs(Group::Snapshot) {
        rec.plan([], snapshot::FIGURES * s.rounds.max(1));
    }
    if s.runs(Group::Handover) {
        handover::plan(s, rec);
    }
    rec.plan(main.order.iter().map(String::as_str), main_runs);
    for stage in objsize.iter().chain(&scaling) {
        stage.plan(rec);
    }
    if let Some(raid) = &raid {
        raid.plan(rec);
    }
    if s.runs(Group::Metadata) {
        rec.plan([], metadata::FIGURES);
    }
    if s.runs(Group::Scale) {
        rec.plan([], scale::figures(s));
    }
    // The snapshot group first: its first-write figures create thousands of files, and on
    // ext4 without a journal creating a file is several times slower for minutes after
    // many were deleted (the other groups delete theirs when they end; see NO_JOURNAL). Its
    // own files are deleted last, for the same reason: the main group's figures create
    // objects too (`dog vdi write`).
    let snapshot_dir = work.join("snapshot");
    if s.runs(Group::Snapshot) {
        snapshot::run(s, bins, &snapshot_dir, rec)?;
    }
    // Next, its files kept to the end too: its timed hand-overs create files (the local
    // membership driver keeps lock records in files), and it deletes few itself (the cache
    // files a hand-over drops).
    let handover_dir = work.join("handover");
    if s.runs(Group::Handover) {
        handover::run(s, bins, &handover_dir, rec)?;
    }
    if !main.is_empty() {
        let dir = work.join("main");
        let mut rig = main_rig::MainRig::start(bins, &dir, s)?;
        rig.run_plan(rec, &main, s.rounds)?;
        if s.runs(Group::Cache) {
            rig.record_rss(rec)?;
        }
        drop(rig);
        remove(&dir)?;
    }
    for stage in objsize.iter().chain(&scaling) {
        stage.run(bins, work, s.runtime_s, rec)?;
    }
    if let Some(raid) = &raid {
        raid.run(bins, work, s.runtime_s, rec)?;
    }
    if s.runs(Group::Metadata) {
        let dir = work.join("metadata");
        metadata::run(s, bins, &dir, rec)?;
        remove(&dir)?;
    }
    if s.runs(Group::Scale) {
        scale::run(s, rec)?;
    }
    for (group, dir) in [
        (Group::Handover, &handover_dir),
        (Group::Snapshot, &snapshot_dir),
    ] {
        if s.runs(group) {
            remove(dir)?;
        }
    }
    Ok(())
}

/// Copies every `*.log` below `work` into `dest`, named by their path (`main-node0.log`).
fn keep_logs(work: &Path, dest: &Path) -> Result<usize> {
    let mut logs = Vec::new();
    find_logs(work, &mut logs)?;
    if !logs.is_empty() {
        std::fs::create_dir_all(dest)?;
    }
    for log in &logs {
        let rel = log.strip_prefix(work).unwrap_or(log);
        let name = rel.to_string_lossy().replace('/', "-");
        std::fs::copy(log, dest.join(name))?;
    }
    Ok(logs.len())
}

fn find_logs(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        let kind = entry.file_type()?;
        if kind.is_dir() && !cluster::is_mounted(&path) {
            find_logs(&path, out)?;
        } else if kind.is_file() && path.extension().is_some_and(|e| e == "log") {
            out.push(path);
        }
    }
    Ok(())
}

fn remove(dir: &Path) -> Result<()> {
    std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()))
}

fn save(report: &Report, path: &Path) -> Result<()> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    report.save(path)
}

fn exe_dir() -> Result<PathBuf> {
    let exe = std::env::current_exe().context("finding this executable")?;
    exe.parent()
        .map(Path::to_path_buf)
        .context("this executable has no directory")
}

/// fio always; bindfs when a group compares with it; FUSE.
fn check_tools(s: &Settings) -> Result<()> {
    let mut needed = vec!["fio", "cp", "ls"];
    if s.groups.iter().any(|g| g.on_main_cluster()) {
        needed.push("bindfs");
    }
    for tool in needed {
        if !proc::in_path(tool) {
            bail!("{tool} is not installed (or not in PATH): scripts/install-deps.sh installs what the benchmarks need");
        }
    }
    if !Path::new("/dev/fuse").exists() {
        bail!("/dev/fuse is missing: FUSE is needed to mount sheepfs and bindfs");
    }
    Ok(())
}

/// The scratch directory: made fresh, and removed on drop once nothing is mounted below it.
struct WorkDir {
    dir: Option<tempfile::TempDir>,
}

impl WorkDir {
    fn create(parent: Option<&Path>) -> Result<WorkDir> {
        let parent = match parent {
            Some(p) => p.to_path_buf(),
            None => default_work_parent(),
        };
        std::fs::create_dir_all(&parent)
            .with_context(|| format!("creating the work directory {}", parent.display()))?;
        let dir = tempfile::Builder::new()
            .prefix("bench-run-")
            .tempdir_in(&parent)
            .with_context(|| format!("making a scratch directory in {}", parent.display()))?;
        Ok(WorkDir { dir: Some(dir) })
    }

    fn path(&self) -> &Path {
        self.dir
            .as_ref()
            .map_or(Path::new("/nonexistent"), |d| d.path())
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let Some(dir) = self.dir.take() else { return };
        // Never let the removal walk into a mount that is still there.
        for m in mounts_under(dir.path()) {
            unmount(&m);
        }
        if !mounts_under(dir.path()).is_empty() {
            eprintln!(
                "bench: {} still has mounts: leaving it",
                dir.path().display()
            );
            let _ = dir.keep();
        }
    }
}

/// The `target` directory this executable is in (same disk as the build), else the temp dir.
fn default_work_parent() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| {
            exe.ancestors()
                .find(|a| a.file_name().is_some_and(|n| n == "target"))
                .map(Path::to_path_buf)
        })
        .unwrap_or_else(std::env::temp_dir)
}
