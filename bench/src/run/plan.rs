//! The plan of the main cluster's figures: one [`Step`] per figure, built per group from the
//! profile's matrix, merged (a figure several groups need is measured once), and split into
//! key steps (goal figures and what they are compared with, run `--rounds` times, interleaved)
//! and the rest (run once).
//!
//! Figure ids are `<group>/<job>/<target>`. A sheepfs figure's `reference` is the bindfs figure
//! of the same job when one is planned (else the cache-off one); cache figures also carry
//! `params.reference_off`, the cache-off figure of the same job.

use std::collections::HashSet;

use serde_json::Value;

use super::fio::{Engine, FioJob};
use super::goals;
use super::settings::{size_label, Group, IopsRw, Matrix, Settings};
use crate::figures::Figure;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;

/// What a fio job runs against on the main cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// The raw file, O_DIRECT.
    Raw,
    /// `bindfs --multithreaded` over the raw file's directory.
    Bindfs,
    /// sheepfs without a cache.
    Off,
    /// sheepfs with the cache, evicted right before.
    Cold,
    /// sheepfs with the cache, fully read right before.
    Warm,
    /// Writes through the cache (writeback mode), fully read right before.
    Writeback,
}

impl Target {
    pub fn name(self) -> &'static str {
        match self {
            Target::Raw => "raw",
            Target::Bindfs => "bindfs",
            Target::Off => "off",
            Target::Cold => "cold",
            Target::Warm => "warm",
            Target::Writeback => "writeback",
        }
    }

    fn is_sheepfs(self) -> bool {
        !matches!(self, Target::Raw | Target::Bindfs)
    }
}

/// `dog` group operations, each over `--size` bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DogOp {
    /// `cp` of the source file to another file on the same disk.
    Copy,
    /// `cp`, then fsync of the copy.
    CopySync,
    /// `dog vdi read` to a file on the same disk.
    Read,
    /// `dog vdi write` over already written objects.
    Write,
    /// `dog vdi write` into a new VDI (every object created).
    WriteAlloc,
}

/// How a figure is measured.
#[derive(Debug, Clone, PartialEq)]
pub enum Work {
    Fio {
        job: FioJob,
        target: Target,
    },
    /// Cache resized to `pct` % of the file (+16M), evicted, warmed; 4k random reads at qd16.
    Sweep {
        pct: u32,
    },
    /// The sweep's job on the cache mount with the bench VDI in mode `off`: the same
    /// process and connections as the sweep points, without the cache's work.
    SweepModeOff,
    /// `cachectl flush` of a VDI holding `--size` of dirty data.
    Flush,
    Dog(DogOp),
}

/// One planned figure: its template (no runs yet) and how to measure it.
#[derive(Debug, Clone)]
pub struct Step {
    pub fig: Figure,
    pub work: Work,
}

impl Step {
    /// Runs of the figure in a round ([`FioJob::passes`]).
    pub fn passes(&self) -> usize {
        match &self.work {
            Work::Fio { job, .. } => job.passes,
            _ => 1,
        }
    }
}

/// The main cluster's steps: key ones (run every round) and the others (run once).
pub struct MainPlan {
    pub key: Vec<Step>,
    pub rest: Vec<Step>,
    /// Every figure id in group order (the report's order).
    pub order: Vec<String>,
}

impl MainPlan {
    pub fn build(s: &Settings) -> MainPlan {
        let m = &s.matrix;
        let mut steps = Vec::new();
        for g in &s.groups {
            steps.extend(match g {
                Group::Iops => iops(m),
                Group::Sweep => sweep(m),
                Group::Throughput => throughput(m),
                Group::Cache => cache(m),
                Group::Flush => flush(s.size),
                Group::Dog => dog(s.size),
                Group::Objsize
                | Group::Scaling
                | Group::Metadata
                | Group::Snapshot
                | Group::Handover
                | Group::Scale
                | Group::Raid => Vec::new(),
            });
        }
        let mut steps = merge(steps);
        let key_ids = goals::key_ids(steps.iter().map(|s| &s.fig), s.copies);
        if s.key_only {
            steps.retain(|s| key_ids.contains(&s.fig.id));
        }
        let order = steps.iter().map(|s| s.fig.id.clone()).collect();
        let (key, rest) = steps.into_iter().partition(|s| key_ids.contains(&s.fig.id));
        MainPlan { key, rest, order }
    }

    pub fn is_empty(&self) -> bool {
        self.key.is_empty() && self.rest.is_empty()
    }

    /// Every step, in plan order.
    #[cfg(test)]
    pub fn steps(&self) -> impl Iterator<Item = &Step> {
        self.key.iter().chain(&self.rest)
    }
}

/// Keeps the first step of each id (filling in a reference a later one has).
fn merge(steps: Vec<Step>) -> Vec<Step> {
    let mut out: Vec<Step> = Vec::new();
    let mut seen = HashSet::new();
    for s in steps {
        if seen.insert(s.fig.id.clone()) {
            out.push(s);
        } else if let Some(first) = out.iter_mut().find(|f| f.fig.id == s.fig.id) {
            if first.fig.reference.is_none() {
                first.fig.reference = s.fig.reference;
            }
        }
    }
    out
}

/// A figure template with its parameters.
pub fn template(
    group: &str,
    job: &str,
    target: &str,
    unit: &str,
    params: Vec<(&str, Value)>,
) -> Figure {
    let mut f = Figure::new(group, job, target, unit, Vec::new());
    f.params = params
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    f
}

/// One step per target of a fio job, with references set as the module doc says.
pub fn fio_steps(
    group: Group,
    name: &str,
    job: &FioJob,
    unit: &str,
    targets: &[Target],
) -> Vec<Step> {
    let id = |t: Target| format!("{}/{name}/{}", group.name(), t.name());
    let has = |t: Target| targets.contains(&t);
    targets
        .iter()
        .map(|&t| {
            let mut fig = template(group.name(), name, t.name(), unit, job.params());
            if t.is_sheepfs() && t != Target::Off {
                if has(Target::Off) {
                    fig.params
                        .insert("reference_off".into(), Value::from(id(Target::Off)));
                }
                fig.reference = has(Target::Bindfs)
                    .then(|| id(Target::Bindfs))
                    .or_else(|| has(Target::Off).then(|| id(Target::Off)));
            } else if t == Target::Off && has(Target::Bindfs) {
                fig.reference = Some(id(Target::Bindfs));
            }
            Step {
                fig,
                work: Work::Fio {
                    job: job.clone(),
                    target: t,
                },
            }
        })
        .collect()
}

const ALL_TARGETS: [Target; 5] = [
    Target::Raw,
    Target::Bindfs,
    Target::Off,
    Target::Cold,
    Target::Warm,
];

/// A 4k random job of the iops group and its name, e.g. `mix-4k-psync-nj4`.
pub fn iops_job(rw: IopsRw, engine: Engine) -> (String, FioJob) {
    let (label, fio_rw, mix) = match rw {
        IopsRw::Read => ("randread", "randread", None),
        IopsRw::Mix => ("mix", "randrw", Some(80)),
    };
    let mut job = FioJob::timed(fio_rw, 4 * KIB, engine);
    job.rwmixread = mix;
    (format!("{label}-4k-{}", engine.label()), job)
}

fn iops(m: &Matrix) -> Vec<Step> {
    let mut v = Vec::new();
    for (rw, engines) in &m.iops {
        for &e in engines {
            let (name, job) = iops_job(*rw, e);
            v.extend(fio_steps(Group::Iops, &name, &job, "IOPS", &ALL_TARGETS));
        }
    }
    v
}

/// The reference of the sweep: 4k random reads at qd16.
const SWEEP_BASE: &str = "randread-4k-libaio-qd16";

/// The sweep's job on the cache mount in mode `off` ([`Work::SweepModeOff`]): no goal, a
/// second reference for the sweep points (`ratio_mode_off`).
pub const SWEEP_MODE_OFF: &str = "sweep/randread-4k-modeoff/cache";

fn sweep(m: &Matrix) -> Vec<Step> {
    let (name, job) = iops_job(IopsRw::Read, Engine::Libaio(16));
    let refs = [Target::Bindfs, Target::Off];
    let mut v = fio_steps(Group::Iops, &name, &job, "IOPS", &refs);
    let mut fig = template(
        "sweep",
        "randread-4k-modeoff",
        "cache",
        "IOPS",
        job.params(),
    );
    debug_assert_eq!(fig.id, SWEEP_MODE_OFF);
    fig.reference = Some(format!("iops/{SWEEP_BASE}/off"));
    v.push(Step {
        fig,
        work: Work::SweepModeOff,
    });
    for &pct in &m.sweep_pcts {
        let mut params = job.params();
        params.push(("hit_pct", Value::from(pct)));
        let mut fig = template(
            "sweep",
            &format!("randread-4k-hit{pct}"),
            "cache",
            "IOPS",
            params.clone(),
        );
        fig.reference = Some(format!("iops/{SWEEP_BASE}/bindfs"));
        let mut off = template("sweep", &fig.job, "off", "IOPS", params);
        off.reference = fig.reference.clone();
        fig.params
            .insert("reference_off".into(), Value::from(off.id.clone()));
        fig.params
            .insert("reference_mode_off".into(), Value::from(SWEEP_MODE_OFF));
        v.push(Step {
            fig,
            work: Work::Sweep { pct },
        });
        // The point's own cache-off run, right after it: the goal compares the two in each
        // round (the points take a while to prepare, and this machine's speed drifts).
        v.push(Step {
            fig: off,
            work: Work::Fio {
                job: job.clone(),
                target: Target::Off,
            },
        });
    }
    v
}

/// Sequential jobs (libaio, depth 4): `read-64k`, `write-1m`.
pub fn seq_job(rw: &'static str, bs: u64) -> (String, FioJob) {
    (
        format!("{rw}-{}", size_label(bs)),
        FioJob::timed(rw, bs, Engine::Libaio(4)),
    )
}

fn throughput(m: &Matrix) -> Vec<Step> {
    let mut v = Vec::new();
    for &bs in &m.throughput_bs {
        let (name, job) = seq_job("read", bs);
        let t = [Target::Raw, Target::Bindfs, Target::Off, Target::Warm];
        v.extend(fio_steps(Group::Throughput, &name, &job, "MiB/s", &t));
        let (name, job) = seq_job("write", bs);
        let t = [Target::Raw, Target::Bindfs, Target::Off, Target::Writeback];
        v.extend(fio_steps(Group::Throughput, &name, &job, "MiB/s", &t));
    }
    v
}

fn cache(m: &Matrix) -> Vec<Step> {
    let mut v = Vec::new();
    for &d in &m.cache_depths {
        let (name, job) = iops_job(IopsRw::Read, Engine::Libaio(d));
        let t = [Target::Bindfs, Target::Off, Target::Cold, Target::Warm];
        v.extend(fio_steps(Group::Iops, &name, &job, "IOPS", &t));
    }
    for &d in &m.cache_depths {
        let job = FioJob::timed("randwrite", 4 * KIB, Engine::Libaio(d));
        let name = format!("randwrite-4k-libaio-qd{d}");
        let t = [Target::Bindfs, Target::Off, Target::Writeback];
        v.extend(fio_steps(Group::Cache, &name, &job, "IOPS", &t));
    }
    let (name, job) = seq_job("read", MIB);
    let t = [Target::Bindfs, Target::Off, Target::Warm];
    v.extend(fio_steps(Group::Throughput, &name, &job, "MiB/s", &t));
    let mut once = job;
    once.time_based = false;
    once.passes = m.first_read_passes;
    let t = [Target::Off, Target::Cold];
    v.extend(fio_steps(Group::Cache, "first-read-1m", &once, "MiB/s", &t));
    v
}

/// The cluster's durable sequential write speed (the flush figure's reference): one pass of
/// 1 MiB writes through the cache-off mount, then fsync (which flushes every replica), timed
/// together, as `cachectl flush` returns once the data is durable in the cluster.
pub const SEQ_WRITE_OFF: &str = "flush/write-1m-durable/off";

fn flush(size: u64) -> Vec<Step> {
    let (_, mut job) = seq_job("write", MIB);
    job.time_based = false;
    job.end_fsync = true;
    let mut v = fio_steps(
        Group::Flush,
        "write-1m-durable",
        &job,
        "MiB/s",
        &[Target::Off],
    );
    let mut fig = template(
        "flush",
        "cachectl-flush",
        "cache",
        "MiB/s",
        vec![("size", Value::from(size))],
    );
    fig.reference = Some(SEQ_WRITE_OFF.into());
    v.push(Step {
        fig,
        work: Work::Flush,
    });
    v
}

fn dog(size: u64) -> Vec<Step> {
    let cp = "dog/copy/cp";
    let ops = [
        ("copy", "cp", DogOp::Copy, None),
        ("copy", "cp-sync", DogOp::CopySync, None),
        ("read", "dog", DogOp::Read, Some(cp)),
        ("write", "dog", DogOp::Write, Some(cp)),
        ("write-alloc", "dog", DogOp::WriteAlloc, Some(cp)),
    ];
    ops.into_iter()
        .map(|(job, target, op, reference)| {
            let mut fig = template(
                "dog",
                job,
                target,
                "MiB/s",
                vec![("size", Value::from(size))],
            );
            fig.reference = reference.map(String::from);
            if op == DogOp::Write {
                let r = Value::from("dog/copy/cp-sync");
                fig.params.insert("reference_cp_sync".into(), r);
            }
            Step {
                fig,
                work: Work::Dog(op),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::run::settings::Profile;

    fn settings(profile: Profile) -> Settings {
        Settings {
            profile,
            nodes: 3,
            copies: 3,
            object_size: 4 * MIB,
            size: 16 * MIB,
            runtime_s: 1,
            rounds: 1,
            groups: Group::all().iter().copied().collect(),
            key_only: false,
            matrix: Matrix::of(profile),
            membership: Default::default(),
        }
    }

    #[test]
    fn key_only_keeps_the_key_steps_and_what_they_refer_to() {
        let all = MainPlan::build(&settings(Profile::Full));
        let key = MainPlan::build(&Settings {
            key_only: true,
            ..settings(Profile::Full)
        });
        assert!(key.rest.is_empty());
        let ids =
            |p: &MainPlan| -> Vec<String> { p.key.iter().map(|s| s.fig.id.clone()).collect() };
        assert_eq!(ids(&key), ids(&all));
        assert_eq!(key.order.len(), key.key.len());
        for s in &key.key {
            if let Some(r) = &s.fig.reference {
                assert!(key.order.contains(r), "{} -> {r}", s.fig.id);
            }
        }
    }

    #[test]
    fn ids_are_unique_and_references_planned() {
        for p in [Profile::Full, Profile::Quick, Profile::Smoke] {
            let plan = MainPlan::build(&settings(p));
            let ids: HashSet<&str> = plan.steps().map(|s| s.fig.id.as_str()).collect();
            assert_eq!(ids.len(), plan.steps().count(), "{p:?}");
            for s in plan.steps() {
                if let Some(r) = &s.fig.reference {
                    assert!(ids.contains(r.as_str()), "{p:?}: {} -> {r}", s.fig.id);
                }
            }
        }
    }

    #[test]
    fn full_profile_shape() {
        let plan = MainPlan::build(&settings(Profile::Full));
        let ids: Vec<&str> = plan.steps().map(|s| s.fig.id.as_str()).collect();
        // 16 iops jobs × 5 targets, 10 throughput jobs × 4, 5 sweep points with their
        // cache-off runs, and mode off.
        assert_eq!(ids.iter().filter(|i| i.starts_with("iops/")).count(), 80);
        assert_eq!(
            ids.iter().filter(|i| i.starts_with("throughput/")).count(),
            40
        );
        assert_eq!(ids.iter().filter(|i| i.starts_with("sweep/")).count(), 11);
        let warm = plan
            .key
            .iter()
            .find(|s| s.fig.id == "iops/randread-4k-libaio-qd1/warm");
        let warm = warm.expect("warm qd1 is a key figure");
        assert_eq!(
            warm.fig.reference.as_deref(),
            Some("iops/randread-4k-libaio-qd1/bindfs")
        );
        assert_eq!(
            warm.fig.params["reference_off"],
            "iops/randread-4k-libaio-qd1/off"
        );
        let cold = plan
            .steps()
            .find(|s| s.fig.id == "cache/first-read-1m/cold");
        let cold = cold.expect("first read");
        assert_eq!(
            cold.fig.reference.as_deref(),
            Some("cache/first-read-1m/off")
        );
        // Both sides of the first read in several passes, pass for pass; one elsewhere.
        let off = plan.steps().find(|s| s.fig.id == "cache/first-read-1m/off");
        assert_eq!(off.map(Step::passes), Some(8));
        assert_eq!(cold.passes(), 8);
        assert_eq!(warm.passes(), 1);
        assert!(plan.rest.iter().any(|s| s.fig.id == "iops/mix-4k-sync/raw"));
    }
}
