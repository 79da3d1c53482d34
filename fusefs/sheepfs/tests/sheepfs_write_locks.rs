//! The mount without a cache takes the attachment lock for read-write opens, as the cache
//! does: a second writer (another mount, cached or not) is refused with the same EBUSY and
//! the same log line everywhere; the lock is leased (`--lock-ttl`), released at the last
//! close, lost (writes fail with EIO) when another attachment came after its lease ended;
//! `--no-lock` opts out. Mounts, cached or not, run with `--lock-mode exclusive` here (the
//! refusal); the default, cooperative mode hands the lock over instead (`lock_handover.rs`).

mod common;

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{cache_args, open_rw, strs, Rig, SHEEPFS};
use serde_json::Value;
use testkit::cluster::Cluster;
use testkit::mount::Mount;
use testkit::wait_until;

const TTL: &str = "2s";

fn locks(c: &Cluster) -> Vec<Value> {
    c.dog_json(&["vdi", "lock", "list"])
        .as_array()
        .expect("a JSON array")
        .clone()
}

/// Another mount of the cluster in `tmp` (`name`: its directory and log), with `extra`.
fn mount(tmp: &Path, c: &Cluster, name: &str, extra: &[String]) -> Mount {
    let mut args = vec!["--lock-ttl".to_string(), TTL.to_string()];
    if !extra.iter().any(|a| a == "--no-lock") {
        args.extend(["--lock-mode".to_string(), "exclusive".to_string()]);
    }
    args.extend_from_slice(extra);
    Mount::start(
        Path::new(SHEEPFS),
        &c.addr(1),
        &tmp.join(format!("mnt-{name}")),
        &tmp.join(format!("{name}.log")),
        &strs(&args),
    )
}

fn log_of(tmp: &Path, name: &str) -> String {
    std::fs::read_to_string(tmp.join(format!("{name}.log"))).unwrap_or_default()
}

/// A read-write open that must be refused with EBUSY.
fn refused(path: impl Into<PathBuf>) {
    let path = path.into();
    let e = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .expect_err("a second writer is refused");
    assert_eq!(
        e.raw_os_error(),
        Some(libc::EBUSY),
        "{}: {e}",
        path.display()
    );
}

/// The line a refused mount logs, from `VDI 'x' is attached` to the end of the line.
fn refusal_line(log: &str) -> String {
    let at = log
        .rfind("open x: VDI 'x' is attached read-write by ")
        .unwrap_or_else(|| panic!("no refusal logged:\n{log}"));
    let line = log[at..].lines().next().unwrap();
    assert!(line.contains("dog vdi lock break x"), "{line}");
    line.to_string()
}

#[test]
fn a_second_writer_is_refused_the_same_way_by_mounts_with_and_without_a_cache() {
    let tmp = tempfile::tempdir().unwrap();
    let rig = Rig::start(3, 2, "1M", &["--lock-ttl", TTL, "--lock-mode", "exclusive"]);
    rig.cluster.dog_ok(&["vdi", "create", "x", "8M"]);
    let plain = mount(tmp.path(), &rig.cluster, "plain", &[]);
    let cached = mount(
        tmp.path(),
        &rig.cluster,
        "cached",
        &cache_args(&tmp.path().join("cache"), "64M"),
    );

    // The first mount (no cache) writes: it holds the lock, leased, under its mount point.
    let f = open_rw(rig.path("x"));
    f.write_all_at(b"first", 0).unwrap();
    let l = locks(&rig.cluster);
    assert_eq!(l.len(), 1, "{l:?}");
    assert_eq!(l[0]["leased"], true, "{l:?}");
    let owner = l[0]["owner"].as_str().unwrap().to_string();
    assert!(
        owner.ends_with(&format!("/mount:{}", rig.mount.dir.display())),
        "{owner}"
    );
    // Refused by a mount without a cache and by one with, the same errno and the same words.
    refused(plain.path("x"));
    refused(cached.path("x"));
    let line = refusal_line(&log_of(tmp.path(), "plain"));
    assert_eq!(line, refusal_line(&log_of(tmp.path(), "cached")));
    assert!(line.contains(&format!("(owner {owner})")), "{line}");
    // Readers are not writers.
    let mut b = [0u8; 5];
    std::fs::File::open(plain.path("x"))
        .unwrap()
        .read_exact_at(&mut b, 0)
        .unwrap();
    assert_eq!(&b, b"first");
    // Its lease is renewed: still held well past the TTL.
    std::thread::sleep(Duration::from_secs(3));
    refused(plain.path("x"));
    // Two read-write files of the VDI on the first mount share the lock.
    let f2 = open_rw(rig.path("x"));
    drop(f);
    refused(plain.path("x"));

    // The last close releases it: the other mount without a cache now writes, and the
    // first one is refused the same way.
    drop(f2);
    wait_until("the lock released at close", Duration::from_secs(5), || {
        locks(&rig.cluster).is_empty()
    });
    let g = open_rw(plain.path("x"));
    g.write_all_at(b"second", 0).unwrap();
    refused(rig.path("x"));
    let first_log = std::fs::read_to_string(rig.cluster.dir.path().join("sheepfs.log")).unwrap();
    let line = refusal_line(&first_log);
    assert!(
        line.contains("/mount:") && line.contains("mnt-plain"),
        "{line}"
    );
    drop(g);
    wait_until("the lock released at close", Duration::from_secs(5), || {
        locks(&rig.cluster).is_empty()
    });

    // A cache holds it (until it unmounts): both mounts without a cache are refused.
    let h = open_rw(cached.path("x"));
    h.write_all_at(b"third", 0).unwrap();
    h.sync_all().unwrap();
    drop(h);
    refused(rig.path("x"));
    refused(plain.path("x"));
    assert_eq!(
        refusal_line(&log_of(tmp.path(), "plain")),
        refusal_line(&std::fs::read_to_string(rig.cluster.dir.path().join("sheepfs.log")).unwrap())
    );
    drop(cached);
    wait_until(
        "the cache's lock released at unmount",
        Duration::from_secs(10),
        || locks(&rig.cluster).is_empty(),
    );

    // rm right after the last close works: the close's lock is released first.
    let k = open_rw(rig.path("x"));
    k.write_all_at(b"fourth", 0).unwrap();
    drop(k);
    std::fs::remove_file(rig.path("x")).unwrap();
    assert!(!rig.cluster.dog(&["vdi", "info", "x"]).status.success());
}

#[test]
fn a_killed_mount_without_a_cache_loses_its_lock_within_its_ttl_and_a_lost_lock_fails_writes() {
    let tmp = tempfile::tempdir().unwrap();
    let mut rig = Rig::start(3, 2, "1M", &["--lock-ttl", TTL, "--lock-mode", "exclusive"]);
    rig.cluster.dog_ok(&["vdi", "create", "x", "8M"]);
    let other = mount(tmp.path(), &rig.cluster, "plain", &[]);

    // kill -9 with a file open read-write: nobody renews the lease; the lock frees itself.
    let f = open_rw(rig.path("x"));
    f.write_all_at(b"first", 0).unwrap();
    refused(other.path("x"));
    drop(f);
    rig.mount.kill9();
    wait_until(
        "the dead mount's lock to free itself",
        Duration::from_secs(10),
        || locks(&rig.cluster).is_empty(),
    );
    let g = open_rw(other.path("x"));
    let mut b = [0u8; 5];
    g.read_exact_at(&mut b, 0).unwrap();
    assert_eq!(&b, b"first");

    // The lock broken, and another attachment (dog vdi lock acquire) before the holder's
    // next renewal: the holder's lock is lost, and its writes fail with EIO.
    let attached = || {
        let out = rig.cluster.dog(&["vdi", "lock", "break", "x"]);
        assert!(out.status.success());
        rig.cluster
            .dog(&["vdi", "lock", "acquire", "x", "--owner", "intruder"])
            .status
            .success()
    };
    wait_until(
        "another attachment after a break",
        Duration::from_secs(20),
        attached,
    );
    wait_until(
        "writes to fail once the lock is lost",
        Duration::from_secs(10),
        || match g.write_all_at(b"late", 0) {
            Ok(()) => false,
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
                true
            }
        },
    );
    assert!(log_of(tmp.path(), "plain").contains("lost the lock of VDI 'x'"));
    assert_eq!(g.sync_all().unwrap_err().raw_os_error(), Some(libc::EIO));
    // A new read-write open tries the lock again: refused while the intruder holds it; once
    // it lets go, taken, and every file of the VDI on that mount writes again.
    refused(other.path("x"));
    rig.cluster
        .dog_ok(&["vdi", "lock", "release", "x", "--owner", "intruder"]);
    let g2 = open_rw(other.path("x"));
    g.write_all_at(b"again", 0).unwrap();
    g.sync_all().unwrap();
    drop(g2);
    assert_eq!(rig.cluster.read_vdi("x", 0, 5), b"again");
    assert!(log_of(tmp.path(), "plain").contains("VDI 'x' locked again after its lock was lost"));
}

#[test]
fn no_lock_writes_a_vdi_held_elsewhere_and_is_refused_with_a_cache() {
    let tmp = tempfile::tempdir().unwrap();
    let rig = Rig::start(3, 2, "1M", &["--lock-mode", "exclusive"]);
    rig.cluster.dog_ok(&["vdi", "create", "x", "8M"]);
    let free = mount(tmp.path(), &rig.cluster, "free", &["--no-lock".into()]);
    let f = open_rw(rig.path("x"));
    f.write_all_at(b"held", 0).unwrap();
    let gen_before = rig.cluster.dog_json(&["vdi", "lock", "list"])[0]["gen"].clone();
    // Opens read-write, writes, takes no lock.
    let g = open_rw(free.path("x"));
    g.write_all_at(b"free", 0).unwrap();
    g.sync_all().unwrap();
    assert_eq!(locks(&rig.cluster).len(), 1);
    let mut b = [0u8; 4];
    f.read_exact_at(&mut b, 0).unwrap();
    assert_eq!(&b, b"free");
    assert!(gen_before.is_u64());

    let out = std::process::Command::new(SHEEPFS)
        .args([
            "--cluster",
            &rig.cluster.addr(0),
            "--no-lock",
            "--foreground",
        ])
        .arg("--cache-dir")
        .arg(tmp.path().join("c"))
        .arg(tmp.path().join("mnt-x"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--no-lock is for a mount without a cache"),
        "{err}"
    );
}

/// Unmounting right after the last close leaves no lock behind, and the process exits
/// cleanly (no panic on the way).
#[test]
fn unmount_right_after_close_leaves_no_lock() {
    let mut rig = Rig::start(
        3,
        2,
        "1M",
        &["--lock-ttl", "30s", "--lock-mode", "exclusive"],
    );
    rig.cluster.dog_ok(&["vdi", "create", "x", "8M"]);
    let f = open_rw(rig.path("x"));
    f.write_all_at(b"bye", 0).unwrap();
    drop(f);
    rig.mount.unmount_and_wait();
    // Well inside the 30 s lease: released, not expired.
    assert!(locks(&rig.cluster).is_empty(), "{:?}", locks(&rig.cluster));
    let log = std::fs::read_to_string(rig.cluster.dir.path().join("sheepfs.log")).unwrap();
    assert!(!log.contains("panicked"), "{log}");
    assert_eq!(rig.cluster.read_vdi("x", 0, 3), b"bye");
}
