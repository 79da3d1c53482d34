//! The guest's counter pattern on its disk, and the host's check of it.
//!
//! Write `i` (i = 1, 2, ...) fills slot `i mod K`, the 4 KiB block at `(i mod K) * 4096`,
//! with 256 copies of the 16-byte line `SEQ %011d\n`. Once the guest reports its last
//! acknowledged write `last`, slot `s` must hold the newest `i <= last` with
//! `i ≡ s (mod K)`, or zeros if no write reached it, and every byte past the K slots is zero.
//! So each of the last K acknowledged writes is checked (none lost, none torn, none undone by
//! an older copy coming back), and no write after `last` happened.

use std::fs::File;
use std::io::Read;
use std::path::Path;

use crate::{Error, Result};

/// The size of a slot: one guest write.
pub const BLOCK: usize = 4096;
const LINE: usize = 16;

/// The block write `i` puts in its slot.
pub fn block(i: u64) -> Vec<u8> {
    let line = format!("SEQ {i:011}\n");
    debug_assert_eq!(line.len(), LINE);
    line.as_bytes().repeat(BLOCK / LINE)
}

/// The write slot `slot` of `slots` must hold after writes 1..=`last`, 0 for none.
pub fn expected(slot: u64, slots: u64, last: u64) -> u64 {
    let back = (last % slots + slots - slot) % slots;
    last.saturating_sub(back)
}

/// What [`check`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PatternReport {
    /// Slots holding a write (the others were never written).
    pub written_slots: u64,
    /// The newest write found, which is `last`.
    pub newest: u64,
}

/// Checks the disk image at `path` after the guest's writes 1..=`last` over `slots` slots:
/// every slot holds what [`expected`] says, the rest of the image is zero. The error names
/// the first few slots that differ.
pub fn check(path: &Path, slots: u64, last: u64) -> Result<PatternReport> {
    let what = || format!("the counter pattern in {}", path.display());
    let mut f =
        File::open(path).map_err(|e| Error::io(format!("opening {}", path.display()), e))?;
    let mut buf = vec![0u8; BLOCK];
    let mut wrong = Vec::new();
    let mut report = PatternReport {
        written_slots: 0,
        newest: 0,
    };
    for slot in 0..slots {
        f.read_exact(&mut buf)
            .map_err(|e| Error::io(format!("reading slot {slot} of {}", path.display()), e))?;
        let want = expected(slot, slots, last);
        let ok = if want == 0 {
            buf.iter().all(|&b| b == 0)
        } else {
            buf == block(want)
        };
        if !ok {
            wrong.push(format!(
                "slot {slot}: want {}, found {}",
                name(want),
                describe(&buf)
            ));
        } else if want != 0 {
            report.written_slots += 1;
            report.newest = report.newest.max(want);
        }
    }
    let mut offset = slots * BLOCK as u64;
    let mut chunk = vec![0u8; 1 << 20];
    loop {
        let n = f
            .read(&mut chunk)
            .map_err(|e| Error::io(format!("reading {} past the slots", path.display()), e))?;
        if n == 0 {
            break;
        }
        if let Some(at) = chunk[..n].iter().position(|&b| b != 0) {
            wrong.push(format!(
                "byte {} past the slots is not zero",
                offset + at as u64
            ));
            break;
        }
        offset += n as u64;
    }
    if !wrong.is_empty() {
        let shown = wrong.iter().take(8).cloned().collect::<Vec<_>>().join("; ");
        return Err(Error::Unexpected {
            what: what(),
            detail: format!("{} difference(s) after write {last}: {shown}", wrong.len()),
        });
    }
    Ok(report)
}

fn name(i: u64) -> String {
    if i == 0 {
        "zeros".into()
    } else {
        format!("write {i}")
    }
}

/// What a block holds: zeros, one write's copies, or something torn.
fn describe(buf: &[u8]) -> String {
    if buf.iter().all(|&b| b == 0) {
        return "zeros".into();
    }
    let first = String::from_utf8_lossy(&buf[..LINE]);
    match first
        .strip_prefix("SEQ ")
        .and_then(|s| s.trim_end().parse::<u64>().ok())
    {
        Some(i) if buf == block(i) => format!("write {i}"),
        Some(i) => format!("write {i} torn"),
        None => format!("garbage starting {first:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Seek, SeekFrom, Write};

    /// What the guest does, on a file.
    fn write_pattern(path: &Path, size: u64, slots: u64, last: u64) {
        let mut f = File::create(path).unwrap();
        f.set_len(size).unwrap();
        for i in 1..=last {
            f.seek(SeekFrom::Start((i % slots) * BLOCK as u64)).unwrap();
            f.write_all(&block(i)).unwrap();
        }
    }

    #[test]
    fn expected_matches_replaying_the_writes() {
        for slots in [1, 2, 5, 8] {
            for last in 0..30 {
                let mut model = vec![0; slots as usize];
                for i in 1..=last {
                    model[(i % slots) as usize] = i;
                }
                for s in 0..slots {
                    assert_eq!(
                        expected(s, slots, last),
                        model[s as usize],
                        "{slots} {last} {s}"
                    );
                }
            }
        }
    }

    #[test]
    fn accepts_the_pattern_and_names_lost_torn_and_extra_writes() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("disk");
        write_pattern(&p, 1 << 20, 8, 13);
        let r = check(&p, 8, 13).unwrap();
        assert_eq!(
            r,
            PatternReport {
                written_slots: 8,
                newest: 13
            }
        );
        // A lost last write: the guest says 14 happened.
        let e = check(&p, 8, 14).unwrap_err().to_string();
        assert!(e.contains("slot 6: want write 14, found write 6"), "{e}");
        // Fewer writes than slots: the rest must be zeros.
        write_pattern(&p, 1 << 20, 8, 3);
        assert_eq!(check(&p, 8, 3).unwrap().written_slots, 3);
        // A torn block, and a stray byte past the slots.
        let mut f = File::options().write(true).open(&p).unwrap();
        f.seek(SeekFrom::Start(2 * BLOCK as u64 + 100)).unwrap();
        f.write_all(b"x").unwrap();
        f.seek(SeekFrom::Start(900_000)).unwrap();
        f.write_all(b"y").unwrap();
        let e = check(&p, 8, 3).unwrap_err().to_string();
        assert!(e.contains("2 difference(s)"), "{e}");
        assert!(
            e.contains("slot 2: want write 2, found write 2 torn"),
            "{e}"
        );
        assert!(e.contains("byte 900000 past the slots"), "{e}");
    }
}
