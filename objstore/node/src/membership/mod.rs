//! Membership drivers: who is in the cluster, at which epoch, and the small cluster-wide
//! key-value store that holds the format and the VDI table.
//!
//! # Contract
//! - [`Driver::join`] registers this node as alive and returns a view that contains it. Every
//!   change of the live node set (a join, a leave, a death, a restart with a new incarnation)
//!   produces exactly one new epoch, numbered one above the last, with the full node list.
//!   Epochs are totally ordered and never reused; [`Driver::view_at`] returns past ones.
//! - [`Driver::tick`] is called by every node about every [`TICK`]. It refreshes this node's
//!   liveness and returns the newest view. A node that stops ticking (killed, hung) is dropped
//!   from the view within [`DEAD_AFTER`] plus one tick; the driver may notice sooner.
//! - [`Driver::leave`] removes this node at once; the next epoch lacks it.
//! - The key-value store is linearizable: [`Driver::kv_cas`] replaces a value only if it still
//!   equals `expected` (`None` = absent), and a `None` new value deletes.
//! - Calls block (file or network I/O); async callers run them on a blocking pool. The
//!   in-memory driver ([`MemMembership`], for the fault simulator) never blocks.

mod local;
mod mem;

use std::time::Duration;

use thiserror::Error;

use objstore_proto::view::{NodeInfo, View};

pub use local::LocalDriver;
pub use mem::{MemDriver, MemMembership};

/// How often nodes call [`Driver::tick`].
pub const TICK: Duration = Duration::from_millis(500);
/// A node silent for this long is dead.
pub const DEAD_AFTER: Duration = Duration::from_millis(2500);

#[derive(Debug, Error)]
#[non_exhaustive]
pub enum DriverError {
    #[error("membership store at {path}: {op} failed")]
    Io {
        path: String,
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("membership store at {path} holds unreadable data in {what}: {reason}")]
    Corrupt {
        path: String,
        what: String,
        reason: String,
    },
    #[error("unknown cluster driver '{0}': expected local:STATE_DIR")]
    UnknownDriver(String),
}

/// A membership and key-value backend (see the module doc for the contract).
pub trait Driver: Send + Sync + 'static {
    /// The id of the cluster this store belongs to, created on first use.
    fn cluster_id(&self) -> Result<String, DriverError>;
    fn join(&self, me: &NodeInfo) -> Result<View, DriverError>;
    fn tick(&self) -> Result<View, DriverError>;
    fn leave(&self) -> Result<(), DriverError>;
    fn view_at(&self, epoch: u32) -> Result<Option<View>, DriverError>;
    fn kv_get(&self, key: &str) -> Result<Option<Vec<u8>>, DriverError>;
    fn kv_cas(
        &self,
        key: &str,
        expected: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<bool, DriverError>;
    /// Every key starting with `prefix`, sorted, with its value.
    fn kv_list(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, DriverError>;
}

/// Opens a driver from its command-line spelling, e.g. `local:/var/lib/sheep/state`.
pub fn open(spec: &str) -> Result<Box<dyn Driver>, DriverError> {
    match spec.split_once(':') {
        Some(("local", dir)) if !dir.is_empty() => Ok(Box::new(LocalDriver::open(dir.as_ref())?)),
        _ => Err(DriverError::UnknownDriver(spec.to_string())),
    }
}
