//! Snapshots in the mount: `NAME@TAG` read-only files, snapshots and rollbacks of a VDI the
//! mount holds through its writeback cache (asked with cachectl, or by dog finding the VDI
//! attached here), with a real cluster, a real FUSE mount, fio, cp and qemu-img.

mod common;

use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{
    cachectl_ok, fio_verify_args, open_rw, remount, rig_with_cache, run, stats, stdout, strs,
};
use serde_json::Value;
use testkit::{pseudo_random, wait_until};

const MIB: u64 = 1 << 20;

fn errno_of<T: std::fmt::Debug>(r: std::io::Result<T>) -> i32 {
    r.expect_err("should have failed")
        .raw_os_error()
        .expect("an OS error")
}

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

/// `qemu-img compare` of two raw images: true if identical (exit 0), false if they differ
/// (exit 1); panics on an error (exit 2).
fn qemu_identical(a: &str, b: &str) -> bool {
    let out = Command::new("qemu-img")
        .args(["compare", "-f", "raw", "-F", "raw", a, b])
        .output()
        .expect("run qemu-img (make test installs it)");
    match out.status.code() {
        Some(0) => true,
        Some(1) => {
            eprintln!("qemu-img compare {a} {b}: {}", stdout(&out));
            false
        }
        _ => panic!(
            "qemu-img compare {a} {b} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

#[test]
fn snapshot_files_are_read_only_and_equal_a_copy_taken_at_snapshot_time() {
    let (_tmp, rig, cache) = rig_with_cache(3, "64M");
    rig.cluster.dog_ok(&["vdi", "create", "disk", "16M"]);
    let f = open_rw(rig.path("disk"));
    let a = pseudo_random(6 * MIB as usize, 1);
    f.write_all_at(&a, 512 * 1024).unwrap();
    assert!(
        stats(&cache)["dirty"].as_u64().unwrap() > 0,
        "writeback: dirty in the cache"
    );
    let copy = rig.scratch("copy.raw");
    std::fs::copy(rig.path("disk"), &copy).unwrap();

    let out = cachectl_ok(&cache, &["snapshot", "disk", "-s", "t", "--json"]);
    let done: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(done["snapshot"], "disk@t", "{done}");
    assert_eq!(done["attached"], true, "{done}");
    assert_eq!(done["open"], true, "{done}");
    assert!(
        done["flushed"].as_u64().unwrap() >= a.len() as u64,
        "{done}"
    );
    assert_ne!(done["vid"], done["new_vid"], "{done}");
    assert_eq!(stats(&cache)["dirty"], 0);

    // Listed, read-only, the VDI's size.
    let dir = rig.mount.dir.clone();
    assert_eq!(names(&dir), ["disk", "disk@t"]);
    let snap = rig.path("disk@t");
    let meta = std::fs::metadata(&snap).unwrap();
    assert_eq!(meta.len(), 16 * MIB);
    assert_eq!(meta.permissions().mode() & 0o777, 0o444);
    assert_eq!(
        errno_of(std::fs::OpenOptions::new().write(true).open(&snap)),
        libc::EROFS
    );
    assert_eq!(errno_of(open_rw_result(&snap)), libc::EROFS);
    let c = std::ffi::CString::new(snap.clone()).unwrap();
    // SAFETY: a valid path; truncate(2) touches nothing of this process.
    assert_eq!(unsafe { libc::truncate(c.as_ptr(), 0) }, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EROFS)
    );
    assert_eq!(errno_of(std::fs::remove_file(&snap)), libc::EPERM);

    // The VDI goes on through the same open file, and the snapshot keeps what it had.
    let b = pseudo_random(2 * MIB as usize, 2);
    f.write_all_at(&b, 512 * 1024).unwrap();
    let mut back = vec![0u8; b.len()];
    f.read_exact_at(&mut back, 512 * 1024).unwrap();
    assert!(back == b, "the VDI reads its new writes");
    assert!(qemu_identical(&snap, &copy), "the snapshot equals the copy");
    let converted = rig.scratch("converted.raw");
    run(
        "qemu-img",
        &["convert", "-f", "raw", "-O", "raw", &snap, &converted],
    );
    assert!(std::fs::read(&converted).unwrap() == std::fs::read(&copy).unwrap());
    f.sync_all().unwrap();
    assert!(rig.cluster.read_vdi("disk", 512 * 1024, b.len() as u64) == b);
    assert!(rig.cluster.read_vdi("disk@t", 512 * 1024, b.len() as u64) == a[..b.len()]);

    // Snapshots come and go with dog.
    rig.cluster.dog_ok(&["vdi", "snapshot", "disk", "-s", "u"]);
    wait_until("disk@u appears", Duration::from_secs(30), || {
        names(&dir).contains(&"disk@u".to_string())
    });
    rig.cluster.dog_ok(&["vdi", "delete", "disk@t"]);
    wait_until("disk@t goes", Duration::from_secs(30), || {
        !names(&dir).contains(&"disk@t".to_string())
    });
    assert_eq!(errno_of(std::fs::metadata(&snap)), libc::ENOENT);
}

fn open_rw_result(p: &str) -> std::io::Result<std::fs::File> {
    std::fs::OpenOptions::new().read(true).write(true).open(p)
}

/// Copies `from` to `to` until two copies in a row are equal: writes still in flight when
/// the writer was paused have landed.
fn settled_copy(from: &str, to: &str) -> Vec<u8> {
    let mut last = std::fs::read(from).unwrap();
    loop {
        let now = std::fs::read(from).unwrap();
        if now == last {
            std::fs::write(to, &now).unwrap();
            return now;
        }
        last = now;
    }
}

#[test]
fn snapshot_during_fio_verify_equals_a_copy_taken_through_the_paused_writer() {
    let (_tmp, rig, cache) = rig_with_cache(3, "128M");
    rig.cluster.dog_ok(&["vdi", "create", "disk", "32M"]);
    let disk = rig.path("disk");
    // About 4 s of writes (each 4 KiB block once, then verified), paused in the middle.
    let args = fio_verify_args(
        &disk,
        "32M",
        // The job is a thread of the process paused (as a process it would run in a
        // session of its own).
        &[
            "--do_verify=1",
            "--number_ios=8000",
            "--rate_iops=2000",
            "--thread",
        ],
    );
    let mut cmd = Command::new("fio");
    cmd.args(strs(&args));
    testkit::die_with_parent(&mut cmd, libc::SIGKILL);
    let mut fio = cmd
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run fio (make test installs it)");
    wait_until("fio writes into the cache", Duration::from_secs(30), || {
        stats(&cache)["dirty"].as_u64().unwrap() > 2 * MIB
    });
    let pid = fio.id() as i32;
    // SAFETY: signals to fio, a child of this test.
    let stop = |sig| unsafe { libc::kill(pid, sig) };
    assert_eq!(stop(libc::SIGSTOP), 0);
    assert!(
        fio.try_wait().unwrap().is_none(),
        "fio was still running when paused"
    );
    let copy = rig.scratch("copy.raw");
    let copied = settled_copy(&disk, &copy);
    let out = rig
        .cluster
        .dog_ok(&["vdi", "snapshot", "disk", "-s", "t", "--json"]);
    let done: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(done["snapshot"], "disk@t", "dog asked the mount: {done}");
    assert_eq!(done["open"], true, "{done}");
    let flushed = done["flushed"].as_u64().unwrap();
    assert!(
        flushed > 0 && flushed < 8000 * 4096,
        "taken in the middle of the writes: {done}"
    );
    assert_eq!(stop(libc::SIGCONT), 0);
    let out = fio.wait_with_output().unwrap();
    assert!(out.status.success(), "fio failed: {}", stdout(&out));
    let v: Value = serde_json::from_slice(&out.stdout).expect("fio json");
    assert_eq!(v["jobs"][0]["error"], 0, "fio verify of the VDI: {v}");
    assert!(
        v["jobs"][0]["write"]["io_bytes"].as_u64().unwrap() > 0,
        "fio wrote"
    );
    let snap = rig.path("disk@t");
    assert!(
        qemu_identical(&snap, &copy),
        "the snapshot equals the copy taken at the pause"
    );
    assert!(
        std::fs::read(&disk).unwrap() != copied,
        "fio wrote the VDI after the snapshot"
    );
    assert!(std::fs::read(&snap).unwrap() == copied);
}

#[test]
fn rollback_under_a_writeback_cache_discards_the_dirty_writes() {
    let (_tmp, mut rig, cache) = rig_with_cache(3, "64M");
    rig.cluster.dog_ok(&["vdi", "create", "disk", "8M"]);
    let f = open_rw(rig.path("disk"));
    let a = pseudo_random(3 * MIB as usize, 1);
    f.write_all_at(&a, 0).unwrap();
    cachectl_ok(&cache, &["snapshot", "disk", "-s", "t"]);
    let b = pseudo_random(2 * MIB as usize, 2);
    f.write_all_at(&b, 4096).unwrap();
    let dirty = stats(&cache)["dirty"].as_u64().unwrap();
    assert!(dirty >= b.len() as u64, "B is dirty in the cache: {dirty}");

    // Refused without confirmation; dog asks the mount holding the VDI.
    let refused = rig.cluster.dog(&["vdi", "rollback", "disk@t"]);
    assert!(!refused.status.success());
    let out = rig.cluster.dog_ok(&["vdi", "rollback", "disk@t", "--yes"]);
    let text = String::from_utf8_lossy(&out);
    assert!(
        text.contains("rolled VDI 'disk' back to 'disk@t'"),
        "{text}"
    );
    assert!(
        text.contains("never pushed (discarded by the rollback)"),
        "{text}"
    );
    assert_eq!(stats(&cache)["dirty"], 0);

    // The open file reads A (the rolled-back data), as does a new open, the cluster and the
    // snapshot.
    let mut back = vec![0u8; a.len()];
    f.read_exact_at(&mut back, 0).unwrap();
    assert!(back == a, "the open file reads the rolled-back data");
    assert!(std::fs::read(rig.path("disk")).unwrap()[..a.len()] == a[..]);
    assert!(rig.cluster.read_vdi("disk", 0, a.len() as u64) == a);
    assert!(std::fs::read(rig.path("disk@t")).unwrap()[..a.len()] == a[..]);
    // It writes the rolled-back VDI, not the snapshot.
    f.write_all_at(b"after", 0).unwrap();
    f.sync_all().unwrap();
    drop(f);
    assert_eq!(rig.cluster.read_vdi("disk", 0, 5), b"after");
    assert!(rig.cluster.read_vdi("disk@t", 0, 5) == a[..5]);

    // After a remount too.
    rig.mount.unmount_and_wait();
    remount(&mut rig, &cache, "64M", "sheepfs2.log");
    let now = std::fs::read(rig.path("disk")).unwrap();
    assert_eq!(&now[..5], b"after");
    assert!(now[5..a.len()] == a[5..]);
    assert!(std::fs::read(rig.path("disk@t")).unwrap()[..a.len()] == a[..]);
}

#[test]
fn dog_refuses_a_snapshot_it_cannot_ask_the_holder_for() {
    let (_tmp, rig, cache) = rig_with_cache(3, "64M");
    rig.cluster.dog_ok(&["vdi", "create", "far", "8M"]);
    rig.cluster.dog_ok(&[
        "vdi",
        "lock",
        "take",
        "far",
        "--owner",
        "vm-9",
        "--host",
        "hv-elsewhere",
    ]);
    let e = rig.cluster.dog_err(&["vdi", "snapshot", "far"]);
    assert!(e.contains("attached read-write by hv-elsewhere"), "{e}");
    assert!(
        e.contains("run 'cachectl snapshot far' on hv-elsewhere"),
        "{e}"
    );
    let e = rig.cluster.dog_err(&["vdi", "snapshot", "far", "-s", "x"]);
    assert!(e.contains("hv-elsewhere"), "{e}");

    // Attached by this host's mount, whose socket is gone.
    rig.cluster.dog_ok(&["vdi", "create", "near", "8M"]);
    let f = open_rw(rig.path("near"));
    f.write_all_at(b"x", 0).unwrap();
    let locks = rig.cluster.dog_json(&["vdi", "lock", "list"]);
    let near = locks
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["vdi"] == "near")
        .cloned()
        .unwrap();
    let sock = cache.join("control.sock");
    assert_eq!(near["control"], sock.to_string_lossy().as_ref(), "{near}");
    std::fs::rename(&sock, cache.join("moved.sock")).unwrap();
    let e = rig.cluster.dog_err(&["vdi", "snapshot", "near"]);
    let host = objstore_client::lock::local_host();
    assert!(e.contains(&format!("attached read-write by {host}")), "{e}");
    assert!(e.contains("is not there"), "{e}");
    std::fs::rename(cache.join("moved.sock"), &sock).unwrap();
    // Nothing was taken.
    let list = stdout(&rig.cluster.dog(&["vdi", "list"]));
    assert!(!list.contains("near@") && !list.contains(" s "), "{list}");
    drop(f);
}
