//! The copy of an object a node takes in recovery, among its own and the holders of the
//! newest version elsewhere (see [`reference`]).

use std::collections::HashMap;
use std::net::SocketAddr;

use crate::store::ObjState;

/// Where this node's copy of an object must come from.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Reference {
    /// The local copy is current (or the reference the others take).
    Mine,
    /// Pull this state from these nodes.
    Pull(ObjState, Vec<SocketAddr>),
}

/// Chooses the copy of one object this node must hold, from its own state (`mine`) and the
/// holders of the newest version elsewhere (`holders`, all at one version): the newest version
/// wins; among copies of the newest version, one that is not suspect wins over suspect ones
/// (whose bytes may hold an unacknowledged write); when every copy of the newest version is
/// suspect, the one on the node with the lowest id is the reference, so every replica ends with
/// the same bytes.
pub(super) fn reference(
    me: u64,
    ids: &HashMap<SocketAddr, u64>,
    mine: Option<ObjState>,
    holders: &[(SocketAddr, ObjState)],
) -> Reference {
    let Some((_, newest)) = holders.first().copied() else {
        return Reference::Mine;
    };
    let mine_v = mine.map(|m| m.version).unwrap_or_default();
    if mine.is_some() && mine_v > newest.version {
        return Reference::Mine;
    }
    let clean: Vec<SocketAddr> = holders
        .iter()
        .filter(|(_, s)| !s.suspect)
        .map(|(a, _)| *a)
        .collect();
    if mine.is_some() && mine_v == newest.version {
        let m = mine.unwrap_or_default();
        if !m.suspect {
            return Reference::Mine;
        }
        if !clean.is_empty() {
            return Reference::Pull(ObjState::live(newest.version), clean);
        }
    } else if !clean.is_empty() {
        let want = holders
            .iter()
            .find(|(_, s)| !s.suspect)
            .map(|(_, s)| *s)
            .unwrap_or(newest);
        return Reference::Pull(want, clean);
    }
    // Every copy of the newest version is suspect (mine too, if I have one).
    let lowest = holders
        .iter()
        .map(|(a, _)| (ids.get(a).copied().unwrap_or(u64::MAX), *a))
        .min();
    match lowest {
        Some((id, _)) if mine_v == newest.version && me < id => Reference::Mine,
        Some((_, addr)) => Reference::Pull(newest, vec![addr]),
        None => Reference::Mine,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use objstore_proto::version::Version;

    fn addr(i: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], 7000 + i))
    }

    fn st(v: u64, suspect: bool) -> ObjState {
        ObjState {
            suspect,
            ..ObjState::live(Version(v))
        }
    }

    #[test]
    fn the_reference_copy() {
        let ids: HashMap<SocketAddr, u64> = (1..=3).map(|i| (addr(i), i as u64)).collect();
        let me = 2;
        // Nothing elsewhere, or older: mine.
        assert_eq!(reference(me, &ids, Some(st(5, true)), &[]), Reference::Mine);
        assert_eq!(
            reference(me, &ids, Some(st(5, false)), &[(addr(1), st(4, false))]),
            Reference::Mine
        );
        // Newer elsewhere: pull it, clean holders first.
        assert_eq!(
            reference(
                me,
                &ids,
                Some(st(4, false)),
                &[(addr(1), st(5, true)), (addr(3), st(5, false))]
            ),
            Reference::Pull(st(5, false), vec![addr(3)])
        );
        // Same version: a clean copy of mine stays; a suspect one takes a clean one.
        assert_eq!(
            reference(me, &ids, Some(st(5, false)), &[(addr(1), st(5, true))]),
            Reference::Mine
        );
        assert_eq!(
            reference(me, &ids, Some(st(5, true)), &[(addr(3), st(5, false))]),
            Reference::Pull(st(5, false), vec![addr(3)])
        );
        // Every copy suspect: the lowest node id is the reference.
        assert_eq!(
            reference(me, &ids, Some(st(5, true)), &[(addr(3), st(5, true))]),
            Reference::Mine
        );
        assert_eq!(
            reference(
                me,
                &ids,
                Some(st(5, true)),
                &[(addr(1), st(5, true)), (addr(3), st(5, true))]
            ),
            Reference::Pull(st(5, true), vec![addr(1)])
        );
        assert_eq!(
            reference(
                me,
                &ids,
                None,
                &[(addr(3), st(5, true)), (addr(1), st(5, true))]
            ),
            Reference::Pull(st(5, true), vec![addr(1)])
        );
    }
}
