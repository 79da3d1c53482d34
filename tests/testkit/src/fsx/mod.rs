//! An fsx-style file exerciser (after the idea of xfstests' `fsx`, which Debian does not
//! package): seeded random operations on a file of fixed size, each checked against an
//! in-memory model of the file.
//!
//! Operations: `read` (pread), `write` (pwrite), `mapread` and `mapwrite` (through a shared
//! mapping made for the operation, or through one mapping of the whole file kept for the run,
//! so `write(2)` and discards must also reach pages already mapped), `punch` and `zero`
//! (`fallocate` punch hole and zero range, when the file system takes them) and `fsync`. A
//! `mapwrite` is followed by `msync(MS_SYNC)` unless it is one of the few left dirty on
//! purpose: the next reads must see them all the same. Every read of any kind compares what
//! it got with the model; the run ends with a read of the whole file both ways.
//!
//! The file's size never changes: VDIs do not shrink through the mount. With
//! [`Options::refuses_shrink`], `shrink` operations check that: `ftruncate` to a smaller size
//! must fail with EINVAL, and the reads after it find every byte where it was.
//!
//! A failure ([`Failure`]) names the seed, the operation and its number, the first offset
//! that differs with the expected and received bytes around it, the last operation that wrote
//! that offset, and the operations before it: run again with the same seed (and the same
//! options) to replay it.

mod map;

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;

use map::Mapping;

/// Which operations a run draws from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// read and write (plus discards and fsync): no mapping.
    Buffered,
    /// mapped reads and writes (plus discards and fsync): no read(2) or write(2) but the
    /// final check.
    Mapped,
    /// Everything mixed (fsx's default).
    Both,
}

/// What a run does.
#[derive(Debug, Clone)]
pub struct Options {
    pub seed: u64,
    /// Operations to run.
    pub ops: usize,
    pub mode: Mode,
    /// Longest read, write or discard.
    pub max_len: u64,
    /// Whether to draw punch-hole and zero-range operations (dropped anyway if the first one
    /// is refused with EOPNOTSUPP).
    pub fallocate: bool,
    /// Whether the file refuses to shrink (a VDI): then `shrink` operations try a smaller
    /// size, must fail with EINVAL, and must leave every byte as it was.
    pub refuses_shrink: bool,
    /// Operations kept for a failure report.
    pub history: usize,
}

impl Options {
    pub fn new(seed: u64, ops: usize, mode: Mode) -> Options {
        Options {
            seed,
            ops,
            mode,
            max_len: 256 << 10,
            fallocate: true,
            refuses_shrink: false,
            history: 24,
        }
    }
}

/// One operation: where and how long.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    Read {
        off: u64,
        len: u64,
    },
    Write {
        off: u64,
        len: u64,
    },
    /// `kept`: through the mapping of the whole file kept for the run.
    MapRead {
        off: u64,
        len: u64,
        kept: bool,
    },
    /// `msync`: followed by msync(MS_SYNC) of its pages.
    MapWrite {
        off: u64,
        len: u64,
        kept: bool,
        msync: bool,
    },
    Punch {
        off: u64,
        len: u64,
    },
    Zero {
        off: u64,
        len: u64,
    },
    Fsync,
    /// `ftruncate` to a smaller size, which must be refused.
    Shrink {
        to: u64,
    },
}

impl Op {
    fn name(&self) -> &'static str {
        match self {
            Op::Read { .. } => "read",
            Op::Write { .. } => "write",
            Op::MapRead { .. } => "mapread",
            Op::MapWrite { .. } => "mapwrite",
            Op::Punch { .. } => "punch",
            Op::Zero { .. } => "zero",
            Op::Fsync => "fsync",
            Op::Shrink { .. } => "shrink",
        }
    }

    /// The bytes it changes, if it changes any.
    fn changes(&self) -> Option<(u64, u64)> {
        match *self {
            Op::Write { off, len }
            | Op::MapWrite { off, len, .. }
            | Op::Punch { off, len }
            | Op::Zero { off, len } => Some((off, len)),
            _ => None,
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let range = |f: &mut fmt::Formatter<'_>, off: u64, len: u64| {
            write!(f, "{:#x} .. {:#x} ({len} bytes)", off, off + len)
        };
        write!(f, "{:<8} ", self.name())?;
        match *self {
            Op::Read { off, len }
            | Op::Write { off, len }
            | Op::Punch { off, len }
            | Op::Zero { off, len } => range(f, off, len),
            Op::MapRead { off, len, kept } => {
                range(f, off, len)?;
                f.write_str(if kept { " kept mapping" } else { "" })
            }
            Op::MapWrite {
                off,
                len,
                kept,
                msync,
            } => {
                range(f, off, len)?;
                f.write_str(if kept { " kept mapping" } else { "" })?;
                f.write_str(if msync { "" } else { " no msync" })
            }
            Op::Fsync => Ok(()),
            Op::Shrink { to } => write!(f, "to {to:#x} (must be refused)"),
        }
    }
}

/// What a run did.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Operations run, by name.
    pub counts: BTreeMap<&'static str, usize>,
    /// Whether discards ran (false: not drawn, or refused).
    pub fallocate: bool,
    /// What the file holds at the end, by the model (and by the final check).
    pub content: Vec<u8>,
}

/// The first thing a run found wrong.
#[derive(Debug, Clone)]
pub struct Failure {
    pub seed: u64,
    pub mode: Mode,
    /// The operation's number (from 1), 0 for the final check.
    pub step: usize,
    pub op: Op,
    /// A mismatch: the first offset that differs, and the bytes there (up to 16).
    pub offset: Option<u64>,
    pub expected: Vec<u8>,
    pub got: Vec<u8>,
    /// The last operation that changed that offset, with its number.
    pub last_change: Option<(usize, Op)>,
    /// A system call that failed.
    pub error: Option<String>,
    /// The operations before, oldest first, with their numbers.
    pub log: Vec<(usize, Op)>,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "fsx failed at operation {} (seed {}, mode {:?}; the same seed and options replay it): {}",
            self.step, self.seed, self.mode, self.op
        )?;
        if let Some(e) = &self.error {
            writeln!(f, "  error: {e}")?;
        }
        if let Some(off) = self.offset {
            writeln!(f, "  first difference at offset {off:#x}")?;
            writeln!(f, "  expected {:02x?}", self.expected)?;
            writeln!(f, "  got      {:02x?}", self.got)?;
            match &self.last_change {
                Some((n, op)) => writeln!(f, "  last changed by operation {n}: {op}")?,
                None => writeln!(
                    f,
                    "  never changed by this run (expected its initial bytes)"
                )?,
            }
        }
        writeln!(f, "  operations before it:")?;
        for (n, op) in &self.log {
            writeln!(f, "  {n:>6} {op}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Failure {}

/// splitmix64: a small seeded generator, so a run replays from its seed alone.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }

    fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let x = self.next().to_le_bytes();
            chunk.copy_from_slice(&x[..chunk.len()]);
        }
    }
}

const FALLOC_FL_KEEP_SIZE: i32 = 0x01;
const FALLOC_FL_PUNCH_HOLE: i32 = 0x02;
const FALLOC_FL_ZERO_RANGE: i32 = 0x10;

fn fallocate(file: &File, mode: i32, off: u64, len: u64) -> std::io::Result<()> {
    // SAFETY: a plain system call on a valid descriptor.
    let r = unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            mode,
            off as libc::off_t,
            len as libc::off_t,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// A run in progress: the file, its model and what was done.
struct Run<'a> {
    file: &'a File,
    opts: &'a Options,
    model: Vec<u8>,
    kept: Option<Mapping>,
    log: VecDeque<(usize, Op)>,
    /// Every change, for naming the last writer of an offset.
    changes: Vec<(usize, Op)>,
    report: Report,
}

impl Run<'_> {
    fn fail(&self, step: usize, op: &Op) -> Box<Failure> {
        Box::new(Failure {
            seed: self.opts.seed,
            mode: self.opts.mode,
            step,
            op: op.clone(),
            offset: None,
            expected: Vec::new(),
            got: Vec::new(),
            last_change: None,
            error: None,
            log: self.log.iter().cloned().collect(),
        })
    }

    fn io_fail(&self, step: usize, op: &Op, what: &str, e: std::io::Error) -> Box<Failure> {
        Box::new(Failure {
            error: Some(format!("{what}: {e}")),
            ..*self.fail(step, op)
        })
    }

    /// Compares `got` (read at `off`) with the model.
    fn check(&self, step: usize, op: &Op, off: u64, got: &[u8]) -> Result<(), Box<Failure>> {
        let want = &self.model[off as usize..off as usize + got.len()];
        let Some(i) = want.iter().zip(got).position(|(a, b)| a != b) else {
            return Ok(());
        };
        let at = off + i as u64;
        let end = (i + 16).min(got.len());
        let last_change = self
            .changes
            .iter()
            .rev()
            .find(|(_, c)| c.changes().is_some_and(|(o, l)| (o..o + l).contains(&at)));
        Err(Box::new(Failure {
            offset: Some(at),
            expected: want[i..end].to_vec(),
            got: got[i..end].to_vec(),
            last_change: last_change.cloned(),
            ..*self.fail(step, op)
        }))
    }

    /// Draws the next operation.
    fn draw(&mut self, rng: &mut Rng) -> Op {
        let size = self.model.len() as u64;
        let len = 1 + rng.below(self.opts.max_len.min(size));
        let off = rng.below(size - len + 1);
        let fallocate = self.opts.fallocate && self.report.fallocate;
        loop {
            let pick = rng.below(100);
            let op = match (self.opts.mode, pick) {
                (_, 0..=1) => Op::Fsync,
                (_, 2) if self.opts.refuses_shrink => Op::Shrink { to: off },
                (_, 2) => Op::Fsync,
                (_, 3..=7) if fallocate => Op::Punch { off, len },
                (_, 8..=12) if fallocate => Op::Zero { off, len },
                (_, 3..=12) => continue,
                (Mode::Buffered, 13..=55) | (Mode::Both, 13..=34) => Op::Read { off, len },
                (Mode::Buffered, _) | (Mode::Both, 35..=56) => Op::Write { off, len },
                (Mode::Mapped, 13..=55) | (Mode::Both, 57..=78) => Op::MapRead {
                    off,
                    len,
                    kept: rng.below(2) == 0,
                },
                _ => Op::MapWrite {
                    off,
                    len,
                    kept: rng.below(2) == 0,
                    msync: rng.below(8) != 0,
                },
            };
            return op;
        }
    }

    fn map(&self, off: u64, len: u64, write: bool) -> std::io::Result<Mapping> {
        Mapping::new(self.file, off, len, write)
    }

    fn apply(&mut self, step: usize, op: &Op, rng: &mut Rng) -> Result<(), Box<Failure>> {
        match *op {
            Op::Read { off, len } => {
                let mut buf = vec![0u8; len as usize];
                (self.file.read_exact_at(&mut buf, off))
                    .map_err(|e| self.io_fail(step, op, "pread", e))?;
                self.check(step, op, off, &buf)?;
            }
            Op::MapRead { off, len, kept } => {
                let mut buf = vec![0u8; len as usize];
                if kept {
                    self.kept.as_ref().expect("mapped").read(off, &mut buf);
                } else {
                    let m = (self.map(off, len, false))
                        .map_err(|e| self.io_fail(step, op, "mmap", e))?;
                    m.read(off, &mut buf);
                }
                self.check(step, op, off, &buf)?;
            }
            Op::Write { off, len } | Op::MapWrite { off, len, .. } => {
                let mut data = vec![0u8; len as usize];
                rng.fill(&mut data);
                match *op {
                    Op::Write { .. } => (self.file.write_all_at(&data, off))
                        .map_err(|e| self.io_fail(step, op, "pwrite", e))?,
                    Op::MapWrite { kept, msync, .. } => {
                        let fresh;
                        let m = if kept {
                            self.kept.as_ref().expect("mapped")
                        } else {
                            fresh = (self.map(off, len, true))
                                .map_err(|e| self.io_fail(step, op, "mmap", e))?;
                            &fresh
                        };
                        m.write(off, &data);
                        if msync {
                            m.sync(off, len)
                                .map_err(|e| self.io_fail(step, op, "msync", e))?;
                        }
                    }
                    _ => unreachable!(),
                }
                self.model[off as usize..(off + len) as usize].copy_from_slice(&data);
            }
            Op::Punch { off, len } | Op::Zero { off, len } => {
                let mode = match op {
                    Op::Punch { .. } => FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                    _ => FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE,
                };
                match fallocate(self.file, mode, off, len) {
                    Ok(()) => self.model[off as usize..(off + len) as usize].fill(0),
                    Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {
                        self.report.fallocate = false;
                        return Ok(());
                    }
                    Err(e) => return Err(self.io_fail(step, op, "fallocate", e)),
                }
            }
            Op::Shrink { to } => match self.file.set_len(to) {
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
                Err(e) => return Err(self.io_fail(step, op, "ftruncate (expected EINVAL)", e)),
                Ok(()) => {
                    let e = std::io::Error::other("it succeeded");
                    return Err(self.io_fail(step, op, "ftruncate (expected EINVAL)", e));
                }
            },
            Op::Fsync => self
                .file
                .sync_all()
                .map_err(|e| self.io_fail(step, op, "fsync", e))?,
        }
        Ok(())
    }

    /// Reads the whole file with pread (and through a fresh mapping in the mapped modes).
    fn final_check(&self) -> Result<(), Box<Failure>> {
        let size = self.model.len() as u64;
        let read = Op::Read { off: 0, len: size };
        let mut buf = vec![0u8; size as usize];
        (self.file.read_exact_at(&mut buf, 0)).map_err(|e| self.io_fail(0, &read, "pread", e))?;
        self.check(0, &read, 0, &buf)?;
        if self.opts.mode != Mode::Buffered {
            let op = Op::MapRead {
                off: 0,
                len: size,
                kept: false,
            };
            let m = self
                .map(0, size, false)
                .map_err(|e| self.io_fail(0, &op, "mmap", e))?;
            m.read(0, &mut buf);
            self.check(0, &op, 0, &buf)?;
        }
        Ok(())
    }
}

/// Runs `opts.ops` operations on `file` (open read-write, its size fixed), whose content
/// must be `initial` when called. Returns what it did, or the first mismatch or failed call.
pub fn run(file: &File, initial: Vec<u8>, opts: &Options) -> Result<Report, Box<Failure>> {
    assert!(!initial.is_empty(), "fsx needs a file that is not empty");
    let mut rng = Rng(opts.seed);
    let mut run = Run {
        file,
        opts,
        model: initial,
        kept: None,
        log: VecDeque::with_capacity(opts.history + 1),
        changes: Vec::new(),
        report: Report {
            counts: BTreeMap::new(),
            fallocate: opts.fallocate,
            content: Vec::new(),
        },
    };
    if opts.mode != Mode::Buffered {
        let size = run.model.len() as u64;
        let op = Op::MapRead {
            off: 0,
            len: size,
            kept: true,
        };
        run.kept =
            Some(Mapping::new(file, 0, size, true).map_err(|e| run.io_fail(0, &op, "mmap", e))?);
    }
    for step in 1..=opts.ops {
        let op = run.draw(&mut rng);
        run.apply(step, &op, &mut rng)?;
        *run.report.counts.entry(op.name()).or_default() += 1;
        if op.changes().is_some() {
            run.changes.push((step, op.clone()));
        }
        run.log.push_back((step, op));
        if run.log.len() > opts.history {
            run.log.pop_front();
        }
    }
    run.final_check()?;
    run.kept = None;
    Ok(Report {
        content: run.model,
        ..run.report
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a local file (tmpfs or disk) every mode passes: the model and the checks agree with
    /// a file system known to be coherent.
    #[test]
    fn every_mode_passes_on_a_local_file() {
        for mode in [Mode::Buffered, Mode::Mapped, Mode::Both] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("f");
            let size = 1 << 20;
            std::fs::write(&path, vec![0u8; size]).unwrap();
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .unwrap();
            let mut opts = Options::new(7, 1000, mode);
            opts.max_len = 64 << 10;
            let report = run(&f, vec![0u8; size], &opts).unwrap_or_else(|e| panic!("{e}"));
            let n: usize = report.counts.values().sum();
            assert_eq!(n, 1000);
            let mapped = report.counts.contains_key("mapwrite");
            assert_eq!(mapped, mode != Mode::Buffered, "{mode:?}: {report:?}");
            let plain = report.counts.contains_key("write");
            assert_eq!(plain, mode != Mode::Mapped, "{mode:?}: {report:?}");
        }
    }

    /// A file changed behind the model's back is reported with the offset, the bytes and the
    /// seed.
    #[test]
    fn a_mismatch_is_reported_with_its_offset_and_seed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, vec![0u8; 64 << 10]).unwrap();
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        // The model believes the file starts with 0xff where it holds zeros.
        let mut initial = vec![0u8; 64 << 10];
        initial[100] = 0xff;
        let mut opts = Options::new(3, 0, Mode::Buffered);
        opts.fallocate = false;
        let e = run(&f, initial, &opts).unwrap_err();
        assert_eq!(e.offset, Some(100));
        assert_eq!((e.expected[0], e.got[0]), (0xff, 0));
        let text = e.to_string();
        assert!(text.contains("seed 3") && text.contains("0x64"), "{text}");
    }
}
