//! What a cluster looks like at one epoch: its nodes, its format, and the summary a node
//! hands to clients. Plain data, shared by placement, the wire protocol, nodes and clients.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

/// One node of a membership view.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    /// Stable id, kept in the node's data directory.
    pub id: u64,
    pub addr: SocketAddr,
    /// Failure domain: copies of one object go to distinct zones where there are enough.
    pub zone: u32,
    /// Virtual nodes on the ring (the node's weight).
    pub vnodes: u32,
    /// Changes at every start, so a restart is a membership change even if it is quick.
    pub incarnation: u64,
}

/// A membership epoch: every change makes a new one with the full node list (sorted by id).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct View {
    pub epoch: u32,
    pub nodes: Vec<NodeInfo>,
}

impl View {
    pub fn node(&self, id: u64) -> Option<&NodeInfo> {
        self.nodes.iter().find(|n| n.id == id)
    }

    /// Number of distinct zones.
    pub fn zones(&self) -> usize {
        let mut z: Vec<u32> = self.nodes.iter().map(|n| n.zone).collect();
        z.sort_unstable();
        z.dedup();
        z.len()
    }
}

/// Set once by `dog cluster format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterConfig {
    pub copies: u32,
    /// Live owners a write needs (0 in a format written before it existed: the default).
    #[serde(default)]
    pub min_copies: u32,
    pub object_size: u32,
    /// Unix seconds.
    pub formatted_at: u64,
    /// How new VDIs keep their data objects unless they say otherwise: an erasure code set
    /// by `dog cluster format --copies x:y` (inodes then keep `copies` = y + 1 full copies);
    /// None: `copies` full copies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vdi_redundancy: Option<crate::redundancy::Redundancy>,
}

pub const DEFAULT_OBJECT_SIZE: u32 = 4 << 20;
pub const MIN_OBJECT_SIZE: u32 = 1 << 20;
pub const MAX_OBJECT_SIZE: u32 = 64 << 20;
pub const MAX_COPIES: u32 = 31;

/// The default minimum of live owners for writes, as Ceph's `min_size`: a majority of the
/// copies (2 of 3, 1 of 2, 1 of 1).
pub fn default_min_copies(copies: u32) -> u32 {
    copies - copies / 2
}

impl ClusterConfig {
    /// How a new VDI keeps its data objects by default.
    pub fn default_redundancy(&self) -> crate::redundancy::Redundancy {
        self.vdi_redundancy
            .unwrap_or(crate::redundancy::Redundancy::Copies(self.copies))
    }

    /// Live owners of an object a write needs; below it writes wait.
    pub fn min_copies(&self) -> u32 {
        if self.min_copies == 0 {
            default_min_copies(self.copies)
        } else {
            self.min_copies
        }
    }

    /// Checks a requested format; the error names what is wrong.
    pub fn validate(copies: u32, min_copies: u32, object_size: u64) -> Result<(), String> {
        if copies == 0 || copies > MAX_COPIES {
            return Err(format!("copies must be 1 to {MAX_COPIES}, not {copies}"));
        }
        if min_copies == 0 || min_copies > copies {
            return Err(format!(
                "min-copies must be 1 to the number of copies ({copies}), not {min_copies}"
            ));
        }
        if !object_size.is_power_of_two()
            || object_size < MIN_OBJECT_SIZE as u64
            || object_size > MAX_OBJECT_SIZE as u64
        {
            return Err(format!(
                "object size must be a power of two from 1 MiB to 64 MiB, not {object_size} bytes"
            ));
        }
        Ok(())
    }
}

/// What a node tells clients about the cluster (opcode `ClusterInfo`, JSON).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterInfo {
    pub cluster_id: String,
    pub config: Option<ClusterConfig>,
    pub view: View,
    /// The membership driver, for people (`etcd://...`, `local:...`); empty from old nodes.
    #[serde(default)]
    pub membership: String,
}

/// Most virtual nodes one node may have (`sheep --vnodes`).
pub const MAX_VNODES: u32 = 65536;
/// Most ring points (virtual nodes of all nodes) a view may make: a bound on what a client
/// builds from a node's answer.
pub const MAX_RING_POINTS: u64 = 1 << 22;

impl ClusterInfo {
    /// Refuses a cluster description no node sends (a corrupted or hostile answer) before a
    /// client builds anything from it: a bad format, a node without or with too many virtual
    /// nodes, a ring too large, or two nodes with one id.
    pub fn check(&self) -> Result<(), String> {
        if let Some(c) = &self.config {
            let min = if c.min_copies == 0 {
                default_min_copies(c.copies)
            } else {
                c.min_copies
            };
            ClusterConfig::validate(c.copies, min, c.object_size as u64)?;
            if let Some(r) = c.vdi_redundancy {
                r.validate(0, usize::MAX)?;
            }
        }
        let mut points = 0u64;
        let mut ids: Vec<u64> = Vec::with_capacity(self.view.nodes.len());
        for n in &self.view.nodes {
            if n.vnodes == 0 || n.vnodes > MAX_VNODES {
                return Err(format!(
                    "node {} ({}) has {} virtual nodes, not 1 to {MAX_VNODES}",
                    n.id, n.addr, n.vnodes
                ));
            }
            points += n.vnodes as u64;
            ids.push(n.id);
        }
        if points > MAX_RING_POINTS {
            return Err(format!(
                "the view's {} nodes have {points} virtual nodes in all, more than {MAX_RING_POINTS}",
                self.view.nodes.len()
            ));
        }
        ids.sort_unstable();
        if let Some(w) = ids.windows(2).find(|w| w[0] == w[1]) {
            return Err(format!("two nodes of the view have id {}", w[0]));
        }
        Ok(())
    }

    /// Fewer nodes or zones than copies: writes go to as many as exist.
    pub fn degraded(&self) -> bool {
        match self.config {
            Some(c) => self.view.zones() < c.copies as usize,
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(vnodes: &[u32]) -> ClusterInfo {
        ClusterInfo {
            cluster_id: "c".into(),
            config: None,
            view: View {
                epoch: 1,
                nodes: vnodes
                    .iter()
                    .enumerate()
                    .map(|(i, &v)| NodeInfo {
                        id: i as u64,
                        addr: SocketAddr::from(([127, 0, 0, 1], 7000 + i as u16)),
                        zone: 0,
                        vnodes: v,
                        incarnation: 1,
                    })
                    .collect(),
            },
            membership: String::new(),
        }
    }

    /// A client builds its ring from a node's answer: a hostile or corrupted one must not make
    /// it allocate without bound (4 billion virtual nodes would be 64 GiB of ring).
    #[test]
    fn check_refuses_views_no_node_sends() {
        assert_eq!(info(&[128, 128, 64]).check(), Ok(()));
        assert!(info(&[u32::MAX])
            .check()
            .unwrap_err()
            .contains("virtual nodes"));
        assert!(info(&[0]).check().unwrap_err().contains("virtual nodes"));
        let big = vec![MAX_VNODES; 65];
        assert!(info(&big).check().unwrap_err().contains("in all"));
        let mut twins = info(&[1, 1]);
        twins.view.nodes[1].id = 0;
        assert!(twins.check().unwrap_err().contains("id 0"));
        let mut bad_format = info(&[1]);
        bad_format.config = Some(ClusterConfig {
            copies: 0,
            min_copies: 0,
            object_size: 4 << 20,
            formatted_at: 0,
            vdi_redundancy: None,
        });
        assert!(bad_format.check().unwrap_err().contains("copies"));
        bad_format.config = Some(ClusterConfig {
            copies: 3,
            vdi_redundancy: Some(crate::redundancy::Redundancy::Ec { data: 1, parity: 9 }),
            ..bad_format.config.unwrap()
        });
        assert!(bad_format.check().unwrap_err().contains("data strips"));
    }
}
