//! The local driver's own tests (the conformance suite covers the contract).

use super::*;

fn node(id: u64, port: u16) -> NodeInfo {
    NodeInfo {
        id,
        addr: format!("127.0.0.1:{port}").parse().unwrap(),
        zone: id as u32,
        vnodes: 8,
        incarnation: 1,
    }
}

#[test]
fn join_leave_make_epochs() {
    let d = tempfile::tempdir().unwrap();
    let a = LocalDriver::open(d.path()).unwrap();
    let b = LocalDriver::open(d.path()).unwrap();
    assert_eq!(a.cluster_id().unwrap(), b.cluster_id().unwrap());
    let v1 = a.join(&node(1, 7000)).unwrap();
    assert_eq!((v1.epoch, v1.nodes.len()), (1, 1));
    let v2 = b.join(&node(2, 7001)).unwrap();
    assert_eq!((v2.epoch, v2.nodes.len()), (2, 2));
    assert_eq!(a.tick().unwrap(), v2, "no change, no new epoch");
    b.leave().unwrap();
    let v3 = a.tick().unwrap();
    assert_eq!((v3.epoch, v3.nodes), (3, vec![node(1, 7000)]));
    assert_eq!(a.view_at(2).unwrap(), Some(v2));
}

#[test]
fn dead_pid_is_dropped() {
    let d = tempfile::tempdir().unwrap();
    let a = LocalDriver::open(d.path()).unwrap();
    a.join(&node(1, 7000)).unwrap();
    let rec = NodeRecord {
        info: node(2, 7001),
        pid: u32::MAX / 2, // no such process
        heartbeat_ms: now_ms(),
    };
    fs::write(a.node_path(2), serde_json::to_vec(&rec).unwrap()).unwrap();
    let v = a.tick().unwrap();
    assert_eq!(v.nodes, vec![node(1, 7000)]);
}

/// A stall of the whole host (no node ticks for longer than DEAD_AFTER) kills no one: the
/// first node back allows for its own lateness. A node still silent afterwards is dropped.
#[test]
fn a_stall_of_everyone_kills_no_one() {
    let d = tempfile::tempdir().unwrap();
    let a = LocalDriver::open(d.path()).unwrap();
    let b = LocalDriver::open(d.path()).unwrap();
    a.join(&node(1, 7000)).unwrap();
    let v2 = b.join(&node(2, 7001)).unwrap();
    a.tick().unwrap();
    std::thread::sleep(DEAD_AFTER + TICK); // every node held up
    assert_eq!(a.tick().unwrap(), v2, "a's own stall made b look dead");
    assert_eq!(b.tick().unwrap(), v2);
    // b stops for good while a ticks on time: b goes within DEAD_AFTER and a tick or two.
    let stopped = std::time::Instant::now();
    let v = loop {
        let v = a.tick().unwrap();
        if v.node(2).is_none() {
            break v;
        }
        assert!(stopped.elapsed() < DEAD_AFTER + TICK * 3, "b never dropped");
        std::thread::sleep(TICK);
    };
    assert_eq!((v.epoch, v.nodes), (v2.epoch + 1, vec![node(1, 7000)]));
}

#[test]
fn kv_cas_and_list() {
    let d = tempfile::tempdir().unwrap();
    let a = LocalDriver::open(d.path()).unwrap();
    assert!(a.kv_cas("vdi/x", None, Some(b"1")).unwrap());
    assert!(!a.kv_cas("vdi/x", None, Some(b"2")).unwrap());
    assert!(a.kv_cas("vdi/x", Some(b"1"), Some(b"2")).unwrap());
    assert!(a.kv_cas("vdi/y/z", None, Some(b"3")).unwrap());
    assert!(a.kv_cas("other", None, Some(b"4")).unwrap());
    let l = a.kv_list("vdi/").unwrap();
    assert_eq!(
        l,
        vec![
            ("vdi/x".into(), b"2".to_vec()),
            ("vdi/y/z".into(), b"3".to_vec())
        ]
    );
    assert!(a.kv_cas("vdi/x", Some(b"2"), None).unwrap());
    assert_eq!(a.kv_get("vdi/x").unwrap(), None);
    // Keys of any length (a 255-byte VDI name and more).
    let long = format!("lock/{}", "n".repeat(300));
    assert!(a.kv_cas(&long, None, Some(b"v")).unwrap());
    assert_eq!(a.kv_get(&long).unwrap(), Some(b"v".to_vec()));
    assert_eq!(a.kv_list("lock/").unwrap(), vec![(long, b"v".to_vec())]);
}

#[test]
fn leases() {
    let d = tempfile::tempdir().unwrap();
    let a = LocalDriver::open(d.path()).unwrap();
    let b = LocalDriver::open(d.path()).unwrap();
    let ttl = Duration::from_secs(1);
    let l = a.lease_grant(ttl).unwrap();
    assert_ne!(l, 0);
    assert!(a.kv_cas_leased("lock/x", None, b"1", l).unwrap());
    assert!(!a.kv_cas_leased("lock/x", None, b"2", l).unwrap(), "a cas");
    assert_eq!(b.kv_get("lock/x").unwrap(), Some(b"1".to_vec()));
    assert_eq!(b.kv_list("lock/").unwrap().len(), 1);
    // Renewals (from another node) keep it alive past its first deadline.
    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(500));
        assert!(b.lease_keepalive(l).unwrap());
    }
    assert_eq!(a.kv_get("lock/x").unwrap(), Some(b"1".to_vec()));
    // Left alone, it ends, and its key with it, for every read.
    std::thread::sleep(Duration::from_millis(1100));
    assert_eq!(b.kv_list("lock/").unwrap(), vec![]);
    assert_eq!(a.kv_get("lock/x").unwrap(), None);
    assert!(!a.lease_keepalive(l).unwrap(), "an ended lease stays ended");
    assert!(!a.kv_cas_leased("lock/x", None, b"3", l).unwrap());
    assert_eq!(a.kv_get("lock/x").unwrap(), None);

    // Revoke removes its keys at once, and only its keys.
    let l2 = a.lease_grant(Duration::from_secs(30)).unwrap();
    assert!(a.kv_cas_leased("lock/y", None, b"y", l2).unwrap());
    assert!(a.kv_cas_leased("lock/z", None, b"z", l2).unwrap());
    assert!(a.kv_cas("lock/w", None, Some(b"w")).unwrap());
    // A plain cas unbinds a key: it survives the lease.
    assert!(a.kv_cas("lock/z", Some(b"z"), Some(b"z2")).unwrap());
    b.lease_revoke(l2).unwrap();
    b.lease_revoke(l2).unwrap(); // unknown: not an error
    assert!(!a.lease_keepalive(l2).unwrap());
    assert_eq!(
        a.kv_list("lock/").unwrap(),
        vec![
            ("lock/w".into(), b"w".to_vec()),
            ("lock/z".into(), b"z2".to_vec())
        ]
    );
}

#[test]
fn tick_expires_leases_unread() {
    let d = tempfile::tempdir().unwrap();
    let a = LocalDriver::open(d.path()).unwrap();
    a.join(&node(1, 7000)).unwrap();
    let l = a.lease_grant(Duration::from_millis(200)).unwrap(); // rounds up to 1 s
    assert!(a.kv_cas_leased("lock/x", None, b"1", l).unwrap());
    std::thread::sleep(Duration::from_millis(500));
    a.tick().unwrap();
    assert!(
        a.read_record("lock/x").unwrap().is_some(),
        "1 s, not 200 ms"
    );
    std::thread::sleep(Duration::from_millis(700));
    a.tick().unwrap();
    assert!(a.read_record("lock/x").unwrap().is_none());
    assert!(a.read_lease(l).unwrap().is_none());
}

#[test]
fn records_of_earlier_versions_read_unbound() {
    // [u32 BE key length][key][value], as written before leases.
    let mut old = 5u32.to_be_bytes().to_vec();
    old.extend_from_slice(b"vdi/xvalue");
    let r = kv_decode(&old).unwrap();
    assert_eq!(
        (r.key.as_str(), r.value.as_slice(), r.lease),
        ("vdi/x", &b"value"[..], None)
    );
    assert_eq!(kv_encode("vdi/x", b"value", None), old);
    let bound = kv_encode("vdi/x", b"value", Some(0x0102_0304_0506_0708));
    assert_eq!(&bound[..12], &[0x80, 0, 0, 5, 1, 2, 3, 4, 5, 6, 7, 8]);
    let r = kv_decode(&bound).unwrap();
    assert_eq!(
        (r.key.as_str(), r.lease),
        ("vdi/x", Some(0x0102_0304_0506_0708))
    );
}
