//! Copies lost with a failed `fdatasync`, and late attempts, in one process (memory stores, the
//! in-memory network): found by the fault simulator (`make sim SEEDS=10000`), each proven here
//! on its own.
//!
//! - A copy a flush lost while no other owner could give it back is restored within the same
//!   epoch once one can (before: only a new epoch's recovery tried again, so the copy stayed
//!   unreadable and the owners different).
//! - When every owner lost its copy, what remains (the data of the last successful flush) is
//!   kept and the owners agree on one copy (before: listings showed lost copies as good, and
//!   each owner gave up its own copy for another's lost one until none was left).
//! - A first write whose client had seen no version of the object, given up on and arriving
//!   after a remove, is refused (before: "no version seen" was accepted over anything, and the
//!   removed object came back with that write's block).

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use objstore_client::conn::Conn;
use objstore_client::transport::Link;
use objstore_client::Client;
use objstore_node::store::mem::{Fault, Op};
use objstore_node::store::ObjectBackend;
use objstore_node::testing::MemCluster;
use objstore_proto::frame::{Header, Opcode, ResultCode};
use objstore_proto::{ObjIndex, ObjectId, Vid};

const MIB: u64 = 1 << 20;

fn oid(i: u32) -> ObjectId {
    ObjectId::data(Vid(9), ObjIndex(i))
}

fn client(c: &MemCluster, rt: &tokio::runtime::Runtime, timeout: Duration) -> Arc<Client> {
    c.client_on(rt, timeout)
}

/// The owners of `oid` in node 0's view, primary first, as node indexes.
fn owners(c: &MemCluster, n: usize, oid: ObjectId) -> Vec<usize> {
    let ep = c.node(0).unwrap().epoch();
    ep.ring
        .replicas(oid, 3)
        .iter()
        .map(|o| (0..n).find(|&i| c.addr(i) == o.addr).unwrap())
        .collect()
}

fn wait_for(what: &str, secs: u64, mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    while !cond() {
        assert!(std::time::Instant::now() < deadline, "timed out: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One owner's flush fails while its links to the other owners are down (all still members),
/// so it cannot restore its copy. Once they are reachable again,
/// with no new epoch, the copy is restored (the round plans again), flushes succeed, and the
/// acknowledged write is on every owner. Before: flushes succeeded again at once (nothing
/// left to sync) while the copy stayed unreadable until some later epoch.
#[test]
fn a_lost_copy_is_restored_within_the_epoch_once_an_owner_can_give_it() {
    let c = MemCluster::start(4).expect("start");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let cl = client(&c, &rt, Duration::from_secs(20));
    rt.block_on(cl.format(3, None, MIB)).unwrap();
    let o = oid(1);
    rt.block_on(cl.write_obj(o, 0, Bytes::from_static(b"first")))
        .unwrap();
    rt.block_on(cl.flush()).unwrap();
    rt.block_on(cl.write_obj(o, 0, Bytes::from_static(b"later")))
        .unwrap();
    let epoch = c.epoch(0);
    let own = owners(&c, 4, o);
    let bad = own[2];
    for &other in &own[..2] {
        c.net.set_link(c.addr(bad), c.addr(other), Link::Down);
    }
    c.store(bad).fail(Op::Flush, Fault::Io);
    let short = client(&c, &rt, Duration::from_secs(2));
    assert!(
        rt.block_on(short.flush()).is_err(),
        "the flush that lost the copy succeeded"
    );
    c.store(bad).clear_faults();
    assert!(
        c.store(bad).read(o, 0, 5).is_err(),
        "the copy whose flush failed is readable: not the case tested"
    );
    c.net.heal();
    wait_for("a flush to succeed once the owners are back", 20, || {
        rt.block_on(short.flush()).is_ok()
    });
    assert_eq!(
        c.epoch(0),
        epoch,
        "the membership changed: not the case tested"
    );
    assert_eq!(c.store(bad).read(o, 0, 5).unwrap(), b"later");
    assert_eq!(c.replicas_agree(o), 3);
    let got = rt.block_on(cl.read_obj(o, 0, 5)).unwrap();
    assert_eq!(&got[..], b"later");
}

/// Every owner's flush fails: the data of the write since the last successful flush is gone
/// everywhere. Each owner keeps what remains (the flushed data), they agree on one copy, the
/// object reads the flushed data, flushes succeed again, and each node counts the loss. Before:
/// the copies stayed unreadable, and when planned again each owner forgot its own copy for
/// another's lost one.
#[test]
fn when_every_owner_lost_its_copy_the_last_flushed_data_is_kept() {
    let c = MemCluster::start(3).expect("start");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let cl = client(&c, &rt, Duration::from_secs(20));
    rt.block_on(cl.format(3, None, MIB)).unwrap();
    let o = oid(2);
    rt.block_on(cl.write_obj(o, 0, Bytes::from_static(b"first")))
        .unwrap();
    rt.block_on(cl.flush()).unwrap();
    rt.block_on(cl.write_obj(o, 0, Bytes::from_static(b"later")))
        .unwrap();
    for i in 0..3 {
        c.store(i).fail(Op::Flush, Fault::Io);
    }
    assert!(rt.block_on(cl.flush()).is_err());
    for i in 0..3 {
        c.store(i).clear_faults();
    }
    wait_for("a flush to succeed once the loss is settled", 30, || {
        rt.block_on(cl.flush()).is_ok()
    });
    let got = rt.block_on(cl.read_obj(o, 0, 5)).unwrap();
    assert_eq!(&got[..], b"first");
    wait_for("every owner to settle on one copy", 30, || {
        (0..3).all(|i| c.store(i).read(o, 0, 5).is_ok_and(|b| b == b"first"))
    });
    assert_eq!(c.replicas_agree(o), 3);
    for i in 0..3 {
        let lost = c.node(i).unwrap().recovery_status().data_lost;
        assert_eq!(lost, 1, "node {i} counts {lost} object(s) lost");
    }
}

/// A raw first attempt (the client had seen no version: expected 0) that reaches the primary
/// after the object was written and removed is refused with `Conflict` and the current
/// version, and the object stays removed. Before: accepted, re-creating the removed object.
#[test]
fn a_late_first_attempt_is_not_applied_over_a_remove() {
    let c = MemCluster::start(3).expect("start");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let cl = client(&c, &rt, Duration::from_secs(20));
    rt.block_on(cl.format(3, None, MIB)).unwrap();
    let o = oid(3);
    rt.block_on(cl.write_obj(o, 4096, Bytes::from_static(b"written")))
        .unwrap();
    rt.block_on(cl.remove_obj(o)).unwrap();
    let primary = owners(&c, 3, o)[0];
    let epoch = c.epoch(0).unwrap();
    let frame = rt.block_on(async {
        let conn = Conn::connect_via(&c.net, c.addr(primary), Duration::from_secs(5))
            .await
            .unwrap();
        let mut h = Header::request(Opcode::WriteObj, 0, epoch);
        h.oid = o.0;
        h.offset = 4096;
        h.length = 7;
        conn.call_with_prefix(
            h,
            Bytes::copy_from_slice(&0u64.to_be_bytes()),
            Bytes::from_static(b"written"),
            Duration::from_secs(5),
        )
        .await
        .unwrap()
    });
    assert_eq!(frame.header.result_code(), ResultCode::Conflict);
    let tomb = c.store(primary).meta(o).unwrap();
    assert!(
        tomb.deleted,
        "the late attempt re-created the object: {tomb:?}"
    );
    assert_eq!(frame.header.offset, tomb.version.0);
    // A client that has seen no version writes at once all the same.
    let fresh = client(&c, &rt, Duration::from_secs(20));
    rt.block_on(fresh.write_obj(o, 0, Bytes::from_static(b"again")))
        .unwrap();
    let got = rt.block_on(cl.read_obj(o, 0, 5)).unwrap();
    assert_eq!(&got[..], b"again");
}
