//! Races between a VDI's requests and the pushes of its dirty data, made likely by seams on
//! the writes that reach the cluster (`common::Hooks`: a push held in flight, writes delayed
//! at random) and by many iterations.

mod common;

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use cache_control::CacheMode;
use common::*;
use objcache::{Cache, CachedVdi, Pause};
use objstore_client::MemVolume;

/// A cache of `cache_size` in `dir` over an in-memory cluster holding one VDI (`name`, id
/// `vid`, `size` bytes in objects of `os`), opened read-write through the cache.
struct One {
    cluster: MemCluster,
    vol: Arc<MemVolume>,
    cache: Cache<MemCluster>,
    v: Arc<CachedVdi<MemCluster>>,
}

async fn one_vdi(dir: &Path, name: &str, vid: u32, size: u64, os: u64, cache_size: u64) -> One {
    let cluster = MemCluster::default();
    let vol = cluster.add(name, vid, size, os as u32);
    let cache = Cache::open(config(dir, cache_size), cluster.clone()).unwrap();
    let v = Arc::new(cache.open_vdi(name, true).await.unwrap().expect("cached"));
    One {
        cluster,
        vol,
        cache,
        v,
    }
}

/// A discard (what sheepfs does for a punch-hole or zero-range fallocate) of dirty cached
/// blocks while a push of the same object is in flight: the push's old bytes must not land
/// on the cluster after the zeros, and the dirty bytes must be counted down once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_discard_waits_for_a_push_of_its_object_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let os = 4 * MIB;
    let One {
        cluster,
        vol,
        cache,
        v,
    } = one_vdi(dir.path(), "r", 10, 16 * MIB, os, 64 * MIB).await;
    let hooks = &cluster.0.hooks;
    // (discard start, length) within the written range [w, w + 256 KiB): aligned blocks,
    // partial blocks at both ends, and (with a write over a whole object) a whole object.
    let w = os + 64 * 1024;
    let cases = [
        (w, 256 * 1024),
        (w + 100, 64 * 1024),
        (w + 8192, 4096 * 3 + 7),
        (os, os),
    ];
    let mut entered = 0;
    for i in 0..40u64 {
        let (d, dlen) = cases[i as usize % cases.len()];
        let (wo, wlen) = if dlen == os {
            (os, os)
        } else {
            (w, 256 * 1024)
        };
        let data = pattern(i, wlen as usize);
        v.write(wo, Bytes::from(data.clone())).await.unwrap();
        hooks.writes.hold(true);
        let flushing = tokio::spawn({
            let cache = cache.clone();
            async move { cache.flush(None, |_, _| {}).await }
        });
        entered += 1;
        hooks.writes.wait_entered(entered).await;
        // The push has read the old bytes and is on its way: discard them now.
        let discarding = tokio::spawn({
            let v = v.clone();
            async move { v.discard(d, dlen).await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        hooks.writes.hold(false);
        discarding.await.unwrap().unwrap();
        flushing.await.unwrap().unwrap();
        cache.flush(None, |_, _| {}).await.unwrap();
        let all = vol.contents();
        let mut want = data.clone();
        want[(d - wo) as usize..(d - wo + dlen) as usize].fill(0);
        assert!(
            all[wo as usize..(wo + wlen) as usize] == want[..],
            "iteration {i}: the cluster holds old bytes in the discarded range {d}+{dlen}"
        );
        let st = cache.stats();
        assert_eq!(st.dirty, 0, "iteration {i}: dirty bytes after the flush");
        assert_eq!(
            st.total.dirty, 0,
            "iteration {i}: dirty bits after the flush"
        );
        // Clean for the next round.
        v.discard(os, 2 * os).await.unwrap();
        entered = hooks.writes.entered();
    }
}

/// One writer writing and discarding at random (each request after the last one returned),
/// pushes running all the while (fsyncs, with the cluster's writes delayed at random): at
/// the end the cluster holds exactly what the writer wrote, and the dirty byte counter is 0
/// (it never wrapped below zero on the way).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_and_discards_under_pushes_end_with_the_writers_bytes_and_no_dirty_count() {
    let dir = tempfile::tempdir().unwrap();
    let size = 8 * MIB;
    let One {
        cluster,
        vol,
        cache,
        v,
    } = one_vdi(dir.path(), "s", 11, size, MIB, 64 * MIB).await;
    cluster.0.hooks.jitter_us.store(300, Ordering::Relaxed);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let pusher = tokio::spawn({
        let (cache, stop) = (cache.clone(), stop.clone());
        async move {
            while !stop.load(Ordering::SeqCst) {
                cache.flush(None, |_, _| {}).await.unwrap();
                let d = cache.stats().dirty;
                assert!(d <= 64 * MIB, "the dirty byte counter wrapped: {d}");
            }
        }
    });
    let mut model = vec![0u8; size as usize];
    let h = &cluster.0.hooks;
    for i in 0..600u64 {
        // Small ranges over two objects, so that requests and pushes meet often.
        let off = h.below(2 * MIB - 70_000) + 512 * 1024;
        let len = 1 + h.below(64 * 1024);
        if h.below(3) == 0 {
            v.discard(off, len).await.unwrap();
            model[off as usize..(off + len) as usize].fill(0);
        } else {
            let data = pattern(i * 7919, len as usize);
            v.write(off, Bytes::from(data.clone())).await.unwrap();
            model[off as usize..(off + len) as usize].copy_from_slice(&data);
        }
    }
    stop.store(true, Ordering::SeqCst);
    pusher.await.unwrap();
    cache.flush(None, |_, _| {}).await.unwrap();
    // The data first: a count left over must not hide whether a write stayed unpushed.
    let all = vol.contents();
    let first_bad = all.iter().zip(&model).position(|(a, b)| a != b);
    assert!(
        first_bad.is_none(),
        "the cluster differs from what was written, first at byte {first_bad:?}"
    );
    let st = cache.stats();
    assert_eq!(
        (st.dirty, st.total.dirty),
        (0, 0),
        "dirty bytes (counter, bits) after the last flush"
    );
}

/// A push that runs after a write set its blocks' dirty bits and before the write returned
/// (held at `Pause::WriteStored`): the push sends those blocks and counts them down. The
/// counter must equal the bytes of the dirty bits all along: before, the write counted its
/// blocks up only after it left the object's lock, so the push's count-down came first, found
/// the counter at 0 and stopped there, and the write's count-up then left bytes counted dirty
/// that no block was (`writes_and_discards_under_pushes_...` failed about once in 20 runs
/// under load with 12 KiB or 32 KiB left after the last flush).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_between_a_writes_bits_and_its_return_leaves_the_dirty_count_right() {
    let dir = tempfile::tempdir().unwrap();
    let One {
        cluster,
        vol,
        cache,
        v,
    } = one_vdi(dir.path(), "c", 15, 8 * MIB, MIB, 64 * MIB).await;
    let stored = cluster.0.hooks.at(Pause::WriteStored);
    // Whole blocks; partial blocks at both ends; over two objects (the second piece is not
    // held); a rewrite of dirty blocks.
    let cases = [
        (0, 3 * 4096),
        (MIB / 2 + 100, 5000),
        (MIB - 8192, 16384),
        (0, 4096),
    ];
    for (i, &(at, len)) in cases.iter().enumerate() {
        let data = pattern(i as u64, len as usize);
        if i == 3 {
            // Dirty and not pushed when the held write comes.
            v.write(at, Bytes::from(pattern(99, len as usize)))
                .await
                .unwrap();
        }
        stored.hold_next(1);
        let writing = tokio::spawn({
            let (v, data) = (v.clone(), Bytes::from(data.clone()));
            async move { v.write(at, data).await }
        });
        stored.wait_entered(i as u64 + 1).await;
        // The write's bits are set, and it has not returned: a flush pushes its blocks.
        cache.flush(None, |_, _| {}).await.unwrap();
        stored.hold(false);
        writing.await.unwrap().unwrap();
        let st = cache.stats();
        assert_eq!(
            st.dirty, st.total.dirty,
            "case {i}: the dirty byte counter against the dirty bits"
        );
        cache.flush(None, |_, _| {}).await.unwrap();
        let st = cache.stats();
        assert_eq!(
            (st.dirty, st.total.dirty),
            (0, 0),
            "case {i}: dirty bytes (counter, bits) after the flush"
        );
        assert!(
            vol.contents()[at as usize..(at + len) as usize] == data[..],
            "case {i}: the cluster holds the write"
        );
    }
}

/// Writers rewriting blocks while pushes run without pause: every block that reaches the
/// cluster is one a writer wrote, never half of one write and half of another (a push reads
/// the cache's blocks under the writers' lock). Each write covers 64 KiB but for 2 KiB at
/// both ends, one byte repeated: the cache writes it in pieces of 16 KiB, so blocks inside
/// it are written by two system calls, and its 14 whole blocks must reach the cluster whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_push_never_sends_a_block_torn_by_a_write() {
    let dir = tempfile::tempdir().unwrap();
    let One {
        cluster,
        vol,
        cache,
        v,
    } = one_vdi(dir.path(), "t", 12, 8 * MIB, MIB, 64 * MIB).await;
    let span = 3 * MIB;
    // Every block cached first (the writes' partial edge blocks are then written in place).
    v.write(0, Bytes::from(vec![1u8; span as usize]))
        .await
        .unwrap();
    let h = &cluster.0.hooks;
    h.edges_every.store(16, Ordering::SeqCst);
    h.check_blocks.store(true, Ordering::SeqCst);
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (0..2u64)
        .map(|w| {
            let (v, stop) = (v.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    let unit = ((n * 7 + w * 3) % (span / 65536)) * 65536;
                    let data = vec![(n * 2 + w) as u8; 65536 - 4096];
                    assert!(
                        v.write_fast(unit + 2048, &data),
                        "a writeback write took the slow path"
                    );
                    n += 1;
                }
                n
            })
        })
        .collect();
    let until = std::time::Instant::now() + Duration::from_secs(3);
    let mut rounds = 0;
    while std::time::Instant::now() < until && h.torn.load(Ordering::SeqCst) == 0 {
        cache.flush(None, |_, _| {}).await.unwrap();
        rounds += 1;
        tokio::task::yield_now().await;
    }
    stop.store(true, Ordering::SeqCst);
    let writes: u64 = writers.into_iter().map(|w| w.join().unwrap()).sum();
    cache.flush(None, |_, _| {}).await.unwrap();
    let torn = h.torn.load(Ordering::SeqCst);
    assert_eq!(
        torn, 0,
        "{torn} torn blocks reached the cluster ({writes} writes, {rounds} flushes)"
    );
    assert!(writes > 0 && rounds > 0);
    // And the cluster ends with what the cache holds.
    let got = v
        .read_missed(0, span, objcache::Missed::default())
        .await
        .unwrap();
    assert!(
        vol.contents()[..span as usize] == got[..],
        "the cluster differs from the cache"
    );
}

/// An fsync while a write to a full cache makes room by pushing (`reserve`, which runs
/// outside the flushes' lock): the push has written the fsync's data to the cluster and
/// marked it clean, and is held there (`Pause::PushCleaned`). The fsync finds nothing dirty,
/// but must still flush the cluster before it returns: the push marked the cluster as
/// needing a flush before it cleared the bits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_fsync_never_returns_before_the_cluster_flushed_a_push_that_made_room() {
    let dir = tempfile::tempdir().unwrap();
    let os = 256 * 1024u64;
    // One object's worth: a write of a whole other object has to push the first.
    let One {
        cluster, cache, v, ..
    } = one_vdi(dir.path(), "f", 13, 4 * MIB, os, os).await;
    let cleaned = cluster.0.hooks.at(Pause::PushCleaned);
    for i in 0..20u64 {
        let at = (i % 64) * 4096;
        let data = pattern(i, 4096);
        v.write(at, Bytes::from(data.clone())).await.unwrap();
        cleaned.hold(true);
        let making_room = tokio::spawn({
            let v = v.clone();
            async move {
                let other = os * (1 + i % 15);
                v.write(other, Bytes::from(pattern(i + 100, os as usize)))
                    .await
            }
        });
        cleaned.wait_entered(i + 1).await;
        // The fsync of the first write, while the push that made room is held.
        v.flush().await.unwrap();
        let durable = cluster.durable("f");
        cleaned.hold(false);
        making_room.await.unwrap().unwrap();
        assert!(
            durable[at as usize..at as usize + 4096] == data[..],
            "iteration {i}: the fsync returned before the cluster flushed its data"
        );
        // Out of the way for the next round.
        cache.flush(None, |_, _| {}).await.unwrap();
    }
}

/// Dirty data cached from one cluster, the mount killed, the cluster created anew with a
/// VDI of the same name, id and lock generation: the next mount pushes none of the old data
/// into the new VDI; it sets the objects with unpushed writes aside (with the old record),
/// drops the clean ones, and the new VDI works through the cache as any other.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_data_of_a_recreated_cluster_is_set_aside_not_pushed() {
    let dir = tempfile::tempdir().unwrap();
    let old = MemCluster::default();
    *old.0.cluster_id.lock().unwrap() = "one/1000".into();
    old.add("a", 1, 16 * MIB, 4 << 20);
    let dirty = pattern(21, 8192);
    {
        let cache = Cache::open(config(dir.path(), 64 * MIB), old.clone()).unwrap();
        let v = cache.open_vdi("a", true).await.unwrap().expect("cached");
        // Object 2 clean (pushed), object 0 dirty.
        v.write(8 * MIB, Bytes::from(pattern(20, 4096)))
            .await
            .unwrap();
        cache.flush(None, |_, _| {}).await.unwrap();
        v.write(4096, Bytes::from(dirty.clone())).await.unwrap();
        assert_eq!(cache.stats().dirty, 8192);
        // Dropped without shutdown: as after a kill -9.
    }
    let new = MemCluster::default();
    *new.0.cluster_id.lock().unwrap() = "two/2000".into();
    let vol = new.add("a", 1, 16 * MIB, 4 << 20);
    let cache = Cache::open(config(dir.path(), 64 * MIB), new.clone()).unwrap();
    cache.start(&tokio::runtime::Handle::current()).unwrap();
    wait_for("no dirty data left", || cache.stats().dirty == 0);
    // Time for a push that should not happen.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        vol.stats().writes,
        0,
        "old data was pushed into the new VDI"
    );
    assert_eq!(cache.stats().used, 0, "the old VDI's clean data is dropped");
    assert!(vol.contents().iter().all(|&b| b == 0));
    // Set aside, with the old record, and recoverable.
    let aside: Vec<_> = std::fs::read_dir(dir.path().join("orphaned"))
        .expect("an orphaned directory")
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    let rec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(aside[0].join("record.json")).unwrap()).unwrap();
    assert_eq!(
        (rec["name"].as_str(), rec["cluster"].as_str()),
        (Some("a"), Some("one/1000"))
    );
    let data = std::fs::read(aside[0].join("00000000.data")).unwrap();
    assert!(
        data[4096..4096 + 8192] == dirty[..],
        "the unpushed bytes are kept"
    );
    assert!(aside[0].join("00000000.meta").exists());
    assert!(
        !aside[0].join("00000002.data").exists(),
        "clean data is dropped"
    );
    // The new VDI through the cache: its own data only.
    let v = cache.open_vdi("a", true).await.unwrap().expect("cached");
    let got = v
        .read_missed(0, 16384, objcache::Missed::default())
        .await
        .unwrap();
    assert!(
        got.iter().all(|&b| b == 0),
        "the old data is not read either"
    );
    v.write(0, Bytes::from(pattern(22, 4096))).await.unwrap();
    cache.flush(None, |_, _| {}).await.unwrap();
    assert_eq!(&vol.contents()[..4096], &pattern(22, 4096)[..]);
}

/// A block left dirty by writeback when the VDI turned writethrough (`cachectl mode` flushes
/// first, but a write can come between), pushed while a writethrough write of new bytes to
/// the same block goes to the cluster: the push's older bytes land after the new ones, so
/// the block must stay dirty and go out again, or the cluster keeps the old bytes while the
/// cache holds the new ones as clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writethrough_write_during_a_push_of_its_block_leaves_the_cluster_right() {
    let dir = tempfile::tempdir().unwrap();
    let One {
        cluster,
        vol,
        cache,
        v,
    } = one_vdi(dir.path(), "w", 14, 8 * MIB, MIB, 64 * MIB).await;
    let vid = cache.vid_of("w").unwrap();
    let writes = &cluster.0.hooks.writes;
    for i in 0..10u64 {
        cache.set_mode(vid, CacheMode::Writeback);
        let at = i * 8192;
        v.write(at, Bytes::from(pattern(i, 4096))).await.unwrap();
        cache.set_mode(vid, CacheMode::Writethrough);
        // The push of the old bytes, held on its way to the cluster.
        writes.hold_next(1);
        let pushing = tokio::spawn({
            let cache = cache.clone();
            async move { cache.flush(None, |_, _| {}).await }
        });
        writes.wait_entered(i + 1).await;
        let new = pattern(i + 1000, 4096);
        v.write(at, Bytes::from(new.clone())).await.unwrap();
        writes.hold(false);
        pushing.await.unwrap().unwrap();
        cache.flush(None, |_, _| {}).await.unwrap();
        assert!(
            vol.contents()[at as usize..at as usize + 4096] == new[..],
            "iteration {i}: the cluster kept the bytes the push sent after the writethrough"
        );
        assert_eq!(cache.stats().dirty, 0);
    }
}

/// Reads `len` bytes at `offset` through the cache (hit, or fetched where missed).
async fn read(v: &CachedVdi<MemCluster>, offset: u64, len: u64) -> Vec<u8> {
    match v.read_hit(offset, len) {
        Ok(b) => b,
        Err(missed) => v.read_missed(offset, len, missed).await.unwrap().to_vec(),
    }
}

/// A discard the cluster refuses: the dirty (acknowledged, not yet pushed) blocks it covers
/// keep their bytes, and clean cached blocks it covers partly read what the cluster holds.
/// Before, the discard dropped the dirty blocks and zeroed the clean ones in the cache first:
/// the acknowledged write read back as the cluster's older bytes, and the clean block read
/// zeros the cluster never got (until it was evicted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_discard_the_cluster_refuses_loses_no_write_and_leaves_the_cache_as_the_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let os = 4 * MIB;
    let One { vol, cache, v, .. } = one_vdi(dir.path(), "f", 12, 16 * MIB, os, 64 * MIB).await;
    // A clean cached block: written, pushed, flushed.
    let clean = pattern(1, 4096);
    v.write(0, Bytes::from(clean.clone())).await.unwrap();
    v.flush().await.unwrap();
    // A dirty one: written, not pushed.
    let dirty = pattern(2, 8192);
    v.write(os, Bytes::from(dirty.clone())).await.unwrap();
    vol.set_failing(true);
    assert!(v.discard(100, 200).await.is_err());
    assert!(v.discard(os, 8192).await.is_err());
    vol.set_failing(false);
    assert_eq!(
        read(&v, 0, 4096).await,
        clean,
        "the clean block after a failed discard"
    );
    assert_eq!(
        read(&v, os, 8192).await,
        dirty,
        "the dirty blocks after a failed discard"
    );
    // Once the cluster takes them, the discards read as zeros, here and there.
    v.discard(100, 200).await.unwrap();
    v.discard(os, 4096 + 10).await.unwrap();
    v.flush().await.unwrap();
    let mut want = clean.clone();
    want[100..300].fill(0);
    assert_eq!(read(&v, 0, 4096).await, want);
    let mut want2 = dirty.clone();
    want2[..4096 + 10].fill(0);
    assert_eq!(read(&v, os, 8192).await, want2);
    let all = vol.contents();
    assert_eq!(&all[..4096], &want[..]);
    assert_eq!(&all[os as usize..os as usize + 8192], &want2[..]);
    cache.shutdown().await;
}
