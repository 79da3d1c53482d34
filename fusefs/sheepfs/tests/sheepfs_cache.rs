//! The object cache with a real mount, real cluster, real cachectl, fio and dog.

mod common;

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::{
    cache_args, cachectl, cachectl_bin, cachectl_ok, fio, fio_verify_args as fio_job, open_rw,
    remount, rig_with_cache, stats, strs, Rig, SHEEPFS,
};
use serde_json::Value;
use testkit::mount::Mount;
use testkit::{pseudo_random, wait_until};

/// A verifying random-write fio run on another thread.
fn fio_verify_in_background(
    path: String,
    size: &'static str,
    ios: u32,
) -> std::thread::JoinHandle<Value> {
    std::thread::spawn(move || {
        let n = format!("--number_ios={ios}");
        fio(&strs(&fio_job(
            &path,
            size,
            &["--rw=randwrite", "--do_verify=1", &n],
        )))
    })
}

#[test]
fn writeback_then_flush_reaches_the_cluster() {
    let (_tmp, rig, cache) = rig_with_cache(3, "64M");
    rig.cluster.dog_ok(&["vdi", "create", "w", "8M"]);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(rig.path("w"))
        .unwrap();
    let data = pseudo_random(3 << 20, 1);
    f.write_all_at(&data, 4096).unwrap();
    // Acknowledged from the cache: the cluster still has the old (zero) data.
    assert_eq!(rig.cluster.read_vdi("w", 4096, 4096), vec![0u8; 4096]);
    let s = stats(&cache);
    assert_eq!(s["dirty"], 3u64 << 20, "{s}");
    let mut back = vec![0u8; data.len()];
    f.read_exact_at(&mut back, 4096).unwrap();
    assert!(back == data, "reads see the cached writes");
    cachectl_ok(&cache, &["flush", "w"]);
    assert!(rig.cluster.read_vdi("w", 4096, data.len() as u64) == data);
    assert_eq!(stats(&cache)["dirty"], 0);
    // The VDI is attached: another host would be refused; dog shows the lock.
    let locks = rig.cluster.dog_json(&["vdi", "lock", "list"]);
    assert_eq!(locks[0]["vdi"], "w");
    // fsync pushes too.
    f.write_all_at(b"fsync me", 0).unwrap();
    f.sync_all().unwrap();
    assert_eq!(rig.cluster.read_vdi("w", 0, 8), b"fsync me");
    // A discard of part of a dirty block zeroes that part and keeps the rest of the write.
    let block = pseudo_random(4096, 9);
    f.write_all_at(&block, 1 << 20).unwrap();
    use std::os::unix::io::AsRawFd;
    // SAFETY: fallocate on an open descriptor of this test.
    let r = unsafe {
        libc::fallocate(
            f.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            (1 << 20) + 1024,
            512,
        )
    };
    assert_eq!(r, 0, "punch hole: {}", std::io::Error::last_os_error());
    f.sync_all().unwrap();
    let mut want = block.clone();
    want[1024..1536].fill(0);
    assert_eq!(rig.cluster.read_vdi("w", 1 << 20, 4096), want);
    let mut back = vec![0u8; 4096];
    f.read_exact_at(&mut back, 1 << 20).unwrap();
    assert_eq!(back, want);
    // Writethrough: acknowledged once the cluster has it.
    cachectl_ok(&cache, &["mode", "w", "writethrough"]);
    f.write_all_at(b"through", 100).unwrap();
    assert_eq!(rig.cluster.read_vdi("w", 100, 7), b"through");
    assert_eq!(stats(&cache)["dirty"], 0);
}

/// sheepfs killed while a writer is in the middle of writing: every write it acknowledged
/// reads back after the remount, through the mount and from the cluster; the one in flight
/// reads as before or after, never torn. Then, with the cache idle, a kill -9 pushes exactly
/// the dirty bytes at the next mount.
#[test]
fn kill9_keeps_every_acknowledged_write_and_pushes_only_dirty() {
    use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
    use std::sync::{Arc, Mutex};
    const BS: u64 = 4096;
    const SIZE: u64 = 64 << 20;
    const BLOCKS: u64 = SIZE / BS;
    let (_tmp, mut rig, cache) = rig_with_cache(3, "256M");
    rig.cluster.dog_ok(&["vdi", "create", "k", "64M"]);
    let f = rig.path("k");

    // Write i puts pattern i at block (i * 7919) % BLOCKS; acknowledged writes are recorded.
    let at = |i: u64| (i * 7919) % BLOCKS;
    let acked = Arc::new(Mutex::new(Vec::<u64>::new()));
    let in_flight = Arc::new(Mutex::new(None::<u64>));
    let failed = Arc::new(AtomicBool::new(false));
    let writer = {
        let (path, acked, in_flight, failed) =
            (f.clone(), acked.clone(), in_flight.clone(), failed.clone());
        std::thread::spawn(move || {
            let file = open_rw(&path);
            for i in 0.. {
                *in_flight.lock().unwrap() = Some(i);
                if file
                    .write_all_at(&pseudo_random(BS as usize, i + 1), at(i) * BS)
                    .is_err()
                {
                    failed.store(true, SeqCst);
                    return;
                }
                acked.lock().unwrap().push(i);
                *in_flight.lock().unwrap() = None;
            }
        })
    };
    wait_until("2000 acknowledged writes", Duration::from_secs(60), || {
        acked.lock().unwrap().len() >= 2000
    });
    assert!(!writer.is_finished(), "the writer stopped before the kill");
    rig.mount.kill9();
    writer.join().unwrap();
    assert!(failed.load(SeqCst), "the writer saw the mount die");
    let acked = acked.lock().unwrap().clone();
    let in_flight = *in_flight.lock().unwrap();
    // The model: each block's last acknowledged pattern (0: never written, zeros), and what the
    // write in flight at the kill may have left instead.
    let mut want = vec![0u64; BLOCKS as usize];
    for &i in &acked {
        want[at(i) as usize] = i + 1;
    }
    let pattern = |v: u64| {
        if v == 0 {
            vec![0u8; BS as usize]
        } else {
            pseudo_random(BS as usize, v)
        }
    };
    let check = |what: &str, got: &[u8]| {
        for b in 0..BLOCKS {
            let blk = &got[(b * BS) as usize..((b + 1) * BS) as usize];
            let old = pattern(want[b as usize]);
            let ok = blk == &old[..]
                || in_flight.is_some_and(|i| at(i) == b && blk == &pattern(i + 1)[..]);
            assert!(ok, "{what}: block {b} is not its last acknowledged write");
        }
    };
    remount(&mut rig, &cache, "256M", "sheepfs-mid-write.log");
    let mut through = vec![0u8; SIZE as usize];
    open_rw(&f).read_exact_at(&mut through, 0).unwrap();
    check("the mount", &through);
    cachectl_ok(&cache, &["flush"]);
    check("the cluster", &rig.cluster.read_vdi("k", 0, SIZE));

    // Idle: write without fsync; fio closes the file (close does not push).
    fio(&strs(&fio_job(
        &f,
        "64M",
        &["--rw=randwrite", "--do_verify=0", "--number_ios=4000"],
    )));
    let before = stats(&cache);
    let dirty = before["dirty"].as_u64().unwrap();
    assert!(dirty > 0, "{before}");
    let used = before["used"].as_u64().unwrap();
    rig.mount.kill9();
    assert!(!testkit::mount::is_mounted(&rig.mount.dir));

    remount(&mut rig, &cache, "256M", "sheepfs2.log");
    // The dirty data is known exactly and pushed at start.
    wait_until(
        "the dirty data to be pushed",
        Duration::from_secs(60),
        || stats(&cache)["dirty"] == 0,
    );
    let after = stats(&cache);
    assert_eq!(
        after["total"]["pushed_bytes"], dirty,
        "only the dirty bytes are pushed"
    );
    assert_eq!(after["used"], used, "the cache kept its data");
    // fio's own verification of what it wrote, through the mount and, after the cache is
    // dropped, through the cluster.
    let verify = || {
        fio(&strs(&fio_job(
            &f,
            "64M",
            &["--rw=randwrite", "--verify_only", "--number_ios=4000"],
        )))
    };
    verify();
    cachectl_ok(&cache, &["evict"]);
    assert_eq!(stats(&cache)["used"], 0);
    verify();
}

#[test]
fn lost_or_corrupt_index_is_rebuilt() {
    let (_tmp, mut rig, cache) = rig_with_cache(3, "64M");
    rig.cluster.dog_ok(&["vdi", "create", "i", "16M"]);
    let data = pseudo_random(16 << 20, 3);
    {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(rig.path("i"))
            .unwrap();
        f.write_all_at(&data, 0).unwrap();
    }
    // Everything written is cached (clean once the unmount pushed it).
    let used = stats(&cache)["used"].as_u64().unwrap();
    assert!(used >= 16 << 20, "{used}");
    let restart = |rig: &mut Rig, tag: &str| {
        rig.mount.unmount_and_wait();
        // Between mounts the index is damaged.
        match tag {
            "deleted" => std::fs::remove_dir_all(cache.join("index")).unwrap(),
            _ => {
                for e in std::fs::read_dir(cache.join("index")).unwrap().flatten() {
                    if e.path().is_file() {
                        std::fs::write(e.path(), b"garbage garbage garbage").unwrap();
                    }
                }
            }
        }
        remount(rig, &cache, "64M", &format!("sheepfs-{tag}.log"));
    };
    for tag in ["deleted", "corrupt"] {
        restart(&mut rig, tag);
        assert_eq!(
            stats(&cache)["used"].as_u64().unwrap(),
            used,
            "{tag} index: the cached objects were found again"
        );
        let mut back = vec![0u8; data.len()];
        open_rw(rig.path("i")).read_exact_at(&mut back, 0).unwrap();
        assert!(back == data, "{tag} index: data differs");
        assert!(
            rig.cluster.read_vdi("i", 0, 16 << 20) == data,
            "{tag}: cluster has it"
        );
        let st = stats(&cache);
        assert_eq!(
            st["total"]["misses"], 0,
            "{tag}: every read was a hit: {st}"
        );
        assert!(st["total"]["hits"].as_u64().unwrap() > 0, "{tag}: {st}");
    }
}

#[test]
fn bounded_size_lru_and_no_dirty_lost() {
    let (_tmp, rig, cache) = rig_with_cache(3, "16M");
    rig.cluster.dog_ok(&["vdi", "create", "b", "64M"]);
    let f = rig.path("b");
    // Writing 4x the cache size: use stays within one block of the size throughout.
    let writer = fio_verify_in_background(f.clone(), "64M", 6000);
    let limit = (16u64 << 20) + 4096;
    while !writer.is_finished() {
        let used = stats(&cache)["used"].as_u64().unwrap();
        assert!(used <= limit, "cache use {used} is over {limit}");
        std::thread::sleep(Duration::from_millis(50));
    }
    writer.join().unwrap();
    assert!(stats(&cache)["used"].as_u64().unwrap() <= limit);

    // No dirty data was lost: with the cache flushed and emptied, fio verifies what it wrote
    // against the cluster's copy.
    cachectl_ok(&cache, &["evict"]);
    assert_eq!(
        stats(&cache)["used"],
        0,
        "evict flushed, then dropped everything"
    );
    fio(&strs(&fio_job(
        &f,
        "64M",
        &["--rw=randwrite", "--verify_only", "--number_ios=6000"],
    )));
    cachectl_ok(&cache, &["evict"]);
    let file = std::fs::File::open(&f).unwrap();

    // LRU: read A, B, A again, then C: B (least recently used) goes, A stays.
    let read = |from: u64, mib: u64| {
        let mut buf = vec![0u8; 1 << 20];
        for i in 0..mib {
            file.read_exact_at(&mut buf, (from + i) << 20).unwrap();
        }
    };
    let misses = || stats(&cache)["total"]["misses"].as_u64().unwrap();
    // Fills land in the background: wait until what was read is in the cache.
    let filled = |mib: u64| {
        wait_until("fills to land", Duration::from_secs(30), || {
            stats(&cache)["used"].as_u64().unwrap() >= (mib << 20).min(16 << 20)
        })
    };
    read(0, 6); // A
    filled(6);
    read(8, 6); // B
    filled(12);
    read(0, 6); // A again: hits
    let m = misses();
    read(0, 6);
    assert_eq!(misses(), m, "A is cached");
    // C: over the size; B is evicted. (A full cache keeps a range on its second miss; the
    // full read above already missed C once.)
    read(20, 6);
    read(20, 6);
    wait_until("C to be cached", Duration::from_secs(30), || {
        stats(&cache)["total"]["evictions"].as_u64().unwrap() > 0
            && stats(&cache)["used"].as_u64().unwrap() >= 14 << 20
    });
    let m = misses();
    read(0, 6);
    assert_eq!(misses(), m, "A (recently used) stayed");
    read(8, 6);
    assert!(misses() > m, "B (least recently used) was evicted");
    assert!(stats(&cache)["total"]["evictions"].as_u64().unwrap() > 0);
}

/// A small cache under random writes evicts and re-creates the same objects all the time: an
/// object's files are only made again once those of its evicted self are gone (retiring them
/// once took the new object's files along, and its blocks read back as zeros).
#[test]
fn objects_evicted_and_created_again_keep_their_data() {
    let (_tmp, rig, cache) = rig_with_cache(3, "16M");
    rig.cluster.dog_ok(&["vdi", "create", "t", "64M"]);
    let f = rig.path("t");
    for round in 0..3 {
        let v = fio(&strs(&fio_job(
            &f,
            "64M",
            &["--rw=randwrite", "--do_verify=1", "--number_ios=6000"],
        )));
        assert_eq!(v["jobs"][0]["error"], 0, "round {round}");
    }
    let s = stats(&cache);
    assert!(s["total"]["evictions"].as_u64().unwrap() > 0, "{s}");
    assert!(s["used"].as_u64().unwrap() <= (16 << 20) + 4096, "{s}");
}

/// The LRU order outlives the mount: the index records when each object was last used, and
/// the next mount evicts in that order. Run both ways round, so an order that ignored the
/// index (the files' order on disk) could not pass both.
#[test]
fn lru_order_survives_a_remount() {
    let (_tmp, mut rig, cache) = rig_with_cache(3, "16M");
    rig.cluster.dog_ok(&["vdi", "create", "o", "32M"]);
    let data = pseudo_random(32 << 20, 5);
    rig.cluster.write_vdi("o", 0, &data);
    let open = |rig: &Rig| open_rw(rig.path("o"));
    let read = |file: &std::fs::File, from: u64, mib: u64| {
        let mut buf = vec![0u8; 1 << 20];
        for i in from..from + mib {
            file.read_exact_at(&mut buf, i << 20).unwrap();
            assert!(buf[..] == data[(i << 20) as usize..][..1 << 20], "MiB {i}");
        }
    };
    let total = |k: &str| stats(&cache)["total"][k].as_u64().unwrap();
    let used = || stats(&cache)["used"].as_u64().unwrap();
    // (used last, used before it), both 6 MiB: 12 of the cache's 16.
    for (round, (recent, old)) in [(0u64, 8u64), (8, 0)].into_iter().enumerate() {
        {
            let file = open(&rig);
            read(&file, old, 6);
            wait_until(
                "the first range to be cached",
                Duration::from_secs(30),
                || used() >= 6 << 20,
            );
            read(&file, recent, 6);
            wait_until("both to be cached", Duration::from_secs(30), || {
                used() >= 12 << 20
            });
            let m = total("misses");
            read(&file, recent, 6); // used again: more recently than `old`
            assert_eq!(total("misses"), m, "round {round}: cached");
        }
        rig.mount.unmount_and_wait();
        remount(&mut rig, &cache, "16M", &format!("sheepfs-lru{round}.log"));
        let file = open(&rig);
        // A third range, twice (a full cache keeps a range on its second miss): room is made
        // by evicting what was least recently used before the remount.
        let evictions = total("evictions");
        read(&file, 20, 6);
        read(&file, 20, 6);
        wait_until(
            "the third range to be cached",
            Duration::from_secs(30),
            || total("evictions") > evictions && used() >= 14 << 20,
        );
        let m = total("misses");
        read(&file, recent, 6);
        assert_eq!(total("misses"), m, "round {round}: used last, stayed");
        read(&file, old, 6);
        assert!(
            total("misses") > m,
            "round {round}: least recently used, evicted"
        );
        cachectl_ok(&cache, &["evict"]);
    }
}

/// Reads far over the cache size, sequential (long fills, one write per run of blocks) and
/// random (4 KiB fills), always return the cluster's bytes; a full cache keeps a
/// range only on its second miss, and only in place of data idle for longer than that range
/// took to come back (a scan larger than the cache does not churn it).
#[test]
fn full_cache_admits_second_misses_and_reads_stay_right() {
    let (_tmp, rig, cache) = rig_with_cache(3, "16M");
    rig.cluster.dog_ok(&["vdi", "create", "r", "48M"]);
    let data = pseudo_random(48 << 20, 7);
    rig.cluster.write_vdi("r", 0, &data);
    let file = open_rw(rig.path("r"));
    let total = |k: &str| stats(&cache)["total"][k].as_u64().unwrap();
    let read_mib = |i: u64, what: &str| {
        let mut buf = vec![0u8; 1 << 20];
        file.read_exact_at(&mut buf, i << 20).unwrap();
        assert!(
            buf[..] == data[(i << 20) as usize..][..1 << 20],
            "{what}: MiB {i} differs"
        );
    };
    let pass = |what: &str| (0..48u64).for_each(|i| read_mib(i, what));
    pass("first sequential pass");
    assert!(
        total("skipped_fills") > 0,
        "a full cache does not keep first misses: {}",
        stats(&cache)
    );
    let used = stats(&cache)["used"].as_u64().unwrap();
    assert!(used <= (16 << 20) + 4096, "cache use {used} over its size");
    // Fills land in the background: wait for them, then scan again.
    wait_until("fills to land", Duration::from_secs(30), || {
        stats(&cache)["fill_backlog"] == 0
    });
    let (hits0, evictions0) = (total("hit_bytes"), total("evictions"));
    pass("second sequential pass");
    assert!(
        total("hit_bytes") - hits0 >= 8 << 20,
        "the second pass reads what the first one kept from the cache: {}",
        stats(&cache)
    );
    assert_eq!(
        total("evictions"),
        evictions0,
        "a scan over the cache's size evicts nothing it is still using: {}",
        stats(&cache)
    );
    // Once the cached data has gone unused for longer than a range's reuse interval, that
    // range read twice comes in: re-read it in pairs until it does.
    let fills0 = total("fills");
    wait_until(
        "the re-read range to be filled",
        Duration::from_secs(30),
        || {
            read_mib(40, "re-read");
            read_mib(40, "re-read");
            total("fills") > fills0
        },
    );
    wait_until("its fill to land", Duration::from_secs(30), || {
        let m = total("misses");
        read_mib(40, "re-read");
        total("misses") == m
    });
    let used = stats(&cache)["used"].as_u64().unwrap();
    assert!(used <= (16 << 20) + 4096, "cache use {used} over its size");
    let mut buf = vec![0u8; 4096];
    for i in 0..3000u64 {
        let at = ((i * 7919) % (12 << 10)) * 4096;
        file.read_exact_at(&mut buf, at).unwrap();
        assert!(
            buf[..] == data[at as usize..][..4096],
            "4 KiB read at {at} differs"
        );
    }
    cachectl_ok(&cache, &["evict"]);
    pass("after evict");
}

/// A sequential read longer than `--cache-sequential-cutoff` (16 MiB by default) is a stream:
/// past the cutoff, its first pass through an object is fetched past the cache, the second
/// pass caches it, and once cached, a pass is all hits. A block written but not yet pushed
/// reads back new from a pass that goes past the cache. `cachectl evict` forgets the first
/// pass; with a cutoff of 0, the first pass is cached.
#[test]
fn a_stream_is_cached_on_its_second_pass() {
    const MIB: u64 = 1 << 20;
    let (_tmp, mut rig, cache) = rig_with_cache(3, "64M");
    rig.cluster.dog_ok(&["vdi", "create", "s", "40M"]);
    let mut data = pseudo_random(40 << 20, 11);
    rig.cluster.write_vdi("s", 0, &data);
    let open = |rig: &Rig| open_rw(rig.path("s"));
    // A dirty block in an object the first pass will fetch past the cache.
    let at = 30 * MIB as usize + 8192;
    let block = pseudo_random(4096, 12);
    open(&rig).write_all_at(&block, at as u64).unwrap();
    data[at..at + 4096].copy_from_slice(&block);
    assert!(
        stats(&cache)["dirty"].as_u64().unwrap() > 0,
        "the write is dirty"
    );
    let data = data;
    let pass = |file: &std::fs::File, what: &str| {
        let mut buf = vec![0u8; MIB as usize];
        for i in 0..40 {
            file.read_exact_at(&mut buf, i * MIB).unwrap();
            assert!(
                buf[..] == data[(i * MIB) as usize..][..MIB as usize],
                "{what}: MiB {i} differs"
            );
        }
    };
    let total = |k: &str| stats(&cache)["total"][k].as_u64().unwrap();
    let used = || stats(&cache)["used"].as_u64().unwrap();
    // Fills of what a pass keeps land in the background: wait for them to settle.
    let settled = || {
        wait_until("fills to settle", Duration::from_secs(30), || {
            stats(&cache)["fill_backlog"] == 0
        });
        used()
    };
    assert_eq!(stats(&cache)["sequential_cutoff"], 16 * MIB);
    let file = open(&rig);
    let first = |what: &str| {
        let bypassed = total("stream_bypasses");
        pass(&file, what);
        let kept = settled();
        assert!(
            kept <= 18 * MIB,
            "{what}: a stream's first pass keeps only its first 16 MiB, not {kept}: {}",
            stats(&cache)
        );
        assert!(
            total("stream_bypasses") >= bypassed + 20,
            "{what}: the rest was fetched past the cache: {}",
            stats(&cache)
        );
    };
    // A pass that caches keeps everything it reads, unless the fill thread fell 16 MiB
    // behind under load: those ranges are left out, and a later pass keeps them.
    let keeps = |what: &str| {
        let kept = settled();
        assert!(
            kept >= 30 * MIB,
            "{what} keeps what it reads, not {kept}: {}",
            stats(&cache)
        );
    };
    first("first pass");
    pass(&file, "second pass");
    keeps("the second pass");
    for _ in 0..3 {
        if used() == 40 * MIB {
            break;
        }
        pass(&file, "a pass after the second");
        settled();
    }
    assert_eq!(used(), 40 * MIB, "the VDI is cached whole");
    let misses = total("misses");
    pass(&file, "a pass over the cached VDI");
    assert_eq!(total("misses"), misses, "once cached, a pass is all hits");

    cachectl_ok(&cache, &["evict", "s"]);
    first("first pass after an evict");
    drop(file);

    // --cache-sequential-cutoff 0: every stream is cached on its first pass.
    rig.mount.unmount_and_wait();
    let mut args = cache_args(&cache, "64M");
    args.extend(["--cache-sequential-cutoff".into(), "0".into()]);
    rig.mount = Mount::start(
        Path::new(SHEEPFS),
        &rig.cluster.addr(0),
        &rig.mount.dir,
        &rig.cluster.dir.path().join("sheepfs-cutoff0.log"),
        &strs(&args),
    );
    cachectl_ok(&cache, &["evict"]);
    let file = open(&rig);
    pass(&file, "first pass, no cutoff");
    keeps("with no cutoff, the first pass");
    assert_eq!(total("stream_bypasses"), 0);
}

#[test]
fn evict_and_flush_during_fio_verify() {
    let (_tmp, rig, cache) = rig_with_cache(3, "32M");
    rig.cluster.dog_ok(&["vdi", "create", "e", "48M"]);
    let f = rig.path("e");
    let job = fio_verify_in_background(f.clone(), "48M", 8000);
    let mut rounds = 0;
    while !job.is_finished() {
        for args in [&["flush"][..], &["evict", "e"][..]] {
            cachectl_ok(&cache, args);
        }
        rounds += 1;
    }
    let v = job
        .join()
        .expect("fio verify failed while the cache was flushed and evicted");
    assert!(v["jobs"][0]["read"]["total_ios"].as_u64().unwrap() >= 8000);
    assert!(rounds > 0);
    // Refusals: discarding dirty data needs --yes; unknown VDIs are named.
    let used = stats(&cache)["used"].clone();
    let out = cachectl(&cache, &["evict", "--discard-dirty"]);
    let e = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{e}");
    assert!(
        e.contains("refusing to evict with --discard-dirty") && e.contains("add --yes"),
        "{e}"
    );
    assert_eq!(stats(&cache)["used"], used, "nothing was evicted");
    let out = cachectl(&cache, &["flush", "nope"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("nope"));
}

#[test]
fn second_read_write_attach_is_refused_then_sees_everything() {
    let (_tmp, mut rig, cache) = rig_with_cache(3, "64M");
    rig.cluster.dog_ok(&["vdi", "create", "s", "8M"]);
    let data = pseudo_random(5 << 20, 8);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(rig.path("s"))
        .unwrap();
    f.write_all_at(&data, 0).unwrap();
    drop(f);
    assert!(stats(&cache)["dirty"].as_u64().unwrap() > 0);

    // A second mount (another "host": its own cache dir) on the same cluster.
    let tmp = tempfile::tempdir().unwrap();
    let cache2 = tmp.path().join("cache2");
    let mut args = cache_args(&cache2, "64M");
    args.extend(["--lock-mode".to_string(), "exclusive".to_string()]);
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let second = Mount::start(
        Path::new(SHEEPFS),
        &rig.cluster.addr(1),
        &tmp.path().join("mnt2"),
        &tmp.path().join("second.log"),
        &a,
    );
    let e = std::fs::OpenOptions::new()
        .write(true)
        .open(second.path("s"))
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EBUSY), "{e}");
    assert!(
        second.log_tail().contains("attached read-write by"),
        "{}",
        second.log_tail()
    );

    // The first unmounts: its dirty data is pushed and the lock released before it exits.
    rig.mount.unmount_and_wait();
    assert!(rig
        .cluster
        .dog_json(&["vdi", "lock", "list"])
        .as_array()
        .unwrap()
        .is_empty());
    let f2 = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(second.path("s"))
        .unwrap();
    let mut back = vec![0u8; data.len()];
    f2.read_exact_at(&mut back, 0).unwrap();
    assert!(
        back == data,
        "the second mount sees every write of the first"
    );
}

/// Writes made without the lock (`dog vdi write`, sheepfs without a cache) while no cache
/// holds the VDI bump its generation: the cache that attached it before drops what it cached
/// on its next attach instead of serving it stale.
#[test]
fn writes_without_the_lock_make_the_next_attach_drop_stale_data() {
    let (_tmp, mut rig, cache) = rig_with_cache(3, "64M");
    rig.cluster.dog_ok(&["vdi", "create", "u", "4M"]);
    let old = pseudo_random(1 << 20, 21);
    let f = open_rw(rig.path("u"));
    f.write_all_at(&old, 0).unwrap();
    let mut back = vec![0u8; old.len()];
    f.read_exact_at(&mut back, 0).unwrap();
    drop(f);
    rig.mount.unmount_and_wait();

    // dog writes the first half over what the cache holds.
    let new = pseudo_random(512 << 10, 22);
    rig.cluster.write_vdi("u", 0, &new);
    remount(&mut rig, &cache, "64M", "u2.log");
    let holds_data = |why: &str| assert!(stats(&cache)["used"].as_u64().unwrap() > 0, "{why}");
    holds_data("the cached data is kept until the VDI is attached");
    let f = open_rw(rig.path("u"));
    f.read_exact_at(&mut back, 0).unwrap();
    assert!(
        back[..new.len()] == new[..],
        "dog's write is read back, not the cached data"
    );
    assert!(back[new.len()..] == old[new.len()..]);
    assert!(
        rig.mount.log_tail().contains("written without its lock"),
        "{}",
        rig.mount.log_tail()
    );
    drop(f);
    rig.mount.unmount_and_wait();

    // The same with sheepfs without a cache as the writer.
    let tmp = tempfile::tempdir().unwrap();
    let mut plain = Mount::start(
        Path::new(SHEEPFS),
        &rig.cluster.addr(1),
        &tmp.path().join("mnt2"),
        &tmp.path().join("plain.log"),
        &[],
    );
    let newer = pseudo_random(64 << 10, 23);
    open_rw(plain.path("u")).write_all_at(&newer, 4096).unwrap();
    plain.unmount_and_wait();
    remount(&mut rig, &cache, "64M", "u3.log");
    holds_data("the cache holds what the last attach read");
    let f = open_rw(rig.path("u"));
    f.read_exact_at(&mut back, 0).unwrap();
    assert!(back[4096..4096 + newer.len()] == newer[..]);
    assert!(back[..4096] == new[..4096]);
}

/// Creates VDI `name` (b"first" at 0) and opens it read-write through plain handles: attached
/// by a write, set to mode off (kept across mounts), released by a remount (the rig's 64 MiB
/// cache), then opened in mode off, so with no lock and writes straight to the cluster.
fn open_in_mode_off(rig: &mut Rig, cache: &Path, name: &str, size: &str) -> std::fs::File {
    rig.cluster.dog_ok(&["vdi", "create", name, size]);
    open_rw(rig.path(name)).write_all_at(b"first", 0).unwrap();
    cachectl_ok(cache, &["mode", name, "off"]);
    rig.mount.unmount_and_wait();
    remount(rig, cache, "64M", &format!("{name}2.log"));
    open_rw(rig.path(name))
}

/// The mount logged taking VDI `name`'s open file over, and the cluster's first (only) lock is
/// `name`'s, held by this host rather than the test's "elsewhere".
fn assert_taken_over(rig: &Rig, name: &str) {
    let log = rig.mount.log_tail();
    assert!(log.contains("its open file was taken over"), "{log}");
    let locks = rig.cluster.dog_json(&["vdi", "lock", "list"]);
    assert_eq!(locks[0]["vdi"], name, "{locks}");
    assert_ne!(locks[0]["host"], "elsewhere", "{locks}");
}

/// `cachectl mode VDI writeback` on a VDI open read-write through plain handles (it was in
/// mode off, unattached, when opened) attaches it and puts the open file under the cache
/// while fio writes and verifies through it: no write lost or reordered across the switch.
#[test]
fn cachectl_mode_takes_over_an_open_file() {
    let (_tmp, mut rig, cache) = rig_with_cache(3, "64M");
    let f = open_in_mode_off(&mut rig, &cache, "m", "24M");
    let a = pseudo_random(1 << 20, 31);
    f.write_all_at(&a, 0).unwrap();
    assert!(rig.cluster.read_vdi("m", 0, a.len() as u64) == a);
    let locks = rig.cluster.dog_json(&["vdi", "lock", "list"]);
    assert_eq!(locks.as_array().map(Vec::len), Some(0), "{locks}");

    let path = rig.path("m");
    let job = std::thread::spawn(move || {
        fio(&strs(&fio_job(
            &path,
            "16M",
            &["--offset=8M", "--do_verify=1", "--number_ios=30000"],
        )))
    });
    // fio is under way: it has written objects past the first.
    wait_until("fio to write", Duration::from_secs(30), || {
        rig.cluster.dog_json(&["vdi", "info", "m"])["allocated_objects"]
            .as_u64()
            .unwrap()
            > 1
    });
    let out = cachectl_ok(&cache, &["mode", "m", "writeback"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "VDI 'm' is now writeback\n",
        "taken over: no note about the next open"
    );
    let during = !job.is_finished();
    let v = job.join().expect("fio verify failed across the switch");
    assert!(
        during,
        "fio was still writing when the cache took the file over: {}",
        v["jobs"][0]["write"]
    );
    let verified = v["jobs"][0]["read"]["total_ios"].as_u64().unwrap();
    assert!(
        verified >= 4096,
        "every block of the 16 MiB verified: {verified}"
    );
    assert_taken_over(&rig, "m");

    // The file opened before the switch now writes back through the cache.
    let b = pseudo_random(1 << 20, 32);
    f.write_all_at(&b, 0).unwrap();
    assert!(stats(&cache)["dirty"].as_u64().unwrap() > 0);
    assert!(
        rig.cluster.read_vdi("m", 0, a.len() as u64) == a,
        "held in the cache until flushed"
    );
    let mut back = vec![0u8; b.len()];
    f.read_exact_at(&mut back, 0).unwrap();
    assert!(back == b);
    cachectl_ok(&cache, &["flush", "m"]);
    assert!(rig.cluster.read_vdi("m", 0, b.len() as u64) == b);
}

/// A mode change whose attach is refused (another host holds the lock) says so and leaves the
/// open file going straight to the cluster; once the lock is free, the next read-write open
/// puts every open file of the VDI under the cache, after the plain writes in flight, while
/// a writer keeps writing through the first file: every block reads back as last written.
#[test]
fn a_read_write_open_takes_over_plain_files_after_a_refused_mode_change() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    const BLOCKS: u64 = 1024;
    let (_tmp, mut rig, cache) = rig_with_cache(3, "64M");
    let f = Arc::new(open_in_mode_off(&mut rig, &cache, "n", "4M"));
    rig.cluster.dog_ok(&[
        "vdi",
        "lock",
        "acquire",
        "n",
        "--owner",
        "other",
        "--host",
        "elsewhere",
    ]);
    let out = cachectl(&cache, &["mode", "n", "writeback"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("VDI 'n' is now writeback, but the cache could not take over its open file")
            && err.contains("elsewhere"),
        "{err}"
    );

    // A writer through the plain file: block i % BLOCKS gets the pattern of write i.
    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicU64::new(0));
    let writer = {
        let (f, stop, written) = (f.clone(), stop.clone(), written.clone());
        std::thread::spawn(move || {
            let mut last = vec![None; BLOCKS as usize];
            let mut i = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let b = i % BLOCKS;
                f.write_all_at(&pseudo_random(4096, 1000 + i), b * 4096)
                    .unwrap();
                last[b as usize] = Some(1000 + i);
                i += 1;
                written.store(i, Ordering::SeqCst);
            }
            last
        })
    };
    wait_until("plain writes", Duration::from_secs(30), || {
        written.load(Ordering::SeqCst) > 50
    });
    rig.cluster
        .dog_ok(&["vdi", "lock", "release", "n", "--owner", "other"]);
    let g = open_rw(rig.path("n"));
    let at_upgrade = written.load(Ordering::SeqCst);
    wait_until("cached writes", Duration::from_secs(30), || {
        written.load(Ordering::SeqCst) > at_upgrade + 200
    });
    stop.store(true, Ordering::SeqCst);
    let last = writer.join().expect("the writer failed");
    assert_taken_over(&rig, "n");
    assert!(
        stats(&cache)["dirty"].as_u64().unwrap() > 0,
        "writes go to the cache now"
    );

    let expect = |b: usize| match last[b] {
        Some(seed) => pseudo_random(4096, seed),
        None if b == 0 => [&b"first"[..], &[0u8; 4091][..]].concat(),
        None => vec![0u8; 4096],
    };
    let mut back = vec![0u8; (BLOCKS * 4096) as usize];
    g.read_exact_at(&mut back, 0).unwrap();
    for b in 0..BLOCKS as usize {
        assert!(
            back[b * 4096..(b + 1) * 4096] == expect(b)[..],
            "block {b} reads back as last written"
        );
    }
    cachectl_ok(&cache, &["flush", "n"]);
    assert!(rig.cluster.read_vdi("n", 0, BLOCKS * 4096) == back);
    drop((f, g));
}

/// A child process killed on drop, so a failing test leaves no cachectl behind.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// 4 nodes, 3 copies: the cluster survives one failure, so a flush that loses a node midway
/// still succeeds once the node's objects move to the next epoch, and everything it pushed is
/// in the cluster.
#[test]
fn node_killed_during_flush() {
    const SIZE: u64 = 384 << 20;
    let (_tmp, mut rig, cache) = rig_with_cache(4, "1G");
    rig.cluster.dog_ok(&["vdi", "create", "n", "384M"]);
    let data = pseudo_random(SIZE as usize, 4);
    {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(rig.path("n"))
            .unwrap();
        f.write_all_at(&data, 0).unwrap();
    }
    // The flusher may have started on its own (max dirty): most is still dirty.
    let st = stats(&cache);
    assert!(st["dirty"].as_u64().unwrap() > SIZE / 2, "{st}");
    let pushed0 = st["total"]["pushed_bytes"].as_u64().unwrap();
    let mut cmd = Command::new(cachectl_bin());
    cmd.arg("--cache-dir").arg(&cache).arg("flush");
    testkit::die_with_parent(&mut cmd, libc::SIGKILL);
    let mut flush = Child(cmd.spawn().unwrap());
    wait_until(
        "the flush to start pushing",
        Duration::from_secs(30),
        || stats(&cache)["total"]["pushed_bytes"].as_u64().unwrap() > pushed0,
    );
    rig.cluster.kill9(3);
    // The kill landed while the flush was still pushing (else this test tested nothing).
    let pushed = stats(&cache)["total"]["pushed_bytes"].as_u64().unwrap();
    assert!(
        pushed < SIZE && flush.0.try_wait().unwrap().is_none(),
        "the flush had ended ({pushed} bytes pushed) before the node was killed"
    );
    let status = flush.0.wait().unwrap();
    let s = stats(&cache);
    assert!(
        status.success(),
        "the flush failed with a node of 4 down: {s}"
    );
    assert_eq!(s["dirty"], 0, "{s}");
    assert!(
        rig.cluster.read_vdi("n", 0, SIZE) == data,
        "the cluster does not hold what was flushed"
    );
}

#[test]
fn host_crash_drops_untrusted_cache_and_bad_files_never_crash() {
    let (_tmp, mut rig, cache) = rig_with_cache(3, "64M");
    rig.cluster.dog_ok(&["vdi", "create", "h", "8M"]);
    let synced = pseudo_random(2 << 20, 21);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(rig.path("h"))
        .unwrap();
    f.write_all_at(&synced, 0).unwrap();
    f.sync_all().unwrap();
    f.write_all_at(b"never fsynced", 4 << 20).unwrap();
    drop(f);
    rig.mount.kill9();
    // Simulate the host going down: the state says "in use" under another boot.
    let state = cache.join("state.json");
    let mut st: Value = serde_json::from_slice(&std::fs::read(&state).unwrap()).unwrap();
    st["boot_id"] = "another-boot".into();
    std::fs::write(&state, serde_json::to_vec(&st).unwrap()).unwrap();
    // Files of an object nobody knows: dropped with the rest, unread.
    std::fs::create_dir_all(cache.join("obj/0000ff")).unwrap();
    std::fs::write(cache.join("obj/0000ff/00000001.meta"), b"").unwrap();

    remount(&mut rig, &cache, "64M", "after-crash.log");
    let s = stats(&cache);
    assert_eq!(
        s["used"], 0,
        "nothing cached before the crash is trusted: {s}"
    );
    assert_eq!(s["dirty"], 0);
    assert!(rig.mount.log_tail().contains("host went down"));
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(rig.path("h"))
        .unwrap();
    let mut back = vec![0u8; synced.len()];
    f.read_exact_at(&mut back, 0).unwrap();
    assert!(back == synced, "fsynced data survives");
    let mut lost = [0u8; 13];
    f.read_exact_at(&mut lost, 4 << 20).unwrap();
    assert_eq!(
        lost, [0u8; 13],
        "the unfsynced write is lost, never torn or garbage"
    );

    // Damaged meta files of objects the cache does trust (a kill -9 on the same boot) are
    // read at the next mount: the cache drops those objects, never serves them, and lives on.
    let fresh = pseudo_random(2 << 20, 22);
    f.write_all_at(&fresh, 0).unwrap();
    f.sync_all().unwrap();
    drop(f);
    let vid = rig.cluster.dog_json(&["vdi", "info", "h"])["vid"]
        .as_u64()
        .unwrap();
    let dir = cache.join(format!("obj/{vid:06x}"));
    assert!(dir.join("00000000.meta").is_file() && dir.join("00000001.meta").is_file());
    rig.mount.kill9();
    std::fs::write(dir.join("00000000.meta"), b"").unwrap();
    std::fs::write(dir.join("00000001.meta"), b"garbage").unwrap();
    remount(&mut rig, &cache, "64M", "after-bad-meta.log");
    let log = std::fs::read_to_string(rig.cluster.dir.path().join("after-bad-meta.log")).unwrap();
    assert_eq!(
        log.matches("dropping cached object").count(),
        2,
        "both damaged objects are dropped:\n{log}"
    );
    let f = open_rw(rig.path("h"));
    let mut back = vec![0u8; fresh.len()];
    f.read_exact_at(&mut back, 0).unwrap();
    assert!(back == fresh, "the dropped objects read from the cluster");
    assert!(
        cachectl(&cache, &["stats"]).status.success(),
        "sheepfs lives on"
    );
}

#[test]
fn failed_pushes_keep_data_dirty_and_report() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let mut args = cache_args(&cache, "64M");
    args.extend(["--timeout".to_string(), "3".to_string()]);
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut rig = Rig::start(1, 1, "1M", &a);
    rig.cluster.dog_ok(&["vdi", "create", "p", "8M"]);
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(rig.path("p"))
        .unwrap();
    f.write_all_at(&pseudo_random(1 << 20, 5), 0).unwrap();
    rig.cluster.kill9(0);
    let out = cachectl(&cache, &["flush"]);
    assert!(
        !out.status.success(),
        "a flush with the cluster gone must fail"
    );
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains("flush failed") && e.contains("stays dirty"),
        "{e}"
    );
    let s = stats(&cache);
    assert_eq!(s["dirty"], 1u64 << 20, "the data stays dirty: {s}");
    assert!(s["push_errors"].as_u64().unwrap() > 0);
    assert!(s["last_push_error"].is_string());
    // fsync reports the failure too; the daemon lives on.
    assert!(f.sync_all().is_err());
    assert!(cachectl(&cache, &["stats"]).status.success());
    // Resize works and refuses nonsense.
    assert!(cachectl(&cache, &["resize", "32M"]).status.success());
    assert_eq!(stats(&cache)["size"], 32u64 << 20);
    assert!(!cachectl(&cache, &["resize", "1M"]).status.success());
}
