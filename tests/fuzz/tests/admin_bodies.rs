//! Fuzz target `admin_bodies`: the JSON bodies of the administrative operations, each input
//! read as every body type a node or a client parses (the node then validates a format), so a
//! body meant for one operation and sent to another is covered too. See the crate
//! documentation; `objstore/node/tests/fuzz_requests.rs` sends such bodies to a running node.

use fuzz_targets::json::round_trip;
use fuzz_targets::{config, inputs};
use objstore_proto::api::{
    CopyCheck, FormatRequest, KvCasLeasedRequest, KvCasRequest, LeaseGrantRequest, LeaseId,
    NodeStats, NodeStatus, RecoveryStatus, RepairReply, RepairRequest, ScrubStatus,
};
use objstore_proto::view::{default_min_copies, ClusterConfig, ClusterInfo};
use proptest::prelude::*;

const TARGET: &str = "admin_bodies";

fn check_body(b: &[u8]) -> Result<(), TestCaseError> {
    if let Some(r) = round_trip::<FormatRequest>(b)? {
        let min = r.min_copies.unwrap_or_else(|| default_min_copies(r.copies));
        let _ = ClusterConfig::validate(r.copies, min, r.object_size);
    }
    round_trip::<KvCasRequest>(b)?;
    round_trip::<KvCasLeasedRequest>(b)?;
    round_trip::<LeaseGrantRequest>(b)?;
    round_trip::<LeaseId>(b)?;
    round_trip::<NodeStatus>(b)?;
    round_trip::<NodeStats>(b)?;
    round_trip::<RecoveryStatus>(b)?;
    round_trip::<ScrubStatus>(b)?;
    round_trip::<CopyCheck>(b)?;
    round_trip::<RepairRequest>(b)?;
    round_trip::<RepairReply>(b)?;
    round_trip::<ClusterConfig>(b)?;
    if let Some(info) = round_trip::<ClusterInfo>(b)? {
        let _ = info.check();
    }
    round_trip::<Vec<(String, String)>>(b)?;
    Ok(())
}

fn seeds() -> Vec<(String, Vec<u8>)> {
    let list: [(&str, &str); 13] = [
        (
            "format",
            r#"{"copies":3,"min_copies":2,"object_size":4194304}"#,
        ),
        (
            "format-default-min",
            r#"{"copies":2,"object_size":67108864}"#,
        ),
        (
            "kv-cas",
            r#"{"key":"vdi/disk0","expected":"{\"vid\":7}","new":null}"#,
        ),
        (
            "kv-cas-leased",
            r#"{"key":"lock/disk0","expected":null,"new":"host-a","lease":18446744073709551615}"#,
        ),
        ("lease-grant", r#"{"ttl_secs":1}"#),
        ("lease-id", r#"{"lease":0}"#),
        (
            "cluster-config",
            r#"{"copies":3,"min_copies":0,"object_size":1048576,"formatted_at":0}"#,
        ),
        (
            "cluster-info",
            r#"{"cluster_id":"x","config":null,"view":{"epoch":1,"nodes":[{"id":9,"addr":"[::1]:7000","zone":0,"vnodes":65536,"incarnation":1}]}}"#,
        ),
        (
            "recovery",
            r#"{"epoch":2,"state":"waiting","total":9,"done":3,"failed":1,"removed":0,"incomplete":5,"waiting_for":["10.0.0.2:7000"],"waiting_epoch":1,"data_lost":0}"#,
        ),
        ("kv-list", r#"[["a","b"],["vdi/\u00e9","\u0000"]]"#),
        (
            "copy-check",
            r#"{"state":{"version":17179869185,"deleted":false,"suspect":false,"lost":false},"recovering":false,"digest":"af13","bytes":4194304,"error":null}"#,
        ),
        (
            "repair-request",
            r#"{"version":17179869185,"source":"10.0.0.2:7000"}"#,
        ),
        (
            "scrub",
            r#"{"rate":10485760,"current":null,"last":{"started":1,"ended":2,"took_ms":1500,"objects":3,"bytes":9,"bad":1,"repaired":1,"unrecoverable":0},"passes":1,"bad_total":1,"repaired_total":1}"#,
        ),
    ];
    fuzz_targets::named("json", list.map(|(n, b)| (n, b.as_bytes().to_vec())))
}

#[test]
fn seeds_are_in_the_corpus() {
    fuzz_targets::check_seeds_pass(TARGET, &seeds(), |b| {
        prop_assert!(
            serde_json::from_slice::<serde_json::Value>(b).is_ok(),
            "a seed is JSON"
        );
        check_body(b)
    });
}

proptest! {
    #![proptest_config(config())]
    #[test]
    fn admin_bodies(bytes in inputs(TARGET)) {
        check_body(&bytes)?;
    }
}
