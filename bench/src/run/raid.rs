//! The `raid` group: the Linux RAID HOWTO's benchmark table for our redundancy schemes.
//!
//! One cluster of `raid_nodes` nodes per scheme (2 and 3 copies, `2:1`, `4:2`) × object size,
//! side by side in one run, each with a VDI of that scheme behind a sheepfs mount without
//! cache. On each: sequential read and write by block size (the HOWTO's chunk size × block
//! size matrix, our chunk being the object), 4 KiB random reads and writes at qd16, the raw
//! bytes the nodes store per GiB written, and sequential 1 MiB reads with one node killed
//! (the last figure of a cluster: it is not restarted). Besides, in this process, the CPU
//! seconds per GiB that encoding a stripe and decoding one with y strips lost cost.
//!
//! Figure ids are `raid/<job>-obj<size>/<scheme>` with the scheme spelled `c3` or `ec4-2`;
//! every figure carries `redundancy`, `object_size` and (fio jobs) `bs` in its params.

use std::path::Path;

use anyhow::{Context, Result};
use serde_json::Value;

use super::cluster::Bins;
use super::fio::{Engine, FioJob};
use super::plan::{seq_job, template, Step, Work};
use super::record::{Outcome, Recorder};
use super::rig::{blame, Fill, OffRig, Shape};
use super::settings::{size_label, Settings};
use crate::figures::Figure;
use objstore_proto::ec::Codec;
use objstore_proto::redundancy::Redundancy;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: f64 = (1u64 << 30) as f64;

/// The group's name in figure ids.
const GROUP: &str = "raid";

/// A scheme as figure ids spell it: `c3`, `ec4-2`.
pub fn scheme_label(r: Redundancy) -> String {
    match r {
        Redundancy::Copies(n) => format!("c{n}"),
        Redundancy::Ec { data, parity } => format!("ec{data}-{parity}"),
    }
}

/// What one figure of a cluster measures.
#[derive(Debug, Clone)]
enum RaidWork {
    /// A fio job on the healthy cluster.
    Fio(FioJob),
    /// The bytes allocated under the nodes' object directories ÷ the bytes the fill wrote.
    Raw,
    /// The fio job after one node is killed.
    Degraded(FioJob),
}

struct RaidStep {
    fig: Figure,
    work: RaidWork,
}

/// One cluster: its scheme, object size and figures.
struct RaidCluster {
    scheme: Redundancy,
    object_size: u64,
    steps: Vec<RaidStep>,
}

/// Every cluster of the group and the codec figures.
pub struct RaidStage {
    nodes: usize,
    file_size: u64,
    membership: super::settings::Membership,
    clusters: Vec<RaidCluster>,
    codec: Vec<Figure>,
}

/// A figure template of the group with the cluster's parameters.
fn raid_fig(
    job: &str,
    scheme: Redundancy,
    object_size: u64,
    unit: &str,
    mut params: Vec<(&str, Value)>,
) -> Figure {
    params.push(("redundancy", Value::from(scheme.to_string())));
    params.push(("object_size", Value::from(object_size)));
    let job = format!("{job}-obj{}", size_label(object_size));
    template(GROUP, &job, &scheme_label(scheme), unit, params)
}

impl RaidStage {
    pub fn new(s: &Settings) -> RaidStage {
        let m = &s.matrix;
        let mut clusters = Vec::new();
        for &scheme in &m.raid_schemes {
            for &obj in &m.raid_objects {
                let mut steps = Vec::new();
                let nodes = m.raid_nodes;
                let fio = |job: &str, fio: FioJob, unit: &str| {
                    let mut params = fio.params();
                    params.push(("nodes", Value::from(nodes)));
                    let fig = raid_fig(job, scheme, obj, unit, params);
                    RaidStep {
                        fig,
                        work: RaidWork::Fio(fio),
                    }
                };
                for &bs in &m.raid_bs {
                    for rw in ["write", "read"] {
                        let (name, job) = seq_job(rw, bs);
                        steps.push(fio(&name, job, "MiB/s"));
                    }
                }
                for rw in ["randwrite", "randread"] {
                    let engine = Engine::Libaio(16);
                    let job = FioJob::timed(rw, 4 * KIB, engine);
                    steps.push(fio(&format!("{rw}-4k-{}", engine.label()), job, "IOPS"));
                }
                steps.push(RaidStep {
                    fig: raid_fig("raw-per-gib", scheme, obj, "GiB/GiB", Vec::new()),
                    work: RaidWork::Raw,
                });
                let (name, job) = seq_job("read", MIB);
                let mut fig = raid_fig(&format!("{name}-down"), scheme, obj, "MiB/s", job.params());
                fig.reference = Some(raid_fig(&name, scheme, obj, "MiB/s", Vec::new()).id);
                steps.push(RaidStep {
                    fig,
                    work: RaidWork::Degraded(job),
                });
                clusters.push(RaidCluster {
                    scheme,
                    object_size: obj,
                    steps,
                });
            }
        }
        let codec = (m.raid_schemes.iter())
            .filter(|r| matches!(r, Redundancy::Ec { .. }))
            .flat_map(|&r| {
                ["encode", "decode"].map(|what| {
                    let mut f = raid_fig(what, r, s.object_size, "CPU s/GiB", Vec::new());
                    f.higher_is_better = false;
                    f
                })
            })
            .collect();
        RaidStage {
            nodes: m.raid_nodes,
            file_size: s.size.min(m.raid_file_cap),
            membership: s.membership,
            clusters,
            codec,
        }
    }

    /// Every figure id, in order, and the number of measurements.
    pub fn plan(&self, rec: &mut Recorder) {
        let ids: Vec<&str> = (self.clusters.iter())
            .flat_map(|c| c.steps.iter().map(|s| s.fig.id.as_str()))
            .chain(self.codec.iter().map(|f| f.id.as_str()))
            .collect();
        let n = ids.len();
        rec.plan(ids, n);
    }

    /// The codec figures, then each cluster in turn under `work`: started, measured, removed.
    pub fn run(&self, bins: &Bins, work: &Path, runtime_s: u64, rec: &mut Recorder) -> Result<()> {
        for fig in &self.codec {
            rec.announce(fig, "")?;
            let scheme: Redundancy = fig.params["redundancy"]
                .as_str()
                .and_then(|r| r.parse().ok())
                .expect("a scheme the stage wrote");
            let decode = fig.job.starts_with("decode");
            let object_size = fig.params["object_size"].as_u64().unwrap_or(4 * MIB);
            rec.measure(fig, &[], || coding_cost(scheme, object_size, decode))?;
        }
        for c in &self.clusters {
            let dir = work.join(format!(
                "{GROUP}-{}-obj{}",
                scheme_label(c.scheme),
                size_label(c.object_size)
            ));
            eprintln!(
                "bench: {GROUP}: {} nodes, VDI with --copies {}, {} objects, {} MiB file",
                self.nodes,
                c.scheme,
                size_label(c.object_size),
                self.file_size / MIB
            );
            // N copies: the cluster's own number (a VDI may not differ); x:y: a VDI of its
            // own on a cluster of 3 copies (its inode's).
            let copies = match c.scheme {
                Redundancy::Copies(n) => n as usize,
                Redundancy::Ec { .. } => 3.min(self.nodes),
            };
            let shape = Shape {
                nodes: self.nodes,
                copies,
                object_size: c.object_size,
                membership: self.membership,
            };
            let scheme = c.scheme.to_string();
            let vdi_args: &[&str] = match c.scheme {
                Redundancy::Copies(_) => &[],
                Redundancy::Ec { .. } => &["--copies", scheme.as_str(), "--experimental"],
            };
            let mut rig = OffRig::start_with(
                bins,
                &dir,
                shape,
                self.file_size,
                runtime_s,
                Fill::Fio,
                vdi_args,
            )?;
            for step in &c.steps {
                self.run_step(&mut rig, rec, step)
                    .map_err(|e| blame(e, rig.check_alive()))?;
            }
            drop(rig);
            std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
        }
        Ok(())
    }

    fn run_step(&self, rig: &mut OffRig, rec: &mut Recorder, step: &RaidStep) -> Result<()> {
        let as_step = |job: &FioJob| Step {
            fig: step.fig.clone(),
            work: Work::Fio {
                job: job.clone(),
                target: super::plan::Target::Off,
            },
        };
        match &step.work {
            RaidWork::Fio(job) => rig.run_off_step(rec, &as_step(job), job, ""),
            RaidWork::Raw => {
                rec.announce(&step.fig, "")?;
                let dirs = rig.cluster.node_dirs();
                let written = rig.size;
                rec.measure(&step.fig, &[], || {
                    let raw: u64 = dirs.iter().map(|d| tree_bytes(&d.join("obj"))).sum();
                    Ok(Outcome {
                        value: raw as f64 / written as f64,
                        bytes: 0,
                    })
                })
                .map(drop)
            }
            RaidWork::Degraded(job) => {
                // The last node: the mount talks to the first that answers.
                rig.cluster.kill(self.nodes - 1);
                rig.run_off_step(rec, &as_step(job), job, " (one node killed)")
            }
        }
    }
}

/// Bytes the disk gives to every file under `dir` (0 if it is missing): allocated blocks, as
/// `du` counts them, not apparent lengths. An object file's header reserves room for the sums
/// of the largest object (68 KiB) but a strip's sums fill only its first block: the rest is a
/// hole, which takes no space. The tree may be a running node's: a file renamed or removed
/// between the listing and its stat counts nothing (the metadata group's `disk-used` failed
/// on such a file when it stat'ed with `?`).
pub(super) fn tree_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => tree_bytes(&e.path()),
            Ok(_) => e.metadata().map_or(0, |m| m.blocks() * 512),
            Err(_) => 0,
        })
        .sum()
}

/// Data coded per coding figure.
const CODED: u64 = 256 * MIB;

/// CPU seconds (this thread's) per GiB of objects encoded whole, or decoded with `parity`
/// data strips lost (the worst case a read meets).
fn coding_cost(scheme: Redundancy, object_size: u64, decode: bool) -> Result<Outcome> {
    let codec = Codec::new(scheme, object_size).map_err(anyhow::Error::msg)?;
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let object: Vec<u8> = (0..object_size)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    let rounds = (CODED / object_size).max(1);
    let strips = codec.encode(&object);
    let started = thread_cpu();
    for _ in 0..rounds {
        if decode {
            let mut have: Vec<Option<Vec<u8>>> = strips.iter().cloned().map(Some).collect();
            for s in have.iter_mut().take(codec.parity()) {
                *s = None;
            }
            codec
                .reconstruct(&mut have)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            std::hint::black_box(&have);
        } else {
            std::hint::black_box(codec.encode(std::hint::black_box(&object)));
        }
    }
    // A decode's time includes copying the strips it starts from, as a read's decode does.
    let cpu = (thread_cpu() - started).max(1e-9);
    let bytes = rounds * object_size;
    Ok(Outcome {
        value: cpu / (bytes as f64 / GIB),
        bytes: 0,
    })
}

/// This thread's CPU time in seconds.
fn thread_cpu() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given; the clock id is a constant.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scheme_labels() {
        assert_eq!(scheme_label(Redundancy::Copies(3)), "c3");
        assert_eq!(scheme_label("4:2".parse().unwrap()), "ec4-2");
    }

    #[test]
    fn coding_costs_are_positive() {
        let r: Redundancy = "2:1".parse().unwrap();
        for decode in [false, true] {
            let o = coding_cost(r, MIB, decode).unwrap();
            assert!(
                o.value > 0.0 && o.value.is_finite(),
                "{decode}: {}",
                o.value
            );
        }
    }

    #[test]
    fn tree_bytes_counts_allocated_blocks_of_nested_files() {
        use std::os::unix::fs::FileExt;
        let d = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(d.path().join("a/b")).unwrap();
        std::fs::write(d.path().join("x"), vec![1u8; 8192]).unwrap();
        // 1 MiB long, one block written at its end: a hole before it takes no space.
        let f = std::fs::File::create(d.path().join("a/b/y")).unwrap();
        f.write_all_at(&[1u8; 4096], (1 << 20) - 4096).unwrap();
        f.sync_all().unwrap();
        std::fs::File::open(d.path().join("x"))
            .unwrap()
            .sync_all()
            .unwrap();
        let n = tree_bytes(d.path());
        assert!((8192 + 4096..=8192 + 4096 + 16384).contains(&n), "{n}");
        assert_eq!(tree_bytes(&d.path().join("none")), 0);
    }
}
