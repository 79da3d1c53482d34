//! A multiplexed connection to one node: many requests in flight, matched to their responses
//! by request id. A writer task batches outgoing frames; a reader task routes responses. When
//! the connection breaks every waiting caller gets [`ConnError::Closed`].

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use thiserror::Error;
use tokio::io::{AsyncWriteExt, BufReader, BufWriter};
use tokio::sync::{mpsc, oneshot};

use objstore_proto::frame::{read_frame_aligned, write_frame_parts, Frame, Header, ResultCode};

use crate::transport::{Refused, Tcp, Transport, Writer};

#[derive(Debug, Error, Clone)]
#[non_exhaustive]
pub enum ConnError {
    #[error("cannot connect to {addr}: {reason}")]
    Connect { addr: SocketAddr, reason: String },
    #[error("connection to {0} closed")]
    Closed(SocketAddr),
    #[error("no answer from {0} within {1:?}")]
    Timeout(SocketAddr, Duration),
    #[error("bad frame from {addr}: {reason}")]
    BadFrame { addr: SocketAddr, reason: String },
    /// The handshake failed: a key refused (either way: `Unauthenticated`) or the node's
    /// connection limit (`LimitReached`). Not worth retrying; the message says why.
    #[error("{message}")]
    Refused {
        addr: SocketAddr,
        code: ResultCode,
        message: String,
    },
}

/// Waiters by request id; ordered, so a broken connection wakes them in the order they asked
/// (the fault simulator replays a seed exactly only if wake-ups do not follow a hash seed).
type Pending = Arc<Mutex<BTreeMap<u64, oneshot::Sender<Frame>>>>;

/// A frame to send: its payload is `prefix` then `payload` (a prefix saves copying object data
/// behind a few bytes of request fields).
pub(crate) struct Outgoing {
    header: Header,
    prefix: Bytes,
    payload: Bytes,
}

/// One TCP connection to a node.
pub struct Conn {
    addr: SocketAddr,
    tx: mpsc::UnboundedSender<Outgoing>,
    pending: Pending,
    next_id: AtomicU64,
    closed: Arc<AtomicBool>,
}

impl Conn {
    pub async fn connect(addr: SocketAddr, timeout: Duration) -> Result<Conn, ConnError> {
        Conn::connect_via(&Tcp::default(), addr, timeout).await
    }

    /// Opens a connection to `addr` through `transport`.
    pub async fn connect_via(
        transport: &dyn Transport,
        addr: SocketAddr,
        timeout: Duration,
    ) -> Result<Conn, ConnError> {
        let (rd, wr) = tokio::time::timeout(timeout, transport.connect(addr))
            .await
            .map_err(|_| ConnError::Connect {
                addr,
                reason: format!("timed out after {timeout:?}"),
            })?
            .map_err(
                |e| match e.get_ref().and_then(|i| i.downcast_ref::<Refused>()) {
                    Some(r) => ConnError::Refused {
                        addr,
                        code: r.code,
                        message: r.message.clone(),
                    },
                    None => ConnError::Connect {
                        addr,
                        reason: e.to_string(),
                    },
                },
            )?;
        let buffer = transport.io_buffer();
        let (tx, mut rx) = mpsc::unbounded_channel::<Outgoing>();
        let pending: Pending = Arc::default();
        let closed = Arc::new(AtomicBool::new(false));

        let closed_w = closed.clone();
        tokio::spawn(async move {
            pump_frames(wr, &mut rx, buffer).await;
            closed_w.store(true, Ordering::SeqCst);
        });

        let pending_r = pending.clone();
        let closed_r = closed.clone();
        tokio::spawn(async move {
            let mut r = BufReader::with_capacity(buffer, rd);
            loop {
                match read_frame_aligned(&mut r).await {
                    Ok(Some(frame)) => {
                        let waiter = pending_r.lock().unwrap().remove(&frame.header.req_id);
                        if let Some(w) = waiter {
                            let _ = w.send(frame);
                        }
                    }
                    Ok(None) => break,
                    Err(e) => {
                        tracing::warn!("closing connection to {addr}: {e}");
                        break;
                    }
                }
            }
            closed_r.store(true, Ordering::SeqCst);
            // Dropping the senders wakes every waiter with an error.
            pending_r.lock().unwrap().clear();
        });

        Ok(Conn {
            addr,
            tx,
            pending,
            next_id: AtomicU64::new(1),
            closed,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Sends a request and waits for its response. `header.req_id` is assigned here.
    pub async fn call(
        &self,
        header: Header,
        payload: Bytes,
        timeout: Duration,
    ) -> Result<Frame, ConnError> {
        self.call_with_prefix(header, Bytes::new(), payload, timeout)
            .await
    }

    /// [`Conn::call`] with a payload of `prefix` followed by `payload`, sent without joining
    /// them.
    pub async fn call_with_prefix(
        &self,
        mut header: Header,
        prefix: Bytes,
        payload: Bytes,
        timeout: Duration,
    ) -> Result<Frame, ConnError> {
        if self.is_closed() {
            return Err(ConnError::Closed(self.addr));
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        header.req_id = id;
        header.payload_len = (prefix.len() + payload.len()) as u32;
        let (otx, orx) = oneshot::channel();
        self.pending.lock().unwrap().insert(id, otx);
        let out = Outgoing {
            header,
            prefix,
            payload,
        };
        if self.tx.send(out).is_err() {
            self.pending.lock().unwrap().remove(&id);
            return Err(ConnError::Closed(self.addr));
        }
        match tokio::time::timeout(timeout, orx).await {
            Ok(Ok(frame)) => Ok(frame),
            Ok(Err(_)) => Err(ConnError::Closed(self.addr)),
            Err(_) => {
                self.pending.lock().unwrap().remove(&id);
                Err(ConnError::Timeout(self.addr, timeout))
            }
        }
    }
}

/// Writes queued frames to `wr` through a buffer of `buffer` bytes, batching what is queued
/// before each flush, until the queue closes (then it shuts the writing side down) or a write
/// fails.
pub(crate) async fn pump_frames(
    wr: Writer,
    rx: &mut mpsc::UnboundedReceiver<Outgoing>,
    buffer: usize,
) {
    let mut w = BufWriter::with_capacity(buffer, wr);
    while let Some(o) = rx.recv().await {
        if write_frame_parts(&mut w, &o.header, &[&o.prefix, &o.payload])
            .await
            .is_err()
        {
            return;
        }
        while let Ok(o) = rx.try_recv() {
            if write_frame_parts(&mut w, &o.header, &[&o.prefix, &o.payload])
                .await
                .is_err()
            {
                return;
            }
        }
        if w.flush().await.is_err() {
            return;
        }
    }
    // Every handle of the connection is gone: say so to the node, which then closes its side,
    // and the reading task ends. A TCP write half does this when dropped; an in-memory pipe's
    // half does not, and each dropped connection stayed open for good (at 200 nodes in one
    // process, thousands of them, with their buffers).
    let _ = w.shutdown().await;
}

/// Connections by address, opened on first use and replaced when they break.
pub struct Pool {
    transport: Arc<dyn Transport>,
    conns: tokio::sync::Mutex<HashMap<SocketAddr, Arc<Conn>>>,
}

impl Default for Pool {
    /// Over TCP.
    fn default() -> Self {
        Pool::new(Arc::new(Tcp::default()))
    }
}

impl Pool {
    /// Connections opened through `transport`.
    pub fn new(transport: Arc<dyn Transport>) -> Pool {
        Pool {
            transport,
            conns: Default::default(),
        }
    }

    /// The read and write buffer of each connection ([`Transport::io_buffer`]).
    pub fn io_buffer(&self) -> usize {
        self.transport.io_buffer()
    }

    /// The open connection to `addr`, or a new one. The map is not held while connecting: a
    /// connect to a host cut off (its SYNs dropped) lasts its whole `timeout`, and must not
    /// hold up requests to every other node meanwhile. Two tasks connecting at once may both
    /// connect; the first to finish is kept, the other's connection is closed.
    pub async fn get(&self, addr: SocketAddr, timeout: Duration) -> Result<Arc<Conn>, ConnError> {
        if let Some(c) = self.open(addr).await {
            return Ok(c);
        }
        let c = Arc::new(Conn::connect_via(&*self.transport, addr, timeout).await?);
        let mut conns = self.conns.lock().await;
        if let Some(old) = conns.get(&addr) {
            if !old.is_closed() {
                return Ok(old.clone());
            }
        }
        conns.insert(addr, c.clone());
        Ok(c)
    }

    async fn open(&self, addr: SocketAddr) -> Option<Arc<Conn>> {
        let conns = self.conns.lock().await;
        conns.get(&addr).filter(|c| !c.is_closed()).cloned()
    }

    /// Forgets a connection that failed, so the next call opens a new one.
    pub async fn drop_conn(&self, addr: SocketAddr) {
        self.conns.lock().await.remove(&addr);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::{Reader, Tcp, Transport, Writer};
    use futures::future::BoxFuture;

    /// TCP, except that a connect to `cut` never completes (a host whose SYNs are dropped).
    struct OneCut {
        cut: SocketAddr,
    }

    impl Transport for OneCut {
        fn connect(
            &self,
            addr: SocketAddr,
        ) -> BoxFuture<'static, std::io::Result<(Reader, Writer)>> {
            if addr == self.cut {
                Box::pin(std::future::pending())
            } else {
                Tcp::default().connect(addr)
            }
        }
    }

    #[tokio::test]
    async fn a_connect_to_a_cut_host_holds_up_no_other_connection() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let good = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((s, _)) = listener.accept().await {
                held.push(s);
            }
        });
        let cut: SocketAddr = "127.0.0.1:1".parse().unwrap();
        let pool = Arc::new(Pool::new(Arc::new(OneCut { cut })));
        let p = pool.clone();
        let stuck = tokio::spawn(async move { p.get(cut, Duration::from_secs(30)).await });
        // Let the stuck connect start and take whatever it takes.
        tokio::task::yield_now().await;
        let c = tokio::time::timeout(
            Duration::from_secs(5),
            pool.get(good, Duration::from_secs(5)),
        )
        .await
        .expect("a connect to a healthy node waited for the cut one")
        .unwrap();
        assert_eq!(c.addr(), good);
        // The same open connection is handed out again.
        let again = pool.get(good, Duration::from_secs(5)).await.unwrap();
        assert!(Arc::ptr_eq(&c, &again));
        stuck.abort();
    }
}
