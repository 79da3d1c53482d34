//! Block checksums, shared by the file and memory backends.
//!
//! An object is checked in [`BLOCK`]-byte blocks (4 KiB: the guest's I/O size, so an aligned
//! write never reads anything back). Each block has one `u32`: crc32c of the block, bytes past
//! the object's end counted as zeros, XORed with crc32c of a zero block, so a block never
//! written (a hole, all zeros) has the sum 0 and needs no table entry written. crc32c because
//! the damage looked for is random (a flipped bit, a torn or misdirected write): it catches
//! every burst up to 32 bits and runs at many GB/s (`crc-fast` folds with carry-less multiply,
//! VPCLMULQDQ/AVX-512 where the CPU has it); a forged block is the authentication layer's
//! business, not the store's.
//!
//! The file layout (see docs/integrity.md): a header region of [`HEADER_LEN`] bytes at the
//! start of every object file — [`MAGIC`], the format version (u32 little-endian), then from
//! [`TABLE_AT`] one little-endian u32 per block, room for the largest object
//! ([`MAX_INODE_LEN`]) — and the object's bytes from [`HEADER_LEN`] on, so the file's length
//! still gives the object's length.

use std::sync::OnceLock;

use objstore_proto::oid::MAX_INODE_LEN;

/// Bytes per checked block.
pub const BLOCK: usize = 4096;
/// The first bytes of every object file of this format.
pub const MAGIC: [u8; 8] = *b"SHEEPOBJ";
/// The format version written after [`MAGIC`].
pub const FORMAT: u32 = 1;
/// Where the table of block sums starts in a file.
pub const TABLE_AT: u64 = 64;
/// Blocks a table has room for: the largest object, an inode of [`MAX_INODE_LEN`] bytes.
pub const MAX_BLOCKS: u64 = MAX_INODE_LEN.div_ceil(BLOCK as u64);
/// Where an object's bytes start in its file: past the table, 4 KiB-aligned.
pub const HEADER_LEN: u64 = (TABLE_AT + 4 * MAX_BLOCKS).next_multiple_of(BLOCK as u64);
// Tests read copies past it (`testkit::replicas::OBJECT_HEADER_LEN`): change both together.
const _: () = assert!(HEADER_LEN == 69632);

const ZEROS: [u8; BLOCK] = [0; BLOCK];

fn zero_sum() -> u32 {
    static Z: OnceLock<u32> = OnceLock::new();
    *Z.get_or_init(|| crc_fast::crc32_iscsi(&ZEROS))
}

/// The stored sum of one block given its bytes (at most [`BLOCK`]; the rest counts as zeros).
pub fn sum(block: &[u8]) -> u32 {
    debug_assert!(block.len() <= BLOCK);
    let c = if block.len() < BLOCK {
        // Only an object's last block can be short (an inode's): padded here.
        let mut full = [0u8; BLOCK];
        full[..block.len()].copy_from_slice(block);
        crc_fast::crc32_iscsi(&full)
    } else {
        crc_fast::crc32_iscsi(block)
    };
    c ^ zero_sum()
}

/// The blocks `[first, end)` that the byte range `offset..offset+len` touches.
pub fn blocks(offset: u64, len: usize) -> (u64, u64) {
    let first = offset / BLOCK as u64;
    let end = (offset + len as u64).div_ceil(BLOCK as u64);
    (first, end.max(first))
}

/// Whether a write of `len` bytes at `offset` covers whole blocks only, so that the sums of its
/// bytes alone ([`sums_of`]) are the sums its blocks get: such a write's primary sends them with
/// it and the replicas keep them as given (see [`given`]).
pub fn whole_blocks(offset: u64, len: usize) -> bool {
    len > 0 && offset.is_multiple_of(BLOCK as u64) && len.is_multiple_of(BLOCK)
}

/// `sums` if they can be the sums of a write of `len` bytes at `offset`: it covers whole
/// blocks and there is one sum a block. Anything else is None: the store sums the bytes itself.
pub fn given(offset: u64, len: usize, sums: Option<&[u32]>) -> Option<&[u32]> {
    sums.filter(|s| whole_blocks(offset, len) && s.len() == len / BLOCK)
}

/// The sums of the consecutive blocks of `data`, whose first byte starts block `first`:
/// the object's bytes from `first * BLOCK` on (the last block may be short).
pub fn sums_of(data: &[u8]) -> Vec<u32> {
    data.chunks(BLOCK).map(sum).collect()
}

/// The first block of `data` (starting at block `first`) whose sum is not the one in
/// `table` (`table[i]` for block `first + i`; a block with no entry must be zeros).
pub fn first_bad(first: u64, data: &[u8], table: &[u32]) -> Option<u64> {
    for (i, b) in data.chunks(BLOCK).enumerate() {
        let want = table.get(i).copied().unwrap_or(0);
        if sum(b) != want {
            return Some(first + i as u64);
        }
    }
    // Blocks past the data read as zeros: their sums must be 0.
    let n = data.len().div_ceil(BLOCK);
    table
        .iter()
        .enumerate()
        .skip(n)
        .find(|(_, s)| **s != 0)
        .map(|(i, _)| first + i as u64)
}

/// The table bytes for `sums`.
pub fn encode(sums: &[u32]) -> Vec<u8> {
    sums.iter().flat_map(|s| s.to_le_bytes()).collect()
}

/// The sums in table bytes.
pub fn decode(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// The header's first bytes: magic and format version.
pub fn header() -> [u8; 12] {
    let mut h = [0u8; 12];
    h[..8].copy_from_slice(&MAGIC);
    h[8..].copy_from_slice(&FORMAT.to_le_bytes());
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sum_is_crc32c() {
        // The check value of CRC-32C (Castagnoli): the file format depends on it.
        assert_eq!(crc_fast::crc32_iscsi(b"123456789"), 0xe306_9283);
        let mut b = [0u8; BLOCK];
        b[..9].copy_from_slice(b"123456789");
        assert_eq!(sum(b"123456789"), crc_fast::crc32_iscsi(&b) ^ zero_sum());
    }

    #[test]
    fn a_hole_sums_to_zero_and_short_blocks_count_as_zero_padded() {
        assert_eq!(sum(&ZEROS), 0);
        assert_eq!(sum(&[]), 0);
        assert_eq!(sum(&[0; 100]), 0);
        let mut b = vec![0u8; BLOCK];
        b[..3].copy_from_slice(b"abc");
        assert_eq!(sum(b"abc"), sum(&b));
        assert_ne!(sum(b"abc"), 0);
    }

    #[test]
    fn a_flipped_bit_is_found_in_its_block() {
        let mut d = vec![7u8; 3 * BLOCK + 10];
        let t = sums_of(&d);
        assert_eq!(first_bad(5, &d, &t), None);
        d[2 * BLOCK + 1] ^= 1;
        assert_eq!(first_bad(5, &d, &t), Some(7));
        // A table entry for a block past the data must be 0.
        let d = vec![7u8; BLOCK];
        assert_eq!(first_bad(0, &d, &[sum(&d), 1]), Some(1));
    }

    #[test]
    fn the_header_fits_the_largest_object_and_data_starts_aligned() {
        const { assert!(TABLE_AT + 4 * MAX_BLOCKS <= HEADER_LEN) };
        const { assert!(HEADER_LEN.is_multiple_of(BLOCK as u64)) };
        assert_eq!(HEADER_LEN, 69632);
        assert_eq!(blocks(0, 0), (0, 0));
        assert_eq!(blocks(4095, 2), (0, 2));
        assert_eq!(blocks(4096, 4096), (1, 2));
    }

    #[test]
    fn only_sums_of_whole_blocks_one_a_block_are_taken_as_given() {
        let s = [1u32, 2];
        assert!(whole_blocks(0, 2 * BLOCK) && whole_blocks(BLOCK as u64, BLOCK));
        assert!(!whole_blocks(0, 0) && !whole_blocks(512, BLOCK) && !whole_blocks(0, 100));
        assert_eq!(given(0, 2 * BLOCK, Some(&s)), Some(&s[..]));
        assert_eq!(given(0, 3 * BLOCK, Some(&s)), None);
        assert_eq!(given(512, 2 * BLOCK, Some(&s)), None);
        assert_eq!(given(0, 2 * BLOCK, None), None);
    }
}
