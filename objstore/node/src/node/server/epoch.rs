//! The checks every object request passes before it is handled: the request's epoch
//! against the node's (and this epoch's recovery plan), and a forwarded write's data and range.

use std::sync::Arc;

use super::Failure;
use crate::node::{Epoch, Node};
use objstore_proto::frame::{Header, ResultCode};
use objstore_proto::oid::{ObjectId, MAX_INODE_LEN};
use objstore_proto::view::ClusterConfig;

/// A request of epoch `req`, older than the node's `cur`: the client refreshes its view and
/// sends again.
pub(in crate::node) fn stale_epoch(req: u32, cur: u32) -> Failure {
    Failure {
        code: ResultCode::StaleEpoch,
        message: format!("request epoch {req} is older than the node's {cur}"),
        aux: cur,
        version: None,
    }
}

/// Checks the request's epoch and waits for this epoch's recovery plan.
/// [`io_epoch`] for a change of an object: the node records that it takes changes in this
/// epoch before it applies the first ([`Node::note_change`]), so a node that took none is never
/// waited for once it is gone.
pub(in crate::node) async fn change_epoch(
    node: &Node,
    h: &Header,
) -> Result<(Arc<Epoch>, ClusterConfig), Failure> {
    let (ep, cfg) = io_epoch(node, h).await?;
    node.note_change(ep.view.epoch).await?;
    Ok((ep, cfg))
}

pub(in crate::node) async fn io_epoch(
    node: &Node,
    h: &Header,
) -> Result<(Arc<Epoch>, ClusterConfig), Failure> {
    let cfg = node.config().ok_or_else(|| {
        Failure::new(
            ResultCode::NotFormatted,
            "the cluster is not formatted: run 'dog cluster format'",
        )
    })?;
    node.check_member()?;
    node.check_fenced()?;
    let ep = node.epoch();
    let cur = ep.view.epoch;
    if h.epoch < cur {
        return Err(stale_epoch(h.epoch, cur));
    }
    if h.epoch > cur {
        return Err(Failure {
            code: ResultCode::NodeBehind,
            message: format!("node is at epoch {cur}, request at {}", h.epoch),
            aux: cur,
            version: None,
        });
    }
    if !node.recovery.wait_planned(cur).await {
        return Err(Failure::new(
            ResultCode::Busy,
            format!("still planning recovery for epoch {cur}"),
        ));
    }
    Ok((ep, cfg))
}

/// The checks of a forwarded write's data (`PeerWrite`, `PeerCow`): its length, its block
/// sums, its range; the sums to store.
pub(super) fn forwarded(
    h: &Header,
    cfg: &ClusterConfig,
    data: &[u8],
    sums: Vec<u32>,
) -> Result<Option<Arc<[u32]>>, Failure> {
    if data.len() != h.length as usize {
        return Err(Failure::invalid(format!(
            "write length {} but {} bytes of data",
            h.length,
            data.len()
        )));
    }
    let sums = crate::node::replicate::given_sums(h.offset, data, sums)?;
    check_range(ObjectId(h.oid), h.offset, h.length, cfg)?;
    Ok(sums)
}

pub(in crate::node) fn check_range(
    oid: ObjectId,
    offset: u64,
    length: u32,
    cfg: &ClusterConfig,
) -> Result<(), Failure> {
    let limit = if oid.is_inode() {
        MAX_INODE_LEN
    } else {
        cfg.object_size as u64
    };
    match offset.checked_add(length as u64) {
        Some(end) if end <= limit => Ok(()),
        _ => Err(Failure::invalid(format!(
            "range {offset}+{length} is outside object {oid} ({limit} bytes)"
        ))),
    }
}
