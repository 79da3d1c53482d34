//! The `metadata` figures, on a cluster of their own: creating many VDIs, listing them with
//! dog, mounting sheepfs over them and `ls -l` of the mount; then a 1 TiB thin VDI: its
//! creation, first open through the mount, first 4 KiB write, and the nodes' disk use after.

use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result};
use serde_json::Value;

use super::cluster::{output, Bins, Cluster, Mount};
use super::plan::template;
use super::proc::check_interrupt;
use super::raid::tree_bytes;
use super::record::Recorder;
use super::settings::Settings;
use crate::figures::Figure;

/// Figures of this group.
pub const FIGURES: usize = 8;
const TIB: u64 = 1 << 40;
const MIB: f64 = (1u64 << 20) as f64;

/// Announces `fig`, times `f`, records the time in the figure's unit (s or ms).
fn timed_figure(rec: &mut Recorder, fig: &Figure, f: impl FnOnce() -> Result<()>) -> Result<()> {
    rec.announce(fig, "")?;
    let t0 = Instant::now();
    f()?;
    let secs = t0.elapsed().as_secs_f64();
    rec.record(fig, if fig.unit == "ms" { secs * 1e3 } else { secs })
}

pub fn run(s: &Settings, bins: &Bins, dir: &Path, rec: &mut Recorder) -> Result<()> {
    let n = s.matrix.metadata_vdis;
    eprintln!("bench: metadata: {n} VDIs on {} nodes", s.nodes);
    let cluster = Cluster::start(bins, dir, s.nodes, s.membership)?;
    cluster.format(s.copies, s.object_size)?;
    let fig = |job: &str, target: &str, unit: &str| {
        let mut f = template(
            "metadata",
            job,
            target,
            unit,
            vec![("vdis", Value::from(n))],
        );
        f.higher_is_better = false;
        f
    };
    timed_figure(rec, &fig("create-vdis", "dog", "s"), || {
        for i in 0..n {
            check_interrupt()?;
            cluster.create_vdi(&format!("meta{i:05}"), 1 << 30)?;
        }
        Ok(())
    })?;
    timed_figure(rec, &fig("list-vdis", "dog", "ms"), || {
        cluster.dog(&["vdi", "list"]).map(drop)
    })?;
    let mnt = dir.join("mnt");
    let log = dir.join("sheepfs.log");
    let mut mount = None;
    timed_figure(rec, &fig("mount", "sheepfs", "ms"), || {
        mount = Some(Mount::sheepfs(&cluster, &mnt, &log, &[])?);
        Ok(())
    })?;
    timed_figure(rec, &fig("ls-l", "sheepfs", "ms"), || {
        let mut cmd = Command::new("ls");
        cmd.arg("-l").arg(&mnt).stdout(Stdio::null());
        output(cmd, "ls -l of the mount").map(drop)
    })?;
    let before = disk_used(&cluster);
    thin_vdi(rec, &cluster, &mnt, &fig)?;
    let mut f = fig("disk-used", "nodes", "MiB");
    f.params
        .insert("before_1t_mib".into(), Value::from(before as f64 / MIB));
    rec.announce(&f, "")?;
    let after = disk_used(&cluster);
    rec.record(&f, after as f64 / MIB)?;
    drop(mount);
    Ok(())
}

/// The 1 TiB thin VDI: create, first open through the mount, first 4 KiB write (O_DIRECT).
fn thin_vdi(
    rec: &mut Recorder,
    cluster: &Cluster,
    mnt: &Path,
    fig: &impl Fn(&str, &str, &str) -> Figure,
) -> Result<()> {
    timed_figure(rec, &fig("create-1t", "dog", "ms"), || {
        cluster.create_vdi("huge", TIB)
    })?;
    let path = mnt.join("huge");
    let mut file = None;
    timed_figure(rec, &fig("open-1t", "sheepfs", "ms"), || {
        let f = File::options()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path)
            .with_context(|| format!("opening {}", path.display()))?;
        file = Some(f);
        Ok(())
    })?;
    let file = file.context("the 1 TiB VDI was not opened")?;
    let mut storage = vec![0xa5u8; 2 * 4096];
    let start = storage.as_ptr().align_offset(4096);
    let block = &mut storage[start..start + 4096];
    timed_figure(rec, &fig("write-4k-1t", "sheepfs", "ms"), || {
        file.write_at(block, TIB / 2)
            .with_context(|| format!("writing 4 KiB at 512 GiB of {}", path.display()))
            .map(drop)
    })
}

/// Bytes allocated on disk under every node's directory (the nodes are running).
fn disk_used(cluster: &Cluster) -> u64 {
    cluster.node_dirs().iter().map(|d| tree_bytes(d)).sum()
}
