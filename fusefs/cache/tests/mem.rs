//! The cache in process, over VDIs in memory ([`objstore_client::MemVolume`]) and a lock
//! table in memory (`common`): fills, admission into a full cache, eviction under a small
//! size, dirty tracking, flush, mode changes, and a crash (the cache dropped without
//! unmounting) followed by a restart on the same directory.

mod common;

use std::sync::atomic::Ordering;

use bytes::Bytes;
use cache_control::{CacheMode, CacheStats};
use common::*;
use objcache::{Cache, Missed};
use objstore_client::Volume;

fn vdi_stats(st: &CacheStats, name: &str) -> (u64, u64) {
    st.vdis
        .iter()
        .find(|v| v.name == name)
        .map(|v| (v.used, v.dirty))
        .unwrap_or((0, 0))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_miss_is_filled_and_then_served_from_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = MemCluster::default();
    let vol = cluster.add("a", 1, 8 * MIB, 4 << 20);
    let data = pattern(0, 8 * MIB as usize);
    vol.write_at(0, Bytes::from(data.clone())).await.unwrap();
    let cache = Cache::open(config(dir.path(), 64 * MIB), cluster.clone()).unwrap();
    cache.start(&tokio::runtime::Handle::current()).unwrap();
    let v = cache.open_vdi("a", true).await.unwrap().expect("cached");

    let got = v.read_missed(4096, 65536, Missed::default()).await.unwrap();
    assert_eq!(&got[..], &data[4096..4096 + 65536]);
    let reads = vol.stats().reads;
    wait_for("the fill", || cache.stats().total.fills >= 1);
    // Served from the cache: on the caller's thread when the blocks are in the page cache
    // (`read_hit`), else by the async path, which reads the cache's file.
    let hit = match v.read_hit(4096, 65536) {
        Ok(hit) => Bytes::from(hit),
        Err(missed) => v.read_missed(4096, 65536, missed).await.unwrap(),
    };
    assert_eq!(&hit[..], &data[4096..4096 + 65536]);
    assert_eq!(vol.stats().reads, reads, "a hit reaches no cluster");
    let st = cache.stats();
    assert_eq!((st.total.misses, st.total.hits), (1, 1));
    assert_eq!(st.dirty, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_stay_dirty_until_a_flush_pushes_them() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = MemCluster::default();
    let vol = cluster.add("d", 2, 16 * MIB, 4 << 20);
    let cache = Cache::open(config(dir.path(), 64 * MIB), cluster.clone()).unwrap();
    let v = cache.open_vdi("d", true).await.unwrap().expect("cached");

    let one = pattern(1, 4096);
    let two = pattern(2, 8192);
    v.write(0, Bytes::from(one.clone())).await.unwrap();
    v.write(5 * MIB + 8192, Bytes::from(two.clone()))
        .await
        .unwrap();
    let st = cache.stats();
    assert_eq!((st.dirty, vdi_stats(&st, "d")), (12288, (12288, 12288)));
    assert_eq!(
        vol.stats().writes,
        0,
        "writeback: nothing reached the cluster"
    );

    let pushed = cache.flush(None, |_, _| {}).await.unwrap();
    assert_eq!(pushed, 12288);
    assert_eq!(cache.stats().dirty, 0);
    assert_eq!(cluster.0.flushes.load(Ordering::SeqCst), 1);
    let all = vol.contents();
    assert_eq!(&all[..4096], &one[..]);
    assert_eq!(
        &all[5 * MIB as usize + 8192..5 * MIB as usize + 16384],
        &two[..]
    );
    assert!(all[4096..5 * MIB as usize + 8192].iter().all(|&b| b == 0));
    // Nothing left to push: no second cluster flush either.
    assert_eq!(cache.flush(None, |_, _| {}).await.unwrap(), 0);
    assert_eq!(cluster.0.flushes.load(Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_cache_pushes_and_evicts_to_take_more_writes_than_it_holds() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = MemCluster::default();
    let vol = cluster.add("big", 3, 32 * MIB, 1 << 20);
    let size = 8 * MIB;
    let cache = Cache::open(config(dir.path(), size), cluster.clone()).unwrap();
    let v = cache.open_vdi("big", true).await.unwrap().expect("cached");

    let data = pattern(3, 32 * MIB as usize);
    for (i, chunk) in data.chunks(MIB as usize).enumerate() {
        v.write(i as u64 * MIB, Bytes::copy_from_slice(chunk))
            .await
            .unwrap();
        assert!(cache.stats().used <= size, "over the bound after write {i}");
    }
    let st = cache.stats();
    assert!(
        st.total.evictions >= 24,
        "evictions: {}",
        st.total.evictions
    );
    assert!(st.total.pushed_bytes >= 24 * MIB);
    cache.flush(None, |_, _| {}).await.unwrap();
    assert!(vol.contents() == data, "every write reached the cluster");
    // What is still cached reads back right.
    let got = v
        .read_missed(31 * MIB, MIB, Missed::default())
        .await
        .unwrap();
    assert_eq!(&got[..], &data[31 * MIB as usize..]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_crash_the_next_mount_finds_the_same_dirty_blocks_and_pushes_them() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = MemCluster::default();
    let vol = cluster.add("c", 4, 16 * MIB, 4 << 20);
    let one = pattern(4, 4096);
    let two = pattern(5, 8192);
    let before = {
        let cache = Cache::open(config(dir.path(), 64 * MIB), cluster.clone()).unwrap();
        let v = cache.open_vdi("c", true).await.unwrap().expect("cached");
        v.write(MIB, Bytes::from(one.clone())).await.unwrap();
        v.write(9 * MIB + 4096, Bytes::from(two.clone()))
            .await
            .unwrap();
        let st = cache.stats();
        assert_eq!(st.dirty, 12288);
        st
        // Dropped without shutdown: as after a kill -9 (same boot, not marked clean).
    };
    assert_eq!(vol.stats().writes, 0);

    let cache = Cache::open(config(dir.path(), 64 * MIB), cluster.clone()).unwrap();
    let after = cache.stats();
    assert_eq!(after.dirty, before.dirty, "the same dirty bytes");
    assert_eq!(vdi_stats(&after, "c"), vdi_stats(&before, "c"));
    // Starting pushes what the last mount left.
    cache.start(&tokio::runtime::Handle::current()).unwrap();
    wait_for("the push of what the last mount left", || {
        cache.stats().dirty == 0 && cluster.0.flushes.load(Ordering::SeqCst) > 0
    });
    let all = vol.contents();
    assert_eq!(&all[MIB as usize..MIB as usize + 4096], &one[..]);
    let at = 9 * MIB as usize + 4096;
    assert_eq!(&all[at..at + 8192], &two[..]);
    assert_eq!(
        vol.stats().write_bytes,
        12288,
        "only the dirty blocks were pushed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_cache_keeps_a_range_only_on_its_second_miss() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = MemCluster::default();
    let vol = cluster.add("f", 5, 32 * MIB, 1 << 20);
    let data = pattern(6, 32 * MIB as usize);
    vol.write_at(0, Bytes::from(data.clone())).await.unwrap();
    let size = 8 * MIB;
    let cache = Cache::open(config(dir.path(), size), cluster.clone()).unwrap();
    cache.start(&tokio::runtime::Handle::current()).unwrap();
    let v = cache.open_vdi("f", true).await.unwrap().expect("cached");
    let (v, data) = (&v, &data);
    let read = |at: u64| async move {
        let got = v.read_missed(at, MIB, Missed::default()).await.unwrap();
        assert!(
            got[..] == data[at as usize..(at + MIB) as usize],
            "MiB at {at}"
        );
    };
    let landed = || cache.stats().fill_backlog == 0;
    // One pass over four times the cache: what fits is kept, then first misses pass by.
    for i in 0..32 {
        read(i * MIB).await;
        wait_for("fills to land", landed);
    }
    let st = cache.stats();
    assert!(st.used <= size, "over the bound: {}", st.used);
    assert!(st.total.skipped_fills > 0, "a full cache kept first misses");
    assert_eq!(st.total.evictions, 0, "first misses displaced cached data");
    // Ranges missed again, sooner than the cached data was last used: they come in, and
    // displace what went unused longest.
    let fills = st.total.fills;
    for at in [20, 21, 22] {
        read(at * MIB).await;
        wait_for("a second miss's fill", landed);
    }
    let st = cache.stats();
    assert!(
        st.total.fills >= fills + 3,
        "second misses were not kept: {st:?}"
    );
    assert!(st.total.evictions > 0, "nothing was displaced: {st:?}");
    assert!(st.used <= size, "over the bound: {}", st.used);
    // And is served from the cache now.
    let reads = vol.stats().reads;
    let got = match v.read_hit(20 * MIB, MIB) {
        Ok(hit) => Bytes::from(hit),
        Err(missed) => v.read_missed(20 * MIB, MIB, missed).await.unwrap(),
    };
    assert!(got[..] == data[20 * MIB as usize..21 * MIB as usize]);
    assert_eq!(vol.stats().reads, reads, "served from the cache");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mode_changes_writeback_writethrough_off() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = MemCluster::default();
    let vol = cluster.add("m", 6, 16 * MIB, 4 << 20);
    let cache = Cache::open(config(dir.path(), 64 * MIB), cluster.clone()).unwrap();
    cache.start(&tokio::runtime::Handle::current()).unwrap();
    let v = cache.open_vdi("m", true).await.unwrap().expect("cached");
    let vid = cache.vid_of("m").expect("a record of m");
    assert_eq!(cache.mode_of(vid), CacheMode::Writeback);

    // Writeback: the write stays in the cache.
    v.write(0, Bytes::from(pattern(7, 4096))).await.unwrap();
    assert_eq!((cache.stats().dirty, vol.stats().writes), (4096, 0));

    // Leaving writeback flushes first (as cachectl mode does); writethrough then writes the
    // cluster at once and keeps a clean copy.
    cache.flush(Some(vid), |_, _| {}).await.unwrap();
    cache.set_mode(vid, CacheMode::Writethrough);
    assert_eq!(cache.mode_of(vid), CacheMode::Writethrough);
    assert_eq!(vol.stats().writes, 1);
    let two = pattern(8, 8192);
    v.write(MIB, Bytes::from(two.clone())).await.unwrap();
    assert_eq!(vol.stats().writes, 2, "writethrough reached the cluster");
    assert_eq!(cache.stats().dirty, 0);
    assert_eq!(&vol.contents()[MIB as usize..MIB as usize + 8192], &two[..]);
    assert!(vdi_stats(&cache.stats(), "m").0 >= 12288, "and kept a copy");

    // Off: the cached data goes, and reads and writes go straight to the cluster.
    cache.set_mode(vid, CacheMode::Off);
    assert_eq!(cache.mode_of(vid), CacheMode::Off);
    assert_eq!(vdi_stats(&cache.stats(), "m"), (0, 0));
    let reads = vol.stats().reads;
    let got = v.read_missed(MIB, 8192, Missed::default()).await.unwrap();
    assert_eq!(&got[..], &two[..]);
    assert!(vol.stats().reads > reads);
    v.write(2 * MIB, Bytes::from(pattern(9, 4096)))
        .await
        .unwrap();
    assert_eq!(vol.stats().writes, 3);
    assert_eq!(cache.stats().used, 0, "mode off caches nothing");
}

/// A tmpfs of `mib` MiB mounted over a new temporary directory, unmounted when dropped (also
/// when the test fails); None (the test is skipped, and says so) where mounting is not
/// allowed.
struct SmallDisk(tempfile::TempDir);

impl SmallDisk {
    fn mount(mib: u64) -> Option<SmallDisk> {
        let d = tempfile::tempdir().unwrap();
        let ok = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(d.path())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            eprintln!("skipped: cannot mount a tmpfs here (needs root)");
            return None;
        }
        Some(SmallDisk(d))
    }

    /// Fills what is left of the disk with a file `name` (ENOSPC from here on); returns its
    /// path.
    fn fill(&self, name: &str) -> std::path::PathBuf {
        use std::io::Write;
        let p = self.0.path().join(name);
        let mut f = std::fs::File::create(&p).unwrap();
        let block = vec![0x5au8; 4096];
        while f.write_all(&block).is_ok() {}
        p
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(self.0.path())
            .status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_cache_disk_sends_writes_to_the_cluster_and_stays_coherent() {
    let Some(disk) = SmallDisk::mount(8) else {
        return;
    };
    let dir = disk.0.path().join("cache");
    let cluster = MemCluster::default();
    let vol = cluster.add("full", 9, 24 * MIB, 1 << 20);
    // The bound is far above what the disk holds: the disk fills first.
    let cache = Cache::open(config(&dir, 256 * MIB), cluster.clone()).unwrap();
    cache.start(&tokio::runtime::Handle::current()).unwrap();
    let v = cache.open_vdi("full", true).await.unwrap().expect("cached");

    // Cached (dirty) before the disk fills, object 1 only in part: the next write into it
    // needs new blocks on the full disk (before the fix, that write failed with EIO).
    let mut want = pattern(10, 3 * MIB as usize / 2);
    v.write(0, Bytes::from(want.clone())).await.unwrap();
    want.resize(24 * MIB as usize, 0);
    let ballast = disk.fill("ballast");

    // Dirty data fills the disk: writes push and evict to make room, and all succeed, at
    // odd offsets and lengths (partial blocks, across objects).
    let pass = |seed: u64, from: usize, to: usize, want: &mut Vec<u8>| {
        let data = pattern(seed, to - from);
        let v = &v;
        let mut writes = Vec::new();
        let mut at = from;
        while at < to {
            let end = (at + 300_000).min(to);
            writes.push((at, Bytes::copy_from_slice(&data[at - from..end - from])));
            want[at..end].copy_from_slice(&data[at - from..end - from]);
            at = end;
        }
        async move {
            for (at, b) in writes {
                v.write(at as u64, b)
                    .await
                    .unwrap_or_else(|e| panic!("write at {at}: {e}"));
            }
        }
    };
    pass(11, 4096 + 100, 24 * MIB as usize, &mut want).await;
    let check = |what: &str, ok: fn(&cache_control::VdiStats) -> bool, want: &[u8]| {
        let st = cache.stats();
        assert!(ok(&st.total), "{what}: {:?}", st.total);
        assert_eq!(st.used, st.total.used, "no reserved bytes leaked");
        let (v, want) = (&v, want.to_vec());
        async move { assert!(read_all(v, 24).await == want, "reads see every write") }
    };
    check(
        "room made by pushing and evicting",
        |t| t.evictions > 0 && t.pushed_bytes > 0,
        &want,
    )
    .await;

    // Nothing left to evict on a full disk: writes go straight to the cluster.
    cache.flush(None, |_, _| {}).await.unwrap();
    cache.evict(None, false);
    let ballast2 = disk.fill("ballast2");
    pass(
        13,
        3 * MIB as usize + 512,
        7 * MIB as usize + 1000,
        &mut want,
    )
    .await;
    check(
        "writes went through",
        |t| t.full_writethroughs > 0 && t.full_writethrough_bytes > 0,
        &want,
    )
    .await;
    assert!(vol.contents()[..8 * MIB as usize] == want[..8 * MIB as usize]);

    // Room again: the cache takes writes again.
    std::fs::remove_file(ballast).unwrap();
    std::fs::remove_file(ballast2).unwrap();
    let again = pattern(12, MIB as usize);
    v.write(20 * MIB, Bytes::from(again.clone())).await.unwrap();
    want[20 * MIB as usize..21 * MIB as usize].copy_from_slice(&again);
    assert!(cache.stats().dirty >= MIB, "the write was cached");
    cache.flush(None, |_, _| {}).await.unwrap();
    assert!(vol.contents() == want, "the cluster has every write");
    assert!(read_all(&v, 24).await == want);
    // The reads' fills hold their room until they land.
    wait_for("the fills", || cache.stats().fill_backlog == 0);
    let st = cache.stats();
    assert_eq!(st.used, st.total.used, "no reserved bytes leaked");
    cache.shutdown().await;
}

/// The first `mib` MiB of a VDI, read through the cache.
async fn read_all(v: &objcache::CachedVdi<MemCluster>, mib: u64) -> Vec<u8> {
    let mut got = Vec::new();
    for i in 0..mib {
        let r = v
            .read_missed(i * MIB, MIB, Missed::default())
            .await
            .unwrap();
        got.extend_from_slice(&r);
    }
    got
}
