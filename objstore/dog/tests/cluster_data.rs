//! Data through real nodes with real `dog`: what goes in comes out, on exactly `copies` nodes.

use testkit::cluster::{Bins, Cluster};

fn bins() -> Bins {
    Bins::fresh()
}
use testkit::pseudo_random;

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
