//! Check and repair in one process (memory stores, the in-memory network): copies made behind,
//! missing or corrupt behind the nodes' backs (no new epoch, so recovery does not look) are
//! found by the check and restored from a good copy; a repair with nothing good to restore
//! from leaves the copy alone.

use std::time::Duration;

use bytes::Bytes;
use objstore_client::vdi::check::{check, CheckOptions, Target};
use objstore_client::ClientError;
use objstore_node::store::ObjectBackend;
use objstore_node::testing::MemCluster;
use objstore_proto::frame::ResultCode;
use objstore_proto::version::Version;
use objstore_proto::{ObjIndex, ObjectId, Vid};

const MIB: u64 = 1 << 20;

fn oid(i: u32) -> ObjectId {
    ObjectId::data(Vid(7), ObjIndex(i))
}

fn target(i: u32) -> Target {
    Target {
        vdi: "t".into(),
        index: Some(i as u64),
        oid: oid(i),
        ec: None,
    }
}

/// The node index of `addr`.
fn node_at(c: &MemCluster, addr: std::net::SocketAddr) -> usize {
    (0..3).find(|&i| c.addr(i) == addr).unwrap()
}

#[test]
fn behind_missing_and_corrupt_copies_are_repaired_and_nothing_good_is_dropped() {
    let c = MemCluster::start(3).expect("start");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let cl = c.client_on(&rt, Duration::from_secs(20));
    rt.block_on(cl.format(3, None, MIB)).unwrap();
    for i in 0..3 {
        rt.block_on(cl.write_obj(oid(i), 0, Bytes::from_static(b"first")))
            .unwrap();
    }
    rt.block_on(cl.flush()).unwrap();
    // Object 0: one copy put back at its first version after a second write.
    let behind = node_at(&c, cl.view().replicas(oid(0)).unwrap()[1]);
    let (old, old_state) = c.store(behind).read_whole(oid(0)).unwrap();
    rt.block_on(cl.write_obj(oid(0), 0, Bytes::from_static(b"later")))
        .unwrap();
    rt.block_on(cl.flush()).unwrap();
    let store = c.store(behind);
    store.forget(oid(0)).unwrap();
    assert!(store.put_if_newer(oid(0), &old, old_state).unwrap());
    // Object 1: one copy gone. Object 2: one copy's byte flipped.
    let missing = node_at(&c, cl.view().replicas(oid(1)).unwrap()[2]);
    c.store(missing).forget(oid(1)).unwrap();
    let corrupt = node_at(&c, cl.view().replicas(oid(2)).unwrap()[0]);
    assert!(c.store(corrupt).corrupt(oid(2), 1));

    // A repair with no owner holding the version asked leaves the copy as it is.
    let err = rt
        .block_on(cl.repair_obj(c.addr(behind), oid(0), Version(u64::MAX), None))
        .unwrap_err();
    assert!(
        matches!(&err, ClientError::Refused { code: ResultCode::NotFound, message, .. } if message.contains("left as it is")),
        "{err}"
    );
    assert_eq!(c.store(behind).read_whole(oid(0)).unwrap().1, old_state);

    let targets = (0..3).map(target).collect();
    let s = rt.block_on(check(&cl, targets, CheckOptions::default(), |_| {}));
    assert_eq!(s.objects, 3);
    assert_eq!(s.bad_copies, 3, "{s:#?}");
    assert_eq!(s.repaired_copies, 3, "{s:#?}");
    assert_eq!(s.unrecoverable_objects, 0, "{s:#?}");
    let problem = |i: u64| {
        let p = s.problems.iter().find(|p| p.index == Some(i)).unwrap();
        (node_at(&c, p.bad[0].addr), p.bad[0].problem.clone())
    };
    assert_eq!(problem(0).0, behind);
    assert!(problem(0).1.starts_with("behind"), "{:?}", problem(0));
    assert_eq!(problem(1), (missing, "missing".to_string()));
    // The memory store keeps block checksums too: the flipped byte fails them.
    let (node, why) = problem(2);
    assert_eq!(node, corrupt);
    assert!(
        why.starts_with("failed verification") && why.contains("checksum"),
        "{why}"
    );
    for i in 0..3 {
        assert_eq!(c.replicas_agree(oid(i)), 3, "object {i}");
    }
    let again = rt.block_on(check(
        &cl,
        (0..3).map(target).collect(),
        CheckOptions::default(),
        |_| {},
    ));
    assert_eq!(again.bad_copies, 0, "{again:#?}");
    assert_eq!(
        &rt.block_on(cl.read_obj(oid(0), 0, 5)).unwrap()[..],
        b"later"
    );
    // Writes go on over restored copies.
    rt.block_on(cl.write_obj(oid(1), 0, Bytes::from_static(b"third")))
        .unwrap();
    assert_eq!(c.replicas_agree(oid(1)), 3);
}
