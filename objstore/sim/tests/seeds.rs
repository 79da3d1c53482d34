//! The simulator over many seeds (see the crate documentation of objstore-sim).
//!
//! - `seeds`: `SIM_SEEDS` seeds (default 1000) from `SIM_SEED_BASE` (default 0), or only
//!   `SEED` when set. It fails on every rule of the checker; with `SIM_STRICT=0` only on the
//!   lenient ones ([`LENIENT`]), to see what else a change breaks while one rule still fails.
//!   Either way it prints every kind of violation found, with seeds, and a replay command for
//!   the first.
//! - `without_faults_nothing_fails`: no fault, no violation, no failed operation.
//! - `a_seed_replays_exactly`: one seed twice, the same trace.
//!
//! `SIM_FAULTS=crashes,partitions,hangs,delays,resets,disk_full,fsync_errors,full_restarts,`
//! `power_cuts` (any subset) keeps only those fault classes; `SIM_SHARED=1` lets clients write each other's objects;
//! `SIM_VDI_CLIENTS=N` runs N clients through VDI handles (default 1; 0 gives the runs of
//! before there were any).
//! With `SEED`, `SIM_LOG=FILTER` (e.g. `info`, `objstore_node=debug`) prints the nodes' logs,
//! each line with its simulated time and node.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use objstore_sim::{run, Config, Kind, Report};

/// What must hold today: no torn or foreign block; once the faults stop and every node is
/// back, recovery finishes and every block reads without error. The other kinds are the known
/// replication gaps of issue 22 (see the report the test prints, and docs/architecture.md
/// "Simulator").
const LENIENT: &[Kind] = &[
    Kind::Garbage,
    Kind::Foreign,
    Kind::NotSettled,
    Kind::FinalReadFailed,
];

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.parse().ok())
}

fn replay(seed: u64) -> String {
    let mut env = String::new();
    for var in [
        "SIM_FAULTS",
        "SIM_SHARED",
        "SIM_VDI_CLIENTS",
        "SIM_EC",
        "SIM_EC_VDIS",
    ] {
        if let Ok(v) = std::env::var(var) {
            env.push_str(&format!("{var}={v} "));
        }
    }
    format!("{env}SEED={seed} cargo test -p objstore-sim --test seeds seeds -- --nocapture")
}

/// Runs the seeds on a few threads; returns the reports by seed.
fn run_many(seeds: Vec<u64>, cfg: &Config) -> Vec<Report> {
    let next = AtomicU64::new(0);
    let out = Mutex::new(Vec::new());
    let workers = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(seeds.len().max(1));
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed) as usize;
                let Some(&seed) = seeds.get(i) else { return };
                let r = run(seed, cfg).unwrap_or_else(|e| panic!("seed {seed}: {e:?}"));
                out.lock().unwrap().push(r);
            });
        }
    });
    let mut v = out.into_inner().unwrap();
    v.sort_by_key(|r| r.seed);
    v
}

/// The default shape, changed by `SIM_FAULTS` (e.g. `crashes,disk_full`: only those fault
/// classes), `SIM_SHARED=1` (clients write each other's objects) and `SIM_VDI_CLIENTS=N`
/// (clients through VDI handles).
fn config() -> Config {
    let mut cfg = Config::default();
    if let Ok(f) = std::env::var("SIM_FAULTS") {
        cfg.faults = f.parse().unwrap_or_else(|e| panic!("SIM_FAULTS: {e}"));
    }
    cfg.shared_objects = std::env::var("SIM_SHARED").is_ok_and(|v| v == "1");
    if let Ok(ec) = std::env::var("SIM_EC") {
        cfg.ec = Some(ec.parse().unwrap_or_else(|e| panic!("SIM_EC: {e}")));
    }
    cfg.ec_vdis = std::env::var("SIM_EC_VDIS").is_ok_and(|v| v == "1");
    if let Some(n) = env_u64("SIM_VDI_CLIENTS") {
        cfg.vdi_clients = n as usize;
    }
    if std::env::var("SIM_CLIENT_DEFAULTS").is_ok_and(|v| v == "1") {
        let d = objstore_client::ClientOptions::default();
        cfg.op_timeout = d.timeout;
        cfg.request_timeout = d.request_timeout;
    }
    cfg
}

/// Log lines stamped with the simulated time of the seed running.
struct SimTime;

impl tracing_subscriber::fmt::time::FormatTime for SimTime {
    fn format_time(&self, w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
        match objstore_sim::elapsed() {
            Some(t) => write!(w, "{:>11.6}", t.as_secs_f64()),
            None => write!(w, "{:>11}", "-"),
        }
    }
}

fn check_seeds(strict: bool) {
    let cfg = config();
    if let (Some(_), Ok(filter)) = (env_u64("SEED"), std::env::var("SIM_LOG")) {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_timer(SimTime)
            .with_ansi(false)
            .with_writer(std::io::stderr)
            .init();
    }
    let seeds: Vec<u64> = match env_u64("SEED") {
        Some(s) => vec![s],
        None => {
            let base = env_u64("SIM_SEED_BASE").unwrap_or(0);
            (base..base + env_u64("SIM_SEEDS").unwrap_or(1000)).collect()
        }
    };
    let t = Instant::now();
    let reports = run_many(seeds.clone(), &cfg);
    let elapsed = t.elapsed();
    let mut by_kind: BTreeMap<Kind, Vec<u64>> = BTreeMap::new();
    for r in &reports {
        for k in r.kinds() {
            by_kind.entry(k).or_default().push(r.seed);
        }
    }
    let ops: usize = reports.iter().map(|r| r.stats.ops).sum();
    let failed: usize = reports.iter().map(|r| r.stats.failed).sum();
    let blocks: usize = reports.iter().map(|r| r.stats.blocks_checked).sum();
    let crashes: usize = reports.iter().map(|r| r.stats.crashes).sum();
    let sim: f64 = reports.iter().map(|r| r.stats.sim_time.as_secs_f64()).sum();
    // One hash over every seed's trace: two runs of the same seeds must print the same.
    let batch = reports
        .iter()
        .fold(0u64, |h, r| h.rotate_left(7) ^ r.trace_hash);
    eprintln!(
        "simulator: {} seed(s) in {:.1} s ({:.0} s simulated): {ops} operations ({failed} returned errors), {blocks} block reads checked, {crashes} node crashes; traces {batch:016x}",
        reports.len(),
        elapsed.as_secs_f64(),
        sim
    );
    if reports.len() == 1 {
        let r = &reports[0];
        eprintln!(
            "seed {}: trace {:016x}, {:?}",
            r.seed, r.trace_hash, r.stats
        );
        // Faults and operations in time order (an operation at its completion).
        let mut lines: Vec<(u64, String)> = r
            .history
            .events
            .iter()
            .map(|e| (e.at, e.what.clone()))
            .collect();
        lines.extend(r.history.ops.iter().map(|o| {
            (
                o.end,
                format!(
                    "client {} {:?} ({:.3}-{:.3} s): {:?}",
                    o.client,
                    o.kind,
                    o.invoke as f64 / 1e6,
                    o.end as f64 / 1e6,
                    o.outcome
                ),
            )
        }));
        lines.sort_by_key(|l| l.0);
        for (at, what) in lines {
            eprintln!("  {:>10.3} s  {what}", at as f64 / 1e6);
        }
        for v in &r.violations {
            eprintln!("  violation: {v}");
        }
    }
    let mut fatal = Vec::new();
    for (kind, seeds) in &by_kind {
        let counts = !strict && !LENIENT.contains(kind);
        let first = reports
            .iter()
            .find(|r| r.seed == seeds[0])
            .and_then(|r| r.violations.iter().find(|v| v.kind == *kind))
            .map(|v| v.to_string())
            .unwrap_or_default();
        eprintln!(
            "{kind:?}{}: {} seed(s), e.g. {:?}\n  first: seed {}: {first}\n  replay: {}",
            if counts { " (known gap, issue 22)" } else { "" },
            seeds.len(),
            &seeds[..seeds.len().min(12)],
            seeds[0],
            replay(seeds[0])
        );
        if !counts {
            fatal.push(format!(
                "{kind:?} (first seed {}: {})",
                seeds[0],
                replay(seeds[0])
            ));
        }
    }
    assert!(fatal.is_empty(), "violations: {}", fatal.join("; "));
}

/// Every rule of the checker, on every seed (`SIM_STRICT=0`: only the lenient rules, to look
/// at what else a change breaks while one rule still fails).
#[test]
fn seeds() {
    check_seeds(std::env::var("SIM_STRICT").map_or(true, |v| v != "0"));
}

/// Without faults the simulator finds nothing and no operation fails: the checker and the
/// harness do not cry wolf.
#[test]
fn without_faults_nothing_fails() {
    let cfg = Config {
        faults: objstore_sim::Faults::NONE,
        ..Config::default()
    };
    for r in run_many((0..20).collect(), &cfg) {
        assert!(
            r.violations.is_empty(),
            "seed {}: {:?}",
            r.seed,
            r.violations
        );
        assert_eq!(r.stats.failed, 0, "seed {}", r.seed);
        assert_eq!(r.stats.crashes, 0);
        assert!(r.stats.blocks_checked > 0);
    }
}

#[test]
fn a_seed_replays_exactly() {
    let cfg = config();
    let seed = env_u64("SEED").unwrap_or(7);
    let a = run(seed, &cfg).unwrap();
    let b = run(seed, &cfg).unwrap();
    assert!(a.stats.ops > 0 && a.stats.faults > 0, "{:?}", a.stats);
    assert_eq!(a.history.ops, b.history.ops);
    assert_eq!(a.history.events, b.history.events);
    assert_eq!(a.trace_hash, b.trace_hash);
    assert_eq!(a.violations, b.violations);
    let c = run(seed + 1, &cfg).unwrap();
    assert_ne!(a.trace_hash, c.trace_hash, "another seed, another run");
}

/// Erasure-coded objects (2:1 on 5 nodes) under partitions, hung and slow nodes and reset
/// connections, which stop changes on some strips and not others: every stripe still reads as
/// one version and ends whole. Crashes, full disks and failed fsyncs are left out: under them
/// the simulator still finds stripes it cannot make whole (a strip at a version whose change
/// no note records; a node down with a strip a failed fsync lost; `SIM_EC=2:1` runs every
/// fault; docs/architecture.md, erasure-coded objects, "Limits"; issue 44).
#[test]
fn ec_seeds_without_crashes() {
    let faults = "partitions,hangs,delays,resets";
    let cfg = Config {
        ec: Some("2:1".parse().unwrap()),
        faults: faults.parse().unwrap(),
        ..Config::default()
    };
    let n = env_u64("SIM_EC_SEEDS").unwrap_or(100);
    assert_seeds_clean(
        (0..n).map(|s| 50_000 + s).collect(),
        &cfg,
        &format!("SIM_EC=2:1 SIM_FAULTS={faults}"),
    );
}

/// Erasure-coded VDIs driven as users drive them (`Config::ec_vdis`: 8 requests in flight on
/// one handle, first writes racing, discards, bursts of adjacent writes that the client sends
/// as one change) under crashes, partitions, hung and slow nodes and resets: the client's
/// write batches, reconstruct-write and shared reads of the primary all run here. Nothing may
/// be lost, stale, unreadable or divergent.
#[test]
fn ec_vdi_seeds_with_crashes() {
    assert_ec_vdi_seeds_clean("2:1", "crashes,partitions,hangs,delays,resets");
}

/// [`ec_vdi_seeds_with_crashes`] at 2:2, where a crash is a power cut that wrote back part of
/// what its node had not synced (`power_cuts`): strips and notes come back as they were, as
/// set, mixed or torn, and every stripe must still read as one version and end whole.
#[test]
fn ec_vdi_seeds_with_power_cuts() {
    assert_ec_vdi_seeds_clean("2:2", "crashes,power_cuts,partitions,hangs,delays,resets");
}

/// `SIM_EC_VDIS_SEEDS` seeds (default 100) from 0 with erasure-coded VDIs of `scheme` under
/// `faults`.
fn assert_ec_vdi_seeds_clean(scheme: &str, faults: &str) {
    let cfg = Config {
        ec: Some(scheme.parse().unwrap()),
        ec_vdis: true,
        faults: faults.parse().unwrap(),
        ..Config::default()
    };
    let n = env_u64("SIM_EC_VDIS_SEEDS").unwrap_or(100);
    assert_seeds_clean(
        (0..n).collect(),
        &cfg,
        &format!("SIM_EC={scheme} SIM_EC_VDIS=1 SIM_FAULTS={faults}"),
    );
}

/// Runs `seeds` with `cfg` and fails naming every seed that broke (its first violation), with
/// the environment (`replay`) that replays one.
fn assert_seeds_clean(seeds: Vec<u64>, cfg: &Config, replay: &str) {
    let bad: Vec<String> = (run_many(seeds, cfg).into_iter())
        .filter_map(|r| Some(format!("seed {}: {}", r.seed, r.violations.first()?)))
        .collect();
    assert!(
        bad.is_empty(),
        "{} seed(s) broke (replay: {replay} SEED=...): {}",
        bad.len(),
        bad.join("; ")
    );
}
