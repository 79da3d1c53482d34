//! Check, repair and scrub through real nodes: copies damaged on a node's disk (bytes flipped
//! in the object files, files removed) are found by `dog vdi check` and by the background
//! scrub and restored from good copies; an object with no good copy is named.

mod common;

use std::os::unix::fs::FileExt;
use std::time::Duration;

use common::{bins, MIB};
use serde_json::Value;
use testkit::cluster::Cluster;
use testkit::{pseudo_random, replicas, wait_until};

/// A cluster of 3 nodes with 3 copies of 1 MiB objects, and VDI `name` of `objects` objects
/// written whole with pseudo-random bytes (returned).
fn cluster_with(node_args: Vec<Vec<String>>, name: &str, objects: u64) -> (Cluster, Vec<u8>) {
    let c = Cluster::start_with_args(&bins(), node_args);
    c.dog_ok(&["cluster", "format", "--copies", "3", "--object-size", "1M"]);
    c.dog_ok(&["vdi", "create", name, &format!("{objects}M")]);
    let data = pseudo_random((objects * MIB) as usize, 0xc4ec);
    c.write_vdi(name, 0, &data);
    c.wait_recovered();
    (c, data)
}

/// Object `index` of VDI `name`: its id.
fn oid_of(c: &Cluster, name: &str, index: u64) -> String {
    c.holders(name, index).oid.expect("an allocated object")
}

/// Flips one byte of `addr`'s copy of `oid` in place on its disk, behind the node's back.
fn flip(c: &Cluster, addr: &str, oid: &str, at: u64) {
    let path = replicas::copy_path(c, addr, oid)
        .unwrap_or_else(|| panic!("{addr} holds no file for {oid}"));
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    // A byte of the object's data, past the store's header (its block checksums).
    let at = at + replicas::OBJECT_HEADER_LEN;
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, at).unwrap();
    b[0] ^= 0xff;
    f.write_all_at(&b, at).unwrap();
}

fn check_json(c: &Cluster, args: &[&str]) -> (bool, Value) {
    let mut a = args.to_vec();
    a.push("--json");
    let out = c.dog(&a);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "dog {a:?} printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.success(), v)
}

/// Nodes without the background scrub: only the check repairs.
fn no_scrub() -> Vec<Vec<String>> {
    vec![vec!["--scrub-rate".into(), "0".into()]; 3]
}

#[test]
fn check_repairs_a_flipped_byte_in_each_of_100_objects_on_one_replica() {
    let (c, data) = cluster_with(no_scrub(), "big", 100);
    let victim = c.addr(1);
    for i in 0..100 {
        flip(&c, &victim, &oid_of(&c, "big", i), (i * 7919) % MIB);
    }
    assert!(
        replicas::check(&c, "big").is_err(),
        "the flipped bytes show on disk"
    );

    let (ok, s) = check_json(&c, &["vdi", "check", "big"]);
    assert!(ok, "check succeeds: {s}");
    assert_eq!(s["objects"], 101, "the inode and 100 data objects: {s}");
    assert_eq!(s["bad_copies"], 100, "{s}");
    assert_eq!(s["repaired_copies"], 100, "{s}");
    assert_eq!(s["repaired_objects"], 100, "{s}");
    assert_eq!(s["unrecoverable_objects"], 0, "{s}");
    for p in s["problems"].as_array().unwrap() {
        let bad = p["bad"].as_array().unwrap();
        assert_eq!(bad.len(), 1, "{p}");
        assert_eq!(bad[0]["addr"], victim.as_str(), "{p}");
        // Each copy checks its blocks against their checksums as it reads them back.
        assert!(
            bad[0]["problem"]
                .as_str()
                .is_some_and(|w| w.starts_with("failed verification") && w.contains("checksum")),
            "{p}"
        );
        assert_eq!(bad[0]["repaired"], true, "{p}");
    }

    let (ok, again) = check_json(&c, &["vdi", "check", "big"]);
    assert!(ok, "{again}");
    assert_eq!(
        again["bad_copies"], 0,
        "a second check finds nothing: {again}"
    );
    assert_eq!(again["copies"], 303, "{again}");
    replicas::assert_consistent(&c, "big");
    assert!(
        c.read_vdi("big", 0, 100 * MIB) == data,
        "the VDI reads back as written"
    );
    // The human summary.
    let text = String::from_utf8(c.dog_ok(&["vdi", "check", "big"])).unwrap();
    assert!(
        text.contains("checked 101 object(s) of VDI 'big'") && text.contains("bad copies: 0"),
        "{text}"
    );
}

#[test]
fn check_restores_a_missing_copy_and_names_an_unrecoverable_object() {
    let (c, data) = cluster_with(no_scrub(), "v", 8);
    // Index 1: node 0's copy removed from its disk under the running node.
    let oid1 = oid_of(&c, "v", 1);
    std::fs::remove_file(replicas::copy_path(&c, &c.addr(0), &oid1).unwrap()).unwrap();
    // Index 2: every copy removed.
    let oid2 = oid_of(&c, "v", 2);
    for i in 0..3 {
        std::fs::remove_file(replicas::copy_path(&c, &c.addr(i), &oid2).unwrap()).unwrap();
    }
    // Index 3: the copies on nodes 1 and 2 flipped at different bytes: three contents, and
    // only node 0's passes its block checksums, so it is the one good copy (without checksums
    // no majority would say which is right).
    let oid3 = oid_of(&c, "v", 3);
    flip(&c, &c.addr(1), &oid3, 10);
    flip(&c, &c.addr(2), &oid3, 20);

    let (ok, s) = check_json(&c, &["vdi", "check", "v"]);
    assert!(!ok, "an unrecoverable object fails the check: {s}");
    assert_eq!(s["objects"], 9, "{s}");
    // Node 0 may restore its copy of index 1 on its own (the check's read of it failed, and a
    // copy a read fails on is restored from a replica at once) before the check looks again:
    // then the check has nothing left to repair there.
    let healed = s["problems"]
        .as_array()
        .unwrap()
        .iter()
        .all(|p| p["index"] != 1);
    let (bad, repaired) = if healed { (5, 2) } else { (6, 3) };
    assert_eq!(s["repaired_copies"], repaired, "{s}");
    assert_eq!(
        s["bad_copies"], bad,
        "node 0's copy of index 1 (unless healed), the 3 of index 2, 2 of index 3: {s}"
    );
    assert_eq!(s["unrecoverable_objects"], 1, "{s}");
    let problems = s["problems"].as_array().unwrap();
    let by_index = |i: u64| {
        problems
            .iter()
            .find(|p| p["index"] == i)
            .unwrap_or_else(|| panic!("index {i} not reported: {s}"))
    };
    if !healed {
        let p1 = by_index(1);
        assert_eq!(p1["bad"][0]["addr"], c.addr(0).as_str(), "{p1}");
        assert_eq!(p1["bad"][0]["repaired"], true, "{p1}");
        assert!(p1["unrecoverable"].is_null(), "{p1}");
    }
    let p2 = by_index(2);
    assert!(
        p2["unrecoverable"]
            .as_str()
            .unwrap()
            .contains("failed verification"),
        "{p2}"
    );
    let p3 = by_index(3);
    assert!(p3["unrecoverable"].is_null(), "{p3}");
    let bad3 = p3["bad"].as_array().unwrap();
    assert_eq!(bad3.len(), 2, "{p3}");
    assert!(bad3.iter().all(|b| b["repaired"] == true), "{p3}");

    // The exit code and the names on stderr.
    let err = c.dog_err(&["vdi", "check", "v"]);
    assert!(
        err.contains("1 object(s) unrecoverable")
            && err.contains("index 2 of VDI 'v'")
            && err.contains(&oid2)
            && !err.contains("index 3 of VDI 'v'"),
        "{err}"
    );
    assert_eq!(
        replicas::copy_data(&replicas::copy_path(&c, &c.addr(2), &oid3).unwrap()).unwrap(),
        common::object(&data, 3),
        "node 2's copy of index 3 restored from node 0's"
    );
    // The restored copy is whole: index 1 reads back from node 0 alone.
    let path = replicas::copy_path(&c, &c.addr(0), &oid1).expect("restored on node 0");
    let back = replicas::copy_data(&path).unwrap();
    assert!(
        back == common::object(&data, 1),
        "node 0's copy of index 1 restored"
    );
    // dog cluster check sees the same (every VDI).
    let (ok, s) = check_json(&c, &["cluster", "check"]);
    assert!(!ok);
    assert_eq!(s["unrecoverable_objects"], 1, "{s}");
    assert_eq!(s["bad_copies"], 3, "the 3 removed copies of index 2: {s}");
}

/// Node `addr`'s scrub status (`dog node scrub`).
fn scrub_of(c: &Cluster, addr: &str) -> Value {
    let rows = c.dog_json(&["node", "scrub"]);
    rows.as_array()
        .unwrap()
        .iter()
        .find(|r| r["addr"] == addr)
        .map(|r| r["status"]["scrub"].clone())
        .unwrap_or(Value::Null)
}

#[test]
fn scrub_repairs_a_flipped_byte_without_a_read_and_a_slow_scrub_is_throttled() {
    let fast: Vec<String> = ["--scrub-rate", "1G", "--scrub-interval", "1s"]
        .map(String::from)
        .to_vec();
    let (mut c, data) = cluster_with(vec![fast; 3], "s", 4);
    let oid = oid_of(&c, "s", 2);
    let victim = c.addr(2);
    flip(&c, &victim, &oid, 4096);
    // No client reads: only the scrub can find it.
    wait_until(
        "the scrub to restore the flipped copy",
        Duration::from_secs(30),
        || {
            replicas::copy_path(&c, &victim, &oid)
                .and_then(|p| replicas::copy_data(&p).ok())
                .is_some_and(|b| b == common::object(&data, 2))
        },
    );
    let repaired: u64 = (0..3)
        .map(|i| scrub_of(&c, &c.addr(i))["repaired_total"].as_u64().unwrap())
        .sum();
    assert!(repaired >= 1, "a scrub counted the repair");
    replicas::assert_consistent(&c, "s");
    // The repair may come from the first pass to end; the others end soon after.
    let node_list = || String::from_utf8(c.dog_ok(&["node", "list"])).unwrap();
    assert!(node_list().contains("Last scrub"), "{}", node_list());
    wait_until(
        "every node shows its last scrub's time",
        Duration::from_secs(30),
        || node_list().lines().skip(1).all(|l| l.contains(" UTC")),
    );

    // Node 0 again at 512 KiB/s: its pass reads at least 4 MiB of copies, so takes 8 s or more.
    // (A pass every second: the one recorded before the restart is due again at once.)
    let rate = 512 * 1024;
    c.node_args[0] = ["--scrub-rate", "512K", "--scrub-interval", "1s"]
        .map(String::from)
        .to_vec();
    c.kill9(0);
    let restarted = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    c.start_node(0);
    c.wait_recovered();
    let addr = c.addr(0);
    // Before its first pass since the restart (8 s or more), the node shows the one it
    // recorded before.
    let s = scrub_of(&c, &addr);
    if s["passes"] == 0 {
        assert!(
            s["last"]["started"]
                .as_u64()
                .is_some_and(|t| t <= restarted),
            "the pass before the restart is remembered: {s}"
        );
    }
    wait_until("node 0's slow pass", Duration::from_secs(90), || {
        scrub_of(&c, &addr)["passes"].as_u64() >= Some(1)
    });
    let s = scrub_of(&c, &addr);
    assert_eq!(s["rate"], rate, "{s}");
    let last = &s["last"];
    let bytes = last["bytes"].as_u64().unwrap();
    let took = last["took_ms"].as_u64().unwrap();
    assert!(bytes >= 4 * MIB, "the pass read every copy: {s}");
    assert!(
        took >= bytes * 1000 / rate,
        "{bytes} bytes at {rate} B/s took only {took} ms: {s}"
    );
    assert_eq!(last["bad"], 0, "{s}");
}
