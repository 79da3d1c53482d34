//! The main cluster: the figures of the iops, sweep, throughput, cache, flush and dog groups.
//!
//! ```text
//!   WORK/raw/file ── bindfs --multithreaded ──► WORK/bind/file      (references, same disk)
//!   sheep × N ── sheepfs (no cache, --no-lock) ──► WORK/off/bench
//!            └── sheepfs --cache-dir WORK/cache (10G, writeback) ──► WORK/on/bench (held open)
//! ```
//!
//! `bench` holds the raw file's data. This VM evicts page cache idle for about a minute, so
//! the target of every job that reads (and of writeback and cold jobs) is prepared right
//! before it: references by reading the raw file, the cache-off mount by reading the VDI into
//! the nodes' page cache, `warm` by filling the cache (a stream is cached on its second pass)
//! and reading the VDI once more, all hits, as the references read the raw file, `writeback`
//! by reading it once, `cold` by flushing and evicting the cache (nodes warmed). The flush
//! VDI is written once at start, so that flushes overwrite objects as the sequential-write
//! reference does.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde_json::Value;

use super::cluster::{output, timed, Bins, Mount};
use super::fio::{Engine, FioJob};
use super::plan::{DogOp, MainPlan, Step, Target, Work};
use super::proc::Watched;
use super::record::{Outcome, Recorder};
use super::rig::{blame, read_whole, run_fio, sync_all, write_random, Fill, OffRig, Shape, VDI};
use super::settings::Settings;
use crate::figures::{median, Figure};

const MIB: u64 = 1 << 20;
/// The cache's size bound (restored after each sweep point).
const CACHE_SIZE: &str = "10G";
/// VDI the flush figure dirties and flushes.
const FLUSH_VDI: &str = "flush";
/// VDI of the dog figures.
const DOG_VDI: &str = "dog";
/// Per-VDI `cachectl stats` counters recorded for each cache job (`cache_rounds`).
const COUNTERS: [&str; 5] = [
    "hits",
    "misses",
    "fills",
    "busy_skipped_fills",
    "skipped_fills",
];

/// Fields drop in order: open files, then the cache mount (which pushes its dirty data), then
/// bindfs, then the cache-off mount and the nodes.
pub struct MainRig {
    /// Kept open: the VDIs stay attached to the cache.
    _attached: Vec<File>,
    cache: Mount,
    bind: Mount,
    base: OffRig,
    dir: PathBuf,
    cachectl: PathBuf,
    /// Whether the dog VDI has been written once.
    dog_written: bool,
    alloc_runs: u32,
    /// Measured hit ratios per sweep point, over its runs.
    hit_ratios: std::collections::HashMap<u32, Vec<f64>>,
}

impl MainRig {
    pub fn start(bins: &Bins, dir: &Path, s: &Settings) -> Result<MainRig> {
        let raw_dir = dir.join("raw");
        std::fs::create_dir_all(&raw_dir)?;
        let raw = raw_dir.join("file");
        eprintln!("bench: writing {} MiB of random data...", s.size / MIB);
        write_random(&raw, s.size)?;
        eprintln!("bench: starting {} nodes, {} copies...", s.nodes, s.copies);
        let shape = Shape {
            nodes: s.nodes,
            copies: s.copies,
            object_size: s.object_size,
            membership: s.membership,
        };
        let base = OffRig::start(bins, dir, shape, s.size, s.runtime_s, Fill::From(&raw))?;
        base.cluster.create_vdi(FLUSH_VDI, s.size)?;
        // Written once, so a flush overwrites objects like its reference (a sequential write
        // over the bench VDI): the first write of an object pays its crash-safe creation.
        base.cluster.write_vdi(FLUSH_VDI, &raw)?;
        let bind = Mount::bindfs(&raw_dir, &dir.join("bind"), &dir.join("bindfs.log"))?;
        let cache_opts = [
            "--cache-dir".to_string(),
            dir.join("cache").display().to_string(),
            "--cache-size".into(),
            CACHE_SIZE.into(),
            "--cache-max-dirty".into(),
            "8G".into(),
            "--cache-max-dirty-age".into(),
            "3600".into(),
        ];
        let cache = Mount::sheepfs(
            &base.cluster,
            &dir.join("on"),
            &dir.join("sheepfs-on.log"),
            &cache_opts,
        )?;
        // Attach read-write (as qemu would), so the cache serves these VDIs.
        let attached = [VDI, FLUSH_VDI]
            .iter()
            .map(|v| attach(&cache.path(v)))
            .collect::<Result<Vec<_>>>()?;
        Ok(MainRig {
            _attached: attached,
            cache,
            bind,
            base,
            dir: dir.into(),
            cachectl: bins.path("cachectl"),
            dog_written: false,
            alloc_runs: 0,
            hit_ratios: Default::default(),
        })
    }

    /// Measures every step: key steps `rounds` times, interleaved, then the rest once.
    pub fn run_plan(&mut self, rec: &mut Recorder, plan: &MainPlan, rounds: usize) -> Result<()> {
        for round in 1..=rounds {
            let of_rounds = (rounds > 1).then(|| format!("round {round}/{rounds}"));
            for step in &plan.key {
                self.run_step(rec, step, of_rounds.as_deref())?;
            }
        }
        for step in &plan.rest {
            self.run_step(rec, step, None)?;
        }
        Ok(())
    }

    /// Measures `step` (each of its passes); a failure names a daemon that died, if one did.
    fn run_step(&mut self, rec: &mut Recorder, step: &Step, round: Option<&str>) -> Result<()> {
        let passes = step.passes();
        for pass in 1..=passes {
            let of_passes = (passes > 1).then(|| format!("pass {pass}/{passes}"));
            let parts: Vec<&str> = round.into_iter().chain(of_passes.as_deref()).collect();
            let note = if parts.is_empty() {
                String::new()
            } else {
                format!(" ({})", parts.join(", "))
            };
            self.measure_step(rec, step, &note)
                .map_err(|e| blame(e, self.check_alive()))?;
        }
        Ok(())
    }

    fn check_alive(&mut self) -> Result<()> {
        self.cache.check_alive()?;
        self.bind.check_alive()?;
        self.base.check_alive()
    }

    fn measure_step(&mut self, rec: &mut Recorder, step: &Step, note: &str) -> Result<()> {
        self.measure_work(rec, step, note)?;
        match &step.work {
            Work::Fio { job, .. } if job.writes() => self.settle(),
            _ => Ok(()),
        }
    }

    /// After a job that wrote: the cache mount's dirty data pushed and every dirty page
    /// written, untimed, so that no later job runs beside this one's write-back (on the rig,
    /// a 1 GiB read right after the cache's 4k write job ran at 0.4–0.6x while the cache
    /// files' pages were written back).
    fn settle(&self) -> Result<()> {
        self.ctl(&["flush"])?;
        sync_all()
    }

    fn measure_work(&mut self, rec: &mut Recorder, step: &Step, note: &str) -> Result<()> {
        match &step.work {
            Work::Fio { job, target } if *target == Target::Off => {
                self.base.run_off_step(rec, step, job, note)
            }
            Work::Fio { job, target } => {
                rec.announce(&step.fig, note)?;
                if job.reads() || matches!(target, Target::Cold | Target::Writeback) {
                    self.prepare(*target)?;
                }
                let procs = self.watched(*target);
                let file = self.file(*target);
                let cached = matches!(target, Target::Cold | Target::Warm | Target::Writeback);
                let before = if cached { self.vdi_counters()? } else { None };
                run_fio(
                    rec,
                    step,
                    job,
                    &file,
                    self.base.size,
                    self.base.runtime_s,
                    &procs,
                )?;
                // What the cache did during the job, run by run, for reading a figure
                // that moved (were the reads hits, were misses filled).
                if let (Some(b), Some(a)) = (before, self.vdi_counters()?) {
                    let delta: serde_json::Map<String, Value> = COUNTERS
                        .iter()
                        .map(|&k| (k.to_string(), Value::from(a[k].saturating_sub(b[k]))))
                        .collect();
                    rec.push_param(&step.fig.id, "cache_rounds", Value::Object(delta));
                }
                Ok(())
            }
            Work::Sweep { pct } => self.sweep(rec, step, *pct, note),
            Work::SweepModeOff => self.sweep_mode_off(rec, step, note),
            Work::Flush => self.flush(rec, &step.fig, note),
            Work::Dog(op) => self.dog(rec, &step.fig, *op, note),
        }
    }

    fn file(&self, t: Target) -> PathBuf {
        match t {
            Target::Raw => self.dir.join("raw/file"),
            Target::Bindfs => self.bind.path("file"),
            Target::Off => self.base.file(),
            Target::Cold | Target::Warm | Target::Writeback => self.cache.path(VDI),
        }
    }

    fn prepare(&self, t: Target) -> Result<()> {
        match t {
            Target::Raw | Target::Bindfs => read_whole(&self.file(Target::Raw), false),
            Target::Off => self.base.warm(),
            Target::Cold => {
                self.ctl(&["flush"])?;
                self.ctl(&["evict"])?;
                self.base.warm()
            }
            // Filled (a stream is cached on its second pass, docs/cache.md), then read once
            // more, all hits, as the references read the raw file before their jobs.
            Target::Warm => {
                self.fill_cache()?;
                read_whole(&self.cache.path(VDI), true)
            }
            Target::Writeback => self.fill_cache(),
        }
    }

    fn watched(&self, t: Target) -> Vec<Watched> {
        let fs = match t {
            Target::Raw => return Vec::new(),
            Target::Bindfs => return vec![self.bind.watched()],
            Target::Off => return self.base.watched(),
            Target::Cold | Target::Warm | Target::Writeback => self.cache.watched(),
        };
        let mut w = vec![fs];
        w.extend(self.base.cluster.watched());
        w
    }

    /// `cachectl --cache-dir WORK/cache ARGS...`; its stdout.
    fn ctl(&self, args: &[&str]) -> Result<Vec<u8>> {
        let mut cmd = Command::new(&self.cachectl);
        cmd.arg("--cache-dir")
            .arg(self.dir.join("cache"))
            .args(args);
        output(cmd, &format!("cachectl {}", args.join(" ")))
    }

    /// Reads the bench VDI through the cache until it is cached as far as the cache's size
    /// allows: a whole-VDI read is a stream (`--cache-sequential-cutoff`), cached on its
    /// second pass, and ranges that come while the fill thread is 16 MiB behind are left out
    /// of that one; so passes go on (at most 5) until one adds nothing or the cache is full
    /// (where a next pass would start displacing what the last one kept).
    fn fill_cache(&self) -> Result<()> {
        let mut last = None;
        for _ in 0..5 {
            read_whole(&self.cache.path(VDI), true)?;
            let v = self.stats(&[])?;
            let (used, size) = (counter(&v, "used")?, counter(&v, "size")?);
            if last == Some(used) || used + 4 * MIB >= size - size / 8 {
                break;
            }
            last = Some(used);
        }
        Ok(())
    }

    /// The bench VDI's [`COUNTERS`] so far (None before its first open through the cache).
    fn vdi_counters(&self) -> Result<Option<HashMap<&'static str, u64>>> {
        let v = self.stats(&[])?;
        let Some(e) = v["vdis"]
            .as_array()
            .and_then(|a| a.iter().find(|e| e["name"] == VDI))
        else {
            return Ok(None);
        };
        COUNTERS
            .iter()
            .map(|&k| Ok((k, counter(e, k)?)))
            .collect::<Result<_>>()
            .map(Some)
    }

    /// (hits, misses) of the bench VDI so far.
    fn hits_misses(&self) -> Result<(u64, u64)> {
        let c = self
            .vdi_counters()?
            .context("cachectl stats: no line for the bench VDI")?;
        Ok((c["hits"], c["misses"]))
    }

    /// `cachectl --json stats ARGS...`, parsed.
    fn stats(&self, args: &[&str]) -> Result<Value> {
        let out = self.ctl(&[&["--json", "stats"], args].concat())?;
        serde_json::from_slice(&out).context("cachectl stats --json")
    }

    fn sweep(&mut self, rec: &mut Recorder, step: &Step, pct: u32, note: &str) -> Result<()> {
        rec.announce(&step.fig, note)?;
        let cache_bytes = self.base.size * pct as u64 / 100 + 16 * MIB;
        self.ctl(&["flush"])?;
        self.ctl(&["resize", &cache_bytes.to_string()])?;
        self.ctl(&["evict"])?;
        self.fill_cache()?;
        let (h0, m0) = self.hits_misses()?;
        self.sweep_job(rec, step)?;
        let (h1, m1) = self.hits_misses()?;
        self.ctl(&["resize", CACHE_SIZE])?;
        let (h, m) = (h1.saturating_sub(h0), m1.saturating_sub(m0));
        let ratios = self.hit_ratios.entry(pct).or_default();
        ratios.push(h as f64 / (h + m).max(1) as f64);
        rec.set_param(
            &step.fig.id,
            "hit_ratio_measured",
            Value::from(median(ratios)),
        );
        Ok(())
    }

    /// The sweep's job through the cache mount with the bench VDI in mode `off` (nodes
    /// warmed as for the cache-off mount); the mode is set back to writeback after.
    fn sweep_mode_off(&mut self, rec: &mut Recorder, step: &Step, note: &str) -> Result<()> {
        rec.announce(&step.fig, note)?;
        self.base.warm()?;
        self.ctl(&["mode", VDI, "off"])?;
        let measured = self.sweep_job(rec, step);
        self.ctl(&["mode", VDI, "writeback"])?;
        measured
    }

    /// The sweep's job (4k random reads at iodepth 16) through the cache mount.
    fn sweep_job(&self, rec: &mut Recorder, step: &Step) -> Result<()> {
        let job = FioJob::timed("randread", 4096, Engine::Libaio(16));
        run_fio(
            rec,
            step,
            &job,
            &self.cache.path(VDI),
            self.base.size,
            self.base.runtime_s,
            &self.watched(Target::Warm),
        )
    }

    fn flush(&mut self, rec: &mut Recorder, fig: &Figure, note: &str) -> Result<()> {
        rec.announce(fig, note)?;
        let size = self.base.size;
        // Its reference (a write timed to durability) overwrites objects every node has just
        // written (see `OffRig::write_pass`): so does the flush.
        self.base.write_pass(&self.base.off.path(FLUSH_VDI))?;
        self.base.write_pass(&self.cache.path(FLUSH_VDI))?;
        let procs = self.watched(Target::Writeback);
        rec.measure(fig, &procs, || {
            let ((), secs) = timed(|| self.ctl(&["flush", FLUSH_VDI]).map(drop))?;
            Ok(mib_per_s(size, secs))
        })
        .map(drop)
    }

    fn dog(&mut self, rec: &mut Recorder, fig: &Figure, op: DogOp, note: &str) -> Result<()> {
        rec.announce(fig, note)?;
        let raw = self.file(Target::Raw);
        let dst = self.dir.join("copy");
        let cluster = &self.base.cluster;
        if matches!(op, DogOp::Read | DogOp::Write) && !self.dog_written {
            cluster.create_vdi(DOG_VDI, self.base.size)?;
            cluster.write_vdi(DOG_VDI, &raw)?;
            self.dog_written = true;
        }
        let alloc = format!("alloc{}", self.alloc_runs);
        if op == DogOp::WriteAlloc {
            self.alloc_runs += 1;
            cluster.create_vdi(&alloc, self.base.size)?;
        }
        read_whole(&raw, false)?;
        let procs = match op {
            DogOp::Copy | DogOp::CopySync => Vec::new(),
            _ => cluster.watched(),
        };
        let size = self.base.size;
        rec.measure(fig, &procs, || {
            let t0 = Instant::now();
            match op {
                DogOp::Copy | DogOp::CopySync => copy(&raw, &dst, op == DogOp::CopySync)?,
                DogOp::Read => cluster.read_vdi(DOG_VDI, Some(&dst))?,
                DogOp::Write => cluster.write_vdi(DOG_VDI, &raw)?,
                DogOp::WriteAlloc => cluster.write_vdi(&alloc, &raw)?,
            }
            Ok(mib_per_s(size, t0.elapsed().as_secs_f64()))
        })?;
        let _ = std::fs::remove_file(&dst);
        if op == DogOp::WriteAlloc {
            cluster.dog(&["vdi", "delete", &alloc])?;
        }
        Ok(())
    }

    /// The whole-run peak RSS of both sheepfs mounts (figures `cache/sheepfs-rss/*`).
    pub fn record_rss(&self, rec: &mut Recorder) -> Result<()> {
        for (target, mount, cache) in [
            ("cache", &self.cache, CACHE_SIZE),
            ("off", &self.base.off, "none"),
        ] {
            let mut fig = Figure::new("cache", "sheepfs-rss", target, "MiB", Vec::new());
            fig.higher_is_better = false;
            fig.params.insert("cache_size".into(), Value::from(cache));
            rec.announce(&fig, "")?;
            let kib = rec.lifetime_peak_rss(&mount.watched())?;
            fig.peak_rss_kib.insert("sheepfs".into(), kib);
            rec.record(&fig, kib as f64 / 1024.0)?;
        }
        Ok(())
    }
}

/// Opens a VDI file read-write and keeps it open.
fn attach(path: &Path) -> Result<File> {
    File::options()
        .read(true)
        .write(true)
        .open(path)
        .with_context(|| format!("attaching {} read-write", path.display()))
}

fn mib_per_s(bytes: u64, secs: f64) -> Outcome {
    Outcome {
        value: bytes as f64 / MIB as f64 / secs.max(1e-9),
        bytes,
    }
}

/// `cp SRC DST` (and an fsync of DST with `sync`).
fn copy(src: &Path, dst: &Path, sync: bool) -> Result<()> {
    let mut cmd = Command::new("cp");
    cmd.arg(src).arg(dst);
    output(cmd, "cp")?;
    if sync {
        File::open(dst)
            .and_then(|f| f.sync_all())
            .with_context(|| format!("syncing {}", dst.display()))?;
    }
    if !dst.exists() {
        bail!("cp left no {}", dst.display());
    }
    Ok(())
}

/// The number `k` of a `cachectl stats --json` object.
fn counter(v: &Value, k: &str) -> Result<u64> {
    v[k].as_u64()
        .with_context(|| format!("cachectl stats: no {k}"))
}
