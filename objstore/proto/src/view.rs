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

impl ClusterInfo {
    /// Fewer nodes or zones than copies: writes go to as many as exist.
    pub fn degraded(&self) -> bool {
        match self.config {
            Some(c) => self.view.zones() < c.copies as usize,
            None => false,
        }
    }
}
