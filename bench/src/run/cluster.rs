//! Real processes of a benchmark cluster: `sheep` nodes with the local membership driver on
//! loopback, `dog` against them, `sheepfs` and `bindfs` mounts.
//!
//! Stopping order is the contract: mounts first (unmounted, then their daemon stopped with
//! SIGTERM, so sheepfs pushes its cache while the nodes are still up), nodes last. Owners hold
//! mounts in fields declared before their [`Cluster`], so drop order keeps it on errors too.

use std::ffi::CString;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use super::proc::{check_interrupt, free_port, wait_for, Daemon, Watched};

/// Where sheep, dog, sheepfs and cachectl are.
#[derive(Debug, Clone)]
pub struct Bins {
    pub dir: PathBuf,
}

impl Bins {
    /// Checks that every binary the runner needs is in `dir`.
    pub fn find(dir: &Path) -> Result<Bins> {
        for name in ["sheep", "dog", "sheepfs", "cachectl"] {
            let p = dir.join(name);
            if !p.is_file() {
                bail!(
                    "{} is missing: build the binaries (cargo build --release --workspace --bins) \
                     or point --bin-dir at them",
                    p.display()
                );
            }
        }
        Ok(Bins { dir: dir.into() })
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

/// Runs `cmd` to completion; its stdout, or an error naming it with its stderr.
pub fn output(mut cmd: Command, what: &str) -> Result<Vec<u8>> {
    // Without redirections of its own, stdin is /dev/null and stdout is captured.
    let out = cmd.output().with_context(|| format!("starting {what}"))?;
    check_interrupt()?;
    if !out.status.success() {
        bail!(
            "{what} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(out.stdout)
}

/// Seconds `f` took.
pub fn timed<T>(f: impl FnOnce() -> Result<T>) -> Result<(T, f64)> {
    let t0 = Instant::now();
    let v = f()?;
    Ok((v, t0.elapsed().as_secs_f64()))
}

/// N sheep sharing one local membership store, under `dir`.
pub struct Cluster {
    bins: Bins,
    dir: PathBuf,
    nodes: Vec<Daemon>,
    addrs: Vec<String>,
}

impl Cluster {
    /// Starts `n` nodes and waits until all are members.
    pub fn start(bins: &Bins, dir: &Path, n: usize) -> Result<Cluster> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut c = Cluster {
            bins: bins.clone(),
            dir: dir.into(),
            nodes: Vec::new(),
            addrs: Vec::new(),
        };
        for i in 0..n {
            let addr = format!("127.0.0.1:{}", free_port()?);
            let mut cmd = Command::new(bins.path("sheep"));
            cmd.arg("--dir")
                .arg(c.node_dir(i))
                .arg("--listen")
                .arg(&addr)
                .arg("--cluster")
                .arg(format!("local:{}", dir.join("state").display()))
                .arg("--log")
                .arg("warn");
            let log = dir.join(format!("node{i}.log"));
            c.nodes
                .push(Daemon::spawn(&format!("sheep{i}"), cmd, &log)?);
            c.addrs.push(addr);
        }
        c.wait_members(n)?;
        Ok(c)
    }

    /// An error with the end of its log if a node has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        self.nodes.iter_mut().try_for_each(Daemon::check_alive)
    }

    fn wait_members(&mut self, n: usize) -> Result<()> {
        wait_for(
            &format!("{n} sheep to join"),
            Duration::from_secs(30),
            || {
                self.check_alive()?;
                let out = self.dog_cmd(&["cluster", "info", "--json"]).output()?;
                Ok(out.status.success()
                    && serde_json::from_slice::<Value>(&out.stdout)
                        .map(|v| v["nodes"] == n)
                        .unwrap_or(false))
            },
        )
    }

    pub fn node_dir(&self, i: usize) -> PathBuf {
        self.dir.join(format!("node{i}"))
    }

    pub fn node_dirs(&self) -> Vec<PathBuf> {
        (0..self.nodes.len()).map(|i| self.node_dir(i)).collect()
    }

    /// Every node's address, comma-separated (for `--cluster` and `--address`).
    pub fn addresses(&self) -> String {
        self.addrs.join(",")
    }

    /// A dog command against this cluster.
    pub fn dog_cmd(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(self.bins.path("dog"));
        cmd.arg("--address").arg(self.addresses()).args(args);
        cmd
    }

    /// Runs dog; its stdout, or an error with its stderr.
    pub fn dog(&self, args: &[&str]) -> Result<Vec<u8>> {
        output(self.dog_cmd(args), &format!("dog {}", args.join(" ")))
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
        self.dog(&["vdi", "create", name, &size.to_string()])
            .map(drop)
    }

    /// `dog vdi write NAME < src`.
    pub fn write_vdi(&self, name: &str, src: &Path) -> Result<()> {
        let input = File::open(src).with_context(|| format!("opening {}", src.display()))?;
        let mut cmd = self.dog_cmd(&["vdi", "write", name]);
        cmd.stdin(input);
        output(cmd, &format!("dog vdi write {name}")).map(drop)
    }

    /// `dog vdi read NAME > dst` (`None`: to /dev/null).
    pub fn read_vdi(&self, name: &str, dst: Option<&Path>) -> Result<()> {
        let mut cmd = self.dog_cmd(&["vdi", "read", name]);
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
            .iter()
            .map(|n| Watched {
                label: n.name().into(),
                pid: n.pid(),
            })
            .collect()
    }

    pub fn bins(&self) -> &Bins {
        &self.bins
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            n.stop(Duration::from_secs(10));
        }
    }
}

/// Whether `path` is a mount point in this namespace.
pub fn is_mounted(path: &Path) -> bool {
    mounts_under(path).iter().any(|m| m == path)
}

/// Mount points at or below `dir`, deepest first.
pub fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut v: Vec<PathBuf> = text
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(PathBuf::from)
        .filter(|m| m.starts_with(dir))
        .collect();
    v.sort_by_key(|m| std::cmp::Reverse(m.components().count()));
    v
}

/// Unmounts `dir`, lazily if it is busy (never blocks).
pub fn unmount(dir: &Path) {
    let Ok(c) = CString::new(dir.as_os_str().as_encoded_bytes()) else {
        return;
    };
    // SAFETY: a valid NUL-terminated path.
    let ok = unsafe { libc::umount2(c.as_ptr(), 0) } == 0;
    if !ok && is_mounted(dir) {
        // SAFETY: as above; MNT_DETACH never blocks.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
    if is_mounted(dir) {
        let _ = Command::new("fusermount3")
            .arg("-uz")
            .arg(dir)
            .stderr(Stdio::null())
            .status();
    }
}

/// A FUSE mount served by a daemon we started: unmounted, then the daemon stopped, on drop.
pub struct Mount {
    pub dir: PathBuf,
    /// Key of its process in the figures' `peak_rss_kib`: "sheepfs" or "bindfs".
    label: &'static str,
    daemon: Daemon,
}

impl Mount {
    /// sheepfs in the foreground on `dir` (created), with `extra` options; waits for the mount.
    pub fn sheepfs(cluster: &Cluster, dir: &Path, log: &Path, extra: &[String]) -> Result<Mount> {
        let mut cmd = Command::new(cluster.bins().path("sheepfs"));
        cmd.arg("--cluster")
            .arg(cluster.addresses())
            .arg(dir)
            .arg("--foreground")
            .arg("--log-file")
            .arg(log)
            .args(extra)
            .env("RUST_LOG", "warn");
        Mount::start("sheepfs", cmd, dir, log)
    }

    /// `bindfs --multithreaded -f SRC DIR`.
    pub fn bindfs(src: &Path, dir: &Path, log: &Path) -> Result<Mount> {
        let mut cmd = Command::new("bindfs");
        cmd.arg("--multithreaded").arg("-f").arg(src).arg(dir);
        Mount::start("bindfs", cmd, dir, log)
    }

    fn start(label: &'static str, cmd: Command, dir: &Path, log: &Path) -> Result<Mount> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let dir = dir.canonicalize()?;
        let name = format!("{label} on {}", dir.display());
        let mut m = Mount {
            daemon: Daemon::spawn(&name, cmd, log)?,
            label,
            dir,
        };
        let what = format!("{label} to mount {}", m.dir.display());
        wait_for(&what, Duration::from_secs(30), || {
            m.daemon.check_alive()?;
            Ok(is_mounted(&m.dir))
        })?;
        Ok(m)
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    pub fn watched(&self) -> Watched {
        Watched {
            label: self.label.into(),
            pid: self.daemon.pid(),
        }
    }

    /// An error with the end of its log if its daemon has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        self.daemon.check_alive()
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        unmount(&self.dir);
        // A sheepfs pushes its cache before it exits: give it time.
        self.daemon.stop(Duration::from_secs(120));
    }
}
