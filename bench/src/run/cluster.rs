//! The benchmark's cluster and mounts: testkit's, started the way the runner needs them, with
//! the dog calls the figures use.
//!
//! The runner's settings, against the tests' defaults: directories it names and removes
//! itself; sheep at `--log warn`; daemons sent SIGTERM (not SIGKILL) if the runner dies;
//! 30 s to start; and a graceful stop (SIGTERM, then SIGKILL after a grace) instead of a kill.
//!
//! Stopping order is the contract: mounts first (unmounted, then their daemon stopped with
//! SIGTERM, so sheepfs pushes its cache while the nodes are still up), nodes last. Owners hold
//! mounts in fields declared before their [`Cluster`], so drop order keeps it on errors too.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, Context, Result};
use testkit::cluster::{ClusterOptions, NodeLog};
use testkit::mount::MountOptions;
use testkit::ProcOptions;

pub use testkit::cluster::Bins;
pub use testkit::mount::{is_mounted, mounts_under, unmount};

use super::proc::Watched;
use super::settings::Membership;

/// How long the daemons may take to start.
const START: Duration = Duration::from_secs(30);

/// A daemon's ties: SIGTERM if the runner dies (sheepfs can still unmount), and up to
/// `grace` to exit on SIGTERM when stopped.
fn daemon(grace: Duration) -> ProcOptions {
    ProcOptions {
        death_signal: libc::SIGTERM,
        stop_grace: Some(grace),
    }
}

/// The binaries in `dir` (sheep, dog, sheepfs and cachectl), nothing built.
pub fn find_bins(dir: &Path) -> Result<Bins> {
    Bins::in_dir(dir).map_err(|e| {
        anyhow!(
            "{e}: build the binaries (cargo build --release --workspace --bins) or point \
             --bin-dir at them"
        )
    })
}

/// sheepfs's `--no-lock` if the binary has it, else nothing (binaries from before the mount
/// without a cache took the attachment lock): the cache-off mount writes the VDI that the
/// cache mount holds attached, which the lock would refuse.
pub fn no_lock_arg(bins: &Bins) -> Result<Vec<String>> {
    let mut cmd = Command::new(bins.path("sheepfs"));
    cmd.arg("--help");
    let help = output(cmd, "sheepfs --help")?;
    let has = String::from_utf8_lossy(&help).contains("--no-lock");
    Ok(has.then(|| "--no-lock".to_string()).into_iter().collect())
}

/// Runs `cmd` to completion; its stdout, or an error naming it with its stderr.
pub fn output(cmd: Command, what: &str) -> Result<Vec<u8>> {
    Ok(testkit::output(cmd, what)?)
}

/// Seconds `f` took.
pub fn timed<T>(f: impl FnOnce() -> Result<T>) -> Result<(T, f64)> {
    let t0 = Instant::now();
    let v = f()?;
    Ok((v, t0.elapsed().as_secs_f64()))
}

/// N sheep sharing one membership store, under a directory the runner names. Fields drop in
/// order: the nodes before their etcd.
pub struct Cluster {
    nodes: testkit::cluster::Cluster,
    /// Kept running while the nodes are (dropped after them).
    _etcd: Option<testkit::etcd::Etcd>,
}

impl Cluster {
    /// Starts `n` nodes in `dir` (and an etcd for them if asked) and waits until all are
    /// members.
    pub fn start(bins: &Bins, dir: &Path, n: usize, membership: Membership) -> Result<Cluster> {
        let etcd = match membership {
            Membership::Local => None,
            Membership::Etcd => Some(testkit::etcd::Etcd::try_start(1)?),
        };
        let opts = ClusterOptions {
            dir: Some(dir.into()),
            log: NodeLog::Arg("warn".into()),
            proc: daemon(Duration::from_secs(10)),
            timeout: START,
            driver: etcd.as_ref().map(|e| e.cluster_spec("/bench")),
            ..ClusterOptions::default()
        };
        Ok(Cluster {
            nodes: testkit::cluster::Cluster::try_start_with(bins, n, opts)?,
            _etcd: etcd,
        })
    }

    /// An error with the end of its log if a node has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        Ok(self.nodes.check_alive()?)
    }

    /// SIGKILL to node `i` (it stays down).
    pub fn kill(&mut self, i: usize) {
        self.nodes.kill9(i);
    }

    pub fn node_dirs(&self) -> Vec<PathBuf> {
        (0..self.nodes.nodes.len())
            .map(|i| self.nodes.node_dir(i))
            .collect()
    }

    /// Every node's address, comma-separated (for `--cluster` and `--address`).
    pub fn addresses(&self) -> String {
        self.nodes.addresses()
    }

    /// Runs dog; its stdout, or an error with its stderr.
    pub fn dog(&self, args: &[&str]) -> Result<Vec<u8>> {
        output(
            self.nodes.dog_command(args),
            &format!("dog {}", args.join(" ")),
        )
    }

    pub fn format(&self, copies: usize, object_size: u64) -> Result<()> {
        self.dog(&[
            "cluster",
            "format",
            "--copies",
            &copies.to_string(),
            "--object-size",
            &object_size.to_string(),
        ])
        .map(drop)
    }

    pub fn create_vdi(&self, name: &str, size: u64) -> Result<()> {
        self.create_vdi_with(name, size, &[])
    }

    /// `dog vdi create NAME SIZE` with `extra` arguments.
    pub fn create_vdi_with(&self, name: &str, size: u64, extra: &[&str]) -> Result<()> {
        let size = size.to_string();
        let mut args = vec!["vdi", "create", name, size.as_str()];
        args.extend_from_slice(extra);
        self.dog(&args).map(drop)
    }

    /// `dog vdi write NAME < src`.
    pub fn write_vdi(&self, name: &str, src: &Path) -> Result<()> {
        let input = File::open(src).with_context(|| format!("opening {}", src.display()))?;
        let mut cmd = self.nodes.dog_command(&["vdi", "write", name]);
        cmd.stdin(input);
        output(cmd, &format!("dog vdi write {name}")).map(drop)
    }

    /// `dog vdi read NAME > dst` (`None`: to /dev/null).
    pub fn read_vdi(&self, name: &str, dst: Option<&Path>) -> Result<()> {
        let mut cmd = self.nodes.dog_command(&["vdi", "read", name]);
        match dst {
            Some(p) => {
                cmd.stdout(File::create(p).with_context(|| format!("creating {}", p.display()))?)
            }
            None => cmd.stdout(Stdio::null()),
        };
        output(cmd, &format!("dog vdi read {name}")).map(drop)
    }

    /// The nodes, for CPU and RSS accounting: "sheep0", "sheep1", ...
    pub fn watched(&self) -> Vec<Watched> {
        self.nodes
            .nodes
            .iter()
            .flatten()
            .map(|n| Watched {
                label: n.name().into(),
                pid: n.pid(),
            })
            .collect()
    }

    pub fn bins(&self) -> &Bins {
        &self.nodes.bins
    }
}

/// A FUSE mount served by a daemon we started: unmounted, then the daemon stopped, on drop.
pub struct Mount {
    /// Key of its process in the figures' `peak_rss_kib`: "sheepfs" or "bindfs".
    label: &'static str,
    mount: testkit::mount::Mount,
}

impl Mount {
    /// sheepfs in the foreground on `dir` (created), with `extra` options, logging warnings
    /// and errors; waits for the mount.
    pub fn sheepfs(cluster: &Cluster, dir: &Path, log: &Path, extra: &[String]) -> Result<Mount> {
        Mount::sheepfs_logging(cluster, dir, log, extra, "warn")
    }

    /// [`Mount::sheepfs`] with `filter` as its `RUST_LOG` (e.g. `warn,sheepfs=info`).
    pub fn sheepfs_logging(
        cluster: &Cluster,
        dir: &Path,
        log: &Path,
        extra: &[String],
        filter: &str,
    ) -> Result<Mount> {
        let sheepfs = cluster.bins().path("sheepfs");
        let addresses = cluster.addresses();
        Mount::start("sheepfs", dir, log, |dir| {
            let mut cmd = Command::new(&sheepfs);
            testkit::auth::with_key(&mut cmd)
                .arg("--cluster")
                .arg(&addresses)
                .arg(dir)
                .arg("--foreground")
                .arg("--log-file")
                .arg(log)
                .args(extra)
                .env("RUST_LOG", filter);
            cmd
        })
    }

    /// `bindfs --multithreaded -f SRC DIR`.
    pub fn bindfs(src: &Path, dir: &Path, log: &Path) -> Result<Mount> {
        Mount::start("bindfs", dir, log, |dir| {
            let mut cmd = Command::new("bindfs");
            cmd.arg("--multithreaded").arg("-f").arg(src).arg(dir);
            cmd
        })
    }

    fn start(
        label: &'static str,
        dir: &Path,
        log: &Path,
        command: impl FnOnce(&Path) -> Command,
    ) -> Result<Mount> {
        let name = format!("{label} on {}", dir.display());
        let opts = MountOptions {
            // A sheepfs pushes its cache before it exits: give it time.
            proc: daemon(Duration::from_secs(120)),
            timeout: START,
            // Its death signal is SIGTERM: sheepfs and bindfs unmount themselves.
            sentinel: false,
        };
        let mount = testkit::mount::Mount::try_spawn(&name, command, dir, log, opts)?;
        Ok(Mount { label, mount })
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.mount.path(name)
    }

    pub fn watched(&self) -> Watched {
        Watched {
            label: self.label.into(),
            pid: self.mount.pid(),
        }
    }

    /// An error with the end of its log if its daemon has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        Ok(self.mount.check_alive()?)
    }
}
