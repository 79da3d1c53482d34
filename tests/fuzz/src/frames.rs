//! The frame target shared by the client and peer protocols: a byte stream is read frame by
//! frame as a node or a client reads it, and each frame's payload is decoded as the receiver
//! of that opcode decodes it (requests as a node, responses as a client or a peer).
//!
//! What must hold: nothing panics or allocates without bound; a decoded header re-encodes to
//! the bytes it came from; a payload either decodes or is refused, and what decodes
//! round-trips (binary layouts and JSON bodies alike); a cluster description a client accepts
//! builds a ring that places objects.

use bytes::Bytes;
use proptest::prelude::*;

use objstore_proto::api::{
    CopyCheck, FormatRequest, KvCasLeasedRequest, KvCasRequest, LeaseGrantRequest, LeaseId,
    NodeStats, NodeStatus, RepairReply, RepairRequest,
};
use objstore_proto::arcs::{decode_arcs, decode_digests, encode_arcs, encode_digests, ARC_DIGEST};
use objstore_proto::frame::{
    read_frame, Frame, FrameError, Header, Opcode, ResultCode, HEADER_LEN,
};
use objstore_proto::oid::ObjectId;
use objstore_proto::payload::{
    cow_prefix, cow_source_error, expected_prefix, peer_write_prefix, split_cow, split_expected,
    split_peer_write,
};
use objstore_proto::placement::Ring;
use objstore_proto::version::{decode_list, encode_list};
use objstore_proto::view::{default_min_copies, ClusterConfig, ClusterInfo};

use crate::json::round_trip;

/// Reads every frame of `bytes` (a stream that never waits); the error that ended it, if any.
pub fn read_all(bytes: &[u8]) -> (Vec<Frame>, Option<FrameError>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("a current-thread runtime");
    rt.block_on(async {
        let mut r = bytes;
        let mut frames = Vec::new();
        loop {
            match read_frame(&mut r).await {
                Ok(Some(f)) => frames.push(f),
                Ok(None) => return (frames, None),
                Err(e) => return (frames, Some(e)),
            }
        }
    })
}

/// One frame's bytes: `h` with its payload length set, then `payload`.
pub fn frame_bytes(mut h: Header, payload: &[u8]) -> Vec<u8> {
    h.payload_len = payload.len() as u32;
    let mut v = h.encode().to_vec();
    v.extend_from_slice(payload);
    v
}

/// The target: reads `bytes` as a stream of frames and decodes each payload.
pub fn check_stream(bytes: &[u8]) -> Result<(), TestCaseError> {
    let (frames, err) = read_all(bytes);
    let mut used = 0;
    for f in &frames {
        prop_assert_eq!(f.payload.len(), f.header.payload_len as usize);
        prop_assert_eq!(&f.header.encode()[..], &bytes[used..used + HEADER_LEN]);
        used += HEADER_LEN + f.payload.len();
        check_payload(&f.header, &f.payload)?;
    }
    match err {
        None => prop_assert_eq!(used, bytes.len()),
        Some(FrameError::Truncated(n)) => prop_assert_eq!(used + n, bytes.len()),
        Some(FrameError::Io(m)) => prop_assert!(false, "i/o error from a slice: {}", m),
        // A header that does not decode: the receiver drops the connection.
        Some(_) => prop_assert!(bytes.len() >= used + HEADER_LEN),
    }
    Ok(())
}

fn check_payload(h: &Header, p: &Bytes) -> Result<(), TestCaseError> {
    if h.is_response() {
        if h.result_code() != ResultCode::Ok {
            // Error text is shown to people as is.
            let _ = Frame {
                header: *h,
                payload: p.clone(),
            }
            .message();
            return Ok(());
        }
        return check_answer(h.opcode, p);
    }
    match h.opcode {
        Opcode::WriteObj | Opcode::RemoveObj => {
            if let Some((v, rest)) = split_expected(p) {
                let mut again = expected_prefix(v).to_vec();
                again.extend_from_slice(&rest);
                prop_assert_eq!(&again[..], &p[..]);
            } else {
                prop_assert!(p.len() < 8);
            }
        }
        Opcode::CowWrite => {
            if let Some((v, source, rest)) = split_cow(p) {
                let mut again = cow_prefix(v, source).to_vec();
                again.extend_from_slice(&rest);
                prop_assert_eq!(&again[..], &p[..]);
                let _ = cow_source_error(ObjectId(h.oid), source);
            } else {
                prop_assert!(p.len() < 16);
            }
        }
        Opcode::PeerWrite => {
            if let Some((base, new, sums, rest)) = split_peer_write(p, h.aux) {
                let mut again = peer_write_prefix(base, new, &sums).to_vec();
                again.extend_from_slice(&rest);
                prop_assert_eq!(&again[..], &p[..]);
            } else {
                prop_assert!(p.len() < 16 + 4 * h.aux as usize);
            }
        }
        Opcode::Format => {
            if let Some(r) = round_trip::<FormatRequest>(p)? {
                let min = r.min_copies.unwrap_or_else(|| default_min_copies(r.copies));
                let _ = ClusterConfig::validate(r.copies, min, r.object_size);
            }
        }
        Opcode::KvCas => {
            round_trip::<KvCasRequest>(p)?;
        }
        Opcode::KvCasLeased => {
            round_trip::<KvCasLeasedRequest>(p)?;
        }
        Opcode::LeaseGrant => {
            round_trip::<LeaseGrantRequest>(p)?;
        }
        Opcode::LeaseKeepalive | Opcode::LeaseRevoke => {
            round_trip::<LeaseId>(p)?;
        }
        Opcode::KvGet | Opcode::KvList => {
            let _ = std::str::from_utf8(p);
        }
        Opcode::RepairObj => {
            round_trip::<RepairRequest>(p)?;
        }
        _ => {}
    }
    Ok(())
}

/// A successful answer, decoded as the client or peer that asked decodes it.
fn check_answer(op: Opcode, p: &Bytes) -> Result<(), TestCaseError> {
    match op {
        Opcode::ClusterInfo => {
            if let Some(info) = round_trip::<ClusterInfo>(p)? {
                if info.check().is_ok() || std::env::var_os("FUZZ_NO_VIEW_CHECK").is_some() {
                    let ring = Ring::new(&info.view.nodes);
                    let copies = info.config.map(|c| c.copies as usize).unwrap_or(3);
                    // Ids as clients name them (a strip's key has one holder).
                    for oid in [0, 1, 1 << 32, u64::MAX] {
                        let r = ring.replicas(ObjectId(oid).base(), copies);
                        prop_assert_eq!(r.len(), copies.min(info.view.nodes.len()));
                    }
                }
            }
        }
        Opcode::NodeStatus => {
            round_trip::<NodeStatus>(p)?;
        }
        Opcode::NodeStat => {
            round_trip::<NodeStats>(p)?;
        }
        Opcode::CheckObj => {
            round_trip::<CopyCheck>(p)?;
        }
        Opcode::RepairObj => {
            round_trip::<RepairReply>(p)?;
        }
        Opcode::KvList => {
            round_trip::<Vec<(String, String)>>(p)?;
        }
        Opcode::LeaseGrant => {
            round_trip::<LeaseId>(p)?;
        }
        Opcode::PeerList => match decode_list(p) {
            Some(list) => {
                let again = encode_list(&list);
                prop_assert_eq!(decode_list(&again), Some(list));
            }
            None => prop_assert!(!p.len().is_multiple_of(17)),
        },
        Opcode::PeerDigest => match decode_digests(p) {
            Some(ds) => prop_assert_eq!(decode_digests(&encode_digests(&ds)), Some(ds)),
            None => prop_assert!(!p.len().is_multiple_of(ARC_DIGEST)),
        },
        Opcode::PeerArcs => {
            if let Some(arcs) = decode_arcs(p) {
                prop_assert_eq!(decode_arcs(&encode_arcs(&arcs)), Some(arcs));
            }
        }
        Opcode::PeerStripRead => {
            if let Some((head, rest)) = objstore_proto::ec::wire::split(p) {
                let again = head.with(&rest);
                prop_assert_eq!(&again[..], &p[..]);
            }
        }
        _ => {}
    }
    Ok(())
}
