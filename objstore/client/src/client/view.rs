//! The cluster as a client last saw it: the node's answer to `ClusterInfo` and the placement
//! ring built from it.

use std::net::SocketAddr;
use std::sync::Arc;

use objstore_proto::oid::ObjectId;
use objstore_proto::placement::Ring;
use objstore_proto::view::{ClusterConfig, ClusterInfo};

use super::ClientError;

/// The cluster as this client last saw it.
pub struct ClusterView {
    pub info: ClusterInfo,
    pub ring: Ring,
}

impl ClusterView {
    pub(super) fn new(info: ClusterInfo) -> Arc<ClusterView> {
        Arc::new(ClusterView {
            ring: Ring::new(&info.view.nodes),
            info,
        })
    }

    pub fn epoch(&self) -> u32 {
        self.info.view.epoch
    }

    pub fn config(&self) -> Result<ClusterConfig, ClientError> {
        self.info.config.ok_or(ClientError::NotFormatted)
    }

    /// Addresses of the replicas of `oid`, primary first.
    pub fn replicas(&self, oid: ObjectId) -> Result<Vec<SocketAddr>, ClientError> {
        let copies = self.config()?.copies as usize;
        Ok(self
            .ring
            .replicas(oid, copies)
            .iter()
            .map(|n| n.addr)
            .collect())
    }
}
