//! `PeerList`: this node's copies for a peer planning its recovery, all of them (an empty
//! request, for tools) or one page of those the peer holds in its epoch
//! ([`ListRequest`]; see `docs/wire.md`). `PeerDigest` and `PeerArcs`: the same copies by
//! ring arc, as digests and as the entries of the arcs asked ([`objstore_proto::arcs`]).

use std::sync::Arc;

use objstore_proto::arcs::{arc_digest, encode_arcs, encode_digests, ArcsRequest};
use objstore_proto::frame::MAX_PAYLOAD;
use objstore_proto::frame::{Header, ResultCode};
use objstore_proto::version::{encode_list, ListRequest, LIST_ENTRY};

use super::{driver_call, Failure, Reply};
use crate::node::ringorder::{Arcs, For, Listing, DIGEST_ENTRIES};
use crate::node::{Epoch, Node};

/// Answers a `PeerList` for epoch `h.epoch` with request `payload`.
pub(super) async fn peer_list(node: &Node, h: &Header, payload: &[u8]) -> Result<Reply, Failure> {
    ready_to_list(node, h).await?;
    if payload.is_empty() {
        return Ok(Reply::bytes(encode_list(&node.listing())));
    }
    let Some(req) = ListRequest::decode(payload) else {
        return Err(Failure::invalid(
            "a PeerList request is owner (8 bytes), copies, part, parts, count (4 each), then count object ids (8 each), with part below parts",
        ));
    };
    let ep = epoch_at(node, h.epoch).await?;
    let listing = (node.listing_part(ep, req).await).map_err(failed)?;
    Ok(match listing {
        // A large one at the lowest priority, as it was built (see `Node::listing_part`).
        Listing::Entries(list) if list.len() > 4096 => {
            let bytes = (node.background(move || encode_list(&list)).await).map_err(failed)?;
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

/// Answers a `PeerDigest` for epoch `h.epoch`: the digest of each arc the asker holds with
/// something here. The payload is a [`ListRequest`] of one part with no extra objects. With
/// more than [`DIGEST_ENTRIES`] entries for the asker, none: `aux` says in how many parts a
/// `PeerList` of them would be asked, and the asker lists this node that way.
pub(super) async fn peer_digest(node: &Node, h: &Header, payload: &[u8]) -> Result<Reply, Failure> {
    ready_to_list(node, h).await?;
    let req = ListRequest::decode(payload)
        .filter(|r| r.parts == 1 && r.extra.is_empty())
        .ok_or_else(|| {
            Failure::invalid(
                "a PeerDigest request is owner (8 bytes), copies, part 0, parts 1 and count 0 (4 each)",
            )
        })?;
    let ep = epoch_at(node, h.epoch).await?;
    let which = Arcs::AllUpTo(DIGEST_ENTRIES);
    let lists = match (node
        .arc_lists(For::Peer, ep, req.owner, req.copies as usize, which)
        .await)
        .map_err(failed)?
    {
        Ok(lists) => lists,
        Err(parts) => {
            return Ok(Reply {
                aux: parts,
                ..Reply::empty()
            })
        }
    };
    let digests = node.background(move || {
        let ds: Vec<_> = lists.iter().map(|(a, l)| arc_digest(*a, l)).collect();
        encode_digests(&ds)
    });
    let bytes = digests.await.map_err(failed)?;
    Ok(Reply::bytes(bytes))
}

/// Answers a `PeerArcs` for epoch `h.epoch`: this node's entries in each arc asked.
pub(super) async fn peer_arcs(node: &Node, h: &Header, payload: &[u8]) -> Result<Reply, Failure> {
    ready_to_list(node, h).await?;
    let Some(req) = ArcsRequest::decode(payload) else {
        return Err(Failure::invalid(
            "a PeerArcs request is owner (8 bytes), copies, count (4 each), then count arcs (4 each)",
        ));
    };
    let ep = epoch_at(node, h.epoch).await?;
    let which = Arcs::These(req.arcs);
    let lists = (node
        .arc_lists(For::Peer, ep, req.owner, req.copies as usize, which)
        .await)
        .map_err(failed)?
        .unwrap_or_default();
    let entries: usize = lists.iter().map(|(_, l)| l.len()).sum();
    if entries * LIST_ENTRY > MAX_PAYLOAD as usize / 2 {
        return Err(Failure::invalid(format!(
            "the arcs asked hold {entries} entries here: ask for fewer at a time"
        )));
    }
    let bytes = (node.background(move || encode_arcs(&lists)).await).map_err(failed)?;
    Ok(Reply::bytes(bytes))
}

/// A listing that could not be built (its thread did not start, or panicked).
fn failed(e: std::io::Error) -> Failure {
    Failure::new(ResultCode::Io, format!("listing: {e}"))
}

/// What every listing checks first: the node has reached epoch `h.epoch`, and its changes of
/// earlier epochs are over.
async fn ready_to_list(node: &Node, h: &Header) -> Result<(), Failure> {
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
    Ok(())
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
