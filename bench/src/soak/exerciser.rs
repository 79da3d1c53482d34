//! The random-write exerciser: writes blocks of known content at random offsets of a VDI file
//! on the mount, remembers what each acknowledged write left, reads back and judges every
//! block.
//!
//! A block's content names itself: a header (magic, block number, generation) and bytes
//! derived from both, so a read tells apart the current content, an older acknowledged one
//! (a stale read: a write reverted or an old copy served) and anything else (corrupt). A write
//! that failed may or may not have landed: until the next good write, either content passes.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::time::Instant;

use super::{Log, Rng};

pub const BLOCK: usize = 4096;
const MAGIC: &[u8; 8] = b"SOAKBLK1";

/// What a block may hold: the generation of its last acknowledged write (0: never written,
/// zeros), and that of a failed write after it, which may have landed.
#[derive(Debug, Clone, Copy, Default)]
struct Expect {
    known: u64,
    maybe: Option<u64>,
}

/// A block's content at generation `gen` (zeros at 0).
pub fn content(block: u64, gen: u64) -> Vec<u8> {
    if gen == 0 {
        return vec![0; BLOCK];
    }
    let mut b = testkit::pseudo_random(BLOCK, block.wrapping_mul(0x9e37_79b9) ^ gen);
    b[..8].copy_from_slice(MAGIC);
    b[8..16].copy_from_slice(&block.to_le_bytes());
    b[16..24].copy_from_slice(&gen.to_le_bytes());
    b
}

/// The generation a block's bytes show, or None if they are no content of this block.
fn generation(block: u64, bytes: &[u8]) -> Option<u64> {
    if bytes.iter().all(|&b| b == 0) {
        return Some(0);
    }
    if &bytes[..8] != MAGIC || bytes[8..16] != block.to_le_bytes() {
        return None;
    }
    let gen = u64::from_le_bytes(bytes[16..24].try_into().ok()?);
    (content(block, gen) == bytes).then_some(gen)
}

/// What the exerciser counted.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct Counts {
    pub writes: u64,
    pub reads: u64,
    pub fsyncs: u64,
    pub blocks_checked: u64,
    pub write_errors: u64,
    pub read_errors: u64,
    pub fsync_errors: u64,
    pub eio: u64,
    pub stale_blocks: u64,
    pub corrupt_blocks: u64,
    pub dog_compares: u64,
    pub dog_errors: u64,
}

pub struct Exerciser {
    file: File,
    model: Vec<Expect>,
    gen: u64,
    rng: Rng,
    pub counts: Counts,
}

impl Exerciser {
    pub fn new(file: File, size: u64, seed: u64) -> Exerciser {
        Exerciser {
            file,
            model: vec![Expect::default(); (size / BLOCK as u64) as usize],
            gen: 0,
            rng: Rng::new(seed),
            counts: Counts::default(),
        }
    }

    fn error(&mut self, log: &Log, what: &str, e: &std::io::Error) {
        if e.raw_os_error() == Some(libc::EIO) {
            self.counts.eio += 1;
        }
        log.anomaly("error", format!("exerciser {what}: {e}"));
    }

    /// One random step: mostly writes and reads, now and then an fsync.
    pub fn step(&mut self, log: &Log) {
        let r = self.rng.below(100);
        if r < 55 {
            self.write(log);
        } else if r < 97 {
            self.read(log);
        } else {
            self.fsync(log);
        }
    }

    fn range(&mut self, max: u64) -> (u64, u64) {
        let n = 1 + self.rng.below(max);
        let first = self.rng.below(self.model.len() as u64 - n + 1);
        (first, n)
    }

    fn write(&mut self, log: &Log) {
        let (first, n) = self.range(16);
        self.gen += 1;
        let gen = self.gen;
        let mut buf = Vec::with_capacity(n as usize * BLOCK);
        for b in first..first + n {
            buf.extend_from_slice(&content(b, gen));
        }
        self.counts.writes += 1;
        let res = self.file.write_all_at(&buf, first * BLOCK as u64);
        for b in first..first + n {
            let e = &mut self.model[b as usize];
            match res {
                Ok(()) => {
                    *e = Expect {
                        known: gen,
                        maybe: None,
                    }
                }
                Err(_) => e.maybe = Some(gen),
            }
        }
        if let Err(e) = res {
            self.counts.write_errors += 1;
            self.error(log, &format!("write of blocks {first}+{n}"), &e);
        }
    }

    fn read(&mut self, log: &Log) {
        let (first, n) = self.range(64);
        let mut buf = vec![0u8; n as usize * BLOCK];
        self.counts.reads += 1;
        match self.file.read_exact_at(&mut buf, first * BLOCK as u64) {
            Ok(()) => self.judge(log, "read", first, &buf),
            Err(e) => {
                self.counts.read_errors += 1;
                self.error(log, &format!("read of blocks {first}+{n}"), &e);
            }
        }
    }

    pub fn fsync(&mut self, log: &Log) -> bool {
        self.counts.fsyncs += 1;
        match self.file.sync_all() {
            Ok(()) => true,
            Err(e) => {
                self.counts.fsync_errors += 1;
                self.error(log, "fsync", &e);
                false
            }
        }
    }

    /// Judges blocks `first..` of `bytes` (read through `how`) against the model.
    pub fn judge(&mut self, log: &Log, how: &str, first: u64, bytes: &[u8]) {
        for (i, chunk) in bytes.chunks_exact(BLOCK).enumerate() {
            let b = first + i as u64;
            let want = self.model[b as usize];
            self.counts.blocks_checked += 1;
            match generation(b, chunk) {
                Some(g) if g == want.known || Some(g) == want.maybe => {}
                Some(g) if g < want.known => {
                    self.counts.stale_blocks += 1;
                    log.anomaly(
                        "stale",
                        format!(
                            "{how}: block {b} holds generation {g}, the last acknowledged \
                             write was generation {}",
                            want.known
                        ),
                    );
                }
                found => {
                    self.counts.corrupt_blocks += 1;
                    log.anomaly(
                        "corrupt",
                        format!(
                            "{how}: block {b} holds {}, expected generation {}{}",
                            found.map_or("bytes of no write".into(), |g| format!("generation {g}")),
                            want.known,
                            want.maybe.map_or(String::new(), |m| format!(" or {m}")),
                        ),
                    );
                }
            }
        }
    }

    /// fsync, then the whole VDI as `read` gives it (dog vdi read) judged block by block.
    pub fn compare_whole(&mut self, log: &Log, read: impl FnOnce() -> anyhow::Result<Vec<u8>>) {
        if !self.fsync(log) {
            return;
        }
        let t = Instant::now();
        self.counts.dog_compares += 1;
        match read() {
            Ok(bytes) if bytes.len() == self.model.len() * BLOCK => {
                self.judge(log, "dog vdi read", 0, &bytes);
                log.note(format!(
                    "dog vdi read compared {} blocks in {:.1} s",
                    self.model.len(),
                    t.elapsed().as_secs_f64()
                ));
            }
            Ok(bytes) => {
                self.counts.dog_errors += 1;
                log.anomaly(
                    "error",
                    format!(
                        "dog vdi read gave {} bytes, not {}",
                        bytes.len(),
                        self.model.len() * BLOCK
                    ),
                );
            }
            Err(e) => {
                self.counts.dog_errors += 1;
                log.anomaly("error", format!("dog vdi read: {e:#}"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contents_name_their_block_and_generation() {
        assert_eq!(generation(7, &content(7, 0)), Some(0));
        assert_eq!(generation(7, &content(7, 3)), Some(3));
        // Another block's content, or a damaged one, is no content of this block.
        assert_eq!(generation(8, &content(7, 3)), None);
        let mut c = content(7, 3);
        c[100] ^= 1;
        assert_eq!(generation(7, &c), None);
        assert_ne!(content(7, 3), content(7, 4));
    }

    #[test]
    fn judges_current_stale_and_corrupt_blocks() {
        let f = tempfile::tempfile().unwrap();
        let log = Log::new(false);
        let mut x = Exerciser::new(f, 4 * BLOCK as u64, 1);
        x.model[0] = Expect {
            known: 5,
            maybe: None,
        };
        x.model[1] = Expect {
            known: 5,
            maybe: Some(6),
        };
        let mut bytes = content(0, 5);
        bytes.extend(content(1, 6)); // a failed write that landed: fine
        bytes.extend(content(2, 0)); // never written: zeros
        bytes.extend(content(3, 0));
        x.judge(&log, "t", 0, &bytes);
        assert_eq!((x.counts.stale_blocks, x.counts.corrupt_blocks), (0, 0));
        x.judge(&log, "t", 0, &content(0, 4)); // older than acknowledged
        assert_eq!(x.counts.stale_blocks, 1);
        x.judge(&log, "t", 0, &content(1, 5)); // wrong block's bytes
        assert_eq!(x.counts.corrupt_blocks, 1);
        assert_eq!(x.counts.blocks_checked, 6);
    }
}
