//! A local cluster of real `sheep` processes, driven through real `dog`: for end-to-end
//! tests (the panicking methods) and for `bench run` (the `try_` ones, and
//! [`ClusterOptions`] for a named directory, quieter logs and a graceful stop).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::{or_panic, try_free_port, try_wait_until, Error, Proc, ProcOptions, Result};

/// Where the binaries under test are.
#[derive(Debug, Clone)]
pub struct Bins {
    pub sheep: PathBuf,
    pub dog: PathBuf,
}

/// Every binary a cluster and its mounts need.
pub const BINARIES: [&str; 4] = ["sheep", "dog", "sheepfs", "cachectl"];

impl Bins {
    /// From `CARGO_BIN_EXE_*` paths.
    pub fn new(sheep: &str, dog: &str) -> Bins {
        Bins {
            sheep: sheep.into(),
            dog: dog.into(),
        }
    }

    /// The workspace's binaries, built now if they are missing or older than their sources:
    /// `cargo build --bins` runs once per test process (a no-op when nothing changed), so
    /// `cargo test -p sheepfs` alone never tests a stale `sheep`.
    pub fn try_fresh() -> Result<Bins> {
        let dir = crate::build::binaries()
            .map_err(|e| Error::Binaries(format!("building the binaries under test: {e}")))?;
        Ok(Bins::at(&dir))
    }

    /// Like [`Bins::try_fresh`]; panics if the build fails.
    #[track_caller]
    pub fn fresh() -> Bins {
        or_panic(Bins::try_fresh())
    }

    /// The binaries already in `dir` (nothing is built): [`Error::Binaries`] naming the first
    /// of [`BINARIES`] missing there.
    pub fn in_dir(dir: &Path) -> Result<Bins> {
        for name in BINARIES {
            let p = dir.join(name);
            if !p.is_file() {
                return Err(Error::Binaries(format!("{} is missing", p.display())));
            }
        }
        Ok(Bins::at(dir))
    }

    fn at(dir: &Path) -> Bins {
        Bins {
            sheep: dir.join("sheep"),
            dog: dir.join("dog"),
        }
    }

    /// The binary `name` (`sheepfs`, `cachectl`, ...): beside `sheep`.
    pub fn path(&self, name: &str) -> PathBuf {
        match name {
            "sheep" => self.sheep.clone(),
            "dog" => self.dog.clone(),
            _ => self.sheep.with_file_name(name),
        }
    }
}

/// How sheep logs, and so how a start is known to be serving.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeLog {
    /// `RUST_LOG=FILTER`, over the caller's. The filter must show `info`: a start counts once
    /// its own log says it serves objects at its address, so another cluster's node that
    /// took the port meanwhile never passes for it.
    Env(String),
    /// `--log FILTER` (a `RUST_LOG` in the caller's environment wins): a start counts once
    /// dog gets an answer at its address while it runs.
    Arg(String),
}

/// How [`Cluster::try_start_with`] starts and stops its nodes.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// Data, membership state and logs; `None`: a fresh temporary directory removed on drop.
    /// A named directory is created if missing and kept.
    pub dir: Option<PathBuf>,
    pub log: NodeLog,
    /// How the nodes are tied to this thread and stopped on drop.
    pub proc: ProcOptions,
    /// How long a node may take to serve, and the cluster to list every member.
    pub timeout: Duration,
    /// The membership driver, as `sheep --cluster` takes it (e.g. an
    /// [`crate::etcd::Etcd::cluster_spec`]); `None`: `local:` on [`Cluster::state_dir`].
    pub driver: Option<String>,
    /// `sheep --lease-ttl` (whole seconds); `None`: sheep's default.
    pub lease_ttl: Option<Duration>,
    /// Where node `i` runs ([`NodeHost`]); a node past the end of the list, or every node when
    /// it is empty: on 127.0.0.1 in this network namespace.
    pub hosts: Vec<NodeHost>,
    /// The key file every node and dog this cluster starts is given (`SHEEP_KEY_FILE`; a
    /// node's own `--key-file` argument wins); `None`: this process's ([`crate::auth`]).
    pub key_file: Option<PathBuf>,
}

/// Where a node runs, as another host would: the IP it listens on and a command prefix its
/// `sheep` runs under (e.g. [`crate::netns::Netns::wrap`]: `nsenter --net=... --`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeHost {
    /// The IP `sheep --listen` binds; empty: 127.0.0.1.
    pub ip: String,
    /// A command `sheep` runs under (its program first); empty: none.
    pub wrap: Vec<String>,
}

impl Default for ClusterOptions {
    /// What tests use: a temporary directory, `RUST_LOG=info`, SIGKILL on drop, 20 s, the
    /// `local` driver.
    fn default() -> ClusterOptions {
        ClusterOptions {
            dir: None,
            log: NodeLog::Env("info".into()),
            proc: ProcOptions::default(),
            timeout: Duration::from_secs(20),
            driver: None,
            lease_ttl: None,
            hosts: Vec::new(),
            key_file: None,
        }
    }
}

/// A cluster's directory: a temporary one removed on drop, or one the caller named and keeps.
#[derive(Debug)]
pub struct Scratch {
    _temp: Option<tempfile::TempDir>,
    path: PathBuf,
}

impl Scratch {
    fn new(named: Option<&Path>) -> Result<Scratch> {
        match named {
            Some(dir) => {
                std::fs::create_dir_all(dir)
                    .map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
                Ok(Scratch {
                    _temp: None,
                    path: dir.to_path_buf(),
                })
            }
            None => {
                let t = tempfile::tempdir()
                    .map_err(|e| Error::io("making a temporary directory", e))?;
                Ok(Scratch {
                    path: t.path().to_path_buf(),
                    _temp: Some(t),
                })
            }
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Fields drop in order: processes are stopped before their directory goes.
pub struct Cluster {
    pub nodes: Vec<Option<Proc>>,
    /// Extra `sheep` arguments per node (e.g. `--zone 1`), used at every (re)start.
    pub node_args: Vec<Vec<String>>,
    pub bins: Bins,
    pub ports: Vec<u16>,
    pub dir: Scratch,
    opts: ClusterOptions,
}

impl Cluster {
    /// Starts `n` nodes sharing one local membership store and waits until all are members;
    /// panics if that fails.
    #[track_caller]
    pub fn start(bins: &Bins, n: usize) -> Cluster {
        or_panic(Cluster::try_start(bins, n))
    }

    /// [`Cluster::try_start_with`] the default (test) options.
    pub fn try_start(bins: &Bins, n: usize) -> Result<Cluster> {
        Cluster::try_start_with(bins, n, ClusterOptions::default())
    }

    /// Starts `n` nodes sharing one membership store (`local` unless
    /// [`ClusterOptions::driver`] names another) and waits until all are members. On an error,
    /// the nodes started so far are stopped.
    pub fn try_start_with(bins: &Bins, n: usize, opts: ClusterOptions) -> Result<Cluster> {
        Cluster::try_start_with_args(bins, vec![Vec::new(); n], opts)
    }

    /// Starts one node per entry of `node_args`, each with those extra `sheep` arguments (e.g.
    /// `--zone 1`), with the default (test) options; panics if that fails.
    #[track_caller]
    pub fn start_with_args(bins: &Bins, node_args: Vec<Vec<String>>) -> Cluster {
        or_panic(Cluster::try_start_with_args(
            bins,
            node_args,
            ClusterOptions::default(),
        ))
    }

    /// [`Cluster::try_start_with`], node `i` started with the extra arguments `node_args[i]`.
    pub fn try_start_with_args(
        bins: &Bins,
        node_args: Vec<Vec<String>>,
        opts: ClusterOptions,
    ) -> Result<Cluster> {
        let n = node_args.len();
        let mut c = Cluster {
            nodes: (0..n).map(|_| None).collect(),
            node_args,
            bins: bins.clone(),
            ports: (0..n).map(|_| try_free_port()).collect::<Result<_>>()?,
            dir: Scratch::new(opts.dir.as_deref())?,
            opts,
        };
        for i in 0..n {
            c.try_start_node(i)?;
        }
        try_wait_until(&format!("{n} members"), c.opts.timeout, || {
            c.check_alive()?;
            c.members_are(n)
        })?;
        Ok(c)
    }

    /// The key file this cluster's nodes and dogs are given.
    pub fn key_file(&self) -> PathBuf {
        match &self.opts.key_file {
            Some(p) => p.clone(),
            None => crate::auth::key_file().to_path_buf(),
        }
    }

    fn with_key<'a>(&self, cmd: &'a mut Command) -> &'a mut Command {
        cmd.env(crate::auth::KEY_ENV, self.key_file())
    }

    /// The `local` driver's state directory (unused with another driver).
    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    /// What every node gets as `--cluster`: [`ClusterOptions::driver`], else `local:` on
    /// [`Cluster::state_dir`].
    pub fn driver_spec(&self) -> String {
        match &self.opts.driver {
            Some(spec) => spec.clone(),
            None => format!("local:{}", self.state_dir().display()),
        }
    }

    pub fn node_dir(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("node{i}"))
    }

    /// Node `i`'s address, `IP:PORT` (its [`NodeHost::ip`], 127.0.0.1 by default).
    pub fn addr(&self, i: usize) -> String {
        match self.opts.hosts.get(i).map(|h| h.ip.as_str()) {
            Some(ip) if !ip.is_empty() => format!("{ip}:{}", self.ports[i]),
            _ => format!("127.0.0.1:{}", self.ports[i]),
        }
    }

    /// Adds node `n` (the next index) with the extra `sheep` arguments `args`, started where
    /// [`ClusterOptions::hosts`]`[n]` says; waits until it serves, not until it is a member.
    /// Returns its index.
    pub fn try_add_node(&mut self, args: Vec<String>) -> Result<usize> {
        let i = self.nodes.len();
        self.nodes.push(None);
        self.node_args.push(args);
        self.ports.push(try_free_port()?);
        self.try_start_node(i)?;
        Ok(i)
    }

    /// Like [`Cluster::try_add_node`]; panics if the node cannot start.
    #[track_caller]
    pub fn add_node(&mut self, args: Vec<String>) -> usize {
        or_panic(self.try_add_node(args))
    }

    fn node_log(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("node{i}.log"))
    }

    /// Starts (or restarts) node `i` on its own data directory; panics if it cannot.
    #[track_caller]
    pub fn start_node(&mut self, i: usize) {
        or_panic(self.try_start_node(i))
    }

    /// Starts (or restarts) node `i` on its own data directory. A first start whose port was
    /// taken meanwhile (ports come from [`try_free_port`], which lets go of them, and tests run
    /// in parallel) moves to another port; another test's node answering there would otherwise
    /// pass for this one.
    pub fn try_start_node(&mut self, i: usize) -> Result<()> {
        let first_start = self.nodes[i].is_none() && !self.node_dir(i).exists();
        for attempt in 0.. {
            let addr = self.addr(i);
            let mut cmd = match self.opts.hosts.get(i).map(|h| h.wrap.as_slice()) {
                Some([prog, args @ ..]) => {
                    let mut c = Command::new(prog);
                    c.args(args).arg(&self.bins.sheep);
                    c
                }
                _ => Command::new(&self.bins.sheep),
            };
            self.with_key(&mut cmd);
            cmd.arg("--dir")
                .arg(self.node_dir(i))
                .arg("--listen")
                .arg(&addr)
                .arg("--cluster")
                .arg(self.driver_spec());
            if let Some(ttl) = self.opts.lease_ttl {
                cmd.arg("--lease-ttl")
                    .arg(format!("{}s", ttl.as_secs().max(1)));
            }
            cmd.args(&self.node_args[i]);
            let by_log = match &self.opts.log {
                NodeLog::Env(filter) => {
                    cmd.env("RUST_LOG", filter);
                    true
                }
                NodeLog::Arg(filter) => {
                    cmd.arg("--log").arg(filter);
                    false
                }
            };
            let log = self.node_log(i);
            // The log is appended to: only what this start writes counts.
            let from = std::fs::metadata(&log).map_or(0, |m| m.len() as usize);
            let name = format!("sheep{i}");
            let mut node = Proc::try_spawn_with(&name, cmd, &log, self.opts.proc)?;
            // Serving: its own log says so, for this address.
            let serving = format!("objects at {addr},");
            let written =
                || std::fs::read(&log).map_or(Vec::new(), |b| b[from.min(b.len())..].to_vec());
            let mut exited = false;
            try_wait_until(
                &format!("{name} to serve on {addr}"),
                self.opts.timeout,
                || {
                    exited = !node.running();
                    Ok(exited || !by_log || String::from_utf8_lossy(&written()).contains(&serving))
                },
            )?;
            if exited {
                let tail = crate::log_tail(&log, 1 << 16);
                if first_start && attempt < 5 && tail.contains("in use") {
                    self.ports[i] = try_free_port()?;
                    continue;
                }
                let why = node.check_alive().err().unwrap_or(Error::Unexpected {
                    what: name.clone(),
                    detail: "exited".into(),
                });
                return Err(why.context(format!("{name} exited while starting on {addr}")));
            }
            self.nodes[i] = Some(node);
            return try_wait_until(
                &format!("{name} to answer on {addr}"),
                self.opts.timeout,
                || {
                    if let Some(n) = self.nodes[i].as_mut() {
                        n.check_alive()?;
                    }
                    Ok(self.try_dog_at(&addr, &["node", "list"])?.status.success())
                },
            );
        }
        unreachable!("the loop returns")
    }

    pub fn kill9(&mut self, i: usize) {
        if let Some(p) = self.nodes[i].as_mut() {
            p.kill9();
        }
        self.nodes[i] = None;
    }

    /// [`Error::Exited`] with the end of its log for the first live node that has exited.
    pub fn check_alive(&mut self) -> Result<()> {
        self.nodes
            .iter_mut()
            .flatten()
            .try_for_each(Proc::check_alive)
    }

    pub fn log(&self, i: usize) -> String {
        crate::log_tail(&self.node_log(i), 1 << 20)
    }

    fn live_addr(&self) -> Result<String> {
        let i = self
            .nodes
            .iter()
            .position(|n| n.is_some())
            .ok_or_else(|| Error::Unexpected {
                what: "the cluster".into(),
                detail: "has no live node".into(),
            })?;
        Ok(self.addr(i))
    }

    /// Every live node's address, comma-separated (for `--cluster` and `--address`).
    pub fn addresses(&self) -> String {
        (0..self.nodes.len())
            .filter(|&i| self.nodes[i].is_some())
            .map(|i| self.addr(i))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// A dog command against every live node, to run as the caller likes.
    pub fn dog_command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(&self.bins.dog);
        self.with_key(&mut cmd);
        cmd.arg("--address").arg(self.addresses()).args(args);
        cmd
    }

    /// Runs dog against `addr`; its output, whatever its exit status.
    pub fn try_dog_at(&self, addr: &str, args: &[&str]) -> Result<Output> {
        let mut cmd = Command::new(&self.bins.dog);
        self.with_key(&mut cmd)
            .arg("--address")
            .arg(addr)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| Error::io(format!("running {}", self.bins.dog.display()), e))
    }

    #[track_caller]
    pub fn dog_at(&self, addr: &str, args: &[&str]) -> Output {
        or_panic(self.try_dog_at(addr, args))
    }

    /// Runs dog against a live node; its output, whatever its exit status.
    pub fn try_dog(&self, args: &[&str]) -> Result<Output> {
        self.try_dog_at(&self.live_addr()?, args)
    }

    /// Runs dog against a live node.
    #[track_caller]
    pub fn dog(&self, args: &[&str]) -> Output {
        or_panic(self.try_dog(args))
    }

    /// Runs dog and returns its stdout; panics with its stderr if it failed.
    pub fn dog_ok(&self, args: &[&str]) -> Vec<u8> {
        let out = self.dog(args);
        assert!(
            out.status.success(),
            "dog {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        out.stdout
    }

    /// `dog cluster format --copies COPIES --object-size OBJECT_SIZE` (e.g. "1M"); panics if
    /// it fails.
    pub fn format(&self, copies: u32, object_size: &str) {
        self.dog_ok(&[
            "cluster",
            "format",
            "--copies",
            &copies.to_string(),
            "--object-size",
            object_size,
        ]);
    }

    /// Runs dog expecting failure; returns its one-line reason.
    pub fn dog_err(&self, args: &[&str]) -> String {
        let out = self.dog(args);
        let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
        assert!(!out.status.success(), "dog {args:?} should have failed");
        assert!(
            err.starts_with("dog: ") || err.starts_with("error: "),
            "dog {args:?}: unexpected stderr {err:?}"
        );
        err
    }

    pub fn dog_json(&self, args: &[&str]) -> Value {
        let mut a = args.to_vec();
        a.push("--json");
        serde_json::from_slice(&self.dog_ok(&a)).expect("dog printed JSON")
    }

    /// Feeds `data` to dog's stdin.
    pub fn dog_stdin(&self, args: &[&str], data: &[u8]) -> Output {
        let mut cmd = Command::new(&self.bins.dog);
        self.with_key(&mut cmd)
            .arg("--address")
            .arg(or_panic(self.live_addr()))
            .args(args);
        crate::proc::output_with_stdin(cmd, data)
    }

    pub fn write_vdi(&self, name: &str, offset: u64, data: &[u8]) {
        let out = self.dog_stdin(&["vdi", "write", name, &offset.to_string()], data);
        assert!(
            out.status.success(),
            "dog vdi write failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    pub fn read_vdi(&self, name: &str, offset: u64, len: u64) -> Vec<u8> {
        self.dog_ok(&["vdi", "read", name, &offset.to_string(), &len.to_string()])
    }

    /// Waits until the cluster lists exactly `n` nodes; panics after 20 s.
    #[track_caller]
    pub fn wait_members(&self, n: usize) {
        or_panic(self.try_wait_members(n))
    }

    /// Waits until the cluster lists exactly `n` nodes.
    pub fn try_wait_members(&self, n: usize) -> Result<()> {
        try_wait_until(&format!("{n} members"), self.opts.timeout, || {
            self.members_are(n)
        })
    }

    fn members_are(&self, n: usize) -> Result<bool> {
        let out = self.try_dog(&["cluster", "info", "--json"])?;
        Ok(out.status.success()
            && serde_json::from_slice::<Value>(&out.stdout)
                .map(|v| v["nodes"] == n)
                .unwrap_or(false))
    }

    /// Waits until every node has finished recovery (and collection) for one common epoch;
    /// panics after 60 s, or as soon as a node reports a failed pull.
    #[track_caller]
    pub fn wait_recovered(&self) {
        or_panic(self.try_wait_recovered())
    }

    /// Waits until every node has finished recovery (and collection) for one common epoch.
    /// A node reporting failed pulls is an [`Error::Unexpected`] at once: a failure is never
    /// "recovered".
    pub fn try_wait_recovered(&self) -> Result<()> {
        try_wait_until("recovery to finish", Duration::from_secs(60), || {
            let out = self.try_dog(&["node", "recovery", "--json"])?;
            if !out.status.success() {
                return Ok(false);
            }
            let rows: Value =
                serde_json::from_slice(&out.stdout).map_err(|e| Error::Unexpected {
                    what: "dog node recovery --json".into(),
                    detail: format!("not JSON: {e}"),
                })?;
            let rows = rows.as_array().map(Vec::as_slice).unwrap_or_default();
            let failed: Vec<&Value> = rows
                .iter()
                .filter(|r| r["status"]["recovery"]["failed"].as_u64().unwrap_or(0) > 0)
                .collect();
            if !failed.is_empty() {
                return Err(Error::Unexpected {
                    what: "recovery".into(),
                    detail: format!(
                        "nodes report failed pulls: {}",
                        serde_json::to_string(&failed).unwrap_or_default()
                    ),
                });
            }
            let epochs: Vec<&Value> = rows.iter().map(|r| &r["status"]["epoch"]).collect();
            Ok(!rows.is_empty()
                && epochs.iter().all(|e| *e == epochs[0])
                && rows.iter().all(|r| {
                    r["status"]["recovery"]["state"] == "done"
                        && r["status"]["recovery"]["epoch"] == *epochs[0]
                }))
        })
    }

    /// Where object `index` of VDI `name` should be (placement) and who holds it at which
    /// version.
    pub fn holders(&self, name: &str, index: u64) -> crate::replicas::ObjectReplicas {
        crate::replicas::object(self, name, index).unwrap_or_else(|e| panic!("{e}"))
    }
}
