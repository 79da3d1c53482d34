//! The backup side: which indexes changed between FROM and TO, and their records.
//!
//! Without FROM, every allocated index of TO is read and its non-zero 4 KiB blocks become
//! data records (a restore starts from zeros). With FROM, an index whose map entry is the same
//! in both is skipped unread; an index that became a hole is one zero record; any other is
//! read in TO (and in FROM when FROM has an object there) and its 4 KiB blocks that differ
//! become data records, or zero records where TO's block is all zeros.

use std::sync::Arc;

use bytes::Bytes;
use objstore_proto::name::split_snapshot;
use objstore_proto::oid::Vid;

use super::format::{Header, Record};
use super::{BackupError, BLOCK};
use crate::client::Client;
use crate::vdi::{Vdi, VdiError};

/// Two snapshots opened for a backup (FROM may be absent: a full backup).
pub struct Source {
    from: Option<Vdi>,
    to: Vdi,
    header: Header,
}

/// One index to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Change {
    pub index: u64,
    /// TO's entry ([`Vid::NONE`]: TO has a hole there).
    pub to: Vid,
    /// FROM's entry ([`Vid::NONE`]: a hole, or no FROM).
    pub from: Vid,
}

/// Splits `NAME@TAG`, refusing a plain name.
fn parts(full: &str, what: &str) -> Result<(String, String), BackupError> {
    match split_snapshot(full).map_err(VdiError::from)? {
        (name, Some(tag)) => Ok((name.to_string(), tag.to_string())),
        (name, None) => Err(BackupError::Refused(format!(
            "{what} '{name}' is a VDI, not a snapshot: back up snapshots (NAME@TAG); take one with 'dog vdi snapshot {name} -s TAG'"
        ))),
    }
}

impl Source {
    /// Opens snapshot `to` (and `from`), refusing plain names, snapshots of two different
    /// VDIs and a FROM taken after TO.
    pub async fn open(
        client: &Arc<Client>,
        from: Option<&str>,
        to: &str,
    ) -> Result<Source, BackupError> {
        let (name, to_tag) = parts(to, "TO")?;
        let from_parts = from.map(|f| parts(f, "FROM")).transpose()?;
        if let Some((fname, _)) = &from_parts {
            if *fname != name {
                return Err(BackupError::Refused(format!(
                    "FROM '{}' and TO '{to}' are snapshots of different VDIs ('{fname}' and '{name}'): an incremental backup is between two snapshots of one VDI",
                    from.unwrap_or_default()
                )));
            }
        }
        let to_vdi = Vdi::open(client.clone(), to).await?;
        let th = to_vdi.header();
        let (from_vdi, from_tag) = match (from, from_parts) {
            (Some(f), Some((_, tag))) => (Some(Vdi::open(client.clone(), f).await?), Some(tag)),
            _ => (None, None),
        };
        let (mut from_size, mut from_time) = (0, 0);
        if let Some(fv) = &from_vdi {
            let fh = fv.header();
            let f = from.unwrap_or_default();
            // Snapshot times are in seconds; within one second (or when a time is missing)
            // the vids tell: a later snapshot of a VDI froze an inode made after the
            // earlier one was taken, and vids only grow.
            let later = match (fh.snapshot, th.snapshot) {
                (f, t) if f != 0 && t != 0 && f != t => f > t,
                _ => fh.vid.0 > th.vid.0,
            };
            if later {
                return Err(BackupError::Refused(format!(
                    "FROM '{f}' was taken after TO '{to}' ({} and {}): name the older snapshot first",
                    crate::lock::format_utc(fh.snapshot as u64),
                    crate::lock::format_utc(th.snapshot as u64)
                )));
            }
            if fh.object_size != th.object_size {
                return Err(BackupError::Refused(format!(
                    "FROM '{f}' and TO '{to}' have different object sizes ({} and {})",
                    fh.object_size, th.object_size
                )));
            }
            from_size = fh.size;
            from_time = fh.snapshot as u64;
        }
        let header = Header {
            object_size: th.object_size,
            size: th.size,
            from_size,
            from_time,
            to_time: th.snapshot as u64,
            name,
            from_tag,
            to_tag,
        };
        Ok(Source {
            from: from_vdi,
            to: to_vdi,
            header,
        })
    }

    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The indexes whose map entry differs between FROM and TO (TO's allocated ones without
    /// FROM), in order.
    pub fn changes(&self) -> Vec<Change> {
        let os = self.header.object_size as u64;
        let to_map = self.to.map();
        let from_map = self.from.as_ref().map(|f| f.map()).unwrap_or_default();
        (0..self.header.size.div_ceil(os))
            .filter_map(|i| {
                let to = to_map.get(i as usize).copied().unwrap_or(Vid::NONE);
                let from = from_map.get(i as usize).copied().unwrap_or(Vid::NONE);
                (to != from).then_some(Change { index: i, to, from })
            })
            .collect()
    }

    /// The bytes of index `index` in TO.
    pub fn object_len(&self, index: u64) -> u64 {
        let os = self.header.object_size as u64;
        os.min(self.header.size - index * os)
    }

    /// The records of one changed index, in offset order.
    pub async fn records(&self, c: Change) -> Result<Vec<Record>, BackupError> {
        let os = self.header.object_size as u64;
        let base = c.index * os;
        let len = self.object_len(c.index);
        if c.to == Vid::NONE {
            return Ok(vec![Record::Zero { offset: base, len }]);
        }
        let to = self.to.read_at(base, len).await?;
        let from = match &self.from {
            Some(f) if c.from != Vid::NONE && base < f.size() => {
                let n = len.min(f.size() - base);
                Some(f.read_at(base, n).await?)
            }
            _ => None,
        };
        Ok(block_records(base, &to, from.as_deref()))
    }
}

/// Data and zero records for `to` (at VDI offset `base`) against `from` (zeros where absent
/// or shorter): runs of differing [`BLOCK`]s, data where TO's block holds anything, zeros
/// where it is all zeros.
pub fn block_records(base: u64, to: &Bytes, from: Option<&[u8]>) -> Vec<Record> {
    #[derive(PartialEq, Clone, Copy)]
    enum Class {
        Same,
        Zero,
        Data,
    }
    let from = from.unwrap_or(&[]);
    let mut out = Vec::new();
    let mut run: Option<(Class, usize)> = None;
    let flush = |out: &mut Vec<Record>, run: Option<(Class, usize)>, end: usize| match run {
        Some((Class::Data, s)) => out.push(Record::Data {
            offset: base + s as u64,
            data: to.slice(s..end),
        }),
        Some((Class::Zero, s)) => out.push(Record::Zero {
            offset: base + s as u64,
            len: (end - s) as u64,
        }),
        _ => {}
    };
    let mut at = 0;
    while at < to.len() {
        let end = (at + BLOCK).min(to.len());
        let t = &to[at..end];
        let f = from.get(at..end.min(from.len())).unwrap_or(&[]);
        let zero = t.iter().all(|&b| b == 0);
        let same = if f.len() == t.len() {
            f == t
        } else {
            // FROM ends inside this block: the rest reads as zeros.
            t[..f.len()] == *f && t[f.len()..].iter().all(|&b| b == 0)
        };
        let class = if same {
            Class::Same
        } else if zero {
            Class::Zero
        } else {
            Class::Data
        };
        if run.map(|(c, _)| c) != Some(class) {
            flush(&mut out, run, at);
            run = Some((class, at));
        }
        at = end;
    }
    flush(&mut out, run, to.len());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_equal_to_from_are_left_out() {
        let mut from = vec![1u8; 4 * BLOCK];
        from[3 * BLOCK..].fill(0);
        let mut to = from.clone();
        to[10] = 9; // block 0 changed
        to[BLOCK..2 * BLOCK].fill(0); // block 1 zeroed
        to[3 * BLOCK + 5] = 4; // block 3 written over zeros
        let r = block_records(100, &Bytes::from(to.clone()), Some(&from));
        assert_eq!(
            r,
            vec![
                Record::Data {
                    offset: 100,
                    data: Bytes::copy_from_slice(&to[..BLOCK])
                },
                Record::Zero {
                    offset: 100 + BLOCK as u64,
                    len: BLOCK as u64
                },
                Record::Data {
                    offset: 100 + 3 * BLOCK as u64,
                    data: Bytes::copy_from_slice(&to[3 * BLOCK..])
                },
            ]
        );
    }

    #[test]
    fn without_from_zero_blocks_are_skipped_and_runs_merge() {
        let mut to = vec![0u8; 5 * BLOCK + 100];
        to[BLOCK..3 * BLOCK].fill(7);
        to[5 * BLOCK + 99] = 1; // the short last block
        let to = Bytes::from(to);
        let r = block_records(0, &to, None);
        assert_eq!(
            r,
            vec![
                Record::Data {
                    offset: BLOCK as u64,
                    data: to.slice(BLOCK..3 * BLOCK)
                },
                Record::Data {
                    offset: 5 * BLOCK as u64,
                    data: to.slice(5 * BLOCK..)
                },
            ]
        );
        // FROM shorter than TO (the VDI grew): the part past FROM's end compares with zeros.
        let from = vec![7u8; 2 * BLOCK];
        let r = block_records(0, &to, Some(&from[..BLOCK + 10]));
        assert_eq!(r.len(), 3, "{r:?}");
        assert_eq!(
            r[0],
            Record::Zero {
                offset: 0,
                len: BLOCK as u64
            }
        );
        assert_eq!(
            (r[1].offset(), r[1].len()),
            (BLOCK as u64, 2 * BLOCK as u64)
        );
        assert_eq!(r[2].offset(), 5 * BLOCK as u64);
    }

    #[test]
    fn identical_objects_give_nothing() {
        let d = Bytes::from(vec![3u8; 3 * BLOCK]);
        assert!(block_records(0, &d, Some(&d)).is_empty());
        assert!(block_records(0, &Bytes::from(vec![0u8; BLOCK]), None).is_empty());
    }
}
