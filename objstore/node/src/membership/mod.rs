//! Membership drivers: who is in the cluster, at which epoch, and the small cluster-wide
//! key-value store that holds the format and the VDI table.
//!
//! # Contract
//! - [`Driver::join`] registers this node as alive and returns a view that contains it. Every
//!   change of the live node set (a join, a leave, a death, a restart with a new incarnation)
//!   produces a new epoch, numbered one above the last, with the full node list; changes that
//!   land together may share one (etcd: eight nodes joining at once may make one epoch).
//!   Epochs are totally ordered and never reused; [`Driver::view_at`] returns past ones.
//! - [`Driver::tick`] is called by every node about every [`TICK`]. It refreshes this node's
//!   liveness (etcd: a background stream does, and the tick joins again after the lease ended)
//!   and returns the newest view; with etcd unreachable it returns the last view it saw, and
//!   being cut off shows through [`Driver::member_until`]. A node that stops ticking (killed, hung) is dropped
//!   from the view within [`DEAD_AFTER`] plus one tick; the driver may notice sooner.
//! - [`Driver::leave`] removes this node at once; the next epoch lacks it.
//! - The key-value store is linearizable: [`Driver::kv_cas`] replaces a value only if it still
//!   equals `expected` (`None` = absent), and a `None` new value deletes.
//! - Leases: [`Driver::lease_grant`] makes a lease that lives while someone renews it
//!   ([`Driver::lease_keepalive`], from any node: the id is cluster-wide) and dies
//!   [`Driver::lease_grant`]'s `ttl` after the last renewal or at [`Driver::lease_revoke`].
//!   A value written with [`Driver::kv_cas_leased`] is bound to a lease: it vanishes with it
//!   (VDI attachment locks of a host that died). A later plain [`Driver::kv_cas`] of the key
//!   unbinds it.
//! - [`Driver::member_until`] bounds how long this node may act on its current epoch without
//!   hearing from the store: past that instant the store may have dropped it and made epochs
//!   without it, so the node must not serve I/O until it hears again (no split brain). A
//!   driver whose nodes cannot be cut off from the store (local) returns `None`.
//! - Calls block (file or network I/O); async callers run them on a blocking pool. The
//!   in-memory driver ([`MemMembership`], for the fault simulator) never blocks.

mod etcd;
mod local;
mod mem;

use std::time::{Duration, Instant};

use thiserror::Error;

use objstore_proto::view::{NodeInfo, View};

pub use etcd::{EtcdDriver, EtcdSpec};
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
    #[error(
        "unknown cluster driver '{0}': expected local:STATE_DIR or etcd://HOST:PORT[,HOST:PORT...][/PREFIX]"
    )]
    UnknownDriver(String),
    /// The store cannot be reached (or answers without a quorum).
    #[error("membership store {endpoints} unreachable: {reason}")]
    Unreachable { endpoints: String, reason: String },
    /// This node's own lease ended: the store dropped it from the cluster.
    #[error("this node's membership lease expired: it left the cluster and must join again")]
    LeaseExpired,
    /// A request the store refused (e.g. a key or value over its limits).
    #[error("membership store {endpoints} refused {op}: {reason}")]
    Refused {
        endpoints: String,
        op: &'static str,
        reason: String,
    },
}

/// Driver settings from the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DriverOptions {
    /// How long a node (or a lease) lives after its last renewal (etcd: the lease TTL).
    pub lease_ttl: Duration,
}

impl Default for DriverOptions {
    fn default() -> Self {
        DriverOptions {
            lease_ttl: DEFAULT_LEASE_TTL,
        }
    }
}

/// `sheep --lease-ttl` default.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(5);

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
    /// Like [`Driver::kv_cas`] with a value (never a delete) bound to lease `lease`; false
    /// also when the lease no longer exists.
    fn kv_cas_leased(
        &self,
        key: &str,
        expected: Option<&[u8]>,
        new: &[u8],
        lease: u64,
    ) -> Result<bool, DriverError>;
    /// A new lease that ends `ttl` (whole seconds, at least 1) after its last renewal.
    fn lease_grant(&self, ttl: Duration) -> Result<u64, DriverError>;
    /// Renews a lease; false when it already ended (its keys are gone).
    fn lease_keepalive(&self, lease: u64) -> Result<bool, DriverError>;
    /// Ends a lease now, deleting its keys; ending an unknown lease is not an error.
    fn lease_revoke(&self, lease: u64) -> Result<(), DriverError>;
    /// The driver and its store, for people: `local:/var/lib/sheep/state`,
    /// `etcd://10.0.0.1:2379/sheep (lease TTL 5s)`.
    fn describe(&self) -> String;
    /// Until when this node is surely still a member (see the module doc); `None`: no bound.
    fn member_until(&self) -> Option<Instant> {
        None
    }
}

/// Opens a driver from its command-line spelling: `local:/var/lib/sheep/state` or
/// `etcd://10.0.0.1:2379,10.0.0.2:2379/sheep`.
pub fn open(spec: &str, opts: DriverOptions) -> Result<Box<dyn Driver>, DriverError> {
    if let Some(rest) = spec.strip_prefix("etcd://") {
        return Ok(Box::new(EtcdDriver::open(&EtcdSpec::parse(rest)?, opts)?));
    }
    match spec.split_once(':') {
        Some(("local", dir)) if !dir.is_empty() => Ok(Box::new(LocalDriver::open(dir.as_ref())?)),
        _ => Err(DriverError::UnknownDriver(spec.to_string())),
    }
}
