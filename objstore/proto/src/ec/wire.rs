//! The payloads of the erasure-coded requests (docs/wire.md, "Erasure-coded objects").
//!
//! ```text
//! EcRead, EcWrite, EcRemove   client -> primary; header aux = data << 8 | parity;
//!                             EcWrite and EcRemove payloads as WriteObj's and RemoveObj's
//! PeerStrip                   primary -> holder of a strip (header oid = the strip's key,
//!                             offset = where in the strip): [head: 24 bytes][bytes ...]
//! PeerStripRead               primary -> holder: header offset, length = the range of the
//!                             strip; answered [head: 24 bytes][bytes ...]
//!
//! head: [data u8][parity u8][op u8][flags u8][touched u32][base u64][version u64]
//! ```
//! In a `PeerStrip` the head is the change: the strip goes from `base` to `version` by `op`,
//! and the change touched the strips of `touched`. In an answer it is what the holder keeps of
//! the strip's last change (its record): `version` is the strip's, and with [`FLAG_KNOWN`],
//! `base` and `touched` are that change's (without it, a strip whose record a crash lost);
//! [`FLAG_UNSURE`] marks a strip whose holder cannot vouch that what it has (or that it has
//! nothing) is the strip's newest version.

use bytes::{BufMut, Bytes, BytesMut};

use super::resolve::{Strip, StripSet};
use crate::redundancy::{Redundancy, EC_DATA, EC_PARITY};
use crate::version::Version;

/// Bytes of a [`StripHead`] on the wire.
pub const HEAD_LEN: usize = 24;
/// The record says which change made the strip's version (`base`, `touched`).
pub const FLAG_KNOWN: u8 = 1;
/// The holder kept what returns the strip to `base` (rule 3).
pub const FLAG_BACK: u8 = 2;
/// The holder cannot tell that what it has of the strip (or that it has nothing) is its
/// newest version: the node that held it in some epoch since the last clean one is down or
/// not listed yet (a strip that moved to this node, or a node back from a crash). Such a
/// strip is missing, not at the version its holder has.
pub const FLAG_UNSURE: u8 = 4;
/// The strip is a tombstone (its object was removed). In a `Put`, the strip installed is one.
pub const FLAG_DELETED: u8 = 8;

/// `PeerStrip` header `aux` flag, with op [`StripOp::Put`]: the holder's copy at the Put's
/// version reads back but is wrong (its bytes disagree with the other strips' parity), so it
/// is dropped as unreadable before the strip is installed; a Put otherwise replaces only an
/// older or bad copy.
pub const PUT_REPLACES: u32 = 1;

/// What a change does to one strip.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum StripOp {
    /// The bytes replace the strip's bytes at the offset (a data strip's new bytes).
    Write = 0,
    /// The bytes are XORed into the strip's at the offset (a parity strip's delta).
    Xor = 1,
    /// Only the version changes: the change left this strip's bytes alone.
    Bump = 2,
    /// The strip becomes a tombstone (the object was removed).
    Remove = 3,
    /// The bytes are the whole strip (a stripe written whole, a strip rebuilt).
    Put = 4,
    /// The strip returns to `base` from what its holder kept, and is then labelled `version`
    /// (a stripe resolved back, written whole at a new version).
    Back = 5,
    /// The change that made `version` was acknowledged: the holder may drop what would
    /// return the strip to `base` (its undo), as no resolution takes the stripe back over it.
    /// Nothing changes if the strip is at another version.
    Settle = 6,
}

impl StripOp {
    pub fn from_u8(v: u8) -> Option<StripOp> {
        Some(match v {
            0 => StripOp::Write,
            1 => StripOp::Xor,
            2 => StripOp::Bump,
            3 => StripOp::Remove,
            4 => StripOp::Put,
            5 => StripOp::Back,
            6 => StripOp::Settle,
            _ => return None,
        })
    }
}

/// The head of a `PeerStrip` request or of a `PeerStripRead` answer (see the module doc).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StripHead {
    pub data: u8,
    pub parity: u8,
    pub op: StripOp,
    pub flags: u8,
    pub touched: StripSet,
    pub base: Version,
    pub version: Version,
}

impl StripHead {
    pub fn scheme(&self) -> Redundancy {
        Redundancy::Ec {
            data: self.data,
            parity: self.parity,
        }
    }

    pub fn encode(&self) -> [u8; HEAD_LEN] {
        let mut b = [0u8; HEAD_LEN];
        b[0] = self.data;
        b[1] = self.parity;
        b[2] = self.op as u8;
        b[3] = self.flags;
        b[4..8].copy_from_slice(&self.touched.0.to_be_bytes());
        b[8..16].copy_from_slice(&self.base.0.to_be_bytes());
        b[16..24].copy_from_slice(&self.version.0.to_be_bytes());
        b
    }

    /// The head at the start of `b`; None if it is short, names an unknown op or a scheme no
    /// node offers.
    pub fn decode(b: &[u8]) -> Option<StripHead> {
        let b = b.get(..HEAD_LEN)?;
        let (data, parity) = (b[0], b[1]);
        if !EC_DATA.contains(&data) || !EC_PARITY.contains(&parity) {
            return None;
        }
        let touched = u32::from_be_bytes(b[4..8].try_into().ok()?);
        if touched >> (data + parity) != 0 {
            return None;
        }
        Some(StripHead {
            data,
            parity,
            op: StripOp::from_u8(b[2])?,
            flags: b[3],
            touched: StripSet(touched),
            base: Version(u64::from_be_bytes(b[8..16].try_into().ok()?)),
            version: Version(u64::from_be_bytes(b[16..24].try_into().ok()?)),
        })
    }

    /// A payload: this head, then `bytes`.
    pub fn with(&self, bytes: &[u8]) -> Bytes {
        let mut b = BytesMut::with_capacity(HEAD_LEN + bytes.len());
        b.put_slice(&self.encode());
        b.put_slice(bytes);
        b.freeze()
    }

    /// What a holder's answer says of its strip, as [`super::resolve`] takes it.
    pub fn strip(&self) -> Strip {
        if self.flags & FLAG_UNSURE != 0 {
            return Strip::Missing;
        }
        Strip::At {
            version: self.version,
            change: (self.flags & FLAG_KNOWN != 0).then_some((self.base, self.touched)),
            back: self.flags & FLAG_BACK != 0,
        }
    }
}

/// A head and the bytes after it.
pub fn split(payload: &Bytes) -> Option<(StripHead, Bytes)> {
    Some((StripHead::decode(payload)?, payload.slice(HEAD_LEN..)))
}

/// The header `aux` of `EcRead`, `EcWrite` and `EcRemove`: the object's scheme.
pub fn scheme_aux(scheme: Redundancy) -> u32 {
    match scheme {
        Redundancy::Ec { data, parity } => (data as u32) << 8 | parity as u32,
        Redundancy::Copies(_) => 0,
    }
}

/// The scheme an `aux` names, if it is one a node offers.
pub fn scheme_of_aux(aux: u32) -> Option<Redundancy> {
    let (data, parity) = (u8::try_from(aux >> 8).ok()?, (aux & 0xff) as u8);
    (EC_DATA.contains(&data) && EC_PARITY.contains(&parity))
        .then_some(Redundancy::Ec { data, parity })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_head() {
        let h = StripHead {
            data: 4,
            parity: 2,
            op: StripOp::Xor,
            flags: FLAG_KNOWN | FLAG_BACK,
            touched: StripSet(0b11_0001),
            base: Version(0x0000_0007_0000_0001),
            version: Version(0x0000_0007_0000_0002),
        };
        #[rustfmt::skip]
        let want = [
            4, 2,                   // data, parity strips
            1,                      // op: Xor
            3,                      // flags: known, back
            0, 0, 0, 0b11_0001,     // touched: strips 0, 4, 5
            0, 0, 0, 7, 0, 0, 0, 1, // base version
            0, 0, 0, 7, 0, 0, 0, 2, // version
        ];
        assert_eq!(h.encode(), want);
        assert_eq!(StripHead::decode(&want), Some(h));
        let (back, rest) = split(&h.with(b"delta")).unwrap();
        assert_eq!((back, &rest[..]), (h, &b"delta"[..]));
        assert_eq!(
            h.strip(),
            Strip::At {
                version: h.version,
                change: Some((h.base, h.touched)),
                back: true
            }
        );
    }

    #[test]
    fn bad_heads_are_refused() {
        let good = StripHead {
            data: 2,
            parity: 1,
            op: StripOp::Bump,
            flags: 0,
            touched: StripSet(0b101),
            base: Version(1),
            version: Version(2),
        }
        .encode();
        assert!(StripHead::decode(&good).is_some());
        assert!(StripHead::decode(&good[..23]).is_none());
        let mut b = good;
        b[2] = 9;
        assert!(StripHead::decode(&b).is_none(), "unknown op");
        let mut b = good;
        b[0] = 1;
        assert!(StripHead::decode(&b).is_none(), "1 data strip");
        let mut b = good;
        b[7] = 0b1000;
        assert!(StripHead::decode(&b).is_none(), "strip 3 of 3");
    }

    #[test]
    fn the_scheme_rides_in_aux() {
        let r = Redundancy::Ec { data: 4, parity: 2 };
        assert_eq!(scheme_aux(r), 0x0402);
        assert_eq!(scheme_of_aux(0x0402), Some(r));
        for bad in [0, 0x0100, 0x0401, 0x1109, 0x0409, 0x1_0402] {
            if bad == 0x0401 {
                assert!(scheme_of_aux(bad).is_some());
                continue;
            }
            assert_eq!(scheme_of_aux(bad), None, "{bad:#x}");
        }
    }
}
