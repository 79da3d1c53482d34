//! objstore-node: the storage node `sheep`.
//!
//! - [`store`]: the object backend trait; objects as files (production) or in memory.
//! - [`membership`]: the driver trait and the `local` driver.
//! - [`node`]: a running node (identity, epochs, the membership thread); `server` answers
//!   requests, `recovery` brings the node's objects up to each new epoch.
//! - [`testing`]: whole clusters in one process (memory stores, an in-memory network).

pub mod membership;
pub mod node;
mod recovery;
mod server;
pub mod store;
pub mod testing;

pub use node::{Epoch, Node, NodeError, NodeOptions, NodeParts, Running};
pub use objstore_proto::api::{RecoveryState, RecoveryStatus};
