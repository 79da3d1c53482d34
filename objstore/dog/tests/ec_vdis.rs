//! Erasure-coded VDIs through real nodes with real `dog` (issue 44): created with
//! `--copies x:y` (or by the cluster's default), what goes in comes out, raw bytes are
//! (x + y) / x of the logical, a node killed leaves the data readable, and impossible schemes
//! are refused by name.

use testkit::cluster::{Bins, Cluster};
use testkit::pseudo_random;

fn bins() -> Bins {
    Bins::fresh()
}

#[test]
fn a_4_2_vdi_keeps_its_data_at_one_and_a_half_times_its_size() {
    let mut c = Cluster::start(&bins(), 6);
    c.dog_ok(&["cluster", "format", "--copies", "3", "--object-size", "1M"]);
    c.dog_ok(&[
        "vdi",
        "create",
        "ec",
        "32M",
        "--copies",
        "4:2",
        "--experimental",
    ]);
    let info = c.dog_json(&["vdi", "info", "ec"]);
    assert_eq!(info["redundancy"], "4:2", "{info}");
    let data = pseudo_random(16 << 20, 44);
    c.write_vdi("ec", 0, &data);
    // An unaligned write across objects and strips.
    let patch = pseudo_random(3 << 20, 45);
    let at = (1 << 20) - 1000;
    c.write_vdi("ec", at, &patch);
    let mut want = data.clone();
    want[at as usize..at as usize + patch.len()].copy_from_slice(&patch);
    assert!(c.read_vdi("ec", 0, 16 << 20) == want, "read back differs");
    let info = c.dog_json(&["vdi", "info", "ec"]);
    assert_eq!(info["allocated_objects"], 16);
    assert_eq!(info["used"], 16u64 << 20);
    assert_eq!(info["raw_used"], 24u64 << 20, "4:2 stores 1.5 bytes a byte");
    // Every strip reads back and parity matches: a clean check.
    let check = c.dog_json(&["vdi", "check", "ec"]);
    assert_eq!(check["objects"], 17, "{check}");
    assert_eq!(check["bad_copies"], 0, "{check}");
    assert_eq!(
        check["copies"],
        3 + 16 * 6,
        "3 inode copies, 6 strips an object: {check}"
    );
    let table = String::from_utf8(c.dog_ok(&["vdi", "list"])).unwrap();
    assert!(table.contains("4:2") && table.contains("Raw"), "{table}");

    // A node down: every byte still reads (decoded from the other strips), and writes go on
    // (5 strips of 6 is min-copies for 4:2).
    c.kill9(4);
    c.wait_members(5);
    assert!(
        c.read_vdi("ec", 0, 16 << 20) == want,
        "read with a node down"
    );
    let more = pseudo_random(1 << 20, 46);
    c.write_vdi("ec", 5 << 20, &more);
    want[5 << 20..6 << 20].copy_from_slice(&more);
    // Two down (y): still every byte.
    c.kill9(5);
    c.wait_members(4);
    assert!(
        c.read_vdi("ec", 0, 16 << 20) == want,
        "read with two nodes down"
    );
    // Both back: the strips they missed are rebuilt, and all reads and writes go on.
    c.start_node(4);
    c.start_node(5);
    c.wait_members(6);
    c.wait_recovered();
    assert!(
        c.read_vdi("ec", 0, 16 << 20) == want,
        "read after both came back"
    );
    c.write_vdi("ec", 0, &more);
    want[..1 << 20].copy_from_slice(&more);
    assert!(c.read_vdi("ec", 0, 16 << 20) == want);

    // Deleted: its strips go with it.
    c.dog_ok(&["vdi", "delete", "ec"]);
    assert!(c.dog_json(&["vdi", "list"]).as_array().unwrap().is_empty());
}

#[test]
fn the_cluster_default_and_impossible_schemes() {
    let c = Cluster::start(&bins(), 4);
    c.wait_members(4);
    // Every node at the epoch of 4 (the first node's count alone let a node still at the
    // epoch of 3 answer the format: "3 zone(s)").
    c.wait_recovered();
    let e = c.dog_err(&["cluster", "format", "--copies", "4:2", "--experimental"]);
    assert!(
        e.contains("6 strips in distinct zones") && e.contains("4 zone(s)"),
        "{e}"
    );
    // A preview: refused without --experimental.
    let e = c.dog_err(&["cluster", "format", "--copies", "2:1"]);
    assert!(e.contains("--experimental"), "{e}");
    let e = c.dog_err(&["vdi", "create", "x", "8M", "--copies", "2:1"]);
    assert!(e.contains("--experimental"), "{e}");
    c.dog_ok(&[
        "cluster",
        "format",
        "--copies",
        "2:1",
        "--experimental",
        "--object-size",
        "1M",
    ]);
    let info = c.dog_json(&["cluster", "info"]);
    assert_eq!(info["vdi_redundancy"], "2:1", "{info}");
    assert_eq!(info["copies"], 2, "inodes keep y + 1 copies");
    c.dog_ok(&["vdi", "create", "d", "8M"]);
    assert_eq!(c.dog_json(&["vdi", "info", "d"])["redundancy"], "2:1");
    let data = pseudo_random(5 << 20, 7);
    c.write_vdi("d", 1000, &data);
    assert!(c.read_vdi("d", 1000, 5 << 20) == data);
    for (scheme, why) in [
        ("3:2", "5 strips in distinct zones"),
        ("17:1", "data strips must be 2 to 16"),
        ("4:9", "parity strips 1 to 8"),
        ("3", "keeps 2 full copies"),
        ("x", "is not a redundancy"),
    ] {
        let e = c.dog_err(&[
            "vdi",
            "create",
            "bad",
            "8M",
            "--copies",
            scheme,
            "--experimental",
        ]);
        assert!(e.contains(why), "--copies {scheme}: {e}");
    }
    assert_eq!(c.dog_json(&["vdi", "list"]).as_array().unwrap().len(), 1);
}

/// Snapshots, clones, rollback and backups of an erasure-coded VDI: a write to an object its
/// snapshot shares copies it whole first (on the client), so the snapshot keeps its bytes;
/// a clone inherits the scheme; a full backup restores the same bytes.
#[test]
fn snapshot_clone_rollback_and_backup_of_an_ec_vdi() {
    let c = Cluster::start(&bins(), 4);
    c.wait_members(4);
    c.dog_ok(&["cluster", "format", "--copies", "2", "--object-size", "1M"]);
    c.dog_ok(&[
        "vdi",
        "create",
        "A",
        "8M",
        "--copies",
        "2:1",
        "--experimental",
    ]);
    let base = pseudo_random(6 << 20, 11);
    c.write_vdi("A", 0, &base);
    c.dog_ok(&["vdi", "snapshot", "A", "-s", "s1"]);
    let patch = pseudo_random(5000, 12);
    c.write_vdi("A", (2 << 20) - 100, &patch);
    let mut now = base.clone();
    now[(2 << 20) - 100..(2 << 20) + 4900].copy_from_slice(&patch);
    assert!(c.read_vdi("A", 0, 6 << 20) == now, "A after its write");
    assert!(
        c.read_vdi("A@s1", 0, 6 << 20) == base,
        "the snapshot kept its bytes"
    );
    assert_eq!(c.dog_json(&["vdi", "info", "A@s1"])["redundancy"], "2:1");

    c.dog_ok(&["vdi", "clone", "A@s1", "C"]);
    assert_eq!(c.dog_json(&["vdi", "info", "C"])["redundancy"], "2:1");
    c.write_vdi("C", 4096, b"clone");
    let mut cloned = base.clone();
    cloned[4096..4101].copy_from_slice(b"clone");
    assert!(c.read_vdi("C", 0, 6 << 20) == cloned, "the clone");
    assert!(
        c.read_vdi("A@s1", 0, 6 << 20) == base,
        "the snapshot under its clone"
    );

    let full = c.dog_ok(&["vdi", "backup", "A@s1"]);
    let out = c.dog_stdin(&["vdi", "restore", "B"], &full);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        c.read_vdi("B", 0, 6 << 20) == base,
        "restored from the backup"
    );

    c.dog_ok(&["vdi", "rollback", "A@s1", "--yes"]);
    assert!(c.read_vdi("A", 0, 6 << 20) == base, "rolled back");
    let check = c.dog_json(&["cluster", "check"]);
    assert_eq!(check["bad_copies"], 0, "{check}");
}

/// The background scrub over a 4:2 VDI, with no client reading it: a byte flipped in data
/// strip 1 on its holder's disk (its block checksum fails) and parity strip 5 rewritten with
/// valid checksums (only parity can tell) are both rebuilt, the parity by the stripe's
/// primary, which names why.
#[test]
fn the_scrub_rebuilds_a_flipped_data_strip_and_a_parity_strip_that_disagrees() {
    use std::os::unix::fs::FileExt;
    use testkit::replicas::{copy_data, copy_path, log_since, rewrite_sealed, OBJECT_HEADER_LEN};

    let fast: Vec<String> = ["--scrub-rate", "1G", "--scrub-interval", "1s"]
        .map(String::from)
        .to_vec();
    let c = Cluster::start_with_args(&bins(), vec![fast; 6]);
    c.wait_members(6);
    c.wait_recovered();
    c.dog_ok(&["cluster", "format", "--copies", "3", "--object-size", "1M"]);
    c.dog_ok(&[
        "vdi",
        "create",
        "ec",
        "4M",
        "--copies",
        "4:2",
        "--experimental",
    ]);
    let data = pseudo_random(4 << 20, 47);
    c.write_vdi("ec", 0, &data);
    c.wait_recovered();
    let base = c.holders("ec", 1).oid.expect("allocated");
    let base = objstore_proto::ObjectId(u64::from_str_radix(&base, 16).unwrap());
    // Strip k's holder (node index) and file.
    let strip = |k: usize| {
        let key = base.strip(k).to_string();
        (0..6)
            .find_map(|i| copy_path(&c, &c.addr(i), &key).map(|p| (i, p)))
            .unwrap_or_else(|| panic!("no node holds strip {k} ({key})"))
    };
    let (primary, _) = strip(0);
    let (h1, p1) = strip(1);
    let (h5, p5) = strip(5);
    let (want1, want5) = (copy_data(&p1).unwrap(), copy_data(&p5).unwrap());
    let marks: Vec<u64> = (0..6).map(|i| testkit::replicas::log_mark(&c, i)).collect();

    // One fault at a time: with two wrong strips a rebuild could take one from the other.
    rewrite_sealed(&p5, 9000, b"not the parity").unwrap();
    let restored = |k: usize, want: &[u8]| copy_data(&strip(k).1).is_ok_and(|b| b == want);
    testkit::wait_until(
        "the scrub to rebuild parity strip 5",
        std::time::Duration::from_secs(60),
        || restored(5, &want5),
    );
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&p1)
        .unwrap();
    let at = OBJECT_HEADER_LEN + 4096 + 17;
    let mut b = [0u8];
    f.read_exact_at(&mut b, at).unwrap();
    f.write_all_at(&[b[0] ^ 0xff], at).unwrap();
    testkit::wait_until(
        "the scrub to rebuild data strip 1",
        std::time::Duration::from_secs(60),
        || restored(1, &want1),
    );
    let log = log_since(&c, primary, marks[primary]);
    assert!(
        log.contains(&format!(
            "strip 5 on {} is bad (its bytes disagree with the other strips): rebuilt from the others",
            c.addr(h5)
        )),
        "the primary (node {primary}) names the parity strip it rebuilt:\n{log}"
    );
    let log5 = log_since(&c, h5, marks[h5]);
    assert!(
        !log5.contains("strip 5 here is bad"),
        "the rewritten parity passed its checksums on node {h5}:\n{log5}"
    );
    let rows = c.dog_json(&["node", "scrub"]);
    let repaired: u64 = rows
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["status"]["scrub"]["repaired_total"].as_u64().unwrap_or(0))
        .sum();
    assert!(
        repaired >= 2,
        "strips 1 (node {h1}) and 5 counted repaired: {rows}"
    );
    let check = c.dog_json(&["vdi", "check", "ec", "--dry-run"]);
    assert_eq!(check["bad_copies"], 0, "{check}");
    assert!(c.read_vdi("ec", 0, 4 << 20) == data, "read back differs");
}
