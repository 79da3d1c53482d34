//! `PeerList`: this node's copies for a peer planning its recovery, all of them (an empty
//! request, for tools) or one page of those the peer holds in its epoch
//! ([`ListRequest`]; see `docs/wire.md`).

use std::sync::Arc;

use objstore_proto::frame::{Header, ResultCode};
use objstore_proto::version::{encode_list, ListRequest};

use super::{driver_call, Failure, Reply};
use crate::node::ringorder::Listing;
use crate::node::{Epoch, Node};

/// Answers a `PeerList` for epoch `h.epoch` with request `payload`.
pub(super) async fn peer_list(node: &Node, h: &Header, payload: &[u8]) -> Result<Reply, Failure> {
    let cur = node.epoch().view.epoch;
    if h.epoch > cur {
        return Err(Failure {
            code: ResultCode::NodeBehind,
            message: format!("node is at epoch {cur}, listing asked for {}", h.epoch),
            aux: cur,
            version: None,
        });
    }
    if !node.drain_before(cur).await {
        return Err(Failure::new(
            ResultCode::Busy,
            format!("changes of epochs before {cur} are still in progress"),
        ));
    }
    if payload.is_empty() {
        return Ok(Reply::bytes(encode_list(&node.listing())));
    }
    let Some(req) = ListRequest::decode(payload) else {
        return Err(Failure::invalid(
            "a PeerList request is owner (8 bytes), copies, part, parts, count (4 each), then count object ids (8 each), with part below parts",
        ));
    };
    let ep = epoch_at(node, h.epoch).await?;
    let listing = (node.listing_part(ep, req).await)
        .map_err(|e| Failure::new(ResultCode::Io, format!("listing: {e}")))?;
    Ok(match listing {
        // A large one at the lowest priority, as it was built (see `Node::listing_part`).
        Listing::Entries(list) if list.len() > 4096 => {
            let bytes = (node.background(move || encode_list(&list)).await)
                .map_err(|e| Failure::new(ResultCode::Io, format!("listing: {e}")))?;
            Reply::bytes(bytes)
        }
        Listing::Entries(list) => Reply::bytes(encode_list(&list)),
        // Too large for one page: `aux` says in how many parts to ask.
        Listing::Split(parts) => Reply {
            aux: parts,
            ..Reply::empty()
        },
    })
}

/// Epoch `e` (this node's, or an earlier one from the membership store's history): a listing
/// filtered by who holds what must use the ring of the epoch its asker recovers.
async fn epoch_at(node: &Node, e: u32) -> Result<Arc<Epoch>, Failure> {
    let cur = node.epoch();
    if cur.view.epoch == e {
        return Ok(cur);
    }
    match driver_call(node, move |d| d.view_at(e)).await? {
        Some(view) => Ok(Epoch::new(view)),
        None => Err(Failure::invalid(format!(
            "epoch {e} is not in the membership store's history"
        ))),
    }
}
