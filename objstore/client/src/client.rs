//! The client library: placement computed here, requests sent straight to the replicas.
//!
//! - A write (and a remove) goes to the object's primary: its first owner in the current epoch.
//!   The primary gives it the object's next version, applies it and forwards it to the other
//!   owners, and answers only when every owner holds that version (see the node's server).
//!   Writes to one object from this client are also ordered here (a lock per object, sharded).
//! - A read goes to the primary and moves to the next owner at once on any failure of that
//!   replica (no answer within [`ClientOptions::request_timeout`], a lost connection, an error
//!   code); nodes that failed to answer lately are tried last.
//! - A stale epoch, a busy node or a lost connection refreshes the membership view and retries
//!   with backoff until [`ClientOptions::timeout`], then fails with the last reason.
//! - A hung node (alive, silent) costs each request one `request_timeout`, not the whole
//!   operation: the request fails, its connection is dropped, and the retry refreshes the view,
//!   which drops the node once the membership does (within about 3 s with the local driver).
//! - [`Client::flush`] makes every earlier acknowledged write durable on every node.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use bytes::Bytes;
use thiserror::Error;
// tokio's clock, so a paused clock (the fault simulator) governs the retry deadline too.
use tokio::time::Instant;

use crate::conn::{ConnError, Pool};
use crate::transport::{Tcp, Transport};
use objstore_proto::api::{FormatRequest, NodeStatus};
use objstore_proto::auth::KeyFile;
use objstore_proto::frame::{Frame, Header, Opcode, ResultCode};
use objstore_proto::oid::ObjectId;
use objstore_proto::version::{ObjState, Version};
use objstore_proto::view::ClusterInfo;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
const ORDER_SHARDS: usize = 1024;

/// The default [`ClientOptions::timeout`].
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// The default [`ClientOptions::request_timeout`].
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// How long the client waits. The timeouts nest, each well inside the next:
///
/// ```text
///  node -> peer request (a forwarded write, a recovery pull)  <  request_timeout  <  timeout
/// ```
///
/// - `request_timeout` bounds one request to one node: a node that does not answer in time
///   is taken for hung for this request (its connection is dropped, a read moves to the next
///   replica, a write is retried on a refreshed view). It must cover a busy node's honest
///   worst case: a 4 MiB object written crash-safely (tmp file, fsync, rename) behind a queue of
///   others on a slow, shared disk and CPU; too short, and a merely slow node costs retries
///   (never an error by itself). The 5 s default is a choice, not a measured bound: above
///   the membership's drop of a silent node (about 3 s), so the retry usually finds the node
///   gone, and meant to be generous for a 4 MiB write on a loaded 2-core machine.
/// - A node that forwards a request to a peer must give up on that peer sooner than
///   `request_timeout`, so it can answer its client with the peer's failure before the client
///   gives up on it (and takes a healthy node for a hung one).
/// - `timeout` bounds the whole operation, retries included: a request failing for this long
///   is an error (EIO through the mount). It must cover the membership's reaction to a hung or
///   dead node plus the new epoch's recovery plan, so that one hung node is a pause.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// How long one operation keeps retrying (stale epochs, dead or hung nodes) before it fails.
    pub timeout: Duration,
    /// How long one request to one node may wait for its answer.
    pub request_timeout: Duration,
    /// The cluster key file: every TCP connection opens with its handshake (None: no
    /// handshake, for nodes run with `--no-auth`). Unused over an in-memory transport.
    pub key: Option<Arc<KeyFile>>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            timeout: DEFAULT_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            key: None,
        }
    }
}

#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ClientError {
    #[error("no node of the cluster answered (tried {addrs}): {reason}")]
    Unreachable { addrs: String, reason: String },
    #[error("the cluster is not formatted: run 'dog cluster format --copies N' first")]
    NotFormatted,
    #[error("{0}")]
    AlreadyFormatted(String),
    #[error("object {0} not found on any replica")]
    NotFound(ObjectId),
    #[error("node {0} is out of disk space")]
    NoSpace(SocketAddr),
    #[error("node {addr} refused the request: {message}")]
    Refused {
        addr: SocketAddr,
        code: ResultCode,
        message: String,
    },
    #[error("gave up after {secs:.1} s: {last}")]
    Timeout { secs: f64, last: String },
    #[error("the value changed under us")]
    Conflict,
    #[error("unreadable answer from {addr}: {reason}")]
    BadReply { addr: SocketAddr, reason: String },
    /// A key refused (`Unauthenticated`) or a node's limit reached (`LimitReached`): not
    /// retried. The message names the node and why.
    #[error("{message}")]
    Denied {
        addr: SocketAddr,
        code: ResultCode,
        message: String,
    },
}

/// One attempt's outcome.
enum Step<T> {
    Done(T),
    Fatal(ClientError),
    /// Worth retrying after a view refresh; the text says why.
    Retry(String),
}

/// What one answer means for the caller.
enum Answer {
    Ok(Frame),
    NotFound,
    Retry(String),
    Fatal(ClientError),
}

fn answer(addr: SocketAddr, res: Result<Frame, ConnError>) -> Answer {
    let f = match res {
        Ok(f) => f,
        Err(e) => {
            return match refusal::refused(e) {
                Ok(denied) => Answer::Fatal(denied),
                Err(e) => Answer::Retry(e.to_string()),
            }
        }
    };
    if let Some(e) = refusal::denied(addr, &f) {
        return Answer::Fatal(e);
    }
    match f.header.result_code() {
        ResultCode::Ok => Answer::Ok(f),
        ResultCode::NotFound => Answer::NotFound,
        ResultCode::StaleEpoch
        | ResultCode::NodeBehind
        | ResultCode::Busy
        | ResultCode::ShuttingDown
        // A fenced node left (or is leaving) the cluster: the next view places it elsewhere.
        | ResultCode::Fenced => Answer::Retry(format!("{addr}: {}", f.message())),
        ResultCode::NotFormatted => Answer::Fatal(ClientError::NotFormatted),
        ResultCode::NoSpace => Answer::Fatal(ClientError::NoSpace(addr)),
        ResultCode::AlreadyFormatted => Answer::Fatal(ClientError::AlreadyFormatted(f.message())),
        ResultCode::Conflict => Answer::Fatal(ClientError::Conflict),
        code => Answer::Fatal(ClientError::Refused {
            addr,
            code,
            message: f.message(),
        }),
    }
}

/// The replicas of `oid` in view `v`, or the step to take when there are none.
fn targets<T>(v: &ClusterView, oid: ObjectId) -> Result<Vec<SocketAddr>, Step<T>> {
    match v.replicas(oid) {
        Ok(t) if t.is_empty() => Err(Step::Retry("the cluster has no nodes".into())),
        Ok(t) => Ok(t),
        Err(e) => Err(Step::Fatal(e)),
    }
}

pub struct Client {
    bootstrap: Vec<SocketAddr>,
    opts: ClientOptions,
    pool: Pool,
    view: RwLock<Arc<ClusterView>>,
    order: Vec<tokio::sync::Mutex<()>>,
    /// Nodes whose last request got no answer (timed out, refused, connection lost): tried
    /// last by reads and by requests to any node, until one of them answers again.
    suspects: Mutex<HashSet<SocketAddr>>,
    /// The version each object had after this client's last change of it (see
    /// [`Client::write_obj`]); a few bytes per object this client changed.
    versions: Mutex<HashMap<ObjectId, Version>>,
    /// What a flush writes first ([`Client::before_flush`]).
    before_flush: Mutex<Vec<std::sync::Weak<dyn BeforeFlush>>>,
    /// Writes of erasure-coded objects waiting for their object's turn (`batch`).
    batches: batch::Batches,
    /// The version of each erasure-coded object's stripe this client knows (`direct`).
    stripes: direct::Stripes,
}

/// Changes a client holds back and writes before each flush: a VDI handle's map entries
/// (`vdi::entries`).
pub(crate) trait BeforeFlush: Send + Sync {
    /// Writes every change held that no flush has made durable yet; returns a mark for
    /// [`BeforeFlush::flushed`].
    fn write_pending(&self) -> futures::future::BoxFuture<'_, Result<u64, ClientError>>;
    /// Every node was flushed after [`BeforeFlush::write_pending`] returned `mark`.
    fn flushed(&self, mark: u64);
}

impl Client {
    /// Registers `w`: every later [`Client::flush`] has it write what it holds first (until
    /// it is dropped).
    pub(crate) fn before_flush(&self, w: std::sync::Weak<dyn BeforeFlush>) {
        let mut list = self.before_flush.lock().unwrap();
        list.retain(|x| x.strong_count() > 0);
        list.push(w);
    }

    /// Connects to the cluster through any of `addrs`.
    pub async fn connect(addrs: &[SocketAddr], opts: ClientOptions) -> Result<Client, ClientError> {
        let tcp = Tcp::with_key(opts.key.clone());
        Client::connect_via(Arc::new(tcp), addrs, opts).await
    }

    /// Like [`Client::connect`], over `transport` (an in-memory network in tests).
    pub async fn connect_via(
        transport: Arc<dyn Transport>,
        addrs: &[SocketAddr],
        opts: ClientOptions,
    ) -> Result<Client, ClientError> {
        let client = Client {
            bootstrap: addrs.to_vec(),
            opts,
            pool: Pool::new(transport),
            view: RwLock::new(ClusterView::new(ClusterInfo {
                cluster_id: String::new(),
                config: None,
                view: Default::default(),
                membership: String::new(),
            })),
            order: (0..ORDER_SHARDS).map(|_| Default::default()).collect(),
            suspects: Mutex::default(),
            versions: Mutex::default(),
            before_flush: Mutex::default(),
            batches: batch::Batches::default(),
            stripes: direct::Stripes::default(),
        };
        client.refresh().await?;
        Ok(client)
    }

    pub fn view(&self) -> Arc<ClusterView> {
        self.view.read().unwrap().clone()
    }

    /// The addresses the client was given to start from.
    pub fn bootstrap(&self) -> &[SocketAddr] {
        &self.bootstrap
    }

    pub fn options(&self) -> &ClientOptions {
        &self.opts
    }

    /// Fetches the cluster view again from any node.
    pub async fn refresh(&self) -> Result<Arc<ClusterView>, ClientError> {
        let (addr, f) = self.any_node(Opcode::ClusterInfo, Bytes::new()).await?;
        let info: ClusterInfo = parse(addr, &f.payload)?;
        info.check().map_err(|e| ClientError::BadReply {
            addr,
            reason: format!("its cluster description is not valid: {e}"),
        })?;
        let mut cur = self.view.write().unwrap();
        if info.view.epoch >= cur.info.view.epoch {
            *cur = ClusterView::new(info);
        }
        Ok(cur.clone())
    }

    /// One request to one node, bounded by the request timeout. A request that fails drops its
    /// connection (the next one opens a new connection: a hung node's old one may never answer
    /// again) and marks the node suspect; any answer clears that.
    async fn call(&self, addr: SocketAddr, h: Header, payload: Bytes) -> Result<Frame, ConnError> {
        self.call_with_prefix(addr, h, Bytes::new(), payload).await
    }

    /// [`Client::call`] with a payload of `prefix` then `payload`.
    async fn call_with_prefix(
        &self,
        addr: SocketAddr,
        h: Header,
        prefix: Bytes,
        payload: Bytes,
    ) -> Result<Frame, ConnError> {
        let connect = CONNECT_TIMEOUT.min(self.opts.request_timeout);
        let res = match self.pool.get(addr, connect).await {
            Ok(conn) => {
                conn.call_with_prefix(h, prefix, payload, self.opts.request_timeout)
                    .await
            }
            Err(e) => Err(e),
        };
        match &res {
            Ok(_) => {
                let mut s = self.suspects.lock().unwrap();
                if !s.is_empty() {
                    s.remove(&addr);
                }
            }
            Err(e) => {
                tracing::debug!("{addr}: {e}");
                self.suspects.lock().unwrap().insert(addr);
                self.pool.drop_conn(addr).await;
            }
        }
        res
    }

    /// `addrs` in the same order, except that suspect nodes come last.
    fn suspects_last(&self, mut addrs: Vec<SocketAddr>) -> Vec<SocketAddr> {
        let s = self.suspects.lock().unwrap();
        if !s.is_empty() {
            // A stable sort: the placement order stays among the trusted and the suspect.
            addrs.sort_by_key(|a| s.contains(a));
        }
        addrs
    }

    /// Sends an epoch-free request to the first node that answers.
    async fn any_node(
        &self,
        op: Opcode,
        payload: Bytes,
    ) -> Result<(SocketAddr, Frame), ClientError> {
        let mut addrs: Vec<SocketAddr> =
            self.view().info.view.nodes.iter().map(|n| n.addr).collect();
        for a in &self.bootstrap {
            if !addrs.contains(a) {
                addrs.push(*a);
            }
        }
        let addrs = self.suspects_last(addrs);
        let mut last = String::from("no address to try");
        let mut denial = None;
        for &addr in &addrs {
            match self
                .call(addr, Header::request(op, 0, 0), payload.clone())
                .await
            {
                Ok(f) => match refusal::denied(addr, &f) {
                    Some(e) => {
                        last = e.to_string();
                        denial = Some(e);
                    }
                    None => return Ok((addr, f)),
                },
                Err(e) => match refusal::refused(e) {
                    Ok(e) => {
                        last = e.to_string();
                        denial = Some(e);
                    }
                    Err(e) => last = e.to_string(),
                },
            }
        }
        // Every node failed and one refused us: that is the answer, not an outage.
        if let Some(e) = denial {
            return Err(e);
        }
        Err(ClientError::Unreachable {
            addrs: addrs
                .iter()
                .map(|a| a.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            reason: last,
        })
    }

    async fn retry<T, F, Fut>(&self, mut attempt: F) -> Result<T, ClientError>
    where
        F: FnMut(Arc<ClusterView>) -> Fut,
        Fut: Future<Output = Step<T>>,
    {
        let start = Instant::now();
        let mut backoff = Duration::from_millis(20);
        loop {
            match attempt(self.view()).await {
                Step::Done(t) => return Ok(t),
                Step::Fatal(e) => return Err(e),
                Step::Retry(why) => {
                    if start.elapsed() >= self.opts.timeout {
                        return Err(ClientError::Timeout {
                            secs: start.elapsed().as_secs_f64(),
                            last: why,
                        });
                    }
                    tracing::debug!("retrying: {why}");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_millis(500));
                    let _ = self.refresh().await;
                }
            }
        }
    }

    fn order_lock(&self, oid: ObjectId) -> &tokio::sync::Mutex<()> {
        let h = oid.0.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        &self.order[(h >> 32) as usize % ORDER_SHARDS]
    }

    /// Reads `len` bytes at `offset` of object `oid` from the first replica that answers: any
    /// failure of one replica (no answer in time, a lost connection, an error code, a short
    /// answer) moves to the next at once; suspect nodes are tried last. Fails with the first
    /// replica's error only when every replica failed and none of them asks for a retry.
    pub async fn read_obj(
        &self,
        oid: ObjectId,
        offset: u64,
        len: u32,
    ) -> Result<Bytes, ClientError> {
        let mut h = Header::request(Opcode::ReadObj, 0, 0);
        h.oid = oid.0;
        h.offset = offset;
        h.length = len;
        self.retry(|v| async move {
            let targets = match targets(&v, oid) {
                Ok(t) => self.suspects_last(t),
                Err(step) => return step,
            };
            let mut h = h;
            h.epoch = v.epoch();
            let mut retry = None;
            let mut fatal = None;
            for addr in targets {
                match answer(addr, self.call(addr, h, Bytes::new()).await) {
                    Answer::Ok(f) if f.payload.len() == len as usize => {
                        return Step::Done(f.payload)
                    }
                    Answer::Ok(f) => {
                        retry = Some(format!("{addr} sent {} bytes, not {len}", f.payload.len()))
                    }
                    Answer::NotFound => {}
                    Answer::Retry(why) => retry = Some(why),
                    // Not this replica's to decide for the others: the next one may serve.
                    Answer::Fatal(ClientError::NotFormatted) => {
                        return Step::Fatal(ClientError::NotFormatted)
                    }
                    Answer::Fatal(e) => {
                        tracing::debug!("reading {oid} from {addr}: {e}; trying the next replica");
                        fatal.get_or_insert(e);
                    }
                }
            }
            match (retry, fatal) {
                (Some(why), _) => Step::Retry(why),
                (None, Some(e)) => Step::Fatal(e),
                (None, None) => Step::Fatal(ClientError::NotFound(oid)),
            }
        })
        .await
    }

    /// Makes every write acknowledged before this call durable on every node: first writes
    /// what this client holds back (a VDI handle's map entries), then flushes every node.
    pub async fn flush(&self) -> Result<(), ClientError> {
        let held = self.write_held().await?;
        self.retry(|v| async move {
            let h = Header::request(Opcode::Flush, 0, v.epoch());
            let results = futures::future::join_all(
                v.info
                    .view
                    .nodes
                    .iter()
                    .map(|n| async move { (n.addr, self.call(n.addr, h, Bytes::new()).await) }),
            )
            .await;
            for (addr, res) in results {
                match answer(addr, res) {
                    Answer::Ok(_) => {}
                    Answer::Retry(why) => return Step::Retry(why),
                    Answer::NotFound => return Step::Retry(format!("{addr}: flush not found")),
                    Answer::Fatal(e) => return Step::Fatal(e),
                }
            }
            Step::Done(())
        })
        .await?;
        for (p, mark) in held {
            p.flushed(mark);
        }
        Ok(())
    }

    /// Writes what every handle of this client holds back (VDI handles' map entries: those
    /// queued, those a batch has on their way, and those written since the last flush),
    /// without flushing the nodes: once it returns, every change acknowledged through this
    /// client before the call is in the objects it belongs to. Returns each holder with its
    /// mark, for [`BeforeFlush::flushed`] once the nodes are flushed.
    pub(crate) async fn write_held(&self) -> Result<Vec<(Arc<dyn BeforeFlush>, u64)>, ClientError> {
        let pending: Vec<Arc<dyn BeforeFlush>> = self
            .before_flush
            .lock()
            .unwrap()
            .iter()
            .filter_map(|w| w.upgrade())
            .collect();
        let mut held = Vec::with_capacity(pending.len());
        for p in pending {
            let mark = p.write_pending().await?;
            held.push((p, mark));
        }
        Ok(held)
    }

    /// What node `addr` holds of `oid` (its version, or a tombstone), or None if nothing.
    pub async fn stat_obj(
        &self,
        addr: SocketAddr,
        oid: ObjectId,
    ) -> Result<Option<ObjState>, ClientError> {
        let mut h = Header::request(Opcode::StatObj, 0, 0);
        h.oid = oid.0;
        match answer(addr, self.call(addr, h, Bytes::new()).await) {
            Answer::Ok(f) => Ok(Some(ObjState::from_wire(f.header.offset, f.header.aux))),
            Answer::NotFound => Ok(None),
            Answer::Retry(why) => Err(unreachable(addr, why)),
            Answer::Fatal(e) => Err(e),
        }
    }

    /// Every node of `view` with its status (or why it did not answer), asked in parallel.
    pub async fn node_statuses(
        &self,
        view: &ClusterView,
    ) -> Vec<(
        objstore_proto::view::NodeInfo,
        Result<NodeStatus, ClientError>,
    )> {
        let nodes = view.info.view.nodes.clone();
        let statuses =
            futures::future::join_all(nodes.iter().map(|n| self.node_status(n.addr))).await;
        nodes.into_iter().zip(statuses).collect()
    }

    pub async fn node_status(&self, addr: SocketAddr) -> Result<NodeStatus, ClientError> {
        self.node_json(addr, Opcode::NodeStatus).await
    }

    /// Node `addr`'s status and counters (`NodeStat`).
    pub async fn node_stats(
        &self,
        addr: SocketAddr,
    ) -> Result<objstore_proto::api::NodeStats, ClientError> {
        self.node_json(addr, Opcode::NodeStat).await
    }

    /// A request without a body to node `addr` that answers JSON.
    async fn node_json<T: serde::de::DeserializeOwned>(
        &self,
        addr: SocketAddr,
        op: Opcode,
    ) -> Result<T, ClientError> {
        let h = Header::request(op, 0, 0);
        match answer(addr, self.call(addr, h, Bytes::new()).await) {
            Answer::Ok(f) => parse(addr, &f.payload),
            Answer::Fatal(e) => Err(e),
            Answer::NotFound => Err(unreachable(addr, "answered not found".into())),
            Answer::Retry(why) => Err(unreachable(addr, why)),
        }
    }

    /// Formats the cluster; `min_copies` None takes the default for `copies`.
    pub async fn format(
        &self,
        copies: u32,
        min_copies: Option<u32>,
        object_size: u64,
    ) -> Result<(), ClientError> {
        self.format_with(FormatRequest {
            copies,
            min_copies,
            object_size,
            vdi_redundancy: None,
        })
        .await
    }

    /// Formats the cluster as `req` says (with VDIs erasure-coded by default, say).
    pub async fn format_with(&self, req: FormatRequest) -> Result<(), ClientError> {
        let body = serde_json::to_vec(&req).expect("serializable");
        let (addr, f) = self.any_node(Opcode::Format, Bytes::from(body)).await?;
        match answer(addr, Ok(f)) {
            Answer::Ok(_) => {
                self.refresh().await?;
                Ok(())
            }
            Answer::Fatal(e) => Err(e),
            Answer::NotFound => Err(unreachable(addr, "answered not found".into())),
            Answer::Retry(why) => Err(unreachable(addr, why)),
        }
    }

    /// A key-value request to any node, retried (all nodes unreachable, busy) until the
    /// client's timeout.
    async fn kv_call(&self, op: Opcode, body: Bytes) -> Result<Option<Frame>, ClientError> {
        self.retry(|_| {
            let body = body.clone();
            async move {
                let (addr, f) = match self.any_node(op, body).await {
                    Ok(r) => r,
                    Err(e @ ClientError::Unreachable { .. }) => return Step::Retry(e.to_string()),
                    Err(e) => return Step::Fatal(e),
                };
                match answer(addr, Ok(f)) {
                    Answer::Ok(f) => Step::Done(Some(f)),
                    Answer::NotFound => Step::Done(None),
                    Answer::Fatal(e) => Step::Fatal(e),
                    Answer::Retry(why) => Step::Retry(why),
                }
            }
        })
        .await
    }
}

mod batch;
mod change;
mod check;
mod direct;
mod kv;
mod refusal;
mod view;

pub use view::ClusterView;

fn unreachable(addr: SocketAddr, reason: String) -> ClientError {
    ClientError::Unreachable {
        addrs: addr.to_string(),
        reason,
    }
}

fn parse<T: serde::de::DeserializeOwned>(
    addr: SocketAddr,
    payload: &[u8],
) -> Result<T, ClientError> {
    serde_json::from_slice(payload).map_err(|e| ClientError::BadReply {
        addr,
        reason: e.to_string(),
    })
}
