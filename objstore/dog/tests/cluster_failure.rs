//! Node death and return with real processes: kill -9, recovery to full copies, and a node that
//! comes back with stale copies never serving them.

use testkit::cluster::{Bins, Cluster};

fn bins() -> Bins {
    Bins::fresh()
}
use testkit::pseudo_random;

const MIB: u64 = 1 << 20;
const OBJECTS: u64 = 48;

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

#[test]
fn kill9_recovery_and_stale_rejoin() {
    let mut c = Cluster::start(&bins(), 4);
    c.dog_ok(&["cluster", "format", "--copies", "3", "--object-size", "1M"]);
    c.dog_ok(&["vdi", "create", "v", "64M"]);
    let mut data = pseudo_random((OBJECTS * MIB) as usize, 7);
    c.write_vdi("v", 0, &data);
    c.wait_recovered();
    for i in 0..OBJECTS {
        assert_eq!(c.holders("v", i).len(), 3, "object {i} before the kill");
    }

    // kill -9 one node: every object still reads back identical, right away.
    let victim = 3;
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
            c.holders("v", i),
            survivors,
            "object {i} must be back to 3 copies on the 3 survivors"
        );
    }
    assert!(c.read_vdi("v", 0, OBJECTS * MIB) == data, "after recovery");

    // The victim comes back on its old directory holding stale copies of the overwritten
    // objects. No read may ever return them: read while it rejoins and recovers, and after.
    c.start_node(victim);
    c.wait_members(4);
    for round in 0..4 {
        let got = c.read_vdi("v", 0, OBJECTS * MIB);
        for i in 0..OBJECTS {
            let r = (i * MIB) as usize..((i + 1) * MIB) as usize;
            assert!(
                got[r.clone()] == data[r],
                "round {round}: object {i} served stale data"
            );
        }
    }
    c.wait_recovered();
    assert!(c.read_vdi("v", 0, OBJECTS * MIB) == data, "after rejoin");
    let all = sorted((0..4).map(|i| c.addr(i)).collect());
    for i in 0..OBJECTS {
        let h = c.holders("v", i);
        assert_eq!(
            h.len(),
            3,
            "object {i}: exactly 3 copies after rejoin, got {h:?}"
        );
        assert!(h.iter().all(|a| all.contains(a)));
    }
    // The returning node pulled what it missed.
    assert!(
        c.log(victim).contains("recovering"),
        "the rejoined node should have recovered objects"
    );
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
    assert_eq!(c.holders("v", 0).len(), 2, "as many copies as nodes");
}
