//! Copy-on-write of a data object, done by the nodes (`CowWrite`, issue 26).
//!
//! A VDI's object shared with an ancestor (a snapshot, or the parent it was cloned from) lives
//! under the ancestor's id; the first write to it makes the VDI's own object. The client sends
//! that write to the target's primary with the source object's id, and the primary:
//!
//! ```text
//!  target live here? ── yes ─► a write (Node::write_change: plain, or blocks a partial target
//!        │                      lacks merged with the source's and marked present)
//!        │ missing: no trace here
//!        ▼
//!  source partial itself, or not durable? (from this node's copy or an owner's: ReadObj
//!        │               with READ_COW_RECORD)  ── no ─► a partial target: the blocks written
//!        │                                     (edge blocks merged with the source's) and a
//!        │ yes, or the target is a tombstone    record naming the source (Change::Cow, PeerCow)
//!        ▼
//!  whole = the source's bytes as a client reads them, with the write ─► Change::Put (whole)
//! ```
//!
//! A source no owner holds is `NotFound` ("source object X of copy-on-write to Y does not
//! exist"): the client then copies from the source's own ancestor. Each step is the path of
//! every change (a version from the primary, the expected-version check under the object's
//! lock), so a copy races with nothing: a writer that created the target meanwhile makes the
//! change's expected version stale (`Conflict`) and the client retries. The source is only
//! read: a COW never changes it. Partial targets: [`super::partial`].

use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use super::acting::Acting;
use super::replicate::Change;
use super::server::{change_epoch, check_range, not_recovered, Failure};
use super::{Epoch, Node};
use crate::store::Version;
use objstore_proto::frame::Header;
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
    let (ep, cfg) = change_epoch(node, h).await?;
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
    let change = match here {
        Some(s) if !s.deleted => {
            node.write_change(&ep, &cfg, target, expected, h.offset, data)
                .await?
        }
        // Nothing here: a partial target, holding only the blocks written, unless the source
        // is partial itself (one hop at most) or not durable yet: then the copy is whole.
        None if node.source_takes_partial(&ep, &cfg, source, target).await? => {
            node.cow_start(&ep, &cfg, source, target, h.offset, data)
                .await?
        }
        _ => {
            let _memory = node.whole_copies.acquire().await.map_err(|_| {
                Failure::new(
                    objstore_proto::frame::ResultCode::ShuttingDown,
                    "node stopping",
                )
            })?;
            let whole = node
                .copy_applied(&ep, &cfg, source, target, h.offset, &data)
                .await?;
            // Installed durable on every owner (over a tombstone, a new object written by
            // parts would not be created whole).
            Change::Put { data: whole }
        }
    };
    node.change(&ep, target, &others, expected, change, &Acting::Here)
        .await
}

/// Copies into whole objects built at once on a node (each holds an object's worth of memory,
/// twice: the source read and the copy). Most copies are partial and hold a few blocks; the
/// gate charges a `CowWrite` for those ([`super::gate::cost`]).
pub(super) const WHOLE_COPIES: usize = 8;

impl Node {
    /// The bytes the new `target` gets: `source`'s with `data` written at `offset`, without
    /// trailing zeros past the write (they read as zeros anyway).
    async fn copy_applied(
        self: &Arc<Self>,
        ep: &Epoch,
        cfg: &ClusterConfig,
        source: ObjectId,
        target: ObjectId,
        offset: u64,
        data: &[u8],
    ) -> Result<Bytes, Failure> {
        let os = cfg.object_size as usize;
        let src = self.source_range(ep, cfg, source, target, 0, os, 1).await?;
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
}
