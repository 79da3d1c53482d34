//! The transport seam: how a connection to a node is opened and how a node accepts them. TCP
//! in production; [`MemNetwork`] in tests, where nodes and clients of one process talk over
//! in-memory pipes (no ports, no root), and a test can refuse connections to a node or inject
//! network faults (partitions, delays, resets, dead nodes: see [`mem`]).
//!
//! ```text
//!  Client / node peers ── Pool ── Conn ──► Transport::connect(addr) ──► (reader, writer)
//!  node server ◄── Listener::accept() ◄── TcpListener | MemListener
//! ```

pub mod handshake;
pub mod mem;

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use futures::future::BoxFuture;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};

pub use handshake::Refused;
pub use mem::{ConnInfo, Delay, Link, MemListener, MemNetwork};
use objstore_proto::auth::KeyFile;

/// The reading half of a connection.
pub type Reader = Box<dyn AsyncRead + Send + Unpin>;
/// The writing half of a connection.
pub type Writer = Box<dyn AsyncWrite + Send + Unpin>;

/// The read and write buffer of each side of a connection: 256 KiB, so that a 4 MiB object
/// moves in a few large reads and writes.
pub const IO_BUFFER: usize = 256 << 10;

/// Opens connections to nodes.
pub trait Transport: Send + Sync + 'static {
    /// Connects to `addr`.
    fn connect(&self, addr: SocketAddr) -> BoxFuture<'static, io::Result<(Reader, Writer)>>;

    /// The read and write buffer each connection through this transport gets, at both ends
    /// (a node's server takes its peers' transport's): [`IO_BUFFER`], unless a test of
    /// hundreds of nodes in one process asks for less ([`MemNetwork::set_io_buffer`]).
    fn io_buffer(&self) -> usize {
        IO_BUFFER
    }
}

/// TCP, with Nagle off. With a key file, every connection opens with the cluster key's
/// handshake ([`handshake`]); without one (`Tcp::default()`), it sends no handshake and talks
/// only to nodes that run without a key (`sheep --no-auth`).
#[derive(Debug, Default, Clone)]
pub struct Tcp {
    key: Option<Arc<KeyFile>>,
}

impl Tcp {
    /// TCP whose connections prove they hold the keys of `key` (None: no handshake).
    pub fn with_key(key: Option<Arc<KeyFile>>) -> Tcp {
        Tcp { key }
    }
}

impl Transport for Tcp {
    fn connect(&self, addr: SocketAddr) -> BoxFuture<'static, io::Result<(Reader, Writer)>> {
        let key = self.key.clone();
        Box::pin(async move {
            let stream = TcpStream::connect(addr).await?;
            let _ = stream.set_nodelay(true);
            let (mut rd, mut wr) = stream.into_split();
            if let Some(key) = key {
                handshake::initiate(&mut rd, &mut wr, &key, addr).await?;
            }
            Ok((Box::new(rd) as Reader, Box::new(wr) as Writer))
        })
    }
}

/// Where a node accepts connections.
pub enum Listener {
    Tcp(TcpListener),
    Mem(MemListener),
}

impl Listener {
    /// The address it accepts on.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        match self {
            Listener::Tcp(l) => l.local_addr(),
            Listener::Mem(l) => Ok(l.addr),
        }
    }

    /// The next connection and the peer's address.
    pub async fn accept(&mut self) -> io::Result<(Reader, Writer, SocketAddr)> {
        match self {
            Listener::Tcp(l) => {
                let (stream, peer) = l.accept().await?;
                let _ = stream.set_nodelay(true);
                let (rd, wr) = stream.into_split();
                Ok((Box::new(rd), Box::new(wr), peer))
            }
            Listener::Mem(l) => {
                let (stream, peer) = l.rx.recv().await.ok_or_else(|| {
                    io::Error::new(io::ErrorKind::NotConnected, "in-memory listener closed")
                })?;
                let (rd, wr) = tokio::io::split(stream);
                Ok((Box::new(rd), Box::new(wr), peer))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn mem_network_connects_and_refuses() {
        let net = MemNetwork::new();
        let addr: SocketAddr = "10.0.0.1:7000".parse().unwrap();
        assert!(net.connect(addr).await.is_err());
        let mut l = net.listen(addr).unwrap();
        assert!(net.listen(addr).is_err());
        let (mut r, mut w) = net.connect(addr).await.unwrap();
        let (mut sr, mut sw, _) = l.accept().await.unwrap();
        w.write_all(b"ping").await.unwrap();
        let mut b = [0u8; 4];
        sr.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"ping");
        sw.write_all(b"pong").await.unwrap();
        r.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"pong");
        net.close(addr);
        let e = net.connect(addr).await.err().unwrap();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused);
    }
}
