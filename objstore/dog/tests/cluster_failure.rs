//! Node death and return with real processes: kill -9, recovery to full copies, and a node that
//! comes back with stale copies never serving them. After each, every replica of every object
//! is read from disk and compared (`testkit::replicas`).

use serde_json::Value;
use testkit::cluster::{Bins, Cluster};
use testkit::pseudo_random;
use testkit::replicas::{self, assert_consistent};

fn bins() -> Bins {
    Bins::fresh()
}

const MIB: u64 = 1 << 20;
const OBJECTS: u64 = 48;
/// The rejoining node pauses this long before each recovery pull, so it is still recovering
/// while the test reads from it.
const PULL_DELAY_MS: u64 = 1000;

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

fn object(data: &[u8], i: u64) -> &[u8] {
    &data[(i * MIB) as usize..((i + 1) * MIB) as usize]
}

/// Node `addr`'s recovery state as `dog node recovery` shows it ("recovering", "done", ...).
fn recovery_state(c: &Cluster, addr: &str) -> String {
    let rows = c.dog_json(&["node", "recovery"]);
    rows.as_array()
        .unwrap()
        .iter()
        .find(|r| r["addr"] == addr)
        .map(|r| match &r["status"]["recovery"]["state"] {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
        .unwrap_or_else(|| "not a member".into())
}

#[test]
fn kill9_recovery_and_stale_rejoin() {
    let mut c = Cluster::start(&bins(), 4);
    c.dog_ok(&["cluster", "format", "--copies", "3", "--object-size", "1M"]);
    c.dog_ok(&["vdi", "create", "v", "64M"]);
    let mut data = pseudo_random((OBJECTS * MIB) as usize, 7);
    c.write_vdi("v", 0, &data);
    c.wait_recovered();
    let r = assert_consistent(&c, "v");
    assert_eq!((r.objects, r.copies), (OBJECTS as usize + 1, 3), "{r:?}");

    // kill -9 one node: every object still reads back identical, right away.
    let victim = 3;
    let victim_addr = c.addr(victim);
    c.kill9(victim);
    assert!(
        c.read_vdi("v", 0, OBJECTS * MIB) == data,
        "read after kill -9 differs"
    );

    // Writes still succeed: overwrite every other object while the victim is down.
    for i in (0..OBJECTS).step_by(2) {
        let fresh = pseudo_random(MIB as usize, 1000 + i);
        c.write_vdi("v", i * MIB, &fresh);
        data[(i * MIB) as usize..((i + 1) * MIB) as usize].copy_from_slice(&fresh);
    }
    c.wait_members(3);
    c.wait_recovered();
    let survivors = sorted((0..3).map(|i| c.addr(i)).collect());
    for i in 0..OBJECTS {
        assert_eq!(
            c.holders("v", i).addrs(),
            survivors,
            "object {i} must be back to 3 copies on the 3 survivors"
        );
    }
    assert_consistent(&c, "v");
    assert!(c.read_vdi("v", 0, OBJECTS * MIB) == data, "after recovery");

    // The victim comes back on its old directory holding stale copies of the overwritten
    // objects, slowed down so that it is still recovering while we read. Read each stale
    // object for which it is the first replica (reads go there first) while it still has the
    // object pending: it must pull the newest copy before it answers.
    c.node_args[victim] = vec!["--test-pull-delay-ms".into(), PULL_DELAY_MS.to_string()];
    let mark = replicas::log_mark(&c, victim);
    c.start_node(victim);
    c.wait_members(4);
    let mut stale = 0;
    let mut hits = Vec::new();
    for i in (0..OBJECTS).step_by(2) {
        let o = c.holders("v", i);
        if !o.placement.contains(&victim_addr) {
            continue;
        }
        stale += 1;
        if o.placement[0] != victim_addr {
            continue;
        }
        // Pending on the victim: it does not report the object yet, and it is recovering.
        let pending =
            !o.addrs().contains(&victim_addr) && recovery_state(&c, &victim_addr) == "recovering";
        let got = c.read_vdi("v", i * MIB, MIB);
        assert!(
            got == object(&data, i),
            "object {i} served stale data (pending on the rejoined node: {pending})"
        );
        if pending {
            hits.push(i);
        }
    }
    assert!(
        !hits.is_empty(),
        "no read reached the rejoined node while it was recovering: the test proved nothing"
    );
    eprintln!("read objects {hits:?} from the rejoined node while it was recovering them");

    c.wait_recovered();
    assert!(c.read_vdi("v", 0, OBJECTS * MIB) == data, "after rejoin");
    // Exactly 3 copies of every object, on exactly its placement, one stamp, same bytes.
    let r = assert_consistent(&c, "v");
    assert_eq!((r.objects, r.copies), (OBJECTS as usize + 1, 3), "{r:?}");
    for i in 0..OBJECTS {
        let o = c.holders("v", i);
        assert_eq!(o.addrs(), o.placement_sorted(), "object {i} after rejoin");
    }
    // The returning node pulled exactly the objects it missed, and this start says so.
    let log = replicas::log_since(&c, victim, mark);
    assert!(
        log.contains(&format!(": recovering {stale} object(s)")),
        "the rejoined node should have recovered its {stale} stale object(s):\n{log}"
    );
    assert!(log.contains(": recovery done"), "{log}");
    assert!(!log.contains("could not recover"), "{log}");
}

#[test]
fn fewer_nodes_than_copies_is_degraded_but_writable() {
    let c = Cluster::start(&bins(), 2);
    c.dog_ok(&["cluster", "format", "--copies", "3"]);
    let info = c.dog_json(&["cluster", "info"]);
    assert_eq!(info["status"], "degraded");
    let text = String::from_utf8(c.dog_ok(&["cluster", "info"])).unwrap();
    assert!(text.contains("degraded"), "{text}");
    c.dog_ok(&["vdi", "create", "v", "16M"]);
    let data = pseudo_random(8 << 20, 3);
    c.write_vdi("v", 0, &data);
    assert!(c.read_vdi("v", 0, 8 << 20) == data);
    assert_eq!(
        c.holders("v", 0).addrs().len(),
        2,
        "as many copies as nodes"
    );
    c.wait_recovered();
    let r = assert_consistent(&c, "v");
    assert_eq!(
        (r.objects, r.copies),
        (3, 2),
        "inode and 2 objects, 2 copies"
    );
}

/// The replica check can fail: one byte flipped in one node's copy (while the node is stopped,
/// so nothing the cluster does explains it) is reported, naming that object and that node.
#[test]
fn replica_check_names_a_corrupted_copy() {
    let mut c = Cluster::start(&bins(), 3);
    c.dog_ok(&["cluster", "format", "--copies", "3", "--object-size", "1M"]);
    c.dog_ok(&["vdi", "create", "v", "8M"]);
    c.write_vdi("v", 0, &pseudo_random(4 << 20, 11));
    c.wait_recovered();
    assert_consistent(&c, "v");

    let target = 1;
    let addr = c.addr(target);
    let o = c.holders("v", 2);
    let oid = o.oid.clone().expect("object 2 is allocated");
    let stamp = o
        .holders
        .iter()
        .find(|h| h.addr == addr)
        .expect("3 copies on 3 nodes")
        .stamp;
    c.kill9(target);
    let path = replicas::copy_path(&c, &addr, &oid, stamp).unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[4096] ^= 0x5a;
    std::fs::write(&path, &bytes).unwrap();
    c.start_node(target);
    c.wait_members(3);
    c.wait_recovered();

    let e = replicas::check(&c, "v").expect_err("a corrupted copy must be reported");
    assert_eq!(e.problems.len(), 1, "{e}");
    let p = &e.problems[0];
    assert_eq!(p.node.as_deref(), Some(addr.as_str()), "{e}");
    assert!(
        p.object.contains(&oid) && p.object.starts_with("index 2 "),
        "{e}"
    );
    assert!(p.what.contains("first at offset 4096"), "{e}");
}
