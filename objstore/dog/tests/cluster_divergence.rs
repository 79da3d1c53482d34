//! Copies that diverge while nodes are down, and must not: an acknowledged write, a discard, a
//! delete made while holders are away; a write into an object whose holders are all down; a
//! recovery that fails on a full disk. Each test states the behaviour the design promises;
//! each failed before issue 22's versions, tombstones and history rule (say how in its doc).

mod common;

use std::time::Duration;

use common::{
    add_node, bins, discard, kill_at_once, live_node, lost_pair, object, KillOnDrop, Tmpfs, MIB,
};
use testkit::cluster::Cluster;
use testkit::pseudo_random;
use testkit::replicas::{self, assert_consistent};

/// With every copy of an object gone (both holders down at once), a partial write to it must
/// not make a new object of zeros around the written bytes: it waits for a holder (or fails),
/// and once the holders are back the object holds its old data with the write on top.
/// (Failed before issue 22's history rule: the write succeeded at once on the new owners as a
/// fresh object of zeros at a newer stamp, and recovery then copied it over the holders' data.)
#[test]
fn partial_write_to_a_lost_object_keeps_its_data() {
    let mut c = Cluster::start(&bins(), 4);
    c.dog_ok(&["cluster", "format", "--copies", "2", "--object-size", "1M"]);
    c.dog_ok(&["vdi", "create", "v", "32M"]);
    let data = pseudo_random(32 << 20, 42);
    c.write_vdi("v", 0, &data);
    c.wait_recovered();
    // The nodes up cannot vouch for the objects only the pair held: the cluster says it waits
    // for the pair.
    let (pair, lost) = lose_a_pair(&mut c, "v");

    let (i, oid) = lost[0].clone();
    let patch = [0xab; 4096];
    let at = i * MIB + 4096;
    // The write runs in its own dog; the holders come back once it has ended or after 3 s,
    // whichever is first (the order changes which path is taken, not what must hold).
    let t = std::time::Instant::now();
    let mut writer = KillOnDrop(Some(
        std::process::Command::new(&c.bins.dog)
            .env(testkit::auth::KEY_ENV, c.key_file())
            .args(["--address", &c.addr(live_node(&c)), "--timeout", "60"])
            .args(["vdi", "write", "v", &at.to_string()])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    ));
    let child = writer.0.as_mut().unwrap();
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(&patch).unwrap();
    }
    while t.elapsed() < Duration::from_secs(3) && child.try_wait().unwrap().is_none() {
        std::thread::sleep(Duration::from_millis(50));
    }
    let ended_before_return = child.try_wait().unwrap().is_some();
    for n in [pair.0, pair.1] {
        c.start_node(n);
    }
    c.wait_members(4);
    let write = writer.0.take().unwrap().wait_with_output().unwrap();
    let elapsed = t.elapsed();
    eprintln!(
        "write into lost object {i} ({oid}): {} after {elapsed:?} (ended before the holders \
         returned: {ended_before_return}) {}",
        write.status,
        String::from_utf8_lossy(&write.stderr)
    );
    c.wait_recovered();
    let mut want = object(&data, i).to_vec();
    if write.status.success() {
        want[4096..8192].copy_from_slice(&patch);
    }
    let got = c.read_vdi("v", i * MIB, MIB);
    let zeros = (0..got.len())
        .filter(|&k| got[k] == 0 && want[k] != 0)
        .count();
    assert!(
        got == want,
        "object {i} ({oid}) after its holders returned: {zeros} bytes read as zero that were \
         not (the write {} after {elapsed:?})",
        if write.status.success() {
            "succeeded"
        } else {
            "failed"
        },
    );
    assert_consistent(&c, "v");
}

/// Rolling failure: A dies, a write is acknowledged by B and C, B and C die, A starts alone on
/// its old copies, then B and C return. A alone must not serve its old copies as current (a read
/// waits or fails), a write made meanwhile must not revive them, and once B and C are back
/// every acknowledged write is what the VDI holds.
/// (Failed before: A alone served the old data, took a 4 KiB write on top of it, and when B
/// and C returned the acknowledged write was lost.)
#[test]
fn rolling_failure_keeps_acknowledged_writes() {
    let mut c = Cluster::start(&bins(), 3);
    c.dog_ok(&["cluster", "format", "--copies", "3", "--object-size", "1M"]);
    c.dog_ok(&["vdi", "create", "v", "8M"]);
    let old = pseudo_random(8 << 20, 71);
    c.write_vdi("v", 0, &old);
    c.wait_recovered();

    let (a, b, cc) = (0, 1, 2);
    c.kill9(a);
    c.wait_members(2);
    let mut want = pseudo_random(8 << 20, 72);
    c.write_vdi("v", 0, &want);
    c.wait_recovered();
    kill_at_once(&mut c, &[b, cc]);

    c.start_node(a);
    c.wait_members(1);
    let read = c.dog(&["--timeout", "5", "vdi", "read", "v", "0", "1M"]);
    let served_old = read.status.success() && read.stdout == object(&old, 0);
    let patch = [0x5a; 4096];
    let write = c.dog_stdin(&["--timeout", "5", "vdi", "write", "v", "4096"], &patch);
    if write.status.success() {
        want[4096..8192].copy_from_slice(&patch);
    }
    c.start_node(b);
    c.start_node(cc);
    c.wait_members(3);
    c.wait_recovered();
    let got = c.read_vdi("v", 0, 8 << 20);
    let old_objects: Vec<u64> = (0..8u64)
        .filter(|&i| {
            let r = (i * MIB) as usize + 8192..((i + 1) * MIB) as usize;
            got[r.clone()] == old[r]
        })
        .collect();
    assert!(
        !served_old && got == want,
        "A alone served object 0 as it was before the acknowledged write: {served_old}; a 4 KiB \
         write to A alone: {}; after B and C returned, objects {old_objects:?} hold the data \
         from before the acknowledged write",
        if write.status.success() {
            "acknowledged".to_string()
        } else {
            format!(
                "refused ({})",
                String::from_utf8_lossy(&write.stderr).trim()
            )
        }
    );
    assert_consistent(&c, "v");
}

/// A VDI deleted while a node is down: when the node returns with its copies, they do not come
/// back (not on it, not copied to others); every node ends with no object at all.
/// (Failed before durable tombstones: the node returned with 6 to 11 of the VDI's 17 objects
/// and kept them.)
#[test]
fn delete_while_a_node_is_down_stays_deleted() {
    let mut c = Cluster::start(&bins(), 4);
    c.dog_ok(&["cluster", "format", "--copies", "2", "--object-size", "1M"]);
    c.dog_ok(&["vdi", "create", "v", "16M"]);
    c.write_vdi("v", 0, &pseudo_random(16 << 20, 81));
    c.wait_recovered();
    let down = 3;
    c.kill9(down);
    c.wait_members(3);
    c.wait_recovered();
    c.dog_ok(&["vdi", "delete", "v"]);
    c.start_node(down);
    c.wait_members(4);
    c.wait_recovered();
    assert!(c.dog_json(&["vdi", "list"]).as_array().unwrap().is_empty());
    let held: Vec<(String, u64)> = c
        .dog_json(&["node", "list"])
        .as_array()
        .unwrap()
        .iter()
        .map(|n| {
            (
                n["addr"].as_str().unwrap().to_string(),
                n["status"]["objects"].as_u64().unwrap(),
            )
        })
        .filter(|(_, n)| *n > 0)
        .collect();
    assert!(
        held.is_empty(),
        "objects of the deleted VDI are back after node {} returned: {held:?}",
        c.addr(down)
    );
}

/// A node joins with a disk too small for what it must pull: its failed pulls show in
/// `dog node recovery`, no other node drops a copy meanwhile, and once the disk has room the
/// pulls are retried and the cluster ends with 2 agreeing copies of everything.
/// (Failed before the fix: 15 of 18 pulls failed on 3 MiB, the round ended "done", nothing was
/// retried once the disk had room, and the old owners dropped their copies, leaving those
/// objects with 1 copy.)
#[test]
fn failed_recovery_on_a_full_disk_keeps_copies() {
    let mut c = Cluster::start(&bins(), 3);
    c.dog_ok(&["cluster", "format", "--copies", "2", "--object-size", "1M"]);
    c.dog_ok(&["vdi", "create", "v", "32M"]);
    let data = pseudo_random(24 << 20, 91);
    c.write_vdi("v", 0, &data);
    c.wait_recovered();
    assert_consistent(&c, "v");

    // Node 3 joins on a 3 MiB disk; about half of the 25 objects become its to hold.
    let small = add_node(&mut c);
    let disk = Tmpfs::mount(&c.node_dir(small), "3M");
    c.start_node(small);
    replicas::wait_view(&c, &[0, 1, 2, small]);
    let small_addr = c.addr(small);
    let row = |c: &Cluster| {
        c.dog_json(&["node", "recovery"])
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["addr"] == small_addr.as_str())
            .map(|r| r["status"]["recovery"].clone())
            .unwrap_or_default()
    };
    testkit::wait_until(
        "the small node to report failed pulls",
        Duration::from_secs(30),
        || row(&c)["failed"].as_u64().unwrap_or(0) > 0,
    );
    let failing = row(&c);
    // Whatever the nodes do while the pulls fail, no object may drop below 2 copies.
    let thin = |c: &Cluster| -> Vec<String> {
        replicas::objects(c, "v")
            .unwrap()
            .iter()
            .filter(|o| o.holders.len() < 2)
            .map(|o| format!("{} on {:?}", o.name(), o.addrs()))
            .collect()
    };
    let thin_while_full = thin(&c);

    // Room on the disk: the failed pulls must be retried and the cluster settle.
    disk.resize("64M");
    let mut settled = true;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let rows = c.dog_json(&["node", "recovery"]);
        let rows = rows.as_array().unwrap();
        let e = &rows[0]["status"]["recovery"]["epoch"];
        if rows.iter().all(|r| {
            let rc = &r["status"]["recovery"];
            rc["state"] == "done" && rc["failed"] == 0 && rc["epoch"] == *e
        }) {
            break;
        }
        if std::time::Instant::now() > deadline {
            settled = false;
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let check = replicas::check(&c, "v");
    let got = c.read_vdi("v", 0, 24 << 20);
    assert!(
        thin_while_full.is_empty() && settled && check.is_ok() && got == data,
        "while the disk was full ({failing}), objects with fewer than 2 copies: \
         {thin_while_full:?}; settled with no failures within 30 s of making room: {settled} \
         (small node now {}); data intact: {}; replica check: {}",
        row(&c),
        got == data,
        match &check {
            Ok(r) => format!("{r:?}"),
            Err(p) => p.to_string(),
        }
    );
}

/// A discard made while a node is down stays discarded when it returns: the discarded object
/// reads as zeros, and a later write into it does not land on the returning node's old copy.
/// (Failed before durable tombstones: the returning node kept its old copy, a 4 KiB write
/// landed on it, and the bytes around it read as the old data.)
#[test]
fn discard_while_a_node_is_down_stays_discarded() {
    let mut c = Cluster::start(&bins(), 3);
    c.dog_ok(&["cluster", "format", "--copies", "3", "--object-size", "1M"]);
    c.dog_ok(&["vdi", "create", "v", "8M"]);
    let mut want = pseudo_random(8 << 20, 101);
    c.write_vdi("v", 0, &want);
    c.wait_recovered();

    let down = 2;
    c.kill9(down);
    c.wait_members(2);
    // Object 3 whole (unmapped and removed), and part of object 5 (zeroed).
    discard(&c, "v", 3 * MIB, MIB);
    discard(&c, "v", 5 * MIB + 100, 5000);
    want[(3 * MIB) as usize..(4 * MIB) as usize].fill(0);
    want[(5 * MIB + 100) as usize..(5 * MIB + 5100) as usize].fill(0);
    assert!(
        c.read_vdi("v", 0, 8 << 20) == want,
        "right after the discards"
    );

    c.start_node(down);
    c.wait_members(3);
    c.wait_recovered();
    assert!(
        c.read_vdi("v", 0, 8 << 20) == want,
        "after the node returned"
    );
    // Object 3 is written again (a new object at the same id): the returning node's old copy
    // must not supply the bytes around the write.
    let patch = pseudo_random(4096, 102);
    c.write_vdi("v", 3 * MIB + 8192, &patch);
    want[(3 * MIB + 8192) as usize..(3 * MIB + 12288) as usize].copy_from_slice(&patch);
    c.wait_recovered();
    let check = replicas::check(&c, "v");
    let got = c.read_vdi("v", 0, 8 << 20);
    assert!(
        got == want && check.is_ok(),
        "objects that read back wrong: {:?}; replica check (the node that was down is {}): {}",
        (0..8u64)
            .filter(|&i| object(&got, i) != object(&want, i))
            .collect::<Vec<_>>(),
        c.addr(down),
        match &check {
            Ok(r) => format!("{r:?}"),
            Err(p) => p.to_string(),
        }
    );
}

/// Both holders of some objects are gone for good: the cluster waits and says for whom;
/// `dog cluster recover` refuses without `--force`, and without `--yes` when it cannot ask;
/// with both it records the loss, recovery finishes, and the objects the nodes up hold are
/// served.
#[test]
fn forced_recovery_accepts_losing_every_holder() {
    let mut c = Cluster::start(&bins(), 4);
    c.dog_ok(&["cluster", "format", "--copies", "2", "--object-size", "1M"]);
    c.dog_ok(&["vdi", "create", "v", "32M"]);
    let data = pseudo_random(32 << 20, 43);
    c.write_vdi("v", 0, &data);
    c.wait_recovered();
    let (pair, lost) = lose_a_pair(&mut c, "v");
    let text = String::from_utf8(c.dog_ok(&["cluster", "info"])).unwrap();
    assert!(
        text.contains("Status: waiting")
            && text.contains(&c.addr(pair.0))
            && text.contains(&c.addr(pair.1)),
        "{text}"
    );
    let no_force = c.dog(&["cluster", "recover"]);
    assert!(!no_force.status.success());
    assert!(String::from_utf8_lossy(&no_force.stderr).contains("--force"));
    let no_yes = c.dog_stdin(&["cluster", "recover", "--force"], b"");
    assert!(!no_yes.status.success());
    assert!(String::from_utf8_lossy(&no_yes.stderr).contains("--yes"));
    let out = c.dog_json(&["cluster", "recover", "--force", "--yes"]);
    assert!(out["objects_maybe_older"].is_u64(), "{out}");
    let waited: Vec<&str> = out["waited_for"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(
        waited.contains(&c.addr(pair.0).as_str()) && waited.contains(&c.addr(pair.1).as_str()),
        "{out}"
    );
    c.wait_recovered();
    assert_ne!(c.dog_json(&["cluster", "info"])["status"], "waiting");
    // An object the nodes up hold reads as written.
    let kept = (0..32u64)
        .find(|i| !lost.iter().any(|(l, _)| l == i))
        .unwrap();
    assert!(c.read_vdi("v", kept * MIB, MIB) == object(&data, kept));
}

/// Kills at once both holders of some data objects of `name` (not of its inode) and waits until
/// `dog cluster info` says the cluster waits for both. Returns the pair and the lost objects.
fn lose_a_pair(c: &mut Cluster, name: &str) -> ((usize, usize), Vec<(u64, String)>) {
    let (pair, lost) = lost_pair(c, name);
    kill_at_once(c, &[pair.0, pair.1]);
    c.wait_members(2);
    let t = std::time::Instant::now();
    let info = loop {
        let info = c.dog_json(&["cluster", "info"]);
        if info["status"] == "waiting" {
            break info;
        }
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "the cluster does not say it waits: {info}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let waiting: Vec<&str> = info["waiting_for"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    for n in [pair.0, pair.1] {
        assert!(waiting.contains(&c.addr(n).as_str()), "{info}");
    }
    (pair, lost)
}
