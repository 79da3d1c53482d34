//! The `handover` figures (issue 42), on a cluster of their own: a VDI's lock handed over
//! between two mounts standing for two hosts, as at a live migration's switch-over.
//!
//! ```text
//!   sheep × N ─┬─ sheepfs --cache-dir WORK/cache-a ──► WORK/a/handover      (A, writeback)
//!              ├─ sheepfs --cache-dir WORK/cache-b ──► WORK/b/handover      (B, writeback)
//!              ├─ sheepfs (no cache) ──────────────► WORK/c/handover-off    (C)
//!              └─ sheepfs (no cache) ──────────────► WORK/d/handover-off    (D)
//! ```
//!
//! Every mount keeps its VDI open read-write with `O_DIRECT` (as qemu with `cache=none` does),
//! in `--lock-mode cooperative` (the default). After a round untimed (a push, and the lock
//! moved to the other mount and back: see `run`), each round, A holding the lock:
//!
//! - `push-dirty/cache`: A writes `handover_dirty` bytes (1 MiB writes, dirty in its cache,
//!   which pushes nothing early: `--cache-max-dirty-age 3600`), then, after a `sync`, its
//!   `fsync` is timed: the push of that data and the cluster's flush.
//! - `handover-dirty/cache`: A writes the same bytes again (other data), then, after a
//!   `sync`, one 4 KiB write and `fsync` on B are timed: B asks, A (polling every 50 ms)
//!   lets its requests finish, pushes, flushes, drops its cached blocks and releases; B
//!   takes the lock and its write goes on.
//! - `overhead-dirty/cache`: the round's hand-over minus its push; goal < 100 ms.
//! - `write-holder` and `handover-bare`, on the cache mounts and again on the mounts without
//!   a cache (`off`): `handover_bare` times, alternating direction, a 4 KiB write and `fsync`
//!   on the mount holding the lock, then the same on the other one, which takes the lock: a
//!   hand-over with nothing dirty, its fixed cost, next to the same write without one.
//!
//! So at both timed steps A's cache holds the same: `handover_dirty` bytes of the VDI, all
//! dirty (the hand-over drops them all). A 4 KiB write on A then brings the lock back for the
//! next round. The VDIs (twice `handover_dirty`) have that region written first (`dog vdi
//! write`), so every push overwrites objects that exist.
//!
//! The mounts log sheepfs's own lines of each hand-over (`RUST_LOG=warn,sheepfs=info`): the
//! holder's `handed the lock ... (ELAPSED)` and the asker's `took the lock over ... in
//! ELAPSED`, kept per hand-over in the figure's `holder_ms` and `asker_ms` (the asker's wait
//! is the holder's work plus the two polls); `write_ms` is the 4 KiB write alone, without the
//! `fsync`.

use std::cell::Cell;
use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use serde_json::Value;

use super::cluster::{output, Bins, Cluster, Mount};
use super::plan::template;
use super::proc::{check_interrupt, Watched};
use super::record::{Outcome, Recorder};
use super::rig::{sync_all, write_random};
use super::settings::Settings;
use crate::figures::Figure;

const MIB: u64 = 1 << 20;
const BLOCK: usize = 4096;
/// The VDI of the cache mounts, and of the mounts without a cache.
const VDI: &str = "handover";
const VDI_OFF: &str = "handover-off";
/// sheepfs logs at warn, but its lock hand-over lines (info).
const LOG_FILTER: &str = "warn,sheepfs=info";
/// What a holder's line of a hand-over says first.
const HANDED: &str = "handed the lock (generation";
/// How long a hand-over's log lines may take to appear after the asker's write returned.
const LOG_WAIT: Duration = Duration::from_secs(5);

/// The ids of the figures the goal and the report pair.
pub const PUSH: &str = "handover/push-dirty/cache";
pub const HANDOVER: &str = "handover/handover-dirty/cache";
pub const OVERHEAD: &str = "handover/overhead-dirty/cache";

/// Figures of this group.
const FIGURES: [&str; 7] = [
    PUSH,
    HANDOVER,
    OVERHEAD,
    "handover/write-holder/cache",
    "handover/handover-bare/cache",
    "handover/write-holder/off",
    "handover/handover-bare/off",
];

/// Announces the group's figures and its number of measurements.
pub fn plan(s: &Settings, rec: &mut Recorder) {
    let per_round = 3 + 2 * 2 * s.matrix.handover_bare;
    rec.plan(FIGURES, per_round * s.rounds.max(1));
}

fn fig(job: &str, target: &str, reference: Option<&str>, params: &[(&str, Value)]) -> Figure {
    let mut f = template("handover", job, target, "ms", params.to_vec());
    f.reference = reference.map(str::to_string);
    f.higher_is_better = false;
    f
}

/// One mount of a pair: its VDI held open, its log, its cache directory (if any).
struct Side {
    file: File,
    mount: Mount,
    log: PathBuf,
    cache: Option<PathBuf>,
}

impl Side {
    fn start(cluster: &Cluster, dir: &Path, name: &str, vdi: &str, cache: bool) -> Result<Side> {
        let cache_dir = cache.then(|| dir.join(format!("cache-{name}")));
        let mut extra = Vec::new();
        if let Some(c) = &cache_dir {
            extra.extend([
                "--cache-dir".to_string(),
                c.display().to_string(),
                "--cache-size".into(),
                "1G".into(),
                "--cache-max-dirty".into(),
                "1G".into(),
                "--cache-max-dirty-age".into(),
                "3600".into(),
            ]);
        }
        let log = dir.join(format!("sheepfs-{name}.log"));
        let mount = Mount::sheepfs_logging(cluster, &dir.join(name), &log, &extra, LOG_FILTER)?;
        let path = mount.path(vdi);
        let file = File::options()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(&path)
            .with_context(|| format!("opening {} read-write", path.display()))?;
        Ok(Side {
            file,
            mount,
            log,
            cache: cache_dir,
        })
    }

    /// One 4 KiB write at the start of the VDI, then `fsync`: (ms of the write, ms of both).
    fn write_sync(&self, buf: &mut Aligned) -> Result<(f64, f64)> {
        let block = buf.slice(BLOCK);
        block.fill(0xa5);
        let t0 = Instant::now();
        self.file.write_all_at(block, 0).context("writing 4 KiB")?;
        let write = t0.elapsed();
        self.file.sync_all().context("fsync")?;
        Ok((ms(write), ms(t0.elapsed())))
    }

    fn log_len(&self) -> u64 {
        std::fs::metadata(&self.log).map_or(0, |m| m.len())
    }
}

/// Two mounts of one VDI, and which of them holds its lock.
struct Pair {
    a: Side,
    b: Side,
    target: &'static str,
    a_holds: Cell<bool>,
}

impl Pair {
    /// (the side holding the lock, the other one).
    fn sides(&self) -> (&Side, &Side) {
        if self.a_holds.get() {
            (&self.a, &self.b)
        } else {
            (&self.b, &self.a)
        }
    }

    /// A 4 KiB write and `fsync` on A (`to_a`) or B, which takes the lock if the other one
    /// has it (untimed).
    fn lock_to(&self, to_a: bool, buf: &mut Aligned) -> Result<()> {
        let side = if to_a { &self.a } else { &self.b };
        side.write_sync(buf)?;
        self.a_holds.set(to_a);
        Ok(())
    }

    fn watched(&self) -> Vec<Watched> {
        vec![self.a.mount.watched(), self.b.mount.watched()]
    }
}

/// What a hand-over's log lines say: the holder's and the asker's elapsed time, in ms, and
/// what a holder with a cache pushed and dropped (`pushed 256.0 MiB first, dropped ...`).
#[derive(Debug, Default, PartialEq)]
struct Logged {
    holder_ms: Option<f64>,
    asker_ms: Option<f64>,
    holder_did: Option<String>,
}

pub fn run(s: &Settings, bins: &Bins, dir: &Path, rec: &mut Recorder) -> Result<()> {
    let dirty = s.matrix.handover_dirty;
    eprintln!(
        "bench: handover: {} nodes, {} MiB dirty at each hand-over, {} rounds",
        s.nodes,
        dirty / MIB,
        s.rounds
    );
    let cluster = Cluster::start(bins, dir, s.nodes, s.membership)?;
    cluster.format(s.copies, s.object_size)?;
    let src = dir.join("src.raw");
    write_random(&src, dirty)?;
    for vdi in [VDI, VDI_OFF] {
        cluster.create_vdi(vdi, 2 * dirty)?;
        cluster.write_vdi(vdi, &src)?;
    }
    let _ = std::fs::remove_file(&src);
    // The first side of each pair opens (and so attaches, with a cache) first.
    let cache = Pair {
        a: Side::start(&cluster, dir, "a", VDI, true)?,
        b: Side::start(&cluster, dir, "b", VDI, true)?,
        target: "cache",
        a_holds: Cell::new(false),
    };
    let off = Pair {
        a: Side::start(&cluster, dir, "c", VDI_OFF, false)?,
        b: Side::start(&cluster, dir, "d", VDI_OFF, false)?,
        target: "off",
        a_holds: Cell::new(false),
    };
    let mut buf = Aligned::new(MIB as usize);
    // A round untimed first, so that the rounds measured are alike: the first push after
    // the VDI was written ran slower than the next ones (780 against 676–708 ms at 256 MiB,
    // while the holder's part of the hand-over took 765–803 ms in every round), and a mount
    // that takes a lock for the first time skips what each later take pays (its first write
    // is retried once, 22 ms: the client expected the object at the version it last wrote).
    write_region(&cache.a.file, 0, dirty, u64::MAX, &mut buf)?;
    cache.a.file.sync_all().context("fsync on mount A")?;
    for pair in [&cache, &off] {
        pair.lock_to(true, &mut buf)?;
        pair.lock_to(false, &mut buf)?;
        pair.lock_to(true, &mut buf)?;
    }
    let size = [("dirty_bytes", Value::from(dirty))];
    let push = fig("push-dirty", "cache", None, &size);
    let handover = fig("handover-dirty", "cache", Some(PUSH), &size);
    let overhead = fig("overhead-dirty", "cache", None, &size);
    let given_before = handovers_given(&cluster, &cache)?;
    let rounds = s.rounds.max(1);
    for round in 0..rounds {
        let note = if rounds > 1 {
            format!(" (round {}/{rounds})", round + 1)
        } else {
            String::new()
        };
        let seed = 2 * round as u64;
        // The push: A's dirty data, timed at its fsync. Each timed step comes after a `sync`,
        // so that the kernel's write-back of the cache files just written is not inside it.
        write_region(&cache.a.file, 0, dirty, seed, &mut buf)?;
        sync_all()?;
        rec.announce(&push, &note)?;
        let t0 = Instant::now();
        cache.a.file.sync_all().context("fsync on mount A")?;
        let push_ms = ms(t0.elapsed());
        rec.record(&push, push_ms)?;
        // The hand-over: the same bytes dirty again on A, then a write on B.
        write_region(&cache.a.file, 0, dirty, seed + 1, &mut buf)?;
        sync_all()?;
        let hand_ms = hand_over(rec, &handover, &cache, &mut buf, &note)?;
        rec.announce(&overhead, &note)?;
        rec.record(&overhead, hand_ms - push_ms)?;
        for pair in [&cache, &off] {
            bare(rec, pair, s.matrix.handover_bare, &mut buf, &note)?;
            // A holds the lock at the next round's start.
            pair.lock_to(true, &mut buf)?;
        }
    }
    // Every timed step on the cache mounts was a hand-over: `cachectl stats` counts them (a
    // round's dirty one, its bare ones, and the lock's way back to A if B has it).
    if let (Some(before), Some(after)) = (given_before, handovers_given(&cluster, &cache)?) {
        let n = s.matrix.handover_bare;
        let expected = (rounds * (1 + n + usize::from(n.is_multiple_of(2)))) as u64;
        rec.set_param(HANDOVER, "cachectl_handovers", Value::from(after - before));
        if after - before != expected {
            eprintln!(
                "bench: handover: the caches counted {} hand-overs given, {expected} expected",
                after - before
            );
        }
    }
    drop((off, cache));
    Ok(())
}

/// `n` hand-overs with nothing dirty on `pair`, alternating direction, each after the same
/// write on the holder.
fn bare(rec: &mut Recorder, pair: &Pair, n: usize, buf: &mut Aligned, note: &str) -> Result<()> {
    let holder = fig("write-holder", pair.target, None, &[]);
    let job = fig(
        "handover-bare",
        pair.target,
        Some(&holder.id),
        &[("handovers_per_round", Value::from(n))],
    );
    for _ in 0..n {
        rec.announce(&holder, note)?;
        let (_, t) = pair.sides().0.write_sync(buf)?;
        rec.record(&holder, t)?;
        hand_over(rec, &job, pair, buf, note)?;
    }
    Ok(())
}

/// Times a hand-over on `pair` (a 4 KiB write and `fsync` on the side that does not hold the
/// lock) as a run of `fig`, with what the logs say of it; its time in ms.
fn hand_over(
    rec: &mut Recorder,
    fig: &Figure,
    pair: &Pair,
    buf: &mut Aligned,
    note: &str,
) -> Result<f64> {
    let (holder, asker) = pair.sides();
    let marks = (holder.log_len(), asker.log_len());
    rec.announce(fig, note)?;
    let mut write_ms = 0.0;
    let outcome = rec.measure(fig, &pair.watched(), || {
        let (w, t) = asker.write_sync(buf)?;
        write_ms = w;
        Ok(Outcome { value: t, bytes: 0 })
    })?;
    pair.a_holds.set(!pair.a_holds.get());
    rec.push_param(&fig.id, "write_ms", Value::from(write_ms));
    let logged = read_logs(holder, asker, marks)?;
    for (key, v) in [
        ("holder_ms", logged.holder_ms),
        ("asker_ms", logged.asker_ms),
    ] {
        rec.push_param(&fig.id, key, v.map_or(Value::Null, Value::from));
    }
    if let Some(did) = logged.holder_did {
        rec.push_param(&fig.id, "holder_did", Value::from(did));
    }
    Ok(outcome.value)
}

/// The hand-over's lines in the holder's and the asker's logs past `marks`, waited for up to
/// [`LOG_WAIT`] (the holder logs once it has released, which may be after the asker's write).
fn read_logs(holder: &Side, asker: &Side, marks: (u64, u64)) -> Result<Logged> {
    let deadline = Instant::now() + LOG_WAIT;
    loop {
        let held = tail(&holder.log, marks.0)?;
        let line = held.lines().rev().find(|l| l.contains(HANDED));
        let logged = Logged {
            holder_ms: line.and_then(holder_elapsed),
            asker_ms: tail(&asker.log, marks.1)?
                .lines()
                .rev()
                .find_map(asker_elapsed),
            holder_did: line.and_then(holder_did),
        };
        if (logged.holder_ms.is_some() && logged.asker_ms.is_some()) || Instant::now() > deadline {
            return Ok(logged);
        }
        check_interrupt()?;
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// What `path` holds past byte `from`.
fn tail(path: &Path, from: u64) -> Result<String> {
    let data = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let from = (from as usize).min(data.len());
    Ok(String::from_utf8_lossy(&data[from..]).into_owned())
}

/// The holder's `handed the lock (generation N) over to ... (ELAPSED)`: ELAPSED in ms.
fn holder_elapsed(line: &str) -> Option<f64> {
    if !line.contains(HANDED) {
        return None;
    }
    let inner = line.trim_end().strip_suffix(')')?;
    parse_debug_duration(&inner[inner.rfind('(')? + 1..])
}

/// `pushed SIZE first, dropped SIZE cached` of a holder's line (with a cache).
fn holder_did(line: &str) -> Option<String> {
    let from = line.find("pushed ")?;
    let len = line[from..].find(" cached")? + " cached".len();
    Some(line[from..from + len].to_string())
}

/// The asker's `took the lock over ... in ELAPSED; ...`: ELAPSED in ms.
fn asker_elapsed(line: &str) -> Option<f64> {
    if !line.contains("took the lock over") {
        return None;
    }
    let rest = &line[line.rfind(", in ")? + 5..];
    parse_debug_duration(rest.split(';').next()?)
}

/// A [`Duration`]'s `Debug` text (`1.25s`, `850.5ms`, `12µs`, `7ns`) in ms.
fn parse_debug_duration(text: &str) -> Option<f64> {
    let text = text.trim();
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (num, unit) = text.split_at(split);
    let v: f64 = num.parse().ok()?;
    let scale = match unit {
        "s" => 1e3,
        "ms" => 1.0,
        "µs" | "us" => 1e-3,
        "ns" => 1e-6,
        _ => return None,
    };
    Some(v * scale)
}

/// Hand-overs given by the two caches of `pair` so far (`cachectl stats`), if it counts them.
fn handovers_given(cluster: &Cluster, pair: &Pair) -> Result<Option<u64>> {
    let mut total = 0;
    for side in [&pair.a, &pair.b] {
        let Some(dir) = &side.cache else {
            return Ok(None);
        };
        let mut cmd = Command::new(cluster.bins().path("cachectl"));
        cmd.arg("--cache-dir").arg(dir).args(["--json", "stats"]);
        let out = output(cmd, "cachectl stats")?;
        let v: Value = serde_json::from_slice(&out).context("cachectl stats --json")?;
        match v["total"]["handovers_given"].as_u64() {
            Some(n) => total += n,
            None => return Ok(None),
        }
    }
    Ok(Some(total))
}

/// `len` bytes at `offset` of `file` in 1 MiB writes of pseudo-random data from `seed`.
fn write_region(file: &File, offset: u64, len: u64, seed: u64, buf: &mut Aligned) -> Result<()> {
    let mut x = 0x9E37_79B9_7F4A_7C15 ^ (seed.wrapping_add(1)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    let mut at = 0;
    while at < len {
        check_interrupt()?;
        let n = (len - at).min(MIB) as usize;
        let chunk = buf.slice(n);
        for word in chunk.chunks_exact_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            word.copy_from_slice(&x.to_le_bytes());
        }
        file.write_all_at(chunk, offset + at)
            .with_context(|| format!("writing 1 MiB at {}", offset + at))?;
        at += n as u64;
    }
    Ok(())
}

/// A buffer aligned for `O_DIRECT` (4 KiB).
struct Aligned {
    storage: Vec<u8>,
    start: usize,
    cap: usize,
}

impl Aligned {
    fn new(cap: usize) -> Aligned {
        let storage = vec![0u8; cap + BLOCK];
        let start = storage.as_ptr().align_offset(BLOCK);
        Aligned {
            storage,
            start,
            cap,
        }
    }

    /// The first `n` bytes (at most its capacity).
    fn slice(&mut self, n: usize) -> &mut [u8] {
        let n = n.min(self.cap);
        &mut self.storage[self.start..self.start + n]
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_as_debug_prints_them() {
        for d in [
            Duration::from_millis(1250),
            Duration::from_micros(850_500),
            Duration::from_micros(12),
            Duration::from_nanos(7),
            Duration::from_secs(3),
        ] {
            let got = parse_debug_duration(&format!("{d:?}")).unwrap();
            assert!((got - ms(d)).abs() < 1e-9, "{d:?}: {got}");
        }
        assert_eq!(parse_debug_duration("12 apples"), None);
        assert_eq!(parse_debug_duration(""), None);
    }

    #[test]
    fn elapsed_times_from_the_log_lines() {
        let holder = "2026-12-04T10:00:00.1Z  INFO sheepfs::cachelocks: VDI 'handover': handed \
                      the lock (generation 7) over to host (owner x), who asked for it; pushed \
                      256 MiB first, dropped 512 MiB cached (812.5ms)";
        assert_eq!(holder_elapsed(holder), Some(812.5));
        let did = "pushed 256 MiB first, dropped 512 MiB cached";
        assert_eq!(holder_did(holder).as_deref(), Some(did));
        let plain = "INFO sheepfs::handover: VDI 'h': handed the lock (generation 3) over to \
                     h (owner y), who asked for it; its writes here were flushed first (1.5s)";
        assert_eq!(holder_elapsed(plain), Some(1500.0));
        assert_eq!(holder_did(plain), None);
        let asker = "INFO sheepfs::cachelocks: VDI 'handover': took the lock over from host \
                     (owner x, generation 7) for a write, in 901.25ms; generation 8 now, read \
                     and written through the cache again";
        assert_eq!(asker_elapsed(asker), Some(901.25));
        assert_eq!(holder_elapsed(asker), None);
        assert_eq!(asker_elapsed(holder), None);
    }
}
