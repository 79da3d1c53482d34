//! The fsx-style exerciser (`testkit::fsx`) on real mounts of a real cluster, with the cache
//! and without: seeded random reads, writes, shared-mapping reads and writes (msync'd or left
//! dirty), discards, fsyncs and refused shrinks of one VDI, each checked against a model; then the cluster
//! itself (`dog vdi read`) must hold the model's bytes once the file is fsynced.
//!
//! A failure prints the seed; `FSX_SEED=N` replays it (`FSX_OPS` changes the count).

mod common;

use std::time::Instant;

use common::{cache_args, open_rw, strs, Rig};
use testkit::fsx::{self, Mode, Options};

/// The VDI's size: 8 objects of 1 MiB, so operations cross objects and some stay holes.
const SIZE: u64 = 8 << 20;

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    Some(
        v.parse()
            .unwrap_or_else(|_| panic!("{name}={v}: not a number")),
    )
}

/// Runs fsx in `mode` on a new VDI of `rig`, then checks the cluster holds what fsx left.
fn exercise(rig: &Rig, mode: Mode, default_seed: u64) {
    let seed = env_u64("FSX_SEED").unwrap_or(default_seed);
    let ops = env_u64("FSX_OPS").unwrap_or(3000) as usize;
    rig.cluster
        .dog_ok(&["vdi", "create", "fsx", &SIZE.to_string()]);
    let f = open_rw(rig.path("fsx"));
    let mut opts = Options::new(seed, ops, mode);
    opts.max_len = 192 << 10;
    opts.refuses_shrink = true;
    let started = Instant::now();
    let report = fsx::run(&f, vec![0u8; SIZE as usize], &opts)
        .unwrap_or_else(|e| panic!("{e}\nsheepfs log:\n{}", rig.mount.log_tail()));
    eprintln!(
        "fsx {mode:?} seed {seed}: {:?} in {:.1?}",
        report.counts,
        started.elapsed()
    );
    assert_eq!(report.counts.values().sum::<usize>(), ops);
    assert!(
        report.fallocate,
        "the mount takes punch hole and zero range"
    );
    if mode != Mode::Buffered {
        assert!(report.counts["mapwrite"] > ops / 10, "{:?}", report.counts);
    }
    assert!(
        report.counts.get("shrink").is_some_and(|&n| n > 0),
        "{:?}",
        report.counts
    );
    // Durable and in the cluster: what another client reads.
    f.sync_all().unwrap();
    let cluster = rig.cluster.read_vdi("fsx", 0, SIZE);
    if let Some(i) = (0..SIZE as usize).find(|&i| cluster[i] != report.content[i]) {
        panic!(
            "dog vdi read differs from the file at offset {i:#x}: cluster {:02x?}, file {:02x?}",
            &cluster[i..(i + 16).min(cluster.len())],
            &report.content[i..(i + 16).min(cluster.len())]
        );
    }
}

fn plain() -> Rig {
    Rig::start(3, 2, "1M", &[])
}

/// A mount with a cache in writeback (the default mode); the TempDir outlives the rig.
fn cached() -> (tempfile::TempDir, Rig) {
    let tmp = tempfile::tempdir().unwrap();
    let args = cache_args(&tmp.path().join("cache"), "64M");
    let rig = Rig::start(3, 2, "1M", &strs(&args));
    (tmp, rig)
}

#[test]
fn fsx_buffered_without_cache() {
    exercise(&plain(), Mode::Buffered, 1);
}

#[test]
fn fsx_mapped_without_cache() {
    exercise(&plain(), Mode::Mapped, 2);
}

#[test]
fn fsx_both_without_cache() {
    exercise(&plain(), Mode::Both, 3);
}

#[test]
fn fsx_buffered_with_cache() {
    let (_tmp, rig) = cached();
    exercise(&rig, Mode::Buffered, 4);
}

#[test]
fn fsx_mapped_with_cache() {
    let (_tmp, rig) = cached();
    exercise(&rig, Mode::Mapped, 5);
}

#[test]
fn fsx_both_with_cache() {
    let (_tmp, rig) = cached();
    exercise(&rig, Mode::Both, 6);
}

/// What a mapping on this host shows after the VDI was written elsewhere (`dog vdi write`,
/// as another host would): `read(2)` and a new mapping see the new bytes at once; a page
/// mapped before may keep its old bytes until the file is opened or mapped again.
#[test]
fn a_mapping_sees_writes_made_elsewhere_once_the_file_is_mapped_again() {
    use std::os::unix::fs::FileExt;
    use std::os::unix::io::AsRawFd;
    let rig = plain();
    rig.cluster.dog_ok(&["vdi", "create", "m", "4M"]);
    rig.cluster.write_vdi("m", 0, &[1u8; 4096]);
    let f = std::fs::File::open(rig.path("m")).unwrap();
    let map = |f: &std::fs::File| {
        // SAFETY: a fresh read-only shared mapping of one page of an open file.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ,
                libc::MAP_SHARED,
                f.as_raw_fd(),
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
        p as *const u8
    };
    // SAFETY: reads of the first byte of live one-page mappings.
    let first = |p: *const u8| unsafe { std::ptr::read_volatile(p) };
    let old = map(&f);
    assert_eq!(first(old), 1);

    rig.cluster.write_vdi("m", 0, &[2u8; 4096]);
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, 0).unwrap();
    assert_eq!(b[0], 2, "read(2) asks sheepfs");
    // Not asserted: the page may have been evicted meanwhile (then it shows 2).
    eprintln!(
        "the old mapping shows {} after the write elsewhere",
        first(old)
    );

    let again = std::fs::File::open(rig.path("m")).unwrap();
    assert_eq!(first(old), 2, "an open drops the file's cached pages");
    rig.cluster.write_vdi("m", 0, &[3u8; 4096]);
    let fresh = map(&again);
    assert_eq!(first(fresh), 3, "a new mapping sees the new bytes");
    assert_eq!(first(old), 3, "mapping again dropped the old pages too");
    // SAFETY: unmapping the two mappings made above, once.
    unsafe {
        libc::munmap(old as *mut _, 4096);
        libc::munmap(fresh as *mut _, 4096);
    }
}
