//! A formatted cluster with a sheepfs mount without cache and one filled VDI (`bench`): the
//! whole setup of the `objsize` and `scaling` figures, and the base of the main cluster.

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

use super::cluster::{no_lock_arg, output, Bins, Cluster, Mount};
use super::fio::{Engine, FioJob, FioResult};
use super::plan::{seq_job, Step};
use super::proc::{check_interrupt, Watched};
use super::record::{Outcome, Recorder};
use super::settings::Membership;

/// Name of the VDI the fio jobs run on.
pub const VDI: &str = "bench";

/// How the `bench` VDI gets its data.
pub enum Fill<'a> {
    /// `dog vdi write bench < FILE`.
    From(&'a Path),
    /// One pass of fio's sequential 1M writes through the mount.
    Fio,
}

/// The shape of a cluster.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub nodes: usize,
    pub copies: usize,
    pub object_size: u64,
    pub membership: Membership,
}

/// Fields drop in order: the mount before the cluster.
pub struct OffRig {
    pub off: Mount,
    pub cluster: Cluster,
    /// The VDI's size.
    pub size: u64,
    pub runtime_s: u64,
}

impl OffRig {
    /// Starts the nodes under `dir`, formats, creates and fills `bench`, mounts sheepfs.
    pub fn start(
        bins: &Bins,
        dir: &Path,
        shape: Shape,
        size: u64,
        runtime_s: u64,
        fill: Fill,
    ) -> Result<OffRig> {
        OffRig::start_with(bins, dir, shape, size, runtime_s, fill, &[])
    }

    /// [`OffRig::start`] with `vdi_args` added to `dog vdi create` (e.g. a scheme of its own).
    pub fn start_with(
        bins: &Bins,
        dir: &Path,
        shape: Shape,
        size: u64,
        runtime_s: u64,
        fill: Fill,
        vdi_args: &[&str],
    ) -> Result<OffRig> {
        let cluster = Cluster::start(bins, dir, shape.nodes, shape.membership)?;
        cluster.format(shape.copies, shape.object_size)?;
        cluster.create_vdi_with(VDI, size, vdi_args)?;
        if let Fill::From(src) = fill {
            cluster.write_vdi(VDI, src)?;
        }
        let off = Mount::sheepfs(
            &cluster,
            &dir.join("off"),
            &dir.join("sheepfs-off.log"),
            &no_lock_arg(bins)?,
        )?;
        let rig = OffRig {
            off,
            cluster,
            size,
            runtime_s,
        };
        if let Fill::Fio = fill {
            let job = FioJob {
                time_based: false,
                ..FioJob::timed("write", 1 << 20, Engine::Libaio(4))
            };
            job.run(&rig.file(), size, runtime_s)?;
        }
        Ok(rig)
    }

    /// An error naming the first of its daemons that has exited, with its log's end.
    pub fn check_alive(&mut self) -> Result<()> {
        self.off.check_alive()?;
        self.cluster.check_alive()
    }

    /// The VDI through the mount without cache.
    pub fn file(&self) -> PathBuf {
        self.off.path(VDI)
    }

    /// Brings the VDI's objects into the nodes' page cache.
    pub fn warm(&self) -> Result<()> {
        self.cluster.read_vdi(VDI, None)
    }

    /// The mount's sheepfs and every node.
    pub fn watched(&self) -> Vec<Watched> {
        let mut w = vec![self.off.watched()];
        w.extend(self.cluster.watched());
        w
    }

    /// One untimed pass of 1 MiB writes over `file`.
    ///
    /// A write timed to durability (the flush figure's reference, and the flush itself) is
    /// preceded by one through the cache-off mount over the VDI it writes, so that it
    /// overwrites objects every node has just written, wherever it comes in a run. Without
    /// it, in a whole run, the reference overwrote objects the groups before had just used,
    /// and the flush objects idle since the start, whose pages this VM's kernel had dropped
    /// (0.61x, against 1.27x in a flush-only run). On the profiling rig, a flush after
    /// dropping the page cache ran at 310 MiB/s for 4.4 CPU s, the next one at 440 MiB/s
    /// for 2.8. The pass is followed by `sync`, so its dirty pages (the nodes', and the cache
    /// files' when it wrote through the cache) are not written back inside the timed job.
    pub fn write_pass(&self, file: &Path) -> Result<()> {
        let (_, mut job) = seq_job("write", 1 << 20);
        job.time_based = false;
        job.run(file, self.size, self.runtime_s)?;
        sync_all()
    }

    /// Runs a fio step against the mount without cache, warmed first when it reads (and
    /// rewritten first when it is timed to durability: [`OffRig::write_pass`]).
    pub fn run_off_step(
        &self,
        rec: &mut Recorder,
        step: &Step,
        job: &FioJob,
        note: &str,
    ) -> Result<()> {
        rec.announce(&step.fig, note)?;
        if job.reads() {
            self.warm()?;
        }
        let file = self.file();
        if job.end_fsync {
            self.write_pass(&file)?;
        }
        run_fio(
            rec,
            step,
            job,
            &file,
            self.size,
            self.runtime_s,
            &self.watched(),
        )
    }
}

/// `err`, led by why a daemon died if `alive` says one did (a failed job is most often that).
pub fn blame(err: anyhow::Error, alive: Result<()>) -> anyhow::Error {
    match alive {
        Err(dead) if check_interrupt().is_ok() => err.context(format!("{dead:#}")),
        _ => err,
    }
}

/// Measures one run of `job` on `file` as a run of `step`'s figure.
pub fn run_fio(
    rec: &mut Recorder,
    step: &Step,
    job: &FioJob,
    file: &Path,
    size: u64,
    runtime_s: u64,
    procs: &[Watched],
) -> Result<()> {
    let iops = step.fig.unit == "IOPS";
    rec.measure(&step.fig, procs, || {
        let r: FioResult = job.run(file, size, runtime_s)?;
        Ok(Outcome {
            value: if iops { r.iops } else { r.mib_s },
            bytes: r.io_bytes,
        })
    })
    .map(drop)
}

/// `sync`: every dirty page of the machine written back.
pub fn sync_all() -> Result<()> {
    output(Command::new("sync"), "sync").map(drop)
}

/// Reads a whole file in 1 MiB pieces (with O_DIRECT: through the cache, no page cache).
pub fn read_whole(path: &Path, direct: bool) -> Result<()> {
    let mut opts = File::options();
    opts.read(true);
    if direct {
        opts.custom_flags(libc::O_DIRECT);
    }
    let mut f = opts
        .open(path)
        .with_context(|| format!("opening {}", path.display()))?;
    // O_DIRECT wants an aligned buffer: take the aligned 1 MiB inside a larger one.
    let mut storage = vec![0u8; (1 << 20) + 4096];
    let start = storage.as_ptr().align_offset(4096);
    let buf = &mut storage[start..start + (1 << 20)];
    loop {
        check_interrupt()?;
        let n = f
            .read(buf)
            .with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            return Ok(());
        }
    }
}

/// Writes `size` bytes of pseudo-random (incompressible) data to `path`.
pub fn write_random(path: &Path, size: u64) -> Result<()> {
    let mut f = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15 ^ size;
    let mut block = vec![0u8; 1 << 20];
    let mut left = size;
    while left > 0 {
        check_interrupt()?;
        for chunk in block.chunks_exact_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            chunk.copy_from_slice(&x.to_le_bytes());
        }
        let n = left.min(block.len() as u64) as usize;
        f.write_all(&block[..n])
            .with_context(|| format!("writing {}", path.display()))?;
        left -= n as u64;
    }
    f.sync_all()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_file_reads_back() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("f");
        write_random(&p, (1 << 20) + 5).unwrap();
        assert_eq!(std::fs::metadata(&p).unwrap().len(), (1 << 20) + 5);
        let data = std::fs::read(&p).unwrap();
        assert_ne!(&data[..8], &data[8..16]);
        read_whole(&p, false).unwrap();
        assert!(read_whole(&d.path().join("none"), false).is_err());
    }
}
