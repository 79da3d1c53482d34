//! Placement: which nodes hold an object, as a pure function of (object id, membership).
//!
//! Consistent hashing over virtual nodes. Node `n` puts `n.vnodes` points on a 64-bit ring at
//! `blake3(n.id ‖ i)`; an object hashes to `blake3(oid)` and goes to the first `copies` distinct
//! nodes met walking clockwise from there, skipping nodes whose zone already holds a copy. When
//! there are fewer zones than copies, a second walk fills the rest with distinct nodes of any
//! zone; with fewer nodes than copies every node holds one. `docs/placement.md` has measurements.

use crate::oid::ObjectId;
use crate::view::NodeInfo;

/// A ring built from one membership view. Cheap to query; rebuild it when the view changes.
#[derive(Debug, Clone)]
pub struct Ring {
    /// (point, node index), sorted by point then node id.
    points: Vec<(u64, u32)>,
    nodes: Vec<NodeInfo>,
}

fn hash64(bytes: &[u8]) -> u64 {
    let h = blake3::hash(bytes);
    u64::from_be_bytes(h.as_bytes()[..8].try_into().unwrap())
}

/// Position of virtual node `i` of node `id`.
pub fn vnode_point(id: u64, i: u32) -> u64 {
    let mut b = [0u8; 12];
    b[..8].copy_from_slice(&id.to_be_bytes());
    b[8..].copy_from_slice(&i.to_be_bytes());
    hash64(&b)
}

/// Position of an object on the ring.
pub fn object_point(oid: ObjectId) -> u64 {
    hash64(&oid.0.to_be_bytes())
}

impl Ring {
    pub fn new(nodes: &[NodeInfo]) -> Ring {
        let mut points = Vec::with_capacity(nodes.iter().map(|n| n.vnodes as usize).sum());
        for (idx, n) in nodes.iter().enumerate() {
            for i in 0..n.vnodes {
                points.push((vnode_point(n.id, i), idx as u32));
            }
        }
        points.sort_unstable_by_key(|&(p, idx)| (p, nodes[idx as usize].id));
        Ring {
            points,
            nodes: nodes.to_vec(),
        }
    }

    pub fn nodes(&self) -> &[NodeInfo] {
        &self.nodes
    }

    /// Indices (into [`Ring::nodes`]) of the nodes holding `oid`, primary first.
    pub fn replica_indices(&self, oid: ObjectId, copies: usize) -> Vec<usize> {
        let want = copies.min(self.nodes.len());
        let mut chosen: Vec<usize> = Vec::with_capacity(want);
        if want == 0 || self.points.is_empty() {
            return chosen;
        }
        let h = object_point(oid);
        let start = self.points.partition_point(|&(p, _)| p < h);
        let n = self.points.len();
        let walk = (0..n).map(|k| self.points[(start + k) % n].1 as usize);
        let mut zones: Vec<u32> = Vec::with_capacity(want);
        for idx in walk.clone() {
            if chosen.len() == want {
                return chosen;
            }
            let zone = self.nodes[idx].zone;
            if !chosen.contains(&idx) && !zones.contains(&zone) {
                chosen.push(idx);
                zones.push(zone);
            }
        }
        for idx in walk {
            if chosen.len() == want {
                break;
            }
            if !chosen.contains(&idx) {
                chosen.push(idx);
            }
        }
        chosen
    }

    /// The nodes holding `oid`, primary first.
    pub fn replicas(&self, oid: ObjectId, copies: usize) -> Vec<&NodeInfo> {
        self.replica_indices(oid, copies)
            .into_iter()
            .map(|i| &self.nodes[i])
            .collect()
    }

    /// Whether node `id` is among the holders of `oid`.
    pub fn holds(&self, id: u64, oid: ObjectId, copies: usize) -> bool {
        self.replica_indices(oid, copies)
            .into_iter()
            .any(|i| self.nodes[i].id == id)
    }
}
