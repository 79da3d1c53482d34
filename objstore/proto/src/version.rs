//! Object versions: which copy of an object is current.
//!
//! Every change of an object (a write, a discard, a delete) gets a version that only grows,
//! assigned by the object's primary replica of the epoch (the first owner on the ring) and
//! stored with the object on every replica. A version is `epoch << 32 | seq`: the first change
//! in an epoch starts at `seq` 1, later ones count up. One primary per object and epoch, so one
//! version never names two different contents. A delete leaves a tombstone at its version, so
//! an older copy on a node that was away never comes back.
//!
//! On the wire a version travels in a response header's `offset` field and a state's flags in
//! `aux` (see docs/wire.md); [`encode_list`]/[`decode_list`] are the `PeerList` entries.

use std::fmt;

use bytes::{BufMut, Bytes, BytesMut};
use serde::{Deserialize, Serialize};

use crate::oid::ObjectId;

/// An object's version (see the module documentation). 0: no version (the object never
/// existed here).
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Version(pub u64);

impl Version {
    pub const NONE: Version = Version(0);

    /// The epoch in which this version was made.
    pub fn epoch(self) -> u32 {
        (self.0 >> 32) as u32
    }

    /// The version of the next change made in `epoch` after this one.
    pub fn next(self, epoch: u32) -> Version {
        if self.epoch() < epoch {
            Version(((epoch as u64) << 32) | 1)
        } else {
            Version(self.0 + 1)
        }
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.epoch(), self.0 & 0xffff_ffff)
    }
}

impl fmt::Debug for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{self}")
    }
}

/// Flag bit in `aux`: the object is deleted at this version (a tombstone).
pub const FLAG_DELETED: u32 = 1;
/// Flag bit in `aux`: the copy was being written when its node stopped, so its bytes may hold
/// a change newer than its version (see [`ObjState::suspect`]).
pub const FLAG_SUSPECT: u32 = 2;
/// Flag bit in `aux` (listings only): the node lost this copy's data at this version with a
/// failed `fdatasync` and has not restored it (see [`ObjState::lost`]).
pub const FLAG_LOST: u32 = 4;

/// What a node holds of one object: its version, whether that version is a delete, and
/// whether the copy's bytes may be newer than its version.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ObjState {
    pub version: Version,
    pub deleted: bool,
    /// The node stopped (killed, crashed) while this copy had writes not yet flushed: the
    /// version is the last one flushed, the bytes may hold later writes, among them one that
    /// other replicas never applied. Recovery makes every replica take one reference copy
    /// before any of them serves it.
    #[serde(default)]
    pub suspect: bool,
    /// Listings only: the node's copy lost the data of `version` with a failed `fdatasync`
    /// and is not restored yet. Its bytes are nobody's reference: it is never a source, and it
    /// never makes another node give up its own copy; it only says that `version` existed.
    #[serde(default)]
    pub lost: bool,
}

impl ObjState {
    pub fn live(version: Version) -> ObjState {
        ObjState {
            version,
            deleted: false,
            suspect: false,
            lost: false,
        }
    }

    pub fn tombstone(version: Version) -> ObjState {
        ObjState {
            version,
            deleted: true,
            suspect: false,
            lost: false,
        }
    }

    /// The flags word carried in `aux`.
    pub fn flags(self) -> u32 {
        let mut f = 0;
        if self.deleted {
            f |= FLAG_DELETED;
        }
        if self.suspect {
            f |= FLAG_SUSPECT;
        }
        if self.lost {
            f |= FLAG_LOST;
        }
        f
    }

    pub fn from_wire(version: u64, flags: u32) -> ObjState {
        ObjState {
            version: Version(version),
            deleted: flags & FLAG_DELETED != 0,
            suspect: flags & FLAG_SUSPECT != 0,
            lost: flags & FLAG_LOST != 0,
        }
    }

    /// Whether a copy at `self` must be replaced by one at `other` (recovery, a primary's
    /// push): `other` is newer, or as new while this copy is suspect and `other` is not.
    pub fn replaced_by(self, other: ObjState) -> bool {
        other.version > self.version
            || (other.version == self.version && self.suspect && !other.suspect)
    }
}

/// What a `PeerList` asks for, as its payload (an empty payload asks for every object at once):
/// part `part` of `parts` of the node's objects that node `owner` holds in the request's epoch
/// with `copies` copies, and the objects in `extra` wherever they fall in the ring (the asker's
/// own copies that it lost and no longer owns: it must learn who holds them). The objects of a
/// part are those whose index shard falls in that part (see the node's store), so the `parts`
/// answers together list each object once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListRequest {
    pub owner: u64,
    pub copies: u32,
    pub part: u32,
    pub parts: u32,
    pub extra: Vec<ObjectId>,
}

impl ListRequest {
    /// owner (8), copies (4), part (4), parts (4), count of `extra` (4), then each (8).
    pub fn encode(&self) -> Bytes {
        let mut b = BytesMut::with_capacity(24 + 8 * self.extra.len());
        b.put_u64(self.owner);
        b.put_u32(self.copies);
        b.put_u32(self.part);
        b.put_u32(self.parts);
        b.put_u32(self.extra.len() as u32);
        for oid in &self.extra {
            b.put_u64(oid.0);
        }
        b.freeze()
    }

    /// None if `b` is not such a request (a wrong length, `part` not below `parts`, or
    /// `parts` 0).
    pub fn decode(b: &[u8]) -> Option<ListRequest> {
        let u32_at = |i: usize| u32::from_be_bytes(b[i..i + 4].try_into().unwrap());
        if b.len() < 24 {
            return None;
        }
        let n = u32_at(20) as usize;
        if b.len() != 24 + 8 * n {
            return None;
        }
        let r = ListRequest {
            owner: u64::from_be_bytes(b[..8].try_into().unwrap()),
            copies: u32_at(8),
            part: u32_at(12),
            parts: u32_at(16),
            extra: b[24..]
                .chunks_exact(8)
                .map(|c| ObjectId(u64::from_be_bytes(c.try_into().unwrap())))
                .collect(),
        };
        (r.parts > 0 && r.part < r.parts).then_some(r)
    }
}

/// Bytes of one `PeerList` entry: oid (8), version (8), flags (1).
pub const LIST_ENTRY: usize = 17;

/// Encodes a `PeerList` response.
pub fn encode_list(list: &[(ObjectId, ObjState)]) -> Bytes {
    let mut b = BytesMut::with_capacity(list.len() * LIST_ENTRY);
    for (oid, st) in list {
        b.put_u64(oid.0);
        b.put_u64(st.version.0);
        b.put_u8(st.flags() as u8);
    }
    b.freeze()
}

/// Decodes a `PeerList` response; None if its length is not a whole number of entries.
pub fn decode_list(b: &[u8]) -> Option<Vec<(ObjectId, ObjState)>> {
    if !b.len().is_multiple_of(LIST_ENTRY) {
        return None;
    }
    Some(
        b.chunks_exact(LIST_ENTRY)
            .map(|c| {
                (
                    ObjectId(u64::from_be_bytes(c[..8].try_into().unwrap())),
                    ObjState::from_wire(
                        u64::from_be_bytes(c[8..16].try_into().unwrap()),
                        c[16] as u32,
                    ),
                )
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_request_round_trip() {
        let r = ListRequest {
            owner: 7,
            copies: 3,
            part: 2,
            parts: 16,
            extra: vec![ObjectId(5), ObjectId(u64::MAX)],
        };
        assert_eq!(ListRequest::decode(&r.encode()), Some(r.clone()));
        let e = r.encode();
        assert_eq!(ListRequest::decode(&e[..e.len() - 1]), None);
        assert_eq!(ListRequest::decode(&[]), None);
        let bad = ListRequest { part: 16, ..r };
        assert_eq!(ListRequest::decode(&bad.encode()), None);
    }

    #[test]
    fn versions_grow_within_and_across_epochs() {
        let v = Version::NONE.next(3);
        assert_eq!((v.epoch(), v.0 & 0xffff_ffff), (3, 1));
        let w = v.next(3);
        assert!(w > v);
        assert_eq!(w.to_string(), "3.2");
        let x = w.next(7);
        assert!(x > w);
        assert_eq!(x.to_string(), "7.1");
        // A version from a later epoch than the caller's still grows.
        assert!(x.next(5) > x);
    }

    #[test]
    fn list_round_trip_and_bad_length() {
        let list = vec![
            (ObjectId(1), ObjState::live(Version(5))),
            (ObjectId(u64::MAX), ObjState::tombstone(Version(u64::MAX))),
            (
                ObjectId(3),
                ObjState {
                    suspect: true,
                    ..ObjState::live(Version(9))
                },
            ),
            (
                ObjectId(4),
                ObjState {
                    lost: true,
                    ..ObjState::live(Version(10))
                },
            ),
        ];
        let b = encode_list(&list);
        assert_eq!(b.len(), 4 * LIST_ENTRY);
        assert_eq!(decode_list(&b).unwrap(), list);
        assert!(decode_list(&b[..20]).is_none());
    }
}
