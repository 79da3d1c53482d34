//! Old holders stand in for a new owner whose disk is full (issue 43): two nodes hold every
//! object (one copy), a third joins with a full disk and owns a share of them. Before, each
//! read of an object it owned failed "node ... is out of disk space" while the old holder
//! still had it. Now every read is answered with the right bytes, every write is
//! acknowledged (applied on the old holder), nothing is lost when the full node dies, and
//! once its disk has room it takes the newest copies.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use objstore_client::{Client, ClientOptions};
use objstore_node::store::mem::{Fault, Op};
use objstore_node::store::ObjectBackend;
use objstore_node::testing::MemCluster;
use objstore_proto::{ObjIndex, ObjectId, Vid};

const OBJECTS: u32 = 64;
const LEN: usize = 4096;

fn fill(oid: ObjectId, round: u8) -> Bytes {
    Bytes::from(vec![(oid.0 as u8) ^ round; LEN])
}

struct Setup {
    c: MemCluster,
    rt: tokio::runtime::Runtime,
    client: Arc<Client>,
    oids: Vec<ObjectId>,
    /// The objects the full node owns.
    owned: Vec<ObjectId>,
}

/// Two nodes with every object written at round 0, then node 2 joins with a full disk and
/// has tried (and failed) to pull what it owns.
fn full_node_joins() -> Setup {
    let mut c = MemCluster::start(3).expect("start in-memory nodes");
    c.kill(2);
    c.wait_members(2);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let opts = ClientOptions {
        timeout: Duration::from_secs(5),
        ..ClientOptions::default()
    };
    let client = Arc::new(rt.block_on(c.client(opts)).unwrap());
    rt.block_on(client.format(1, None, 1 << 20))
        .expect("format");
    let oids: Vec<ObjectId> = (0..OBJECTS)
        .map(|i| ObjectId::data(Vid(1), ObjIndex(i)))
        .collect();
    rt.block_on(async {
        for &oid in &oids {
            client.write_obj(oid, 0, fill(oid, 0)).await.expect("write");
        }
    });
    c.wait_recovered();
    c.wipe(2);
    c.store(2).fail(Op::Write, Fault::NoSpace);
    c.start_node(2).unwrap();
    c.wait_members(3);
    let owned: Vec<ObjectId> = (oids.iter().copied())
        .filter(|&oid| c.owners(0, oid, 1) == vec![2])
        .collect();
    assert!(!owned.is_empty(), "the joined node owns some objects");
    let joined = c.node(2).unwrap().clone();
    let deadline = Instant::now() + Duration::from_secs(20);
    while joined.recovery_status().failed == 0 {
        assert!(Instant::now() < deadline, "no failed pull");
        std::thread::sleep(Duration::from_millis(50));
    }
    Setup {
        c,
        rt,
        client,
        oids,
        owned,
    }
}

impl Setup {
    /// Every object reads back as written at `round` (objects the full node owns) or round 0.
    fn read_all(&self, round: u8, what: &str) {
        self.rt.block_on(async {
            for &oid in &self.oids {
                let want = if self.owned.contains(&oid) {
                    fill(oid, round)
                } else {
                    fill(oid, 0)
                };
                let got = (self.client.read_obj(oid, 0, LEN as u32).await)
                    .unwrap_or_else(|e| panic!("read {oid} {what}: {e}"));
                assert!(got == want, "{oid} {what}: wrong bytes");
            }
        });
    }

    /// Writes round `round` into every object the full node owns, each acknowledged.
    fn write_owned(&self, round: u8) {
        self.rt.block_on(async {
            for &oid in &self.owned {
                (self.client.write_obj(oid, 0, fill(oid, round)).await)
                    .unwrap_or_else(|e| panic!("write {oid} with the full node in: {e}"));
            }
        });
    }
}

#[test]
fn a_full_new_owner_reads_and_writes_through_the_old_holder() {
    let s = full_node_joins();
    s.read_all(0, "with the full node in");
    let relayed = s.c.node(2).unwrap().recovery_status().relayed;
    assert!(
        relayed >= s.owned.len() as u64,
        "{relayed} relayed for {} objects",
        s.owned.len()
    );
    s.write_owned(1);
    s.read_all(1, "after writes through the old holder");
    s.write_owned(2);
    s.read_all(2, "after a second round of writes");

    // Its disk gets room: it takes the newest copies and the epoch recovers.
    s.c.store(2).clear_faults();
    s.c.wait_recovered();
    let full = s.c.store(2);
    for &oid in &s.owned {
        assert!(full.meta(oid).is_some(), "{oid} is not on its owner");
    }
    s.read_all(2, "once the new owner holds them");
    eprintln!(
        "{} of {OBJECTS} objects were the full node's; {relayed} reads and then writes went through the old holder",
        s.owned.len()
    );
}

#[test]
fn writes_through_the_old_holder_survive_the_full_node_and_nobody_waits_for_it() {
    let mut s = full_node_joins();
    s.write_owned(1);
    s.c.kill(2);
    s.c.wait_members(2);
    s.read_all(1, "with the full node gone");
    let st = s.c.node(0).unwrap().recovery_status();
    assert!(st.waiting_for.is_empty(), "{st:?}");
}
