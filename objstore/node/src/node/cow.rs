//! Copy-on-write of a data object, done by the nodes (`CowWrite`, issue 26).
//!
//! A VDI's object shared with an ancestor (a snapshot, or the parent it was cloned from) lives
//! under the ancestor's id; the first write to it makes the VDI's own object. The client sends
//! that write to the target's primary with the source object's id, and the primary:
//!
//! ```text
//!  target live here? ── yes ─► a plain write at offset (a COW sent again, a second writer)
//!        │ no (missing, or a tombstone)
//!        ▼
//!  source bytes, as an owner serves a ReadObj of it: this node's copy if it owns the source
//!  (recovered first), else each owner in placement order (ReadObj over the peer connections)
//!        │ every owner: not found ─► NotFound "source object X of copy-on-write to Y does not exist"
//!        ▼
//!  whole = source with the write applied ─► Node::change(Put { data: whole })
//! ```
//!
//! The last step is the path of every change (a version from the primary, the whole object to
//! every owner with `PeerPut`, installed durable there, the expected-version check under the
//! object's lock), so a copy races with nothing: a writer that created the target meanwhile
//! makes the change's expected version stale (`Conflict`) and the client retries, then as a
//! plain write. The source is only read: a COW never changes it.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use super::replicate::{Change, FORWARD_TIMEOUT};
use super::server::{blocking, check_range, io_epoch, not_recovered, Failure};
use super::{Epoch, Node};
use crate::store::Version;
use objstore_proto::frame::{Header, Opcode, ResultCode};
use objstore_proto::oid::ObjectId;
use objstore_proto::payload::{cow_source_error, split_cow};
use objstore_proto::view::ClusterConfig;

/// `CowWrite`: the checks of `WriteObj`, then a plain write or a copy (see the module
/// documentation). Returns the target's new version.
pub(super) async fn cow_write(
    node: &Arc<Node>,
    h: &Header,
    payload: Bytes,
) -> Result<Version, Failure> {
    let target = ObjectId(h.oid);
    let _change = node.enter(h.epoch);
    let (ep, cfg) = io_epoch(node, h).await?;
    let Some((expected, source, data)) = split_cow(&payload) else {
        return Err(Failure::invalid(
            "CowWrite payload shorter than its version and source object",
        ));
    };
    if data.len() != h.length as usize {
        return Err(Failure::invalid(format!(
            "write length {} but {} bytes of data",
            h.length,
            data.len()
        )));
    }
    if let Some(why) = cow_source_error(target, source) {
        return Err(Failure::invalid(why));
    }
    check_range(target, h.offset, h.length, &cfg)?;
    let others = node.primary_of(&ep, &cfg, target)?;
    node.ensure_recovered(target)
        .await
        .map_err(|why| not_recovered(target, why))?;
    let here = node.store.meta(target);
    let base = here.map(|s| s.version).unwrap_or_default();
    if expected != base {
        // Refused before the source is read; `change` checks again under the lock.
        return Err(super::replicate::conflict(target, base, expected));
    }
    let change = if here.is_some_and(|s| !s.deleted) {
        Change::Write {
            offset: h.offset,
            data,
        }
    } else {
        let whole = node
            .copy_applied(&ep, &cfg, source, target, h.offset, &data)
            .await?;
        // Installed durable on every owner, not created unsynced: the client records the
        // target in the VDI's inode as soon as this returns, and a crash that kept that entry
        // but dropped the target would read zeros where the source's bytes were.
        Change::Put { data: whole }
    };
    node.change(&ep, target, &others, expected, change).await
}

impl Node {
    /// The bytes the new `target` gets: `source`'s with `data` written at `offset`, without
    /// trailing zeros past the write (they read as zeros anyway).
    async fn copy_applied(
        &self,
        ep: &Epoch,
        cfg: &ClusterConfig,
        source: ObjectId,
        target: ObjectId,
        offset: u64,
        data: &[u8],
    ) -> Result<Bytes, Failure> {
        let src = self.source_bytes(ep, cfg, source, target).await?;
        let write_end = offset as usize + data.len();
        let used = src.iter().rposition(|&b| b != 0).map_or(0, |p| p + 1);
        let mut whole = BytesMut::with_capacity(used.max(write_end));
        whole.extend_from_slice(&src[..used]);
        if whole.len() < write_end {
            whole.resize(write_end, 0);
        }
        whole[offset as usize..write_end].copy_from_slice(data);
        Ok(whole.freeze())
    }

    /// `source`'s current bytes (a whole object's worth, zeros past its end), as an owner
    /// serves a `ReadObj` of it: this node's copy first if it owns the source (after
    /// recovering it), then each other owner in placement order. A source no owner holds is
    /// `NotFound`; owners that failed otherwise make it `Busy` (the client retries).
    async fn source_bytes(
        &self,
        ep: &Epoch,
        cfg: &ClusterConfig,
        source: ObjectId,
        target: ObjectId,
    ) -> Result<Bytes, Failure> {
        let mut owners: Vec<SocketAddr> = ep
            .ring
            .replicas(source, cfg.copies as usize)
            .iter()
            .map(|n| n.addr)
            .collect();
        // A stable sort: this node first, the others in placement order.
        owners.sort_by_key(|&a| a != self.me.addr);
        let len = cfg.object_size as usize;
        let deadline = tokio::time::Instant::now() + FORWARD_TIMEOUT;
        let mut failed: Option<Failure> = None;
        for addr in owners {
            let res = if addr == self.me.addr {
                self.local_source(source, len).await
            } else {
                self.remote_source(addr, ep.view.epoch, source, len, deadline)
                    .await
            };
            match res {
                Ok(b) => return Ok(b),
                Err(f) if f.code == ResultCode::NotFound => {}
                Err(f) => {
                    tracing::debug!(
                        "copy-on-write to {target}: source {source} from {addr}: {} {}",
                        f.code as u16,
                        f.message
                    );
                    failed.get_or_insert(f);
                }
            }
        }
        Err(match failed {
            None => Failure::new(
                ResultCode::NotFound,
                format!("source object {source} of copy-on-write to {target} does not exist"),
            ),
            Some(f) => Failure::new(
                ResultCode::Busy,
                format!(
                    "source object {source} of copy-on-write to {target} could not be read: {}",
                    f.message
                ),
            ),
        })
    }

    async fn local_source(&self, source: ObjectId, len: usize) -> Result<Bytes, Failure> {
        self.ensure_recovered(source)
            .await
            .map_err(|why| not_recovered(source, why))?;
        let store = self.store.clone();
        let data = blocking(self, move || store.read(source, 0, len)).await?;
        Ok(Bytes::from(data))
    }

    async fn remote_source(
        &self,
        addr: SocketAddr,
        epoch: u32,
        source: ObjectId,
        len: usize,
        deadline: tokio::time::Instant,
    ) -> Result<Bytes, Failure> {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            return Err(Failure::new(
                ResultCode::Busy,
                format!("owner {addr} not asked: out of time"),
            ));
        }
        let mut h = Header::request(Opcode::ReadObj, 0, epoch);
        h.oid = source.0;
        h.length = len as u32;
        let res = match self.peers.get(addr, left).await {
            Ok(c) => c.call(h, Bytes::new(), left).await,
            Err(e) => Err(e),
        };
        match res {
            Ok(f) => match f.header.result_code() {
                ResultCode::Ok if f.payload.len() == len => Ok(f.payload),
                ResultCode::Ok => Err(Failure::new(
                    ResultCode::Busy,
                    format!("owner {addr} sent {} bytes, not {len}", f.payload.len()),
                )),
                code => Err(Failure::new(code, format!("owner {addr}: {}", f.message()))),
            },
            Err(e) => {
                self.peers.drop_conn(addr).await;
                Err(Failure::new(ResultCode::Busy, format!("owner {addr}: {e}")))
            }
        }
    }
}
