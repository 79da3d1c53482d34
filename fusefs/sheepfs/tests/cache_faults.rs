//! The object cache under faults, with a real mount on a real cluster: a cache disk that
//! fills up under fio verify, and `rm` of a VDI with dirty data while the cluster is down.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{cache_args, cachectl_ok, fio, fio_verify_args as fio_job, stats, strs, Rig, Tmpfs};
use testkit::wait_until;

/// Fills what the disk at `dir` has left with the file `name`: writes to it fail with ENOSPC
/// from then on. Returns its path.
fn fill(dir: &Path, name: &str) -> PathBuf {
    use std::io::Write;
    let p = dir.join(name);
    let mut f = std::fs::File::create(&p).unwrap();
    let block = vec![0x5au8; 4096];
    while f.write_all(&block).is_ok() {}
    p
}

fn total(cache: &Path, k: &str) -> u64 {
    stats(cache)["total"][k].as_u64().unwrap()
}

/// A cache whose disk (a 24 MiB tmpfs, under a 256 MiB bound) is filled to the brim under
/// fio verify: no write fails. First the disk fills while fio writes (the cache pushes and
/// evicts its own objects to make room on it); then the disk is full with nothing the cache
/// can free, and writes go straight to the cluster (counted, and logged once). fio verifies
/// every pass, through the mount and, with the cache emptied, from the cluster.
#[test]
fn a_cache_disk_filled_to_the_brim_under_fio_verify_fails_no_write() {
    let tmp = tempfile::tempdir().unwrap();
    let disk = Tmpfs::mount(&tmp.path().join("disk"), "24M", tmp.path());
    let cache = disk.0.join("cache");
    let args = cache_args(&cache, "256M");
    let rig = Rig::start(3, 3, "1M", &strs(&args));
    rig.cluster.dog_ok(&["vdi", "create", "full", "64M"]);
    let f = rig.path("full");
    let log = rig.cluster.dir.path().join("sheepfs.log");
    let run = |ios: &str, extra: &[&str]| {
        let n = format!("--number_ios={ios}");
        let mut a = vec!["--rw=randwrite", &n[..], "--fsync=64"];
        a.extend_from_slice(extra);
        fio(&strs(&fio_job(&f, "64M", &a)));
    };

    // 1. The disk fills while fio writes and verifies: the ballast takes what the cache
    // leaves once it holds some dirty data.
    let writer = {
        let f = f.clone();
        std::thread::spawn(move || {
            fio(&strs(&fio_job(
                &f,
                "64M",
                &["--rw=randwrite", "--do_verify=1", "--number_ios=12000"],
            )))
        })
    };
    wait_until("dirty data in the cache", Duration::from_secs(60), || {
        writer.is_finished() || stats(&cache)["dirty"].as_u64().unwrap() >= 4 << 20
    });
    let ballast = fill(&disk.0, "ballast");
    writer
        .join()
        .expect("fio verify passed while the disk filled up");
    let st = stats(&cache);
    assert!(
        st["total"]["evictions"].as_u64().unwrap() > 0,
        "the cache freed its own objects to go on: {st}"
    );

    // 2. Nothing the cache can free: the cache emptied, the disk filled again.
    cachectl_ok(&cache, &["evict"]);
    let ballast2 = fill(&disk.0, "ballast2");
    run("6000", &["--do_verify=1"]);
    let through = total(&cache, "full_writethroughs");
    let bytes = total(&cache, "full_writethrough_bytes");
    assert!(through > 0 && bytes >= through * 4096, "{}", stats(&cache));
    let st = stats(&cache);
    assert_eq!(
        st["used"], st["total"]["used"],
        "no reserved bytes leaked: {st}"
    );
    let logged = std::fs::read_to_string(&log).unwrap();
    let episodes = logged
        .matches("writes it cannot take go straight to the cluster")
        .count();
    assert!(
        (1..=3).contains(&episodes),
        "logged once per episode, not per write: {episodes} times"
    );

    // 3. Room again: the cache takes writes again, and everything verifies, through the
    // cache and from the cluster alone.
    std::fs::remove_file(ballast).unwrap();
    std::fs::remove_file(ballast2).unwrap();
    run("3000", &["--do_verify=1"]);
    assert!(stats(&cache)["dirty"].as_u64().unwrap() > 0, "cached again");
    assert_eq!(total(&cache, "full_writethroughs"), through);
    cachectl_ok(&cache, &["evict"]);
    assert_eq!(stats(&cache)["used"], 0);
    run("3000", &["--verify_only"]);
    drop(rig);
}

/// `rm` of a VDI with dirty data in the cache while the cluster is down fails (EIO, the
/// reason in the log) and keeps the dirty data; with the cluster back it deletes the VDI,
/// and only then the cached data. (It used to drop the dirty data first, and lose it when
/// the cluster delete failed.)
#[test]
fn rm_with_dirty_data_and_the_cluster_down_keeps_the_data() {
    use std::os::unix::fs::FileExt;
    let (_tmp, mut rig, cache, _) = common::rig_with_cache_and(1, 1, "64M", &["--timeout", "3"]);
    rig.cluster.dog_ok(&["vdi", "create", "gone", "8M"]);
    let data = testkit::pseudo_random(3 << 20, 7);
    common::open_rw(rig.path("gone"))
        .write_all_at(&data, 4096)
        .unwrap();
    let dirty = stats(&cache)["dirty"].as_u64().unwrap();
    assert_eq!(dirty, 3 << 20);
    let vid_dir = std::fs::read_dir(cache.join("obj"))
        .unwrap()
        .next()
        .expect("the VDI's cached objects")
        .unwrap()
        .path();

    rig.cluster.kill9(0);
    let err = std::fs::remove_file(rig.path("gone")).expect_err("rm with the cluster down");
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err}");
    let st = stats(&cache);
    assert_eq!(st["dirty"], dirty, "the dirty data stays: {st}");
    assert!(vid_dir.exists());
    let logged = std::fs::read_to_string(rig.cluster.dir.path().join("sheepfs.log")).unwrap();
    assert!(logged.contains("unlink gone"), "the failure is logged");

    rig.cluster.start_node(0);
    rig.cluster.wait_members(1);
    // The dirty data is intact: it reads back through the mount (from the cache).
    let mut back = vec![0u8; data.len()];
    std::fs::File::open(rig.path("gone"))
        .unwrap()
        .read_exact_at(&mut back, 4096)
        .unwrap();
    assert!(back == data, "the dirty data reads back");
    assert_eq!(stats(&cache)["dirty"], dirty);
    wait_until("rm to work again", Duration::from_secs(60), || {
        std::fs::remove_file(rig.path("gone")).is_ok()
    });
    let st = stats(&cache);
    assert_eq!(
        (st["dirty"].as_u64(), st["used"].as_u64()),
        (Some(0), Some(0)),
        "{st}"
    );
    assert!(st["vdis"].as_array().unwrap().is_empty(), "{st}");
    assert!(!vid_dir.exists() || std::fs::read_dir(&vid_dir).unwrap().next().is_none());
    let list = rig.cluster.dog_json(&["vdi", "list"]);
    assert!(!list.to_string().contains("\"gone\""), "{list}");
    let locks = rig.cluster.dog_json(&["vdi", "lock", "list"]);
    assert_eq!(locks, serde_json::json!([]), "its lock went with it");
}
