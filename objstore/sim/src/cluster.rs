//! The simulated cluster: every node inline (no OS thread) in the one runtime, on a
//! [`MemStore`], the simulator's [`MemNetwork`] and one [`MemMembership`].
//!
//! A crash cuts the node off the network (all its connections reset, it cannot connect or be
//! connected to), ends its ticker, recovery and accept tasks, and keeps only what its store
//! had made durable ([`MemStore::crashed`]). A restart brings it back on that state with the
//! same id and a new incarnation, as `sheep` restarting on its directory would.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use objstore_client::transport::MemNetwork;
use objstore_node::membership::MemMembership;
use objstore_node::store::meta::MetaStore;
use objstore_node::store::{MemStore, ObjectBackend};
use objstore_node::{Node, NodeError, NodeOptions, NodeParts, RecoveryState, Running};
use objstore_proto::cowrec::{self, CowRecord};
use objstore_proto::oid::ObjectId;

/// One node of the simulated cluster.
pub struct SimNode {
    pub addr: SocketAddr,
    pub id: u64,
    pub store: Arc<MemStore>,
    /// A metadata-only store the node runs on instead of `store` (the scale runs: versions,
    /// no bytes; every change durable at once, so a crash keeps it whole).
    pub meta: Option<Arc<MetaStore>>,
    running: Option<Running>,
}

impl SimNode {
    pub fn is_up(&self) -> bool {
        self.running.is_some()
    }

    pub fn node(&self) -> Option<&Arc<Node>> {
        self.running.as_ref().map(|r| &r.node)
    }
}

pub struct SimCluster {
    pub net: MemNetwork,
    pub membership: MemMembership,
    pub nodes: Vec<SimNode>,
}

/// Node `i`'s address.
pub fn node_addr(i: usize) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, i as u8 + 1], 7000))
}

impl SimCluster {
    /// A cluster of nodes with the given ids, none started yet.
    pub fn new(net: MemNetwork, ids: &[u64]) -> SimCluster {
        SimCluster {
            net,
            membership: MemMembership::new("sim"),
            nodes: ids
                .iter()
                .enumerate()
                .map(|(i, &id)| SimNode {
                    addr: node_addr(i),
                    id,
                    store: Arc::new(MemStore::default()),
                    meta: None,
                    running: None,
                })
                .collect(),
        }
    }

    /// A new node with id `id` on the metadata-only `store`, down; returns its index.
    pub fn add_meta_node(&mut self, id: u64, store: Arc<MetaStore>) -> usize {
        let i = self.nodes.len();
        assert!(i < 255, "a simulated cluster has at most 255 nodes");
        self.nodes.push(SimNode {
            addr: node_addr(i),
            id,
            store: Arc::new(MemStore::default()),
            meta: Some(store),
            running: None,
        });
        i
    }

    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.nodes.iter().map(|n| n.addr).collect()
    }

    /// Starts node `i` (down) on its store with a new incarnation.
    pub async fn start(
        &mut self,
        i: usize,
        incarnation: u64,
        vnodes: u32,
    ) -> Result<(), NodeError> {
        let n = &mut self.nodes[i];
        if n.running.is_some() {
            return Ok(());
        }
        self.net.revive(n.addr);
        let listener = self.net.listen(n.addr).map_err(|source| NodeError::Bind {
            addr: n.addr,
            source,
        })?;
        let opts = NodeOptions {
            // Never touched: the identity is given and the store is in memory.
            dir: PathBuf::from(format!("/nonexistent/objstore-sim/node{i}")),
            listen: n.addr,
            cluster: "memory".into(),
            zone: None,
            vnodes,
            pull_delay: Duration::ZERO,
            // Every acknowledged change drops its undos: the workload's writes are small.
            settle_from: 0,
            driver_opts: Default::default(),
            // The nemesis fails flushes on purpose: counted, never fenced.
            health: objstore_node::health::HealthOptions::never_fenced(),
            scrub: Default::default(),
            access: Default::default(),
        };
        let parts = NodeParts {
            store: Some(match &n.meta {
                Some(m) => m.clone() as Arc<dyn ObjectBackend>,
                None => n.store.clone(),
            }),
            listener: Some(listener),
            driver: Some(Arc::new(self.membership.driver())),
            identity: Some((n.id, incarnation)),
            inline: true,
            ..NodeParts::new(Arc::new(self.net.endpoint(n.addr)))
        };
        n.running = Some(Node::start_with(opts, parts).await?);
        Ok(())
    }

    /// Crashes node `i` (see the module documentation); false if it was down.
    pub fn crash(&mut self, i: usize) -> bool {
        self.halt(i, MemStore::crashed)
    }

    /// Crashes node `i` as a power cut that wrote back some of what it had not synced, in an
    /// order `rng` picks ([`MemStore::power_cut`]); false if it was down.
    pub fn power_cut(&mut self, i: usize, rng: &mut impl rand::Rng) -> bool {
        self.halt(i, |s| s.power_cut(rng))
    }

    fn halt(&mut self, i: usize, left: impl FnOnce(&MemStore) -> MemStore) -> bool {
        let n = &mut self.nodes[i];
        let Some(running) = n.running.take() else {
            return false;
        };
        self.net.kill(n.addr);
        running.halt();
        n.store = Arc::new(left(&n.store));
        true
    }

    pub fn up(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|&i| self.nodes[i].is_up())
            .collect()
    }

    /// Whether every node is up, in the newest epoch with all nodes, and done recovering it.
    pub fn settled(&self) -> bool {
        let latest = self.membership.latest();
        latest.nodes.len() == self.nodes.len()
            && self.nodes.iter().all(|n| {
                n.node().is_some_and(|node| {
                    let s = node.recovery_status();
                    node.epoch().view.epoch == latest.epoch
                        && s.epoch == latest.epoch
                        && s.state == RecoveryState::Done
                })
            })
    }

    /// Each owner's copy of `oid` in the newest epoch (None: not held), as (node index, bytes
    /// without trailing zeros: an object's length says nothing). A partial copy-on-write
    /// target's absent blocks (its record past `object_size` says which) are zeroed: no read
    /// ever returns their bytes, and a fill that failed after writing its blocks but before
    /// marking them leaves them there. Call when settled.
    /// Where the strips of erasure-coded object `oid` on their holders (in the newest view)
    /// break the stripe: not all at one version, or parity that does not match the data.
    /// None for a whole stripe, or an object never written.
    pub fn stripe_divergence(
        &self,
        oid: ObjectId,
        scheme: objstore_proto::redundancy::Redundancy,
        object_size: u64,
    ) -> Option<String> {
        let node = self.nodes.iter().find_map(|n| n.node())?;
        let ep = node.epoch();
        let codec = objstore_proto::ec::Codec::new(scheme, object_size).ok()?;
        let mut strips = Vec::new();
        let mut states = Vec::new();
        for k in 0..codec.strips() {
            let holder = ep.ring.strip_holder(oid, k)?;
            let id = ep.ring.nodes()[holder].id;
            let i = self.nodes.iter().position(|n| n.id == id)?;
            let key = oid.strip(k);
            let state = self.nodes[i].store.meta(key);
            let mut bytes = match state {
                Some(s) if !s.deleted => self.nodes[i].store.read_whole(key).ok()?.0,
                _ => Vec::new(),
            };
            bytes.resize(codec.strip_len(), 0);
            states.push((i, state.map(|s| (s.version, s.deleted))));
            strips.push(bytes);
        }
        if states.iter().all(|(_, s)| s.is_none()) {
            return None;
        }
        if states.windows(2).any(|w| w[0].1 != w[1].1) {
            return Some(format!("strips at {states:?}"));
        }
        let parity = codec.parity_of(&strips[..codec.data()]).ok()?;
        (parity[..] != strips[codec.data()..])
            .then(|| format!("parity does not match the data (strips at {states:?})"))
    }

    pub fn owner_copies(
        &self,
        oid: ObjectId,
        copies: usize,
        object_size: u64,
    ) -> Vec<(usize, Option<Vec<u8>>)> {
        let Some(node) = self.nodes.iter().find_map(|n| n.node()) else {
            return Vec::new();
        };
        let ep = node.epoch();
        ep.ring
            .replicas(oid, copies)
            .iter()
            .filter_map(|info| self.nodes.iter().position(|n| n.id == info.id))
            .map(|i| {
                let copy = self.nodes[i].store.read_whole(oid).ok().map(|(mut d, _)| {
                    let record = d.get(object_size as usize..).unwrap_or(&[]);
                    if let Some(rec) = CowRecord::decode(record, object_size) {
                        for b in 0..cowrec::blocks(object_size) {
                            if !rec.present(b) {
                                let lo = (b * cowrec::BLOCK) as usize;
                                let hi = (lo + cowrec::BLOCK as usize).min(d.len());
                                if let Some(s) = d.get_mut(lo..hi) {
                                    s.fill(0);
                                }
                            }
                        }
                    }
                    let len = d.iter().rposition(|&b| b != 0).map_or(0, |p| p + 1);
                    d.truncate(len);
                    d
                });
                (i, copy)
            })
            .collect()
    }
}
