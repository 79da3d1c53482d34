//! `bench soak` (`make soak`): minutes of I/O through a sheepfs mount (no cache) while a
//! nemesis kills, restarts, stops and continues one node at a time.
//!
//! ```text
//!  fio randwrite 4k verify ──► MOUNT/fio ┐
//!  exerciser (own thread)  ──► MOUNT/ex  ├─ sheepfs ── 4 sheep, 3 copies
//!      └─ every --check-every: fsync, dog vdi read ex, compare
//!  nemesis (main thread): SIGKILL + restart | SIGSTOP + SIGCONT, one node at a time
//! ```
//!
//! At the end: fio's verify errors and EIOs, the exerciser's EIOs, stale and corrupt blocks,
//! a last `dog vdi read` comparison, the time back to full copies after the last event, and
//! `testkit::replicas::check` of both VDIs. Never more than one node is down, so every object
//! keeps at least 2 of its 3 owners: every EIO counts. Exit status 1 if any count is not zero.

mod exerciser;
mod nemesis;

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;
use testkit::cluster::{Bins, Cluster, ClusterOptions};
use testkit::mount::Mount;

use exerciser::{Counts, Exerciser};
use nemesis::{Event, Nemesis};

#[derive(Args)]
pub struct SoakArgs {
    /// Minutes of faults and I/O (make soak: SOAK_MIN).
    #[arg(long, default_value_t = 5.0)]
    minutes: f64,
    /// Where sheep, dog, sheepfs and cachectl are (make soak builds them there).
    #[arg(long, default_value = "target/release")]
    bin_dir: PathBuf,
    /// Keep the cluster's data and logs here (default: a temporary directory, removed).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Seed of the nemesis and the exerciser (default: from the clock); printed, to replay
    /// the same choices.
    #[arg(long)]
    seed: Option<u64>,
    /// Seconds between the exerciser's comparisons with `dog vdi read`.
    #[arg(long, default_value_t = 30)]
    check_every: u64,
    /// Which faults the nemesis injects: kill (SIGKILL, restart), stop (SIGSTOP, SIGCONT),
    /// both, or none (a control run: the same I/O and checks without faults).
    #[arg(long, value_enum, default_value = "both")]
    faults: Faults,
    /// Print the summary as JSON.
    #[arg(long)]
    json: bool,
}

/// The nemesis's repertoire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Faults {
    Kill,
    Stop,
    Both,
    None,
}

const NODES: usize = 4;
const COPIES: &str = "3";
const FIO_VDI: &str = "fio";
const FIO_SIZE: &str = "128M";
const EX_VDI: &str = "ex";
const EX_SIZE: u64 = 32 << 20;

/// xorshift64*: the soak's choices, replayable from a seed.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Something wrong, when it happened and what the nemesis was doing then.
#[derive(Debug, Clone, Serialize)]
pub struct Anomaly {
    pub at_s: f64,
    pub kind: &'static str,
    pub what: String,
    pub nemesis: String,
}

/// The soak's log: notes and anomalies printed as they come (to stderr), anomalies kept.
pub struct Log {
    start: Instant,
    quiet: bool,
    state: Mutex<String>,
    anomalies: Mutex<Vec<Anomaly>>,
}

impl Log {
    pub fn new(quiet: bool) -> Log {
        Log {
            start: Instant::now(),
            quiet,
            state: Mutex::new("quiet".into()),
            anomalies: Mutex::default(),
        }
    }

    fn t(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    pub fn set_state(&self, s: String) {
        *self.state.lock().unwrap() = s;
    }

    pub fn note(&self, s: String) {
        if !self.quiet {
            eprintln!("[{:7.1} s] {s}", self.t());
        }
    }

    pub fn anomaly(&self, kind: &'static str, what: String) {
        let a = Anomaly {
            at_s: self.t(),
            kind,
            what,
            nemesis: self.state.lock().unwrap().clone(),
        };
        if !self.quiet {
            eprintln!(
                "[{:7.1} s] {}: {} (nemesis: {})",
                a.at_s, a.kind, a.what, a.nemesis
            );
        }
        self.anomalies.lock().unwrap().push(a);
    }
}

/// What fio said: its verify errors and EIOs, counted from its error lines.
#[derive(Debug, Default, Clone, Serialize)]
struct FioCounts {
    exit_ok: bool,
    writes: u64,
    verify_reads: u64,
    verify_errors: u64,
    eio: u64,
    other_errors: u64,
    longest_write_s: f64,
}

/// Counts fio's error lines as they come (so each is logged with what the nemesis was doing
/// then); returns the counts and fio's whole stderr once it closes.
fn watch_fio_errors(stderr: impl Read, log: &Log) -> (FioCounts, String) {
    let mut c = FioCounts::default();
    let mut all = String::new();
    for line in BufReader::new(stderr).lines() {
        let Ok(line) = line else { break };
        if line.starts_with("verify:") {
            c.verify_errors += 1;
            log.anomaly("fio verify", line.clone());
        } else if line.contains("io_u error") {
            if line.contains("Input/output error") {
                c.eio += 1;
            } else {
                c.other_errors += 1;
            }
            log.anomaly("fio error", line.clone());
        }
        all.push_str(&line);
        all.push('\n');
    }
    (c, all)
}

/// fio's figures from its JSON, over the counts of its error lines.
fn fio_counts(out: &std::process::Output, errors: (FioCounts, String), log: &Log) -> FioCounts {
    let (mut c, stderr) = errors;
    c.exit_ok = out.status.success();
    let text = String::from_utf8_lossy(&out.stdout);
    let v: serde_json::Value =
        serde_json::from_str(&text[text.find('{').unwrap_or(0)..]).unwrap_or_default();
    let job = &v["jobs"][0];
    c.writes = job["write"]["total_ios"].as_u64().unwrap_or(0);
    c.verify_reads = job["read"]["total_ios"].as_u64().unwrap_or(0);
    c.longest_write_s = job["write"]["lat_ns"]["max"].as_f64().unwrap_or(0.0) / 1e9;
    if !c.exit_ok && c.verify_errors + c.eio + c.other_errors == 0 {
        c.other_errors += 1;
        log.anomaly(
            "fio error",
            format!("fio exited with {}: {stderr}", out.status),
        );
    }
    c
}

#[derive(Debug, Serialize)]
struct Summary {
    seed: u64,
    minutes: f64,
    faults: Faults,
    /// sheep0, sheep1, ...: their addresses.
    nodes: Vec<String>,
    fio: FioCounts,
    exerciser: Counts,
    events: Vec<Event>,
    back_to_full_copies_after_last_event_s: Option<f64>,
    replica_problems: Vec<String>,
    anomalies: Vec<Anomaly>,
    verify_errors: u64,
    eio: u64,
    stale_reads: u64,
    failed: bool,
}

pub fn soak(args: SoakArgs) -> Result<bool> {
    testkit::install_interrupt_handlers();
    let bins = Bins::in_dir(&args.bin_dir).map_err(|e| {
        anyhow::anyhow!("{e}: build the binaries (make build) or point --bin-dir at them")
    })?;
    let seed = args.seed.unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64)
    });
    let log = Arc::new(Log::new(args.json));
    log.note(format!(
        "soak: {} min, seed {seed}, {NODES} nodes, {COPIES} copies, faults {:?}",
        args.minutes, args.faults
    ));

    let mut c = Cluster::try_start_with(
        &bins,
        NODES,
        ClusterOptions {
            dir: args.dir.clone(),
            ..ClusterOptions::default()
        },
    )?;
    let dog = |a: &[&str]| -> Result<Vec<u8>> {
        Ok(testkit::output(
            c.dog_command(a),
            &format!("dog {}", a.join(" ")),
        )?)
    };
    dog(&["cluster", "format", "--copies", COPIES])?;
    dog(&["vdi", "create", FIO_VDI, FIO_SIZE])?;
    dog(&["vdi", "create", EX_VDI, &EX_SIZE.to_string()])?;
    let addrs = c.addresses();
    let mount = Mount::try_start(
        &bins.path("sheepfs"),
        &addrs,
        &c.dir.path().join("mnt"),
        &c.dir.path().join("sheepfs.log"),
        &[],
    )?;

    let secs = (args.minutes * 60.0).max(1.0);
    let mut fio = Command::new("fio");
    testkit::die_with_parent(&mut fio, libc::SIGKILL);
    fio.args([
        "--name=soak",
        "--rw=randwrite",
        "--bs=4k",
        "--iodepth=16",
        "--ioengine=libaio",
        "--direct=1",
        "--verify=crc32c",
        "--verify_backlog=1024",
        "--verify_fatal=0",
        "--continue_on_error=all",
        "--verify_state_save=0",
        "--time_based",
        "--output-format=json",
    ])
    .arg(format!("--runtime={}", secs.ceil() as u64))
    .arg(format!("--filename={}", mount.path(FIO_VDI).display()))
    .arg(format!("--size={FIO_SIZE}"))
    .stdout(Stdio::piped())
    .stderr(Stdio::piped());
    let mut fio = fio.spawn().context("running fio (make deps installs it)")?;
    let fio_errors = {
        let stderr = fio.stderr.take().expect("piped");
        let log = log.clone();
        std::thread::spawn(move || watch_fio_errors(stderr, &log))
    };

    // The exerciser, on its own thread until told to stop.
    let stop = Arc::new(AtomicBool::new(false));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(mount.path(EX_VDI))
        .context("opening the exerciser's VDI on the mount")?;
    let dog_bin = bins.dog.clone();
    let dog_read = move || -> Result<Vec<u8>> {
        let mut cmd = Command::new(&dog_bin);
        testkit::auth::with_key(&mut cmd).args([
            "--address",
            &addrs,
            "--timeout",
            "60",
            "vdi",
            "read",
            EX_VDI,
        ]);
        Ok(testkit::output(cmd, "dog vdi read")?)
    };
    let exerciser = {
        let (stop, log, dog_read) = (stop.clone(), log.clone(), dog_read.clone());
        let check_every = Duration::from_secs(args.check_every.max(1));
        std::thread::spawn(move || {
            let mut x = Exerciser::new(file, EX_SIZE, seed ^ 0x5eed);
            let mut last_check = Instant::now();
            while !stop.load(Ordering::SeqCst) {
                x.step(&log);
                if last_check.elapsed() >= check_every {
                    x.compare_whole(&log, &dog_read);
                    last_check = Instant::now();
                }
            }
            x
        })
    };

    let start = log.start;
    let until = Instant::now() + Duration::from_secs_f64(secs);
    let mut nemesis = Nemesis::new(seed, args.faults);
    let nemesis_result = nemesis.run(&mut c, &log, start, until);
    log.note("faults over; waiting for fio".into());
    let fio_out = fio.wait_with_output().context("waiting for fio")?;
    stop.store(true, Ordering::SeqCst);
    let mut x = exerciser
        .join()
        .map_err(|_| anyhow::anyhow!("the exerciser panicked"))?;
    nemesis_result?;

    // The end: whole again, a last comparison, the copies checked on disk.
    x.compare_whole(&log, dog_read);
    let errors = fio_errors
        .join()
        .map_err(|_| anyhow::anyhow!("the fio watcher panicked"))?;
    let fio_counts = fio_counts(&fio_out, errors, &log);
    let settled = Instant::now();
    if let Err(e) = c.try_wait_recovered() {
        log.anomaly("recovery", format!("at the end: {}", e.chain()));
    }
    let last_event_full = nemesis.events.last().and_then(|e| e.back_to_full_copies_s);
    log.note(format!(
        "recovered {:.1} s after the I/O stopped",
        settled.elapsed().as_secs_f64()
    ));
    let mut replica_problems = Vec::new();
    for vdi in [FIO_VDI, EX_VDI] {
        if let Err(p) = testkit::replicas::check(&c, vdi) {
            for p in p.problems {
                log.anomaly("replicas", format!("{vdi}: {p}"));
                replica_problems.push(format!("{vdi}: {p}"));
            }
        }
    }
    drop(mount);

    let xc = x.counts.clone();
    let verify_errors = fio_counts.verify_errors + xc.corrupt_blocks;
    let eio = fio_counts.eio + xc.eio;
    let stale_reads = xc.stale_blocks;
    let anomalies = log.anomalies.lock().unwrap().clone();
    let failed =
        verify_errors + eio + stale_reads > 0 || !anomalies.is_empty() || !fio_counts.exit_ok;
    let summary = Summary {
        seed,
        minutes: args.minutes,
        faults: args.faults,
        nodes: (0..NODES).map(|i| c.addr(i)).collect(),
        fio: fio_counts,
        exerciser: xc,
        events: nemesis.events,
        back_to_full_copies_after_last_event_s: last_event_full,
        replica_problems,
        anomalies,
        verify_errors,
        eio,
        stale_reads,
        failed,
    };
    print_summary(&summary, args.json);
    if testkit::check_interrupt().is_err() {
        bail!("interrupted");
    }
    Ok(!failed)
}

fn print_summary(s: &Summary, json: bool) {
    if json {
        println!("{}", serde_json::to_string_pretty(s).expect("serializable"));
        return;
    }
    let kills = s.events.iter().filter(|e| e.kind == "kill9").count();
    let stops = s.events.len() - kills;
    println!(
        "soak: {:.1} min, seed {}, faults {:?}",
        s.minutes, s.seed, s.faults
    );
    let nodes: Vec<String> = s
        .nodes
        .iter()
        .enumerate()
        .map(|(i, a)| format!("sheep{i} {a}"))
        .collect();
    println!("  nodes: {}", nodes.join(", "));
    for e in &s.events {
        println!(
            "  [{:7.1} s] {} sheep{} for {:.1} s, back to full copies {}",
            e.at_s,
            e.kind,
            e.node,
            e.down_s,
            e.back_to_full_copies_s
                .map_or("never".into(), |t| format!("{t:.1} s later"))
        );
    }
    println!(
        "  events: {} ({kills} kill -9 + restart, {stops} SIGSTOP + SIGCONT)",
        s.events.len()
    );
    println!(
        "  fio: {} writes, {} verify reads, longest write {:.1} s",
        s.fio.writes, s.fio.verify_reads, s.fio.longest_write_s
    );
    let x = &s.exerciser;
    println!(
        "  exerciser: {} writes, {} reads, {} fsyncs, {} blocks checked, {} dog vdi read \
         comparisons ({} failed)",
        x.writes, x.reads, x.fsyncs, x.blocks_checked, x.dog_compares, x.dog_errors
    );
    println!(
        "verify errors: {} (fio {}, exerciser corrupt blocks {})",
        s.verify_errors, s.fio.verify_errors, x.corrupt_blocks
    );
    println!(
        "EIO while enough owners were up: {} (fio {}, exerciser {})",
        s.eio, s.fio.eio, x.eio
    );
    println!("stale reads: {}", s.stale_reads);
    println!("replica problems: {}", s.replica_problems.len());
    match s.back_to_full_copies_after_last_event_s {
        Some(t) => println!("back to full copies after the last event: {t:.1} s"),
        None if s.events.is_empty() => println!("back to full copies: no event happened"),
        None => println!("back to full copies after the last event: never"),
    }
    if !s.anomalies.is_empty() {
        println!("anomalies ({}):", s.anomalies.len());
        for a in &s.anomalies {
            println!(
                "  [{:7.1} s] {}: {} (nemesis: {})",
                a.at_s, a.kind, a.what, a.nemesis
            );
        }
    }
    println!("{}", if s.failed { "FAILED" } else { "ok" });
}
