//! Whom a cluster waits for after a node dies (issue 43): only nodes that may hold something
//! newer. A node records in the cluster store that it takes changes in an epoch before it
//! applies the first; one that took none (it joined, could not even store what it was to
//! hold, and died) is not waited for, though its epoch never became clean. Before, every read
//! of an object it owned in that epoch waited for it until `dog cluster recover --force`.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use objstore_client::ClientOptions;
use objstore_node::store::mem::{Fault, Op};
use objstore_node::testing::MemCluster;
use objstore_proto::{ObjIndex, ObjectId, Vid};

const OBJECTS: u32 = 64;

#[test]
fn a_joined_node_that_took_no_change_is_not_waited_for_once_dead() {
    let mut c = MemCluster::start(3).expect("start in-memory nodes");
    c.kill(2);
    c.wait_members(2);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let opts = ClientOptions {
        timeout: Duration::from_secs(5),
        ..ClientOptions::default()
    };
    let client = Arc::new(rt.block_on(c.client(opts)).unwrap());
    // One copy: a node that is gone hides whatever only it may hold.
    rt.block_on(client.format(1, None, 1 << 20))
        .expect("format");
    let oids: Vec<ObjectId> = (0..OBJECTS)
        .map(|i| ObjectId::data(Vid(1), ObjIndex(i)))
        .collect();
    let data = |oid: ObjectId| Bytes::from(vec![oid.0 as u8; 4096]);
    rt.block_on(async {
        for &oid in &oids {
            client.write_obj(oid, 0, data(oid)).await.expect("write");
        }
    });
    c.wait_recovered();

    // It joins with a full disk: it can store nothing, so it takes no change and its
    // recovery never finishes (the epoch never becomes clean).
    c.wipe(2);
    c.store(2).fail(Op::Write, Fault::NoSpace);
    c.start_node(2).unwrap();
    c.wait_members(3);
    let owned = (oids.iter())
        .filter(|&&oid| c.owners(0, oid, 1) == vec![2])
        .count();
    assert!(owned > 0, "the joined node owns some objects");
    let joined = c.node(2).unwrap().clone();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while joined.recovery_status().failed == 0 {
        assert!(std::time::Instant::now() < deadline, "no failed pull");
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(joined);
    c.kill(2);
    c.wait_members(2);

    // Every object reads back from the nodes that held it all along: nobody waits.
    rt.block_on(async {
        for &oid in &oids {
            let got = client
                .read_obj(oid, 0, 4096)
                .await
                .unwrap_or_else(|e| panic!("read {oid} with the full node gone: {e}"));
            assert_eq!(got, data(oid), "{oid}");
        }
    });
    let st = c.node(0).unwrap().recovery_status();
    assert!(st.waiting_for.is_empty(), "{st:?}");
    eprintln!("{owned} of {OBJECTS} objects were the full node's; none waited for it");
}

/// The other side: a node that took a write in its epoch is waited for once it is gone, as
/// before (with one copy, the write is nowhere else).
#[test]
fn a_node_that_took_a_write_is_waited_for_once_dead() {
    let mut c = MemCluster::start(3).expect("start in-memory nodes");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let opts = ClientOptions {
        timeout: Duration::from_secs(3),
        ..ClientOptions::default()
    };
    let client = Arc::new(rt.block_on(c.client(opts)).unwrap());
    rt.block_on(client.format(1, None, 1 << 20))
        .expect("format");
    let oid = (0..OBJECTS)
        .map(|i| ObjectId::data(Vid(1), ObjIndex(i)))
        .find(|&oid| c.owners(0, oid, 1) == vec![2])
        .expect("an object of node 2");
    rt.block_on(client.write_obj(oid, 0, Bytes::from(vec![9u8; 4096])))
        .expect("write");
    c.kill(2);
    c.wait_members(2);
    let e = rt
        .block_on(client.read_obj(oid, 0, 4096))
        .expect_err("its only copy is on the dead node");
    let why = e.to_string();
    assert!(
        why.contains("waiting for") && why.contains(&c.addr(2).to_string()),
        "{why}"
    );
}
