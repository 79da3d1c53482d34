//! The scale harness (issue 43): a [`MemCluster`] of real nodes on metadata-only stores
//! ([`MetaStore`]: versions, no bytes), filled with millions of objects where the ring places
//! them, then taken through epoch changes (a node joins, a node dies) while it measures what
//! each node's recovery plan cost: listing entries fetched (17 bytes each on the wire),
//! requests sent, planning time, and how long until every node recovered.
//!
//! Used by `objstore/node/tests/scale.rs` (the bounds that must hold) and `bench run --only
//! scale` (the figures against nodes and objects per node).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use objstore_proto::api::RecoveryStatus;
use objstore_proto::{ObjIndex, ObjectId, Vid};

use super::MemCluster;
use crate::store::meta::MetaStore;
use crate::store::{ObjState, Version};
use crate::{Epoch, Node};

/// A node's membership lease: hundreds of nodes sharing two cores miss heartbeats of the
/// default 5 s while they plan, and membership then churns (at 100 nodes, hundreds of epochs
/// a minute, and no epoch change ever finished). A killed node is seen gone after it.
pub const LEASE_TTL: Duration = Duration::from_secs(30);

/// Objects of one VDI in the harness (its ids are `data(vid, index)`).
const PER_VDI: u64 = 1 << 20;

/// A harness cluster's shape.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub nodes: usize,
    /// Objects in all (each stored `copies` times).
    pub objects: u64,
    pub copies: u32,
}

/// The cost of one epoch change, per node and in all.
#[derive(Debug, Clone)]
pub struct EpochCost {
    /// What changed: "join", "kill" or "restart".
    pub event: &'static str,
    pub epoch: u32,
    pub nodes: usize,
    /// Each node's plan of the epoch, in node order (nodes up only).
    pub plans: Vec<RecoveryStatus>,
    /// Objects each node owns in the epoch, in the same order.
    pub owned: Vec<u64>,
    /// From the change until every node saw the new membership.
    pub members_in: Duration,
    /// From the change until every node recovered the epoch.
    pub recovered_in: Duration,
}

impl EpochCost {
    /// Listing entries fetched by all nodes.
    pub fn entries(&self) -> u64 {
        self.plans.iter().map(|p| p.plan_entries).sum()
    }
    /// Arc digests fetched by all nodes.
    pub fn digests(&self) -> u64 {
        self.plans.iter().map(|p| p.plan_digests).sum()
    }
    /// Bytes of listings fetched by all nodes: entries of 17 bytes, digests of 24.
    pub fn bytes(&self) -> u64 {
        17 * self.entries() + 24 * self.digests()
    }
    /// Listing requests sent by all nodes.
    pub fn requests(&self) -> u64 {
        self.plans.iter().map(|p| p.plan_requests).sum()
    }
    /// The slowest plan.
    pub fn max_plan_ms(&self) -> u64 {
        self.plans.iter().map(|p| p.plan_ms).max().unwrap_or(0)
    }
    /// Entries fetched per object owned, over all nodes.
    pub fn entries_per_owned(&self) -> f64 {
        self.entries() as f64 / self.owned.iter().sum::<u64>().max(1) as f64
    }
}

/// A running harness cluster.
pub struct Harness {
    pub cluster: MemCluster,
    pub shape: Shape,
    pub rt: tokio::runtime::Runtime,
    stores: Vec<Arc<MetaStore>>,
}

/// Object `i` of the harness.
pub fn object(i: u64) -> ObjectId {
    ObjectId::data(
        Vid(1 + (i / PER_VDI) as u32),
        ObjIndex((i % PER_VDI) as u32),
    )
}

impl Harness {
    /// Starts `shape.nodes` nodes, formats the cluster and puts every object on its owners at
    /// one version (as if written in the format's epoch).
    pub fn start(shape: Shape) -> Harness {
        let stores: Vec<Arc<MetaStore>> = (0..shape.nodes).map(|_| Arc::default()).collect();
        let cluster = MemCluster::start_meta(stores.clone(), LEASE_TTL).expect("start the nodes");
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        let client = cluster.client_on(&rt, Duration::from_secs(30));
        rt.block_on(client.format(shape.copies, None, 4 << 20))
            .expect("format");
        let h = Harness {
            cluster,
            shape,
            rt,
            stores,
        };
        h.fill();
        h
    }

    fn fill(&self) {
        let node = self.cluster.node(0).expect("node 0 is up").clone();
        let addrs: Vec<SocketAddr> = (0..self.stores.len())
            .map(|i| self.cluster.addr(i))
            .collect();
        fill(&self.stores, &addrs, &node.epoch(), self.shape);
    }

    /// Adds a node with an empty store and measures the epoch change.
    pub fn join(&mut self) -> EpochCost {
        let store: Arc<MetaStore> = Arc::default();
        self.stores.push(store.clone());
        let i = self.cluster.add_node_on(store);
        let started = Instant::now();
        self.cluster.start_node(i).expect("start the new node");
        self.measure("join", started)
    }

    /// Starts node `i` again (on its store as it was) and measures the epoch change.
    pub fn restart(&mut self, i: usize) -> EpochCost {
        let started = Instant::now();
        self.cluster.start_node(i).expect("restart the node");
        self.measure("restart", started)
    }

    /// Node `i`'s store.
    pub fn store(&self, i: usize) -> &Arc<MetaStore> {
        &self.stores[i]
    }

    /// Kills node `i` and measures the epoch change.
    pub fn kill(&mut self, i: usize) -> EpochCost {
        let started = Instant::now();
        self.cluster.kill(i);
        self.measure("kill", started)
    }

    fn up(&self) -> Vec<usize> {
        (0..self.stores.len())
            .filter(|&i| self.cluster.node(i).is_some())
            .collect()
    }

    /// Waits until every node up is in one epoch with all of them and recovered it.
    fn measure(&self, event: &'static str, started: Instant) -> EpochCost {
        let up = self.up();
        let within = Duration::from_secs(600);
        self.cluster.wait_members_within(up.len(), within);
        let members_in = started.elapsed();
        self.cluster.wait_recovered_within(within);
        let recovered_in = started.elapsed();
        let nodes: Vec<(SocketAddr, &Node)> = up
            .iter()
            .map(|&i| (self.cluster.addr(i), &**self.cluster.node(i).unwrap()))
            .collect();
        cost(event, &nodes, self.shape, members_in, recovered_in)
    }
}

/// Puts every object of `shape` on the nodes `ep`'s ring gives it, at version 1 of the epoch,
/// empty (a pull then moves a version, not 4 MiB of zeros). Node `i` of `stores` is the one
/// at `addrs[i]`.
pub fn fill(stores: &[Arc<MetaStore>], addrs: &[SocketAddr], ep: &Epoch, shape: Shape) {
    let version = Version(((ep.view.epoch as u64) << 32) | 1);
    let index: Vec<usize> = (ep.ring.nodes().iter())
        .map(|n| {
            (addrs.iter().position(|&a| a == n.addr))
                .expect("every node of the ring is a harness node")
        })
        .collect();
    let mut per: Vec<Vec<(ObjectId, ObjState)>> = vec![Vec::new(); stores.len()];
    for i in 0..shape.objects {
        let oid = object(i);
        for k in ep.ring.replica_indices(oid, shape.copies as usize) {
            per[index[k]].push((oid, ObjState::live(version)));
        }
    }
    for (store, objs) in stores.iter().zip(per) {
        store.fill(objs, 0);
    }
}

/// The cost of the epoch change `nodes` (each node up, by address) have all recovered: each
/// one's plan, and the objects of `shape` it owns in the epoch.
pub fn cost(
    event: &'static str,
    nodes: &[(SocketAddr, &Node)],
    shape: Shape,
    members_in: Duration,
    recovered_in: Duration,
) -> EpochCost {
    let ep = nodes[0].1.epoch();
    let copies = shape.copies as usize;
    let mut by_ring = vec![0u64; ep.ring.nodes().len()];
    for k in 0..shape.objects {
        for r in ep.ring.replica_indices(object(k), copies) {
            by_ring[r] += 1;
        }
    }
    let owned = (nodes.iter())
        .map(|(addr, _)| {
            let r = ep.ring.nodes().iter().position(|n| n.addr == *addr);
            r.map_or(0, |r| by_ring[r])
        })
        .collect();
    EpochCost {
        event,
        epoch: ep.view.epoch,
        nodes: nodes.len(),
        plans: nodes.iter().map(|(_, n)| n.recovery_status()).collect(),
        owned,
        members_in,
        recovered_in,
    }
}
