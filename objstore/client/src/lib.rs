//! objstore-client: everything a program needs to use the cluster, and nothing of the node.
//!
//! - [`conn`]: multiplexed connections to nodes; [`transport`]: TCP, or an in-memory network
//!   for tests.
//! - [`backup`]: the delta stream of `dog vdi backup | restore`, its two sides.
//! - [`client`]: the placement-aware client (replica fan-out, retries, stale-epoch refresh).
//! - [`lock`]: VDI attachment locks and generations in the cluster's key-value store.
//! - [`vdi`]: the VDI table, inodes and the [`Vdi`] handle.
//! - [`volume`]: the [`Volume`] trait a VDI implements, and [`MemVolume`] for tests.

pub mod backup;
pub mod client;
pub mod conn;
pub mod lock;
pub mod transport;
pub mod vdi;
pub mod volume;

pub use client::{Client, ClientError, ClientOptions};
pub use objstore_proto::ObjectId;
pub use vdi::{Vdi, VdiError};
pub use volume::{MemVolume, Volume};
