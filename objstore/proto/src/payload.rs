//! The binary payload prefixes of the requests that change an object (see docs/wire.md):
//!
//! ```text
//! WriteObj, RemoveObj:  [expected version: u64 BE][data ...]
//! CowWrite:             [expected version: u64 BE][source object id: u64 BE][data ...]
//! PeerWrite:            [base version: u64 BE][new version: u64 BE][aux × block sum: u32 BE][data ...]
//! PeerCow:              [as PeerWrite's prefix][source object id: u64 BE, 0: none][data ...]
//! FlattenObj:           [expected version: u64 BE][source object id: u64 BE]
//! ```
//!
//! The encoders are what clients and primaries send; the decoders are what a node reads, and
//! they refuse (None) a payload too short for its prefix.

use bytes::{BufMut, Bytes, BytesMut};

use crate::oid::ObjectId;
use crate::version::Version;

/// The prefix of a `WriteObj` or `RemoveObj` payload: the version the client last saw.
pub fn expected_prefix(expected: Version) -> Bytes {
    Bytes::copy_from_slice(&expected.0.to_be_bytes())
}

/// The version a client expects an object at, and the rest of the payload.
pub fn split_expected(payload: &Bytes) -> Option<(Version, Bytes)> {
    let v = u64::from_be_bytes(payload.get(..8)?.try_into().ok()?);
    Some((Version(v), payload.slice(8..)))
}

/// The prefix of a `CowWrite` payload: the version the client last saw the target at, and
/// the object the target is copied from.
pub fn cow_prefix(expected: Version, source: ObjectId) -> Bytes {
    let mut b = BytesMut::with_capacity(16);
    b.put_u64(expected.0);
    b.put_u64(source.0);
    b.freeze()
}

/// The expected version and source object at the head of a `CowWrite` payload, and the data
/// after them.
pub fn split_cow(payload: &Bytes) -> Option<(Version, ObjectId, Bytes)> {
    let expected = u64::from_be_bytes(payload.get(..8)?.try_into().ok()?);
    let source = u64::from_be_bytes(payload.get(8..16)?.try_into().ok()?);
    Some((Version(expected), ObjectId(source), payload.slice(16..)))
}

/// Why `source` cannot be the object a copy-on-write of `target` copies, if it cannot: both
/// must be data objects of the same index in different VDIs (an ancestor's object and the
/// VDI's own).
pub fn cow_source_error(target: ObjectId, source: ObjectId) -> Option<String> {
    let why = if source == target {
        "is the target itself"
    } else if source.is_inode() || target.is_inode() {
        "and its target must both be data objects"
    } else if source.index() != target.index() {
        "has another index than the target"
    } else if source.vid() == target.vid() {
        "belongs to the target's own VDI"
    } else {
        return None;
    };
    Some(format!(
        "source object {source} of copy-on-write to {target} {why}"
    ))
}

/// The prefix of a `PeerWrite` payload: the version the write applies to, the one it makes,
/// and the sums of the data's blocks as the primary computed them (none for a write that does
/// not cover whole blocks; the header's `aux` says how many).
pub fn peer_write_prefix(base: Version, new: Version, sums: &[u32]) -> Bytes {
    let mut b = BytesMut::with_capacity(16 + 4 * sums.len());
    b.put_u64(base.0);
    b.put_u64(new.0);
    for s in sums {
        b.put_u32(*s);
    }
    b.freeze()
}

/// The base and new versions at the head of a `PeerWrite` payload, the `sums` block sums after
/// them (the header's `aux`), and the data after those.
pub fn split_peer_write(payload: &Bytes, sums: u32) -> Option<(Version, Version, Vec<u32>, Bytes)> {
    let base = u64::from_be_bytes(payload.get(..8)?.try_into().ok()?);
    let new = u64::from_be_bytes(payload.get(8..16)?.try_into().ok()?);
    let end = 16usize.checked_add(usize::try_from(sums).ok()?.checked_mul(4)?)?;
    let table = payload
        .get(16..end)?
        .chunks_exact(4)
        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    Some((Version(base), Version(new), table, payload.slice(end..)))
}

/// The prefix of a `PeerCow` payload: a `PeerWrite` prefix, then the source of a partial
/// target the change creates ([`ObjectId`] 0: it fills blocks of an existing one).
pub fn peer_cow_prefix(
    base: Version,
    new: Version,
    sums: &[u32],
    source: Option<ObjectId>,
) -> Bytes {
    let mut b = BytesMut::from(&peer_write_prefix(base, new, sums)[..]);
    b.put_u64(source.map_or(0, |s| s.0));
    b.freeze()
}

/// The parts of a `PeerCow` payload (see [`peer_cow_prefix`]).
#[allow(clippy::type_complexity)]
pub fn split_peer_cow(
    payload: &Bytes,
    sums: u32,
) -> Option<(Version, Version, Vec<u32>, Option<ObjectId>, Bytes)> {
    let (base, new, table, rest) = split_peer_write(payload, sums)?;
    let source = u64::from_be_bytes(rest.get(..8)?.try_into().ok()?);
    let source = (source != 0).then_some(ObjectId(source));
    Some((base, new, table, source, rest.slice(8..)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::oid::{ObjIndex, Vid};

    #[test]
    fn prefixes_round_trip_and_short_payloads_are_refused() {
        let mut p = expected_prefix(Version(0x0102_0304_0506_0708)).to_vec();
        assert_eq!(p, [1, 2, 3, 4, 5, 6, 7, 8]);
        p.extend_from_slice(b"data");
        let (v, rest) = split_expected(&Bytes::from(p)).unwrap();
        assert_eq!(
            (v, &rest[..]),
            (Version(0x0102_0304_0506_0708), &b"data"[..])
        );
        assert_eq!(split_expected(&Bytes::from_static(&[0; 7])), None);

        let mut p = peer_write_prefix(Version(5), Version(6), &[]).to_vec();
        p.push(9);
        let (b, n, sums, rest) = split_peer_write(&Bytes::from(p), 0).unwrap();
        assert_eq!((b, n, &rest[..]), (Version(5), Version(6), &[9u8][..]));
        assert!(sums.is_empty());
        assert_eq!(split_peer_write(&Bytes::from_static(&[0; 15]), 0), None);

        let mut p = peer_write_prefix(Version(5), Version(6), &[0x0102_0304, 7]).to_vec();
        assert_eq!(p[16..], [1, 2, 3, 4, 0, 0, 0, 7]);
        p.push(9);
        let p = Bytes::from(p);
        let (_, _, sums, rest) = split_peer_write(&p, 2).unwrap();
        assert_eq!((&sums[..], &rest[..]), (&[0x0102_0304, 7][..], &[9u8][..]));
        // More sums than the payload holds, or a count whose size overflows: refused.
        assert_eq!(split_peer_write(&p, 3), None);
        assert_eq!(split_peer_write(&p, u32::MAX), None);

        let src = ObjectId::data(Vid(3), ObjIndex(4));
        let mut p = peer_cow_prefix(Version(5), Version(6), &[7], Some(src)).to_vec();
        p.push(9);
        let (b, n, sums, s, rest) = split_peer_cow(&Bytes::from(p), 1).unwrap();
        assert_eq!(
            (b, n, &sums[..], s, &rest[..]),
            (Version(5), Version(6), &[7u32][..], Some(src), &[9u8][..])
        );
        let p = peer_cow_prefix(Version(5), Version(6), &[], None);
        let (_, _, _, s, rest) = split_peer_cow(&p, 0).unwrap();
        assert_eq!((s, rest.len()), (None, 0));
        assert_eq!(split_peer_cow(&p.slice(..20), 0), None);
    }

    #[test]
    fn cow_prefix_golden_bytes_round_trip_and_short_payloads_are_refused() {
        let source = ObjectId::data(Vid(0xabcdef), ObjIndex(7));
        let mut p = cow_prefix(Version(0x0102_0304_0506_0708), source).to_vec();
        #[rustfmt::skip]
        assert_eq!(p, [
            1, 2, 3, 4, 5, 6, 7, 8,                         // expected version
            0x00, 0xab, 0xcd, 0xef, 0x00, 0x00, 0x00, 0x07, // source: VDI 0xabcdef, index 7
        ]);
        p.extend_from_slice(b"data");
        let (v, src, rest) = split_cow(&Bytes::from(p)).unwrap();
        assert_eq!(
            (v, src, &rest[..]),
            (Version(0x0102_0304_0506_0708), source, &b"data"[..])
        );
        let (_, _, empty) = split_cow(&Bytes::from_static(&[0; 16])).unwrap();
        assert!(empty.is_empty());
        assert_eq!(split_cow(&Bytes::from_static(&[0; 15])), None);
        assert_eq!(split_cow(&Bytes::new()), None);
    }

    #[test]
    fn a_cow_source_is_another_vdis_data_object_of_the_same_index() {
        let target = ObjectId::data(Vid(9), ObjIndex(3));
        assert_eq!(
            cow_source_error(target, ObjectId::data(Vid(4), ObjIndex(3))),
            None
        );
        let bad = [
            (target, "is the target itself"),
            (ObjectId::inode(Vid(4)), "must both be data objects"),
            (ObjectId::data(Vid(4), ObjIndex(2)), "another index"),
            (ObjectId(target.0 ^ (1 << 62)), "own VDI"),
        ];
        for (source, why) in bad {
            let e = cow_source_error(target, source).expect("refused");
            assert!(e.contains(why) && e.contains(&source.to_string()), "{e}");
        }
        assert!(cow_source_error(ObjectId::inode(Vid(9)), ObjectId::inode(Vid(4))).is_some());
    }
}
