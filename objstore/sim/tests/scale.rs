//! Recovery at scale in simulated time (issue 43; `objstore_sim::scale`): 200 nodes on
//! metadata-only stores, inline in one paused-clock runtime. Release builds only (`make test`
//! runs them with `--release`).

use objstore_node::testing::scale::{EpochCost, Shape};
use objstore_sim::scale::SimScale;

fn report(cost: &EpochCost, who: usize) {
    let (plan, owned) = (&cost.plans[who], cost.owned[who]);
    eprintln!(
        "{} at epoch {}: node {who} owns {owned} objects and fetched {} entries ({:.2} per object owned) \
         and {} arc digests (listings of {} entries in all) in {} requests, planned in {} ms (wall, one \
         thread for all nodes); all {} nodes fetched {} entries ({:.2} per object owned) and {} digests, \
         {} bytes, in {} requests; members in {:?}, recovered in {:?} (simulated)",
        cost.event,
        cost.epoch,
        plan.plan_entries,
        plan.plan_entries as f64 / owned.max(1) as f64,
        plan.plan_digests,
        plan.plan_listed,
        plan.plan_requests,
        plan.plan_ms,
        cost.nodes,
        cost.entries(),
        cost.entries_per_owned(),
        cost.digests(),
        cost.bytes(),
        cost.requests(),
        cost.members_in,
        cost.recovered_in,
    );
}

/// A node joining 200 nodes fetches to plan at most twice the entries of the objects it will
/// own (the bound; one, in fact: its `copies` old holders agree, so their digests of
/// each arc are equal and one of them sends the arc's entries), in at most two requests a
/// peer: not every holder's listing (`copies` entries an object), nor the cluster's whole
/// listing. The nodes that already held their objects fetch next to nothing. Then a node dies
/// and the others take its objects over at the same cost per object.
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
    assert!(
        plan.plan_requests <= 2 * shape.nodes as u64,
        "a digest and at most one page of arcs a peer: {plan:?}"
    );
    assert!(
        plan.plan_entries <= 2 * owned,
        "the joiner fetched {} entries for {owned} objects",
        plan.plan_entries
    );
    // It learned of every copy of them all the same: `copies` old holders listed each.
    assert_eq!(plan.plan_listed, copies * owned, "{plan:?}");
    // Digests included, its bytes stay within twice the entries of what it owns.
    assert!(
        17 * plan.plan_entries + 24 * plan.plan_digests <= 2 * 17 * owned,
        "{plan:?}"
    );
    assert!(join.entries_per_owned() <= 2.0, "{join:?}");
    assert!(
        join.entries() < shape.objects * copies * shape.nodes as u64 / 50,
        "all nodes together fetched {} entries: near every node's whole listing",
        join.entries()
    );

    let kill = sim.kill(7).expect("the kill settles");
    report(&kill, 0);
    assert_eq!(kill.nodes, shape.nodes);
    assert!(kill.entries_per_owned() <= 2.0, "{kill:?}");
}
