//! The `snapshot` figures (issue 26), on a cluster of their own with a cache-off mount:
//! - `snapshot-100g` and `clone-100g`: `dog vdi snapshot` and `dog vdi clone` of a 100 GiB VDI
//!   (median of 5 each; goal under 100 ms);
//! - `write-4k-first-qd16`: one 4 KiB O_DIRECT write into every object of a VDI of the run's
//!   size (at least 2 GiB) at iodepth 16 (fio, strided zones of one object): `shared`, a fresh clone of a
//!   snapshot whose objects are all written, so every write makes the clone's own copy;
//!   `unshared`, the same writes again right after, into the objects the clone now owns;
//!   `new`, into a new empty
//!   VDI (each write creates its object). Goal: shared ≥ 0.5× unshared;
//! - `randread-4k-qd16`: 4 KiB random reads of a fresh clone (every object its parent's) and
//!   of the parent VDI itself. Goal: clone ≥ 0.9× parent.
//!
//! The fio pairs run `--rounds` times, alternating, so their goals compare runs of one round.

use std::path::Path;
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde_json::Value;

use super::cluster::{Bins, Cluster, Mount};
use super::fio::FioResult;
use super::plan::template;
use super::proc::check_interrupt;
use super::record::Recorder;
use super::settings::Settings;
use crate::figures::{median, Figure};

const GIB: u64 = 1 << 30;
/// The parent VDI is at least this large, so the first-write jobs make enough writes (one
/// per object) to time: 512 with 4 MiB objects.
const MIN_PARENT: u64 = 2 * GIB;

/// Figures of this group.
pub const FIGURES: usize = 7;

/// The ids of the goal figures' references.
pub const UNSHARED: &str = "snapshot/write-4k-first-qd16/unshared";
pub const PARENT: &str = "snapshot/randread-4k-qd16/parent";

fn fig(job: &str, target: &str, unit: &str, reference: Option<&str>) -> Figure {
    let mut f = template("snapshot", job, target, unit, Vec::new());
    f.reference = reference.map(str::to_string);
    f.higher_is_better = unit != "ms";
    f
}

/// fio at iodepth 16, O_DIRECT libaio, on `file` of `size` bytes, with `extra` arguments.
fn fio(file: &Path, size: u64, extra: &[String]) -> Result<FioResult> {
    let mut args = vec![
        "--name=snapshot".to_string(),
        format!("--filename={}", file.display()),
        format!("--size={size}"),
        "--bs=4k".into(),
        "--ioengine=libaio".into(),
        "--iodepth=16".into(),
        "--direct=1".into(),
        "--output-format=json".into(),
    ];
    args.extend_from_slice(extra);
    let out = Command::new("fio")
        .args(&args)
        .output()
        .context("starting fio")?;
    check_interrupt()?;
    if !out.status.success() {
        bail!(
            "fio {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    FioResult::parse(&String::from_utf8_lossy(&out.stdout))
}

/// One 4 KiB write at the start of every object of `file`, after a `sync` (untimed): no job
/// runs beside the write-back of what came before (the parent's whole write, a job's new
/// objects). Without it the first writes, which dirty new pages, were throttled by the
/// kernel's write-back of the parent's 3 × 2 GiB while the writes into objects already
/// written rewrote pages that were dirty already.
fn first_writes(file: &Path, size: u64, object_size: u64) -> Result<f64> {
    super::rig::sync_all()?;
    let n = size / object_size;
    Ok(fio(
        file,
        size,
        &[
            "--rw=write".into(),
            "--zonemode=strided".into(),
            "--zonesize=4k".into(),
            format!("--zonerange={object_size}"),
            format!("--io_size={}", n * 4096),
        ],
    )?
    .iops)
}

fn random_reads(file: &Path, size: u64, runtime_s: u64) -> Result<f64> {
    Ok(fio(
        file,
        size,
        &[
            "--rw=randread".into(),
            format!("--runtime={runtime_s}"),
            "--time_based".into(),
        ],
    )?
    .iops)
}

/// The median time of 5 runs of `f`, in ms.
fn median_ms(mut f: impl FnMut(usize) -> Result<()>) -> Result<f64> {
    let mut runs = Vec::new();
    for i in 0..5 {
        let t0 = Instant::now();
        f(i)?;
        runs.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    Ok(median(&runs))
}

pub fn run(s: &Settings, bins: &Bins, dir: &Path, rec: &mut Recorder) -> Result<()> {
    let size = s.size.max(MIN_PARENT);
    eprintln!(
        "bench: snapshot: {} nodes, {} MiB VDIs",
        s.nodes,
        size >> 20
    );
    let cluster = Cluster::start(bins, dir, s.nodes, s.membership)?;
    cluster.format(s.copies, s.object_size)?;
    let os = s.object_size;

    cluster.create_vdi("big", 100 * GIB)?;
    let f = fig("snapshot-100g", "dog", "ms", None);
    rec.announce(&f, "")?;
    let ms = median_ms(|i| {
        cluster
            .dog(&["vdi", "snapshot", "big", "-s", &format!("s{i}")])
            .map(drop)
    })?;
    rec.record(&f, ms)?;
    let f = fig("clone-100g", "dog", "ms", None);
    rec.announce(&f, "")?;
    let ms = median_ms(|i| {
        cluster
            .dog(&["vdi", "clone", "big@s0", &format!("bigclone{i}")])
            .map(drop)
    })?;
    rec.record(&f, ms)?;

    // The parent: every object written.
    let src = dir.join("src.raw");
    super::rig::write_random(&src, size)?;
    cluster.create_vdi("parent", size)?;
    cluster.write_vdi("parent", &src)?;
    let _ = std::fs::remove_file(&src);
    cluster.dog(&["vdi", "snapshot", "parent", "-s", "base"])?;

    let mnt = dir.join("mnt");
    let mount = Mount::sheepfs(&cluster, &mnt, &dir.join("sheepfs.log"), &[])?;
    for round in 0..s.rounds.max(1) {
        let note = format!(" (round {})", round + 1);
        let clone = format!("clone{round}");
        cluster.dog(&["vdi", "clone", "parent@base", &clone])?;
        let f = fig("randread-4k-qd16", "clone", "IOPS", Some(PARENT));
        rec.announce(&f, &note)?;
        rec.record(&f, random_reads(&mount.path(&clone), size, s.runtime_s)?)?;
        let f = fig("randread-4k-qd16", "parent", "IOPS", None);
        rec.announce(&f, &note)?;
        rec.record(&f, random_reads(&mount.path("parent"), size, s.runtime_s)?)?;

        let f = fig("write-4k-first-qd16", "shared", "IOPS", Some(UNSHARED));
        rec.announce(&f, &note)?;
        rec.record(&f, first_writes(&mount.path(&clone), size, os)?)?;
        let f = fig("write-4k-first-qd16", "unshared", "IOPS", None);
        rec.announce(&f, &note)?;
        // The same writes again: now into objects the clone owns.
        rec.record(&f, first_writes(&mount.path(&clone), size, os)?)?;

        let fresh = format!("fresh{round}");
        cluster.create_vdi(&fresh, size)?;
        let f = fig("write-4k-first-qd16", "new", "IOPS", Some(UNSHARED));
        rec.announce(&f, &note)?;
        rec.record(&f, first_writes(&mount.path(&fresh), size, os)?)?;
        for name in [&clone, &fresh] {
            cluster.dog(&["vdi", "delete", name])?;
        }
    }
    for id in [UNSHARED, PARENT] {
        rec.set_param(id, "vdi_bytes", Value::from(size));
    }
    drop(mount);
    Ok(())
}
