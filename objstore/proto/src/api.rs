//! JSON bodies of the administrative operations (format, key-value, status). Data operations
//! carry raw bytes; see docs/wire.md.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::version::{ObjState, Version};

/// `Format` request body.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct FormatRequest {
    pub copies: u32,
    /// None: the default for `copies` ([`crate::view::default_min_copies`]).
    #[serde(default)]
    pub min_copies: Option<u32>,
    pub object_size: u64,
    /// The default redundancy of new VDIs' data objects when it is an erasure code (`x:y`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vdi_redundancy: Option<crate::redundancy::Redundancy>,
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
    /// The health of the node's disk (I/O errors, fencing); absent from older nodes.
    #[serde(default)]
    pub health: DiskHealth,
    /// The background scrub: its rate, the pass in progress and the last one finished.
    #[serde(default)]
    pub scrub: ScrubStatus,
}

/// How a node's disk is doing (see docs/operations.md, "Sick disks").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum HealthState {
    /// No I/O error within the window.
    #[default]
    Ok,
    /// I/O errors within the window, fewer than the limit: the copies they hit are restored
    /// from other replicas; the node still serves the rest.
    Degraded,
    /// Errors reached the limit: the node left the cluster and serves no object I/O.
    Fenced,
}

/// I/O errors of the node's store since it started, by the operation that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct IoErrorCounts {
    pub read: u64,
    pub write: u64,
    /// A flush (`fdatasync`) that failed: one per failed flush, whatever the objects it lost.
    pub sync: u64,
    pub remove: u64,
}

impl IoErrorCounts {
    pub fn total(&self) -> u64 {
        self.read + self.write + self.sync + self.remove
    }
}

/// The disk health part of [`NodeStatus`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct DiskHealth {
    pub state: HealthState,
    pub io_errors: IoErrorCounts,
    /// Errors within the last `window_secs`.
    #[serde(default)]
    pub recent: u32,
    /// Errors within the window that fence the node (`sheep --io-error-limit`; 0: never).
    #[serde(default)]
    pub limit: u32,
    #[serde(default)]
    pub window_secs: u64,
    /// The newest error, for people.
    #[serde(default)]
    pub last_error: Option<String>,
    /// Why the node fenced itself, and what the operator does next.
    #[serde(default)]
    pub fenced: Option<String>,
    /// Copies found unreadable and restored from another replica since the node started.
    #[serde(default)]
    pub restored: u64,
}

/// `NodeStat` response body: the node's status and its counters (what `sheep --metrics`
/// serves as Prometheus text, as one JSON document).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NodeStats {
    pub status: NodeStatus,
    /// Seconds since the node started.
    pub uptime_secs: u64,
    /// One entry per opcode that served at least one request.
    pub ops: Vec<OpStats>,
    /// Error answers by result code name (`Io`, `Busy`, ...), every opcode together.
    pub errors: std::collections::BTreeMap<String, u64>,
    /// Counters and gauges other parts of the node registered (scrub, ...).
    #[serde(default)]
    pub extra: Vec<Sample>,
}

/// Requests of one opcode since the node started.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpStats {
    /// The opcode's name (`ReadObj`, ...).
    pub op: String,
    pub requests: u64,
    /// Requests answered with an error code.
    pub errors: u64,
    /// Payload bytes received with the requests and sent with the answers.
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// Sum of the time from decoding a request to its answer being ready, in microseconds.
    pub latency_sum_us: u64,
    /// Cumulative latency histogram: for each upper bound in microseconds, the requests that
    /// took at most that long (the last bound is `u64::MAX`: all of them).
    pub latency_buckets: Vec<(u64, u64)>,
}

/// One sample of a registered metric.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    pub name: String,
    pub help: String,
    /// `counter` or `gauge`.
    pub kind: String,
    #[serde(default)]
    pub labels: Vec<(String, String)>,
    pub value: f64,
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
    /// What the last plan of this epoch fetched from the other nodes: listing entries (17
    /// bytes each), digests of arcs of the ring (24 bytes each), requests, and how long the
    /// plan took (milliseconds); and how many entries the other nodes' listings held in all
    /// (those fetched, and those found equal to this node's own by digest). A plan asks each
    /// node only for the objects this node holds in the epoch (docs/architecture.md,
    /// "Recovery's cost").
    #[serde(default)]
    pub plan_entries: u64,
    #[serde(default)]
    pub plan_digests: u64,
    #[serde(default)]
    pub plan_listed: u64,
    #[serde(default)]
    pub plan_requests: u64,
    #[serde(default)]
    pub plan_ms: u64,
    /// Requests of this epoch answered through a stand-in: an old holder of an object this
    /// node could not store for lack of space (docs/architecture.md, "Old holders stand in").
    #[serde(default)]
    pub relayed: u64,
}

/// `CheckObj` request flag (`aux` bit 0): report the copy's state only, without reading it.
pub const CHECK_STATE_ONLY: u32 = 1;

/// `ReadObj` request flag (`aux` bit 0), between nodes: the answer is one flags byte (bit 0:
/// the copy is durable here) and then the object's copy-on-write record ([`crate::cowrec`])
/// as stored, nothing for a whole object (`offset` and `length` are ignored).
pub const READ_COW_RECORD: u32 = 1;

/// `EcCheck` response body: an erasure-coded object's strips as its primary read them back,
/// judged and (unless asked not to) repaired (see docs/wire.md).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EcCheckReport {
    /// The version the stripe stands at (None: never written, or removed).
    pub version: Option<crate::version::Version>,
    /// Strips whose holder answered.
    pub strips: u64,
    /// Bytes read.
    pub bytes: u64,
    /// Every strip that was not good: why, and whether it was rebuilt.
    pub bad: Vec<BadStrip>,
    /// Why the object cannot be made whole (fewer than x good strips), if so.
    pub unrecoverable: Option<String>,
}

/// One strip of an [`EcCheckReport`] that was not good.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BadStrip {
    pub strip: u32,
    pub addr: std::net::SocketAddr,
    pub problem: String,
    pub repaired: bool,
    #[serde(default)]
    pub repair_error: Option<String>,
}

/// `CheckObj` response body: what one node holds of one object and whether its bytes read back
/// (see docs/wire.md).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CopyCheck {
    /// The copy's state; None: no copy here (nor a tombstone).
    pub state: Option<ObjState>,
    /// The node is recovering this copy (a pull pending, or a bad copy being restored): it was
    /// not read.
    #[serde(default)]
    pub recovering: bool,
    /// The copy here lost its data (a read error, a checksum mismatch, a failed flush) and
    /// waits to be restored from a good copy: it is bad, and when no owner holds a good one
    /// the object is unrecoverable.
    #[serde(default)]
    pub lost: bool,
    /// blake3 of the copy's bytes with trailing zeros left out, in hex (bytes past an object's
    /// end read as zeros, so copies of one content may differ in file length). None for a
    /// tombstone, no copy, a copy that failed verification, or when not asked.
    #[serde(default)]
    pub digest: Option<String>,
    /// Bytes read to verify the copy.
    #[serde(default)]
    pub bytes: u64,
    /// Why the copy failed verification (a read error, a checksum mismatch): it is bad.
    #[serde(default)]
    pub error: Option<String>,
}

/// `RepairObj` request body: restore the copy here at `version` (or a newer one), from
/// `source` when given, else from an owner holding that version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepairRequest {
    pub version: Version,
    #[serde(default)]
    pub source: Option<SocketAddr>,
}

/// `RepairObj` response body: the copy now here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepairReply {
    pub state: ObjState,
}

/// One pass of a node's background scrub over its copies. Times are seconds since the Unix
/// epoch.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScrubPass {
    pub started: u64,
    /// None while the pass runs.
    #[serde(default)]
    pub ended: Option<u64>,
    /// Milliseconds the pass took, once it ended.
    #[serde(default)]
    pub took_ms: Option<u64>,
    /// Copies verified so far (tombstones and copies being recovered are skipped); each strip
    /// of an erasure-coded object held here counts as one.
    pub objects: u64,
    /// Bytes read to verify them (for a stripe this node is the primary of, every strip's).
    pub bytes: u64,
    /// Bad copies found: here (failed verification) or, for objects this node is the primary
    /// of, on another owner (older, missing, failed, or a minority digest); for a stripe, its
    /// bad strips (unreadable, missing, stale, or disagreeing with parity).
    pub bad: u64,
    /// Bad copies restored from a good one (strips rebuilt from the others).
    pub repaired: u64,
    /// Objects with no good copy to restore from, or stripes with fewer than x good strips
    /// or parity that names no wrong strip (see the node's log).
    #[serde(default)]
    pub unrecoverable: u64,
}

/// What `dog node scrub` shows: the scrub's rate and its passes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ScrubStatus {
    /// Bytes per second the scrub reads at most; 0: scrub off.
    pub rate: u64,
    /// The pass in progress, if any.
    #[serde(default)]
    pub current: Option<ScrubPass>,
    /// The last pass finished, if any.
    #[serde(default)]
    pub last: Option<ScrubPass>,
    /// Passes finished since the node started.
    #[serde(default)]
    pub passes: u64,
    /// Bad copies found by every pass since the node started (the pass in progress included).
    #[serde(default)]
    pub bad_total: u64,
    /// Bad copies repaired by every pass since the node started (the pass in progress
    /// included).
    #[serde(default)]
    pub repaired_total: u64,
}
