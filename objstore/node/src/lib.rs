//! objstore-node: the storage node `sheep`.
//!
//! - [`store`]: the object backend trait; objects as files (production) or in memory.
//! - [`membership`]: the driver trait and the `local` driver.
//! - [`node`]: a running node (identity, epochs, the membership thread); its `server` answers
//!   requests, its `recovery` brings the node's objects up to each new epoch.
//! - [`health`]: the store's I/O errors counted, unreadable copies restored, fencing.
//! - [`metrics`]: request counters, a registry for others' metrics, Prometheus text over HTTP.
//! - [`testing`]: whole clusters in one process (memory stores, an in-memory network).

pub mod health;
pub mod membership;
pub mod metrics;
pub mod node;
pub mod store;
pub mod testing;

pub use node::gate::{Access, Limits};
pub use node::{Epoch, Node, NodeError, NodeOptions, NodeParts, Running};
pub use objstore_proto::api::{RecoveryState, RecoveryStatus};
