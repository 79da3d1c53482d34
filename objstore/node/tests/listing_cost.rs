//! What a node fetches to plan recovery (issue 43): it asks each peer only for the objects it
//! holds in the new epoch, first as a digest of each arc of the ring, then the entries of an
//! arc once for all the peers that agree on it, so the cost of a plan grows with what it owns,
//! not with the cluster's total nor with the copies. A node with an empty disk joins a
//! 12-node cluster of 2,400 objects with 3 copies: every object it now holds is listed by
//! each node that holds a copy of it (up to 3 in this epoch, and the one it moved from), and
//! nothing else, and it fetches the entries of each about once.

use std::collections::HashSet;
use std::sync::Arc;

use bytes::Bytes;
use objstore_client::ClientOptions;
use objstore_node::store::ObjectBackend;
use objstore_node::testing::MemCluster;
use objstore_proto::{ObjIndex, ObjectId, Vid};

const NODES: usize = 12;
const OBJECTS: u32 = 2400;
const COPIES: usize = 3;

#[test]
fn a_joining_node_fetches_only_the_entries_of_what_it_will_hold() {
    let mut c = MemCluster::start(NODES).expect("start in-memory nodes");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = Arc::new(rt.block_on(c.client(ClientOptions::default())).unwrap());
    rt.block_on(client.format(COPIES as u32, None, 1 << 20))
        .expect("format");
    let oids: Vec<ObjectId> = (0..OBJECTS)
        .map(|i| ObjectId::data(Vid(1), ObjIndex(i)))
        .collect();
    rt.block_on(async {
        for chunk in oids.chunks(64) {
            let writes = chunk
                .iter()
                .map(|&oid| client.write_obj(oid, 0, Bytes::from(vec![7u8; 512])));
            for r in futures::future::join_all(writes).await {
                r.expect("write");
            }
        }
    });
    let last = NODES - 1;
    c.kill(last);
    c.wait_members(NODES - 1);
    c.wait_recovered();
    // Its disk replaced: it joins holding nothing.
    c.wipe(last);
    c.start_node(last).unwrap();
    c.wait_members(NODES);
    c.wait_recovered();

    let owned: HashSet<ObjectId> = (oids.iter().copied())
        .filter(|&oid| c.owners(0, oid, COPIES).contains(&last))
        .collect();
    assert!(!owned.is_empty());
    let held: HashSet<ObjectId> = c.store(last).list().into_iter().map(|(o, _)| o).collect();
    assert_eq!(held, owned, "the joined node holds exactly what it owns");
    let st = c.node(last).unwrap().recovery_status();
    let every_copy = OBJECTS as u64 * COPIES as u64;
    eprintln!(
        "joined node owns {} of {OBJECTS} objects; its plan fetched {} entries and {} arc digests in {} requests ({:.2} entries per object owned; its peers' listings held {}; a listing of every copy would be {every_copy}), in {} ms",
        owned.len(),
        st.plan_entries,
        st.plan_digests,
        st.plan_requests,
        st.plan_entries as f64 / owned.len() as f64,
        st.plan_listed,
        st.plan_ms
    );
    // Each object it owns is listed by its other holders in this epoch and the previous one:
    // at most COPIES + 1 entries, and nothing about the objects it does not own.
    let owned = owned.len() as u64;
    assert!(st.plan_listed <= (COPIES as u64 + 1) * owned, "{st:?}");
    assert!(st.plan_listed >= owned, "{st:?}");
    // Its holders agree: the entries of each are fetched once, not from each holder.
    assert!(st.plan_entries <= 2 * owned, "{st:?}");
    assert!(st.plan_entries >= owned, "{st:?}");
    assert!(st.plan_entries * 3 < every_copy, "{st:?}");
    // Each peer holds far fewer than a page of them: a digest request each, and one for the
    // entries of the arcs it is asked for.
    assert!(st.plan_requests <= 2 * (NODES as u64 - 1), "{st:?}");
}
