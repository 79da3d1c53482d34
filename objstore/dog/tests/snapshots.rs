//! Snapshots, clones and rollback through real nodes and `dog`: a snapshot keeps what the VDI
//! held when it was taken while the VDI goes on (copy-on-write on the nodes), clones are
//! isolated from each other and from their snapshot, rollback brings the snapshot back,
//! deletes free exactly what nothing else reads, also on a node that was down.

mod common;

use common::{bins, MIB};
use serde_json::Value;
use testkit::cluster::Cluster;
use testkit::{pseudo_random, replicas};

/// 3 nodes, 3 copies of 1 MiB objects, VDI `disk` of 8 MiB written whole (returned).
fn cluster() -> (Cluster, Vec<u8>) {
    let c = Cluster::start(&bins(), 3);
    c.dog_ok(&["cluster", "format", "--copies", "3", "--object-size", "1M"]);
    c.dog_ok(&["vdi", "create", "disk", "8M"]);
    let data = pseudo_random((8 * MIB) as usize, 0x5a9);
    c.write_vdi("disk", 0, &data);
    (c, data)
}

fn row<'a>(list: &'a Value, full: &str) -> &'a Value {
    list.as_array()
        .unwrap()
        .iter()
        .find(|r| {
            let name = r["name"].as_str().unwrap();
            match r["tag"].as_str() {
                Some(t) => format!("{name}@{t}") == full,
                None => name == full,
            }
        })
        .unwrap_or_else(|| panic!("{full} is not listed: {list}"))
}

fn oids(c: &Cluster, name: &str, n: u64) -> Vec<String> {
    (0..n)
        .map(|i| c.holders(name, i).oid.expect("allocated"))
        .collect()
}

#[test]
fn snapshot_keeps_its_data_while_the_vdi_goes_on() {
    let (c, data) = cluster();
    c.dog_ok(&["vdi", "snapshot", "disk", "-s", "one"]);
    // Writes after the snapshot: a whole object, a 4 KiB piece inside another, a discard.
    let new = pseudo_random(MIB as usize, 0xbeef);
    c.write_vdi("disk", 2 * MIB, &new);
    c.write_vdi("disk", 5 * MIB + 12345, &[0xab; 4096]);
    let mut expect = data.clone();
    expect[(2 * MIB) as usize..(3 * MIB) as usize].copy_from_slice(&new);
    expect[(5 * MIB + 12345) as usize..(5 * MIB + 12345 + 4096) as usize].fill(0xab);

    assert_eq!(
        c.read_vdi("disk@one", 0, 8 * MIB),
        data,
        "the snapshot is as taken"
    );
    assert_eq!(c.read_vdi("disk", 0, 8 * MIB), expect, "the VDI goes on");

    // The snapshot's objects are the VDI's old ones: untouched ones still shared, written
    // ones copied into the VDI's own.
    let snap = oids(&c, "disk@one", 8);
    let cur = oids(&c, "disk", 8);
    for i in 0..8 {
        assert_eq!(
            snap[i] == cur[i],
            i != 2 && i != 5,
            "index {i}: {snap:?} {cur:?}"
        );
    }
    replicas::assert_consistent(&c, "disk");
    replicas::assert_consistent(&c, "disk@one");

    // Read-only.
    let e = c.dog_err(&["vdi", "write", "disk@one", "0", "1"]);
    assert!(e.contains("read-only"), "{e}");
    let e = c.dog_err(&["vdi", "resize", "disk@one", "16M"]);
    assert!(e.contains("read-only") || e.contains("snapshot"), "{e}");

    // Listed under the VDI, with what each alone holds.
    let list = c.dog_json(&["vdi", "list"]);
    let s = row(&list, "disk@one");
    assert_eq!(
        s["alone"],
        2 * MIB,
        "the snapshot alone holds the 2 overwritten objects"
    );
    let d = row(&list, "disk");
    assert_eq!(d["alone"], 2 * MIB, "the VDI alone holds its 2 copies");
    assert_eq!(d["parent"], "disk@one");
    let text = String::from_utf8(c.dog_ok(&["vdi", "list"])).unwrap();
    assert!(
        text.lines().any(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            cols.first() == Some(&"s") && cols.get(1) == Some(&"disk") && l.contains("one")
        }),
        "{text}"
    );
    let tree = String::from_utf8(c.dog_ok(&["vdi", "tree"])).unwrap();
    assert_eq!(tree, "disk@one\n└── disk (current)\n");

    // A snapshot without a tag gets one; a second with the same tag is refused.
    c.dog_ok(&["vdi", "snapshot", "disk"]);
    let e = c.dog_err(&["vdi", "snapshot", "disk", "-s", "one"]);
    assert!(e.contains("already exists"), "{e}");
    let e = c.dog_err(&["vdi", "snapshot", "disk", "-s", "a@b"]);
    assert!(e.contains("'@'"), "{e}");
    let list = c.dog_json(&["vdi", "list"]);
    assert_eq!(list.as_array().unwrap().len(), 3, "{list}");
}

#[test]
fn twenty_clones_are_isolated_rollback_and_delete_free_what_nothing_reads() {
    let (c, data) = cluster();
    c.dog_ok(&["vdi", "snapshot", "disk", "-s", "gold"]);
    for k in 0..20u8 {
        let name = format!("vm{k}");
        c.dog_ok(&["vdi", "clone", "disk@gold", &name]);
        c.write_vdi(
            &name,
            (k as u64 % 8) * MIB + 7 + 100 * k as u64,
            &[k + 1; 100],
        );
    }
    for k in 0..20u8 {
        let mut expect = data.clone();
        let at = ((k as u64 % 8) * MIB + 7 + 100 * k as u64) as usize;
        expect[at..at + 100].fill(k + 1);
        assert_eq!(c.read_vdi(&format!("vm{k}"), 0, 8 * MIB), expect, "vm{k}");
    }
    assert_eq!(c.read_vdi("disk@gold", 0, 8 * MIB), data);
    assert_eq!(c.read_vdi("disk", 0, 8 * MIB), data);
    let tree = String::from_utf8(c.dog_ok(&["vdi", "tree"])).unwrap();
    assert!(tree.starts_with("disk@gold\n"), "{tree}");
    assert_eq!(tree.matches("(clone)").count(), 20, "{tree}");

    // A snapshot with clones is not deleted; the message names them.
    let e = c.dog_err(&["vdi", "delete", "disk@gold"]);
    assert!((0..20).all(|k| e.contains(&format!("vm{k}"))), "{e}");

    // Rollback: what was written since is gone, and freed.
    c.write_vdi("disk", 0, &vec![9u8; (3 * MIB) as usize]);
    let e = c.dog_err(&["vdi", "rollback", "disk@gold"]);
    assert!(e.contains("--yes"), "{e}");
    c.dog_ok(&["vdi", "rollback", "disk@gold", "--yes"]);
    assert_eq!(c.read_vdi("disk", 0, 8 * MIB), data);

    // Deleting the clones, then the snapshot: the VDI still reads every object it shared
    // with the snapshot, and it alone holds them now.
    for k in 0..20 {
        c.dog_ok(&["vdi", "delete", &format!("vm{k}")]);
    }
    let gold = oids(&c, "disk@gold", 8);
    let out: Value =
        serde_json::from_slice(&c.dog_ok(&["vdi", "delete", "disk@gold", "--json"])).unwrap();
    assert_eq!(out["gc"]["freed_objects"], 0, "all shared with disk: {out}");
    assert_eq!(c.read_vdi("disk", 0, 8 * MIB), data);
    let list = c.dog_json(&["vdi", "list"]);
    assert_eq!(list.as_array().unwrap().len(), 1, "{list}");
    assert_eq!(row(&list, "disk")["alone"], 8 * MIB);
    let tree = String::from_utf8(c.dog_ok(&["vdi", "tree"])).unwrap();
    assert!(
        tree.contains("disk@gold (deleted, kept for others)"),
        "{tree}"
    );
    // The check covers the kept inode too.
    let check = String::from_utf8(c.dog_ok(&["cluster", "check"])).unwrap();
    assert!(
        check.contains("10 object"),
        "disk's inode and 8 objects, gold's inode: {check}"
    );

    // Overwriting the VDI leaves the deleted snapshot's objects unread: the next gc frees
    // them, and the deleted inode with them.
    c.write_vdi("disk", 0, &vec![7u8; (8 * MIB) as usize]);
    let r = c.dog_json(&["vdi", "gc"]);
    assert_eq!(r["freed_objects"], 8, "{r}");
    // The deleted inode stays: the VDI was rolled back from it and names it as its parent.
    assert_eq!(r["removed_inodes"], 0, "{r}");
    for oid in &gold {
        for i in 0..3 {
            assert!(
                replicas::copy_path(&c, &c.addr(i), oid).is_none(),
                "{oid} still on node {i}"
            );
        }
    }
    let tree = String::from_utf8(c.dog_ok(&["vdi", "tree"])).unwrap();
    assert_eq!(
        tree,
        "disk@gold (deleted, kept for others)\n└── disk (current)\n"
    );
}

#[test]
fn deleting_a_snapshot_frees_its_objects_on_a_node_that_was_down() {
    let (mut c, _) = cluster();
    c.dog_ok(&["vdi", "snapshot", "disk", "-s", "old"]);
    c.write_vdi("disk", 0, &vec![3u8; (8 * MIB) as usize]);
    let old = oids(&c, "disk@old", 8);
    c.wait_recovered();
    c.kill9(2);
    c.wait_members(2);
    let out: Value =
        serde_json::from_slice(&c.dog_ok(&["vdi", "delete", "disk@old", "--json"])).unwrap();
    assert_eq!(out["gc"]["freed_objects"], 8, "{out}");
    let down = c.addr(2);
    assert!(
        old.iter()
            .all(|o| replicas::copy_path(&c, &down, o).is_some()),
        "the down node still has its copies on disk"
    );
    c.start_node(2);
    c.wait_members(3);
    c.wait_recovered();
    for oid in &old {
        assert!(
            replicas::copy_path(&c, &down, oid).is_none(),
            "{oid} came back with node 2"
        );
    }
    assert_eq!(
        c.read_vdi("disk", 0, 8 * MIB),
        vec![3u8; (8 * MIB) as usize]
    );
}

/// The copy-on-write targets a 4 KiB write makes hold only that block (partial, a record
/// past the object's end): deleting the snapshot they read the rest from first makes them
/// whole, so the VDI reads the same after, and the snapshot's object is freed.
#[test]
fn deleting_a_snapshot_keeps_what_partial_copies_read_from_it() {
    let (c, data) = cluster();
    c.dog_ok(&["vdi", "snapshot", "disk", "-s", "one"]);
    let at = 3 * MIB + 8192 + 100;
    c.write_vdi("disk", at, &[0x5c; 4096]);
    let mut expect = data.clone();
    expect[at as usize..at as usize + 4096].fill(0x5c);
    let own = c.holders("disk", 3).oid.expect("allocated");
    let old = c.holders("disk@one", 3).oid.expect("allocated");
    assert_ne!(own, old);
    let len_on = |oid: &str| {
        let path = replicas::copy_path(&c, &c.addr(0), oid).expect("a copy on node 0");
        replicas::copy_data(&path).unwrap().len() as u64
    };
    assert!(len_on(&own) > MIB, "the VDI's copy of index 3 is partial");
    assert_eq!(c.read_vdi("disk", 0, 8 * MIB), expect);

    c.dog_ok(&["vdi", "delete", "disk@one"]);
    assert_eq!(
        c.read_vdi("disk", 0, 8 * MIB),
        expect,
        "the VDI reads the same"
    );
    assert!(
        len_on(&own) <= MIB,
        "the VDI's copy of index 3 was made whole"
    );
    assert!(
        replicas::copy_path(&c, &c.addr(0), &old).is_none(),
        "the snapshot's object {old} was freed"
    );
    replicas::assert_consistent(&c, "disk");
}

/// A copy-on-write target is created unsynced: a crash of every node before the next flush
/// drops it while the clone's map may name it. The clone then reads what it was copied from
/// (the written block was never flushed: its write may be lost), and the next write copies
/// again from the source (never from zeros).
#[test]
fn a_copy_dropped_by_a_crash_before_a_flush_reads_as_its_source_and_is_copied_again() {
    use objstore_client::vdi::Vdi;
    let (mut c, data) = cluster();
    c.dog_ok(&["vdi", "snapshot", "disk", "-s", "base"]);
    c.dog_ok(&["vdi", "clone", "disk@base", "vm"]);
    let at = (4 * MIB + 4096) as usize;
    {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let addrs: Vec<std::net::SocketAddr> = (0..3).map(|i| c.addr(i).parse().unwrap()).collect();
        rt.block_on(async {
            let cl = std::sync::Arc::new(
                objstore_client::Client::connect(&addrs, testkit::auth::client_options())
                    .await
                    .unwrap(),
            );
            let vdi = Vdi::open(cl, "vm").await.unwrap();
            vdi.write_at(at as u64, bytes::Bytes::from(vec![0xee; 4096]))
                .await
                .unwrap();
            // No flush.
        });
    }
    for i in 0..3 {
        c.kill9(i);
    }
    for i in 0..3 {
        c.start_node(i);
    }
    c.wait_members(3);
    c.wait_recovered();

    let block_ok = |got: &[u8], at: usize| {
        let b = &got[at..at + 4096];
        b == &data[at..at + 4096] || b.iter().all(|&x| x == 0xee)
    };
    let got = c.read_vdi("vm", 0, 8 * MIB);
    assert!(
        block_ok(&got, at),
        "the unflushed block is either written or not"
    );
    let mut rest = got.clone();
    rest[at..at + 4096].copy_from_slice(&data[at..at + 4096]);
    assert!(rest == data, "everything else reads as the snapshot");

    let at2 = (4 * MIB + 65536) as usize;
    c.write_vdi("vm", at2 as u64, &[0x11; 4096]);
    let got = c.read_vdi("vm", 0, 8 * MIB);
    assert!(block_ok(&got, at));
    assert!(got[at2..at2 + 4096].iter().all(|&x| x == 0x11));
    let mut rest = got.clone();
    rest[at..at + 4096].copy_from_slice(&data[at..at + 4096]);
    rest[at2..at2 + 4096].copy_from_slice(&data[at2..at2 + 4096]);
    assert!(
        rest == data,
        "the object was copied again from the snapshot, not from zeros"
    );
    assert_eq!(c.read_vdi("disk@base", 0, 8 * MIB), data);
}
