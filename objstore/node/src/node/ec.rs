//! Erasure-coded objects on the node: the primary's side (`EcRead`, `EcWrite`, `EcRemove`:
//! [`primary`]) and each strip holder's (`PeerStrip`, `PeerStripRead`: [`holder`]).
//!
//! The invariant they keep is docs/architecture.md's "Erasure-coded objects": one version
//! names one stripe, at most one change is undecided, every strip can go back one version (its
//! note keeps what undoes the last change), and a stripe left mixed is resolved by
//! [`objstore_proto::ec::resolve`]. Here:
//!
//! - A strip's note ([`Note`], kept with the strip's key by the store) holds the change that
//!   made its version (scheme, base, the strips it touched) and the undo: the bytes it
//!   overwrote, the whole strip it replaced, or nothing (a change that left it alone). The note
//!   is set before the strip's bytes change.
//! - The primary (holder of strip 0) orders changes under the object's lock. The first time
//!   it serves an object in an epoch, and after any change that failed somewhere, it asks
//!   every holder for its strip's state and resolves the stripe before it reads or changes it
//!   ([`Node::ec_decided`]).

mod check;
mod holder;
mod peer;
mod primary;
mod whole;

pub(super) use primary::EcChange;

use std::collections::HashSet;
use std::sync::Mutex;

use bytes::Bytes;

use objstore_proto::ec::resolve::StripSet;
use objstore_proto::ec::wire::{StripHead, StripOp, FLAG_BACK, FLAG_KNOWN, HEAD_LEN};
use objstore_proto::ec::Codec;
use objstore_proto::oid::ObjectId;
use objstore_proto::redundancy::Redundancy;
use objstore_proto::version::Version;
use objstore_proto::view::{ClusterConfig, NodeInfo};

use super::server::Failure;
use super::Epoch;

/// The objects this node, as their primary, knows to be decided in one epoch.
#[derive(Default)]
pub(super) struct Decided {
    state: Mutex<(u32, HashSet<ObjectId>)>,
}

impl Decided {
    pub(super) fn contains(&self, epoch: u32, oid: ObjectId) -> bool {
        let st = self.state.lock().unwrap();
        st.0 == epoch && st.1.contains(&oid)
    }

    pub(super) fn insert(&self, epoch: u32, oid: ObjectId) {
        let mut st = self.state.lock().unwrap();
        if st.0 != epoch {
            *st = (epoch, HashSet::new());
        }
        st.1.insert(oid);
    }

    pub(super) fn remove(&self, oid: ObjectId) {
        self.state.lock().unwrap().1.remove(&oid);
    }
}

/// What the metrics count of erasure-coded objects (`sheep_ec_*`, docs/operations.md).
#[derive(Debug, Clone, Copy)]
pub(super) enum EcEvent {
    /// A stripe a change left mixed went forward to it.
    Forward,
    /// A stripe a change left mixed went back to the version before it.
    Back,
    /// Strips missing or stale were rebuilt from the others.
    Rebuilt,
    /// A piece of a read was decoded from other strips.
    Decoded,
    /// A client's read of a strip here (`EcStripRead`) was served (true) or refused (its
    /// strip here at another version, or unreadable).
    StripRead(bool),
}

impl super::Node {
    pub(super) fn ec_count(&self, e: EcEvent) {
        let r = self.metrics().registry();
        let c = match e {
            EcEvent::StripRead(served) => r.counter(
                "sheep_ec_strip_reads_total",
                "Clients' reads of erasure-coded strips this node holds, straight from it: served, or refused (the strip here at another version than the client's, or unreadable) and read through the primary",
                &[("answer", if served { "served" } else { "refused" })],
            ),
            EcEvent::Decoded => r.counter(
                "sheep_ec_decoded_reads_total",
                "Pieces of reads of erasure-coded objects this node (their primary) decoded from other strips than the ones holding them",
                &[],
            ),
            e => {
                let way = match e {
                    EcEvent::Forward => "forward",
                    EcEvent::Back => "back",
                    _ => "rebuilt",
                };
                r.counter(
                    "sheep_ec_resolved_total",
                    "Stripes of erasure-coded objects this node (their primary) made whole: a change left mixed went forward or back, or missing strips were rebuilt",
                    &[("way", way)],
                )
            }
        };
        c.inc();
    }
}

/// One erasure-coded object in one epoch: its code and the nodes holding its strips.
pub(super) struct Stripe {
    pub(super) oid: ObjectId,
    pub(super) scheme: Redundancy,
    pub(super) codec: Codec,
    /// `holders[k]` holds strip `k`; None while the cluster has fewer nodes than strips.
    pub(super) holders: Vec<Option<NodeInfo>>,
}

impl Stripe {
    /// The stripe of data object `oid` of scheme `scheme` in `ep`.
    pub(super) fn new(
        ep: &Epoch,
        cfg: &ClusterConfig,
        oid: ObjectId,
        scheme: Redundancy,
    ) -> Result<Stripe, Failure> {
        if oid.is_inode() || oid.strip_index().is_some() {
            return Err(Failure::invalid(format!(
                "object {oid} is not a data object: only data objects are erasure-coded"
            )));
        }
        let codec = Codec::new(scheme, cfg.object_size as u64).map_err(Failure::invalid)?;
        let holders: Vec<Option<NodeInfo>> = (0..codec.strips())
            .map(|k| {
                ep.ring
                    .strip_holder(oid, k)
                    .map(|i| ep.ring.nodes()[i].clone())
            })
            .collect();
        Ok(Stripe {
            oid,
            scheme,
            codec,
            holders,
        })
    }

    pub(super) fn key(&self, k: usize) -> ObjectId {
        self.oid.strip(k)
    }

    pub(super) fn width(&self) -> usize {
        self.holders.len()
    }

    /// Strips with a holder in the epoch.
    pub(super) fn held(&self) -> StripSet {
        let mut s = StripSet::default();
        for (k, h) in self.holders.iter().enumerate() {
            if h.is_some() {
                s.insert(k);
            }
        }
        s
    }

    /// A head for a change of this stripe.
    pub(super) fn head(
        &self,
        op: StripOp,
        base: Version,
        version: Version,
        t: StripSet,
    ) -> StripHead {
        let Redundancy::Ec { data, parity } = self.scheme else {
            unreachable!("a stripe's scheme is an erasure code")
        };
        StripHead {
            data,
            parity,
            op,
            flags: 0,
            touched: t,
            base,
            version,
        }
    }
}

/// What undoes a strip's last change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Undo {
    /// The change left the strip's bytes alone.
    Nothing,
    /// It overwrote these bytes at this offset.
    Range { offset: u64, old: Vec<u8> },
    /// It replaced (or removed) the whole strip, which held these bytes.
    Whole(Vec<u8>),
    /// The strip did not exist before.
    Absent,
    /// The strip was a tombstone before.
    Tombstone,
}

/// The note a holder keeps with a strip: the change that made its version, and its undo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Note {
    /// Its version and, with [`FLAG_KNOWN`], the change's base and touched strips.
    pub(super) head: StripHead,
    /// The copy holds every change of the strip made before this epoch (0: not known beyond
    /// what its version says, [`Note::current_of`]): the epoch it was installed whole in by
    /// its holder (rebuilt by its primary, or pulled from a copy its new holder could vouch
    /// for, [`crate::node::history::Safety::installed_current`]).
    pub(super) current: u32,
    pub(super) undo: Undo,
}

/// Bit of an encoded note's head flags (never on the wire): the epoch of
/// [`Note::current`] follows the head (u32 BE). Notes written before it have none.
const NOTE_CURRENT: u8 = 0x80;

/// Bytes of a note's head and [`Note::current`].
pub(super) const NOTE_HEAD_LEN: usize = HEAD_LEN + 4;

/// The op byte of an encoded note's head: no [`StripOp`]'s, so that the note decoder of a
/// release from before [`NOTE_CURRENT`] refuses the note (its head names an unknown op) instead
/// of misreading it. That decoder reads the undo's kind where `current` is now, and so takes
/// most undos for "nothing": a strip it was asked to take back would keep its new bytes under
/// its old version (a node of such a release pulling the strip in a rolling upgrade, or a node
/// downgraded). The note's op goes in the flag bits [`NOTE_OP_BITS`].
const NOTE_OP: u8 = 0xFF;
const NOTE_OP_BITS: u8 = 0x70;
const NOTE_OP_SHIFT: u8 = 4;
// Every op fits in those bits (`Settle` is the highest).
const _: () = assert!((StripOp::Settle as u8) << NOTE_OP_SHIFT <= NOTE_OP_BITS);

impl Note {
    /// The epoch before which a copy at `version` with `current` in its note holds every change
    /// of the strip: a version is made in its epoch after every change of the epochs before.
    pub(super) fn current_of(version: Version, current: u32) -> u32 {
        current.max(version.epoch())
    }

    /// The head and [`Note::current`] at the start of an encoded note (all that
    /// [`NOTE_HEAD_LEN`] bytes of it give).
    pub(super) fn decode_head(b: &[u8]) -> Option<(StripHead, u32)> {
        let mut h: [u8; HEAD_LEN] = b.get(..HEAD_LEN)?.try_into().ok()?;
        if h[2] == NOTE_OP {
            h[2] = (h[3] & NOTE_OP_BITS) >> NOTE_OP_SHIFT;
            h[3] &= !NOTE_OP_BITS;
        }
        let head = StripHead::decode(&h)?;
        if head.flags & NOTE_CURRENT == 0 {
            return Some((head, 0));
        }
        let current = u32::from_be_bytes(b.get(HEAD_LEN..NOTE_HEAD_LEN)?.try_into().ok()?);
        let head = StripHead {
            flags: head.flags & !NOTE_CURRENT,
            ..head
        };
        Some((head, current))
    }

    pub(super) fn encode(&self) -> Vec<u8> {
        debug_assert_eq!(self.head.flags & (NOTE_OP_BITS | NOTE_CURRENT), 0);
        let mut b = self.head.encode().to_vec();
        let flags = self.head.flags & !(NOTE_OP_BITS | NOTE_CURRENT);
        b[3] = flags | NOTE_CURRENT | (self.head.op as u8) << NOTE_OP_SHIFT;
        b[2] = NOTE_OP;
        b.extend_from_slice(&self.current.to_be_bytes());
        let (kind, offset, bytes): (u8, u64, &[u8]) = match &self.undo {
            Undo::Nothing => (0, 0, &[]),
            Undo::Range { offset, old } => (1, *offset, old),
            Undo::Whole(old) => (2, 0, old),
            Undo::Absent => (3, 0, &[]),
            Undo::Tombstone => (4, 0, &[]),
        };
        b.push(kind);
        b.extend_from_slice(&offset.to_be_bytes());
        b.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
        b.extend_from_slice(bytes);
        b
    }

    pub(super) fn decode(b: &[u8]) -> Option<Note> {
        let (head, current) = Note::decode_head(b)?;
        let at = if b[3] & NOTE_CURRENT != 0 {
            NOTE_HEAD_LEN
        } else {
            HEAD_LEN
        };
        let rest = b.get(at..)?;
        let kind = *rest.first()?;
        let offset = u64::from_be_bytes(rest.get(1..9)?.try_into().ok()?);
        let len = u32::from_be_bytes(rest.get(9..13)?.try_into().ok()?) as usize;
        let bytes = rest.get(13..13usize.checked_add(len)?)?.to_vec();
        let undo = match kind {
            0 => Undo::Nothing,
            1 => Undo::Range { offset, old: bytes },
            2 => Undo::Whole(bytes),
            3 => Undo::Absent,
            4 => Undo::Tombstone,
            _ => return None,
        };
        Some(Note {
            head,
            current,
            undo,
        })
    }

    /// A note for a strip at `version` whose change is not known (installed whole, rolled
    /// back): it can go back nowhere.
    pub(super) fn bare(like: &StripHead, version: Version) -> Note {
        Note {
            head: StripHead {
                op: StripOp::Put,
                flags: 0,
                touched: StripSet::default(),
                base: Version::NONE,
                version,
                ..*like
            },
            current: 0,
            undo: Undo::Nothing,
        }
    }

    /// The head a holder answers for its strip at `version` with its note's head `noted`.
    pub(super) fn answer(
        noted: Option<&StripHead>,
        like: &StripHead,
        version: Version,
    ) -> StripHead {
        match noted {
            Some(n) if n.version == version && n.flags & FLAG_KNOWN != 0 => StripHead {
                op: StripOp::Write,
                ..*n
            },
            _ => StripHead {
                op: StripOp::Write,
                flags: 0,
                touched: StripSet::default(),
                base: Version::NONE,
                version,
                ..*like
            },
        }
    }
}

/// `PeerRead` of a strip's key answers its bytes, then its note, then the note's length (u32
/// BE): the note travels with the strip when recovery moves it.
pub(super) fn with_note(data: Vec<u8>, note: Option<Vec<u8>>) -> Vec<u8> {
    let note = note.unwrap_or_default();
    let mut out = data;
    out.extend_from_slice(&note);
    out.extend_from_slice(&(note.len() as u32).to_be_bytes());
    out
}

/// A `PeerRead` answer of key `oid` as [`with_note`] made it for a strip's key: its bytes, and
/// the note to keep with them once installed at `version`: the change that made the version,
/// known, and what returns the strip to that change's base (the undo is of the strip's bytes,
/// the same on every holder of the version). None for a malformed answer.
///
/// The undo travels too: a stripe that went back may have done so on none of a strip's holders
/// (they were down), and recovery then moves the undone change's strip to the new holder; only
/// its undo lets it count at the base (seed 70021 with crashes and SIM_EC=2:1: strip 2, pulled
/// at the undone change without its undo over the one copy of the base, left the stripe
/// undecided for good).
pub(super) fn split_pulled(
    oid: ObjectId,
    payload: &Bytes,
    version: Version,
) -> Option<(Bytes, Option<Note>)> {
    if oid.strip_index().is_none() {
        return Some((payload.clone(), None));
    }
    let n = payload.len().checked_sub(4)?;
    let len = u32::from_be_bytes(payload[n..].try_into().ok()?) as usize;
    let at = n.checked_sub(len)?;
    let note = Note::decode(&payload[at..n])
        .filter(|note| note.head.version == version && note.head.flags & FLAG_KNOWN != 0)
        .map(|note| Note {
            head: StripHead {
                flags: note.head.flags & (FLAG_KNOWN | FLAG_BACK),
                ..note.head
            },
            ..note
        });
    Some((payload.slice(..at), note))
}

impl super::Node {
    /// The note to keep with a strip pulled at `version` whose source kept `note`, encoded:
    /// the source's, with the epoch before which the copy holds every change as this node
    /// can vouch for it now ([`Node::installed_current`]).
    pub(super) fn pulled_note(
        &self,
        key: ObjectId,
        note: Option<Note>,
        version: Version,
    ) -> Option<Vec<u8>> {
        let mut note = note?;
        note.current = self.installed_current(key, Note::current_of(version, note.current));
        Some(note.encode())
    }
}

/// A strip's bytes and the head its holder answered them with.
pub(super) struct StripRead {
    pub(super) head: StripHead,
    pub(super) bytes: Bytes,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_round_trip() {
        let head = StripHead {
            data: 4,
            parity: 2,
            op: StripOp::Xor,
            flags: FLAG_KNOWN,
            touched: StripSet(0b110001),
            base: Version(5),
            version: Version(6),
        };
        for undo in [
            Undo::Nothing,
            Undo::Range {
                offset: 4096,
                old: vec![7; 100],
            },
            Undo::Whole(vec![1, 2, 3]),
            Undo::Absent,
            Undo::Tombstone,
        ] {
            let n = Note {
                head,
                current: 17,
                undo,
            };
            assert_eq!(Note::decode(&n.encode()), Some(n.clone()));
            let b = n.encode();
            assert_eq!(Note::decode(&b[..b.len() - 1]), None, "{n:?}");
            assert_eq!(Note::decode_head(&b[..NOTE_HEAD_LEN]), Some((head, 17)));
            for op in (0..=StripOp::Settle as u8).filter_map(StripOp::from_u8) {
                let n = Note {
                    head: StripHead { op, ..head },
                    ..n.clone()
                };
                assert_eq!(Note::decode(&n.encode()), Some(n));
            }
            // Refused by the decoders of earlier releases: each begins with the head, and
            // its op byte is none they know (they would read this undo as "nothing").
            assert_eq!(StripHead::decode(&b), None);
            // A note written with `current` and its op byte as the op (before NOTE_OP): read
            // as it was.
            let mut with_op = b.clone();
            with_op[2] = head.op as u8;
            with_op[3] = head.flags | NOTE_CURRENT;
            assert_eq!(Note::decode(&with_op), Some(n.clone()));
            assert_eq!(
                Note::decode_head(&with_op[..NOTE_HEAD_LEN]),
                Some((head, 17))
            );
            // A note written before notes said which changes their copy holds: read with
            // none, its head and undo as they were.
            let mut old = head.encode().to_vec();
            old.extend_from_slice(&b[NOTE_HEAD_LEN..]);
            let read = Note::decode(&old).expect("an older note");
            assert_eq!((read.head, read.current, read.undo), (head, 0, n.undo));
            assert_eq!(Note::decode_head(&old[..HEAD_LEN]), Some((head, 0)));
        }
    }

    /// A strip pulled keeps the change that made its version and what returns it to the
    /// change's base; a note of another version, or not known, is dropped.
    #[test]
    fn a_pulled_strip_keeps_its_note_and_undo() {
        let key = ObjectId::data(
            objstore_proto::oid::Vid(1),
            objstore_proto::oid::ObjIndex(3),
        )
        .strip(2);
        let head = StripHead {
            data: 2,
            parity: 1,
            op: StripOp::Write,
            flags: FLAG_KNOWN | FLAG_BACK,
            touched: StripSet(0b101),
            base: Version(32),
            version: Version(38),
        };
        let undo = Undo::Range {
            offset: 512,
            old: vec![9; 64],
        };
        let note = Note {
            head,
            current: 12,
            undo,
        };
        let payload = Bytes::from(with_note(vec![5; 100], Some(note.encode())));
        let (data, kept) = split_pulled(key, &payload, Version(38)).unwrap();
        assert_eq!(&data[..], &[5; 100][..]);
        assert_eq!(kept, Some(note));
        // Of another version: no note kept, the bytes still are.
        let (data, kept) = split_pulled(key, &payload, Version(39)).unwrap();
        assert_eq!((data.len(), kept), (100, None));
        // Malformed: a note length past the payload.
        let bad = Bytes::from(vec![0, 0, 1, 0]);
        assert!(split_pulled(key, &bad, Version(38)).is_none());
    }
}
