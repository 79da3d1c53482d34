//! Recovery at scale (issue 43), on the scale harness (`objstore_node::testing::scale`): real
//! nodes on metadata-only stores. Release builds only (`make test` runs them with
//! `--release`): a debug build lists millions of objects too slowly for the planner's page
//! timeout.

use std::time::Duration;

use bytes::Bytes;
use objstore_node::store::ObjectBackend;
use objstore_node::testing::scale::{object, Harness, Shape};

/// A node holding 5 million objects is listed whole by a peer planning its recovery (a digest
/// request answered with "too many for digests", then a `PeerList` request answered with the
/// parts to ask for, then 10 parts of about 8.5 MB; one frame of 85 MB before, over the 68 MiB
/// cap, so no epoch change could finish) and the peer pulls what changed while it was down. (Many nodes: objstore/sim/tests/scale.rs, in simulated
/// time.)
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "release only: make test runs it with --release"
)]
fn a_node_of_five_million_objects_is_listed_and_recovered() {
    const OBJECTS: u64 = 5_000_000;
    let mut h = Harness::start(Shape {
        nodes: 2,
        objects: OBJECTS,
        copies: 2,
    });
    h.cluster.kill(1);
    h.cluster.wait_members(1);
    let client = h.cluster.client_on(&h.rt, Duration::from_secs(30));
    let changed: Vec<_> = (0..100).map(|k| object(k * 49_999)).collect();
    h.rt.block_on(async {
        for &oid in &changed {
            client
                .write_obj(oid, 0, Bytes::from_static(&[7; 512]))
                .await
                .expect("write while node 1 is down");
        }
    });
    let cost = h.restart(1);
    let plan = &cost.plans[1];
    eprintln!(
        "node 1 listed {} entries in {} requests, planned in {} ms, recovered in {:?}",
        plan.plan_entries, plan.plan_requests, plan.plan_ms, cost.recovered_in
    );
    assert!(plan.plan_entries >= OBJECTS, "{plan:?}");
    assert_eq!(plan.plan_listed, plan.plan_entries, "{plan:?}");
    assert!(plan.plan_requests >= 12, "paged: {plan:?}");
    let (zero, one) = (h.store(0), h.store(1));
    for &oid in &changed {
        assert_eq!(one.meta(oid), zero.meta(oid), "{oid} after recovery");
    }
    assert_eq!(one.len() as u64, OBJECTS);
}
