//! A VDI's inode object:
//!
//! ```text
//! 0     8    12           16    24       32      36        40      41    46        48
//! [magic][vid][object_size][size][created][parent][snapshot][copies][rsv][name_len][name ...]
//! 4096: allocation map, one big-endian u32 per object index: 0 = hole, else the vid owning it
//! ```
//!
//! `copies` says how the data objects are kept: N full copies (bit 7 clear), or an erasure
//! code `x:y` as `0x80 | (x - 1) << 3 | (y - 1)` ([`InodeHeader::redundancy`]).
//!
//! Checks (issue 25), for inodes whose flags byte (41) has [`FLAG_CHECKED`] (every VDI made
//! since): bytes 42..46 hold crc32c (big-endian) of the header up to the end of the name,
//! those four bytes counted as zeros; each map entry's top byte (a vid has 24 bits) is a check
//! byte of its index and vid ([`entry`]), so an update is still one atomic 4-byte write. Older
//! inodes have neither and still open; their entries' top byte must be 0. Every entry must
//! name the VDI itself or an ancestor (its `parent` chain). A header or entry that fails is an
//! error naming the VDI, the index and the value; it is never followed.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use objstore_proto::oid::{ObjectId, Vid, INODE_HEADER_LEN, MAX_INDEXES};
use objstore_proto::redundancy::Redundancy;

use super::VdiError;
use crate::client::{Client, ClientError};

const INODE_MAGIC: &[u8; 8] = b"SHINODE1";
/// The flags byte's bit: the header carries a checksum and map entries a check byte.
pub const FLAG_CHECKED: u8 = 1;
const FLAGS_AT: usize = 41;
const CRC_AT: usize = 42;
/// How many ancestors a VDI's map may name at most (a longer or looping chain is damage).
const MAX_ANCESTORS: usize = 256;

/// The check byte of map entry `index` holding `vid`.
fn check_byte(index: u64, vid: Vid) -> u8 {
    let mut b = [0u8; 12];
    b[..8].copy_from_slice(&index.to_be_bytes());
    b[8..].copy_from_slice(&vid.0.to_be_bytes());
    (crc_fast::crc32_iscsi(&b) >> 24) as u8
}

/// The raw value of map entry `index` holding `vid` (a hole is 0), checked or not.
pub fn entry(checked: bool, index: u64, vid: Vid) -> u32 {
    if checked && vid != Vid::NONE {
        (check_byte(index, vid) as u32) << 24 | vid.0
    } else {
        vid.0
    }
}

/// The vid map entry `index` names, from its raw value; Err(why) when it fails its check.
pub fn entry_vid(checked: bool, index: u64, raw: u32) -> Result<Vid, String> {
    let (top, vid) = ((raw >> 24) as u8, Vid(raw & 0x00ff_ffff));
    let ok = if vid == Vid::NONE {
        raw == 0
    } else if checked {
        top == check_byte(index, vid)
    } else {
        top == 0
    };
    if ok {
        Ok(vid)
    } else {
        Err(format!(
            "allocation entry {index} holds {raw:#010x}, which fails its check"
        ))
    }
}

/// The fixed part of an inode.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InodeHeader {
    pub name: String,
    pub vid: Vid,
    pub object_size: u32,
    pub size: u64,
    /// Unix seconds.
    pub created: u64,
    pub parent: u32,
    pub snapshot: u32,
    pub copies: u8,
    /// The header has a checksum and the map's entries check bytes ([`FLAG_CHECKED`]); false
    /// only for VDIs made before issue 25.
    #[serde(default)]
    pub checked: bool,
}

/// The `copies` byte of an inode whose data objects are kept as `r`.
pub fn redundancy_byte(r: Redundancy) -> u8 {
    match r {
        Redundancy::Copies(n) => n.min(0x7f) as u8,
        Redundancy::Ec { data, parity } => 0x80 | (data - 1) << 3 | (parity - 1),
    }
}

impl InodeHeader {
    /// How the VDI keeps its data objects (its `copies` byte, see the module doc).
    pub fn redundancy(&self) -> Redundancy {
        let c = self.copies;
        if c & 0x80 == 0 {
            Redundancy::Copies(c as u32)
        } else {
            Redundancy::Ec {
                data: ((c >> 3) & 0xf) + 1,
                parity: (c & 7) + 1,
            }
        }
    }

    /// The erasure code of the VDI's data objects, if they are erasure-coded.
    pub fn ec(&self) -> Option<Redundancy> {
        Some(self.redundancy()).filter(|r| r.is_ec())
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; INODE_HEADER_LEN];
        b[0..8].copy_from_slice(INODE_MAGIC);
        b[8..12].copy_from_slice(&self.vid.0.to_be_bytes());
        b[12..16].copy_from_slice(&self.object_size.to_be_bytes());
        b[16..24].copy_from_slice(&self.size.to_be_bytes());
        b[24..32].copy_from_slice(&self.created.to_be_bytes());
        b[32..36].copy_from_slice(&self.parent.to_be_bytes());
        b[36..40].copy_from_slice(&self.snapshot.to_be_bytes());
        b[40] = self.copies;
        let name = self.name.as_bytes();
        b[46..48].copy_from_slice(&(name.len() as u16).to_be_bytes());
        b[48..48 + name.len()].copy_from_slice(name);
        if self.checked {
            b[FLAGS_AT] = FLAG_CHECKED;
            let crc = crc_fast::crc32_iscsi(&b[..48 + name.len()]);
            b[CRC_AT..CRC_AT + 4].copy_from_slice(&crc.to_be_bytes());
        }
        b
    }

    pub fn decode(b: &[u8]) -> Result<InodeHeader, String> {
        if b.len() < INODE_HEADER_LEN {
            return Err(format!(
                "inode is {} bytes, shorter than its header",
                b.len()
            ));
        }
        if &b[0..8] != INODE_MAGIC {
            return Err("inode has a bad magic number".into());
        }
        let u32_at = |i: usize| u32::from_be_bytes(b[i..i + 4].try_into().unwrap());
        let u64_at = |i: usize| u64::from_be_bytes(b[i..i + 8].try_into().unwrap());
        let name_len = u16::from_be_bytes([b[46], b[47]]) as usize;
        if name_len == 0 || name_len > 255 {
            return Err(format!("inode name length {name_len} is out of range"));
        }
        let checked = b[FLAGS_AT] & FLAG_CHECKED != 0;
        if checked {
            let stored = u32_at(CRC_AT);
            let mut h = b[..48 + name_len].to_vec();
            h[CRC_AT..CRC_AT + 4].fill(0);
            let computed = crc_fast::crc32_iscsi(&h);
            if stored != computed {
                return Err(format!(
                    "inode header fails its checksum (stored {stored:#010x}, computed {computed:#010x})"
                ));
            }
        }
        let object_size = u32_at(12);
        if !object_size.is_power_of_two() {
            return Err(format!(
                "inode object size {object_size} is not a power of two"
            ));
        }
        Ok(InodeHeader {
            vid: Vid(u32_at(8)),
            object_size,
            size: u64_at(16),
            created: u64_at(24),
            parent: u32_at(32),
            snapshot: u32_at(36),
            copies: b[40],
            checked,
            name: String::from_utf8(b[48..48 + name_len].to_vec())
                .map_err(|_| "inode name is not UTF-8".to_string())?,
        })
    }

    /// Number of object indexes the VDI spans.
    pub fn indexes(&self) -> u64 {
        self.size.div_ceil(self.object_size as u64)
    }
}

/// Reads a VDI's inode: its header and allocation map, every entry checked against the
/// VDI's ancestors.
pub(crate) async fn read_inode(
    client: &Client,
    name: &str,
    vid: Vid,
) -> Result<(InodeHeader, Vec<Vid>), VdiError> {
    let (header, map) = read_entries(client, name, vid).await?;
    let corrupt = |reason: String| VdiError::Corrupt {
        name: name.to_string(),
        reason,
    };
    let allowed = lineage(client, &header).await.map_err(corrupt)?;
    for (i, v) in map.iter().enumerate() {
        if *v != Vid::NONE && !allowed.contains(v) {
            return Err(corrupt(format!(
                "allocation entry {i} names VDI id {:#x}, neither its own ({:#x}) nor an ancestor's",
                v.0, vid.0
            )));
        }
    }
    Ok((header, map))
}

/// [`read_inode`] of an inode that is no longer in the VDI table (a deleted snapshot kept
/// for others), without the ancestor check: its ancestors may be gone.
pub(crate) async fn read_inode_unchecked(
    client: &Client,
    vid: Vid,
) -> Result<(InodeHeader, Vec<Vid>), VdiError> {
    read_entries(client, &format!("(VDI id {:#x})", vid.0), vid).await
}

/// The header and the map, each entry checked on its own.
async fn read_entries(
    client: &Client,
    name: &str,
    vid: Vid,
) -> Result<(InodeHeader, Vec<Vid>), VdiError> {
    let inode = ObjectId::inode(vid);
    let corrupt = |reason: String| VdiError::Corrupt {
        name: name.to_string(),
        reason,
    };
    let head = client
        .read_obj(inode, 0, INODE_HEADER_LEN as u32)
        .await
        .map_err(|e| match e {
            ClientError::NotFound(_) => corrupt("its inode object is missing".into()),
            e => e.into(),
        })?;
    let header = InodeHeader::decode(&head).map_err(corrupt)?;
    if header.vid != vid {
        return Err(corrupt(format!(
            "its inode {inode} says it is VDI id {:#x}",
            header.vid.0
        )));
    }
    let n = header.indexes();
    if n > MAX_INDEXES {
        return Err(corrupt(format!("{n} objects is over the limit")));
    }
    let raw = if n == 0 {
        Bytes::new()
    } else {
        client
            .read_obj(inode, INODE_HEADER_LEN as u64, (n * 4) as u32)
            .await?
    };
    let map = raw
        .chunks_exact(4)
        .enumerate()
        .map(|(i, c)| {
            let raw = u32::from_be_bytes(c.try_into().unwrap());
            entry_vid(header.checked, i as u64, raw).map_err(&corrupt)
        })
        .collect::<Result<Vec<Vid>, VdiError>>()?;
    Ok((header, map))
}

/// Writes a whole inode: `header`, then `map` (one entry per index, checked as the header
/// says).
pub(crate) async fn write_inode(
    client: &Client,
    header: &InodeHeader,
    map: &[Vid],
) -> Result<(), VdiError> {
    let mut b = header.encode();
    b.reserve(map.len() * 4);
    for (i, v) in map.iter().enumerate() {
        b.extend_from_slice(&entry(header.checked, i as u64, *v).to_be_bytes());
    }
    client
        .write_obj(ObjectId::inode(header.vid), 0, Bytes::from(b))
        .await?;
    Ok(())
}

/// The vids a VDI's map may name: its own and its ancestors' (the `parent` chain).
async fn lineage(client: &Client, header: &InodeHeader) -> Result<Vec<Vid>, String> {
    let mut out = vec![header.vid];
    let mut parent = header.parent;
    while parent != 0 {
        if out.len() > MAX_ANCESTORS || out.contains(&Vid(parent)) {
            return Err(format!("its ancestors loop or run past {MAX_ANCESTORS}"));
        }
        let head = client
            .read_obj(ObjectId::inode(Vid(parent)), 0, INODE_HEADER_LEN as u32)
            .await
            .map_err(|e| format!("its parent VDI id {parent:#x} cannot be read: {e}"))?;
        let h = InodeHeader::decode(&head)
            .map_err(|e| format!("its parent VDI id {parent:#x} is damaged: {e}"))?;
        out.push(Vid(parent));
        parent = h.parent;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use objstore_proto::redundancy::{EC_DATA, EC_PARITY};

    #[test]
    fn every_redundancy_has_its_byte() {
        let mut h = InodeHeader {
            name: "disk".into(),
            vid: Vid(42),
            object_size: 4 << 20,
            size: 1 << 30,
            created: 0,
            parent: 0,
            snapshot: 0,
            copies: 3,
            checked: true,
        };
        assert_eq!((h.redundancy(), h.ec()), (Redundancy::Copies(3), None));
        for data in EC_DATA {
            for parity in EC_PARITY {
                let r = Redundancy::Ec { data, parity };
                h.copies = redundancy_byte(r);
                let back = InodeHeader::decode(&h.encode()).unwrap();
                assert_eq!((back.redundancy(), back.ec()), (r, Some(r)));
            }
        }
        assert_eq!(redundancy_byte(Redundancy::Ec { data: 4, parity: 2 }), 0x99);
    }

    #[test]
    fn inode_header_round_trip() {
        let h = InodeHeader {
            name: "disk".into(),
            vid: Vid(42),
            object_size: 4 << 20,
            size: 10 << 30,
            created: 1_700_000_000,
            parent: 0,
            snapshot: 0,
            copies: 3,
            checked: true,
        };
        let b = h.encode();
        assert_eq!(b.len(), INODE_HEADER_LEN);
        assert_eq!(&b[0..8], b"SHINODE1");
        assert_eq!(InodeHeader::decode(&b).unwrap(), h);
        assert_eq!(h.indexes(), 2560);
        let mut bad = b.clone();
        bad[0] = b'X';
        assert!(InodeHeader::decode(&bad).is_err());
        // Any flipped byte of a checked header is found.
        for at in [8, 13, 17, 30, 33, 40, 42, 48, 51] {
            let mut bad = b.clone();
            bad[at] ^= 0x04;
            let e = InodeHeader::decode(&bad).expect_err("caught");
            assert!(e.contains("checksum") || e.contains("name"), "{at}: {e}");
        }
        // An inode made before the checks (flags 0) still decodes.
        let old = InodeHeader {
            checked: false,
            ..h.clone()
        };
        let ob = old.encode();
        assert_eq!(&ob[41..46], &[0; 5]);
        assert_eq!(InodeHeader::decode(&ob).unwrap(), old);
    }

    #[test]
    fn map_entries_check_their_index_and_vid() {
        let v = Vid(0x00ab_cdef);
        for checked in [true, false] {
            assert_eq!(entry(checked, 5, Vid::NONE), 0);
            assert_eq!(entry_vid(checked, 5, 0), Ok(Vid::NONE));
            let raw = entry(checked, 5, v);
            assert_eq!(entry_vid(checked, 5, raw), Ok(v));
        }
        let raw = entry(true, 5, v);
        assert_ne!(raw >> 24, 0);
        // The same value at another index, or with a flipped bit, fails its check (the check
        // byte is 8 bits: a flip survives it 1 time in 256, and then names a vid that is
        // neither the VDI's nor an ancestor's, caught by read_inode).
        assert!(entry_vid(true, 6, raw).is_err());
        let caught = (0..32)
            .filter(|b| entry_vid(true, 5, raw ^ (1 << b)).is_err())
            .count();
        assert!(caught >= 31, "{caught}");
        // Old inodes: the top byte must be 0; a hole must be all zeros.
        assert!(entry_vid(false, 5, 0x0100_0000 | v.0).is_err());
        assert!(entry_vid(true, 5, 0x0100_0000).is_err());
        let e = entry_vid(true, 9, 0x1234_5678).unwrap_err();
        assert!(e.contains("entry 9") && e.contains("0x12345678"), "{e}");
    }
}
