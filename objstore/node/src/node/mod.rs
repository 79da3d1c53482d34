//! The storage node `sheep`: serves objects over the wire protocol, follows membership epochs,
//! and recovers the objects each new epoch makes it responsible for.
//!
//! ```text
//!  tick thread ── Driver::tick every 500 ms ──► epoch watch ──► recovery task (plan, pull, gc)
//!  Listener (TCP or in-memory) ── one task per connection ── one task per request
//!                                                 ──► ObjectBackend (blocking pool)
//! ```
//!
//! With [`NodeParts::inline`] the node starts no OS thread: the tick is a tokio task and store
//! and driver calls run on the calling task (`Node::blocking`), so a whole cluster runs in one
//! current-thread runtime under a paused clock (the fault simulator, `objstore/sim`).

mod acting;
mod background;
mod check;
mod collect;
mod cow;
mod ec;
mod failure;
mod fence;
pub mod gate;
mod history;
mod integrity;
mod lockstat;
mod partial;
mod recovery;
mod reference;
mod repair;
mod replicate;
pub(crate) mod ringorder;
mod scrub;
mod server;

pub use scrub::ScrubOptions;

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::net::SocketAddr;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use serde::{Deserialize, Serialize};
use thiserror::Error;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::health::{Health, HealthOptions, HealthStore};
use crate::membership::{self, Driver, DriverError, TICK};
use crate::metrics::Metrics;
use crate::store::{FileStore, ObjectBackend};
use objstore_client::conn::Pool;
use objstore_client::transport::{Listener, Tcp, Transport};
use objstore_proto::api::{NodeStats, NodeStatus, RecoveryStatus};
use objstore_proto::keys;
use objstore_proto::placement::Ring;
use objstore_proto::view::{ClusterConfig, ClusterInfo, NodeInfo, View};

/// The default of [`NodeOptions::settle_from`]: 64 KiB.
pub const SETTLE_FROM: usize = 64 << 10;

#[derive(Debug, Clone)]
pub struct NodeOptions {
    pub dir: PathBuf,
    pub listen: SocketAddr,
    /// Driver spelling, e.g. `local:/path/to/state` or `etcd://10.0.0.1:2379/sheep`.
    pub cluster: String,
    /// The driver's settings (`--lease-ttl`).
    pub driver_opts: membership::DriverOptions,
    /// Failure domain; defaults to one zone per node.
    pub zone: Option<u32>,
    pub vnodes: u32,
    /// Test hook: a pause before each recovery pull, so an end-to-end test can act while a
    /// node is still recovering. Zero (no pause) unless a test asks.
    pub pull_delay: std::time::Duration,
    /// An erasure-coded change that sends at least this many bytes to one strip has its
    /// holders drop their undos once it is acknowledged (`StripOp::Settle`); smaller undos
    /// stay until the next change replaces them ([`SETTLE_FROM`] unless a test asks: the
    /// simulator settles every change).
    pub settle_from: usize,
    /// When the node fences itself for disk errors (`--io-error-limit`, `--io-error-window`).
    pub health: HealthOptions,
    /// The background scrub (`sheep --scrub-rate`); off by default.
    pub scrub: ScrubOptions,
    /// The cluster key and the node's limits (see [`gate`]).
    pub access: gate::Access,
}

#[derive(Debug, Error)]
#[non_exhaustive]
pub enum NodeError {
    #[error("data directory {0} is in use by another sheep")]
    DirInUse(PathBuf),
    #[error(
        "data directory {dir} belongs to cluster {dir_cluster}, but the membership store holds cluster {store_cluster}; use an empty directory or the store it was formatted with"
    )]
    ForeignDir {
        dir: PathBuf,
        dir_cluster: String,
        store_cluster: String,
    },
    #[error("data directory {dir}: {op} failed")]
    Io {
        dir: PathBuf,
        op: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("cannot listen on {addr}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Driver(#[from] DriverError),
    #[error(
        "data directory {dir} was fenced for disk errors ({reason}); remove {dir}/fenced once the disk is checked or replaced (see docs/operations.md, \"Sick disks\")"
    )]
    Fenced { dir: PathBuf, reason: String },
}

/// The node's identity, kept in `DIR/node.json`.
#[derive(Serialize, Deserialize)]
struct Identity {
    id: u64,
    cluster_id: String,
}

/// One membership epoch as the node uses it.
pub struct Epoch {
    pub view: View,
    pub ring: Ring,
}

impl Epoch {
    pub(super) fn new(view: View) -> Arc<Epoch> {
        Arc::new(Epoch {
            ring: Ring::new(&view.nodes),
            view,
        })
    }
}

pub struct Node {
    me: NodeInfo,
    /// The span every task of this node runs in: named after its address when the node runs
    /// inline (several nodes in one process: the simulator, in-process tests), none otherwise.
    span: tracing::Span,
    cluster_id: String,
    store: Arc<dyn ObjectBackend>,
    driver: Arc<dyn Driver>,
    epoch_tx: watch::Sender<Arc<Epoch>>,
    config: OnceLock<ClusterConfig>,
    peers: Pool,
    /// Who may connect, and the caps on connections and on what each has in flight.
    gate: gate::Gate,
    recovery: recovery::Recovery,
    scrub: scrub::Scrub,
    /// Slots of [`Node::background`].
    background: tokio::sync::Semaphore,
    /// This node's objects in the order of an epoch's ring, for its peers' listings.
    ring_order: ringorder::Cache,
    /// Orders changes of one object as its primary (sharded), held while the replicas apply.
    obj_locks: Vec<tokio::sync::Mutex<()>>,
    /// Orders an erasure-coded object's changes, resolutions and reads as its primary
    /// (sharded): reads of a stripe known whole share it, the rest take it alone.
    ec_locks: Vec<tokio::sync::RwLock<()>>,
    /// Taken by a copy-on-write that builds a whole object (see [`cow::WHOLE_COPIES`]): the
    /// gate charges a `CowWrite` only what a partial copy holds.
    whole_copies: tokio::sync::Semaphore,
    /// Orders what a replica applies to one object (sharded): held only around local store
    /// calls, never while waiting for another node, so primaries waiting for replicas can
    /// never wait for each other.
    replica_locks: Vec<tokio::sync::Mutex<()>>,
    /// Erasure-coded objects this node, as their primary, knows decided in the epoch.
    ec_known: ec::Decided,
    /// Versions given to changes that failed somewhere; the next change goes above them.
    issued: std::sync::Mutex<
        std::collections::HashMap<objstore_proto::oid::ObjectId, objstore_proto::version::Version>,
    >,
    /// Objects whose owners a background task is bringing back to one version, with the
    /// epoch it works in.
    repairing: std::sync::Mutex<std::collections::HashMap<objstore_proto::oid::ObjectId, u32>>,
    /// Changes in progress, by the epoch they were checked against (see [`Node::enter`]).
    inflight: replicate::Inflight,
    /// The newest epoch in which this node recorded that it takes changes
    /// ([`Node::note_change`]), and the lock its recording holds.
    noted: std::sync::atomic::AtomicU32,
    noting: tokio::sync::Mutex<()>,
    stop: AtomicBool,
    /// The newest membership tick failure and when it was logged.
    tick_error: Mutex<Option<(String, std::time::Instant)>>,
    pull_delay: std::time::Duration,
    settle_from: usize,
    /// Store and driver calls run inline instead of on the blocking pool (see [`NodeParts`]).
    inline: bool,
    /// The data directory's lock; None when the caller chose the identity (see [`NodeParts`]).
    _dir_lock: Option<File>,
    /// The data directory (where a fenced node leaves its `fenced` mark).
    dir: PathBuf,
    /// The store's I/O errors and fencing (see [`crate::health`]).
    health: Arc<Health>,
    /// Request counters and the registry others add metrics to (see [`crate::metrics`]).
    metrics: Metrics,
    started: std::time::Instant,
}

/// What [`Node::start_with`] runs on.
pub struct NodeParts {
    /// The object backend; None: files under `DIR/obj`.
    pub store: Option<Arc<dyn ObjectBackend>>,
    /// Where the node accepts connections; None: TCP on `NodeOptions::listen`.
    pub listener: Option<Listener>,
    /// How the node connects to its peers (recovery).
    pub transport: Arc<dyn Transport>,
    /// The membership driver; None: opened from `NodeOptions::cluster`.
    pub driver: Option<Arc<dyn Driver>>,
    /// The node's id and incarnation. None: the id is read from (or created in)
    /// `DIR/node.json`, which also locks `DIR`, and the incarnation is random. Some: the caller
    /// chose both (a simulator that must place objects the same way in every run of a seed)
    /// and the data directory is not touched unless the object store lives there.
    pub identity: Option<(u64, u64)>,
    /// Run without OS threads: the membership tick as a tokio task, store and driver calls
    /// inline on the calling task instead of on the blocking pool. For the deterministic
    /// simulator, which runs every node in one current-thread runtime; never for production
    /// (a slow disk would stall the node's network tasks).
    pub inline: bool,
}

impl NodeParts {
    /// The production seams (files under `DIR/obj`, TCP, the driver of `NodeOptions::cluster`,
    /// identity from `DIR`, the blocking pool) with connections to peers through `transport`.
    pub fn new(transport: Arc<dyn Transport>) -> NodeParts {
        NodeParts {
            store: None,
            listener: None,
            transport,
            driver: None,
            identity: None,
            inline: false,
        }
    }
}

/// The membership ticker: its own thread, or a task when the node runs inline.
enum Ticker {
    Thread(std::thread::JoinHandle<()>),
    Task(tokio::task::JoinHandle<()>),
}

/// A started node; dropping it does not stop it, call [`Running::shutdown`].
pub struct Running {
    pub node: Arc<Node>,
    ticker: Option<Ticker>,
    /// The recovery and accept tasks, ended by [`Running::halt`].
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

fn dir_err<'a>(dir: &'a Path, op: &'static str) -> impl FnOnce(io::Error) -> NodeError + 'a {
    move |source| NodeError::Io {
        dir: dir.to_path_buf(),
        op,
        source,
    }
}

/// Locks the data directory and reads (or creates) the node's identity.
fn open_dir(dir: &Path, cluster_id: &str) -> Result<(File, u64), NodeError> {
    fs::create_dir_all(dir).map_err(dir_err(dir, "create"))?;
    // Objects are VDI data: the node's user only.
    fs::set_permissions(dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .map_err(dir_err(dir, "chmod 700"))?;
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join("lock"))
        .map_err(dir_err(dir, "open lock"))?;
    // SAFETY: flock on a valid descriptor; held for the life of the process.
    if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        return Err(NodeError::DirInUse(dir.to_path_buf()));
    }
    let id_path = dir.join("node.json");
    let ident = match fs::read(&id_path) {
        Ok(b) => serde_json::from_slice::<Identity>(&b).map_err(|e| NodeError::Io {
            dir: dir.to_path_buf(),
            op: "read node.json",
            source: io::Error::new(io::ErrorKind::InvalidData, e),
        })?,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let ident = Identity {
                id: rand::random::<u64>() >> 1,
                cluster_id: cluster_id.to_string(),
            };
            let tmp = dir.join("node.json.tmp");
            let mut f = File::create(&tmp).map_err(dir_err(dir, "write node.json"))?;
            f.write_all(&serde_json::to_vec_pretty(&ident).unwrap())
                .and_then(|_| f.sync_all())
                .and_then(|_| fs::rename(&tmp, &id_path))
                .map_err(dir_err(dir, "write node.json"))?;
            ident
        }
        Err(e) => return Err(dir_err(dir, "read node.json")(e)),
    };
    if ident.cluster_id != cluster_id {
        return Err(NodeError::ForeignDir {
            dir: dir.to_path_buf(),
            dir_cluster: ident.cluster_id,
            store_cluster: cluster_id.to_string(),
        });
    }
    Ok((lock, ident.id))
}

impl Node {
    /// Opens the data directory, joins the cluster and starts serving over TCP, with objects
    /// as files under `DIR/obj`. Must run inside a tokio runtime.
    pub async fn start(opts: NodeOptions) -> Result<Running, NodeError> {
        let tcp = Tcp::with_key(opts.access.key.clone());
        Node::start_with(opts, NodeParts::new(Arc::new(tcp))).await
    }

    /// Like [`Node::start`] with the seams chosen by the caller: the object backend (None: files
    /// under `DIR/obj`), where it accepts connections, and how it connects to peers. Tests run
    /// whole clusters in one process this way (a [`crate::store::MemStore`] and an in-memory
    /// network).
    pub async fn start_with(opts: NodeOptions, parts: NodeParts) -> Result<Running, NodeError> {
        let inline = parts.inline;
        let driver: Arc<dyn Driver> = match parts.driver {
            Some(d) => d,
            None => Arc::from(membership::open(&opts.cluster, opts.driver_opts)?),
        };
        let d = driver.clone();
        let cluster_id = run_blocking(inline, move || d.cluster_id())
            .await
            .expect("cluster_id task")?;
        let (dir_lock, id, incarnation) = match parts.identity {
            Some((id, incarnation)) => (None, id, incarnation),
            None => {
                let (lock, id) = open_dir(&opts.dir, &cluster_id)?;
                fence::check_mark(&opts.dir)?;
                (Some(lock), id, rand::random())
            }
        };
        let store: Arc<dyn ObjectBackend> = match parts.store {
            Some(s) => s,
            None => {
                let obj_dir = opts.dir.join("obj");
                Arc::new(FileStore::open(&obj_dir).map_err(dir_err(&obj_dir, "open store"))?)
            }
        };
        let health = Arc::new(Health::new(opts.health));
        let store: Arc<dyn ObjectBackend> = Arc::new(HealthStore::new(store, health.clone()));
        let listener = match parts.listener {
            Some(l) => l,
            None => Listener::Tcp(TcpListener::bind(opts.listen).await.map_err(|source| {
                NodeError::Bind {
                    addr: opts.listen,
                    source,
                }
            })?),
        };
        let me = NodeInfo {
            id,
            addr: listener.local_addr().unwrap_or(opts.listen),
            zone: opts.zone.unwrap_or(id as u32),
            vnodes: opts.vnodes,
            incarnation,
        };
        let d = driver.clone();
        let m = me.clone();
        let view = run_blocking(inline, move || d.join(&m))
            .await
            .expect("join task")?;
        tracing::info!(
            "sheep {:016x} serving {} objects at {}, epoch {} with {} node(s)",
            me.id,
            store.len(),
            me.addr,
            view.epoch,
            view.nodes.len()
        );
        let (epoch_tx, _) = watch::channel(Epoch::new(view));
        let me_addr = me.addr;
        let node = Arc::new(Node {
            me,
            cluster_id,
            store,
            driver,
            epoch_tx,
            config: OnceLock::new(),
            peers: Pool::new(parts.transport),
            gate: gate::Gate::new(opts.access.clone()),
            recovery: recovery::Recovery::default(),
            scrub: Default::default(),
            background: tokio::sync::Semaphore::new(background::slots()),
            ring_order: Default::default(),
            obj_locks: (0..replicate::LOCK_SHARDS)
                .map(|_| Default::default())
                .collect(),
            ec_locks: (0..replicate::LOCK_SHARDS)
                .map(|_| Default::default())
                .collect(),
            whole_copies: tokio::sync::Semaphore::new(cow::WHOLE_COPIES),
            replica_locks: (0..replicate::LOCK_SHARDS)
                .map(|_| Default::default())
                .collect(),
            ec_known: Default::default(),
            issued: Default::default(),
            repairing: Default::default(),
            inflight: Default::default(),
            noted: Default::default(),
            noting: Default::default(),
            stop: AtomicBool::new(false),
            tick_error: Mutex::new(None),
            pull_delay: opts.pull_delay,
            settle_from: opts.settle_from,
            span: if inline {
                tracing::info_span!("node", addr = %me_addr)
            } else {
                tracing::Span::none()
            },
            inline,
            _dir_lock: dir_lock,
            dir: opts.dir.clone(),
            health,
            metrics: Metrics::default(),
            started: std::time::Instant::now(),
        });
        let ticker = if inline {
            Ticker::Task(node.spawn(node.clone().tick_task()))
        } else {
            let node = node.clone();
            Ticker::Thread(
                std::thread::Builder::new()
                    .name("membership".into())
                    .spawn(move || node.tick_loop())
                    .map_err(dir_err(&opts.dir, "start membership thread"))?,
            )
        };
        let mut tasks = vec![
            node.spawn(recovery::run(node.clone())),
            node.spawn(server::serve(node.clone(), listener)),
            node.spawn(fence::restore_unreadable(node.clone())),
            node.spawn(fence::fence_when_told(node.clone())),
        ];
        // No task at all when off: the simulator's schedules stay as they were.
        if opts.scrub.rate > 0 {
            tasks.push(node.spawn(scrub::run(node.clone(), opts.scrub, opts.dir.clone())));
        }
        Ok(Running {
            node,
            ticker: Some(ticker),
            tasks,
        })
    }

    /// Spawns a task of this node, in its span.
    pub(crate) fn spawn<F>(&self, f: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: std::future::Future + Send + 'static,
        F::Output: Send + 'static,
    {
        use tracing::Instrument;
        tokio::spawn(f.instrument(self.span.clone()))
    }

    /// Runs a store or driver call: on tokio's blocking pool, or inline when the node runs
    /// without OS threads ([`NodeParts::inline`]).
    pub(crate) async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Result<T, tokio::task::JoinError> {
        run_blocking(self.inline, f).await
    }

    /// The membership tick as a task (a node that runs inline).
    async fn tick_task(self: Arc<Node>) {
        while !self.stop.load(Ordering::SeqCst) {
            tokio::time::sleep(TICK).await;
            if self.stop.load(Ordering::SeqCst) {
                break;
            }
            self.ticked(self.driver.tick());
        }
    }

    fn tick_loop(&self) {
        while !self.stop.load(Ordering::SeqCst) {
            std::thread::sleep(TICK);
            if self.stop.load(Ordering::SeqCst) {
                break;
            }
            self.ticked(self.driver.tick());
        }
    }

    /// Adopts a tick's view; logs a failure when it first happens or changes, and again
    /// every 10 s while it lasts.
    fn ticked(&self, res: Result<View, DriverError>) {
        let mut last = self.tick_error.lock().unwrap();
        match res {
            Ok(view) => {
                if last.take().is_some() {
                    tracing::info!("membership tick works again");
                }
                drop(last);
                self.adopt(view);
            }
            Err(e) => {
                let msg = e.to_string();
                let repeat = matches!(&*last, Some((m, at)) if *m == msg && at.elapsed() < std::time::Duration::from_secs(10));
                if !repeat {
                    tracing::warn!("membership tick failed: {msg}");
                    *last = Some((msg, std::time::Instant::now()));
                }
            }
        }
    }

    /// Publishes a view if it is newer than the current one.
    fn adopt(&self, view: View) {
        self.epoch_tx.send_if_modified(|cur| {
            if view.epoch > cur.view.epoch {
                tracing::info!(
                    "epoch {} -> {}: {} node(s)",
                    cur.view.epoch,
                    view.epoch,
                    view.nodes.len()
                );
                *cur = Epoch::new(view);
                true
            } else {
                false
            }
        });
    }

    /// Refuses I/O once the membership store may have dropped this node: past
    /// [`Driver::member_until`] other nodes may already serve its objects in a newer epoch.
    fn check_member(&self) -> Result<(), server::Failure> {
        match self.driver.member_until() {
            Some(until) if std::time::Instant::now() >= until => Err(server::Failure::new(
                objstore_proto::frame::ResultCode::Busy,
                format!(
                    "node {} has not renewed its membership lease for {} ms past its end: the cluster may have dropped it, so it serves no I/O until it reaches the membership store again",
                    self.me.addr,
                    until.elapsed().as_millis()
                ),
            )),
            _ => Ok(()),
        }
    }

    pub fn me(&self) -> &NodeInfo {
        &self.me
    }

    pub fn epoch(&self) -> Arc<Epoch> {
        self.epoch_tx.borrow().clone()
    }

    fn subscribe(&self) -> watch::Receiver<Arc<Epoch>> {
        self.epoch_tx.subscribe()
    }

    /// The cluster format, once `dog cluster format` has run.
    pub fn config(&self) -> Option<ClusterConfig> {
        if let Some(c) = self.config.get() {
            return Some(*c);
        }
        let raw = self.driver.kv_get(keys::CONFIG).ok().flatten()?;
        let c: ClusterConfig = serde_json::from_slice(&raw).ok()?;
        Some(*self.config.get_or_init(|| c))
    }

    pub fn cluster_info(&self) -> ClusterInfo {
        ClusterInfo {
            cluster_id: self.cluster_id.clone(),
            config: self.config(),
            view: self.epoch().view.clone(),
            membership: self.driver.describe(),
        }
    }

    pub fn recovery_status(&self) -> RecoveryStatus {
        self.recovery.status()
    }

    /// The disk's health: I/O errors, fencing.
    pub fn health(&self) -> &Arc<Health> {
        &self.health
    }

    /// The node's counters, and the registry where other parts add theirs.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// What `NodeStatus` answers.
    pub fn status(&self) -> NodeStatus {
        let (disk_total, disk_free) = self.store.capacity().unwrap_or((0, 0));
        NodeStatus {
            id: self.me.id,
            addr: self.me.addr,
            zone: self.me.zone,
            vnodes: self.me.vnodes,
            epoch: self.epoch().view.epoch,
            objects: self.store.len(),
            disk_total,
            disk_free,
            recovery: self.recovery_status(),
            lease_left_ms: self.driver.member_until().map(|until| {
                let now = std::time::Instant::now();
                if until >= now {
                    (until - now).as_millis() as i64
                } else {
                    -((now - until).as_millis() as i64)
                }
            }),
            health: self.health.status(),
            scrub: self.scrub_status(),
        }
    }

    /// What `NodeStat` answers and `--metrics` serves.
    pub fn stats(&self) -> NodeStats {
        NodeStats {
            status: self.status(),
            uptime_secs: self.started.elapsed().as_secs(),
            ops: self.metrics.ops(),
            errors: self.metrics.errors(),
            extra: self.metrics.registry().samples(),
        }
    }

    pub fn scrub_status(&self) -> objstore_proto::api::ScrubStatus {
        self.scrub.status()
    }
}

impl Running {
    /// Stops the membership ticker, the recovery task and the accept loop without leaving: to
    /// the cluster the node just went silent, as after a crash. Tasks of connections and
    /// requests live on in their runtime until their connections break; drop that runtime (or
    /// cut the node off the in-memory network) to end them.
    pub fn halt(mut self) {
        self.node.stop.store(true, Ordering::SeqCst);
        for t in self.tasks.drain(..) {
            t.abort();
        }
        match self.ticker.take() {
            Some(Ticker::Thread(t)) => {
                let _ = t.join();
            }
            Some(Ticker::Task(t)) => t.abort(),
            None => {}
        }
    }

    /// Leaves the cluster and stops the membership ticker. Connections still open are dropped
    /// when the process exits.
    pub async fn shutdown(mut self) {
        self.node.stop.store(true, Ordering::SeqCst);
        match self.ticker.take() {
            Some(Ticker::Thread(t)) => {
                let _ = tokio::task::spawn_blocking(move || t.join()).await;
            }
            Some(Ticker::Task(t)) => t.abort(),
            None => {}
        }
        let d = self.node.driver.clone();
        match self.node.blocking(move || d.leave()).await {
            Ok(Ok(())) => tracing::info!("left the cluster"),
            Ok(Err(e)) => tracing::warn!("leaving the cluster failed: {e}"),
            Err(e) => tracing::warn!("leaving the cluster failed: {e}"),
        }
    }
}

/// Runs `f` on tokio's blocking pool, or inline (see [`NodeParts::inline`]); the error is the
/// pool's (a call that panicked there), as from `spawn_blocking`.
async fn run_blocking<T: Send + 'static>(
    inline: bool,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, tokio::task::JoinError> {
    if inline {
        return Ok(f());
    }
    tokio::task::spawn_blocking(f).await
}
