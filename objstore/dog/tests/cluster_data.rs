//! Data through real nodes with real `dog`: what goes in comes out, on exactly `copies` nodes.

use testkit::cluster::{Bins, Cluster};

fn bins() -> Bins {
    Bins::fresh()
}
use testkit::pseudo_random;
use testkit::replicas;

#[test]
fn write_read_256m_three_copies() {
    let c = Cluster::start(&bins(), 3);
    c.dog_ok(&["cluster", "format", "--copies", "3"]);
    c.dog_ok(&["vdi", "create", "big", "1G"]);
    let data = pseudo_random(256 << 20, 0x5eed);
    c.write_vdi("big", 0, &data);
    let back = c.read_vdi("big", 0, 256 << 20);
    assert!(back == data, "256 MiB read back differs");

    let info = c.dog_json(&["vdi", "info", "big"]);
    assert_eq!(
        info["allocated_objects"], 64,
        "thin: only written objects exist"
    );
    // Beyond what was written: a hole, zeros, no object.
    assert_eq!(c.read_vdi("big", 300 << 20, 4096), vec![0u8; 4096]);
    assert!(c.dog_json(&["vdi", "object", "big", "100"])["oid"].is_null());

    let addrs: Vec<String> = {
        let mut a: Vec<String> = (0..3).map(|i| c.addr(i)).collect();
        a.sort();
        a
    };
    for index in 0..64 {
        assert_eq!(
            c.holders("big", index).addrs(),
            addrs,
            "object {index} holders"
        );
    }
}

#[test]
fn unaligned_writes_across_objects_and_resize_delete() {
    let c = Cluster::start(&bins(), 3);
    c.dog_ok(&["cluster", "format", "--copies", "2", "--object-size", "1M"]);
    c.dog_ok(&["vdi", "create", "d", "8M"]);
    let base = pseudo_random(8 << 20, 1);
    c.write_vdi("d", 0, &base);
    // An unaligned write spanning three objects.
    let patch = pseudo_random((2 << 20) + 777, 2);
    let at = (1 << 20) - 333;
    c.write_vdi("d", at, &patch);
    let mut want = base.clone();
    want[at as usize..at as usize + patch.len()].copy_from_slice(&patch);
    assert!(c.read_vdi("d", 0, 8 << 20) == want);
    assert_eq!(
        c.read_vdi("d", at + 5, 100),
        want[at as usize + 5..at as usize + 105]
    );
    for index in 0..8 {
        assert_eq!(
            c.holders("d", index).addrs().len(),
            2,
            "2 copies of object {index}"
        );
    }

    replicas::assert_consistent(&c, "d");

    c.dog_ok(&["vdi", "resize", "d", "16M"]);
    assert_eq!(c.dog_json(&["vdi", "info", "d"])["size"], 16u64 << 20);
    assert!(c.read_vdi("d", 0, 8 << 20) == want, "grow keeps the data");
    assert_eq!(c.read_vdi("d", 12 << 20, 4096), vec![0u8; 4096]);

    c.dog_ok(&["vdi", "delete", "d"]);
    assert!(c.dog_json(&["vdi", "list"]).as_array().unwrap().is_empty());
    let nodes = c.dog_json(&["node", "list"]);
    for n in nodes.as_array().unwrap() {
        assert_eq!(
            n["status"]["objects"], 0,
            "delete removes every object: {n}"
        );
    }
}

/// Real nodes started with `sheep --zone`: the copies of every object land in distinct zones;
/// with a whole zone gone the cluster says it is degraded, still serves every byte, and keeps
/// 3 copies spread over the zones left.
#[test]
fn copies_land_in_distinct_zones() {
    let zones = [1u32, 1, 2, 2, 3, 3];
    let mut c = Cluster::start_with_args(
        &bins(),
        zones
            .iter()
            .map(|z| vec!["--zone".to_string(), z.to_string()])
            .collect(),
    );
    c.dog_ok(&["cluster", "format", "--copies", "3", "--object-size", "1M"]);
    let info = c.dog_json(&["cluster", "info"]);
    assert_eq!((&info["zones"], &info["status"]), (&3.into(), &"ok".into()));
    for n in c.dog_json(&["node", "list"]).as_array().unwrap() {
        let i = (0..zones.len()).find(|&i| n["addr"] == c.addr(i)).unwrap();
        assert_eq!(n["zone"], zones[i], "node {i} reports its zone");
    }
    c.dog_ok(&["vdi", "create", "v", "32M"]);
    let data = pseudo_random(32 << 20, 0x20e);
    c.write_vdi("v", 0, &data);
    c.wait_recovered();
    let addrs: Vec<String> = (0..zones.len()).map(|i| c.addr(i)).collect();
    let zone_of = |addr: &str| zones[addrs.iter().position(|a| a == addr).unwrap()];
    for o in replicas::objects(&c, "v").unwrap() {
        let mut z: Vec<u32> = o.addrs().iter().map(|a| zone_of(a)).collect();
        z.sort_unstable();
        assert_eq!(z, [1, 2, 3], "{}: one copy per zone", o.name());
    }
    replicas::assert_consistent(&c, "v");

    // Zone 3 goes away entirely.
    c.kill9(4);
    c.kill9(5);
    replicas::wait_view(&c, &[0, 1, 2, 3]);
    c.wait_recovered();
    let info = c.dog_json(&["cluster", "info"]);
    assert_eq!(
        (&info["zones"], &info["status"]),
        (&2.into(), &"degraded".into())
    );
    assert!(c.read_vdi("v", 0, 32 << 20) == data, "after losing a zone");
    for o in replicas::objects(&c, "v").unwrap() {
        let mut z: Vec<u32> = o.addrs().iter().map(|a| zone_of(a)).collect();
        z.sort_unstable();
        z.dedup();
        assert_eq!(z, [1, 2], "{}: both zones left hold a copy", o.name());
    }
    let r = replicas::assert_consistent(&c, "v");
    assert_eq!(r.copies, 3, "3 copies on 4 nodes of 2 zones");
}
