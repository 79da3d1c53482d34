//! The replication rules of issue 22, proven in one process (memory stores, an in-memory
//! network): versions decide which copy is current, a node back alone waits for the nodes that
//! took the last writes, deletes are durable tombstones, a change that failed somewhere
//! converges, two writers leave identical replicas, a failed flush is restored from a
//! replica instead of acknowledged, and a new epoch's recovery listing waits for the changes of
//! the previous epoch still in flight.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use objstore_client::{Client, ClientError, ClientOptions};
use objstore_node::store::mem::{Fault, Op};
use objstore_node::store::ObjectBackend;
use objstore_node::testing::MemCluster;
use objstore_proto::api::RecoveryState;
use objstore_proto::{ObjIndex, ObjectId, Vid};

const MIB: u64 = 1 << 20;

fn oid(i: u32) -> ObjectId {
    ObjectId::data(Vid(7), ObjIndex(i))
}

fn client(c: &MemCluster, rt: &tokio::runtime::Runtime, timeout: Duration) -> Arc<Client> {
    c.client_on(rt, timeout)
}

/// Node `i`'s index among the owners of `oid` (0: the primary), per node `via`'s view.
fn owner_rank(c: &MemCluster, via: usize, oid: ObjectId, i: usize) -> Option<usize> {
    let ep = c.node(via).unwrap().epoch();
    ep.ring
        .replicas(oid, 3)
        .iter()
        .position(|n| n.addr == c.addr(i))
}

/// Issue 22, scenario 1. Node 0 misses a write; then the two nodes that took it die and node
/// 0 comes back alone. Before, it served the old bytes and took writes over them, and the
/// write was lost for good when the others returned. Now its I/O waits and it says for whom;
/// one of them back is enough to serve the acknowledged write.
#[test]
fn a_node_back_alone_waits_for_the_nodes_that_took_the_last_write() {
    let mut c = MemCluster::start(3).expect("start");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let cl = client(&c, &rt, Duration::from_secs(20));
    rt.block_on(cl.format(3, None, MIB)).unwrap();
    rt.block_on(cl.write_obj(oid(0), 0, Bytes::from_static(b"P1")))
        .unwrap();
    rt.block_on(cl.flush()).unwrap();

    c.crash(0);
    c.wait_members(2);
    c.wait_recovered();
    rt.block_on(cl.write_obj(oid(0), 0, Bytes::from_static(b"P2")))
        .unwrap();
    rt.block_on(cl.flush()).unwrap();
    assert_eq!(&rt.block_on(cl.read_obj(oid(0), 0, 2)).unwrap()[..], b"P2");

    // Both holders of P2 die at once; node 0 comes back alone.
    c.crash(1);
    c.crash(2);
    c.start_node(0).unwrap();
    c.wait_members(1);
    let short = client(&c, &rt, Duration::from_secs(2));
    let deadline = Instant::now() + Duration::from_secs(30);
    let st = loop {
        let st = c.node(0).unwrap().recovery_status();
        if st.state == RecoveryState::Waiting {
            break st;
        }
        assert!(Instant::now() < deadline, "node 0 never waited: {st:?}");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(st.waiting_for, vec![c.addr(1), c.addr(2)], "{st:?}");
    match rt.block_on(short.read_obj(oid(0), 0, 2)) {
        Err(ClientError::Timeout { last, .. }) => {
            assert!(last.contains("waiting for"), "{last}")
        }
        other => panic!("node 0 alone answered a read: {other:?}"),
    }
    assert!(
        rt.block_on(short.write_obj(oid(0), 0, Bytes::from_static(b"P3")))
            .is_err(),
        "node 0 alone took a write"
    );

    // One of the last writers back: the acknowledged write is served.
    c.start_node(1).unwrap();
    c.wait_members(2);
    c.wait_recovered();
    let cl = client(&c, &rt, Duration::from_secs(20));
    assert_eq!(&rt.block_on(cl.read_obj(oid(0), 0, 2)).unwrap()[..], b"P2");
    // Node 0 pulled P2; node 2 (down) still has it too.
    assert_eq!(c.replicas_agree(oid(0)), 3);
}

/// Issue 22, scenario 3. An object removed while one of its holders is down must not come
/// back when that node returns: before, a later 4 KiB write landed on its old copy and the old
/// bytes reappeared around it (and the replicas differed).
#[test]
fn a_remove_while_a_node_is_down_stays_removed() {
    let mut c = MemCluster::start(3).expect("start");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let cl = client(&c, &rt, Duration::from_secs(20));
    rt.block_on(cl.format(3, None, MIB)).unwrap();
    rt.block_on(cl.write_obj(oid(1), 0, Bytes::from(vec![0xaa; MIB as usize])))
        .unwrap();
    rt.block_on(cl.flush()).unwrap();

    c.crash(2);
    c.wait_members(2);
    rt.block_on(cl.remove_obj(oid(1))).unwrap();
    c.start_node(2).unwrap();
    c.wait_members(3);
    c.wait_recovered();
    rt.block_on(cl.write_obj(oid(1), 0, Bytes::from(vec![0x11; 4096])))
        .unwrap();
    let back = rt.block_on(cl.read_obj(oid(1), 0, 8192)).unwrap();
    assert!(back[..4096].iter().all(|&b| b == 0x11));
    assert!(
        back[4096..].iter().all(|&b| b == 0),
        "old bytes came back after the remove"
    );
    assert_eq!(c.replicas_agree(oid(1)), 3);
    // The node that was away holds the new object, not its old copy.
    assert_eq!(c.store(2).read(oid(1), 4096, 1).unwrap(), vec![0]);
}

/// A write that failed on one replica is reported failed; the next write brings that replica
/// back to the same version and bytes as the others (the primary sends it the whole object).
#[test]
fn a_write_that_failed_on_a_replica_converges() {
    let c = MemCluster::start(3).expect("start");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let cl = client(&c, &rt, Duration::from_secs(5));
    rt.block_on(cl.format(3, None, MIB)).unwrap();
    let o = oid(2);
    rt.block_on(cl.write_obj(o, 0, Bytes::from(vec![1; 8192])))
        .unwrap();
    let secondary = (0..3)
        .find(|&i| owner_rank(&c, 0, o, i) == Some(1))
        .unwrap();
    c.store(secondary).fail(Op::Write, Fault::Io);
    assert!(
        rt.block_on(cl.write_obj(o, 4096, Bytes::from(vec![2; 4096])))
            .is_err(),
        "a write that failed on a replica was acknowledged"
    );
    c.store(secondary).clear_faults();
    rt.block_on(cl.write_obj(o, 0, Bytes::from(vec![3; 100])))
        .unwrap();
    assert_eq!(c.replicas_agree(o), 3);
    let v = c.store(0).meta(o).unwrap().version;
    for i in 1..3 {
        assert_eq!(c.store(i).meta(o).unwrap().version, v);
    }
}

/// Two clients writing one object at once, with no order between them: every replica ends
/// with the same bytes under the same version.
#[test]
fn two_writers_on_one_object_leave_identical_replicas() {
    let c = MemCluster::start(3).expect("start");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let a = client(&c, &rt, Duration::from_secs(20));
    rt.block_on(a.format(3, None, MIB)).unwrap();
    let b = client(&c, &rt, Duration::from_secs(20));
    let o = oid(3);
    rt.block_on(async {
        let write = |cl: Arc<Client>, tag: u8| async move {
            for i in 0..200u64 {
                let off = (i * 7919 % 250) * 4096;
                cl.write_obj(o, off, Bytes::from(vec![tag; 8192]))
                    .await
                    .unwrap();
            }
        };
        tokio::join!(write(a.clone(), 0xa), write(b.clone(), 0xb));
    });
    assert_eq!(c.replicas_agree(o), 3);
}

/// A flush whose fdatasync failed on one node is not acknowledged on that node's word: the
/// copy (whose data the failed sync may have lost) is restored from another replica,
/// durably, before the flush succeeds.
#[test]
fn a_failed_flush_restores_the_copy_from_a_replica() {
    let mut c = MemCluster::start(3).expect("start");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let cl = client(&c, &rt, Duration::from_secs(10));
    rt.block_on(cl.format(3, None, MIB)).unwrap();
    let o = oid(4);
    rt.block_on(cl.write_obj(o, 0, Bytes::from_static(b"first")))
        .unwrap();
    rt.block_on(cl.write_obj(o, 0, Bytes::from_static(b"later")))
        .unwrap();
    let bad = (0..3)
        .find(|&i| owner_rank(&c, 0, o, i) == Some(2))
        .unwrap();
    c.store(bad).fail(Op::Flush, Fault::Io);
    rt.block_on(cl.flush()).unwrap();
    c.store(bad).clear_faults();
    // What the flush acknowledged survives a crash of that node.
    c.crash(bad);
    assert_eq!(c.store(bad).read(o, 0, 5).unwrap(), b"later");
}

/// Every replica of an object killed (kill -9) while a write to it was in flight and applied
/// on the primary only: each comes back at its last flushed version, its bytes holding
/// whatever writes it had applied. They must end identical (one reference copy, taken by all),
/// with every acknowledged write. Before the "suspect" mark, the three copies came back under
/// one version with different bytes, and stayed so.
#[test]
fn replicas_killed_during_a_write_end_identical() {
    let mut c = MemCluster::start(3).expect("start");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let cl = client(&c, &rt, Duration::from_secs(5));
    rt.block_on(cl.format(3, None, MIB)).unwrap();
    let o = oid(5);
    rt.block_on(cl.write_obj(o, 0, Bytes::from(vec![1; 16384])))
        .unwrap();
    rt.block_on(cl.flush()).unwrap();
    // Acknowledged, not flushed.
    rt.block_on(cl.write_obj(o, 0, Bytes::from(vec![2; 8192])))
        .unwrap();
    // Applied by the primary only: the others fail it.
    let primary = (0..3)
        .find(|&i| owner_rank(&c, 0, o, i) == Some(0))
        .unwrap();
    for i in (0..3).filter(|&i| i != primary) {
        c.store(i).fail(Op::Write, Fault::Io);
    }
    assert!(rt
        .block_on(cl.write_obj(o, 4096, Bytes::from(vec![3; 4096])))
        .is_err());
    drop(cl);
    for i in 0..3 {
        c.kill(i);
    }
    for i in 0..3 {
        assert!(c.store(i).meta(o).unwrap().suspect || i != primary);
        c.store(i).clear_faults();
        c.start_node(i).unwrap();
    }
    c.wait_members(3);
    c.wait_recovered();
    assert_eq!(c.replicas_agree(o), 3);
    let cl = client(&c, &rt, Duration::from_secs(10));
    let got = rt.block_on(cl.read_obj(o, 0, 16384)).unwrap();
    assert!(
        got[..4096].iter().all(|&b| b == 2),
        "acknowledged write lost"
    );
    assert!(
        got[4096..8192].iter().all(|&b| b == 2) || got[4096..8192].iter().all(|&b| b == 3),
        "a torn write"
    );
    assert!(got[8192..].iter().all(|&b| b == 1));
    for i in 0..3 {
        assert!(
            !c.store(i).meta(o).unwrap().suspect,
            "node {i} stays suspect"
        );
    }
}

/// Below `min-copies` live owners writes wait (and fail after the client's timeout, saying
/// why); reads of objects the nodes up can vouch for go on.
#[test]
fn writes_wait_below_min_copies_and_reads_go_on() {
    let mut c = MemCluster::start(3).expect("start");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let cl = client(&c, &rt, Duration::from_secs(20));
    rt.block_on(cl.format(3, None, MIB)).unwrap();
    assert_eq!(cl.view().config().unwrap().min_copies(), 2);
    rt.block_on(cl.write_obj(oid(6), 0, Bytes::from_static(b"kept")))
        .unwrap();
    rt.block_on(cl.flush()).unwrap();
    c.wait_recovered();
    c.crash(1);
    c.crash(2);
    c.wait_members(1);
    c.wait_recovered();
    let short = client(&c, &rt, Duration::from_secs(2));
    assert_eq!(
        &rt.block_on(short.read_obj(oid(6), 0, 4)).unwrap()[..],
        b"kept"
    );
    match rt.block_on(short.write_obj(oid(6), 0, Bytes::from_static(b"lost"))) {
        Err(ClientError::Timeout { last, .. }) => assert!(last.contains("min-copies"), "{last}"),
        other => panic!("a write with one owner of three up: {other:?}"),
    }
    c.start_node(1).unwrap();
    c.wait_members(2);
    let cl = client(&c, &rt, Duration::from_secs(20));
    rt.block_on(cl.write_obj(oid(6), 0, Bytes::from_static(b"next")))
        .unwrap();
}

/// `dog cluster recover --force` (the FORCED key): a node waiting for nodes that never come
/// back serves what it has once an operator accepts the loss.
#[test]
fn a_forced_recovery_ends_the_wait() {
    let mut c = MemCluster::start(2).expect("start");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let cl = client(&c, &rt, Duration::from_secs(20));
    rt.block_on(cl.format(2, None, MIB)).unwrap();
    rt.block_on(cl.write_obj(oid(7), 0, Bytes::from_static(b"old")))
        .unwrap();
    rt.block_on(cl.flush()).unwrap();
    c.crash(0);
    c.wait_members(1);
    c.wait_recovered();
    rt.block_on(cl.write_obj(oid(7), 0, Bytes::from_static(b"new")))
        .unwrap();
    c.crash(1);
    c.start_node(0).unwrap();
    c.wait_members(1);
    let deadline = Instant::now() + Duration::from_secs(30);
    while c.node(0).unwrap().recovery_status().state != RecoveryState::Waiting {
        assert!(Instant::now() < deadline, "node 0 never waited");
        std::thread::sleep(Duration::from_millis(50));
    }
    let cl = client(&c, &rt, Duration::from_secs(20));
    let epoch = cl.view().epoch();
    assert!(rt
        .block_on(cl.kv_cas(objstore_proto::keys::FORCED, None, Some(&epoch.to_string())))
        .unwrap());
    c.wait_recovered();
    // The loss accepted: node 0 serves its older copy.
    assert_eq!(&rt.block_on(cl.read_obj(oid(7), 0, 3)).unwrap()[..], b"old");
}

/// Two objects that share a lock shard but have different primaries, written at once: each
/// primary forwards to the other while holding its lock for its own object. With one lock per
/// shard for both roles they waited on each other until the forward timed out (3 s); a
/// replica's lock is now a different one, so no write waits that long (the client's timeout
/// here is shorter than the forward timeout).
#[test]
fn primaries_forwarding_to_each_other_do_not_wait_on_each_other() {
    // The node's shard of an object (objstore/node/src/node/replicate.rs, `shard`).
    fn shard(o: ObjectId) -> u64 {
        (o.0.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) % 1024
    }
    let c = MemCluster::start(3).expect("start");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let cl = client(&c, &rt, Duration::from_secs(20));
    rt.block_on(cl.format(3, None, MIB)).unwrap();
    let primary = |o: ObjectId| {
        (0..3)
            .find(|&i| owner_rank(&c, 0, o, i) == Some(0))
            .unwrap()
    };
    let a = oid(100);
    let b = (101..100_000)
        .map(oid)
        .find(|&o| shard(o) == shard(a) && primary(o) != primary(a))
        .expect("two objects of one shard with different primaries");
    let x = client(&c, &rt, Duration::from_secs(2));
    let y = client(&c, &rt, Duration::from_secs(2));
    rt.block_on(async {
        let write = |cl: Arc<Client>, o: ObjectId| async move {
            for i in 0..300u64 {
                cl.write_obj(o, (i % 64) * 4096, Bytes::from(vec![i as u8; 4096]))
                    .await
                    .unwrap_or_else(|e| panic!("write {i} to {o}: {e}"));
            }
        };
        tokio::join!(write(x.clone(), a), write(y.clone(), b));
    });
    assert_eq!(c.replicas_agree(a), 3);
    assert_eq!(c.replicas_agree(b), 3);
}

/// The recovery listing fence ("Fencing" in docs/architecture.md): a node answers the listing
/// of a new epoch only once no change of an older epoch is still being applied on it. A write
/// is held inside the store of each of its three owners (the primary's own write and both
/// forwarded ones) while a fourth node joins: the new epoch makes that node an owner of the
/// object, and its recovery lists the old owners while the write is still in flight. Then the
/// write is released and acknowledged. Without the fence the listings answer at once with the
/// version before the write, the new owner pulls that and stays there: an owner of the new
/// epoch without an acknowledged write, its copy different from the others under another
/// version. With it the listings wait for the write, and every owner ends with it.
#[test]
fn a_recovery_listing_waits_for_the_previous_epochs_changes_in_flight() {
    let mut c = MemCluster::start(4).expect("start");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let opts = ClientOptions {
        timeout: Duration::from_secs(20),
        request_timeout: Duration::from_secs(20),
        ..ClientOptions::default()
    };
    let cl = Arc::new(rt.block_on(c.client(opts)).expect("client"));
    rt.block_on(cl.format(3, None, MIB)).unwrap();
    // An object node 3 owns while it is a member; with it down, nodes 0-2 own it.
    let o = (10..1000)
        .map(oid)
        .find(|&o| owner_rank(&c, 0, o, 3).is_some())
        .unwrap();
    c.crash(3);
    c.wait_members(3);
    c.wait_recovered();
    rt.block_on(cl.write_obj(o, 0, Bytes::from_static(b"old")))
        .unwrap();
    let old = c.store(0).meta(o).unwrap().version;
    let before = c.epoch(0).unwrap();

    // The next write, caught inside every owner's store.
    for i in 0..3 {
        c.store(i).hold(Op::Write, o);
    }
    let held_at = Instant::now();
    let write = rt.spawn({
        let cl = cl.clone();
        async move { cl.write_obj(o, 0, Bytes::from_static(b"new")).await }
    });
    let deadline = Instant::now() + Duration::from_secs(10);
    while (0..3).any(|i| c.store(i).held() == 0) {
        assert!(
            Instant::now() < deadline,
            "the write never reached every owner's store"
        );
        std::thread::sleep(Duration::from_millis(5));
    }

    // Node 3 joins: a new epoch, in which its recovery lists nodes 0-2.
    c.start_node(3).unwrap();
    c.wait_members(4);
    let after = c.epoch(3).unwrap();
    assert!(after > before);
    assert!(owner_rank(&c, 3, o, 3).is_some());
    // Without the fence node 3's round ends at once (it pulled the old version); with it, its
    // listings wait for the write. Either way the listings were asked for within the second.
    let deadline = Instant::now() + Duration::from_secs(1);
    while Instant::now() < deadline {
        let st = c.node(3).unwrap().recovery_status();
        if st.epoch == after && matches!(st.state, RecoveryState::Done | RecoveryState::Collecting)
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        (0..3).all(|i| c.store(i).held() == 1),
        "the write left a store before its release"
    );
    // Released before the primary gives up on its replicas (FORWARD_TIMEOUT, 3 s): the write
    // is acknowledged on its first attempt, in the epoch it was checked against.
    assert!(
        held_at.elapsed() < Duration::from_secs(3),
        "the write was held {:?}: too slow a run to tell",
        held_at.elapsed()
    );
    for i in 0..3 {
        c.store(i).release();
    }
    rt.block_on(write)
        .unwrap()
        .expect("the held write is acknowledged");
    let new = c.store(0).meta(o).unwrap().version;
    assert!(new > old);
    assert_eq!(
        new.0 >> 32,
        u64::from(before),
        "the write's version is of the old epoch"
    );

    c.wait_recovered();
    let ep = c.node(3).unwrap().epoch();
    for owner in ep.ring.replicas(o, 3) {
        let i = (0..4).find(|&i| c.addr(i) == owner.addr).unwrap();
        assert_eq!(
            c.store(i).meta(o).map(|s| s.version),
            Some(new),
            "node {i}, an owner of {o} at epoch {after}, misses the write acknowledged at epoch {before}"
        );
        assert_eq!(c.store(i).read(o, 0, 3).unwrap(), b"new");
    }
    assert!(c.replicas_agree(o) >= 3);
    assert_eq!(&rt.block_on(cl.read_obj(o, 0, 3)).unwrap()[..], b"new");
}
