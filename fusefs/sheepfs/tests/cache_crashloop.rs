//! sheepfs killed with `kill -9` again and again at random points while a writer writes
//! through a writeback cache (with the flusher pushing all the while), remounted each time:
//! every acknowledged write is there after each remount, the dirty bytes `cachectl stats`
//! counts are the dirty bits of the `.meta` files on disk, and in the end the cluster holds
//! exactly what was written. A last fio pass, its dirty data left by one more kill, verifies
//! on a mount without the cache.

mod common;

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{block_pattern, cachectl_ok, fio, fio_verify_args as fio_job, open_rw, stats, strs};
use common::{rig_with_cache_and, Rig, SHEEPFS};
use testkit::mount::Mount;
use testkit::wait_until;

const BS: u64 = 4096;
const SIZE: u64 = 16 << 20;
const BLOCKS: u64 = SIZE / BS;
const KILLS: u64 = 20;

/// A small xorshift generator: the kill points, reproducible from the seed printed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

/// Write i puts pattern i + 1 (0: zeros, never written) at block `at(i)`.
fn at(i: u64) -> u64 {
    (i * 7919 + i / BLOCKS) % BLOCKS
}

/// Dirty bytes the `.meta` files under `cache/obj` record (see docs/cache.md for the layout).
fn dirty_on_disk(cache: &Path) -> u64 {
    let mut bytes = 0;
    for vdir in std::fs::read_dir(cache.join("obj")).unwrap().flatten() {
        for f in std::fs::read_dir(vdir.path()).unwrap().flatten() {
            if f.path().extension().is_none_or(|e| e != "meta") {
                continue;
            }
            let raw = std::fs::read(f.path()).unwrap();
            if raw.len() < 16 {
                continue; // an object being made or retired: no bits
            }
            let blocks = u32::from_le_bytes(raw[12..16].try_into().unwrap()) as usize;
            let w = blocks.div_ceil(64) * 8;
            let dirty = &raw[16 + w..16 + 2 * w];
            bytes += dirty.iter().map(|b| b.count_ones() as u64).sum::<u64>() * BS;
        }
    }
    bytes
}

#[test]
fn twenty_kill9s_during_writes_lose_no_acknowledged_write() {
    // A small max-dirty keeps the flusher pushing: kills land during pushes too.
    let (_tmp, mut rig, cache, args) =
        rig_with_cache_and(3, 3, "64M", &["--cache-max-dirty", "2M"]);
    rig.cluster.dog_ok(&["vdi", "create", "crash", "16M"]);
    rig.cluster.dog_ok(&["vdi", "create", "fio", "16M"]);
    let remount = |rig: &mut Rig, log: &str, args: &[String]| {
        rig.mount = Mount::start(
            Path::new(SHEEPFS),
            &rig.cluster.addr(0),
            &rig.mount.dir,
            &rig.cluster.dir.path().join(log),
            &strs(args),
        );
    };
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    eprintln!("kill points from seed {seed}");
    let mut rng = Rng(seed);
    // The model: each block's last acknowledged pattern.
    let mut want = vec![0u64; BLOCKS as usize];
    let mut next = 0u64;
    let started = Instant::now();

    for round in 0..KILLS {
        let acked = Arc::new(Mutex::new(next));
        let failed = Arc::new(AtomicBool::new(false));
        let writer = {
            let (path, acked, failed) = (rig.path("crash"), acked.clone(), failed.clone());
            std::thread::spawn(move || {
                let file = open_rw(&path);
                for i in next.. {
                    let r = file
                        .write_all_at(&block_pattern(i + 1), at(i) * BS)
                        .and_then(|_| {
                            if i % 97 == 0 {
                                file.sync_data()
                            } else {
                                Ok(())
                            }
                        });
                    if r.is_err() {
                        failed.store(true, SeqCst);
                        return;
                    }
                    *acked.lock().unwrap() = i + 1;
                }
            })
        };
        // A random point: after 50 to 1550 more acknowledged writes.
        let target = next + 50 + rng.below(1500);
        wait_until("acknowledged writes", Duration::from_secs(60), || {
            *acked.lock().unwrap() >= target
        });
        // And a random moment after that, within 20 ms.
        std::thread::sleep(Duration::from_micros(rng.below(20_000)));
        rig.mount.kill9();
        writer.join().unwrap();
        assert!(
            failed.load(SeqCst),
            "round {round}: the writer saw the kill"
        );
        let done = *acked.lock().unwrap();
        for i in next..done {
            want[at(i) as usize] = i + 1;
        }
        // The write under way at the kill (number `done`) may or may not be there.
        let maybe = (done, at(done));
        next = done + 1;

        remount(&mut rig, &format!("sheepfs-{round}.log"), &args);
        let mut got = vec![0u8; SIZE as usize];
        open_rw(rig.path("crash"))
            .read_exact_at(&mut got, 0)
            .unwrap();
        for b in 0..BLOCKS {
            let blk = &got[(b * BS) as usize..((b + 1) * BS) as usize];
            if b == maybe.1 && blk == &block_pattern(maybe.0 + 1)[..] {
                want[b as usize] = maybe.0 + 1;
                continue;
            }
            assert!(
                blk == &block_pattern(want[b as usize])[..],
                "round {round} (seed {seed}): block {b} is not its last acknowledged write"
            );
        }
        // The mount pushes what the last one left; then nothing changes the files: the
        // counter and the bits on disk agree.
        wait_until("the push at mount", Duration::from_secs(60), || {
            stats(&cache)["dirty"] == 0
        });
        let st = stats(&cache);
        assert_eq!(
            st["dirty"].as_u64().unwrap(),
            dirty_on_disk(&cache),
            "round {round}: stats against the meta files: {st}"
        );
        eprintln!(
            "round {round}: {} writes acknowledged so far, {:?}",
            next - 1,
            started.elapsed()
        );
    }

    // Idle with dirty data: the counter and the files agree before a kill too.
    let file = open_rw(rig.path("crash"));
    for i in next..next + 300 {
        file.write_all_at(&block_pattern(i + 1), at(i) * BS)
            .unwrap();
        want[at(i) as usize] = i + 1;
    }
    drop(file);
    let dirty = stats(&cache)["dirty"].as_u64().unwrap();
    assert!(dirty > 0);
    assert_eq!(dirty, dirty_on_disk(&cache), "stats against the meta files");

    // A last complete fio pass, its dirty data left by one more kill and pushed by the next
    // mount.
    let f = rig.path("fio");
    let pass = |extra: &str| {
        fio(&strs(&fio_job(
            &f,
            "16M",
            &["--rw=randwrite", "--number_ios=3000", extra],
        )))
    };
    pass("--do_verify=1");
    rig.mount.kill9();
    remount(&mut rig, "sheepfs-last.log", &args);
    cachectl_ok(&cache, &["flush"]);
    assert_eq!(stats(&cache)["dirty"], 0);
    rig.mount.unmount_and_wait();

    // The cluster alone: exactly what was written.
    let got = rig.cluster.read_vdi("crash", 0, SIZE);
    for b in 0..BLOCKS {
        assert!(
            got[(b * BS) as usize..((b + 1) * BS) as usize] == block_pattern(want[b as usize])[..],
            "the cluster's block {b} is not its last acknowledged write (seed {seed})"
        );
    }
    rig.mount = Mount::start(
        Path::new(SHEEPFS),
        &rig.cluster.addr(0),
        &rig.mount.dir,
        &rig.cluster.dir.path().join("sheepfs-nocache.log"),
        &[],
    );
    pass("--verify_only");
}
