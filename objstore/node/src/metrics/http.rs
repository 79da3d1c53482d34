//! `sheep --metrics ADDR`: a minimal HTTP/1.x server answering `GET /metrics` with the
//! node's Prometheus text ([`super::text::render`]) and 404 to anything else; one request
//! per connection, then the connection is closed. Requests are read up to 8 KiB and 10 s.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::Node;

const MAX_REQUEST: usize = 8 << 10;
const READ_TIMEOUT: Duration = Duration::from_secs(10);

/// Binds `addr`; the returned listener is served by [`serve`].
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

/// Serves the node's metrics on `listener` until the task is dropped.
pub async fn serve(node: Arc<Node>, listener: TcpListener) {
    loop {
        match listener.accept().await {
            Ok((sock, _)) => {
                let node = node.clone();
                tokio::spawn(async move {
                    if let Err(e) = answer(&node, sock).await {
                        tracing::debug!("metrics request: {e}");
                    }
                });
            }
            Err(e) => {
                tracing::warn!("metrics: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn answer(node: &Node, mut sock: TcpStream) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let head = tokio::time::timeout(READ_TIMEOUT, async {
        let mut chunk = [0u8; 1024];
        loop {
            if buf.windows(4).any(|w| w == b"\r\n\r\n") || buf.windows(2).any(|w| w == b"\n\n") {
                return Ok::<bool, std::io::Error>(true);
            }
            if buf.len() >= MAX_REQUEST {
                return Ok(false);
            }
            let n = sock.read(&mut chunk).await?;
            if n == 0 {
                return Ok(!buf.is_empty());
            }
            buf.extend_from_slice(&chunk[..n]);
        }
    })
    .await
    .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "request not read in time"))??;
    let line = buf.split(|&b| b == b'\n').next().unwrap_or_default();
    let line = String::from_utf8_lossy(line);
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = path.split('?').next().unwrap_or("");
    let (status, ctype, body) = if !head {
        (
            "431 Request Header Fields Too Large",
            "text/plain",
            "request too large\n".to_string(),
        )
    } else if method != "GET" && method != "HEAD" {
        (
            "405 Method Not Allowed",
            "text/plain",
            "only GET /metrics\n".to_string(),
        )
    } else if path == "/metrics" {
        (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            super::text::render(&node.stats()),
        )
    } else {
        (
            "404 Not Found",
            "text/plain",
            "only GET /metrics\n".to_string(),
        )
    };
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    if method != "HEAD" {
        out.extend_from_slice(body.as_bytes());
    }
    sock.write_all(&out).await?;
    sock.shutdown().await
}
