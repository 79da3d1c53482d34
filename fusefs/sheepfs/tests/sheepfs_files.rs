//! File semantics of the mount: listing, create, grow, shrink refused, delete, EBUSY, ENOSPC,
//! statfs, du, and many concurrent readers and writers verifying what they read.

mod common;

use std::os::unix::fs::{FileExt, MetadataExt};
use std::sync::Arc;
use std::time::Duration;

use common::Rig;
use testkit::{pseudo_random, wait_until};

fn errno(e: &std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

#[test]
fn listing_follows_dog_and_files_behave() {
    let rig = Rig::start(3, 3, "1M", &[]);
    rig.cluster.dog_ok(&["vdi", "create", "a", "10M"]);
    let names = || -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(&rig.mount.dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    };
    wait_until("a to appear", Duration::from_secs(5), || names() == ["a"]);
    let m = std::fs::metadata(rig.path("a")).unwrap();
    assert!(m.is_file());
    assert_eq!(m.len(), 10 << 20);
    assert_eq!(m.blocks(), 0, "thin: nothing allocated yet");

    // Appears and disappears without remounting.
    rig.cluster.dog_ok(&["vdi", "create", "b", "1M"]);
    wait_until("b to appear", Duration::from_secs(5), || {
        names() == ["a", "b"]
    });
    rig.cluster.dog_ok(&["vdi", "delete", "b"]);
    wait_until("b to go", Duration::from_secs(5), || names() == ["a"]);
    assert_eq!(
        errno(&std::fs::File::open(rig.path("nope")).unwrap_err()),
        libc::ENOENT,
        "unknown VDI"
    );

    // du counts allocated objects.
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(rig.path("a"))
        .unwrap();
    f.write_all_at(b"x", (3 << 20) + 5).unwrap();
    f.sync_all().unwrap();
    assert_eq!(
        std::fs::metadata(rig.path("a")).unwrap().blocks(),
        (1 << 20) / 512
    );

    // Writing past the end: ENOSPC. Straddling the end: the part inside is written.
    assert_eq!(
        errno(&f.write_at(b"zz", 10 << 20).unwrap_err()),
        libc::ENOSPC
    );
    assert_eq!(f.write_at(b"yz", (10 << 20) - 1).unwrap(), 1);

    // Grow with truncate; shrink refused with EINVAL, size unchanged.
    f.set_len(20 << 20).unwrap();
    assert_eq!(
        rig.cluster.dog_json(&["vdi", "info", "a"])["size"],
        20u64 << 20
    );
    assert_eq!(errno(&f.set_len(1 << 20).unwrap_err()), libc::EINVAL);
    assert_eq!(std::fs::metadata(rig.path("a")).unwrap().len(), 20 << 20);
    assert!(rig.mount.log_tail().contains("refusing to shrink VDI 'a'"));

    // rm is refused while open, works after close.
    let e = std::fs::remove_file(rig.path("a")).unwrap_err();
    assert_eq!(errno(&e), libc::EBUSY);
    drop(f);
    std::fs::remove_file(rig.path("a")).unwrap();
    assert!(rig
        .cluster
        .dog_json(&["vdi", "list"])
        .as_array()
        .unwrap()
        .is_empty());

    // O_CREAT + ftruncate makes and sizes a VDI.
    let f = std::fs::File::create(rig.path("made")).unwrap();
    f.set_len(3 << 20).unwrap();
    assert_eq!(
        rig.cluster.dog_json(&["vdi", "info", "made"])["size"],
        3u64 << 20
    );

    // Bad names: EINVAL, ENAMETOOLONG; nothing created.
    let e = std::fs::File::create(rig.path("x@1")).unwrap_err();
    assert_eq!(errno(&e), libc::EINVAL, "{e}");
    let e = std::fs::File::create(rig.path(&"n".repeat(256))).unwrap_err();
    assert_eq!(errno(&e), libc::ENAMETOOLONG, "{e}");
    let names = rig.cluster.dog_json(&["vdi", "list"]);
    assert!(
        names
            .as_array()
            .unwrap()
            .iter()
            .all(|v| v["name"] != "x@1" && v["name"].as_str().unwrap().len() <= 255),
        "{names}"
    );

    // statfs reports the cluster's capacity divided by the copy count (the nodes share one
    // file system here, so each reports the same total), in 4 KiB blocks, and one file per VDI.
    let nodes = rig.cluster.dog_json(&["node", "list"]);
    let nodes = nodes.as_array().unwrap();
    let sum = |field: &str| -> u64 {
        nodes
            .iter()
            .map(|n| n["status"][field].as_u64().unwrap())
            .sum()
    };
    let copies = 3;
    let want_total = sum("disk_total") / copies / 4096;
    let want_free = sum("disk_free") / copies / 4096;
    let vdis = rig
        .cluster
        .dog_json(&["vdi", "list"])
        .as_array()
        .unwrap()
        .len() as u64;
    let st = statvfs(&rig.mount.dir);
    assert_eq!(st.f_bsize, 4096);
    assert_eq!(st.f_frsize, 4096);
    assert_eq!(st.f_blocks, want_total, "total blocks");
    // Free space moves a little between the two readings (logs, other tests): within 1 %.
    let free = st.f_bavail;
    assert!(
        free.abs_diff(want_free) <= want_free / 100 + 1,
        "free blocks {free}, the nodes say {want_free}"
    );
    assert!(free <= st.f_blocks);
    assert_eq!(st.f_files, vdis, "one file per VDI");
    assert_eq!(st.f_namemax, 255);
}

fn statvfs(path: &std::path::Path) -> libc::statvfs {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path and an out-pointer to a zeroed struct.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0, "statvfs");
    st
}

/// 8 readers and 4 writers on one file, all over the same objects: each writer owns every
/// fourth 4 KiB block (so writers share objects but never a block) and writes single blocks;
/// readers read random ranges across everything. A reader checks every block that no write
/// touched while it read (started == acknowledged before and after) against the block's last
/// acknowledged version: a write acknowledged before a read began is always seen. At the end
/// the whole file, through the mount and through dog, equals the model.
#[test]
fn many_concurrent_readers_and_writers_verify() {
    use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
    const BS: u64 = 4096;
    const SIZE: u64 = 32 << 20;
    const BLOCKS: u64 = SIZE / BS;
    let rig = Rig::start(3, 3, "1M", &[]);
    rig.cluster.dog_ok(&["vdi", "create", "c", "32M"]);
    let base = Arc::new(pseudo_random(SIZE as usize, 77));
    {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(rig.path("c"))
            .unwrap();
        f.write_all_at(&base, 0).unwrap();
        f.sync_all().unwrap();
    }
    // Version 0 of a block is the base pattern; version v > 0 is a pattern of (block, v).
    let block = {
        let base = base.clone();
        move |b: u64, v: u64| -> Vec<u8> {
            if v == 0 {
                base[(b * BS) as usize..((b + 1) * BS) as usize].to_vec()
            } else {
                pseudo_random(BS as usize, b * 1_000_003 + v)
            }
        }
    };
    let started: Arc<Vec<AtomicU64>> = Arc::new((0..BLOCKS).map(|_| AtomicU64::new(0)).collect());
    let acked: Arc<Vec<AtomicU64>> = Arc::new((0..BLOCKS).map(|_| AtomicU64::new(0)).collect());
    let checked = Arc::new(AtomicU64::new(0));
    let path = rig.path("c");
    let mut threads = Vec::new();
    for t in 0..12u64 {
        let (path, block) = (path.clone(), block.clone());
        let (started, acked, checked) = (started.clone(), acked.clone(), checked.clone());
        threads.push(std::thread::spawn(move || {
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .unwrap();
            let mut x = t * 7919 + 1;
            let mut next = || {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x
            };
            for i in 0..150 {
                if t < 8 {
                    let len = BS * (1 + next() % 64);
                    let off = (next() % ((SIZE - len) / BS)) * BS;
                    let (first, n) = (off / BS, len / BS);
                    let before: Vec<(u64, u64)> = (first..first + n)
                        .map(|b| {
                            (
                                started[b as usize].load(SeqCst),
                                acked[b as usize].load(SeqCst),
                            )
                        })
                        .collect();
                    let mut buf = vec![0u8; len as usize];
                    f.read_exact_at(&mut buf, off).unwrap();
                    for (k, &(s0, a0)) in before.iter().enumerate() {
                        let b = first + k as u64;
                        let s1 = started[b as usize].load(SeqCst);
                        if s0 != a0 || s1 != s0 {
                            continue; // a write of this block overlapped the read
                        }
                        let got = &buf[k * BS as usize..(k + 1) * BS as usize];
                        assert!(
                            got == &block(b, a0)[..],
                            "reader {t} round {i}: block {b} is not its version {a0}"
                        );
                        checked.fetch_add(1, SeqCst);
                    }
                } else {
                    // Writer w owns the blocks b with b % 4 == w.
                    let b = (next() % (BLOCKS / 4)) * 4 + (t - 8);
                    let v = started[b as usize].load(SeqCst) + 1;
                    started[b as usize].store(v, SeqCst);
                    let data = block(b, v);
                    f.write_all_at(&data, b * BS).unwrap();
                    acked[b as usize].store(v, SeqCst);
                    let mut back = vec![0u8; BS as usize];
                    f.read_exact_at(&mut back, b * BS).unwrap();
                    assert!(
                        back == data,
                        "writer {t} round {i}: block {b} read back differs"
                    );
                }
            }
        }));
    }
    for t in threads {
        t.join().unwrap();
    }
    assert!(
        checked.load(SeqCst) > 10_000,
        "readers checked only {} blocks",
        checked.load(SeqCst)
    );
    // The whole file equals the model, through the mount and through the cluster.
    let mut want = Vec::with_capacity(SIZE as usize);
    for b in 0..BLOCKS {
        want.extend_from_slice(&block(b, acked[b as usize].load(SeqCst)));
    }
    let mut through = vec![0u8; SIZE as usize];
    std::fs::File::open(&path)
        .unwrap()
        .read_exact_at(&mut through, 0)
        .unwrap();
    assert!(through == want, "the mount differs from the model");
    assert!(
        rig.cluster.read_vdi("c", 0, SIZE) == want,
        "the cluster differs from the model"
    );
}
