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
        cluster.format(copies, object_size);
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

/// A rig with a cache. The TempDir holds the cache; bound first, it is dropped last (bindings
/// drop in reverse order), after the rig has unmounted and stopped everything.
pub fn rig_with_cache(nodes: usize, size: &str) -> (tempfile::TempDir, Rig, PathBuf) {
    let (tmp, rig, cache, _) = rig_with_cache_and(nodes, 3, size, &[]);
    (tmp, rig, cache)
}

/// [`rig_with_cache`] with `copies` and `extra` sheepfs options; also returns the options,
/// for remounts.
pub fn rig_with_cache_and(
    nodes: usize,
    copies: u32,
    size: &str,
    extra: &[&str],
) -> (tempfile::TempDir, Rig, PathBuf, Vec<String>) {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let mut args = cache_args(&cache, size);
    args.extend(extra.iter().map(|s| s.to_string()));
    let rig = Rig::start(nodes, copies, "1M", &strs(&args));
    (tmp, rig, cache, args)
}

/// The 4 KiB a test writes as its `v`th pattern (0: zeros, never written), for models of
/// what each block must hold.
pub fn block_pattern(v: u64) -> Vec<u8> {
    if v == 0 {
        vec![0u8; 4096]
    } else {
        testkit::pseudo_random(4096, v)
    }
}

pub fn fio(args: &[&str]) -> Value {
    let out = run("fio", args);
    let v: Value = serde_json::from_slice(&out.stdout).expect("fio json");
    assert_eq!(v["jobs"][0]["error"], 0, "fio error");
    v
}

/// Mounts sheepfs again on the rig's mount point with `cache` (the old mount must be gone).
pub fn remount(rig: &mut Rig, cache: &Path, size: &str, log: &str) {
    let args = cache_args(cache, size);
    rig.mount = Mount::start(
        Path::new(SHEEPFS),
        &rig.cluster.addr(0),
        &rig.mount.dir,
        &rig.cluster.dir.path().join(log),
        &strs(&args),
    );
}

/// A tmpfs mounted over a directory, unmounted on drop (even when the test fails); then the
/// directory tree `owner` (which the cluster's TempDir could not remove while the tmpfs was
/// mounted inside it) is removed.
pub struct Tmpfs(pub PathBuf, PathBuf);

impl Tmpfs {
    pub fn mount(dir: &Path, size: &str, owner: &Path) -> Tmpfs {
        std::fs::create_dir_all(dir).unwrap();
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "mount tmpfs: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs(dir.to_path_buf(), owner.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        testkit::mount::detach(&self.0);
        let _ = std::fs::remove_dir_all(&self.1);
    }
}
