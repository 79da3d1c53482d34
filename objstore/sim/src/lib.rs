//! objstore-sim: the deterministic fault simulator.
//!
//! One seed drives a whole cluster in one current-thread tokio runtime with a paused clock:
//! nodes running inline ([`objstore_node::NodeParts::inline`]) on `MemStore`s, the
//! `MemNetwork` with its fault hooks, the in-memory membership driver, several clients that
//! write objects directly, clients that go through a VDI handle ([`workload::vdi`]: its map,
//! its first writes into new objects, its grouped map entries, many requests in flight, and
//! refreshes), and a nemesis. Simulated time costs nothing; the same seed gives the same
//! operations, faults and result ([`Report::trace_hash`]).
//!
//! - [`cluster`]: the simulated nodes (start, crash, restart; their copies of an object).
//! - [`workload`]: the clients' operations; [`workload::vdi`]: the VDI clients'.
//! - [`nemesis`]: the faults.
//! - [`history`]: what happened; [`checker`]: what a read may return.
//! - [`run()`]: one seed from start to the final checks.
//! - [`scale`]: recovery's cost at hundreds of nodes and millions of objects (no faults).
//!
//! Replay one seed: `SEED=N cargo test -p objstore-sim --test seeds seeds`.

pub mod checker;
pub mod cluster;
pub mod history;
pub mod nemesis;
mod run;
pub mod scale;
pub mod workload;

use std::time::Duration;

use thiserror::Error;

pub use checker::{Kind, Violation};
pub use nemesis::Faults;
pub use run::{elapsed, run, Report, Stats};

/// Why a run could not be carried out (not a finding: findings are [`Violation`]s).
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum SimError {
    #[error("cannot build the runtime")]
    Runtime(#[source] std::io::Error),
    #[error("a node did not start")]
    Node(#[from] objstore_node::NodeError),
    #[error("setting up the cluster failed")]
    Client(#[from] objstore_client::ClientError),
    #[error("the cluster did not form within {0:?} of simulated time")]
    NoCluster(Duration),
    #[error("setting up a VDI client's VDI failed")]
    Vdi(#[from] objstore_client::VdiError),
}

/// The shape of one run.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    pub nodes: usize,
    pub copies: u32,
    /// Live owners a write needs (`dog cluster format --min-copies`); None: the default.
    pub min_copies: Option<u32>,
    /// Points of each node on the placement ring (fewer than production's 128: building rings
    /// is most of a debug build's work, and placement is not what the simulator tests).
    pub vnodes: u32,
    pub clients: usize,
    /// Data objects written (of 1 MiB each; only the first `blocks` blocks are used).
    pub objects: usize,
    pub blocks: usize,
    pub ops_per_client: usize,
    /// Longest pause of a client between two operations.
    pub think: Duration,
    /// Clients that go through a VDI handle ([`workload::vdi`]), each on a VDI of its own.
    pub vdi_clients: usize,
    /// Requests each VDI client keeps in flight: tasks sharing its one handle.
    pub vdi_depth: usize,
    /// Operations of each VDI client, over all its tasks (refreshes not counted).
    pub vdi_ops: usize,
    /// Objects of each VDI (of 1 MiB; 2 to [`workload::vdi::MAX_OBJECTS`]). The blocks used
    /// are those on either side of the boundary between objects 0 and 1 and the first ones of
    /// every further object ([`workload::vdi::windows`]).
    pub vdi_objects: usize,
    /// Whether clients write each other's objects (two writers on one object); false: object
    /// `o` is written only by client `o % clients`, as a VDI has one writer.
    pub shared_objects: bool,
    /// The object clients' objects are erasure-coded with this scheme (`SIM_EC=2:1`): their
    /// writes, reads and removes go through `EcWrite`, `EcRead`, `EcRemove`, copy-on-write is
    /// left out, and the final check compares every stripe's strips (one version, parity that
    /// matches) instead of copies.
    pub ec: Option<objstore_proto::redundancy::Redundancy>,
    /// With `ec`: the VDI clients' VDIs are of the scheme too, and their tasks also send
    /// bursts of adjacent writes (`SIM_EC_VDIS=1`): many changes of one erasure-coded object
    /// in flight through one handle, first writes racing, waiting writes sent as one by the
    /// client. Off by default so that the seeds kept in `tests/regressions.rs` run the
    /// schedules they were found with.
    pub ec_vdis: bool,
    /// At most this many nodes are down at once.
    pub max_down: usize,
    /// Longest pause of the nemesis between two decisions, in ms.
    pub nemesis_pause_ms: u64,
    pub faults: Faults,
    /// Client operation timeout and per-request timeout.
    pub op_timeout: Duration,
    pub request_timeout: Duration,
    /// How long recovery may take once the faults stopped.
    pub settle: Duration,
    /// A pause after recovery finished, before the final reads and comparisons, for repairs
    /// that run on timers (a node's retries back off up to 5 s).
    pub grace: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            nodes: 5,
            copies: 3,
            min_copies: None,
            vnodes: 16,
            clients: 3,
            objects: 6,
            blocks: 8,
            ops_per_client: 12,
            think: Duration::from_millis(100),
            shared_objects: false,
            ec: None,
            ec_vdis: false,
            vdi_clients: 1,
            vdi_depth: 8,
            vdi_ops: 32,
            vdi_objects: 3,
            max_down: 2,
            nemesis_pause_ms: 300,
            faults: Faults::ALL,
            op_timeout: Duration::from_secs(10),
            request_timeout: Duration::from_secs(1),
            settle: Duration::from_secs(120),
            grace: Duration::from_secs(10),
        }
    }
}
