//! VDI attachment locks bound to leases, with real mounts and a real cluster: a live mount
//! keeps its lock (renewed through any node, a node's death included), a mount killed with
//! kill -9 loses it within its TTL, and another host then attaches without `dog vdi lock
//! break`.

mod common;

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{cache_args, open_rw, strs, Rig, SHEEPFS};
use objstore_client::{lock, Client};
use serde_json::Value;
use testkit::cluster::Cluster;
use testkit::mount::Mount;
use testkit::{pseudo_random, wait_until};

const TTL: &str = "2s";
const TTL_SECS: u64 = 2;

fn locks(c: &Cluster) -> Vec<Value> {
    c.dog_json(&["vdi", "lock", "list"])
        .as_array()
        .expect("a JSON array")
        .clone()
}

/// Mount options: a cache in `dir`, locks under a lease of [`TTL`].
fn leased_cache_args(dir: &Path) -> Vec<String> {
    let mut a = cache_args(dir, "64M");
    a.extend(["--lock-ttl".into(), TTL.into()]);
    a
}

/// A rig whose mount has a cache and a lock TTL of [`TTL`]. The TempDir holds the caches and
/// the second mount's directory; bound first, it is dropped last.
fn rig(nodes: usize) -> (tempfile::TempDir, Rig) {
    let tmp = tempfile::tempdir().unwrap();
    let args = leased_cache_args(&tmp.path().join("cache"));
    (tmp, Rig::start(nodes, 2, "1M", &strs(&args)))
}

/// Another "host": its own mount and cache directory on the same cluster, through node `via`.
fn second_mount(tmp: &Path, c: &Cluster, via: usize) -> Mount {
    let mut args = leased_cache_args(&tmp.join("cache2"));
    // Refused, not handed over: the lease alone decides.
    args.extend(["--lock-mode".to_string(), "exclusive".to_string()]);
    Mount::start(
        Path::new(SHEEPFS),
        &c.addr(via),
        &tmp.join("mnt2"),
        &tmp.join("second.log"),
        &strs(&args),
    )
}

#[test]
fn a_killed_mount_loses_its_lock_within_its_ttl() {
    let (tmp, mut rig) = rig(3);
    rig.cluster.dog_ok(&["vdi", "create", "l", "8M"]);
    let data = pseudo_random(3 << 20, 21);
    let f = open_rw(rig.path("l"));
    f.write_all_at(&data, 0).unwrap();
    f.sync_all().unwrap();

    let l = locks(&rig.cluster);
    assert_eq!(l.len(), 1, "{l:?}");
    assert_eq!(l[0]["vdi"], "l");
    assert_eq!(l[0]["leased"], true, "{l:?}");
    assert_eq!(l[0]["ttl_secs"], TTL_SECS, "{l:?}");
    let table = String::from_utf8(rig.cluster.dog_ok(&["vdi", "lock", "list"])).unwrap();
    assert!(table.contains("lease 2s"), "{table}");
    let owner = l[0]["owner"].clone();

    // While the first mount lives, its renewals keep the lock well past the TTL: a second
    // host is refused, before and after.
    let second = second_mount(tmp.path(), &rig.cluster, 1);
    let refused = || {
        let e = std::fs::OpenOptions::new()
            .write(true)
            .open(second.path("l"))
            .unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EBUSY), "{e}");
    };
    refused();
    // Not a readiness wait: the time the lease must outlive.
    std::thread::sleep(Duration::from_secs(3 * TTL_SECS));
    refused();
    let l = locks(&rig.cluster);
    assert_eq!((l.len(), &l[0]["owner"]), (1, &owner), "{l:?}");

    // kill -9: nobody renews the lease; the lock frees itself within the TTL (plus a tick of
    // the store and the time dog takes).
    drop(f);
    let killed = Instant::now();
    rig.mount.kill9();
    wait_until(
        "the dead mount's lock to free itself",
        Duration::from_secs(TTL_SECS + 5),
        || locks(&rig.cluster).is_empty(),
    );
    let freed = killed.elapsed();
    assert!(
        freed >= Duration::from_secs(TTL_SECS) - Duration::from_millis(800),
        "freed after {freed:?}: before its lease could have ended"
    );

    // The second host attaches read-write with no 'dog vdi lock break', and sees every
    // write the first one fsynced.
    let f2 = open_rw(second.path("l"));
    let mut back = vec![0u8; data.len()];
    f2.read_exact_at(&mut back, 0).unwrap();
    assert!(
        back == data,
        "the second mount reads the first one's writes"
    );
    f2.write_all_at(b"second", 0).unwrap();
    f2.sync_all().unwrap();
    let l = locks(&rig.cluster);
    assert_eq!(l.len(), 1, "{l:?}");
    assert_ne!(l[0]["owner"], owner, "{l:?}");
    assert_eq!(l[0]["leased"], true, "{l:?}");
    drop(f2);
    drop(second);
}

#[test]
fn lock_renewals_move_on_when_their_node_dies() {
    let (_tmp, mut rig) = rig(3);
    rig.cluster.dog_ok(&["vdi", "create", "r", "8M"]);
    let f = open_rw(rig.path("r"));
    f.write_all_at(b"before", 0).unwrap();
    f.sync_all().unwrap();
    let before = locks(&rig.cluster);
    assert_eq!(before.len(), 1, "{before:?}");

    // The client asks the nodes in view order (by id): the first one is the renewals' node.
    let nodes = rig.cluster.dog_json(&["node", "list"]);
    let first = nodes[0]["addr"].as_str().unwrap().to_string();
    let i = (0..3)
        .find(|&i| rig.cluster.addr(i) == first)
        .expect("the first node of the view is one of ours");
    rig.cluster.kill9(i);
    // Several TTLs with that node dead (its death noticed, a new epoch), then it comes back.
    std::thread::sleep(Duration::from_secs(3 * TTL_SECS));
    assert_eq!(locks(&rig.cluster), before, "same lock, same lease");
    rig.cluster.start_node(i);
    rig.cluster.wait_members(3);
    std::thread::sleep(Duration::from_secs(2 * TTL_SECS));
    assert_eq!(locks(&rig.cluster), before, "same lock, same lease");
    let log = rig.mount.log_tail();
    assert!(!log.contains("lost the lock"), "{log}");
    assert!(!log.contains("lock taken back"), "{log}");
    // The attachment still writes.
    f.write_all_at(b"after", 0).unwrap();
    f.sync_all().unwrap();
    assert_eq!(rig.cluster.read_vdi("r", 0, 6), b"aftere");
}

/// A lock broken under a live mount comes back (nobody attached meanwhile), same generation;
/// a mount frozen past its TTL while another host attached loses the VDI: its writes fail
/// with EIO instead of landing over the other host's.
#[test]
fn a_mount_cut_off_past_its_ttl_stops_writing_once_another_host_attached() {
    let (tmp, rig) = rig(3);
    rig.cluster.dog_ok(&["vdi", "create", "x", "8M"]);
    let f = open_rw(rig.path("x"));
    f.write_all_at(b"first", 0).unwrap();
    f.sync_all().unwrap();
    let held = locks(&rig.cluster);
    assert_eq!(held.len(), 1, "{held:?}");

    // Broken while the holder lives and nobody takes it: the holder's next renewal finds its
    // lease ended and takes the lock back, same generation, under a new lease.
    rig.cluster.dog_ok(&["vdi", "lock", "break", "x"]);
    wait_until(
        "the live holder to take its broken lock back",
        Duration::from_secs(TTL_SECS + 5),
        || locks(&rig.cluster).len() == 1,
    );
    let back = locks(&rig.cluster);
    assert_eq!(
        (&back[0]["owner"], &back[0]["gen"]),
        (&held[0]["owner"], &held[0]["gen"]),
        "{back:?}"
    );
    assert_ne!(back[0]["lease"], held[0]["lease"], "{back:?}");
    assert!(rig.mount.log_tail().contains("lock taken back"));
    f.write_all_at(b"again", 0).unwrap();
    f.sync_all().unwrap();

    // Frozen (a host cut off) past its TTL: its lock frees itself, and another host attaches
    // and writes. While the mount is frozen this process must neither touch it nor start a
    // process (the exec would close `f`, and a FUSE close waits for the frozen daemon): the
    // second mount starts first, and the lock is watched through the client library.
    let second = second_mount(tmp.path(), &rig.cluster, 1);
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let addr = rig.cluster.addr(1).parse().unwrap();
    let client = rt
        .block_on(Client::connect(&[addr], testkit::auth::client_options()))
        .unwrap();
    let frozen = testkit::pause::Paused::stop(rig.mount.pid()).unwrap();
    wait_until(
        "the frozen mount's lock to free itself",
        Duration::from_secs(TTL_SECS + 5),
        || rt.block_on(lock::list(&client)).unwrap().is_empty(),
    );
    let f2 = open_rw(second.path("x"));
    f2.write_all_at(b"other", 0).unwrap();
    f2.sync_all().unwrap();
    frozen.resume().unwrap();
    wait_until(
        "the resumed mount to find its lock lost",
        Duration::from_secs(TTL_SECS + 10),
        || rig.mount.log_tail().contains("lost the lock of VDI 'x'"),
    );
    let e = f.write_all_at(b"stale", 0).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    assert_eq!(rig.cluster.read_vdi("x", 0, 5), b"other");
    let l = locks(&rig.cluster);
    assert_eq!(l.len(), 1, "{l:?}");
    assert_ne!(l[0]["owner"], held[0]["owner"], "{l:?}");
    drop((f, f2, second));
}
