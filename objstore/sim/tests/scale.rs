//! Recovery at scale in simulated time (issue 43; `objstore_sim::scale`): 200 nodes on
//! metadata-only stores, inline in one paused-clock runtime. Release builds only (`make test`
//! runs them with `--release`).

use objstore_node::testing::scale::{EpochCost, Shape};
use objstore_sim::scale::SimScale;

fn report(cost: &EpochCost, who: usize) {
    let (plan, owned) = (&cost.plans[who], cost.owned[who]);
    eprintln!(
        "{} at epoch {}: node {who} owns {owned} objects and fetched {} entries ({:.2} per object owned) \
         in {} requests, planned in {} ms (wall, one thread for all nodes); all {} nodes fetched {} entries \
         ({:.2} per object owned) in {} requests; members in {:?}, recovered in {:?} (simulated)",
        cost.event,
        cost.epoch,
        plan.plan_entries,
        plan.plan_entries as f64 / owned.max(1) as f64,
        plan.plan_requests,
        plan.plan_ms,
        cost.nodes,
        cost.entries(),
        cost.entries_per_owned(),
        cost.requests(),
        cost.members_in,
        cost.recovered_in,
    );
}

/// A node joining 200 nodes fetches to plan one entry from each holder of each object it
/// will own (`copies` of them), in one request a peer: not the cluster's whole listing (every
/// object's `copies` entries). Then a node dies and the others take its objects over at the
/// same cost per object.
#[test]
#[cfg_attr(
    debug_assertions,
    ignore = "release only: make test runs it with --release"
)]
fn a_node_joining_200_fetches_to_plan_the_entries_of_what_it_will_own() {
    let shape = Shape {
        nodes: 200,
        objects: 200_000,
        copies: 3,
    };
    let copies = u64::from(shape.copies);
    let mut sim = SimScale::start(shape, 43).expect("a simulated cluster of 200 nodes");
    let join = sim.join().expect("the join settles");
    let joiner = join.plans.len() - 1;
    report(&join, joiner);
    let (plan, owned) = (&join.plans[joiner], join.owned[joiner]);
    assert!(owned > 0);
    assert_eq!(plan.plan_requests, shape.nodes as u64, "one request a peer");
    assert!(
        plan.plan_entries <= copies * owned,
        "the joiner fetched {} entries for {owned} objects of {copies} copies",
        plan.plan_entries
    );
    assert!(join.entries_per_owned() <= copies as f64, "{join:?}");
    assert!(
        join.entries() < shape.objects * copies * shape.nodes as u64 / 50,
        "all nodes together fetched {} entries: near every node's whole listing",
        join.entries()
    );

    let kill = sim.kill(7).expect("the kill settles");
    report(&kill, 0);
    assert_eq!(kill.nodes, shape.nodes);
    assert!(kill.entries_per_owned() <= copies as f64, "{kill:?}");
}
