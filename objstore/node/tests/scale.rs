//! Recovery at scale (issue 43), on the scale harness (`objstore_node::testing::scale`): real
//! nodes on metadata-only stores. Release builds only (`make test` runs them with
//! `--release`): a debug build lists millions of objects too slowly for the planner's page
//! timeout.

use std::time::Duration;

use bytes::Bytes;
use objstore_node::store::ObjectBackend;
use objstore_node::testing::scale::{object, Harness, Shape};

/// A node holding 5 million objects is listed whole by a peer planning its recovery (16
/// pages of about 5.3 MB; one frame of 85 MB before, over the 68 MiB cap, so no epoch change
/// could finish) and the peer pulls what changed while it was down.
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
    let (zero, one) = (h.store(0), h.store(1));
    for &oid in &changed {
        assert_eq!(one.meta(oid), zero.meta(oid), "{oid} after recovery");
    }
    assert_eq!(one.len() as u64, OBJECTS);
}

/// A node joining 100 nodes fetches to plan the entries of the copies of the objects it will
/// own (each listed by each node that holds or held a copy: `copies` of them), far from the
/// whole cluster's listing, in one request a peer. (200 nodes in one process outgrow this
/// machine's 24 GB: see docs/architecture.md, "Recovery's cost".)
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "release only: make test runs it with --release"
)]
fn a_node_joining_100_fetches_to_plan_the_entries_of_what_it_will_own() {
    let shape = Shape {
        nodes: 100,
        objects: 100_000,
        copies: 3,
    };
    let mut h = Harness::start(shape);
    let cost = h.join();
    let joiner = cost.plans.len() - 1;
    let (plan, owned) = (&cost.plans[joiner], cost.owned[joiner]);
    let copies = u64::from(shape.copies);
    eprintln!(
        "the joiner owns {owned} objects and fetched {} entries ({:.2} per object owned) in {} requests; \
         all nodes fetched {} entries ({:.2} per object owned) in {} requests; \
         slowest plan {} ms; membership seen in {:?}, recovered in {:?}; a full listing of everything is {} entries",
        plan.plan_entries,
        plan.plan_entries as f64 / owned.max(1) as f64,
        plan.plan_requests,
        cost.entries(),
        cost.entries_per_owned(),
        cost.requests(),
        cost.max_plan_ms(),
        cost.members_in,
        cost.recovered_in,
        shape.objects * copies,
    );
    assert!(owned > 0);
    assert_eq!(plan.plan_requests, shape.nodes as u64, "one request a peer");
    assert!(
        plan.plan_entries <= 2 * copies * owned,
        "the joiner fetched {} entries for {owned} objects of {copies} copies",
        plan.plan_entries
    );
}
