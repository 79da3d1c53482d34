//! Issue 25, checksums, in one process (memory stores, an in-memory network): a copy whose
//! bytes no longer match their checksums is never served; the client reads another replica,
//! and the node restores the bad copy from a good one in the background. A bad copy is never
//! the source another node copies.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use objstore_client::Client;
use objstore_node::store::{ObjectBackend, StoreError};
use objstore_node::testing::MemCluster;
use objstore_proto::{ObjIndex, ObjectId, Vid};

const MIB: u64 = 1 << 20;

fn oid(i: u32) -> ObjectId {
    ObjectId::data(Vid(9), ObjIndex(i))
}

fn bytes_of(i: u32) -> Vec<u8> {
    (0..3 * 4096 + 123)
        .map(|k| (k as u32).wrapping_mul(31).wrapping_add(i) as u8)
        .collect()
}

/// Node index of the first replica a client asks for `oid` (the ring's first owner).
fn first_owner(c: &MemCluster, o: ObjectId) -> usize {
    let ep = c.node(0).unwrap().epoch();
    let first = ep.ring.replicas(o, 3)[0].addr;
    (0..3).find(|&i| c.addr(i) == first).unwrap()
}

fn wait_until(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn setup(n: u32) -> (MemCluster, tokio::runtime::Runtime, Arc<Client>) {
    let c = MemCluster::start(3).expect("start");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let cl = c.client_on(&rt, Duration::from_secs(10));
    rt.block_on(cl.format(3, None, MIB)).unwrap();
    for i in 0..n {
        rt.block_on(cl.write_obj(oid(i), 0, Bytes::from(bytes_of(i))))
            .unwrap();
    }
    rt.block_on(cl.flush()).unwrap();
    (c, rt, cl)
}

/// One flipped byte in each of 20 objects, on the replica every read asks first: every read
/// returns the right bytes, and every bad copy is restored from another replica.
#[test]
fn a_corrupt_copy_is_never_read_and_is_restored() {
    let (c, rt, cl) = setup(20);
    let mut bad = Vec::new();
    for i in 0..20 {
        let o = oid(i);
        let n = first_owner(&c, o);
        assert!(c.store(n).corrupt(o, 4096 + i as usize * 7));
        bad.push((n, o, i));
    }
    for &(_, o, i) in &bad {
        let got = rt
            .block_on(cl.read_obj(o, 0, bytes_of(i).len() as u32))
            .unwrap();
        assert!(got[..] == bytes_of(i)[..], "object {o} read wrong bytes");
    }
    for &(n, o, i) in &bad {
        wait_until(&format!("node {n}'s copy of {o} is restored"), || {
            c.store(n)
                .read_whole(o)
                .is_ok_and(|(d, _)| d == bytes_of(i))
        });
    }
    for &(_, o, _) in &bad {
        assert_eq!(c.replicas_agree(o), 3, "{o}");
    }
}

/// A node that comes back behind pulls the object from the others; the copy on one of them
/// is corrupt: the pull never takes it (its `PeerRead` fails, the puller takes the other
/// source), and the corrupt copy found that way is restored too.
#[test]
fn a_node_recovering_never_takes_a_corrupt_copy() {
    let (mut c, rt, cl) = setup(4);
    let o = oid(1);
    let ep = c.node(0).unwrap().epoch();
    let owners: Vec<usize> = ep
        .ring
        .replicas(o, 3)
        .iter()
        .map(|n| (0..3).find(|&i| c.addr(i) == n.addr).unwrap())
        .collect();
    let (behind, corrupt) = (owners[2], owners[1]);
    c.kill(behind);
    let fresh: Vec<u8> = bytes_of(1).iter().map(|b| b ^ 0x5a).collect();
    rt.block_on(cl.write_obj(o, 0, Bytes::from(fresh.clone())))
        .unwrap();
    rt.block_on(cl.flush()).unwrap();
    // Flipped in every block, so that whatever the puller reads of it is bad.
    for at in [1, 4096 + 2, 2 * 4096 + 3, 3 * 4096 + 4] {
        assert!(c.store(corrupt).corrupt(o, at));
    }
    c.start_node(behind).unwrap();
    wait_until("the node back has the fresh copy", || {
        c.store(behind).read_whole(o).is_ok_and(|(d, _)| d == fresh)
    });
    c.wait_recovered();
    let got = rt.block_on(cl.read_obj(o, 0, fresh.len() as u32)).unwrap();
    assert!(got[..] == fresh[..]);
    // Whether the puller tried the corrupt copy first or not, no node holds bad bytes that it
    // would serve: the corrupt copy is either still refused or restored.
    for n in 0..3 {
        match c.store(n).read_whole(o) {
            Ok((d, _)) => assert!(d == fresh, "node {n} serves bad bytes"),
            Err(StoreError::Corrupt { .. }) => assert_eq!(n, corrupt),
            Err(e) => panic!("node {n}: {e}"),
        }
    }
}
