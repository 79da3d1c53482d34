//! Cooperative lock hand-over between mounts (issue 42; `sheepfs --lock-mode cooperative`,
//! the default), each test on mounts without a cache and again on mounts with a writeback
//! cache each: two mounts, standing for two hosts, keep one VDI open read-write; each write
//! on the mount that does not hold the lock asks the holder for it, and the holder flushes
//! (with a cache: pushes its dirty data and drops what it cached) and hands it over. Every
//! read is checked against a model of what each 4 KiB block must hold: no stale byte, no
//! lost write; also with the holder stopped (SIGSTOP) or killed (-9) while the other mount
//! asks, and with a node killed during the hand-overs. `--lock-mode exclusive` refuses the
//! second writer (EBUSY).

mod common;

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::{Duration, Instant};

use common::{block_pattern, cachectl_ok, fio, fio_verify_args, open_rw, Rig, SHEEPFS};
use testkit::cluster::Cluster;
use testkit::mount::Mount;

const TTL: &str = "3s";
const BLOCK: u64 = 4096;
/// 16 MiB in 1 MiB objects: 4096 blocks.
const BLOCKS: u64 = 4096;

/// What each block of the VDI must hold: the pattern number last written (0: zeros).
struct Model {
    blocks: Vec<u64>,
    rng: u64,
    next: u64,
}

impl Model {
    fn new(seed: u64) -> Model {
        Model {
            blocks: vec![0; BLOCKS as usize],
            rng: seed | 1,
            next: 1,
        }
    }

    fn rand(&mut self, n: u64) -> u64 {
        // xorshift64
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng % n
    }

    /// Writes `n` blocks through `f` (new objects and old ones alike), then fsyncs.
    fn write(&mut self, f: &File, n: usize) {
        for _ in 0..n {
            let b = self.rand(BLOCKS);
            let v = self.next;
            self.next += 1;
            f.write_all_at(&block_pattern(v), b * BLOCK).unwrap();
            self.blocks[b as usize] = v;
        }
        f.sync_all().unwrap();
    }

    /// Reads `n` blocks through `f`, half of them written ones, and checks each.
    fn check_some(&mut self, f: &File, n: usize, what: &str) {
        let written: Vec<u64> = (0..BLOCKS)
            .filter(|&b| self.blocks[b as usize] != 0)
            .collect();
        for i in 0..n {
            let b = if i % 2 == 0 && !written.is_empty() {
                written[self.rand(written.len() as u64) as usize]
            } else {
                self.rand(BLOCKS)
            };
            self.check_block(f, b, what);
        }
    }

    fn check_block(&self, f: &File, b: u64, what: &str) {
        let mut buf = vec![0u8; BLOCK as usize];
        f.read_exact_at(&mut buf, b * BLOCK).unwrap();
        let want = self.blocks[b as usize];
        if buf != block_pattern(want) {
            let got = (0..self.next).find(|&v| buf == block_pattern(v));
            panic!("{what}: block {b} should hold write {want}, reads {got:?} (None: neither zeros nor any write)");
        }
    }

    /// Reads the whole VDI through `f` and checks every block.
    fn check_all(&self, f: &File, what: &str) {
        let mut buf = vec![0u8; (BLOCKS * BLOCK) as usize];
        f.read_exact_at(&mut buf, 0).unwrap();
        self.check_bytes(&buf, what);
    }

    fn check_bytes(&self, buf: &[u8], what: &str) {
        assert_eq!(buf.len() as u64, BLOCKS * BLOCK, "{what}: size");
        for b in 0..BLOCKS {
            let at = (b * BLOCK) as usize;
            let want = self.blocks[b as usize];
            assert!(
                buf[at..at + BLOCK as usize] == block_pattern(want)[..],
                "{what}: block {b} does not hold write {want}"
            );
        }
    }
}

/// Mounts with a cache each, or without one.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Kind {
    Plain,
    Cached,
}

/// The mount options of `kind` for a mount whose cache, if any, lives in `dir`.
fn kind_args(kind: Kind, dir: &Path) -> Vec<String> {
    let mut a = vec!["--lock-ttl".to_string(), TTL.to_string()];
    if kind == Kind::Cached {
        a.push("--cache-dir".into());
        a.push(dir.display().to_string());
        a.push("--cache-size".into());
        a.push("64M".into());
    }
    a
}

/// A second mount of the cluster (another host to the cluster), plain, with `extra`.
fn mount(tmp: &Path, c: &Cluster, name: &str, extra: &[&str]) -> Mount {
    let mut args = vec!["--lock-ttl", TTL];
    args.extend_from_slice(extra);
    Mount::start(
        Path::new(SHEEPFS),
        &c.addr(1),
        &tmp.join(format!("mnt-{name}")),
        &tmp.join(format!("{name}.log")),
        &args,
    )
}

/// A cluster with its mount (A) and a second mount (B, another host to the cluster), both
/// of `kind`, and VDI `x` of 16 MiB. Fields drop in order: B, then A and the cluster, then
/// the directory B (and the caches) live in.
struct Hosts {
    b: Mount,
    rig: Rig,
    tmp: tempfile::TempDir,
}

fn two_hosts(kind: Kind) -> Hosts {
    let tmp = tempfile::tempdir().unwrap();
    let a_args = kind_args(kind, &tmp.path().join("cache-a"));
    let a_args: Vec<&str> = a_args.iter().map(String::as_str).collect();
    let rig = Rig::start(3, 2, "1M", &a_args);
    rig.cluster.dog_ok(&["vdi", "create", "x", "16M"]);
    let b_args = kind_args(kind, &tmp.path().join("cache-b"));
    let b_args: Vec<&str> = b_args.iter().map(String::as_str).collect();
    let b = Mount::start(
        Path::new(SHEEPFS),
        &rig.cluster.addr(1),
        &tmp.path().join("mnt-b"),
        &tmp.path().join("b.log"),
        &b_args,
    );
    Hosts { b, rig, tmp }
}

fn count(log: &Path, what: &str) -> usize {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .matches(what)
        .count()
}

/// The whole VDI as the cluster has it, through `dog vdi read`.
fn dog_read(c: &Cluster) -> Vec<u8> {
    c.dog_ok(&["vdi", "read", "x"])
}

/// Counter `name` summed over the cluster's 3 nodes (`dog node stat --json`).
fn node_counter(c: &Cluster, name: &str) -> u64 {
    (0..3)
        .map(|i| {
            let st = c.dog_json(&["node", "stat", &c.addr(i)]);
            let extra = st["extra"].as_array().cloned().unwrap_or_default();
            extra
                .iter()
                .filter(|x| x["name"] == name)
                .map(|x| x["value"].as_f64().unwrap_or(0.0) as u64)
                .sum::<u64>()
        })
        .sum()
}

/// Sends SIGCONT to a stopped process when dropped.
struct Resume(u32);

impl Drop for Resume {
    fn drop(&mut self) {
        // SAFETY: kill(2) with a pid and a signal number; no memory is involved.
        unsafe { libc::kill(self.0 as libc::pid_t, libc::SIGCONT) };
    }
}

const TAKEN: &str = "took the lock over from";

fn two_mounts_writing_in_turn_hand_the_lock_over_200_times(kind: Kind) {
    let h = two_hosts(kind);
    // Both keep the file open read-write all along, as two qemu processes would.
    let fa = open_rw(h.rig.path("x"));
    let fb = open_rw(h.b.path("x"));
    let files = [&fa, &fb];
    let mut m = Model::new(42);
    let rounds = 200;
    let start = Instant::now();
    for r in 0..rounds {
        let (me, other) = (files[r % 2], files[(r + 1) % 2]);
        // The mount about to write reads first (it does not hold the lock: its reads must
        // see the holder's writes), then writes, taking the lock.
        m.check_some(me, 4, &format!("round {r}: read before the write"));
        m.write(me, 4);
        m.check_some(me, 4, &format!("round {r}: read back by the writer"));
        // The one that gave the lock away reads the new writes too.
        m.check_some(other, 4, &format!("round {r}: read by the other mount"));
    }
    let took = start.elapsed();
    m.check_all(&fa, "mount A at the end");
    m.check_all(&fb, "mount B at the end");
    m.check_bytes(&dog_read(&h.rig.cluster), "dog vdi read");
    let taken = count(&h.rig.cluster.dir.path().join("sheepfs.log"), TAKEN)
        + count(&h.tmp.path().join("b.log"), TAKEN);
    assert!(
        taken >= rounds - 1,
        "{taken} hand-overs logged for {rounds} rounds of writes in turn"
    );
    // The nodes count them too (each the changes it served).
    let counted = node_counter(&h.rig.cluster, "sheep_lock_handovers_total");
    assert!(
        counted >= rounds as u64 - 1,
        "{counted} hand-overs in the nodes' metrics for {rounds} rounds"
    );
    assert!(node_counter(&h.rig.cluster, "sheep_lock_handover_requests_total") >= counted);
    if kind == Kind::Cached {
        // Both caches were used, and gave up what they held at each hand-over.
        for (cache, log) in [
            ("cache-a", h.rig.cluster.dir.path().join("sheepfs.log")),
            ("cache-b", h.tmp.path().join("b.log")),
        ] {
            let out = cachectl_ok(&h.tmp.path().join(cache), &["stats", "--json"]);
            let st: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
            let (given, took) = (
                &st["total"]["handovers_given"],
                &st["total"]["handovers_taken"],
            );
            assert!(
                given.as_u64() >= Some(rounds as u64 / 2 - 1)
                    && took.as_u64() >= Some(rounds as u64 / 2 - 1),
                "{cache}: {given} hand-overs given, {took} taken in cachectl stats"
            );
            let text = std::fs::read_to_string(&log).unwrap();
            let dropping = text
                .lines()
                .filter(|l| l.contains("handed the lock") && !l.contains("dropped 0 B"))
                .count();
            assert!(dropping > 0, "{cache}: no hand-over dropped cached data");
        }
    }
    eprintln!(
        "{rounds} rounds, {taken} hand-overs in {took:?} ({:?} a round)",
        took / rounds as u32
    );
}

/// Hand-overs under many requests in flight: fio writes 16 at a time (4 KiB random writes,
/// crc32c verify headers) on the mount that does not hold the lock, so its first write asks
/// while 15 more wait behind it, then runs through the VDI handle it took the lock with; the
/// other mount then verifies every block fio wrote (reads while the lock is away), and the
/// roles swap. Four hand-overs, each with a new seed over the same 8 MiB.
fn fio_in_flight_across_hand_overs(kind: Kind) {
    let h = two_hosts(kind);
    let files = [
        h.rig.path("x"),
        h.b.path("x").to_string_lossy().into_owned(),
    ];
    // Both files stay open read-write all along, as two qemu processes would.
    let _held = [open_rw(&files[0]), open_rw(&files[1])];
    for round in 0..4 {
        let (writer, reader) = (&files[(round + 1) % 2], &files[round % 2]);
        let seed = format!("--randseed={}", 1000 + round);
        let args = fio_verify_args(writer, "8M", &["--fsync_on_close=1", &seed]);
        fio(&args.iter().map(String::as_str).collect::<Vec<_>>());
        let args = fio_verify_args(reader, "8M", &["--verify_only", &seed]);
        let v = fio(&args.iter().map(String::as_str).collect::<Vec<_>>());
        let read = v["jobs"][0]["read"]["io_bytes"].as_u64().unwrap_or(0);
        assert!(read >= 8 << 20, "round {round}: verified only {read} bytes");
    }
    let taken = count(&h.rig.cluster.dir.path().join("sheepfs.log"), TAKEN)
        + count(&h.tmp.path().join("b.log"), TAKEN);
    assert!(taken >= 4, "{taken} hand-overs logged for 4 rounds");
}

/// The holder is stopped (SIGSTOP) while the other mount asks for the lock: the write
/// waits until the holder's lease ends, then goes on; the holder, resumed, finds its lock
/// gone, and its own next write asks for it back. No acknowledged write is lost.
fn a_holder_stopped_during_a_hand_over_lets_the_lock_go_when_its_lease_ends(kind: Kind) {
    let mut h = two_hosts(kind);
    let fa = open_rw(h.rig.path("x"));
    let fb = open_rw(h.b.path("x"));
    let mut m = Model::new(7);
    m.write(&fb, 32);
    h.b.signal(libc::SIGSTOP);
    // Resumed even if the write fails: a stopped FUSE server would hang the cleanup.
    let resume = Resume(h.b.pid());
    let t = Instant::now();
    m.write(&fa, 32);
    let waited = t.elapsed();
    drop(resume);
    // Within the lease's TTL and a renewal's slack (3 s + 3 s), well before the 30 s bound.
    assert!(
        waited < Duration::from_secs(10),
        "the write waited {waited:?} for a stopped holder's lease of {TTL}"
    );
    m.check_all(&fa, "mount A after taking the lock from a stopped holder");
    m.write(&fb, 32);
    m.check_all(&fb, "mount B after taking it back");
    m.check_all(&fa, "mount A after B took it back");
    m.check_bytes(&dog_read(&h.rig.cluster), "dog vdi read");
    eprintln!("the write waited {waited:?} for the stopped holder");
}

/// The holder is killed (-9) while the other mount asks: the write goes on once its lease
/// ends; every write the dead holder acknowledged and fsynced reads back.
fn a_holder_killed_during_a_hand_over_loses_no_fsynced_write(kind: Kind) {
    let mut h = two_hosts(kind);
    let fa = open_rw(h.rig.path("x"));
    let fb = open_rw(h.b.path("x"));
    let mut m = Model::new(11);
    m.write(&fb, 64);
    let asker = std::thread::spawn({
        let fa = fa.try_clone().unwrap();
        move || {
            let t = Instant::now();
            m.write(&fa, 16);
            (m, t.elapsed())
        }
    });
    std::thread::sleep(Duration::from_millis(50));
    h.b.kill9();
    drop(fb);
    let (m, waited) = asker.join().unwrap();
    assert!(
        waited < Duration::from_secs(12),
        "the write waited {waited:?} for a killed holder's lease of {TTL}"
    );
    m.check_all(&fa, "mount A after the holder was killed");
    m.check_bytes(&dog_read(&h.rig.cluster), "dog vdi read");
}

/// A node dies while the two mounts hand the lock back and forth: every read still matches.
fn hand_overs_go_on_while_a_node_dies(kind: Kind) {
    let mut h = two_hosts(kind);
    let fa = open_rw(h.rig.path("x"));
    let fb = open_rw(h.b.path("x"));
    let files = [&fa, &fb];
    let mut m = Model::new(5);
    for r in 0..40 {
        if r == 15 {
            h.rig.cluster.kill9(2);
        }
        let (me, other) = (files[r % 2], files[(r + 1) % 2]);
        m.check_some(me, 4, &format!("round {r}: read before the write"));
        m.write(me, 8);
        m.check_some(other, 4, &format!("round {r}: read by the other mount"));
    }
    m.check_all(&fa, "mount A at the end");
    m.check_all(&fb, "mount B at the end");
}

/// A holder that never answers (a persistent lock taken with `dog vdi lock take`): `dog vdi
/// lock list` shows the mount asking for it, and the write goes on once the lock is
/// released.
#[test]
fn a_pending_request_shows_in_dog_vdi_lock_list() {
    let rig = Rig::start(3, 2, "1M", &["--lock-ttl", TTL]);
    rig.cluster.dog_ok(&["vdi", "create", "x", "16M"]);
    rig.cluster
        .dog_ok(&["vdi", "lock", "take", "x", "--owner", "someone-else"]);
    let fa = open_rw(rig.path("x"));
    let writer = std::thread::spawn(move || {
        let t = Instant::now();
        fa.write_all_at(b"after the hand-over", 0).unwrap();
        t.elapsed()
    });
    let owner = format!("/mount:{}", rig.mount.dir.display());
    testkit::wait_until(
        "the request in dog vdi lock list",
        Duration::from_secs(10),
        || {
            let l = rig.cluster.dog_json(&["vdi", "lock", "list"]);
            l[0]["requested_by"]["owner"]
                .as_str()
                .is_some_and(|o| o.ends_with(&owner))
        },
    );
    let table = String::from_utf8(rig.cluster.dog_ok(&["vdi", "lock", "list"])).unwrap();
    assert!(table.contains("a hand-over is pending"), "{table}");
    rig.cluster
        .dog_ok(&["vdi", "lock", "release", "x", "--owner", "someone-else"]);
    let waited = writer.join().unwrap();
    assert!(waited < Duration::from_secs(20), "{waited:?}");
    // Taken, the request withdrawn (and the lock released at the file's close).
    let l = rig.cluster.dog_json(&["vdi", "lock", "list"]);
    assert!(l[0].get("requested_by").is_none(), "{l}");
}

#[test]
fn exclusive_mode_refuses_a_second_writer_with_ebusy() {
    let tmp = tempfile::tempdir().unwrap();
    let rig = Rig::start(3, 2, "1M", &["--lock-ttl", TTL, "--lock-mode", "exclusive"]);
    rig.cluster.dog_ok(&["vdi", "create", "x", "16M"]);
    let b = mount(tmp.path(), &rig.cluster, "b", &["--lock-mode", "exclusive"]);
    let fa = open_rw(rig.path("x"));
    fa.write_all_at(b"held", 0).unwrap();
    let e = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(b.path("x"))
        .expect_err("the second writer is refused");
    assert_eq!(e.raw_os_error(), Some(libc::EBUSY), "{e}");
}

mod two_mounts_writing_in_turn_hand_the_lock_over_200_times {
    use super::*;

    #[test]
    fn plain() {
        super::two_mounts_writing_in_turn_hand_the_lock_over_200_times(Kind::Plain);
    }

    #[test]
    fn cached() {
        super::two_mounts_writing_in_turn_hand_the_lock_over_200_times(Kind::Cached);
    }
}

mod a_holder_stopped_during_a_hand_over_lets_the_lock_go_when_its_lease_ends {
    use super::*;

    #[test]
    fn plain() {
        super::a_holder_stopped_during_a_hand_over_lets_the_lock_go_when_its_lease_ends(
            Kind::Plain,
        );
    }

    #[test]
    fn cached() {
        super::a_holder_stopped_during_a_hand_over_lets_the_lock_go_when_its_lease_ends(
            Kind::Cached,
        );
    }
}

mod a_holder_killed_during_a_hand_over_loses_no_fsynced_write {
    use super::*;

    #[test]
    fn plain() {
        super::a_holder_killed_during_a_hand_over_loses_no_fsynced_write(Kind::Plain);
    }

    #[test]
    fn cached() {
        super::a_holder_killed_during_a_hand_over_loses_no_fsynced_write(Kind::Cached);
    }
}

mod hand_overs_go_on_while_a_node_dies {
    use super::*;

    #[test]
    fn plain() {
        super::hand_overs_go_on_while_a_node_dies(Kind::Plain);
    }

    #[test]
    fn cached() {
        super::hand_overs_go_on_while_a_node_dies(Kind::Cached);
    }
}

mod fio_in_flight_across_hand_overs {
    use super::*;

    #[test]
    fn plain() {
        super::fio_in_flight_across_hand_overs(Kind::Plain);
    }

    #[test]
    fn cached() {
        super::fio_in_flight_across_hand_overs(Kind::Cached);
    }
}
