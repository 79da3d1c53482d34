//! A file store's index entry: what the store knows of one object ([`Entry`]), and the same
//! packed as the index keeps it ([`Packed`]).

use super::{ObjState, Version};

/// What the store knows of one object.
#[derive(Debug, Clone, Copy)]
pub(super) struct Entry {
    /// The current state (the version of the last write, durable or not).
    pub(super) state: ObjState,
    /// The version in the file's name; [`Version::NONE`] for a data object created since the
    /// last flush (`<oid>.0.n`), of which nothing is durable yet.
    pub(super) disk: Version,
    /// The file's name carries the "being written" marker.
    pub(super) marked: bool,
    /// The object's length in bytes, once known (None: not looked up since the store opened).
    pub(super) len: Option<u64>,
}

/// An [`Entry`] as the index keeps it: 24 bytes instead of 48 (the issue-43 goal of under 64
/// bytes of index per object, key and hash table included; bench `scale/index`).
#[derive(Debug, Clone, Copy)]
pub(super) struct Packed {
    version: u64,
    disk: u64,
    /// The length in the low [`LEN_BITS`] bits ([`LEN_UNKNOWN`]: not known), the flags above:
    /// deleted, suspect, lost, marked.
    len_flags: u64,
}

const LEN_BITS: u32 = 56;
/// A length not known. A length this large or larger (never an object's) is kept as unknown:
/// the store looks it up again.
const LEN_UNKNOWN: u64 = (1 << LEN_BITS) - 1;

impl From<Entry> for Packed {
    fn from(e: Entry) -> Packed {
        let bit = |b: bool, n: u32| u64::from(b) << (LEN_BITS + n);
        Packed {
            version: e.state.version.0,
            disk: e.disk.0,
            len_flags: e.len.unwrap_or(LEN_UNKNOWN).min(LEN_UNKNOWN)
                | bit(e.state.deleted, 0)
                | bit(e.state.suspect, 1)
                | bit(e.state.lost, 2)
                | bit(e.marked, 3),
        }
    }
}

impl Packed {
    fn flag(&self, n: u32) -> bool {
        self.len_flags >> (LEN_BITS + n) & 1 != 0
    }

    pub(super) fn state(&self) -> ObjState {
        ObjState {
            version: Version(self.version),
            deleted: self.flag(0),
            suspect: self.flag(1),
            lost: self.flag(2),
        }
    }

    pub(super) fn unpack(&self) -> Entry {
        let len = self.len_flags & LEN_UNKNOWN;
        Entry {
            state: self.state(),
            disk: Version(self.disk),
            marked: self.flag(3),
            len: (len != LEN_UNKNOWN).then_some(len),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use objstore_proto::oid::ObjectId;

    /// With its key, an entry takes 32 bytes of the index's hash table (48 unpacked, 56 with
    /// the key): with the table's control byte and free slots, under 64 bytes an object
    /// (`crate::store::tests::index_under_64_bytes_an_object_at_every_count`).
    #[test]
    fn packed_is_small_and_unpacks_to_what_was_packed() {
        assert_eq!(std::mem::size_of::<(ObjectId, Packed)>(), 32);
        for bits in 0..16u8 {
            for len in [None, Some(0), Some(4 << 20), Some(LEN_UNKNOWN - 1)] {
                let e = Entry {
                    state: ObjState {
                        version: Version(7 << 32 | 9),
                        deleted: bits & 1 != 0,
                        suspect: bits & 2 != 0,
                        lost: bits & 4 != 0,
                    },
                    disk: Version(3),
                    marked: bits & 8 != 0,
                    len,
                };
                let u = Packed::from(e).unpack();
                assert_eq!(
                    (u.state, u.disk, u.marked, u.len),
                    (e.state, e.disk, e.marked, e.len)
                );
            }
        }
    }
}
