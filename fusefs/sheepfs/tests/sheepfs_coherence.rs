//! What a reader elsewhere (another mount without a cache, `dog vdi read`) sees of writes
//! made through a mount with a writeback cache, and when: docs/cache.md, "Coherence".

mod common;

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{cache_args_aged, open_rw, stats, strs, Rig, SHEEPFS};
use testkit::mount::Mount;
use testkit::wait_until;

const OBJ: u64 = 1 << 20;

fn read_at(f: &std::fs::File, off: u64, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    f.read_exact_at(&mut b, off).unwrap();
    b
}

/// A rig whose mount has a writeback cache (its directory returned) flushed by age after
/// `max_age` seconds, with an 8 MiB VDI `x`. The TempDir holds the cache; bound first, it is
/// dropped last.
fn cached_rig(max_age: &str) -> (tempfile::TempDir, PathBuf, Rig) {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let args = cache_args_aged(&cache, "64M", max_age);
    let rig = Rig::start(3, 2, "1M", &strs(&args));
    rig.cluster.dog_ok(&["vdi", "create", "x", "8M"]);
    (tmp, cache, rig)
}

#[test]
fn a_reader_elsewhere_sees_writeback_writes_once_pushed_and_new_objects_once_it_reopens() {
    // The flusher's age limit out of the way (an hour): only fsync pushes here.
    let (tmp, cache, rig) = cached_rig("3600");
    rig.cluster.write_vdi("x", 0, &[1u8; 4096]);
    let reader = Mount::start(
        Path::new(SHEEPFS),
        &rig.cluster.addr(1),
        &tmp.path().join("mnt-reader"),
        &tmp.path().join("reader.log"),
        &[],
    );
    let r = std::fs::File::open(reader.path("x")).unwrap();
    assert_eq!(read_at(&r, 0, 4), [1u8; 4]);

    // Written in writeback: object 0 (allocated) and object 3 (a hole until now).
    let w = open_rw(rig.path("x"));
    w.write_all_at(&[2u8; 4096], 0).unwrap();
    w.write_all_at(&[3u8; 4096], 3 * OBJ).unwrap();
    assert_eq!(stats(&cache)["dirty"], 8192);
    // Not pushed: nobody elsewhere sees them.
    assert_eq!(read_at(&r, 0, 4), [1u8; 4], "the reader before fsync");
    assert_eq!(
        rig.cluster.read_vdi("x", 0, 4),
        [1u8; 4],
        "dog before fsync"
    );
    assert_eq!(rig.cluster.read_vdi("x", 3 * OBJ, 4), [0u8; 4]);

    // fsync pushes: dog and the reader's open file see object 0 at once; object 3 was a
    // hole when the reader opened, and stays one to it until it opens the VDI again.
    w.sync_all().unwrap();
    assert_eq!(stats(&cache)["dirty"], 0);
    assert_eq!(rig.cluster.read_vdi("x", 0, 4), [2u8; 4]);
    assert_eq!(rig.cluster.read_vdi("x", 3 * OBJ, 4), [3u8; 4]);
    assert_eq!(read_at(&r, 0, 4), [2u8; 4], "the reader after fsync");
    assert_eq!(
        read_at(&r, 3 * OBJ, 4),
        [0u8; 4],
        "a new object, before reopening"
    );
    let r2 = std::fs::File::open(reader.path("x")).unwrap();
    assert_eq!(read_at(&r2, 3 * OBJ, 4), [3u8; 4], "after reopening");
    assert_eq!(
        read_at(&r, 3 * OBJ, 4),
        [3u8; 4],
        "every descriptor of the reader"
    );
}

#[test]
fn the_flusher_age_makes_writeback_writes_visible_elsewhere_without_fsync() {
    let (_tmp, cache, rig) = cached_rig("2");
    let w = open_rw(rig.path("x"));
    w.write_all_at(&[7u8; 4096], OBJ).unwrap();
    wait_until(
        "the flusher to push by age",
        Duration::from_secs(20),
        || rig.cluster.read_vdi("x", OBJ, 4) == [7u8; 4],
    );
    assert_eq!(stats(&cache)["dirty"], 0);
}

/// A write made without the lock (`--no-lock`) while a cache holds the VDI: the cache goes on
/// serving what it cached, and does not see it until it attaches the VDI again.
#[test]
fn a_cache_does_not_see_unlocked_writes_while_it_holds_the_vdi() {
    let (tmp, _cache, rig) = cached_rig("3600");
    let w = open_rw(rig.path("x"));
    w.write_all_at(&[1u8; 4096], 0).unwrap();
    w.sync_all().unwrap();
    let other = Mount::start(
        Path::new(SHEEPFS),
        &rig.cluster.addr(1),
        &tmp.path().join("mnt-other"),
        &tmp.path().join("other.log"),
        &["--no-lock"],
    );
    let o = open_rw(other.path("x"));
    o.write_all_at(&[9u8; 4096], 0).unwrap();
    o.sync_all().unwrap();
    assert_eq!(rig.cluster.read_vdi("x", 0, 4), [9u8; 4]);
    assert_eq!(read_at(&w, 0, 4), [1u8; 4], "the cache serves its own copy");
}
