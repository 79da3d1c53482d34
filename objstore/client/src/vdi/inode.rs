//! A VDI's inode object:
//!
//! ```text
//! 0     8    12           16    24       32      36        40      41    46        48
//! [magic][vid][object_size][size][created][parent][snapshot][copies][rsv][name_len][name ...]
//! 4096: allocation map, one big-endian u32 per object index: 0 = hole, else the vid owning it
//! ```

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use objstore_proto::oid::{ObjectId, INODE_HEADER_LEN, MAX_INDEXES};

use super::VdiError;
use crate::client::{Client, ClientError};

const INODE_MAGIC: &[u8; 8] = b"SHINODE1";

/// The fixed part of an inode.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InodeHeader {
    pub name: String,
    pub vid: u32,
    pub object_size: u32,
    pub size: u64,
    /// Unix seconds.
    pub created: u64,
    pub parent: u32,
    pub snapshot: u32,
    pub copies: u8,
}

impl InodeHeader {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; INODE_HEADER_LEN];
        b[0..8].copy_from_slice(INODE_MAGIC);
        b[8..12].copy_from_slice(&self.vid.to_be_bytes());
        b[12..16].copy_from_slice(&self.object_size.to_be_bytes());
        b[16..24].copy_from_slice(&self.size.to_be_bytes());
        b[24..32].copy_from_slice(&self.created.to_be_bytes());
        b[32..36].copy_from_slice(&self.parent.to_be_bytes());
        b[36..40].copy_from_slice(&self.snapshot.to_be_bytes());
        b[40] = self.copies;
        let name = self.name.as_bytes();
        b[46..48].copy_from_slice(&(name.len() as u16).to_be_bytes());
        b[48..48 + name.len()].copy_from_slice(name);
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
        let object_size = u32_at(12);
        if !object_size.is_power_of_two() {
            return Err(format!(
                "inode object size {object_size} is not a power of two"
            ));
        }
        Ok(InodeHeader {
            vid: u32_at(8),
            object_size,
            size: u64_at(16),
            created: u64_at(24),
            parent: u32_at(32),
            snapshot: u32_at(36),
            copies: b[40],
            name: String::from_utf8(b[48..48 + name_len].to_vec())
                .map_err(|_| "inode name is not UTF-8".to_string())?,
        })
    }

    /// Number of object indexes the VDI spans.
    pub fn indexes(&self) -> u64 {
        self.size.div_ceil(self.object_size as u64)
    }
}

/// Reads a VDI's inode: its header and allocation map.
pub(crate) async fn read_inode(
    client: &Client,
    name: &str,
    vid: u32,
) -> Result<(InodeHeader, Vec<u32>), VdiError> {
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
        .map(|c| u32::from_be_bytes(c.try_into().unwrap()))
        .collect();
    Ok((header, map))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inode_header_round_trip() {
        let h = InodeHeader {
            name: "disk".into(),
            vid: 42,
            object_size: 4 << 20,
            size: 10 << 30,
            created: 1_700_000_000,
            parent: 0,
            snapshot: 0,
            copies: 3,
        };
        let b = h.encode();
        assert_eq!(b.len(), INODE_HEADER_LEN);
        assert_eq!(&b[0..8], b"SHINODE1");
        assert_eq!(InodeHeader::decode(&b).unwrap(), h);
        assert_eq!(h.indexes(), 2560);
        let mut bad = b.clone();
        bad[0] = b'X';
        assert!(InodeHeader::decode(&bad).is_err());
    }
}
