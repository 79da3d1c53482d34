//! Peers' listings from this node's objects in ring order.
//!
//! At an epoch change every peer asks this node for the objects it holds that the peer owns in
//! the epoch (`PeerList`). Filtering the whole index by the ring for each asker costs a hash
//! and a ring lookup per object per asker (about 170 ns): at 100 peers and 10^6 objects, 17 s
//! of CPU a node per epoch change, and listings that overran their peers' timeouts. Instead,
//! the first listing of an epoch sorts the node's objects by the arc of the ring each falls
//! in ([`Ring::arc_of`]: all objects of an arc have the same holders); each asker's listing is
//! then the objects of the arcs it holds, their states read fresh from the store.
//!
//! The invariant: a listing holds exactly what a pass over the whole index at the time of the
//! request would have kept. The order is reused only while the store reports that no object
//! entered its index since the order was read ([`ObjectBackend::created`], read before the
//! index is): objects that left it since are skipped (their state is read fresh), and one that
//! left and came back counts as entering. Otherwise, or for a store that does not count, the
//! order is read again, at the cost of the pass it replaces.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use objstore_proto::arcs::ArcList;
use objstore_proto::oid::ObjectId;
use objstore_proto::placement::Ring;
use objstore_proto::version::ListRequest;

use super::recovery::PAGE_ENTRIES;
use super::{Epoch, Node};
use crate::store::{shard_of, shard_range, ObjState, ObjectBackend, INDEX_SHARDS};

/// A peer's listing as [`Node::listing_part`] answers it.
pub(crate) enum Listing {
    Entries(Vec<(ObjectId, ObjState)>),
    /// Too many for one page: ask in this many parts.
    Split(u32),
}

/// The objects of a store in the order of one epoch's ring.
struct Order {
    epoch: u32,
    copies: usize,
    /// [`ObjectBackend::created`] before the index was read.
    created: u64,
    /// (arc, object), sorted.
    by_arc: Vec<(u32, ObjectId)>,
    /// Each run of objects here with the same holders: where it is in `by_arc`, and its
    /// holders (node indexes of the ring: `copies` of them, or one for the keys of one strip,
    /// which sort after the arc's plain objects and before its inodes). An arc has one run, or
    /// more when it holds strips.
    arcs: Vec<(std::ops::Range<usize>, Vec<usize>)>,
}

impl Order {
    fn read(
        store: &dyn ObjectBackend,
        ring: &Ring,
        (epoch, copies): (u32, usize),
        created: u64,
    ) -> Order {
        let mut by_arc: Vec<(u32, ObjectId)> = (store.list_part(0, 1).into_iter())
            .map(|(oid, _)| (ring.arc_of(oid) as u32, oid))
            .collect();
        by_arc.sort_unstable();
        let mut arcs = Vec::new();
        let mut start = 0;
        for run in by_arc.chunk_by(|a, b| (a.0, a.1.strip_index()) == (b.0, b.1.strip_index())) {
            let arc = run[0].0 as usize;
            let holders = ring.holders_of(arc, run[0].1.strip_index(), copies);
            arcs.push((start..start + run.len(), holders));
            start += run.len();
        }
        Order {
            epoch,
            copies,
            created,
            by_arc,
            arcs,
        }
    }
}

/// The order last read (one epoch's; the next epoch's replaces it), and a lock taken to read
/// it, so that requests arriving together read it once.
#[derive(Default)]
pub(crate) struct Cache {
    last: Mutex<Option<Arc<Order>>>,
    reading: tokio::sync::Mutex<()>,
}

/// Who [`Node::in_ring_order`] works for: a peer ([`Node::background`]) or this node's own
/// plan ([`Node::low_priority`]: it must not take the slots its peers' requests wait for).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum For {
    Peer,
    Me,
}

impl Node {
    /// Runs `f` on `who`'s thread on the store and its objects in the order of epoch `ep`'s
    /// ring with `copies` copies: the order last read if nothing entered the index since,
    /// else read again (and kept for the next asker).
    async fn in_ring_order<T: Send + 'static>(
        &self,
        who: For,
        ep: Arc<Epoch>,
        copies: usize,
        f: impl FnOnce(&dyn ObjectBackend, &Ring, &Order) -> T + Send + 'static,
    ) -> std::io::Result<T> {
        let key = (ep.view.epoch, copies);
        let current = || {
            let created = self.store.created()?;
            let last = self.ring_order.last.lock().unwrap();
            last.clone()
                .filter(|o| (o.epoch, o.copies) == key && o.created == created)
        };
        let order = match current() {
            Some(o) => o,
            None => {
                let _one = self.ring_order.reading.lock().await;
                match current() {
                    Some(o) => o,
                    None => {
                        let (store, ep) = (self.store.clone(), ep.clone());
                        let read = move || {
                            let created = store.created();
                            let o = Order::read(&*store, &ep.ring, key, created.unwrap_or(0));
                            (Arc::new(o), created.is_some())
                        };
                        let (order, counted) = self.run_for(who, read).await?;
                        if counted {
                            *self.ring_order.last.lock().unwrap() = Some(order.clone());
                        }
                        order
                    }
                }
            }
        };
        let store = self.store.clone();
        self.run_for(who, move || f(&*store, &ep.ring, &order))
            .await
    }

    /// Runs `f` on `who`'s thread (see [`For`]).
    async fn run_for<T: Send + 'static>(
        &self,
        who: For,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> std::io::Result<T> {
        match who {
            For::Peer => self.background(f).await,
            For::Me => self.low_priority(f).await,
        }
    }

    /// Part `req.part` of `req.parts` of what the peer asking `req` holds in epoch `ep` (and
    /// the extra objects it names), sorted by id. Asked whole (one part), it is answered whole
    /// only up to [`PAGE_ENTRIES`]: past that, [`Listing::Split`] says in how many parts to
    /// ask. Built at the lowest priority ([`Node::background`]): ten peers listing a node of
    /// a million objects must not slow its reads (bench `scale/read-4k-p99`).
    pub(super) async fn listing_part(
        &self,
        ep: Arc<Epoch>,
        req: ListRequest,
    ) -> std::io::Result<Listing> {
        let listing = if req.parts > 1 {
            // A part of a listing too large for one page (a node holding over a million of
            // the asker's objects: a cluster of few nodes): a pass over that part's shards
            // only, as cheap as reading the order's part.
            let (store, ep, req) = (self.store.clone(), ep.clone(), req.clone());
            self.background(move || {
                let extra: HashSet<ObjectId> = req.extra.iter().copied().collect();
                let mut l = store.list_part(req.part, req.parts);
                l.retain(|(oid, _)| {
                    extra.contains(oid) || ep.ring.holds(req.owner, *oid, req.copies as usize)
                });
                l.sort_unstable_by_key(|(o, _)| *o);
                Listing::Entries(l)
            })
            .await?
        } else {
            let req = req.clone();
            let copies = req.copies as usize;
            (self.in_ring_order(For::Peer, ep.clone(), copies, move |store, ring, order| {
                answer(store, ring, order, &req)
            }))
            .await?
        };
        let Listing::Entries(list) = listing else {
            return Ok(listing);
        };
        let range = shard_range(req.part, req.parts);
        let extra: HashSet<ObjectId> = req.extra.iter().copied().collect();
        Ok(Listing::Entries(self.with_lost(list, |oid| {
            range.contains(&shard_of(oid))
                && (extra.contains(&oid) || ep.ring.holds(req.owner, oid, req.copies as usize))
        })))
    }

    /// What this node holds of each arc of epoch `ep`'s ring that node `owner` holds with
    /// `copies` copies, each arc's entries sorted by id and exactly those a `PeerList` from
    /// `owner` would answer in that arc (lost copies shown lost): see [`Arcs`]. For
    /// [`Arcs::AllUpTo`] holding more entries than it allows, none: the error is in how many
    /// parts a `PeerList` of them would be asked.
    pub(crate) async fn arc_lists(
        &self,
        who: For,
        ep: Arc<Epoch>,
        owner: u64,
        copies: usize,
        which: Arcs,
    ) -> std::io::Result<Result<Vec<(u32, ArcList)>, u32>> {
        let lost = self.recovery.lost_copies();
        self.in_ring_order(who, ep, copies, move |store, ring, order| {
            if let Arcs::AllUpTo(cap) = which {
                let n: usize = order.held_by(ring, owner).map(|(at, _)| at.len()).sum();
                if n > cap {
                    return Err(parts_for(n));
                }
            }
            let mut out = by_arc(store, ring, order, owner, &which);
            for (oid, want) in lost {
                if !ring.holds(owner, oid, copies) {
                    continue;
                }
                let arc = ring.arc_of(oid) as u32;
                let at = match &which {
                    // Every arc asked is in the answer, in the order asked.
                    Arcs::These(_) => out.iter().position(|(a, _)| *a == arc),
                    // Sorted by arc; one with nothing but the lost copy is added.
                    Arcs::All | Arcs::AllUpTo(_) => {
                        match out.binary_search_by_key(&arc, |(a, _)| *a) {
                            Ok(i) => Some(i),
                            Err(i) => {
                                out.insert(i, (arc, Vec::new()));
                                Some(i)
                            }
                        }
                    }
                };
                if let Some(at) = at {
                    super::repair::show_lost(&mut out[at].1, oid, want);
                }
            }
            Ok(out)
        })
        .await
    }
}

/// The most entries a peer's digests stand for in one answer. Past that (a cluster of few
/// nodes of a million objects or more), arcs hold hundreds of thousands of entries each, and
/// digests cost the peer and the asker a hash of every entry to save the fetch of arcs of
/// which most are fetched anyway: the asker lists such a peer whole (2 nodes of 10^6
/// objects, one restarted, planned in 1,017 ms with digests, 759 ms without).
pub(crate) const DIGEST_ENTRIES: usize = PAGE_ENTRIES / 4;

/// Which arcs [`Node::arc_lists`] answers.
#[derive(Debug, Clone)]
pub(crate) enum Arcs {
    /// Every arc with something here, ascending.
    All,
    /// The same, unless they hold more than this many entries.
    AllUpTo(usize),
    /// These arcs, in this order, even empty.
    These(Vec<u32>),
}

/// How many parts to ask for `n` entries: about half a page each, so that uneven parts still
/// fit.
fn parts_for(n: usize) -> u32 {
    let parts = (2 * n as u64).div_ceil(PAGE_ENTRIES as u64);
    parts.clamp(2, INDEX_SHARDS as u64) as u32
}

impl Order {
    /// The arcs with objects here that node `owner` holds: where they are in `by_arc`, and
    /// the arc.
    fn held_by<'a>(
        &'a self,
        ring: &Ring,
        owner: u64,
    ) -> impl Iterator<Item = (std::ops::Range<usize>, u32)> + 'a {
        let owner = ring.nodes().iter().position(|n| n.id == owner);
        (self.arcs.iter())
            .filter(move |(_, holders)| owner.is_some_and(|i| holders.contains(&i)))
            .map(|(at, _)| (at.clone(), self.by_arc[at.start].0))
    }
}

/// [`Node::arc_lists`] without the lost copies: from `order`, states read now.
fn by_arc(
    store: &dyn ObjectBackend,
    ring: &Ring,
    order: &Order,
    owner: u64,
    which: &Arcs,
) -> Vec<(u32, ArcList)> {
    let list = |at: std::ops::Range<usize>| -> ArcList {
        (order.by_arc[at].iter())
            .filter_map(|&(_, oid)| Some((oid, store.meta(oid)?)))
            .collect()
    };
    // An arc's runs held by `owner` follow each other in `by_arc`: their lists, joined, are
    // the arc's sorted by id.
    let mut held: Vec<(u32, ArcList)> = Vec::new();
    for (at, arc) in order.held_by(ring, owner) {
        match held.last_mut() {
            Some((a, l)) if *a == arc => l.extend(list(at)),
            _ => held.push((arc, list(at))),
        }
    }
    match which {
        Arcs::All | Arcs::AllUpTo(_) => held.into_iter().filter(|(_, l)| !l.is_empty()).collect(),
        Arcs::These(arcs) => {
            let held: std::collections::HashMap<u32, ArcList> = held.into_iter().collect();
            (arcs.iter())
                .map(|arc| (*arc, held.get(arc).cloned().unwrap_or_default()))
                .collect()
        }
    }
}

/// The listing `req` asks for, from `order` and the states in `store` now.
fn answer(store: &dyn ObjectBackend, ring: &Ring, order: &Order, req: &ListRequest) -> Listing {
    let owner = ring.nodes().iter().position(|n| n.id == req.owner);
    let range = shard_range(req.part, req.parts);
    let whole = req.parts <= 1;
    let copies = req.copies as usize;
    let mut oids: Vec<ObjectId> = Vec::new();
    for (at, holders) in &order.arcs {
        if owner.is_some_and(|i| holders.contains(&i)) {
            let objs = order.by_arc[at.clone()].iter().map(|(_, oid)| *oid);
            oids.extend(objs.filter(|oid| whole || range.contains(&shard_of(*oid))));
        }
    }
    for &oid in &req.extra {
        if !ring.holds(req.owner, oid, copies) && (whole || range.contains(&shard_of(oid))) {
            oids.push(oid);
        }
    }
    if whole && oids.len() > PAGE_ENTRIES {
        return Listing::Split(parts_for(oids.len()));
    }
    oids.sort_unstable();
    oids.dedup();
    Listing::Entries(
        (oids.into_iter())
            .filter_map(|oid| Some((oid, store.meta(oid)?)))
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use objstore_proto::oid::{ObjIndex, Vid};
    use objstore_proto::view::NodeInfo;

    use super::*;
    use crate::store::{MemStore, Version};

    fn ring(n: u64) -> Ring {
        let nodes: Vec<NodeInfo> = (1..=n)
            .map(|id| NodeInfo {
                id,
                addr: SocketAddr::from(([10, 0, 0, id as u8], 7000)),
                zone: id as u32,
                vnodes: 16,
                incarnation: 1,
            })
            .collect();
        Ring::new(&nodes)
    }

    fn oid(i: u32) -> ObjectId {
        ObjectId::data(Vid(1 + i / 1000), ObjIndex(i % 1000))
    }

    /// Plain data objects, strips' keys (whose holders differ within an arc) and inodes.
    fn key(i: u32) -> ObjectId {
        match i % 4 {
            0 => oid(i).strip((i as usize / 4) % 7),
            1 => ObjectId::inode(Vid(10 + i)),
            _ => oid(i),
        }
    }

    /// What a pass over the whole index keeps for `req`, as the listing was built before.
    fn by_pass(store: &MemStore, ring: &Ring, req: &ListRequest) -> Vec<(ObjectId, ObjState)> {
        let range = shard_range(req.part, req.parts);
        let mut v = store.list();
        v.retain(|(o, _)| {
            range.contains(&shard_of(*o))
                && (req.extra.contains(o) || ring.holds(req.owner, *o, req.copies as usize))
        });
        v
    }

    fn entries(l: Listing) -> Vec<(ObjectId, ObjState)> {
        match l {
            Listing::Entries(v) => v,
            Listing::Split(p) => panic!("split in {p}"),
        }
    }

    /// For every asker, part and set of extra objects, the ring order answers what a pass
    /// over the index answers; after objects come and go it answers for the store as it is
    /// once read again, which `created` says when to do.
    #[test]
    fn answers_as_a_pass_over_the_index_would() {
        let store = MemStore::default();
        let ring = ring(7);
        for i in 0..3000 {
            store.write(key(i), 0, &[1], None, Version(1)).unwrap();
        }
        let order = Order::read(&store, &ring, (1, 3), store.created().unwrap());
        let check = |order: &Order| {
            for owner in [1, 4, 7, 99] {
                for (part, parts) in [(0, 1), (0, 3), (2, 3)] {
                    for extra in [vec![], vec![key(5), key(2999), oid(7777), key(8)]] {
                        let req = ListRequest {
                            owner,
                            copies: 3,
                            part,
                            parts,
                            extra,
                        };
                        let got = entries(answer(&store, &ring, order, &req));
                        assert_eq!(got, by_pass(&store, &ring, &req), "{req:?}");
                    }
                }
            }
        };
        check(&order);
        // Removed objects are skipped at once; a changed state is read fresh.
        store.forget(key(10)).unwrap();
        store.write(key(11), 0, &[2], None, Version(3)).unwrap();
        store.write(key(12), 0, &[2], None, Version(3)).unwrap();
        assert_eq!(store.created(), Some(order.created), "nothing entered");
        check(&order);
        // A new object: the count says the order is stale, and read again it answers right.
        store.write(oid(7777), 0, &[1], None, Version(4)).unwrap();
        assert_ne!(store.created(), Some(order.created));
        check(&Order::read(
            &store,
            &ring,
            (1, 3),
            store.created().unwrap(),
        ));
    }

    /// The arcs of a listing hold, together, what the listing holds: all of them, or asked by
    /// name (an arc not held or empty answers nothing).
    #[test]
    fn arcs_hold_what_the_listing_holds() {
        let store = MemStore::default();
        let ring = ring(7);
        for i in 0..3000 {
            store.write(key(i), 0, &[1], None, Version(1)).unwrap();
        }
        let order = Order::read(&store, &ring, (1, 3), store.created().unwrap());
        for owner in [1, 4, 99] {
            let req = ListRequest {
                owner,
                copies: 3,
                part: 0,
                parts: 1,
                extra: vec![],
            };
            let all = by_arc(&store, &ring, &order, owner, &Arcs::All);
            let mut flat: Vec<_> = all.iter().flat_map(|(_, l)| l.clone()).collect();
            flat.sort_unstable_by_key(|(o, _)| *o);
            assert_eq!(flat, by_pass(&store, &ring, &req), "owner {owner}");
            for (arc, l) in &all {
                assert!(!l.is_empty());
                assert!(l.iter().all(|(o, _)| ring.arc_of(*o) as u32 == *arc));
                assert!(l.windows(2).all(|w| w[0].0 < w[1].0), "sorted by id");
            }
            let capped = by_arc(&store, &ring, &order, owner, &Arcs::AllUpTo(usize::MAX));
            assert_eq!(capped, all);
            let mut names: Vec<u32> = all.iter().map(|(a, _)| *a).rev().collect();
            names.push(u32::MAX);
            let named = by_arc(&store, &ring, &order, owner, &Arcs::These(names.clone()));
            assert_eq!(named.len(), names.len());
            assert_eq!(named.last(), Some(&(u32::MAX, Vec::new())));
            let mut back = named[..named.len() - 1].to_vec();
            back.reverse();
            assert_eq!(back, all);
        }
    }
}
