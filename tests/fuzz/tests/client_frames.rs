//! Fuzz target `client_frames`: streams of client↔node frames (requests as a node reads them,
//! answers as the client library reads them). See the crate documentation.

use fuzz_targets::frames::{check_stream, frame_bytes};
use fuzz_targets::{config, inputs};
use objstore_proto::frame::{Header, Opcode, ResultCode};
use objstore_proto::oid::ObjectId;
use objstore_proto::payload::{cow_prefix, expected_prefix};
use objstore_proto::version::Version;
use proptest::prelude::*;

const TARGET: &str = "client_frames";

fn request(op: Opcode, oid: u64, offset: u64, length: u32, payload: &[u8]) -> Vec<u8> {
    let mut h = Header::request(op, 7, 3);
    (h.oid, h.offset, h.length) = (oid, offset, length);
    frame_bytes(h, payload)
}

fn answer(op: Opcode, result: ResultCode, payload: &[u8]) -> Vec<u8> {
    frame_bytes(Header::request(op, 7, 3).response(result, 3), payload)
}

/// Valid frames of every client opcode, and answers the client library decodes.
fn seeds() -> Vec<(String, Vec<u8>)> {
    let data_oid = 0x00ab_cdef_0000_0007;
    let mut write = expected_prefix(Version(3 << 32 | 1)).to_vec();
    write.extend_from_slice(&[0x5a; 512]);
    let mut cow = cow_prefix(Version::NONE, ObjectId(0x00ab_cde0_0000_0007)).to_vec();
    cow.extend_from_slice(&[0xc0; 512]);
    let cluster_info = br#"{"cluster_id":"c0ffee","config":{"copies":3,"min_copies":2,"object_size":4194304,"formatted_at":1796000000},"view":{"epoch":3,"nodes":[{"id":1,"addr":"127.0.0.1:7001","zone":1,"vnodes":128,"incarnation":5},{"id":2,"addr":"127.0.0.1:7002","zone":2,"vnodes":128,"incarnation":6},{"id":3,"addr":"127.0.0.1:7003","zone":3,"vnodes":64,"incarnation":7}]},"membership":"local:/tmp/state"}"#;
    let node_status = br#"{"id":1,"addr":"127.0.0.1:7001","zone":1,"vnodes":128,"epoch":3,"objects":10,"disk_total":1000000,"disk_free":500000,"recovery":{"epoch":3,"state":"done","total":4,"done":4,"failed":0,"removed":1,"incomplete":0,"waiting_for":[],"waiting_epoch":0,"data_lost":0},"lease_left_ms":null}"#;
    let list: [(&str, Vec<u8>); 17] = [
        ("read", request(Opcode::ReadObj, data_oid, 4096, 4096, &[])),
        (
            "write",
            request(Opcode::WriteObj, data_oid, 4096, 512, &write),
        ),
        (
            "cow-write",
            request(Opcode::CowWrite, data_oid, 4096, 512, &cow),
        ),
        (
            "remove",
            request(
                Opcode::RemoveObj,
                data_oid,
                0,
                0,
                &expected_prefix(Version(9)),
            ),
        ),
        (
            "flush+stat",
            [
                request(Opcode::Flush, 0, 0, 0, &[]),
                request(Opcode::StatObj, 1 << 63 | 0xabcdef << 32, 0, 0, &[]),
            ]
            .concat(),
        ),
        (
            "format",
            request(
                Opcode::Format,
                0,
                0,
                0,
                br#"{"copies":3,"min_copies":2,"object_size":4194304}"#,
            ),
        ),
        ("kv-get", request(Opcode::KvGet, 0, 0, 0, b"vdi/disk0")),
        (
            "kv-cas",
            request(
                Opcode::KvCas,
                0,
                0,
                0,
                br#"{"key":"vdi/disk0","expected":null,"new":"{\"vid\":7}"}"#,
            ),
        ),
        ("kv-list", request(Opcode::KvList, 0, 0, 0, b"vdi/")),
        (
            "lease-grant",
            request(Opcode::LeaseGrant, 0, 0, 0, br#"{"ttl_secs":15}"#),
        ),
        (
            "lease-keepalive+revoke",
            [
                request(Opcode::LeaseKeepalive, 0, 0, 0, br#"{"lease":42}"#),
                request(Opcode::LeaseRevoke, 0, 0, 0, br#"{"lease":42}"#),
            ]
            .concat(),
        ),
        (
            "kv-cas-leased",
            request(
                Opcode::KvCasLeased,
                0,
                0,
                0,
                br#"{"key":"lock/disk0","expected":null,"new":"host-a","lease":42}"#,
            ),
        ),
        (
            "answer-cluster-info",
            answer(Opcode::ClusterInfo, ResultCode::Ok, cluster_info),
        ),
        (
            "answer-node-status",
            answer(Opcode::NodeStatus, ResultCode::Ok, node_status),
        ),
        (
            "answer-kv-list",
            answer(
                Opcode::KvList,
                ResultCode::Ok,
                br#"[["vdi/disk0","{\"vid\":7}"],["vdi/disk1","{}"]]"#,
            ),
        ),
        (
            "answer-lease",
            answer(Opcode::LeaseGrant, ResultCode::Ok, br#"{"lease":42}"#),
        ),
        (
            "answer-errors",
            [
                answer(
                    Opcode::ReadObj,
                    ResultCode::StaleEpoch,
                    b"epoch 3 is older than 4",
                ),
                answer(
                    Opcode::WriteObj,
                    ResultCode::Busy,
                    b"waiting for 127.0.0.1:7003",
                ),
                answer(Opcode::ReadObj, ResultCode::Ok, &[0x11; 4096]),
            ]
            .concat(),
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
    fn client_frames(bytes in inputs(TARGET)) {
        check_stream(&bytes)?;
    }
}
