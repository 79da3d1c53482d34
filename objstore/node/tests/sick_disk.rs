//! Sick disks in one process (memory stores with injected I/O errors, the in-memory network):
//! a copy whose read fails is never served and is restored from another replica; a node whose
//! disk keeps failing fences itself (leaves the cluster), and recovery restores its copies on
//! the other nodes; writes that hit the failing disk go through once it is fenced.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use objstore_client::conn::Conn;
use objstore_client::Client;
use objstore_node::health::HealthOptions;
use objstore_node::store::mem::{Fault, Op};
use objstore_node::store::ObjectBackend;
use objstore_node::testing::MemCluster;
use objstore_proto::api::HealthState;
use objstore_proto::frame::{Header, Opcode, ResultCode};
use objstore_proto::{ObjIndex, ObjectId, Vid};

const MIB: u64 = 1 << 20;

fn oid(i: u32) -> ObjectId {
    ObjectId::data(Vid(7), ObjIndex(i))
}

fn limit(n: u32) -> HealthOptions {
    HealthOptions {
        limit: n,
        window: Duration::from_secs(60),
    }
}

fn wait_for(what: &str, secs: u64, mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    while !cond() {
        assert!(std::time::Instant::now() < deadline, "timed out: {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn pattern(i: u32) -> Vec<u8> {
    (0..65536u32)
        .map(|b| (b.wrapping_mul(31) ^ i) as u8)
        .collect()
}

fn setup(n: usize, health: HealthOptions) -> (MemCluster, tokio::runtime::Runtime, Arc<Client>) {
    let c = MemCluster::start_with_health(n, health).expect("start");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let cl = c.client_on(&rt, Duration::from_secs(30));
    rt.block_on(cl.format(3, None, MIB)).unwrap();
    (c, rt, cl)
}

/// EIO on one replica's copy (the primary's, which reads go to first): the read succeeds from
/// another replica with the right bytes, the error is counted, and the copy is restored from
/// a replica (the node is degraded, not fenced). Before: the client got the primary's I/O
/// error as final only if no other replica answered, and the bad copy stayed in place, listed
/// and copied as good.
#[test]
fn eio_on_one_replica_is_read_elsewhere_and_the_copy_restored() {
    let (c, rt, cl) = setup(3, limit(10));
    let o = oid(1);
    rt.block_on(cl.write_obj(o, 0, Bytes::from(pattern(1))))
        .unwrap();
    rt.block_on(cl.flush()).unwrap();
    let primary = c.owners(0, o, 3)[0];
    c.store(primary).fail_object(Op::Read, o, Fault::Io);
    let got = rt.block_on(cl.read_obj(o, 0, 65536)).unwrap();
    assert!(got[..] == pattern(1)[..], "wrong bytes read");
    let node = c.node(primary).unwrap();
    wait_for("the unreadable copy to be restored", 20, || {
        node.health().status().restored == 1
    });
    let h = node.status().health;
    assert_eq!(h.io_errors.read, 1, "{h:?}");
    assert_eq!(h.state, HealthState::Degraded);
    assert!(!node.health().is_fenced());
    // The restored copy is a new one (a new file on a real disk): readable again.
    c.store(primary).clear_faults();
    assert_eq!(c.replicas_agree(o), 3);
    assert_eq!(c.store(primary).read(o, 0, 16).unwrap(), pattern(1)[..16]);
    let got = rt.block_on(cl.read_obj(o, 0, 65536)).unwrap();
    assert!(got[..] == pattern(1)[..], "wrong bytes read");
    assert_eq!(node.status().health.io_errors.read, 1);
    assert_eq!(c.epoch(0), c.epoch(primary), "membership changed");
}

/// A node whose every read fails: reads of all objects succeed through the other replicas,
/// the node fences itself at the limit (status says why, object I/O sent to it gets
/// `Fenced`), leaves the cluster, and recovery restores each of its copies on the remaining
/// nodes, which end up holding three identical copies of every object. Before: the node
/// stayed in the cluster failing reads, and its objects kept a bad copy.
#[test]
fn a_node_whose_disk_keeps_failing_is_fenced_and_its_copies_restored_elsewhere() {
    let (c, rt, cl) = setup(4, limit(3));
    let objs: Vec<ObjectId> = (0..16).map(oid).collect();
    for (i, &o) in objs.iter().enumerate() {
        rt.block_on(cl.write_obj(o, 0, Bytes::from(pattern(i as u32))))
            .unwrap();
    }
    rt.block_on(cl.flush()).unwrap();
    // The node that is the primary (read first) of the most objects.
    let primaries = |n: usize| objs.iter().filter(|&&o| c.owners(0, o, 3)[0] == n).count();
    let bad = (0..4).max_by_key(|&n| primaries(n)).unwrap();
    assert!(primaries(bad) >= 3, "no node is the primary of 3 objects");
    let held: Vec<ObjectId> = objs
        .iter()
        .copied()
        .filter(|&o| c.owners(0, o, 3).contains(&bad))
        .collect();
    c.store(bad).fail(Op::Read, Fault::Io);
    for (i, &o) in objs.iter().enumerate() {
        let got = rt.block_on(cl.read_obj(o, 0, 65536)).unwrap();
        assert!(got[..] == pattern(i as u32)[..], "object {o}: wrong bytes");
    }
    let node = c.node(bad).unwrap().clone();
    wait_for("the node to fence itself", 20, || node.health().is_fenced());
    let h = node.status().health;
    assert_eq!(h.state, HealthState::Fenced);
    assert!(h.io_errors.read >= 3, "{h:?}");
    let why = h.fenced.unwrap();
    assert!(why.contains("left the cluster"), "{why}");
    // Object I/O sent to it is refused as fenced.
    let frame = rt.block_on(async {
        let conn = Conn::connect_via(&c.net, c.addr(bad), Duration::from_secs(5))
            .await
            .unwrap();
        let mut h = Header::request(Opcode::ReadObj, 0, node.epoch().view.epoch);
        h.oid = held[0].0;
        h.length = 16;
        conn.call(h, Bytes::new(), Duration::from_secs(5))
            .await
            .unwrap()
    });
    assert_eq!(frame.header.result_code(), ResultCode::Fenced);
    // It left: the others see three members, recover, and hold three copies of everything.
    c.wait_members(3);
    for i in (0..4).filter(|&i| i != bad) {
        let ep = c.node(i).unwrap().epoch();
        assert!(ep.view.nodes.iter().all(|n| n.addr != c.addr(bad)));
    }
    wait_for("every object on three healthy nodes", 30, || {
        objs.iter().all(|&o| {
            (0..4)
                .filter(|&i| i != bad && c.store(i).read(o, 0, 1).is_ok())
                .count()
                == 3
        })
    });
    for (i, &o) in objs.iter().enumerate() {
        let copies: Vec<_> = (0..4)
            .filter(|&n| n != bad)
            .map(|n| c.store(n).read_whole(o).unwrap())
            .collect();
        assert!(
            copies.windows(2).all(|w| w[0] == w[1]),
            "object {o} differs"
        );
        assert!(copies[0].0 == pattern(i as u32), "object {o}: wrong bytes");
    }
    // Writes and reads go on without it.
    rt.block_on(cl.write_obj(held[0], 0, Bytes::from_static(b"after")))
        .unwrap();
    let got = rt.block_on(cl.read_obj(held[0], 0, 5)).unwrap();
    assert_eq!(&got[..], b"after");
}

/// A replica whose writes fail: the write is retried (not failed at once) while that node
/// counts errors; once it fences itself the write goes to the new owners and succeeds. Before:
/// the client got the replica's I/O error for every write touching it, forever.
#[test]
fn writes_through_a_failing_replica_go_through_once_it_is_fenced() {
    let (c, rt, cl) = setup(4, limit(3));
    let o = oid(20);
    rt.block_on(cl.write_obj(o, 0, Bytes::from(pattern(20))))
        .unwrap();
    let bad = c.owners(0, o, 3)[1];
    c.store(bad).fail(Op::Write, Fault::Io);
    rt.block_on(cl.write_obj(o, 4096, Bytes::from_static(b"through")))
        .expect("the write did not go through once the failing node was fenced");
    assert!(c.node(bad).unwrap().health().is_fenced());
    let got = rt.block_on(cl.read_obj(o, 4096, 7)).unwrap();
    assert_eq!(&got[..], b"through");
    c.wait_members(3);
    let now = c.owners((bad + 1) % 4, o, 3);
    assert!(!now.contains(&bad));
    wait_for("the new owners to agree", 30, || {
        now.iter()
            .all(|&i| c.store(i).read(o, 4096, 7).is_ok_and(|b| b == b"through"))
    });
}
