//! Who may use the node, and how much: the acceptor's side of the cluster-key handshake, the
//! cap on connections, and the caps on requests and bytes in flight per connection.
//!
//! ```text
//!  accept ──► slot? ── no ──► LimitReached answer, close
//!               │ yes
//!  TCP with a key: handshake within HANDSHAKE_TIMEOUT ── fails ──► Unauthenticated answer, close
//!               │ proved
//!  frames ──► per-connection permits (requests, bytes) ──► request task ──► answer ──► permits back
//! ```
//!
//! Before the handshake the node reads only 48-byte headers and the handshake's 32-byte
//! payloads: a frame of any other kind is answered `Unauthenticated` without its payload being
//! read, so an unauthenticated connection costs a socket, a small task, and at most
//! [`HANDSHAKE_TIMEOUT`]. After it, a connection whose requests (payloads, plus the answers of
//! reads) reach the caps is no longer read from until answers drain: TCP pushes back on that
//! sender only, and every other connection goes on.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use objstore_client::transport::handshake::read_small_frame;
use objstore_client::transport::{Reader, Writer};
use objstore_proto::auth::{KeyFile, Nonce, Role, KEY_LEN};
use objstore_proto::frame::{write_frame, Frame, Header, Opcode, ResultCode, HEADER_LEN};
use objstore_proto::oid::ObjectId;

use super::Node;

/// Default [`Limits::handshake_timeout`].
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// The node's caps (`sheep --max-connections`, `--max-requests`, `--max-inflight`).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Open connections, authenticated or not.
    pub max_connections: usize,
    /// Requests in flight on one connection.
    pub max_requests: usize,
    /// Bytes in flight on one connection: request payloads plus the answers of reads.
    pub max_bytes: usize,
    /// How long a new connection has to prove it holds the key before it is closed.
    pub handshake_timeout: Duration,
}

/// Default [`Limits::max_connections`].
pub const DEFAULT_MAX_CONNECTIONS: usize = 8192;
/// Default [`Limits::max_requests`].
pub const DEFAULT_MAX_REQUESTS: usize = 256;
/// Default [`Limits::max_bytes`]: sixteen 4 MiB objects.
pub const DEFAULT_MAX_BYTES: usize = 64 << 20;

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_requests: DEFAULT_MAX_REQUESTS,
            max_bytes: DEFAULT_MAX_BYTES,
            handshake_timeout: HANDSHAKE_TIMEOUT,
        }
    }
}

/// Who may connect and how much each connection may ask at once.
#[derive(Debug, Clone, Default)]
pub struct Access {
    /// The cluster key file. None: TCP connections are served without a handshake (`sheep
    /// --no-auth`). Connections over an in-memory transport never shake hands.
    pub key: Option<Arc<KeyFile>>,
    pub limits: Limits,
}

/// The node's side of [`Access`]: the open-connection count.
pub(super) struct Gate {
    pub(super) access: Access,
    open: Arc<AtomicUsize>,
}

/// One connection's slot; frees it when dropped.
pub(super) struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Gate {
    pub(super) fn new(access: Access) -> Gate {
        Gate {
            access,
            open: Arc::default(),
        }
    }

    /// A slot for a new connection, or None at the cap.
    pub(super) fn admit(&self) -> Option<Slot> {
        let max = self.access.limits.max_connections;
        let mut cur = self.open.load(Ordering::SeqCst);
        loop {
            if cur >= max {
                return None;
            }
            match self
                .open
                .compare_exchange(cur, cur + 1, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => return Some(Slot(self.open.clone())),
                Err(now) => cur = now,
            }
        }
    }

    /// The budget of one new connection.
    pub(super) fn budget(&self) -> Budget {
        let l = self.access.limits;
        Budget {
            requests: Arc::new(Semaphore::new(l.max_requests.max(1))),
            bytes: Arc::new(Semaphore::new(l.max_bytes.clamp(1, u32::MAX as usize))),
            max_bytes: l.max_bytes.clamp(1, u32::MAX as usize),
        }
    }
}

/// Tells a connection beyond the cap why it is closed (an answer to the handshake it is about
/// to send, so a client sees it as the reply to its hello) and closes it.
pub(super) async fn refuse_full(mut wr: Writer, rd: Reader, max: usize, peer: SocketAddr) {
    tracing::warn!("refused a connection from {peer}: the node has {max} open (--max-connections)");
    let mut h = Header::request(Opcode::AuthHello, 0, 0).response(ResultCode::LimitReached, 0);
    h.req_id = 0;
    let msg =
        format!("the node's limit of {max} open connections is reached (sheep --max-connections)");
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        if write_frame(&mut wr, &h, msg.as_bytes()).await.is_ok() {
            let _ = wr.flush().await;
        }
    })
    .await;
    linger(wr, rd).await;
}

/// What one connection may have in flight.
pub(super) struct Budget {
    requests: Arc<Semaphore>,
    bytes: Arc<Semaphore>,
    max_bytes: usize,
}

/// One request's share of its connection's budget, given back when dropped (after its answer
/// is written).
pub(super) struct Permit {
    _request: OwnedSemaphorePermit,
    _bytes: OwnedSemaphorePermit,
}

impl Budget {
    /// Waits until a request of `bytes` (its payload plus its answer's) fits. The caller
    /// stops reading its connection meanwhile. A request larger than the whole budget takes
    /// all of it.
    pub(super) async fn take(&self, bytes: usize) -> Permit {
        let request = self.requests.clone().acquire_owned().await.expect("open");
        let n = bytes.clamp(1, self.max_bytes) as u32;
        let bytes = self
            .bytes
            .clone()
            .acquire_many_owned(n)
            .await
            .expect("open");
        Permit {
            _request: request,
            _bytes: bytes,
        }
    }
}

/// A new connection's handshake, when it must have one (TCP, and the node has a key file):
/// the connection's halves once the peer proved it holds the key, None when it was refused
/// (told why, and closed) or did not finish within the deadline.
pub(super) async fn open(
    node: &Node,
    mut rd: Reader,
    mut wr: Writer,
    peer: SocketAddr,
    tcp: bool,
) -> Option<(Reader, Writer)> {
    let key = match (tcp, &node.gate.access.key) {
        (true, Some(key)) => key.clone(),
        _ => return Some((rd, wr)),
    };
    let deadline = node.gate.access.limits.handshake_timeout;
    match tokio::time::timeout(deadline, accept(&key, &mut rd, &mut wr)).await {
        Ok(Ok(())) => Some((rd, wr)),
        Ok(Err(refusal)) => {
            if refusal.answered {
                tracing::warn!("refused a connection from {peer}: {}", refusal.reason);
            } else {
                tracing::debug!("dropped a connection from {peer}: {}", refusal.reason);
            }
            linger(wr, rd).await;
            None
        }
        Err(_) => {
            tracing::debug!("closed a connection from {peer}: no handshake within {deadline:?}");
            None
        }
    }
}

/// The bytes a request holds until its answer is written: its payload, and what a read
/// answers with.
pub(super) fn cost(node: &Node, frame: &Frame) -> usize {
    let answer = match frame.header.opcode {
        Opcode::ReadObj => frame.header.length as usize,
        // A partial copy: the edge blocks of the write merged with the source's (a whole
        // copy takes one of the node's `WHOLE_COPIES` instead).
        Opcode::CowWrite => 2 * objstore_proto::cowrec::BLOCK as usize,
        // The target read whole.
        Opcode::FlattenObj => node.config().map(|c| c.object_size as usize).unwrap_or(0),
        // The copy here read whole: its length now (a write may grow it a little before it
        // is read). Charging the largest object instead (an inode's 64 MiB, the whole
        // budget) admitted a pull only when nothing else was in flight on the connection, so
        // a pull waited behind a forwarded write waiting for this node's own pull the other
        // way: two nodes recovering from each other stalled until the peer timeout.
        Opcode::PeerRead => node
            .store
            .object_len(ObjectId(frame.header.oid))
            .unwrap_or(0) as usize,
        _ => 0,
    };
    frame.payload.len() + answer
}

/// The acceptor's side of the handshake (see `objstore_client::transport::handshake`). On
/// failure the peer has been told why (when it sent something to answer) and the connection
/// must be closed; the reason is returned for the log.
async fn accept(key: &KeyFile, rd: &mut Reader, wr: &mut Writer) -> Result<(), Refusal> {
    let first = read_header(rd).await?;
    if first.opcode != Opcode::AuthHello
        || first.is_response()
        || first.payload_len as usize != KEY_LEN
    {
        let why = format!(
            "this node serves only connections that prove they hold the cluster key; the first frame was {:?}, not the handshake (give dog, sheepfs or sheep the cluster's key file: --key-file PATH or SHEEP_KEY_FILE)",
            first.opcode
        );
        return Err(answer_refusal(wr, &first, why).await);
    }
    let mut theirs = [0u8; KEY_LEN];
    rd.read_exact(&mut theirs)
        .await
        .map_err(|e| Refusal::silent(format!("connection lost in the handshake: {e}")))?;
    let theirs = Nonce(theirs);
    let keys = match key.keys() {
        Ok(k) => k,
        Err(e) => {
            let why = format!("the node has no usable cluster key yet ({e})");
            return Err(answer_refusal(wr, &first, why).await);
        }
    };
    let mine = Nonce::random().map_err(|e| Refusal::silent(e.to_string()))?;
    let mut payload = Vec::with_capacity(2 * KEY_LEN);
    payload.extend_from_slice(&mine.0);
    payload.extend_from_slice(&keys.prove(Role::Acceptor, &theirs, &mine));
    send(wr, &first.response(ResultCode::Ok, 0), &payload).await?;
    let proof = read_small_frame(rd)
        .await
        .map_err(|e| Refusal::silent(format!("bad handshake frame: {e}")))?;
    let h = proof.header;
    if h.opcode != Opcode::AuthProof || h.is_response() {
        let why = format!("expected the handshake's proof, got {:?}", h.opcode);
        return Err(answer_refusal(wr, &h, why).await);
    }
    if !keys.accepts(&proof.payload, Role::Initiator, &theirs, &mine) {
        let why = "its proof matches none of the node's keys: the cluster key differs (copy the cluster's key file, or finish the key rotation)".to_string();
        return Err(answer_refusal(wr, &h, why).await);
    }
    send(wr, &h.response(ResultCode::Ok, 0), &[]).await?;
    Ok(())
}

/// Why a handshake failed, for the node's log; `answered` when the peer was told.
#[derive(Debug)]
pub(super) struct Refusal {
    pub(super) reason: String,
    pub(super) answered: bool,
}

impl Refusal {
    fn silent(reason: String) -> Refusal {
        Refusal {
            reason,
            answered: false,
        }
    }
}

async fn read_header(rd: &mut Reader) -> Result<Header, Refusal> {
    let mut hb = [0u8; HEADER_LEN];
    rd.read_exact(&mut hb)
        .await
        .map_err(|e| Refusal::silent(format!("closed before the handshake: {e}")))?;
    Header::decode(&hb).map_err(|e| Refusal::silent(format!("bad frame before the handshake: {e}")))
}

async fn send(wr: &mut Writer, h: &Header, payload: &[u8]) -> Result<(), Refusal> {
    write_frame(wr, h, payload)
        .await
        .and(wr.flush().await)
        .map_err(|e| Refusal::silent(format!("connection lost in the handshake: {e}")))
}

async fn answer_refusal(wr: &mut Writer, to: &Header, why: String) -> Refusal {
    let answered = send(
        wr,
        &to.response(ResultCode::Unauthenticated, 0),
        why.as_bytes(),
    )
    .await
    .is_ok();
    Refusal {
        reason: why,
        answered,
    }
}

/// Closes a refused connection so that its answer arrives: our side is shut for writing, and
/// what the peer still sends is read and thrown away for a moment (closing with unread bytes
/// would reset the connection, and the reset can overtake the answer).
async fn linger(mut wr: Writer, mut rd: Reader) {
    let _ = wr.shutdown().await;
    drop(wr);
    let mut sink = [0u8; 4096];
    let mut left: usize = 1 << 20;
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        while left > 0 {
            match rd.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    })
    .await;
}
