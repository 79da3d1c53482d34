//! The erasure-coded requests: `EcRead`, `EcWrite`, `EcRemove`, `EcCheck` to an object's
//! primary, and `PeerStrip`, `PeerStripRead` to a strip's holder (see `node/ec`).

use std::sync::Arc;

use bytes::Bytes;

use super::{check_range, io_epoch, Failure, Handled, Reply};
use crate::node::ec::EcChange;
use crate::node::Node;
use crate::store::{ObjState, Version};
use objstore_proto::ec::wire::{scheme_of_aux, split, StripHead, StripOp};
use objstore_proto::frame::{Header, Opcode};
use objstore_proto::oid::ObjectId;
use objstore_proto::payload::split_expected;
use objstore_proto::redundancy::Redundancy;

/// `EcRead`, `EcWrite`, `EcRemove`, `EcCheck` of a data object of the scheme in `aux`, as its
/// primary.
pub(super) async fn request(node: &Arc<Node>, h: &Header, payload: Bytes) -> Handled {
    let oid = ObjectId(h.oid);
    let changes = matches!(
        h.opcode,
        Opcode::EcWrite | Opcode::EcRemove | Opcode::EcCheck
    );
    let _change = changes.then(|| node.enter(h.epoch));
    let (ep, cfg) = io_epoch(node, h).await?;
    let Some(scheme) = scheme_of_aux(h.aux) else {
        return Err(Failure::invalid(format!(
            "{:?} of object {oid} names no erasure code ({:#x})",
            h.opcode, h.aux
        )));
    };
    match h.opcode {
        Opcode::EcRead => {
            check_range(oid, h.offset, h.length, &cfg)?;
            let (data, version) = node
                .ec_read(&ep, &cfg, oid, scheme, h.offset, h.length as usize)
                .await?;
            // The stripe's version: the client may read its data strips at it directly.
            Ok(Reply::state(data, ObjState::live(version)))
        }
        Opcode::EcCheck => {
            let repair = h.offset & 1 != 0;
            let report = node.ec_check(&ep, &cfg, oid, scheme, repair).await?;
            Ok(Reply::json(&report))
        }
        _ => {
            let Some((expected, data)) = split_expected(&payload) else {
                return Err(Failure::invalid(format!(
                    "{:?} payload shorter than its version",
                    h.opcode
                )));
            };
            let change = if h.opcode == Opcode::EcRemove {
                EcChange::Remove
            } else {
                if data.len() != h.length as usize || data.is_empty() {
                    return Err(Failure::invalid(format!(
                        "write length {} but {} bytes of data",
                        h.length,
                        data.len()
                    )));
                }
                check_range(oid, h.offset, h.length, &cfg)?;
                EcChange::Write {
                    offset: h.offset,
                    data,
                }
            };
            let removed = matches!(change, EcChange::Remove);
            let v = node
                .ec_change(&ep, &cfg, oid, scheme, expected, change)
                .await?;
            let state = if removed {
                ObjState::tombstone(v)
            } else {
                ObjState::live(v)
            };
            Ok(Reply::state(Bytes::new(), state))
        }
    }
}

/// `PeerStrip` and `PeerStripRead` of a strip this node holds.
pub(super) async fn peer(node: &Arc<Node>, h: &Header, payload: Bytes) -> Handled {
    let key = ObjectId(h.oid);
    if h.opcode == Opcode::PeerStrip {
        let _change = node.enter(h.epoch);
        let (ep, cfg) = io_epoch(node, h).await?;
        let Some((head, data)) = split(&payload) else {
            return Err(Failure::invalid(
                "PeerStrip payload without a valid strip head",
            ));
        };
        node.replacing(key, &head, h.aux);
        node.apply_strip(&ep, &cfg, key, head, h.offset, data)
            .await?;
        return Ok(Reply::empty());
    }
    let (ep, cfg) = io_epoch(node, h).await?;
    let like = like(h)?;
    let r = node
        .read_strip(&ep, &cfg, key, like, h.offset, h.length as usize)
        .await?;
    Ok(Reply::bytes(r.head.with(&r.bytes)))
}

/// `EcStripRead` from a client: a range of a data strip here, only at the version it names.
pub(super) async fn strip_read(node: &Arc<Node>, h: &Header, payload: Bytes) -> Handled {
    let key = ObjectId(h.oid);
    let (ep, cfg) = io_epoch(node, h).await?;
    let like = like(h)?;
    let Some((want, _)) = split_expected(&payload) else {
        return Err(Failure::invalid(
            "EcStripRead payload shorter than its version",
        ));
    };
    if key.strip_index().is_none_or(|k| k >= like.data as usize) {
        return Err(Failure::invalid(format!(
            "EcStripRead of {key}, not the key of a data strip of a {} object",
            like.scheme()
        )));
    }
    let bytes = node
        .read_strip_at(&ep, &cfg, key, like, want, h.offset, h.length as usize)
        .await?;
    Ok(Reply::bytes(bytes))
}

/// A strip head of the scheme in `h.aux` (of a strip read: what the holder checks its strip
/// against).
fn like(h: &Header) -> Result<StripHead, Failure> {
    let Some(Redundancy::Ec { data, parity }) = scheme_of_aux(h.aux) else {
        return Err(Failure::invalid(format!(
            "{:?} of no erasure code ({:#x})",
            h.opcode, h.aux
        )));
    };
    Ok(StripHead {
        data,
        parity,
        op: StripOp::Write,
        flags: 0,
        touched: Default::default(),
        base: Version::NONE,
        version: Version::NONE,
    })
}
