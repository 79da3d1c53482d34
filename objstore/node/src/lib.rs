//! objstore-node: the storage node `sheep`.
//!
//! - [`store`]: objects as files on the node's disk.
//! - [`membership`]: the driver trait and the `local` driver.
//! - [`node`]: a running node (identity, epochs, the membership thread); `server` answers
//!   requests, `recovery` brings the node's objects up to each new epoch.

pub mod membership;
pub mod node;
mod recovery;
mod server;
pub mod store;

pub use node::{Epoch, Node, NodeError, NodeOptions, Running};
pub use objstore_proto::api::{RecoveryState, RecoveryStatus};
