//! The cache's control socket: `DIR/control.sock` in the cache directory, mode 0600, JSON
//! lines (the protocol is `cache_control`). Served here, above both the cache and the
//! filesystem: `cachectl mode` may have the filesystem take an open file over into the cache.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use cache_control::{CacheMode, Reply, Request, Response, SOCKET_NAME};
use objcache::{chain, Cache};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

use crate::handles::Shared;
use crate::switch::Op;

/// Binds the socket (replacing a stale one) with mode 0600.
pub(crate) fn bind(dir: &Path) -> std::io::Result<UnixListener> {
    let path = dir.join(SOCKET_NAME);
    let _ = std::fs::remove_file(&path);
    let l = UnixListener::bind(&path)?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    Ok(l)
}

/// Removes the socket (at unmount).
pub fn remove(dir: &Path) {
    let _ = std::fs::remove_file(dir.join(SOCKET_NAME));
}

/// Answers every connection; `sh` has the cache.
pub(crate) async fn serve(sh: Arc<Shared>, cache: Cache, listener: UnixListener) {
    loop {
        match listener.accept().await {
            Ok((s, _)) => {
                tokio::spawn(session(sh.clone(), cache.clone(), s));
            }
            Err(e) => {
                tracing::warn!("control socket: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            }
        }
    }
}

async fn send(w: &mut tokio::net::unix::OwnedWriteHalf, r: &Response) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(r).expect("serializable");
    line.push(b'\n');
    w.write_all(&line).await
}

/// The longest request line taken: requests are a few hundred bytes, and a peer that sends
/// more without a newline is cut off instead of growing our buffer.
pub const MAX_LINE: usize = 64 << 10;

async fn session(sh: Arc<Shared>, cache: Cache, s: UnixStream) {
    let (rd, mut wr) = s.into_split();
    let mut rd = BufReader::new(rd);
    let mut line = Vec::new();
    loop {
        line.clear();
        match (&mut rd)
            .take(MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut line)
            .await
        {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
        if line.len() > MAX_LINE {
            let why = format!("request line longer than {MAX_LINE} bytes; closing");
            let _ = send(&mut wr, &Response::Error(why)).await;
            return;
        }
        let text = line.strip_suffix(b"\n").unwrap_or(&line);
        let text = text.strip_suffix(b"\r").unwrap_or(text);
        let req: Request = match serde_json::from_slice(text) {
            Ok(r) => r,
            Err(e) => {
                let _ = send(&mut wr, &Response::Error(format!("bad request: {e}"))).await;
                continue;
            }
        };
        let resp = handle(&sh, &cache, req, &mut wr).await;
        if send(&mut wr, &resp).await.is_err() {
            return;
        }
    }
}

fn unknown(name: &str) -> Response {
    Response::Error(format!("no VDI named '{name}' in the cluster"))
}

async fn handle(
    sh: &Shared,
    cache: &Cache,
    req: Request,
    wr: &mut tokio::net::unix::OwnedWriteHalf,
) -> Response {
    // A VDI of the cluster that nothing was cached of has id 0 here: nothing to do for it.
    let names = objstore_client::vdi::list_names(sh.client())
        .await
        .unwrap_or_default();
    let vid_of = |name: &Option<String>| -> Result<Option<u32>, Box<Response>> {
        match name {
            None => Ok(None),
            Some(n) => match cache.vid_of(n) {
                Some(v) => Ok(Some(v)),
                None if names.iter().any(|(x, _)| x == n) => Ok(Some(0)),
                None => Err(Box::new(unknown(n))),
            },
        }
    };
    match req {
        Request::Stats { vdi } => {
            let mut st = cache.stats();
            if let Some(n) = vdi {
                if let Err(r) = vid_of(&Some(n.clone())) {
                    return *r;
                }
                st.vdis.retain(|v| v.name == n);
            }
            Response::Ok(Reply::Stats(st))
        }
        Request::Flush { vdi } => {
            let vid = match vid_of(&vdi) {
                Ok(v) => v,
                Err(r) => return *r,
            };
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
            let flush = cache.flush(vid, move |p, t| {
                let _ = tx.send((p, t));
            });
            tokio::pin!(flush);
            loop {
                tokio::select! {
                    r = &mut flush => {
                        return match r {
                            Ok(bytes) => Response::Ok(Reply::Flushed { bytes }),
                            Err(e) => Response::Error(format!("flush failed (the data stays dirty and is retried): {}", chain(&e))),
                        };
                    }
                    Some((pushed, total)) = rx.recv() => {
                        let _ = send(wr, &Response::Progress { pushed, total }).await;
                    }
                }
            }
        }
        Request::Evict { vdi, discard_dirty } => {
            let vid = match vid_of(&vdi) {
                Ok(v) => v,
                Err(r) => return *r,
            };
            if !discard_dirty {
                if let Err(e) = cache.flush(vid, |_, _| {}).await {
                    return Response::Error(format!(
                        "evict: flushing dirty data first failed, nothing evicted: {}",
                        chain(&e)
                    ));
                }
            }
            let (bytes, discarded) = cache.evict(vid, discard_dirty);
            if discarded > 0 {
                tracing::warn!("cachectl evict --discard-dirty threw away {discarded} bytes of unpushed writes");
            }
            Response::Ok(Reply::Evicted {
                bytes,
                discarded_dirty: discarded,
            })
        }
        Request::Resize { size } => {
            if size < 16 << 20 {
                return Response::Error(format!("cache size {size} is too small: at least 16 MiB"));
            }
            if !cache.resize(size).await {
                return Response::Error(format!(
                    "resized to {size} bytes, but the cache could not shrink to it yet (dirty data the cluster has not taken)"
                ));
            }
            Response::Ok(Reply::Resized { size })
        }
        Request::Mode { vdi, mode } => {
            let Some(vid) = cache.vid_of(&vdi) else {
                return Response::Error(match vid_of(&Some(vdi.clone())) {
                    Ok(_) => format!(
                        "VDI '{vdi}' has not been opened through this cache yet: open it first"
                    ),
                    Err(_) => format!("no VDI named '{vdi}' in the cluster"),
                });
            };
            if cache.mode_of(vid) == CacheMode::Writeback && mode != CacheMode::Writeback {
                if let Err(e) = cache.flush(Some(vid), |_, _| {}).await {
                    return Response::Error(format!(
                        "leaving writeback needs a flush, which failed (mode unchanged): {}",
                        chain(&e)
                    ));
                }
            }
            cache.set_mode(vid, mode);
            let mut attached = cache.is_attached(vid);
            if mode != CacheMode::Off && !attached {
                // The VDI's open read-write file, if it has one, goes under the cache.
                match sh.take_over(vid).await {
                    Ok(took) => attached = took,
                    Err(e) => {
                        return Response::Error(format!(
                            "VDI '{vdi}' is now {mode}, but the cache could not take over its open file, which goes on straight to the cluster until its next read-write open: {}",
                            chain(&e)
                        ))
                    }
                }
            }
            Response::Ok(Reply::Mode {
                vdi,
                mode,
                attached: Some(attached),
            })
        }
        Request::Snapshot { vdi, tag } => match sh.switch(cache, Op::Snapshot { vdi, tag }).await {
            Ok(done) => Response::Ok(Reply::Snapshot(done)),
            Err(e) => Response::Error(format!("snapshot: {e}")),
        },
        Request::Rollback { snapshot } => match sh.switch(cache, Op::Rollback { snapshot }).await {
            Ok(done) => Response::Ok(Reply::Rollback(done)),
            Err(e) => Response::Error(format!("rollback: {e}")),
        },
    }
}
