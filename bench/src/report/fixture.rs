//! Synthetic reports for the tests of the report, the charts and compare: every group the
//! runner writes, with plausible numbers, references, goals, spreads, CPU and RSS.

use serde_json::json;

use crate::figures::{Config, Figure, Machine, Report, REPORT_VERSION};

/// A report with no figures.
pub fn empty() -> Report {
    Report {
        version: REPORT_VERSION,
        started: "2026-12-01T10:00:00Z".into(),
        finished: "2026-12-01T10:40:00Z".into(),
        command: "bench run --profile full".into(),
        machine: Machine {
            cpus: 2,
            mem_gib: 24.0,
            cpu_model: "AMD EPYC".into(),
            kernel: "6.1.0".into(),
            fs: "ext4".into(),
            fio_version: "fio-3.33".into(),
        },
        config: Config {
            nodes: 3,
            copies: 3,
            object_size: 4 << 20,
            file_mib: 1024,
            runtime_s: 10,
            rounds: 3,
            profile: "full".into(),
            membership: "local".into(),
        },
        figures: Vec::new(),
    }
}

/// A figure with parameters; three runs around `value` (±5 %).
pub fn fig(group: &str, job: &str, target: &str, unit: &str, value: f64) -> Figure {
    Figure::new(
        group,
        job,
        target,
        unit,
        vec![value * 0.95, value, value * 1.05],
    )
}

/// Sets the parameters of a figure from a JSON object.
pub fn with_params(mut f: Figure, params: serde_json::Value) -> Figure {
    if let serde_json::Value::Object(m) = params {
        f.params = m.into_iter().collect();
    }
    f
}

/// Points `f` at the figure `reference_target` of the same group and job in `figs`.
fn refer(f: &mut Figure, figs: &[Figure], reference_target: &str) {
    let id = format!("{}/{}/{reference_target}", f.group, f.job);
    if let Some(r) = figs.iter().find(|g| g.id == id) {
        f.ratio = Some(f.value / r.value);
        f.reference = Some(id);
    }
}

/// IOPS of a target at a queue shape: more depth helps, the cache helps most.
fn iops_at(target: &str, depth: f64) -> f64 {
    let base = match target {
        "raw" => 17000.0,
        "bindfs" => 30000.0,
        "off" => 7500.0,
        "cold" => 6800.0,
        _ => 36000.0,
    };
    base * depth.powf(0.55)
}

const TARGETS: [&str; 5] = ["raw", "bindfs", "off", "cold", "warm"];

fn iops_group(figs: &mut Vec<Figure>) {
    for kind in ["randread", "mix"] {
        for qd in [1u32, 4, 16, 64] {
            for t in TARGETS {
                let job = format!("{kind}-4k-libaio-qd{qd}");
                let p = json!({"rw": kind, "bs": 4096, "iodepth": qd, "engine": "libaio"});
                figs.push(with_params(
                    fig("iops", &job, t, "IOPS", iops_at(t, f64::from(qd))),
                    p,
                ));
            }
        }
        for nj in [1u32, 4, 10] {
            for t in TARGETS {
                let job = format!("{kind}-4k-psync-nj{nj}");
                let p =
                    json!({"rw": kind, "bs": 4096, "iodepth": 1, "numjobs": nj, "engine": "psync"});
                let v = iops_at(t, f64::from(nj)) * 0.8;
                figs.push(with_params(fig("iops", &job, t, "IOPS", v), p));
            }
        }
    }
}

fn sweep_group(figs: &mut Vec<Figure>) {
    let p = json!({"rw": "randread", "bs": 4096, "iodepth": 16, "engine": "libaio"});
    figs.push(with_params(
        fig("sweep", "randread-4k-qd16", "off", "IOPS", 38000.0),
        p,
    ));
    for (pct, hit, iops) in [
        (0, 0.0, 16500.0),
        (25, 0.09, 30000.0),
        (50, 0.33, 38500.0),
        (75, 0.63, 47800.0),
        (100, 0.99, 183000.0),
    ] {
        let job = format!("randread-4k-qd16-hit{pct}");
        let p = json!({"hit_pct": pct, "hit_ratio_measured": hit, "iodepth": 16});
        let mut f = with_params(fig("sweep", &job, "cache", "IOPS", iops), p);
        f.ratio = Some(iops / 38000.0);
        f.reference = Some("sweep/randread-4k-qd16/off".into());
        figs.push(f);
    }
}

fn throughput_group(figs: &mut Vec<Figure>) {
    for dir in ["read", "write"] {
        for (label, bs) in [
            ("16k", 16384u64),
            ("64k", 65536),
            ("1m", 1 << 20),
            ("4m", 4 << 20),
        ] {
            for t in ["raw", "bindfs", "off", "warm", "writeback"] {
                if dir == "read" && t == "writeback" {
                    continue;
                }
                let scale = (bs as f64 / 16384.0).powf(0.4);
                let base = match t {
                    "raw" => 600.0,
                    "bindfs" => 900.0,
                    "off" => 250.0,
                    _ => 1100.0,
                };
                let job = format!("{dir}-{label}");
                let p = json!({"rw": dir, "bs": bs, "iodepth": 4, "engine": "libaio"});
                figs.push(with_params(
                    fig("throughput", &job, t, "MiB/s", base * scale),
                    p,
                ));
            }
        }
    }
}

fn objsize_group(figs: &mut Vec<Figure>) {
    for dir in ["read", "write"] {
        for obj in [1u64 << 20, 4 << 20, 16 << 20] {
            for (label, bs) in [("64k", 65536u64), ("1m", 1 << 20), ("4m", 4 << 20)] {
                let v = 200.0 * (obj as f64).log2() / 20.0 * (bs as f64 / 65536.0).powf(0.3);
                let job = format!("{dir}-{label}-obj{}m", obj >> 20);
                let p = json!({"rw": dir, "bs": bs, "object_size": obj});
                figs.push(with_params(fig("objsize", &job, "off", "MiB/s", v), p));
            }
        }
    }
}

/// The raid table: 3 copies and 4:2 at two object sizes and block sizes.
fn raid_group(figs: &mut Vec<Figure>) {
    for (scheme, target, w) in [("3", "c3", 1.0), ("4:2", "ec4-2", 1.3)] {
        for obj in [1u64 << 20, 4 << 20] {
            for dir in ["write", "read"] {
                for (label, bs) in [("4k", 4096u64), ("1m", 1 << 20)] {
                    let v = w * (bs as f64 / 4096.0).powf(0.5) * (obj >> 20) as f64;
                    let job = format!("{dir}-{label}-obj{}m", obj >> 20);
                    let p = json!({"rw": dir, "bs": bs, "object_size": obj, "redundancy": scheme});
                    figs.push(with_params(fig("raid", &job, target, "MiB/s", v), p));
                }
            }
            let p = json!({"object_size": obj, "redundancy": scheme});
            let job = format!("raw-per-gib-obj{}m", obj >> 20);
            figs.push(with_params(
                fig("raid", &job, target, "GiB/GiB", w * 1.5),
                p,
            ));
        }
    }
}

fn other_groups(figs: &mut Vec<Figure>) {
    figs.push(fig("flush", "flush-1g", "cachectl", "MiB/s", 190.0));
    figs.push(fig("flush", "write-1m", "off", "MiB/s", 146.0));
    figs.push(fig("metadata", "vdi-create", "dog", "ms", 12.5));
    figs.push(fig("metadata", "cache-index-rebuild", "sheepfs", "s", 1.8));
    for nodes in [3, 6] {
        let p = json!({"nodes": nodes, "copies": 3});
        let job = format!("write-1m-n{nodes}");
        figs.push(with_params(
            fig("scaling", &job, "off", "MiB/s", 80.0 * f64::from(nodes)),
            p,
        ));
    }
}

/// A figure in ms with these runs.
fn ms(job: &str, target: &str, runs: &[f64]) -> Figure {
    let mut f = Figure::new("handover", job, target, "ms", runs.to_vec());
    f.higher_is_better = false;
    f
}

/// Three rounds of the hand-over with 256 MiB dirty (the third without log lines), and three
/// bare hand-overs on each kind of mount.
fn handover_group(figs: &mut Vec<Figure>) {
    let dirty = json!({"dirty_bytes": 256u64 << 20});
    figs.push(with_params(
        ms("push-dirty", "cache", &[800.0, 820.0, 760.0]),
        dirty.clone(),
    ));
    let mut hand = with_params(
        ms("handover-dirty", "cache", &[870.0, 900.0, 840.0]),
        json!({
            "dirty_bytes": 256u64 << 20,
            "holder_ms": [790.0, 790.0, null],
            "asker_ms": [850.0, 850.0, null],
            "write_ms": [868.0, 870.0, 838.0],
        }),
    );
    hand.reference = Some("handover/push-dirty/cache".into());
    hand.ratio = Some(870.0 / 800.0);
    figs.push(hand);
    let mut over = with_params(ms("overhead-dirty", "cache", &[70.0, 80.0, 80.0]), dirty);
    over.goal = Some("< 100 ms over the push of the dirty data".into());
    over.goal_met = Some(true);
    figs.push(over);
    let mut bare = with_params(
        ms("handover-bare", "cache", &[55.0, 60.0, 65.0]),
        json!({
            "holder_ms": [30.0, 30.0, 30.0],
            "asker_ms": [45.0, 45.0, 45.0],
            "write_ms": [53.0, 55.0, 63.0],
        }),
    );
    bare.reference = Some("handover/write-holder/cache".into());
    figs.push(bare);
    figs.push(ms("write-holder", "cache", &[3.5, 4.0, 4.5]));
    figs.push(ms("handover-bare", "off", &[35.0, 40.0, 45.0]));
    figs.push(ms("write-holder", "off", &[2.5, 3.0, 3.5]));
}

/// Adds references, goals, CPU and RSS the way the runner does.
fn annotate(figs: &mut [Figure]) {
    let snapshot = figs.to_vec();
    for f in figs.iter_mut() {
        match (f.group.as_str(), f.target.as_str()) {
            ("iops" | "throughput", "off" | "warm" | "writeback") => refer(f, &snapshot, "bindfs"),
            ("iops", "cold") => refer(f, &snapshot, "off"),
            _ => {}
        }
        let goal = match f.target.as_str() {
            "warm" => 0.9,
            "off" => 0.4,
            _ => 0.0,
        };
        if goal > 0.0 && f.group == "iops" && f.job.ends_with("libaio-qd1") {
            f.goal = Some(format!("≥ {goal}× bindfs"));
            f.goal_met = Some(f.ratio.unwrap_or(0.0) >= goal);
            f.goal_ratio = f.ratio;
        }
        if ["off", "cold", "warm", "writeback", "cache"].contains(&f.target.as_str()) {
            f.cpu_s_per_gib = Some(1.25);
            f.peak_rss_kib = [("sheepfs", 72_000), ("sheep0", 51_000), ("sheep1", 64_000)]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect();
        }
    }
    if let Some(f) = figs.iter_mut().find(|f| f.id == "flush/flush-1g/cachectl") {
        f.ratio = Some(190.0 / 146.0);
        f.reference = Some("flush/write-1m/off".into());
        f.goal = Some("≥ 0.8× off".into());
        f.goal_met = Some(true);
        f.goal_ratio = f.ratio;
        let rounds = serde_json::json!([1.25, 190.0 / 146.0, 1.5]);
        f.params.insert("goal_ratio_rounds".into(), rounds);
    }
}

/// A report with every group the runner writes.
/// Group "scale": joins and kills at 10, 50 and 200 nodes, restarts at 10^4 to 10^6 objects.
fn scale_group(figs: &mut Vec<Figure>) {
    for (nodes, joiner, all) in [(10, 3.0, 2.1), (50, 3.0, 2.0), (200, 3.0, 2.0)] {
        let p = json!({"nodes": nodes, "objects_per_node": 150000, "copies": 3});
        for (job, target, v) in [
            ("join", "joiner", joiner),
            ("join", "all", all),
            ("kill", "all", 1.9),
        ] {
            let f = fig(
                "scale",
                &format!("{job}-{nodes}"),
                target,
                "entries/object",
                v,
            );
            figs.push(with_params(f, p.clone()));
        }
    }
    for (objects, ms) in [(10_000, 500.0), (100_000, 540.0), (1_000_000, 900.0)] {
        let p = json!({"nodes": 2, "objects_per_node": objects});
        let f = fig("scale", &format!("restart-{objects}"), "plan", "ms", ms);
        figs.push(with_params(f, p));
    }
}

pub fn full() -> Report {
    let mut figs = Vec::new();
    iops_group(&mut figs);
    sweep_group(&mut figs);
    throughput_group(&mut figs);
    objsize_group(&mut figs);
    raid_group(&mut figs);
    other_groups(&mut figs);
    annotate(&mut figs);
    handover_group(&mut figs);
    scale_group(&mut figs);
    Report {
        figures: figs,
        ..empty()
    }
}
