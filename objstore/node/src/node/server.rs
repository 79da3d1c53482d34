//! The node's side of the wire protocol: one task per connection, one task per request, so a
//! connection carries many requests at once. A frame that does not decode closes its connection
//! (with the reason logged); every other connection goes on.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::io::{AsyncWriteExt, BufReader, BufWriter};

use objstore_client::transport::{Listener, Reader, Writer};

use super::acting::Acting;
use super::gate;
use super::replicate::Change;
use super::Node;
use crate::membership::{Driver, DriverError};
use crate::store::{ObjState, StoreError, Version};
use objstore_proto::api::{
    KvCasLeasedRequest, KvCasRequest, LeaseGrantRequest, LeaseId, RepairReply, RepairRequest,
};
use objstore_proto::frame::{read_frame, write_frame, Frame, Header, Opcode, ResultCode};
use objstore_proto::keys;
use objstore_proto::oid::ObjectId;
use objstore_proto::payload::{split_cow, split_expected, split_peer_cow, split_peer_write};
use objstore_proto::view::ClusterInfo;

/// Reads up to this size run on the request's task instead of the blocking pool.
pub(super) const INLINE_READ: usize = 64 << 10;

mod ec;
mod epoch;
mod format;
mod list;
use epoch::forwarded;
pub(super) use epoch::{change_epoch, check_range, io_epoch, stale_epoch};
use format::format;

pub(super) use super::failure::{blocking, not_recovered, task_failure, Failure};

pub(super) async fn serve(node: Arc<Node>, mut listener: Listener) {
    // Only TCP connections shake hands: an in-memory network lives inside one process.
    let tcp = matches!(listener, Listener::Tcp(_));
    loop {
        match listener.accept().await {
            Ok((rd, wr, peer)) => match node.gate.admit() {
                Some(slot) => {
                    node.spawn(connection(node.clone(), rd, wr, peer, tcp, slot));
                }
                None => {
                    let max = node.gate.access.limits.max_connections;
                    node.spawn(gate::refuse_full(wr, rd, max, peer));
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotConnected => return,
            Err(e) => {
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn connection(
    node: Arc<Node>,
    rd: Reader,
    wr: Writer,
    peer: SocketAddr,
    tcp: bool,
    _slot: gate::Slot,
) {
    let Some((rd, wr)) = gate::open(&node, rd, wr, peer, tcp).await else {
        return;
    };
    let budget = node.gate.budget();
    // Each request task writes its own response: no hop through a writer task. Request tasks
    // are never cancelled, so a frame is never left half written.
    // Buffers as large as the node's own connections to peers have.
    let buffer = node.peers.io_buffer();
    let wr = Arc::new(tokio::sync::Mutex::new(BufWriter::with_capacity(
        buffer, wr,
    )));
    let mut r = BufReader::with_capacity(buffer, rd);
    loop {
        match read_frame(&mut r).await {
            Ok(Some(frame)) => {
                // Not read further until this request fits the connection's budget.
                let permit = budget.take(gate::cost(&node, &frame)).await;
                let n = node.clone();
                let wr = wr.clone();
                node.spawn(async move {
                    let (h, payload) = handle(&n, frame).await;
                    let mut w = wr.lock().await;
                    if write_frame(&mut *w, &h, &payload).await.is_ok() {
                        let _ = w.flush().await;
                    }
                    drop(permit);
                });
            }
            Ok(None) => break,
            Err(e) => {
                tracing::warn!("closing connection from {peer}: {e}");
                break;
            }
        }
    }
}

struct Reply {
    payload: Bytes,
    aux: u32,
    /// Sent in the response's `offset` field (StatObj, PeerRead).
    version: Option<Version>,
}

impl Reply {
    fn empty() -> Reply {
        Reply::bytes(Bytes::new())
    }
    fn bytes(payload: Bytes) -> Reply {
        Reply {
            payload,
            aux: 0,
            version: None,
        }
    }
    /// An object's bytes (none for a tombstone) with its state in `offset` and `aux`.
    fn state(payload: Bytes, state: ObjState) -> Reply {
        Reply {
            payload,
            aux: state.flags(),
            version: Some(state.version),
        }
    }
    fn json<T: serde::Serialize>(v: &T) -> Reply {
        Reply::bytes(Bytes::from(serde_json::to_vec(v).expect("serializable")))
    }
}

type Handled = Result<Reply, Failure>;

async fn handle(node: &Arc<Node>, frame: Frame) -> (Header, Bytes) {
    let h = frame.header;
    let started = std::time::Instant::now();
    let bytes_in = frame.payload.len();
    let (rh, payload) = answer(node, frame).await;
    node.metrics.request(
        h.opcode,
        bytes_in,
        payload.len(),
        rh.result_code(),
        started.elapsed(),
    );
    (rh, payload)
}

async fn answer(node: &Arc<Node>, frame: Frame) -> (Header, Bytes) {
    let h = frame.header;
    let res = if h.is_response() {
        Err(Failure::invalid("a response frame was sent as a request"))
    } else {
        dispatch(node, &h, frame.payload).await
    };
    let epoch = node.epoch().view.epoch;
    if tracing::enabled!(tracing::Level::TRACE) {
        match &res {
            Ok(r) => tracing::trace!(
                "{:?} {} at epoch {} (here {epoch}): ok {:?}",
                h.opcode,
                ObjectId(h.oid),
                h.epoch,
                r.version
            ),
            Err(f) => tracing::trace!(
                "{:?} {} at epoch {} (here {epoch}): {:?} {}",
                h.opcode,
                ObjectId(h.oid),
                h.epoch,
                f.code,
                f.message
            ),
        }
    }
    match res {
        Ok(r) => {
            let mut rh = h.response(ResultCode::Ok, epoch);
            rh.aux = r.aux;
            if let Some(v) = r.version {
                rh.offset = v.0;
            }
            (rh, r.payload)
        }
        Err(f) => {
            if f.code == ResultCode::Corrupt {
                node.copy_corrupt(ObjectId(h.oid));
            }
            if f.code == ResultCode::InvalidRequest {
                tracing::warn!("refused {:?}: {}", h.opcode, f.message);
            }
            let mut rh = h.response(f.code, epoch);
            rh.aux = f.aux;
            if let Some(v) = f.version {
                rh.offset = v.0;
            }
            (rh, Bytes::from(f.message))
        }
    }
}

fn text(payload: &[u8]) -> Result<&str, Failure> {
    std::str::from_utf8(payload).map_err(|_| Failure::invalid("payload is not UTF-8"))
}

fn json<'a, T: serde::Deserialize<'a>>(payload: &'a [u8]) -> Result<T, Failure> {
    serde_json::from_slice(payload).map_err(|e| Failure::invalid(format!("bad request body: {e}")))
}

fn driver_failure(e: impl std::fmt::Display) -> Failure {
    Failure::new(ResultCode::Io, format!("membership store: {e}"))
}

/// Runs a membership-store call on the blocking pool; its failure as the client sees it.
async fn driver_call<T: Send + 'static>(
    node: &Node,
    f: impl FnOnce(&dyn Driver) -> Result<T, DriverError> + Send + 'static,
) -> Result<T, Failure> {
    let d = node.driver.clone();
    node.blocking(move || f(&*d))
        .await
        .map_err(driver_failure)?
        .map_err(store_failure)
}

/// A store that cannot be reached now (etcd down or cut off) is an outage the client waits
/// out within its timeout (`Busy`), as I/O waits out a lease past its end; any other store
/// error is final.
fn store_failure(e: DriverError) -> Failure {
    match e {
        DriverError::Unreachable { .. } => {
            Failure::new(ResultCode::Busy, format!("membership store: {e}"))
        }
        e => driver_failure(e),
    }
}

async fn dispatch(node: &Arc<Node>, h: &Header, payload: Bytes) -> Handled {
    let oid = ObjectId(h.oid);
    match h.opcode {
        Opcode::ReadObj => {
            let (ep, cfg) = io_epoch(node, h).await?;
            let record = h.aux & objstore_proto::api::READ_COW_RECORD != 0;
            if !record {
                check_range(oid, h.offset, h.length, &cfg)?;
            }
            if let Err(why) = node.ensure_recovered(oid).await {
                return node.read_through(h, why).await.map(Reply::bytes);
            }
            if record {
                return Ok(Reply::bytes(
                    node.record_answer(oid, cfg.object_size as u64)?,
                ));
            }
            let (off, len) = (h.offset, h.length as usize);
            if !oid.is_inode() {
                // Small reads are page-cache hits far more often than not: read_data reads
                // them on this task (a hop to the blocking pool would cost more).
                let data = node.read_data(&ep, &cfg, oid, off, len).await?;
                return Ok(Reply::bytes(data));
            }
            let store = node.store.clone();
            let data = if len <= INLINE_READ {
                store.read(oid, off, len)?
            } else {
                blocking(node, move || store.read(oid, off, len)).await?
            };
            Ok(Reply::bytes(Bytes::from(data)))
        }
        Opcode::WriteObj => {
            let _change = node.enter(h.epoch);
            let (ep, cfg) = io_epoch(node, h).await?;
            let Some((expected, payload)) = split_expected(&payload) else {
                return Err(Failure::invalid(
                    "WriteObj payload shorter than its version",
                ));
            };
            if payload.len() != h.length as usize {
                return Err(Failure::invalid(format!(
                    "write length {} but {} bytes of data",
                    h.length,
                    payload.len()
                )));
            }
            check_range(oid, h.offset, h.length, &cfg)?;
            let others = node.primary_of(&ep, &cfg, oid)?;
            let acting = node.acting(&ep, &cfg, oid).await?;
            let change = match acting {
                Acting::Here => {
                    node.write_change(&ep, &cfg, oid, expected, h.offset, payload)
                        .await?
                }
                // No copy here to tell a partial copy-on-write target: the stand-in refuses
                // a plain write into one (`Diverged`).
                Acting::Through(_) => Change::Write {
                    offset: h.offset,
                    data: payload,
                },
            };
            let v = node
                .change(&ep, oid, &others, expected, change, &acting)
                .await?;
            Ok(Reply::state(Bytes::new(), ObjState::live(v)))
        }
        Opcode::EcRead | Opcode::EcWrite | Opcode::EcRemove | Opcode::EcCheck => {
            ec::request(node, h, payload).await
        }
        Opcode::PeerStrip | Opcode::PeerStripRead => ec::peer(node, h, payload).await,
        Opcode::EcStripRead => ec::strip_read(node, h, payload).await,
        Opcode::CowWrite => {
            let v = super::cow::cow_write(node, h, payload).await?;
            Ok(Reply::state(Bytes::new(), ObjState::live(v)))
        }
        Opcode::FlattenObj => {
            let _change = node.enter(h.epoch);
            let (ep, cfg) = change_epoch(node, h).await?;
            let Some((_, source, _)) = split_cow(&payload) else {
                return Err(Failure::invalid(
                    "FlattenObj payload shorter than its version and source object",
                ));
            };
            let others = node.primary_of(&ep, &cfg, oid)?;
            node.ensure_recovered(oid)
                .await
                .map_err(|why| not_recovered(oid, why))?;
            let v = node.flatten(&ep, &cfg, &others, oid, source).await?;
            Ok(Reply::state(Bytes::new(), ObjState::live(v)))
        }
        Opcode::RemoveObj => {
            let _change = node.enter(h.epoch);
            let (ep, cfg) = io_epoch(node, h).await?;
            let Some((expected, _)) = split_expected(&payload) else {
                return Err(Failure::invalid(
                    "RemoveObj payload shorter than its version",
                ));
            };
            let others = node.primary_of(&ep, &cfg, oid)?;
            let acting = node.acting(&ep, &cfg, oid).await?;
            let v = node
                .change(&ep, oid, &others, expected, Change::Remove, &acting)
                .await?;
            Ok(Reply::state(Bytes::new(), ObjState::tombstone(v)))
        }
        Opcode::Flush => {
            node.check_fenced()?;
            node.flush_here().await.map(|()| Reply::empty())
        }
        Opcode::StatObj | Opcode::PeerRead if node.recovery.is_pending(oid) => Err(Failure::new(
            ResultCode::NotFound,
            format!("object {oid} is not recovered here yet"),
        )),
        Opcode::StatObj => match node.store.meta(oid) {
            Some(st) => Ok(Reply::state(Bytes::new(), st)),
            None => Err(StoreError::NotFound(oid).into()),
        },
        Opcode::PeerRead => {
            let store = node.store.clone();
            let (data, st) = blocking(node, move || {
                let (data, st) = store.read_whole(oid)?;
                let data = match oid.strip_index() {
                    Some(_) => super::ec::with_note(data, store.note(oid)),
                    None => data,
                };
                Ok((data, st))
            })
            .await?;
            Ok(Reply::state(Bytes::from(data), st))
        }
        Opcode::CheckObj => {
            let state_only = h.aux & objstore_proto::api::CHECK_STATE_ONLY != 0;
            Ok(Reply::json(&node.check_copy(oid, state_only).await))
        }
        Opcode::RepairObj => {
            let req: RepairRequest = json(&payload)?;
            let state = node.repair_copy(oid, req.version, req.source).await?;
            Ok(Reply::json(&RepairReply { state }))
        }
        Opcode::PeerList => list::peer_list(node, h, &payload).await,
        Opcode::PeerDigest => list::peer_digest(node, h, &payload).await,
        Opcode::PeerArcs => list::peer_arcs(node, h, &payload).await,
        Opcode::PeerWrite => {
            let _change = node.enter(h.epoch);
            let (ep, cfg) = io_epoch(node, h).await?;
            let Some((base, new, sums, data)) = split_peer_write(&payload, h.aux) else {
                return Err(Failure::invalid(format!(
                    "PeerWrite payload shorter than its versions and {} block sum(s)",
                    h.aux
                )));
            };
            let sums = forwarded(h, &cfg, &data, sums)?;
            match node.acting(&ep, &cfg, oid).await? {
                Acting::Here => {
                    let os = cfg.object_size as u64;
                    node.apply_forwarded(oid, h.offset, data, sums, (base, new), os)
                        .await?
                }
                Acting::Through(s) => {
                    node.forward_through(s, h, payload, ObjState::live(new))
                        .await?
                }
            }
            Ok(Reply::empty())
        }
        Opcode::PeerCow => {
            let _change = node.enter(h.epoch);
            let (_, cfg) = change_epoch(node, h).await?;
            let Some((base, new, sums, source, data)) = split_peer_cow(&payload, h.aux) else {
                return Err(Failure::invalid(format!(
                    "PeerCow payload shorter than its versions, {} block sum(s) and source",
                    h.aux
                )));
            };
            let sums = forwarded(h, &cfg, &data, sums)?;
            if oid.is_inode() {
                return Err(Failure::invalid(format!(
                    "PeerCow of inode {oid}: only data objects are copied on write"
                )));
            }
            if node.recovery.is_pending(oid) {
                // Not waited for as `PeerWrite` does: the pull may need the primary, whose
                // connection this change holds. The primary sends the object whole instead
                // (`PeerPut` needs no recovery first). Copies made while a node dies would
                // otherwise wait on each other's pulls until the peer timeouts.
                return Err(Failure::new(
                    ResultCode::Diverged,
                    format!("object {oid} is pending recovery here"),
                ));
            }
            let os = cfg.object_size as u64;
            node.apply_forwarded_cow(oid, h.offset, data, sums, source, (base, new), os)
                .await?;
            Ok(Reply::empty())
        }
        Opcode::PeerPut => {
            let _change = node.enter(h.epoch);
            let (ep, cfg) = io_epoch(node, h).await?;
            let state = ObjState::from_wire(h.offset, h.aux);
            if !state.deleted {
                // A partial copy-on-write target carries its record past the object size.
                let record = objstore_proto::cowrec::RECORD_SPACE as usize;
                let len = if oid.is_inode() {
                    payload.len()
                } else {
                    payload.len().saturating_sub(record)
                };
                check_range(oid, 0, len as u32, &cfg)?;
            }
            if let Acting::Through(s) = node.put_acting(&ep, &cfg, oid).await? {
                node.forward_through(s, h, payload, state).await?;
                return Ok(Reply::empty());
            }
            match node.apply_put(oid, payload, state).await {
                Ok(()) => Ok(Reply::empty()),
                Err((mut f, local)) => {
                    f.version = Some(local);
                    Err(f)
                }
            }
        }
        Opcode::PeerStatus => Ok(Reply {
            payload: Bytes::new(),
            aux: node.recovery.recovered_epoch(),
            version: None,
        }),
        Opcode::ClusterInfo => Ok(Reply::json::<ClusterInfo>(&node.cluster_info())),
        Opcode::NodeStatus => Ok(Reply::json(&node.status())),
        Opcode::NodeStat => Ok(Reply::json(&node.stats())),
        Opcode::Format => format(node, json(&payload)?).await,
        Opcode::KvGet => {
            let key = text(&payload)?.to_string();
            let v = driver_call(node, move |d| d.kv_get(&key)).await?;
            match v {
                Some(v) => Ok(Reply::bytes(Bytes::from(v))),
                None => Err(Failure::new(ResultCode::NotFound, "no such key")),
            }
        }
        Opcode::KvCas => {
            let req: KvCasRequest = json(&payload)?;
            if req.key == keys::CONFIG {
                return Err(Failure::invalid(
                    "the cluster format is set only by the Format operation",
                ));
            }
            let (key, created, new) = (req.key.clone(), req.expected.is_none(), req.new.clone());
            let ok = driver_call(node, move |d| {
                d.kv_cas(
                    &req.key,
                    req.expected.as_deref().map(str::as_bytes),
                    req.new.as_deref().map(str::as_bytes),
                )
            })
            .await?;
            if ok {
                super::lockstat::changed(node, &key, created, new.as_deref().map(str::as_bytes))
                    .await;
                Ok(Reply::empty())
            } else {
                Err(Failure::new(ResultCode::Conflict, "the key changed"))
            }
        }
        Opcode::KvList => {
            let prefix = text(&payload)?.to_string();
            let list = driver_call(node, move |d| d.kv_list(&prefix)).await?;
            let list: Vec<(String, String)> = list
                .into_iter()
                .map(|(k, v)| (k, String::from_utf8_lossy(&v).into_owned()))
                .collect();
            Ok(Reply::json(&list))
        }
        Opcode::KvCasLeased => {
            let req: KvCasLeasedRequest = json(&payload)?;
            if req.key == keys::CONFIG {
                return Err(Failure::invalid(
                    "the cluster format is set only by the Format operation",
                ));
            }
            let (key, created, new) = (req.key.clone(), req.expected.is_none(), req.new.clone());
            let ok = driver_call(node, move |d| {
                d.kv_cas_leased(
                    &req.key,
                    req.expected.as_deref().map(str::as_bytes),
                    req.new.as_bytes(),
                    req.lease,
                )
            })
            .await?;
            if ok {
                super::lockstat::changed(node, &key, created, Some(new.as_bytes())).await;
                Ok(Reply::empty())
            } else {
                Err(Failure::new(
                    ResultCode::Conflict,
                    "the key changed, or the lease ended",
                ))
            }
        }
        Opcode::LeaseGrant => {
            let req: LeaseGrantRequest = json(&payload)?;
            if req.ttl_secs == 0 || req.ttl_secs > MAX_LEASE_TTL_SECS {
                return Err(Failure::invalid(format!(
                    "lease TTL {} s: expected 1 to {MAX_LEASE_TTL_SECS} s",
                    req.ttl_secs
                )));
            }
            let ttl = Duration::from_secs(req.ttl_secs);
            let lease = driver_call(node, move |d| d.lease_grant(ttl)).await?;
            Ok(Reply::json(&LeaseId { lease }))
        }
        Opcode::LeaseKeepalive => {
            let LeaseId { lease } = json(&payload)?;
            let alive = driver_call(node, move |d| d.lease_keepalive(lease)).await?;
            if alive {
                Ok(Reply::empty())
            } else {
                Err(Failure::new(ResultCode::NotFound, "the lease ended"))
            }
        }
        Opcode::AuthHello | Opcode::AuthProof => Err(Failure::new(
            ResultCode::Unauthenticated,
            "this node runs without a cluster key (sheep --no-auth) and cannot prove one",
        )),
        Opcode::LeaseRevoke => {
            let LeaseId { lease } = json(&payload)?;
            driver_call(node, move |d| d.lease_revoke(lease)).await?;
            Ok(Reply::empty())
        }
    }
}

/// The longest lease `LeaseGrant` makes: a day (a lease that must outlive its holder longer
/// is no lease: take a plain key).
const MAX_LEASE_TTL_SECS: u64 = 86_400;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unreachable_store_is_waited_out_and_other_store_errors_are_final() {
        let e = DriverError::Unreachable {
            endpoints: "http://10.0.0.1:2379".into(),
            reason: "tcp connect error".into(),
        };
        let f = store_failure(e);
        assert_eq!(f.code, ResultCode::Busy);
        assert!(f.message.contains("10.0.0.1:2379"), "{}", f.message);
        let f = store_failure(DriverError::LeaseExpired);
        assert_eq!(f.code, ResultCode::Io);
    }

    #[test]
    fn a_store_task_cancelled_by_shutdown_is_retried_elsewhere() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let cancelled = rt.block_on(async {
            let t = tokio::spawn(std::future::pending::<()>());
            t.abort();
            t.await.unwrap_err()
        });
        assert_eq!(task_failure(cancelled).code, ResultCode::ShuttingDown);
        let panicked = rt.block_on(async { tokio::spawn(async { panic!("boom") }).await });
        assert_eq!(task_failure(panicked.unwrap_err()).code, ResultCode::Io);
    }
}
