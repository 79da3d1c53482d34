//! Fuzz target `peer_frames`: streams of node↔node frames (requests as a node reads them,
//! answers as the asking node reads them). See the crate documentation.

use fuzz_targets::frames::{check_stream, frame_bytes};
use fuzz_targets::{config, inputs};
use objstore_proto::frame::{Header, Opcode, ResultCode};
use objstore_proto::oid::ObjectId;
use objstore_proto::payload::peer_write_prefix;
use objstore_proto::version::{encode_list, ObjState, Version};
use proptest::prelude::*;

const TARGET: &str = "peer_frames";

fn request(op: Opcode, oid: u64, offset: u64, length: u32, aux: u32, payload: &[u8]) -> Vec<u8> {
    let mut h = Header::request(op, 11, 4);
    (h.oid, h.offset, h.length, h.aux) = (oid, offset, length, aux);
    frame_bytes(h, payload)
}

fn answer(op: Opcode, offset: u64, aux: u32, payload: &[u8]) -> Vec<u8> {
    let mut h = Header::request(op, 11, 4).response(ResultCode::Ok, 4);
    (h.offset, h.aux) = (offset, aux);
    frame_bytes(h, payload)
}

fn state(version: u64, deleted: bool, suspect: bool, lost: bool) -> ObjState {
    ObjState {
        version: Version(version),
        deleted,
        suspect,
        lost,
    }
}

/// Valid frames of every peer opcode, and the answers a node decodes.
fn seeds() -> Vec<(String, Vec<u8>)> {
    let oid = 0x0000_0007_0000_0002;
    let list = encode_list(&[
        (ObjectId(1 << 32), state(3 << 32 | 1, false, false, false)),
        (
            ObjectId(1 << 32 | 1),
            state(3 << 32 | 2, true, false, false),
        ),
        (
            ObjectId(1 << 32 | 2),
            state(2 << 32 | 7, false, true, false),
        ),
        (
            ObjectId(1 << 63 | 1 << 32),
            state(4 << 32 | 1, false, false, true),
        ),
    ]);
    let mut write = peer_write_prefix(Version(4 << 32 | 1), Version(4 << 32 | 2), &[]).to_vec();
    write.extend_from_slice(&[0xa5; 4096]);
    // A write of whole blocks carries the primary's sums, one a block (`aux` of them).
    let mut summed = peer_write_prefix(
        Version(4 << 32 | 2),
        Version(4 << 32 | 3),
        &[0x1234_5678, 9],
    )
    .to_vec();
    summed.extend_from_slice(&[0x5a; 8192]);
    let list: [(&str, Vec<u8>); 8] = [
        ("list", request(Opcode::PeerList, 0, 0, 0, 0, &[])),
        ("answer-list", answer(Opcode::PeerList, 0, 0, &list)),
        (
            "read+answer",
            [
                request(Opcode::PeerRead, oid, 0, 0, 0, &[]),
                answer(Opcode::PeerRead, 4 << 32 | 2, 0, &[0x3c; 8192]),
            ]
            .concat(),
        ),
        (
            "status+answer",
            [
                request(Opcode::PeerStatus, 0, 0, 0, 0, &[]),
                answer(Opcode::PeerStatus, 0, 4, &[]),
            ]
            .concat(),
        ),
        (
            "write",
            request(Opcode::PeerWrite, oid, 8192, 4096, 0, &write),
        ),
        (
            "write-summed",
            request(Opcode::PeerWrite, oid, 8192, 8192, 2, &summed),
        ),
        (
            "put",
            request(Opcode::PeerPut, oid, 4 << 32 | 3, 0, 0, &[0x77; 4096]),
        ),
        (
            "put-tombstone",
            request(Opcode::PeerPut, oid, 4 << 32 | 4, 0, 1, &[]),
        ),
    ];
    fuzz_targets::named("bin", list)
}

#[test]
fn seeds_are_in_the_corpus() {
    fuzz_targets::check_seeds_pass(TARGET, &seeds(), check_stream);
}

proptest! {
    #![proptest_config(config())]
    #[test]
    fn peer_frames(bytes in inputs(TARGET)) {
        check_stream(&bytes)?;
    }
}
