//! Listings by ring arc (`PeerDigest`, `PeerArcs`; docs/wire.md): how a node planning its
//! recovery learns what its peers hold without fetching what it already knows.
//!
//! All objects of one arc of the ring ([`crate::placement::Ring::arc_of`]) have the same
//! holders. A peer answers `PeerDigest` with, for each arc the asker holds in the epoch in
//! which the peer has copies, how many and a digest of them ([`digest_of`]: the arc's listing
//! entries, sorted by id, through BLAKE3). Two nodes whose digests of an arc are equal hold
//! the same objects of it at the same versions and flags, so the asker fetches (`PeerArcs`) an
//! arc's entries once for every group of peers that agree on it, and not at all where they
//! agree with its own copies. The asker checks each fetched arc against the digest it was
//! fetched for before it stands for any other peer.

use bytes::{BufMut, Bytes, BytesMut};

use crate::oid::ObjectId;
use crate::version::{decode_list, encode_list, ObjState, LIST_ENTRY};

/// The listing entries of one arc, sorted by id.
pub type ArcList = Vec<(ObjectId, ObjState)>;

/// Bytes of one `PeerDigest` entry: arc (4), count (4), digest (16).
pub const ARC_DIGEST: usize = 24;

/// One arc of a peer's copies, as `PeerDigest` answers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArcDigest {
    pub arc: u32,
    /// Entries in the arc's listing.
    pub count: u32,
    pub digest: [u8; 16],
}

/// The digest of an arc's listing: BLAKE3 of its entries as `PeerList` encodes them (sorted
/// by id), cut to 16 bytes.
pub fn digest_of(list: &[(ObjectId, ObjState)]) -> [u8; 16] {
    let mut h = blake3::Hasher::new();
    h.update(&encode_list(list));
    let mut d = [0; 16];
    d.copy_from_slice(&h.finalize().as_bytes()[..16]);
    d
}

/// [`ArcDigest`] of `arc`'s listing `list`.
pub fn arc_digest(arc: u32, list: &[(ObjectId, ObjState)]) -> ArcDigest {
    ArcDigest {
        arc,
        count: list.len() as u32,
        digest: digest_of(list),
    }
}

/// Encodes a `PeerDigest` response.
pub fn encode_digests(ds: &[ArcDigest]) -> Bytes {
    let mut b = BytesMut::with_capacity(ds.len() * ARC_DIGEST);
    for d in ds {
        b.put_u32(d.arc);
        b.put_u32(d.count);
        b.put_slice(&d.digest);
    }
    b.freeze()
}

/// Decodes a `PeerDigest` response; None if its length is not a whole number of entries.
pub fn decode_digests(b: &[u8]) -> Option<Vec<ArcDigest>> {
    if !b.len().is_multiple_of(ARC_DIGEST) {
        return None;
    }
    Some(
        b.chunks_exact(ARC_DIGEST)
            .map(|c| ArcDigest {
                arc: u32::from_be_bytes(c[..4].try_into().unwrap()),
                count: u32::from_be_bytes(c[4..8].try_into().unwrap()),
                digest: c[8..24].try_into().unwrap(),
            })
            .collect(),
    )
}

/// What a `PeerArcs` asks for: the node's copies in each of `arcs` of the request epoch's ring
/// with `copies` copies, for node `owner` (which must hold those arcs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArcsRequest {
    pub owner: u64,
    pub copies: u32,
    pub arcs: Vec<u32>,
}

impl ArcsRequest {
    /// owner (8), copies (4), count of `arcs` (4), then each (4).
    pub fn encode(&self) -> Bytes {
        let mut b = BytesMut::with_capacity(16 + 4 * self.arcs.len());
        b.put_u64(self.owner);
        b.put_u32(self.copies);
        b.put_u32(self.arcs.len() as u32);
        for &a in &self.arcs {
            b.put_u32(a);
        }
        b.freeze()
    }

    /// None if `b` is not such a request.
    pub fn decode(b: &[u8]) -> Option<ArcsRequest> {
        if b.len() < 16 {
            return None;
        }
        let n = u32::from_be_bytes(b[12..16].try_into().unwrap()) as usize;
        if b.len() != 16 + 4 * n {
            return None;
        }
        Some(ArcsRequest {
            owner: u64::from_be_bytes(b[..8].try_into().unwrap()),
            copies: u32::from_be_bytes(b[8..12].try_into().unwrap()),
            arcs: b[16..]
                .chunks_exact(4)
                .map(|c| u32::from_be_bytes(c.try_into().unwrap()))
                .collect(),
        })
    }
}

/// Encodes a `PeerArcs` response: for each arc asked, in order, arc (4), count (4), then its
/// `count` listing entries.
pub fn encode_arcs(arcs: &[(u32, ArcList)]) -> Bytes {
    let n: usize = arcs.iter().map(|(_, l)| 8 + l.len() * LIST_ENTRY).sum();
    let mut b = BytesMut::with_capacity(n);
    for (arc, list) in arcs {
        b.put_u32(*arc);
        b.put_u32(list.len() as u32);
        b.put_slice(&encode_list(list));
    }
    b.freeze()
}

/// Decodes a `PeerArcs` response; None if it is cut short or has bytes past its last arc.
pub fn decode_arcs(mut b: &[u8]) -> Option<Vec<(u32, ArcList)>> {
    let mut out = Vec::new();
    while !b.is_empty() {
        if b.len() < 8 {
            return None;
        }
        let arc = u32::from_be_bytes(b[..4].try_into().unwrap());
        let n = u32::from_be_bytes(b[4..8].try_into().unwrap()) as usize;
        let end = 8usize.checked_add(n.checked_mul(LIST_ENTRY)?)?;
        if b.len() < end {
            return None;
        }
        out.push((arc, decode_list(&b[8..end])?));
        b = &b[end..];
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::version::Version;

    fn list(n: u64, v: u64) -> ArcList {
        (0..n)
            .map(|i| (ObjectId(i * 3), ObjState::live(Version(v + i))))
            .collect()
    }

    #[test]
    fn round_trips_and_bad_lengths() {
        let ds = vec![arc_digest(3, &list(5, 1)), arc_digest(u32::MAX, &[])];
        let e = encode_digests(&ds);
        assert_eq!(e.len(), 2 * ARC_DIGEST);
        assert_eq!(decode_digests(&e), Some(ds));
        assert_eq!(decode_digests(&e[..e.len() - 1]), None);

        let r = ArcsRequest {
            owner: 9,
            copies: 3,
            arcs: vec![0, 7, u32::MAX],
        };
        assert_eq!(ArcsRequest::decode(&r.encode()), Some(r.clone()));
        let e = r.encode();
        assert_eq!(ArcsRequest::decode(&e[..e.len() - 1]), None);
        assert_eq!(ArcsRequest::decode(&[]), None);

        let arcs = vec![(4, list(3, 10)), (5, Vec::new()), (9, list(1, 2))];
        let e = encode_arcs(&arcs);
        assert_eq!(decode_arcs(&e), Some(arcs));
        assert_eq!(decode_arcs(&e[..e.len() - 1]), None);
        assert_eq!(decode_arcs(&[0, 0, 0, 1, 0xff, 0xff, 0xff, 0xff]), None);
        assert_eq!(decode_arcs(&[]), Some(Vec::new()));
    }

    /// A digest changes with any entry's id, version or flags, and with an entry more or less.
    #[test]
    fn a_digest_names_its_entries() {
        let base = list(4, 1);
        let d = digest_of(&base);
        assert_eq!(d, digest_of(&base.clone()));
        let mut v = base.clone();
        v[2].1.version = Version(99);
        assert_ne!(digest_of(&v), d);
        let mut f = base.clone();
        f[1].1.suspect = true;
        assert_ne!(digest_of(&f), d);
        let mut o = base.clone();
        o[0].0 = ObjectId(1);
        assert_ne!(digest_of(&o), d);
        assert_ne!(digest_of(&base[..3]), d);
        assert_ne!(digest_of(&[]), d);
    }
}
