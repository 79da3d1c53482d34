//! Object ids: the 64-bit name of every object in the cluster.
//!
//! ```text
//!  63  62..61  60..56    55..32          31..0
//! [ I |  00   | strip  | vid (24 bits) | index (32 bits) ]
//! ```
//! `I` marks a VDI's inode object (its index bits are zero); otherwise the id names data object
//! `index` of VDI `vid`. `strip` is 0 in every id a client names; a node stores strip `k` of an
//! erasure-coded data object under the object's id with `k + 1` there ([`ObjectId::strip`]), so
//! one node can hold two strips of one object while they move.

use std::fmt;

use serde::{Deserialize, Serialize};

/// Bit 63: the object is a VDI inode.
pub const INODE_BIT: u64 = 1 << 63;
/// Largest VDI id (24 bits).
pub const MAX_VID: u32 = (1 << 24) - 1;
const VID_SHIFT: u32 = 32;
const STRIP_SHIFT: u32 = 56;
const STRIP_MASK: u64 = 0x1f << STRIP_SHIFT;
/// Most strips an erasure-coded object has (16 data and 8 parity).
pub const MAX_STRIPS: usize = 24;
/// Bytes of an inode object before its allocation map.
pub const INODE_HEADER_LEN: usize = 4096;
/// Most data objects one VDI can have (its allocation map has one u32 per index).
pub const MAX_INDEXES: u64 = 1 << 24;
/// Largest inode object: the header and a full allocation map.
pub const MAX_INODE_LEN: u64 = INODE_HEADER_LEN as u64 + 4 * MAX_INDEXES;

/// A VDI id (24 bits; 0 is no VDI: a hole in an allocation map). Never reused.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Vid(pub u32);

impl Vid {
    /// No VDI (an allocation map's hole).
    pub const NONE: Vid = Vid(0);

    pub fn is_none(self) -> bool {
        self.0 == 0
    }
}

impl fmt::Display for Vid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::LowerHex for Vid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::LowerHex::fmt(&self.0, f)
    }
}

impl fmt::Debug for Vid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Vid({})", self.0)
    }
}

/// The index of a data object inside its VDI (object `i` holds bytes `i * object_size ..`).
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ObjIndex(pub u32);

impl ObjIndex {
    /// The index as a position (for arithmetic with sizes).
    pub fn get(self) -> u64 {
        self.0 as u64
    }
}

impl fmt::Display for ObjIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

impl fmt::Debug for ObjIndex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ObjIndex({})", self.0)
    }
}

/// A 64-bit object id (see the module doc for its layout).
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ObjectId(pub u64);

impl ObjectId {
    /// Data object `index` of VDI `vid`.
    pub fn data(vid: Vid, index: ObjIndex) -> Self {
        debug_assert!(vid.0 <= MAX_VID);
        ObjectId(((vid.0 as u64) << VID_SHIFT) | index.0 as u64)
    }

    /// The inode object of VDI `vid`.
    pub fn inode(vid: Vid) -> Self {
        debug_assert!(vid.0 <= MAX_VID);
        ObjectId(INODE_BIT | ((vid.0 as u64) << VID_SHIFT))
    }

    pub fn is_inode(self) -> bool {
        self.0 & INODE_BIT != 0
    }

    pub fn vid(self) -> Vid {
        Vid(((self.0 >> VID_SHIFT) as u32) & MAX_VID)
    }

    pub fn index(self) -> ObjIndex {
        ObjIndex(self.0 as u32)
    }

    /// The key strip `k` of this erasure-coded data object is stored under.
    pub fn strip(self, k: usize) -> ObjectId {
        debug_assert!(k < MAX_STRIPS && !self.is_inode());
        ObjectId((self.0 & !STRIP_MASK) | ((k as u64 + 1) << STRIP_SHIFT))
    }

    /// Which strip this key stores, if it is a strip's key.
    pub fn strip_index(self) -> Option<usize> {
        match (self.0 & STRIP_MASK) >> STRIP_SHIFT {
            0 => None,
            k => Some(k as usize - 1),
        }
    }

    /// The object a strip key belongs to (itself for any other id): where it is placed.
    pub fn base(self) -> ObjectId {
        ObjectId(self.0 & !STRIP_MASK)
    }
}

impl fmt::Display for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

impl fmt::Debug for ObjectId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ObjectId({:016x})", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout() {
        let d = ObjectId::data(Vid(0xabcdef), ObjIndex(7));
        assert_eq!(d.0, 0x00ab_cdef_0000_0007);
        assert!(!d.is_inode());
        assert_eq!((d.vid(), d.index()), (Vid(0xabcdef), ObjIndex(7)));
        let i = ObjectId::inode(Vid(0xabcdef));
        assert_eq!(i.0, 0x80ab_cdef_0000_0000);
        assert!(i.is_inode());
        assert_eq!(i.vid(), Vid(0xabcdef));
        assert_eq!(serde_json::to_string(&Vid(7)).unwrap(), "7");
        assert_eq!(i.to_string(), "80abcdef00000000");
    }

    #[test]
    fn strip_keys_keep_the_object_and_name_the_strip() {
        let d = ObjectId::data(Vid(0xabcdef), ObjIndex(7));
        assert_eq!(d.strip_index(), None);
        assert_eq!(d.base(), d);
        assert_eq!(d.strip(0).0, 0x01ab_cdef_0000_0007);
        for k in 0..MAX_STRIPS {
            let s = d.strip(k);
            assert_eq!((s.strip_index(), s.base()), (Some(k), d));
            assert_eq!(
                (s.vid(), s.index(), s.is_inode()),
                (d.vid(), d.index(), false)
            );
            assert_eq!(s.strip(3), d.strip(3));
        }
    }
}
