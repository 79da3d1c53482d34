//! Behaviours of the mount that users meet in their first month: the errno of every refused
//! operation, a VDI attached elsewhere, a second sheepfs on one cache, the flusher's triggers,
//! pushes that fail and later succeed, unmounting with the cluster down, signals with files
//! open, and a node whose disk fills up.

mod common;

use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{
    cache_args, cache_args_aged, cachectl, cachectl_ok, open_rw, stats, strs, Rig, Tmpfs, SHEEPFS,
};
use testkit::mount::{is_mounted, Mount};
use testkit::{pseudo_random, wait_until};

fn errno(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

fn cpath(p: &Path) -> std::ffi::CString {
    std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap()
}

/// The errno of a libc call that returned -1 (panics if it succeeded).
fn last_errno(rc: libc::c_int, what: &str) -> i32 {
    assert_eq!(rc, -1, "{what} succeeded");
    std::io::Error::last_os_error().raw_os_error().unwrap()
}

/// Whether process `pid` has exited (gone, or a zombie not yet reaped by its parent).
fn exited(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(s) => s
            .rsplit(')')
            .next()
            .and_then(|rest| rest.split_whitespace().next())
            .is_some_and(|state| state == "Z" || state == "X"),
    }
}

/// Every errno of docs/sheepfs.md's tables, from the operation that gives it.
#[test]
fn errno_table() {
    let rig = Rig::start(1, 1, "1M", &[]);
    rig.cluster.dog_ok(&["vdi", "create", "e", "4M"]);
    let file = rig.mount.path("e");
    let root = &rig.mount.dir;

    // Not supported: ENOSYS for mkdir, rename, mknod; EPERM for links.
    let e = std::fs::create_dir(root.join("d")).unwrap_err();
    assert_eq!(errno(&e), libc::ENOSYS, "mkdir: {e}");
    let e = std::fs::rename(&file, root.join("f")).unwrap_err();
    assert_eq!(errno(&e), libc::ENOSYS, "rename: {e}");
    let fifo = cpath(&root.join("fifo"));
    // SAFETY: a valid path.
    let rc = unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) };
    assert_eq!(last_errno(rc, "mkfifo"), libc::ENOSYS);
    let e = std::fs::hard_link(&file, root.join("h")).unwrap_err();
    assert_eq!(errno(&e), libc::EPERM, "link: {e}");
    let e = std::os::unix::fs::symlink("e", root.join("s")).unwrap_err();
    assert_eq!(errno(&e), libc::EPERM, "symlink: {e}");

    let f = open_rw(&file);
    // Extended attributes: EOPNOTSUPP.
    let (p, name) = (cpath(&file), c"user.x");
    // SAFETY: valid path, name and value buffer.
    let rc = unsafe { libc::setxattr(p.as_ptr(), name.as_ptr(), b"v".as_ptr().cast(), 1, 0) };
    assert_eq!(last_errno(rc, "setxattr"), libc::EOPNOTSUPP);
    // ioctl: not a block device, ENOTTY.
    let mut size = 0u64;
    // SAFETY: BLKGETSIZE64 writes one u64 into `size`.
    let rc = unsafe { libc::ioctl(f.as_raw_fd(), 0x8008_1272, &mut size) };
    assert_eq!(last_errno(rc, "ioctl BLKGETSIZE64"), libc::ENOTTY);
    // An unsupported fallocate mode: EOPNOTSUPP.
    // SAFETY: a valid descriptor.
    let rc = unsafe { libc::fallocate(f.as_raw_fd(), libc::FALLOC_FL_COLLAPSE_RANGE, 0, 1 << 20) };
    assert_eq!(last_errno(rc, "fallocate collapse"), libc::EOPNOTSUPP);

    // O_CREAT|O_EXCL on an existing VDI: EEXIST.
    let e = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&file)
        .unwrap_err();
    assert_eq!(errno(&e), libc::EEXIST, "{e}");
    // Names: ENAMETOOLONG over 255 bytes.
    let e = std::fs::File::create(root.join("n".repeat(256))).unwrap_err();
    assert_eq!(errno(&e), libc::ENAMETOOLONG, "{e}");
    // Sizes: over 2^24 objects of 1 MiB is EFBIG; shrinking is EINVAL; the size is kept.
    let e = f.set_len((1u64 << 44) + 1).unwrap_err();
    assert_eq!(errno(&e), libc::EFBIG, "{e}");
    let e = f.set_len(1 << 20).unwrap_err();
    assert_eq!(errno(&e), libc::EINVAL, "{e}");
    assert_eq!(f.metadata().unwrap().len(), 4 << 20);
    // A write past the end: ENOSPC.
    let e = f.write_all_at(b"x", 4 << 20).unwrap_err();
    assert_eq!(errno(&e), libc::ENOSPC, "{e}");
    // The mount lives on.
    f.write_all_at(b"ok", 0).unwrap();
}

/// `rm` of a VDI another mount (another host, to the cluster) has attached read-write: EBUSY,
/// and the VDI stays; once that mount lets go, `rm` works.
#[test]
fn rm_is_refused_while_another_mount_has_the_vdi_attached() {
    let tmp = tempfile::tempdir().unwrap();
    let a_cache = tmp.path().join("a");
    let rig = Rig::start(3, 3, "1M", &strs(&cache_args(&a_cache, "64M")));
    rig.cluster.dog_ok(&["vdi", "create", "r", "8M"]);
    let b_cache = tmp.path().join("b");
    let mut b = Mount::start(
        Path::new(SHEEPFS),
        &rig.cluster.addr(1),
        &tmp.path().join("mnt-b"),
        &tmp.path().join("sheepfs-b.log"),
        &strs(&cache_args(&b_cache, "64M")),
    );
    let held = open_rw(rig.mount.path("r"));
    held.write_all_at(b"attached", 0).unwrap();
    let e = std::fs::remove_file(b.path("r")).unwrap_err();
    assert_eq!(errno(&e), libc::EBUSY, "{e}");
    assert_eq!(
        rig.cluster.dog_json(&["vdi", "info", "r"])["size"],
        8u64 << 20
    );
    // Closing is not enough: the VDI stays attached to that cache until it unmounts.
    drop(held);
    let e = std::fs::remove_file(b.path("r")).unwrap_err();
    assert_eq!(errno(&e), libc::EBUSY, "{e}");
    let mut rig = rig;
    rig.mount.unmount_and_wait();
    let locks = rig.cluster.dog_json(&["vdi", "lock", "list"]);
    assert_eq!(locks.as_array().unwrap().len(), 0, "{locks}");
    std::fs::remove_file(b.path("r")).unwrap();
    assert!(!rig.cluster.dog(&["vdi", "info", "r"]).status.success());
    b.unmount_and_wait();
}

/// Two sheepfs on one cache directory would corrupt it: the second is refused, clearly, and
/// the first goes on.
#[test]
fn a_second_sheepfs_on_one_cache_directory_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let rig = Rig::start(1, 1, "1M", &strs(&cache_args(&cache, "64M")));
    let mnt = tmp.path().join("mnt2");
    std::fs::create_dir_all(&mnt).unwrap();
    // Should it wrongly start, it daemonizes and mounts: detached when the test ends (its
    // daemon then exits with its mount).
    struct Detach<'a>(&'a Path);
    impl Drop for Detach<'_> {
        fn drop(&mut self) {
            if is_mounted(self.0) {
                testkit::mount::detach(self.0);
            }
        }
    }
    let _guard = Detach(&mnt);
    let out = testkit::auth::with_key(&mut Command::new(SHEEPFS))
        .arg("--cluster")
        .arg(rig.cluster.addr(0))
        .arg(&mnt)
        .args(strs(&cache_args(&cache, "64M")))
        .output()
        .unwrap();
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a second sheepfs on {cache:?} started"
    );
    assert!(
        e.contains(&*cache.to_string_lossy()) && e.contains("in use"),
        "{e}"
    );
    assert!(!is_mounted(&mnt));
    assert!(cachectl(&cache, &["stats"]).status.success());
}

/// The flusher pushes on its own: above --cache-max-dirty, and after --cache-max-dirty-age.
#[test]
fn the_flusher_pushes_over_max_dirty_and_after_max_age() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let mut args = cache_args(&cache, "256M");
    args.extend(["--cache-max-dirty".into(), "8M".into()]);
    let rig = Rig::start(1, 1, "1M", &strs(&args));
    rig.cluster.dog_ok(&["vdi", "create", "m", "64M"]);
    let data = pseudo_random(32 << 20, 31);
    open_rw(rig.mount.path("m")).write_all_at(&data, 0).unwrap();
    // No fsync, an hour of age allowed: only the max-dirty trigger can push.
    wait_until(
        "dirty data to fall to --cache-max-dirty",
        Duration::from_secs(30),
        || stats(&cache)["dirty"].as_u64().unwrap() <= 8 << 20,
    );
    let s = stats(&cache);
    assert!(
        s["total"]["pushed_bytes"].as_u64().unwrap() >= 24 << 20,
        "{s}"
    );

    let tmp2 = tempfile::tempdir().unwrap();
    let cache2 = tmp2.path().join("cache");
    let args = cache_args_aged(&cache2, "256M", "1");
    let m2 = Mount::start(
        Path::new(SHEEPFS),
        &rig.cluster.addr(0),
        &tmp2.path().join("mnt"),
        &tmp2.path().join("sheepfs.log"),
        &strs(&args),
    );
    rig.cluster.dog_ok(&["vdi", "create", "a", "8M"]);
    let small = pseudo_random(1 << 20, 32);
    open_rw(m2.path("a")).write_all_at(&small, 0).unwrap();
    assert!(stats(&cache2)["dirty"].as_u64().unwrap() > 0);
    // Below max dirty, no fsync: pushed once it is a second old.
    wait_until(
        "dirty data older than 1 s to be pushed",
        Duration::from_secs(30),
        || stats(&cache2)["dirty"] == 0,
    );
    assert!(rig.cluster.read_vdi("a", 0, 1 << 20) == small);
}

/// A push that fails (the only node down) keeps the data dirty; once the node is back, a flush
/// succeeds and the cluster holds the bytes.
#[test]
fn failed_pushes_succeed_once_the_node_returns() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let mut args = cache_args(&cache, "64M");
    args.extend(["--timeout".into(), "3".into()]);
    let mut rig = Rig::start(1, 1, "1M", &strs(&args));
    rig.cluster.dog_ok(&["vdi", "create", "p", "8M"]);
    let data = pseudo_random(3 << 20, 33);
    let f = open_rw(rig.mount.path("p"));
    f.write_all_at(&data, 0).unwrap();
    rig.cluster.kill9(0);
    assert!(!cachectl(&cache, &["flush"]).status.success());
    assert_eq!(stats(&cache)["dirty"], 3u64 << 20);
    rig.cluster.start_node(0);
    cachectl_ok(&cache, &["flush"]);
    assert_eq!(stats(&cache)["dirty"], 0);
    f.sync_all().unwrap();
    assert!(rig.cluster.read_vdi("p", 0, 3 << 20) == data);
}

/// Unmounting with the cluster down: sheepfs exits, the dirty data stays recorded in the
/// cache, and the next mount pushes it. The lock is bound to a lease that nobody renews once
/// sheepfs exited, and with the cluster down it could not be made persistent: sheepfs says so,
/// the lock frees itself, and the next mount (same cache, nobody attached since) takes it
/// back at its generation.
#[test]
fn unmount_with_the_cluster_down_keeps_dirty_data_for_the_next_mount() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let mut args = cache_args(&cache, "64M");
    args.extend(["--timeout".into(), "3".into()]);
    let mut rig = Rig::start(1, 1, "1M", &strs(&args));
    rig.cluster.dog_ok(&["vdi", "create", "u", "8M"]);
    let data = pseudo_random(2 << 20, 34);
    open_rw(rig.mount.path("u")).write_all_at(&data, 0).unwrap();
    rig.cluster.kill9(0);
    let pid = rig.mount.pid();
    let (ok, err) = rig.mount.umount();
    assert!(ok, "umount: {err}");
    wait_until("sheepfs to exit", Duration::from_secs(60), || exited(pid));
    let log = std::fs::read_to_string(rig.cluster.dir.path().join("sheepfs.log")).unwrap();
    assert!(
        log.contains("dirty"),
        "the exit names the data left dirty:\n{log}"
    );
    assert!(
        log.contains("could not be made persistent"),
        "the exit says the lock may free itself:\n{log}"
    );
    rig.cluster.start_node(0);
    // Reap the exited sheepfs, so dropping its Mount cannot detach the next one.
    rig.mount.kill9();
    rig.mount = Mount::start(
        Path::new(SHEEPFS),
        &rig.cluster.addr(0),
        &rig.mount.dir.clone(),
        &rig.cluster.dir.path().join("sheepfs2.log"),
        &strs(&args),
    );
    wait_until(
        "the dirty data to be pushed",
        Duration::from_secs(30),
        || stats(&cache)["dirty"] == 0,
    );
    assert!(rig.cluster.read_vdi("u", 0, 2 << 20) == data);
}

/// SIGTERM, SIGINT and SIGHUP with a file still open: sheepfs unmounts and exits, and every
/// acknowledged byte is in the cluster or recorded dirty for the next mount, which pushes it.
#[test]
fn signals_with_files_open_keep_every_acknowledged_write() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let args = cache_args(&cache, "64M");
    let mut rig = Rig::start(1, 1, "1M", &strs(&args));
    rig.cluster.dog_ok(&["vdi", "create", "g", "8M"]);
    for (i, sig) in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP]
        .into_iter()
        .enumerate()
    {
        let data = pseudo_random(1 << 20, 40 + i as u64);
        let at = i as u64 * (2 << 20);
        let f = open_rw(rig.mount.path("g"));
        f.write_all_at(&data, at).unwrap();
        let pid = rig.mount.pid();
        // SAFETY: signalling our own child.
        unsafe { libc::kill(pid as libc::pid_t, sig) };
        wait_until(
            "sheepfs to exit on a signal",
            Duration::from_secs(30),
            || exited(pid),
        );
        drop(f);
        assert!(
            !is_mounted(&rig.mount.dir),
            "sheepfs unmounted before it exited"
        );
        // Reap the exited sheepfs, so dropping its Mount cannot detach the next one.
        rig.mount.kill9();
        rig.mount = Mount::start(
            Path::new(SHEEPFS),
            &rig.cluster.addr(0),
            &rig.mount.dir.clone(),
            &rig.cluster.dir.path().join(format!("sheepfs-{i}.log")),
            &strs(&args),
        );
        wait_until("dirty data to be pushed", Duration::from_secs(30), || {
            stats(&cache)["dirty"] == 0
        });
        assert!(
            rig.cluster.read_vdi("g", at, 1 << 20) == data,
            "signal {sig}: the write did not reach the cluster"
        );
    }
}

/// The only node's disk fills up: the write that does not fit fails with ENOSPC, everything
/// written before reads back, the node keeps serving, and freeing space (deleting a VDI) lets
/// writes go on.
#[test]
fn a_full_node_disk_is_enospc_and_nothing_written_is_lost() {
    let mut cluster = testkit::cluster::Cluster::start(&testkit::cluster::Bins::fresh(), 1);
    cluster.kill9(0);
    let _disk = Tmpfs::mount(&cluster.node_dir(0), "24M", cluster.dir.path());
    cluster.start_node(0);
    cluster.wait_members(1);
    cluster.dog_ok(&["cluster", "format", "--copies", "1", "--object-size", "1M"]);
    let mount = Mount::start(
        Path::new(SHEEPFS),
        &cluster.addr(0),
        &cluster.dir.path().join("mnt"),
        &cluster.dir.path().join("sheepfs.log"),
        &["--timeout", "5"],
    );
    let rig = Rig { mount, cluster };
    rig.cluster.dog_ok(&["vdi", "create", "spare", "8M"]);
    rig.cluster.dog_ok(&["vdi", "create", "full", "64M"]);
    rig.cluster
        .write_vdi("spare", 0, &pseudo_random(6 << 20, 50));
    let f = open_rw(rig.mount.path("full"));
    let mut written = 0u64;
    let err = loop {
        let chunk = pseudo_random(1 << 20, 51 + written);
        match f.write_all_at(&chunk, written << 20) {
            Ok(()) => written += 1,
            Err(e) => break e,
        }
        assert!(written < 64, "64 MiB fit on a 24 MiB disk");
    };
    assert_eq!(errno(&err), libc::ENOSPC, "{err}");
    assert!(written >= 8, "only {written} MiB fit");
    for i in 0..written {
        let mut back = vec![0u8; 1 << 20];
        f.read_exact_at(&mut back, i << 20).unwrap();
        assert!(
            back == pseudo_random(1 << 20, 51 + i),
            "MiB {i} differs after ENOSPC"
        );
    }
    assert!(rig.cluster.dog(&["node", "list"]).status.success());
    // Free space: the write goes on.
    rig.cluster.dog_ok(&["vdi", "delete", "spare"]);
    let chunk = pseudo_random(1 << 20, 99);
    f.write_all_at(&chunk, written << 20).unwrap();
    f.sync_all().unwrap();
    assert!(rig.cluster.read_vdi("full", written << 20, 1 << 20) == chunk);
}
