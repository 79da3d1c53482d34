//! A local cluster of real `sheep` processes for end-to-end tests, driven through real `dog`.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::{free_port, wait_until, Proc};

/// Where the binaries under test are.
#[derive(Debug, Clone)]
pub struct Bins {
    pub sheep: PathBuf,
    pub dog: PathBuf,
}

impl Bins {
    /// From `CARGO_BIN_EXE_*` paths.
    pub fn new(sheep: &str, dog: &str) -> Bins {
        Bins {
            sheep: sheep.into(),
            dog: dog.into(),
        }
    }

    /// The workspace's `sheep` and `dog`, built now if they are missing or older than their
    /// sources: `cargo build --bins` runs once per test process (a no-op when nothing changed),
    /// so `cargo test -p fusefs` alone never tests a stale `sheep`.
    pub fn fresh() -> Bins {
        let dir = crate::build::binaries()
            .unwrap_or_else(|e| panic!("building the binaries under test: {e}"));
        Bins {
            sheep: dir.join("sheep"),
            dog: dir.join("dog"),
        }
    }

    /// Alias of [`Bins::fresh`], kept for older tests.
    pub fn beside_test() -> Bins {
        Bins::fresh()
    }
}

/// Fields drop in order: processes are killed before their directory goes.
pub struct Cluster {
    pub nodes: Vec<Option<Proc>>,
    /// Extra `sheep` arguments per node (e.g. `--zone 1`), used at every (re)start.
    pub node_args: Vec<Vec<String>>,
    pub bins: Bins,
    pub ports: Vec<u16>,
    pub dir: tempfile::TempDir,
}

impl Cluster {
    /// Starts `n` nodes sharing one local membership store and waits until all are members.
    pub fn start(bins: &Bins, n: usize) -> Cluster {
        Cluster::start_with(bins, vec![Vec::new(); n])
    }

    /// Starts one node per entry of `node_args`, each with those extra `sheep` arguments.
    pub fn start_with(bins: &Bins, node_args: Vec<Vec<String>>) -> Cluster {
        let n = node_args.len();
        let mut c = Cluster {
            nodes: (0..n).map(|_| None).collect(),
            node_args,
            bins: bins.clone(),
            ports: (0..n).map(|_| free_port()).collect(),
            dir: tempfile::tempdir().expect("temp dir"),
        };
        for i in 0..n {
            c.start_node(i);
        }
        c.wait_members(n);
        c
    }

    pub fn state_dir(&self) -> PathBuf {
        self.dir.path().join("state")
    }

    pub fn node_dir(&self, i: usize) -> PathBuf {
        self.dir.path().join(format!("node{i}"))
    }

    pub fn addr(&self, i: usize) -> String {
        format!("127.0.0.1:{}", self.ports[i])
    }

    /// Starts (or restarts) node `i` on its own data directory. A first start whose port was
    /// taken meanwhile (ports come from [`free_port`], which lets go of them, and tests run in
    /// parallel) moves to another port; another test's node answering there would otherwise
    /// pass for this one.
    pub fn start_node(&mut self, i: usize) {
        let first_start = self.nodes[i].is_none() && !self.node_dir(i).exists();
        for attempt in 0.. {
            let mut cmd = Command::new(&self.bins.sheep);
            cmd.arg("--dir")
                .arg(self.node_dir(i))
                .arg("--listen")
                .arg(self.addr(i))
                .arg("--cluster")
                .arg(format!("local:{}", self.state_dir().display()))
                .args(&self.node_args[i])
                .env("RUST_LOG", "info");
            let log = self.dir.path().join(format!("node{i}.log"));
            // The log is appended to: only what this start writes counts.
            let from = std::fs::metadata(&log).map_or(0, |m| m.len() as usize);
            let mut node = Proc::spawn(&format!("sheep{i}"), cmd, &log);
            let addr = self.addr(i);
            // Serving: its own log says so, for this address.
            let serving = format!("objects at {addr},");
            let written =
                || std::fs::read(&log).map_or(Vec::new(), |b| b[from.min(b.len())..].to_vec());
            let mut exited = false;
            wait_until(
                &format!("sheep{i} to serve on {addr}"),
                Duration::from_secs(20),
                || {
                    exited = !node.running();
                    exited || String::from_utf8_lossy(&written()).contains(&serving)
                },
            );
            if exited {
                let tail = crate::log_tail(&log, 1 << 16);
                if first_start && attempt < 5 && tail.contains("in use") {
                    self.ports[i] = free_port();
                    continue;
                }
                panic!("sheep{i} exited while starting on {addr}:\n{tail}");
            }
            self.nodes[i] = Some(node);
            wait_until(
                &format!("sheep{i} to answer on {addr}"),
                Duration::from_secs(20),
                || self.dog_at(&addr, &["node", "list"]).status.success(),
            );
            return;
        }
    }

    pub fn kill9(&mut self, i: usize) {
        if let Some(p) = self.nodes[i].as_mut() {
            p.kill9();
        }
        self.nodes[i] = None;
    }

    pub fn log(&self, i: usize) -> String {
        crate::log_tail(&self.dir.path().join(format!("node{i}.log")), 1 << 20)
    }

    fn live_addr(&self) -> String {
        let i = self
            .nodes
            .iter()
            .position(|n| n.is_some())
            .expect("a live node");
        self.addr(i)
    }

    pub fn dog_at(&self, addr: &str, args: &[&str]) -> Output {
        Command::new(&self.bins.dog)
            .arg("--address")
            .arg(addr)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run dog")
    }

    /// Runs dog against a live node.
    pub fn dog(&self, args: &[&str]) -> Output {
        self.dog_at(&self.live_addr(), args)
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
        let mut child = Command::new(&self.bins.dog)
            .arg("--address")
            .arg(self.live_addr())
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run dog");
        let mut stdin = child.stdin.take().unwrap();
        let data = data.to_vec();
        let feeder = std::thread::spawn(move || {
            let _ = stdin.write_all(&data);
        });
        let out = child.wait_with_output().expect("dog output");
        feeder.join().unwrap();
        out
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

    /// Waits until the cluster lists exactly `n` nodes.
    pub fn wait_members(&self, n: usize) {
        wait_until(&format!("{n} members"), Duration::from_secs(20), || {
            let out = self.dog(&["cluster", "info", "--json"]);
            out.status.success()
                && serde_json::from_slice::<Value>(&out.stdout)
                    .map(|v| v["nodes"] == n)
                    .unwrap_or(false)
        });
    }

    /// Waits until every node has finished recovery (and collection) for one common epoch.
    /// Panics as soon as a node reports a failed pull: a failure is never "recovered".
    pub fn wait_recovered(&self) {
        wait_until("recovery to finish", Duration::from_secs(60), || {
            let out = self.dog(&["node", "recovery", "--json"]);
            if !out.status.success() {
                return false;
            }
            let rows: Value = serde_json::from_slice(&out.stdout).unwrap();
            let rows = rows.as_array().unwrap();
            let failed: Vec<&Value> = rows
                .iter()
                .filter(|r| r["status"]["recovery"]["failed"].as_u64().unwrap_or(0) > 0)
                .collect();
            assert!(
                failed.is_empty(),
                "recovery reports failed pulls: {}",
                serde_json::to_string(&failed).unwrap_or_default()
            );
            let epochs: Vec<&Value> = rows.iter().map(|r| &r["status"]["epoch"]).collect();
            !rows.is_empty()
                && epochs.iter().all(|e| *e == epochs[0])
                && rows.iter().all(|r| {
                    r["status"]["recovery"]["state"] == "done"
                        && r["status"]["recovery"]["epoch"] == *epochs[0]
                })
        });
    }

    /// Where object `index` of VDI `name` should be (placement) and who holds it at which
    /// stamp.
    pub fn holders(&self, name: &str, index: u64) -> crate::replicas::ObjectReplicas {
        crate::replicas::object(self, name, index).unwrap_or_else(|e| panic!("{e}"))
    }
}
