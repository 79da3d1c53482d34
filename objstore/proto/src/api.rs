//! JSON bodies of the administrative operations (format, key-value, status). Data operations
//! carry raw bytes; see docs/wire.md.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

/// `Format` request body.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FormatRequest {
    pub copies: u32,
    /// None: the default for `copies` ([`crate::view::default_min_copies`]).
    #[serde(default)]
    pub min_copies: Option<u32>,
    pub object_size: u64,
}

/// `KvCas` request body: replace `key` if it still holds `expected` (`None` = absent); a `None`
/// `new` deletes it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KvCasRequest {
    pub key: String,
    pub expected: Option<String>,
    pub new: Option<String>,
}

/// `KvCasLeased` request body: like [`KvCasRequest`], with a value (never a delete) bound to
/// lease `lease`; refused (`Conflict`) also when the lease ended.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KvCasLeasedRequest {
    pub key: String,
    pub expected: Option<String>,
    pub new: String,
    pub lease: u64,
}

/// `LeaseGrant` request body: a lease that ends `ttl_secs` (at least 1) after its last renewal.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LeaseGrantRequest {
    pub ttl_secs: u64,
}

/// `LeaseGrant` response body, and `LeaseKeepalive` and `LeaseRevoke` request body.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseId {
    pub lease: u64,
}

/// `NodeStatus` response body.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeStatus {
    pub id: u64,
    pub addr: SocketAddr,
    pub zone: u32,
    pub vnodes: u32,
    pub epoch: u32,
    pub objects: usize,
    pub disk_total: u64,
    pub disk_free: u64,
    pub recovery: RecoveryStatus,
    /// Milliseconds left of the node's membership lease (etcd): past 0 it serves no I/O until
    /// it reaches etcd again. None: the driver has no lease (local).
    #[serde(default)]
    pub lease_left_ms: Option<i64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum RecoveryState {
    #[default]
    Planning,
    Recovering,
    /// Recovered; waiting for every owner before dropping objects this node no longer owns.
    Collecting,
    Done,
    /// Some objects may have newer copies only on nodes that are down: their I/O waits.
    Waiting,
}

/// What `dog node recovery` shows.
#[derive(Debug, Clone, Serialize, Deserialize, Default)]
pub struct RecoveryStatus {
    pub epoch: u32,
    pub state: RecoveryState,
    pub total: u64,
    pub done: u64,
    pub failed: u64,
    pub removed: u64,
    /// Objects this node must not serve yet: their newest version may be on nodes that are
    /// down (see `waiting_for`).
    #[serde(default)]
    pub incomplete: u64,
    /// Nodes that may hold newer copies than any node up, when some objects wait for them.
    #[serde(default)]
    pub waiting_for: Vec<SocketAddr>,
    /// The newest epoch in which those nodes could have acknowledged writes.
    #[serde(default)]
    pub waiting_epoch: u32,
    /// Objects since this node started whose data it lost with a failed `fdatasync` while no
    /// other node held that data: it kept what remained (see docs/architecture.md,
    /// "Consistency").
    #[serde(default)]
    pub data_lost: u64,
}
