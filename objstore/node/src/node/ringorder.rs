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
    /// Each arc with objects here: where its objects are in `by_arc`, and its holders (node
    /// indexes of the ring, `copies` of them).
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
        for run in by_arc.chunk_by(|a, b| a.0 == b.0) {
            let arc = run[0].0 as usize;
            arcs.push((start..start + run.len(), ring.arc_holders(arc, copies)));
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

/// The order last read (one epoch's; the next epoch's replaces it).
#[derive(Default)]
pub(crate) struct Cache(Mutex<Option<Arc<Order>>>);

impl Node {
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
        let store = self.store.clone();
        let cached = self.ring_order.0.lock().unwrap().clone();
        let (ep2, req2) = (ep.clone(), req.clone());
        let (listing, fresh) = self
            .background(move || {
                let (ep, req) = (ep2, req2);
                if req.parts > 1 {
                    // A part of a listing too large for one page (a node holding over a
                    // million of the asker's objects: a cluster of few nodes): a pass over
                    // that part's shards only, as cheap as reading the order's part.
                    let extra: HashSet<ObjectId> = req.extra.iter().copied().collect();
                    let mut l = store.list_part(req.part, req.parts);
                    l.retain(|(oid, _)| {
                        extra.contains(oid) || ep.ring.holds(req.owner, *oid, req.copies as usize)
                    });
                    l.sort_unstable_by_key(|(o, _)| *o);
                    return (Listing::Entries(l), None);
                }
                let created = store.created();
                let key = (ep.view.epoch, req.copies as usize);
                let order = match (cached, created) {
                    (Some(o), Some(c)) if (o.epoch, o.copies) == key && o.created == c => o,
                    _ => Arc::new(Order::read(&*store, &ep.ring, key, created.unwrap_or(0))),
                };
                let listing = answer(&*store, &ep.ring, &order, &req);
                (listing, created.is_some().then_some(order))
            })
            .await?;
        if let Some(order) = fresh {
            let mut c = self.ring_order.0.lock().unwrap();
            if c.as_ref().is_none_or(|o| !Arc::ptr_eq(o, &order)) {
                *c = Some(order);
            }
        }
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
        // About half a page a part, so that uneven parts still fit.
        let parts = (2 * oids.len() as u64).div_ceil(PAGE_ENTRIES as u64);
        return Listing::Split(parts.clamp(2, INDEX_SHARDS as u64) as u32);
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
            store.write(oid(i), 0, &[1], None, Version(1)).unwrap();
        }
        let order = Order::read(&store, &ring, (1, 3), store.created().unwrap());
        let check = |order: &Order| {
            for owner in [1, 4, 7, 99] {
                for (part, parts) in [(0, 1), (0, 3), (2, 3)] {
                    for extra in [vec![], vec![oid(5), oid(2999), oid(7777)]] {
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
        store.forget(oid(10)).unwrap();
        store.write(oid(11), 0, &[2], None, Version(3)).unwrap();
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
}
