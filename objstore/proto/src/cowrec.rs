//! The record of a *partial* copy-on-write target (see docs/snapshots.md): a data object that
//! holds only the blocks written since it was copied, and reads the others from its source.
//!
//! The record is bytes of the object itself, at the object size (where client reads and
//! writes never reach), so every whole-object transfer (recovery, `PeerPut`, the check and
//! scrub digests) carries it unchanged:
//!
//! ```text
//! at object_size: [magic "SHEEPCOW"][format: u32 LE = 1][0u32][source object id: u64 LE]
//!                 [bitmap: one bit per 4 KiB block of the object, bit b of byte b/8 = block b present]
//! ```
//!
//! A data object whose length is at most the object size is whole (every block its own).

use crate::oid::ObjectId;

/// Bytes per block the bitmap tracks (the store's checksum block).
pub const BLOCK: u64 = 4096;
/// The first bytes of a record.
pub const MAGIC: [u8; 8] = *b"SHEEPCOW";
/// The record format written after [`MAGIC`].
pub const FORMAT: u32 = 1;
/// Bytes before the bitmap.
const HEAD: usize = 24;

/// The blocks of an object of `object_size` bytes.
pub fn blocks(object_size: u64) -> u64 {
    object_size.div_ceil(BLOCK)
}

/// The bytes a partial target holds past the object size: the record padded to one whole
/// block, so that writing it never reads a block back to sum it.
pub const RECORD_SPACE: u64 = BLOCK;

/// The length of the record of an object of `object_size` bytes.
pub fn record_len(object_size: u64) -> usize {
    HEAD + blocks(object_size).div_ceil(8) as usize
}

/// The blocks `[first, end)` that `len` bytes at `offset` touch.
pub fn touched(offset: u64, len: u64) -> (u64, u64) {
    if len == 0 {
        return (offset / BLOCK, offset / BLOCK);
    }
    (offset / BLOCK, (offset + len).div_ceil(BLOCK))
}

/// A partial target's record: its source and the blocks it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CowRecord {
    pub source: ObjectId,
    bits: Vec<u8>,
    blocks: u64,
}

impl CowRecord {
    /// A record with no block present, for an object of `object_size` bytes.
    pub fn new(source: ObjectId, object_size: u64) -> CowRecord {
        let blocks = blocks(object_size);
        CowRecord {
            source,
            bits: vec![0; blocks.div_ceil(8) as usize],
            blocks,
        }
    }

    /// Decodes the bytes at the object size of an object of `object_size` bytes: None when
    /// they are not a record (a whole object: zeros there, or nothing).
    pub fn decode(raw: &[u8], object_size: u64) -> Option<CowRecord> {
        if raw.len() < record_len(object_size) || raw[..8] != MAGIC {
            return None;
        }
        if u32::from_le_bytes(raw[8..12].try_into().ok()?) != FORMAT {
            return None;
        }
        let source = ObjectId(u64::from_le_bytes(raw[16..24].try_into().ok()?));
        let blocks = blocks(object_size);
        let bits = raw[HEAD..HEAD + blocks.div_ceil(8) as usize].to_vec();
        Some(CowRecord {
            source,
            bits,
            blocks,
        })
    }

    /// The record padded with zeros to [`RECORD_SPACE`] bytes (what the object holds).
    pub fn encode_block(&self) -> Vec<u8> {
        let mut out = self.encode();
        out.resize(RECORD_SPACE as usize, 0);
        out
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HEAD + self.bits.len());
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&FORMAT.to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes());
        out.extend_from_slice(&self.source.0.to_le_bytes());
        out.extend_from_slice(&self.bits);
        out
    }

    pub fn present(&self, block: u64) -> bool {
        block < self.blocks && self.bits[(block / 8) as usize] & (1 << (block % 8)) != 0
    }

    /// Marks blocks `[first, end)` present.
    pub fn set(&mut self, first: u64, end: u64) {
        for b in first..end.min(self.blocks) {
            self.bits[(b / 8) as usize] |= 1 << (b % 8);
        }
    }

    /// Whether every block of `[first, end)` is present.
    pub fn all_present(&self, first: u64, end: u64) -> bool {
        (first..end).all(|b| self.present(b))
    }

    /// How many blocks are present.
    pub fn count(&self) -> u64 {
        self.bits.iter().map(|b| b.count_ones() as u64).sum()
    }

    /// The runs `[first, end)` of absent blocks within `[first, end)`.
    pub fn absent_runs(&self, first: u64, end: u64) -> Vec<(u64, u64)> {
        let mut runs = Vec::new();
        let mut b = first;
        while b < end {
            if self.present(b) {
                b += 1;
                continue;
            }
            let start = b;
            while b < end && !self.present(b) {
                b += 1;
            }
            runs.push((start, b));
        }
        runs
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_and_zeros_are_no_record() {
        let os = 4 << 20;
        assert_eq!(record_len(os), 24 + 128);
        let mut r = CowRecord::new(ObjectId(0x0000_0007_0000_0003), os);
        r.set(0, 1);
        r.set(1023, 1024);
        r.set(5, 9);
        let raw = r.encode();
        assert_eq!(raw.len(), record_len(os));
        assert!(record_len(64 << 20) <= RECORD_SPACE as usize);
        let block = r.encode_block();
        assert_eq!(block.len(), RECORD_SPACE as usize);
        assert_eq!(CowRecord::decode(&block, os).as_ref(), Some(&r));
        assert_eq!(&raw[..8], b"SHEEPCOW");
        let back = CowRecord::decode(&raw, os).unwrap();
        assert_eq!(back, r);
        assert!(back.present(0) && back.present(1023) && back.present(8));
        assert!(!back.present(1) && !back.present(9) && !back.present(4096));
        assert_eq!(back.count(), 6);
        assert_eq!(back.absent_runs(0, 12), vec![(1, 5), (9, 12)]);
        assert!(back.all_present(5, 9) && !back.all_present(4, 9));
        assert_eq!(CowRecord::decode(&vec![0; record_len(os)], os), None);
        assert_eq!(CowRecord::decode(&raw[..20], os), None);
        let mut other = raw.clone();
        other[8] = 2;
        assert_eq!(CowRecord::decode(&other, os), None);
    }

    #[test]
    fn touched_blocks_cover_partial_edges() {
        assert_eq!(touched(0, 4096), (0, 1));
        assert_eq!(touched(100, 4096), (0, 2));
        assert_eq!(touched(8192, 1), (2, 3));
        assert_eq!(touched(8192, 0), (2, 2));
    }
}
