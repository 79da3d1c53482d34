//! Fuzzing a running node with requests (issue 25, "Fuzzing"): well-formed frames whose
//! opcode, object id, offset, length, epoch, flags and payload are arbitrary, and JSON admin
//! bodies mutated byte by byte, sent to a formatted node over the in-memory network. The node
//! must answer every request with a result code (a panic in a request task would leave it
//! unanswered) and go on serving: after each case its status still reads back and the
//! objects written before the case still hold their bytes.
//!
//! Runs with `cargo test` (`FUZZ_CASES`, default 200, sets how many cases; proptest keeps
//! failing cases in `proptest-regressions/`, the corpus, next to this file). The frame
//! decoders themselves are fuzzed in `objstore/proto/src/frame/tests.rs`.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use objstore_client::conn::Conn;
use objstore_client::{Client, ClientOptions};
use objstore_node::testing::MemCluster;
use objstore_proto::frame::{Header, Opcode};
use objstore_proto::{ObjIndex, ObjectId, Vid};
use proptest::prelude::*;

const MIB: u64 = 1 << 20;

struct Rig {
    rt: tokio::runtime::Runtime,
    cluster: MemCluster,
    client: Arc<Client>,
    conn: Conn,
}

/// One node, formatted, with one object written: shared by every case (a fresh node per case
/// would spend the test's time starting nodes).
fn rig() -> &'static std::sync::Mutex<Rig> {
    static RIG: OnceLock<std::sync::Mutex<Rig>> = OnceLock::new();
    RIG.get_or_init(|| {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let cluster = MemCluster::start(1).expect("start");
        let client = Arc::new(
            rt.block_on(cluster.client(ClientOptions {
                timeout: Duration::from_secs(10),
                ..ClientOptions::default()
            }))
            .expect("client"),
        );
        rt.block_on(client.format(1, None, MIB)).unwrap();
        rt.block_on(client.write_obj(known(), 0, Bytes::from_static(b"keep me")))
            .unwrap();
        let conn = rt
            .block_on(Conn::connect_via(
                &cluster.net,
                cluster.addr(0),
                Duration::from_secs(5),
            ))
            .unwrap();
        std::sync::Mutex::new(Rig {
            rt,
            cluster,
            client,
            conn,
        })
    })
}

fn known() -> ObjectId {
    ObjectId::data(Vid(3), ObjIndex(1))
}

/// Admin bodies the node parses as JSON, each a starting point for byte mutations.
const BODIES: &[&str] = &[
    r#"{"copies":1,"min_copies":null,"object_size":1048576}"#,
    r#"{"key":"vdi/disk0","expected":null,"new":"{\"vid\":5}"}"#,
    r#"{"key":"lock/disk0","expected":null,"new":"{}","lease":1}"#,
    r#"{"prefix":"vdi/"}"#,
    r#"{"ttl_ms":5000}"#,
    r#"{"id":1}"#,
    "vdi/disk0",
    "",
];

fn payload() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        prop::collection::vec(any::<u8>(), 0..64),
        prop::collection::vec(any::<u8>(), 0..9000),
        (
            0..BODIES.len(),
            prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
            any::<prop::sample::Index>(),
        )
            .prop_map(|(i, flips, cut)| {
                let mut b = BODIES[i].as_bytes().to_vec();
                for (at, v) in flips {
                    if !b.is_empty() {
                        let i = at.index(b.len());
                        b[i] = v;
                    }
                }
                let keep = cut.index(b.len() + 1);
                if keep > b.len() / 2 {
                    b.truncate(keep);
                }
                b
            }),
    ]
}

fn oid() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(known().0),
        (0u32..8, 0u32..8).prop_map(|(v, i)| ObjectId::data(Vid(v), ObjIndex(i)).0),
        (0u32..8).prop_map(|v| ObjectId::inode(Vid(v)).0),
        any::<u64>(),
    ]
}

fn request() -> impl Strategy<Value = (Header, Vec<u8>)> {
    (
        prop_oneof![
            (0u8..=0x1f).prop_filter_map("an opcode", Opcode::from_u8),
            (0x80u8..=0x8f).prop_filter_map("an opcode", Opcode::from_u8),
        ],
        oid(),
        prop_oneof![Just(0u64), 0u64..(2 * MIB), any::<u64>()],
        prop_oneof![Just(0u32), 0u32..9000, any::<u32>()],
        prop_oneof![Just(None), any::<u32>().prop_map(Some)],
        any::<u32>(),
        payload(),
    )
        .prop_map(|(op, oid, offset, length, epoch, aux, payload)| {
            let mut h = Header::request(op, 0, epoch.unwrap_or(0));
            h.oid = oid;
            h.offset = offset;
            h.length = length;
            h.aux = aux;
            (h, payload)
        })
}

fn cases() -> u32 {
    std::env::var("FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn a_node_answers_every_request_and_goes_on_serving((mut h, payload) in request()) {
        let rig = rig().lock().unwrap_or_else(|e| e.into_inner());
        let epoch = rig.cluster.epoch(0).unwrap();
        if h.epoch == 0 {
            h.epoch = epoch;
        }
        let op = h.opcode;
        let answer = rig.rt.block_on(rig.conn.call(h, Bytes::from(payload), Duration::from_secs(15)));
        let frame = match answer {
            Ok(f) => f,
            Err(e) => return Err(TestCaseError::fail(format!("{op:?}: no answer: {e}"))),
        };
        prop_assert!(frame.header.is_response());
        // The node still serves: its status reads, and the object written at the start
        // holds its bytes unless this case changed it through the API (a write or remove of
        // that very object).
        let status = rig.rt.block_on(rig.client.node_status(rig.cluster.addr(0)));
        prop_assert!(status.is_ok(), "{:?}: node status after it: {:?}", op, status.err());
        let touched = h.oid == known().0
            && matches!(op, Opcode::WriteObj | Opcode::CowWrite | Opcode::RemoveObj | Opcode::PeerWrite | Opcode::PeerPut);
        if touched {
            // Put it back for the next cases.
            let put = rig.rt.block_on(rig.client.write_obj(known(), 0, Bytes::from_static(b"keep me")));
            prop_assert!(put.is_ok(), "{:?}: writing the object again: {:?}", op, put.err());
        } else {
            let got = rig.rt.block_on(rig.client.read_obj(known(), 0, 7));
            prop_assert!(
                got.as_ref().is_ok_and(|b| &b[..] == b"keep me"),
                "{:?}: the object written before reads {:?}",
                op,
                got
            );
        }
    }
}
