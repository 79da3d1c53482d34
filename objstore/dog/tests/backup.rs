//! `dog vdi backup` / `dog vdi restore` through real nodes: a full delta restores a snapshot
//! into a new VDI, an incremental one carries only what changed and brings the copy to the
//! next snapshot byte for byte; deltas that are cut or damaged are refused naming where, and
//! leave the target's snapshot untaken; requests that make no sense are refused.

mod common;

use common::{bins, discard, MIB};
use serde_json::Value;
use testkit::cluster::Cluster;
use testkit::pseudo_random;

const SIZE: u64 = 16 * MIB;

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).trim().to_string()
}

/// Runs `dog vdi restore ARGS` with `delta` on stdin; Ok(stdout) or Err(stderr).
fn restore(c: &Cluster, args: &[&str], delta: &[u8]) -> Result<Vec<u8>, String> {
    let mut a = vec!["vdi", "restore"];
    a.extend_from_slice(args);
    let out = c.dog_stdin(&a, delta);
    if out.status.success() {
        Ok(out.stdout)
    } else {
        Err(stderr(&out))
    }
}

fn exists(c: &Cluster, name: &str) -> bool {
    c.dog(&["vdi", "info", name]).status.success()
}

#[test]
fn full_then_incremental_round_trip_and_bad_deltas() {
    let c = Cluster::start(&bins(), 3);
    c.dog_ok(&["cluster", "format", "--copies", "2", "--object-size", "1M"]);
    c.dog_ok(&["vdi", "create", "A", "16M"]);
    // Objects 0..12 written, 12..16 holes.
    let data = pseudo_random((12 * MIB) as usize, 0xbac);
    c.write_vdi("A", 0, &data);
    c.dog_ok(&["vdi", "snapshot", "A", "-s", "s1"]);
    let at_s1 = c.read_vdi("A", 0, SIZE);

    // Changes: a whole object, 4 KiB inside another, a discard of a whole object and a partial
    // one, 8 KiB into a hole.
    c.write_vdi("A", 2 * MIB, &pseudo_random(MIB as usize, 0x22));
    c.write_vdi("A", 5 * MIB + 8192, &pseudo_random(4096, 0x55));
    discard(&c, "A", 7 * MIB, MIB);
    discard(&c, "A", 9 * MIB + 65536, 65536);
    c.write_vdi("A", 14 * MIB + 4096, &pseudo_random(8192, 0x14));
    c.dog_ok(&["vdi", "snapshot", "A", "-s", "s2"]);
    let at_s2 = c.read_vdi("A@s2", 0, SIZE);
    assert_ne!(at_s1, at_s2);

    // Full: B is created and equals A@s1; B@s1 is taken.
    let out = c.dog(&["vdi", "backup", "A@s1", "--json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let sum: Value = serde_json::from_str(&stderr(&out)).expect("JSON summary on stderr");
    let full = out.stdout;
    assert_eq!(sum["changed_objects"], 12, "{sum}");
    assert_eq!(sum["data_bytes"], 12 * MIB, "{sum}");
    assert_eq!(sum["stream_bytes"], full.len() as u64, "{sum}");
    let out: Value =
        serde_json::from_slice(&restore(&c, &["B", "--json"], &full).unwrap()).unwrap();
    assert_eq!(out["created"], true, "{out}");
    assert_eq!(out["snapshot"], "B@s1", "{out}");
    assert_eq!(c.read_vdi("B", 0, SIZE), at_s1, "B equals A@s1");
    assert_eq!(c.read_vdi("B@s1", 0, SIZE), at_s1, "B@s1 taken");
    let info = c.dog_json(&["vdi", "info", "B"]);
    assert_eq!(info["size"], SIZE);

    // Incremental: about what changed, not what did not.
    let inc = c.dog_ok(&["vdi", "backup", "A@s1", "A@s2"]);
    let changed = MIB + 4096 + 8192; // data; the discards are zero records
    assert!(
        (inc.len() as u64) >= changed && (inc.len() as u64) < changed + 4096,
        "incremental delta {} bytes for {changed} bytes changed",
        inc.len()
    );
    let saved = full.len() - inc.len();
    assert!(
        saved as u64 > 12 * MIB - changed - 64 * 1024,
        "the incremental saves about what did not change: full {} inc {}",
        full.len(),
        inc.len()
    );

    // Onto a VDI without @s1, or none at all: refused, nothing changed.
    c.dog_ok(&["vdi", "create", "C", "16M"]);
    let e = restore(&c, &["C"], &inc).unwrap_err();
    assert!(e.contains("'C@s1' does not exist"), "{e}");
    let e = restore(&c, &["D"], &inc).unwrap_err();
    assert!(e.contains("'D' does not exist"), "{e}");
    assert!(!exists(&c, "D") && !exists(&c, "C@s2"));

    // Cut before its end: refused naming the byte; B@s2 not taken, the rollback named.
    let cut = &inc[..inc.len() - 30];
    let e = restore(&c, &["B"], cut).unwrap_err();
    assert!(
        e.contains(&format!("delta byte {}", cut.len())) && e.contains("ends early"),
        "{e}"
    );
    assert!(
        e.contains("'B@s2' was not taken") && e.contains("rollback B@s1"),
        "{e}"
    );
    assert!(!exists(&c, "B@s2"));
    // B was partly changed: another incremental is refused until it is rolled back.
    let e = restore(&c, &["B"], &inc).unwrap_err();
    assert!(e.contains("changed since 'B@s1'"), "{e}");
    c.dog_ok(&["vdi", "rollback", "B@s1", "--yes"]);

    // A flipped byte in the data of the last record: refused naming it, B@s2 not taken.
    let mut bad = inc.clone();
    let at = bad.len() - 21 - 4 - 100; // trailer, the last record's crc, into its data
    bad[at] ^= 0x40;
    let e = restore(&c, &["B"], &bad).unwrap_err();
    assert!(e.contains("checksum") && e.contains("(record "), "{e}");
    assert!(!exists(&c, "B@s2"));
    c.dog_ok(&["vdi", "rollback", "B@s1", "--yes"]);
    // The header damaged: refused before anything is changed.
    let mut bad = inc.clone();
    bad[50] ^= 1;
    let e = restore(&c, &["B"], &bad).unwrap_err();
    assert!(
        e.contains("header fails its checksum") && e.contains("nothing was changed"),
        "{e}"
    );

    // The whole incremental: B equals A@s2 byte for byte, and B@s2 is taken.
    let out = String::from_utf8(restore(&c, &["B"], &inc).unwrap()).unwrap();
    assert!(out.contains("took snapshot 'B@s2'"), "{out}");
    assert_eq!(c.read_vdi("B", 0, SIZE), at_s2, "B equals A@s2");
    assert_eq!(c.read_vdi("B@s2", 0, SIZE), at_s2);
    // The discarded object is a hole in B too.
    let obj = c.dog_json(&["vdi", "object", "B", "7"]);
    assert!(obj["oid"].is_null(), "{obj}");
    // Applied once: again is refused.
    let e = restore(&c, &["B"], &inc).unwrap_err();
    assert!(e.contains("'B@s2' already exists"), "{e}");

    // A full delta onto a VDI holding data: refused, or replaces all of it with --force.
    c.dog_ok(&["vdi", "create", "E", "16M"]);
    c.write_vdi("E", 15 * MIB, &[1u8; 4096]);
    let e = restore(&c, &["E"], &full).unwrap_err();
    assert!(e.contains("holds data") && e.contains("--force"), "{e}");
    restore(&c, &["E", "--force"], &full).unwrap();
    assert_eq!(c.read_vdi("E", 0, SIZE), at_s1);
}

#[test]
fn backup_refuses_what_makes_no_sense() {
    let c = Cluster::start(&bins(), 2);
    c.dog_ok(&["cluster", "format", "--copies", "2", "--object-size", "1M"]);
    for n in ["A", "B"] {
        c.dog_ok(&["vdi", "create", n, "4M"]);
        c.write_vdi(n, 0, &[7u8; 4096]);
        c.dog_ok(&["vdi", "snapshot", n, "-s", "s1"]);
    }
    c.write_vdi("A", 4096, &[8u8; 4096]);
    c.dog_ok(&["vdi", "snapshot", "A", "-s", "s2"]);

    let e = c.dog_err(&["vdi", "backup", "A"]);
    assert!(e.contains("not a snapshot"), "{e}");
    let e = c.dog_err(&["vdi", "backup", "A@s1", "A"]);
    assert!(e.contains("not a snapshot"), "{e}");
    let e = c.dog_err(&["vdi", "backup", "A@s1", "B@s1"]);
    assert!(e.contains("different VDIs"), "{e}");
    let e = c.dog_err(&["vdi", "backup", "A@s2", "A@s1"]);
    assert!(e.contains("taken after"), "{e}");
    let e = c.dog_err(&["vdi", "backup", "A@nope"]);
    assert!(e.contains("A@nope"), "{e}");

    // An attached VDI is not restored into.
    let full = c.dog_ok(&["vdi", "backup", "A@s2"]);
    c.dog_ok(&["vdi", "lock", "acquire", "B", "--owner", "test"]);
    let e = restore(&c, &["B", "--force"], &full).unwrap_err();
    assert!(e.contains("attached"), "{e}");
    // Not a delta at all.
    let e = restore(&c, &["F"], b"hello").unwrap_err();
    assert!(e.contains("ends early") || e.contains("not a delta"), "{e}");
    let e = restore(&c, &["F"], b"this is certainly not a delta").unwrap_err();
    assert!(e.contains("not a delta"), "{e}");
    assert!(!exists(&c, "F"));
}

/// The figures of docs/backup.md: backup and restore throughput of a 256 MiB VDI and the size
/// of incremental deltas after changing 10 % of its objects. Run with release binaries:
/// `cargo build --release -p objstore-node -p objstore-dog && cargo test -p objstore-dog
/// --test backup -- --ignored --nocapture measure` (BACKUP_BENCH_BIN picks another directory).
#[test]
#[ignore]
fn measure() {
    use std::process::Stdio;
    use std::time::Instant;
    let dir = std::env::var("BACKUP_BENCH_BIN")
        .unwrap_or_else(|_| format!("{}/../../target/release", env!("CARGO_MANIFEST_DIR")));
    let bins = testkit::cluster::Bins::new(&format!("{dir}/sheep"), &format!("{dir}/dog"));
    let c = Cluster::start(&bins, 3);
    c.dog_ok(&["cluster", "format", "--copies", "2"]);
    let size = 256 * MIB;
    c.dog_ok(&["vdi", "create", "A", "256M"]);
    c.write_vdi("A", 0, &pseudo_random(size as usize, 0x256));
    c.dog_ok(&["vdi", "snapshot", "A", "-s", "s1"]);
    let tmp = tempfile::tempdir().unwrap();
    let mib_s = |bytes: u64, secs: f64| bytes as f64 / MIB as f64 / secs;
    let timed =
        |args: &[&str], stdin: Option<&std::path::Path>, stdout: Option<&std::path::Path>| {
            let mut cmd = c.dog_command(args);
            cmd.stdin(match stdin {
                Some(p) => Stdio::from(std::fs::File::open(p).unwrap()),
                None => Stdio::null(),
            });
            cmd.stdout(match stdout {
                Some(p) => Stdio::from(std::fs::File::create(p).unwrap()),
                None => Stdio::null(),
            });
            cmd.stderr(Stdio::piped());
            let t = Instant::now();
            let out = cmd.output().unwrap();
            let secs = t.elapsed().as_secs_f64();
            assert!(out.status.success(), "{args:?}: {}", stderr(&out));
            secs
        };
    let full = tmp.path().join("full");
    let s = timed(&["vdi", "backup", "A@s1"], None, Some(&full));
    println!(
        "full backup of 256 MiB: {s:.2} s, {:.0} MiB/s",
        mib_s(size, s)
    );
    let s = timed(&["vdi", "restore", "B"], Some(&full), None);
    println!(
        "full restore of 256 MiB: {s:.2} s, {:.0} MiB/s",
        mib_s(size, s)
    );
    let s2 = timed(&["vdi", "read", "A@s1"], None, None);
    println!(
        "(dog vdi read of the same 256 MiB: {s2:.2} s, {:.0} MiB/s)",
        mib_s(size, s2)
    );
    let raw = tmp.path().join("raw");
    std::fs::write(&raw, c.read_vdi("A@s1", 0, size)).unwrap();
    c.dog_ok(&["vdi", "create", "W", "256M"]);
    let s3 = timed(&["vdi", "write", "W"], Some(&raw), None);
    println!(
        "(dog vdi write of the same 256 MiB: {s3:.2} s, {:.0} MiB/s)",
        mib_s(size, s3)
    );

    // 10 % of the 64 objects (every tenth): 4 KiB written in each, then each rewritten whole.
    let objects = size / (4 * MIB);
    let picked: Vec<u64> = (0..objects).step_by(10).collect();
    for &i in &picked {
        c.write_vdi("A", i * 4 * MIB + 12288, &pseudo_random(4096, i));
    }
    c.dog_ok(&["vdi", "snapshot", "A", "-s", "s2"]);
    for &i in &picked {
        c.write_vdi(
            "A",
            i * 4 * MIB,
            &pseudo_random((4 * MIB) as usize, i + 1000),
        );
    }
    c.dog_ok(&["vdi", "snapshot", "A", "-s", "s3"]);
    for (from, to, what) in [("A@s1", "A@s2", "4 KiB"), ("A@s2", "A@s3", "all")] {
        let inc = tmp.path().join(to);
        let s = timed(&["vdi", "backup", from, to], None, Some(&inc));
        let len = std::fs::metadata(&inc).unwrap().len();
        let r = timed(&["vdi", "restore", "B"], Some(&inc), None);
        println!(
            "incremental {from}..{to}, {} of {objects} objects changed ({what} of each): delta {len} bytes ({:.2} % of the full one); backup {s:.2} s, restore {r:.2} s",
            picked.len(),
            100.0 * len as f64 / std::fs::metadata(&full).unwrap().len() as f64
        );
    }
    assert_eq!(c.read_vdi("B", 0, size), c.read_vdi("A@s3", 0, size));
}
