//! JSON bodies of the administrative operations (format, key-value, status). Data operations
//! carry raw bytes; see docs/wire.md.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::node::RecoveryStatus;

/// `Format` request body.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FormatRequest {
    pub copies: u32,
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
}
