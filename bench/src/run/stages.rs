//! Figures measured on clusters of their own: `objsize` (one formatted cluster per object
//! size) and `scaling` (one per nodes × copies), both through sheepfs without cache.

use std::path::Path;

use anyhow::{Context, Result};
use serde_json::Value;

use super::cluster::Bins;
use super::fio::{Engine, FioJob};
use super::plan::{fio_steps, iops_job, seq_job, Step, Target, Work};
use super::record::Recorder;
use super::rig::{blame, Fill, OffRig, Shape};
use super::settings::{size_label, Group, IopsRw, Settings};

const MIB: u64 = 1 << 20;

/// Clusters of their own, each with its figures.
pub struct OffStage {
    group: Group,
    file_size: u64,
    clusters: Vec<(Shape, Vec<Step>)>,
}

impl OffStage {
    /// Object size × block size, sequential read and write.
    pub fn objsize(s: &Settings) -> OffStage {
        let file = s.objsize_file();
        let clusters = s
            .matrix
            .objsize_objects
            .iter()
            .map(|&obj| {
                let shape = Shape {
                    nodes: s.nodes,
                    copies: s.copies,
                    object_size: obj,
                    membership: s.membership,
                };
                let mut steps = Vec::new();
                for &bs in &s.matrix.objsize_bs {
                    for rw in ["read", "write"] {
                        let (name, job) = seq_job(rw, bs);
                        let name = format!("{name}-obj{}", size_label(obj));
                        steps.extend(off_steps(Group::Objsize, &name, &job, "MiB/s", shape, file));
                    }
                }
                (shape, steps)
            })
            .collect();
        OffStage {
            group: Group::Objsize,
            file_size: file,
            clusters,
        }
    }

    /// Nodes × copies: 4k random reads at qd16, 1M sequential write and read.
    pub fn scaling(s: &Settings) -> OffStage {
        let file = s.scaling_file();
        let clusters = s
            .matrix
            .scaling
            .iter()
            .map(|&(nodes, copies)| {
                let shape = Shape {
                    nodes,
                    copies,
                    object_size: s.object_size,
                    membership: s.membership,
                };
                let suffix = format!("n{nodes}c{copies}");
                let (rr, rr_job) = iops_job(IopsRw::Read, Engine::Libaio(16));
                let (w, w_job) = seq_job("write", MIB);
                let (r, r_job) = seq_job("read", MIB);
                let mut steps = off_steps(
                    Group::Scaling,
                    &format!("{rr}-{suffix}"),
                    &rr_job,
                    "IOPS",
                    shape,
                    file,
                );
                steps.extend(off_steps(
                    Group::Scaling,
                    &format!("{w}-{suffix}"),
                    &w_job,
                    "MiB/s",
                    shape,
                    file,
                ));
                steps.extend(off_steps(
                    Group::Scaling,
                    &format!("{r}-{suffix}"),
                    &r_job,
                    "MiB/s",
                    shape,
                    file,
                ));
                (shape, steps)
            })
            .collect();
        OffStage {
            group: Group::Scaling,
            file_size: file,
            clusters,
        }
    }

    /// Every figure id, in order, and the number of measurements.
    pub fn plan(&self, rec: &mut Recorder) {
        let ids: Vec<&str> = self
            .clusters
            .iter()
            .flat_map(|(_, steps)| steps.iter().map(|s| s.fig.id.as_str()))
            .collect();
        let n = ids.len();
        rec.plan(ids, n);
    }

    /// Starts each cluster in turn under `work`, measures its figures, stops and removes it.
    pub fn run(&self, bins: &Bins, work: &Path, runtime_s: u64, rec: &mut Recorder) -> Result<()> {
        for (shape, steps) in &self.clusters {
            let dir = work.join(format!(
                "{}-n{}c{}-obj{}",
                self.group.name(),
                shape.nodes,
                shape.copies,
                size_label(shape.object_size)
            ));
            eprintln!(
                "bench: {}: {} nodes, {} copies, {} objects, {} MiB file",
                self.group.name(),
                shape.nodes,
                shape.copies,
                size_label(shape.object_size),
                self.file_size / MIB
            );
            let mut rig = OffRig::start(bins, &dir, *shape, self.file_size, runtime_s, Fill::Fio)?;
            for step in steps {
                if let Work::Fio { job, .. } = &step.work {
                    rig.run_off_step(rec, step, job, "")
                        .map_err(|e| blame(e, rig.check_alive()))?;
                }
            }
            drop(rig);
            std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
        }
        Ok(())
    }
}

/// A fio step on the mount without cache of a cluster of `shape`.
fn off_steps(
    group: Group,
    name: &str,
    job: &FioJob,
    unit: &str,
    shape: Shape,
    file: u64,
) -> Vec<Step> {
    let mut steps = fio_steps(group, name, job, unit, &[Target::Off]);
    for s in &mut steps {
        let p = &mut s.fig.params;
        p.insert("nodes".into(), Value::from(shape.nodes));
        p.insert("copies".into(), Value::from(shape.copies));
        p.insert("object_size".into(), Value::from(shape.object_size));
        p.insert("file_mib".into(), Value::from(file / MIB));
    }
    steps
}
