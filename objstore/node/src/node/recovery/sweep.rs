//! The plan's pass over every object listed or held here, on the blocking pool: one sort of
//! all the listings' entries merged with the local list (sorted too), no map or allocation
//! per object. It keeps only the objects the plan must decide on; an object this node owns,
//! holds not suspect at the newest version listed, that no node lost newer and that waits for
//! nobody needs nothing (the plan would take the copy here as it is), and a copy this node
//! does not own and did not lose is the collector's business, not the plan's.
//!
//! At a million objects a node this is what planning costs (issue 43's scale harness:
//! `objstore/node/tests/scale.rs`); before, a map entry and a vector per object took several
//! times as long, on the node's async workers, where the node's other requests (the peers'
//! listings among them) waited behind it.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;

use crate::node::history::Safety;
use crate::store::{ObjState, Version};
use objstore_proto::oid::ObjectId;
use objstore_proto::placement::Ring;

/// An object the plan must decide on.
pub(super) struct Found {
    pub oid: ObjectId,
    pub owned: bool,
    /// The holders of its newest version listed (lost copies never among them).
    pub holders: Vec<(SocketAddr, ObjState)>,
    /// The copy here.
    pub mine: Option<ObjState>,
    /// The newest version some other node lost and has not restored, if newer than the copy
    /// here.
    pub lost_elsewhere: Option<Version>,
}

/// What the sweep is given.
pub(super) struct Input {
    pub me: u64,
    pub copies: usize,
    pub ring: Ring,
    pub safety: Arc<Safety>,
    /// Each listed node with its entries.
    pub listings: Vec<(SocketAddr, Vec<(ObjectId, ObjState)>)>,
    /// The copies here, sorted by id.
    pub local: Vec<(ObjectId, ObjState)>,
    /// Copies lost here and not restored.
    pub lost_here: HashMap<ObjectId, Version>,
    /// The objects asked of the peers besides those this node holds in the epoch: every
    /// other object a peer listed is this node's ([`objstore_proto::version::ListRequest`]),
    /// which spares the ring lookup of each.
    pub extra: HashSet<ObjectId>,
}

/// The objects the plan must decide on, by id.
pub(super) fn sweep(mut input: Input) -> Vec<Found> {
    let addrs: Vec<SocketAddr> = input.listings.iter().map(|(a, _)| *a).collect();
    let total = input.listings.iter().map(|(_, l)| l.len()).sum();
    let mut listed: Vec<(ObjectId, u32, ObjState)> = Vec::with_capacity(total);
    for (k, (_, list)) in std::mem::take(&mut input.listings).into_iter().enumerate() {
        listed.extend(list.into_iter().map(|(oid, st)| (oid, k as u32, st)));
    }
    listed.sort_unstable_by_key(|(oid, k, _)| (*oid, *k));
    let local = std::mem::take(&mut input.local);
    let mut found = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < listed.len() || j < local.len() {
        let oid = match (listed.get(i), local.get(j)) {
            (Some(a), Some(b)) => a.0.min(b.0),
            (Some(a), None) => a.0,
            (None, Some(b)) => b.0,
            (None, None) => break,
        };
        let start = i;
        while i < listed.len() && listed[i].0 == oid {
            i += 1;
        }
        let mine = match local.get(j) {
            Some(&(o, st)) if o == oid => {
                j += 1;
                Some(st)
            }
            _ => None,
        };
        let group = &listed[start..i];
        if let Some(f) = decide(&input, &addrs, oid, group, mine) {
            found.push(f);
        }
    }
    found
}

/// One object: None when the plan has nothing to decide on it.
fn decide(
    input: &Input,
    addrs: &[SocketAddr],
    oid: ObjectId,
    group: &[(ObjectId, u32, ObjState)],
    mine: Option<ObjState>,
) -> Option<Found> {
    let lost_here = input.lost_here.contains_key(&oid);
    let listed_as_mine = !group.is_empty() && !input.extra.contains(&oid);
    let owned = listed_as_mine || input.ring.holds(input.me, oid, input.copies);
    if !owned && !lost_here {
        return None;
    }
    let mut newest: Option<Version> = None;
    let mut lost_newest: Option<Version> = None;
    for (_, _, st) in group {
        if st.lost {
            lost_newest = lost_newest.max(Some(st.version));
        } else {
            newest = newest.max(Some(st.version));
        }
    }
    let lost_elsewhere = lost_newest.filter(|w| mine.is_none_or(|m| m.version < *w));
    let up_to_date = mine.is_some_and(|m| !m.suspect && newest.is_none_or(|n| m.version >= n));
    if owned && !lost_here && lost_elsewhere.is_none() && up_to_date && input.safety.safe(oid) {
        return None;
    }
    let holders = (group.iter())
        .filter(|(_, _, st)| !st.lost && Some(st.version) == newest)
        .map(|(_, k, st)| (addrs[*k as usize], *st))
        .collect();
    Some(Found {
        oid,
        owned,
        holders,
        mine,
        lost_elsewhere,
    })
}
