//! A cluster and a real sheepfs mount on it, for end-to-end tests; both cleaned up on drop
//! (mount first).

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use testkit::cluster::{Bins, Cluster};
use testkit::mount::Mount;

pub const SHEEPFS: &str = env!("CARGO_BIN_EXE_sheepfs");

/// Fields drop in order: the mount goes before the cluster.
pub struct Rig {
    pub mount: Mount,
    pub cluster: Cluster,
}

impl Rig {
    /// `nodes` sheep, formatted with `copies` and `object_size`, mounted with `extra` options.
    pub fn start(nodes: usize, copies: u32, object_size: &str, extra: &[&str]) -> Rig {
        let cluster = Cluster::start(&Bins::fresh(), nodes);
        cluster.dog_ok(&[
            "cluster",
            "format",
            "--copies",
            &copies.to_string(),
            "--object-size",
            object_size,
        ]);
        let mount = Mount::start(
            Path::new(SHEEPFS),
            &cluster.addr(0),
            &cluster.dir.path().join("mnt"),
            &cluster.dir.path().join("sheepfs.log"),
            extra,
        );
        Rig { mount, cluster }
    }

    pub fn path(&self, name: &str) -> String {
        self.mount.path(name).to_string_lossy().into_owned()
    }

    pub fn scratch(&self, name: &str) -> String {
        self.cluster
            .dir
            .path()
            .join(name)
            .to_string_lossy()
            .into_owned()
    }
}

/// Runs a tool; panics with its output if it failed.
pub fn run(prog: &str, args: &[&str]) -> Output {
    let mut cmd = Command::new(prog);
    cmd.args(args);
    // Killed if the test dies first (a panic elsewhere, the runner killed).
    testkit::die_with_parent(&mut cmd, libc::SIGKILL);
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("run {prog} (make test installs it): {e}"));
    assert!(
        out.status.success(),
        "{prog} {args:?} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// fio arguments for random 4 KiB writes at depth 16 (libaio, O_DIRECT) verified with crc32c,
/// JSON output; `extra` adds or overrides.
pub fn fio_verify_args(file: &str, size: &str, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = [
        "--name=verify",
        "--rw=randwrite",
        "--bs=4k",
        "--iodepth=16",
        "--ioengine=libaio",
        "--direct=1",
        "--verify=crc32c",
        "--verify_fatal=1",
        // No verify state file left in the working directory.
        "--verify_state_save=0",
        "--output-format=json",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    a.push(format!("--filename={file}"));
    a.push(format!("--size={size}"));
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn cachectl_bin() -> PathBuf {
    Path::new(SHEEPFS).with_file_name("cachectl")
}

pub fn cachectl(dir: &Path, args: &[&str]) -> std::process::Output {
    Command::new(cachectl_bin())
        .arg("--cache-dir")
        .arg(dir)
        .args(args)
        .output()
        .expect("run cachectl (cargo build --workspace --bins)")
}

/// Runs cachectl and fails the test, with its error, unless it succeeds.
pub fn cachectl_ok(dir: &Path, args: &[&str]) -> std::process::Output {
    let out = cachectl(dir, args);
    assert!(
        out.status.success(),
        "cachectl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

pub fn stats(dir: &Path) -> Value {
    let out = cachectl_ok(dir, &["stats", "--json"]);
    serde_json::from_slice(&out.stdout).unwrap()
}

pub fn cache_args(dir: &Path, size: &str) -> Vec<String> {
    vec![
        "--cache-dir".into(),
        dir.to_string_lossy().into_owned(),
        "--cache-size".into(),
        size.into(),
        "--cache-max-dirty-age".into(),
        "3600".into(),
    ]
}

/// [`cache_args`] with the flusher's age limit at `max_age` seconds.
pub fn cache_args_aged(dir: &Path, size: &str, max_age: &str) -> Vec<String> {
    let mut args = cache_args(dir, size);
    let age = args
        .iter()
        .position(|a| a == "--cache-max-dirty-age")
        .unwrap();
    args[age + 1] = max_age.into();
    args
}

pub fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// Opens a VDI's file read-write, as qemu does: the attachment that lets the cache serve it.
pub fn open_rw(path: impl AsRef<Path>) -> std::fs::File {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap()
}
