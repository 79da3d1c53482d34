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

    // Bad names.
    assert!(std::fs::File::create(rig.path("x@1")).is_err());

    // statfs reports the cluster's capacity.
    let out = common::run(
        "df",
        &[
            "-B1",
            "--output=size,avail",
            &rig.mount.dir.to_string_lossy(),
        ],
    );
    let line = common::stdout(&out).lines().nth(1).unwrap().to_string();
    let nums: Vec<u64> = line
        .split_whitespace()
        .map(|n| n.parse().unwrap())
        .collect();
    assert!(
        nums[0] > 0 && nums[1] > 0 && nums[1] <= nums[0],
        "df: {line}"
    );
}

#[test]
fn many_concurrent_readers_and_writers_verify() {
    let rig = Rig::start(3, 3, "1M", &[]);
    rig.cluster.dog_ok(&["vdi", "create", "c", "32M"]);
    let base = Arc::new(pseudo_random(32 << 20, 77));
    {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(rig.path("c"))
            .unwrap();
        f.write_all_at(&base, 0).unwrap();
        f.sync_all().unwrap();
    }
    let path = rig.path("c");
    // 8 readers check random 4 KiB..256 KiB ranges against the base; 4 writers each own a
    // disjoint quarter's second half and write-then-read their own patterns there.
    let mut threads = Vec::new();
    for t in 0..12u64 {
        let path = path.clone();
        let base = base.clone();
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
                    // Only the first half of each quarter stays at the base pattern.
                    let q = next() % 4;
                    let len = 4096 * (1 + next() % 64);
                    let off = q * (8 << 20) + next() % ((4 << 20) - len);
                    let mut buf = vec![0u8; len as usize];
                    f.read_exact_at(&mut buf, off).unwrap();
                    assert!(
                        buf[..] == base[off as usize..(off + len) as usize],
                        "reader {t} round {i}: wrong data at {off}+{len}"
                    );
                } else {
                    let q = t - 8;
                    let len = 4096 * (1 + next() % 32);
                    let off = q * (8 << 20) + (4 << 20) + next() % ((4 << 20) - len);
                    let data = pseudo_random(len as usize, next());
                    f.write_all_at(&data, off).unwrap();
                    let mut back = vec![0u8; len as usize];
                    f.read_exact_at(&mut back, off).unwrap();
                    assert!(
                        back == data,
                        "writer {t} round {i}: read back differs at {off}"
                    );
                }
            }
        }));
    }
    for t in threads {
        t.join().expect("a reader or writer failed");
    }
}
