//! The cache checks its blocks after a restart (issue 25, `src/sums.rs`): a byte flipped in a
//! cache data file while sheepfs was down is found on the first read of its block. A clean
//! block is fetched again from the cluster; a dirty one fails with EIO, is counted, and is
//! never pushed. The cache runs in process, over VDIs in memory (`common`); a crash is the
//! cache dropped without shutdown, a restart `Cache::open` on the same directory.

mod common;

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use common::*;
use objcache::{Cache, CachedVdi};
use objstore_client::MemVolume;

/// The cache files of `suffix` ("data", "sums") under `dir`.
fn cache_files(dir: &Path, suffix: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(cache_files(&p, suffix));
        } else if p.extension().is_some_and(|x| x == suffix) && !p.starts_with(dir.join("spare")) {
            out.push(p);
        }
    }
    out
}

/// Flips the bits of the byte at `at` in the only cached data file under `dir`.
fn flip_byte(dir: &Path, at: u64) {
    let files = cache_files(dir, "data");
    assert_eq!(files.len(), 1, "one cached object: {files:?}");
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&files[0])
        .unwrap();
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at).unwrap();
    f.write_all_at(&[!b[0]], at).unwrap();
}

async fn read(v: &CachedVdi<MemCluster>, offset: u64, len: u64) -> Result<Bytes, String> {
    match v.read_hit(offset, len) {
        Ok(b) => Ok(Bytes::from(b)),
        Err(m) => v
            .read_missed(offset, len, m)
            .await
            .map_err(|e| e.to_string()),
    }
}

/// The cache on `dir` (its files loaded as they are), with VDI "v" opened read-write.
async fn mounted(dir: &Path, cluster: &MemCluster) -> (Cache<MemCluster>, CachedVdi<MemCluster>) {
    let cache = Cache::open(config(dir, 64 * MIB), cluster.clone()).unwrap();
    let v = cache.open_vdi("v", true).await.unwrap().expect("cached");
    (cache, v)
}

/// A cache on `dir` with VDI "v" (vid 7) of 16 MiB, its first 64 KiB written through the
/// cache with `data` and left `dirty` or pushed; then dropped as by a kill -9.
async fn written_then_crashed(dir: &Path, cluster: &MemCluster, data: &[u8], dirty: bool) {
    let (cache, v) = mounted(dir, cluster).await;
    v.write(0, Bytes::from(data.to_vec())).await.unwrap();
    if !dirty {
        cache.flush(None, |_, _| {}).await.unwrap();
        assert_eq!(cache.stats().dirty, 0);
    }
    // Dropped without shutdown.
}

/// [`written_then_crashed`] in a new directory, over a new cluster with VDI "v", its first
/// `len` bytes `pattern(seed)`.
async fn crashed(
    seed: u64,
    len: usize,
    dirty: bool,
) -> (tempfile::TempDir, MemCluster, Arc<MemVolume>, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let cluster = MemCluster::default();
    let vol = cluster.add("v", 7, 16 * MIB, 4 << 20);
    let data = pattern(seed, len);
    written_then_crashed(dir.path(), &cluster, &data, dirty).await;
    (dir, cluster, vol, data)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_clean_block_is_fetched_again_after_a_restart() {
    let (dir, cluster, vol, data) = crashed(1, 65536, false).await;
    flip_byte(dir.path(), 4096 + 100);

    let cache = Cache::open(config(dir.path(), 64 * MIB), cluster.clone()).unwrap();
    cache.start(&tokio::runtime::Handle::current()).unwrap();
    let v = cache.open_vdi("v", true).await.unwrap().expect("cached");
    let reads = vol.stats().reads;
    assert_eq!(&read(&v, 0, 65536).await.unwrap()[..], &data[..]);
    assert!(vol.stats().reads > reads, "the bad block was fetched again");
    let st = cache.stats();
    assert_eq!(st.total.corrupt_blocks, 1);
    assert_eq!(st.dirty, 0);
    // Fetched again and filled: later reads are served right, and nothing is found again.
    wait_for("the refill", || {
        cache.stats().total.fills >= 1 && cache.stats().used == 65536
    });
    assert_eq!(&read(&v, 0, 65536).await.unwrap()[..], &data[..]);
    assert_eq!(cache.stats().total.corrupt_blocks, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_dirty_block_fails_with_eio_is_counted_and_never_pushed() {
    let (dir, cluster, vol, data) = crashed(2, 3 * 4096, true).await;
    flip_byte(dir.path(), 4096 + 7);

    let (cache, v) = mounted(dir.path(), &cluster).await;
    let err = read(&v, 4096, 4096).await.unwrap_err();
    assert!(err.contains("corrupt"), "{err}");
    // Every later read of it fails too, reads of its neighbours do not.
    assert!(read(&v, 4096 + 512, 512).await.is_err());
    assert_eq!(&read(&v, 0, 4096).await.unwrap()[..], &data[..4096]);
    assert_eq!(&read(&v, 8192, 4096).await.unwrap()[..], &data[8192..]);
    assert_eq!(cache.stats().total.corrupt_blocks, 1);
    // A flush pushes the good dirty blocks, never the quarantined one, which stays dirty.
    cache.flush(None, |_, _| {}).await.unwrap();
    let all = vol.contents();
    assert_eq!(&all[..4096], &data[..4096]);
    assert_eq!(&all[8192..12288], &data[8192..]);
    assert!(all[4096..8192].iter().all(|&b| b == 0), "garbage pushed");
    assert_eq!(cache.stats().dirty, 4096);
    assert_eq!(cache.stats().total.corrupt_blocks, 1, "counted once");
    // Written whole again, it holds good bytes: served and pushed.
    let new = pattern(3, 4096);
    v.write(4096, Bytes::from(new.clone())).await.unwrap();
    assert_eq!(&read(&v, 4096, 4096).await.unwrap()[..], &new[..]);
    cache.flush(None, |_, _| {}).await.unwrap();
    assert_eq!(&vol.contents()[4096..8192], &new[..]);
    assert_eq!(cache.stats().dirty, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocks_written_after_a_restart_are_checked_against_their_new_sums() {
    let (dir, cluster, _, data) = crashed(4, 4 * 4096, false).await;
    // Block 1 is bad on disk, then written whole before any read; block 2 is written in
    // part (its other bytes, good, are kept).
    flip_byte(dir.path(), 4096 + 9);
    let mut want = data.clone();
    {
        let (cache, v) = mounted(dir.path(), &cluster).await;
        let whole = pattern(5, 4096);
        v.write(4096, Bytes::from(whole.clone())).await.unwrap();
        want[4096..8192].copy_from_slice(&whole);
        let part = pattern(6, 100);
        v.write(8192 + 50, Bytes::from(part.clone())).await.unwrap();
        want[8192 + 50..8192 + 150].copy_from_slice(&part);
        assert_eq!(&read(&v, 0, 4 * 4096).await.unwrap()[..], &want[..]);
        assert_eq!(cache.stats().total.corrupt_blocks, 0);
        // Crashed again, with those blocks dirty.
    }
    let (cache, v) = mounted(dir.path(), &cluster).await;
    assert_eq!(&read(&v, 0, 4 * 4096).await.unwrap()[..], &want[..]);
    assert_eq!(
        cache.stats().total.corrupt_blocks,
        0,
        "their sums were updated"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cache_without_sums_files_loads_unverified_as_before() {
    let (dir, cluster, _, data) = crashed(7, 2 * 4096, false).await;
    // As an older sheepfs left it: no sums. Its blocks are served as they are on disk.
    let sums = cache_files(dir.path(), "sums");
    assert_eq!(sums.len(), 1, "{sums:?}");
    std::fs::remove_file(&sums[0]).unwrap();
    flip_byte(dir.path(), 10);
    let (cache, v) = mounted(dir.path(), &cluster).await;
    let got = read(&v, 0, 2 * 4096).await.unwrap();
    assert_eq!(got[10], !data[10], "served unverified");
    assert_eq!(&got[4096..], &data[4096..]);
    assert_eq!(cache.stats().total.corrupt_blocks, 0);
    // Writes to it still work, without sums.
    v.write(0, Bytes::from(data.clone())).await.unwrap();
    assert_eq!(&read(&v, 0, 2 * 4096).await.unwrap()[..], &data[..]);
    assert!(cache_files(dir.path(), "sums").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_write_over_a_corrupt_block_never_keeps_its_bad_bytes() {
    let (dir, cluster, _, data) = crashed(8, 4 * 4096, false).await;
    flip_byte(dir.path(), 4096 + 3000);
    let (cache, v) = mounted(dir.path(), &cluster).await;
    let part = pattern(9, 512);
    // As sheepfs writes: on the FUSE thread when it can, else on the slow path.
    if !v.write_fast(4096 + 100, &part) {
        v.write(4096 + 100, Bytes::from(part.clone()))
            .await
            .unwrap();
    }
    let mut want = data.clone();
    want[4096 + 100..4096 + 612].copy_from_slice(&part);
    let got = read(&v, 0, 4 * 4096).await.unwrap();
    assert!(got[..] == want[..], "the cluster's bytes around the write");
    assert_eq!(cache.stats().total.corrupt_blocks, 1);

    // A dirty block found bad: a write of part of it fails, as a read does.
    drop(v);
    drop(cache);
    flip_byte(dir.path(), 4096 + 3000);
    let (cache, v) = mounted(dir.path(), &cluster).await;
    let err = v.write(4096 + 100, Bytes::from(part)).await.unwrap_err();
    assert!(err.to_string().contains("corrupt"), "{err}");
    assert_eq!(cache.stats().total.corrupt_blocks, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sums_an_older_sheepfs_left_stale_are_dropped_not_trusted() {
    let (dir, cluster, _, data) = crashed(10, 2 * 4096, true).await;
    // An older sheepfs mounted since: it wrote into block 0 without touching the sums, and
    // its state.json has no "sums" field.
    flip_byte(dir.path(), 20);
    let state = dir.path().join("state.json");
    let mut st: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&state).unwrap()).unwrap();
    assert_eq!(st["sums"], true);
    st.as_object_mut().unwrap().remove("sums");
    std::fs::write(&state, serde_json::to_vec(&st).unwrap()).unwrap();

    let cache = Cache::open(config(dir.path(), 64 * MIB), cluster.clone()).unwrap();
    assert!(
        cache_files(dir.path(), "sums").is_empty(),
        "stale sums dropped"
    );
    let v = cache.open_vdi("v", true).await.unwrap().expect("cached");
    let got = read(&v, 0, 2 * 4096).await.unwrap();
    assert_eq!(
        got[20], !data[20],
        "its dirty block is served as it left it"
    );
    assert_eq!(cache.stats().total.corrupt_blocks, 0);
}
