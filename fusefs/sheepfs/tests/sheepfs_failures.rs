//! Failures around the mount: a node killed under fio, an unreachable cluster, bad mounts.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Rig, SHEEPFS};
use testkit::cluster::{Bins, Cluster};
use testkit::wait_until;

#[test]
fn kill9_a_node_during_fio_verify() {
    let mut rig = Rig::start(4, 3, "1M", &[]);
    rig.cluster.dog_ok(&["vdi", "create", "f", "64M"]);
    let f = rig.path("f");
    let mut fio = Command::new("fio");
    testkit::die_with_parent(&mut fio, libc::SIGKILL);
    let fio = fio
        .args(common::fio_verify_args(
            &f,
            "64M",
            &["--do_verify=1", "--number_ios=12000"],
        ))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run fio (make test installs it)");
    // Kill once the run is well under way.
    wait_until("fio to allocate objects", Duration::from_secs(60), || {
        rig.cluster.dog_json(&["vdi", "info", "f"])["allocated_objects"]
            .as_u64()
            .unwrap()
            >= 16
    });
    rig.cluster.kill9(2);
    let out = fio.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "fio failed after a node died:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["jobs"][0]["error"], 0);
    assert!(v["jobs"][0]["read"]["total_ios"].as_u64().unwrap() >= 12000);
}

#[test]
fn unreachable_cluster_gives_eio_in_bounded_time() {
    let mut rig = Rig::start(1, 1, "1M", &["--timeout", "3"]);
    rig.cluster.dog_ok(&["vdi", "create", "u", "4M"]);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(rig.path("u"))
        .unwrap();
    use std::os::unix::fs::FileExt;
    f.write_all_at(b"data", 0).unwrap();
    rig.cluster.kill9(0);
    let t = Instant::now();
    let e = f.write_all_at(b"more", 0).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    // It retried for about its --timeout (3 s) before giving up, and no longer.
    assert!(
        t.elapsed() >= Duration::from_millis(2500) && t.elapsed() < Duration::from_secs(20),
        "took {:?}",
        t.elapsed()
    );
    let mut buf = [0u8; 4];
    let e = f.read_exact_at(&mut buf, 0).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
}

#[test]
fn bad_mounts_fail_clearly_and_nothing_hangs() {
    let rig = Rig::start(1, 1, "1M", &[]);
    let sheepfs = |args: &[&str]| {
        let out = testkit::auth::with_key(&mut Command::new(SHEEPFS))
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "sheepfs {args:?} should fail");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let addr = rig.cluster.addr(0);
    let mnt = rig.mount.dir.to_string_lossy().into_owned();

    // Already mounted there.
    let e = sheepfs(&["--cluster", &addr, &mnt]);
    assert!(e.contains("already a mount point"), "{e}");
    // Not empty, missing, not a directory.
    let full = rig.scratch("full");
    std::fs::create_dir_all(&full).unwrap();
    std::fs::write(Path::new(&full).join("x"), b"x").unwrap();
    let e = sheepfs(&["--cluster", &addr, &full]);
    assert!(e.contains("not empty"), "{e}");
    let e = sheepfs(&["--cluster", &addr, &rig.scratch("missing")]);
    assert!(e.contains("does not exist"), "{e}");
    // No cluster there: a clear error, promptly.
    let empty = rig.scratch("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let t = Instant::now();
    let e = sheepfs(&["--cluster", "127.0.0.1:1", &empty]);
    assert!(e.contains("cannot reach the cluster at 127.0.0.1:1"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(15));
    assert!(!testkit::mount::is_mounted(Path::new(&empty)));
    // Unformatted cluster.
    let bare = Cluster::start(&Bins::fresh(), 1);
    let e = sheepfs(&["--cluster", &bare.addr(0), &empty]);
    assert!(e.contains("not formatted"), "{e}");

    // Unmounting with a file open: umount says busy, nothing hangs; after close it works.
    rig.cluster.dog_ok(&["vdi", "create", "o", "1M"]);
    let f = std::fs::File::open(rig.path("o")).unwrap();
    let (ok, err) = rig.mount.umount();
    assert!(
        !ok && err.contains("busy"),
        "umount with a file open: {err}"
    );
    drop(f);
    let mut rig = rig;
    rig.mount.unmount_and_wait();

    // A crashed sheepfs leaves a dead mount: users get ENOTCONN at once, never a hang, and a
    // new sheepfs there is refused until it is cleared.
    let mut again = testkit::mount::Mount::start(
        Path::new(SHEEPFS),
        &addr,
        &rig.mount.dir,
        &rig.cluster.dir.path().join("again.log"),
        &[],
    );
    // SAFETY: SIGKILL to the sheepfs this test started, leaving its mount behind.
    unsafe { libc::kill(again.pid() as i32, libc::SIGKILL) };
    wait_until("the mount to die", Duration::from_secs(10), || {
        std::fs::metadata(&rig.mount.dir)
            .err()
            .is_some_and(|e| e.raw_os_error() == Some(libc::ENOTCONN))
    });
    let e = sheepfs(&["--cluster", &addr, &mnt]);
    assert!(e.contains("already a mount point"), "{e}");
    again.kill9();
    assert!(!testkit::mount::is_mounted(&rig.mount.dir));
}

#[test]
fn background_mode_returns_when_ready_and_sigterm_unmounts() {
    let cluster = Cluster::start(&Bins::fresh(), 1);
    cluster.dog_ok(&["cluster", "format", "--copies", "1"]);
    cluster.dog_ok(&["vdi", "create", "bg", "1M"]);
    let mnt = cluster.dir.path().join("bgmnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let mnt = mnt.canonicalize().unwrap();
    let log = cluster.dir.path().join("bg.log");
    let status = testkit::auth::with_key(&mut Command::new(SHEEPFS))
        .arg("--cluster")
        .arg(cluster.addr(0))
        .arg(&mnt)
        .arg("--log-file")
        .arg(&log)
        .status()
        .unwrap();
    assert!(status.success());
    // Ready on return: no polling needed.
    assert!(testkit::mount::is_mounted(&mnt));
    // The daemon, found by its command line in /proc: tracked from here on, so a failing
    // test kills it and detaches its mount.
    let pids = daemons_for(&mnt);
    assert_eq!(pids.len(), 1, "one sheepfs daemon: {pids:?}");
    struct Daemon<'a>(&'a Path, i32);
    impl Drop for Daemon<'_> {
        fn drop(&mut self) {
            // SAFETY: signalling the daemon this test started (gone already on success).
            unsafe { libc::kill(self.1, libc::SIGKILL) };
            testkit::mount::detach(self.0);
        }
    }
    let _guard = Daemon(&mnt, pids[0]);
    assert!(mnt.join("bg").exists());
    // SAFETY: signalling the daemon this test started.
    unsafe { libc::kill(pids[0], libc::SIGTERM) };
    wait_until("SIGTERM to unmount", Duration::from_secs(10), || {
        !testkit::mount::is_mounted(&mnt)
    });
    wait_until("the daemon to exit", Duration::from_secs(10), || {
        // SAFETY: probing a pid.
        unsafe { libc::kill(pids[0], 0) != 0 }
    });
}

/// The pids of sheepfs processes whose command line names `mnt`.
fn daemons_for(mnt: &Path) -> Vec<i32> {
    let want = mnt.to_string_lossy().into_owned();
    let mut pids = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(cmd) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmd
            .split(|&b| b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        if args.first().is_some_and(|a| a.ends_with("sheepfs")) && args.contains(&want) {
            pids.push(pid);
        }
    }
    pids
}
