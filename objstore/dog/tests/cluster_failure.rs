//! Node death and return with real processes: kill -9, recovery to full copies, and a node that
//! comes back with stale copies never serving them. After each, every replica of every object
//! is read from disk and compared (`testkit::replicas`).

mod common;

use std::time::Duration;

use common::{add_node, bins, kill_at_once, lost_pair, object, recovery_state, sorted, Tmpfs, MIB};
use testkit::cluster::Cluster;
use testkit::pseudo_random;
use testkit::replicas::{self, assert_consistent};

const OBJECTS: u64 = 48;
/// The rejoining node pauses this long before each recovery pull, so it is still recovering
/// while the test reads from it.
const PULL_DELAY_MS: u64 = 1000;

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
    // Exactly 3 copies of every object, on exactly its placement, one version, same bytes.
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
/// so nothing the cluster does explains it) is reported, naming that object and that node. The
/// nodes run without the background scrub, which would repair the copy before the check.
#[test]
fn replica_check_names_a_corrupted_copy() {
    let mut c = Cluster::start_with_args(&bins(), vec![vec!["--scrub-rate".into(), "0".into()]; 3]);
    c.dog_ok(&["cluster", "format", "--copies", "3", "--object-size", "1M"]);
    c.dog_ok(&["vdi", "create", "v", "8M"]);
    c.write_vdi("v", 0, &pseudo_random(4 << 20, 11));
    c.wait_recovered();
    assert_consistent(&c, "v");

    let target = 1;
    let addr = c.addr(target);
    let o = c.holders("v", 2);
    let oid = o.oid.clone().expect("object 2 is allocated");
    assert!(
        o.holders.iter().any(|h| h.addr == addr),
        "3 copies on 3 nodes"
    );
    c.kill9(target);
    let path = replicas::copy_path(&c, &addr, &oid).unwrap();
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[replicas::OBJECT_HEADER_LEN as usize + 4096] ^= 0x5a;
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

/// A node is killed (-9) while a series of writes runs, is restarted on its directory, and the
/// cluster ends with every acknowledged byte and agreeing replicas.
#[test]
fn node_killed_during_writes_restarts_on_its_dir() {
    const WRITES: u64 = 8;
    let c = Cluster::start(&bins(), 4);
    c.dog_ok(&["cluster", "format", "--copies", "3", "--object-size", "1M"]);
    c.dog_ok(&["vdi", "create", "v", "32M"]);
    let mut data = pseudo_random(32 << 20, 31);
    c.write_vdi("v", 0, &data);
    c.wait_recovered();

    // WRITES writes of 4 MiB, one after another, each its own dog; the node dies after the
    // second is acknowledged, so the rest run against a cluster losing (then lacking) a node.
    let chunks: Vec<(u64, Vec<u8>)> = (0..WRITES)
        .map(|k| {
            (
                k * 4 * MIB + 4096 * k,
                pseudo_random((4 * MIB) as usize, 500 + k),
            )
        })
        .collect();
    let acked = std::sync::atomic::AtomicU64::new(0);
    let victim = 2;
    std::thread::scope(|s| {
        let writer = s.spawn(|| {
            for (at, bytes) in &chunks {
                let end = (*at + bytes.len() as u64).min(32 << 20);
                let out = c.dog_stdin(
                    &["vdi", "write", "v", &at.to_string()],
                    &bytes[..(end - at) as usize],
                );
                if !out.status.success() {
                    return Err(String::from_utf8_lossy(&out.stderr).into_owned());
                }
                acked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
            Ok(())
        });
        testkit::wait_until("2 writes acknowledged", Duration::from_secs(60), || {
            acked.load(std::sync::atomic::Ordering::SeqCst) >= 2 || writer.is_finished()
        });
        let at_kill = acked.load(std::sync::atomic::Ordering::SeqCst);
        // SAFETY: a signal to a child of this process, reaped by kill9 below.
        unsafe {
            libc::kill(
                c.nodes[victim].as_ref().unwrap().pid() as libc::pid_t,
                libc::SIGKILL,
            )
        };
        let res = writer.join().unwrap();
        assert!(res.is_ok(), "a write failed around the kill: {res:?}");
        assert!(
            at_kill < WRITES,
            "every write was done before the kill: nothing ran during it"
        );
        eprintln!("killed the node after {at_kill} of {WRITES} writes");
    });
    // Reap the victim (already dead).
    let mut c = c;
    c.kill9(victim);
    for (at, bytes) in &chunks {
        let end = (*at + bytes.len() as u64).min(32 << 20);
        data[*at as usize..end as usize].copy_from_slice(&bytes[..(end - at) as usize]);
    }
    c.wait_members(3);
    c.wait_recovered();
    assert!(c.read_vdi("v", 0, 32 << 20) == data, "after the kill");
    assert_consistent(&c, "v");

    c.start_node(victim);
    c.wait_members(4);
    c.wait_recovered();
    assert!(c.read_vdi("v", 0, 32 << 20) == data, "after the restart");
    let r = assert_consistent(&c, "v");
    assert_eq!((r.objects, r.copies), (33, 3), "{r:?}");
}

/// Two nodes die at the same instant with 2 copies: objects whose both copies were on them are
/// out of reach. Reading them waits (the nodes may come back) until the client's timeout, then
/// fails with an error naming the object and the nodes it waits for (no hang, no zeros);
/// everything else reads back exactly.
#[test]
fn losing_every_copy_fails_reads_loudly() {
    let mut c = Cluster::start(&bins(), 4);
    c.dog_ok(&["cluster", "format", "--copies", "2", "--object-size", "1M"]);
    c.dog_ok(&["vdi", "create", "v", "32M"]);
    let data = pseudo_random(32 << 20, 41);
    c.write_vdi("v", 0, &data);
    c.wait_recovered();
    assert_consistent(&c, "v");
    let (pair, lost) = lost_pair(&c, "v");
    kill_at_once(&mut c, &[pair.0, pair.1]);
    c.wait_members(2);

    let lost_idx: Vec<u64> = lost.iter().map(|(i, _)| *i).collect();
    for i in 0..32 {
        if !lost_idx.contains(&i) {
            assert!(
                c.read_vdi("v", i * MIB, MIB) == object(&data, i),
                "object {i} had a surviving copy"
            );
        }
    }
    for (i, oid) in &lost {
        let t = std::time::Instant::now();
        let out = c.dog(&[
            "--timeout",
            "3",
            "vdi",
            "read",
            "v",
            &(i * MIB).to_string(),
            &MIB.to_string(),
        ]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "object {i} has no copy left, yet the read succeeded"
        );
        assert!(out.stdout.is_empty(), "object {i}: no bytes may come out");
        assert!(
            err.contains(oid.as_str())
                && err.contains("waiting for")
                && err.contains(&c.addr(pair.0))
                && err.contains(&c.addr(pair.1)),
            "object {i}: the error should name object {oid} and the nodes it waits for: {err}"
        );
        assert!(
            t.elapsed() < Duration::from_secs(8),
            "object {i}: the read took {:?} to fail",
            t.elapsed()
        );
    }
    // A whole-VDI read fails too instead of filling the lost objects with zeros.
    let out = c.dog(&["--timeout", "3", "vdi", "read", "v"]);
    assert!(!out.status.success(), "a read over lost objects succeeded");
}

/// While a rejoined node is still recovering (slowed down), another node dies and then a new one
/// joins: each new epoch restarts recovery, and the end state has every byte and agreeing
/// replicas.
#[test]
fn new_epochs_during_recovery() {
    let mut c = Cluster::start(&bins(), 4);
    c.dog_ok(&["cluster", "format", "--copies", "3", "--object-size", "1M"]);
    c.dog_ok(&["vdi", "create", "v", "64M"]);
    let mut data = pseudo_random((OBJECTS * MIB) as usize, 51);
    c.write_vdi("v", 0, &data);
    c.wait_recovered();

    // Node 3 misses writes to every other object.
    let slow = 3;
    c.kill9(slow);
    for i in (0..OBJECTS).step_by(2) {
        let fresh = pseudo_random(MIB as usize, 5000 + i);
        c.write_vdi("v", i * MIB, &fresh);
        data[(i * MIB) as usize..((i + 1) * MIB) as usize].copy_from_slice(&fresh);
    }
    c.wait_members(3);
    c.wait_recovered();

    // It comes back slowed down; once it is recovering, node 0 dies.
    c.node_args[slow] = vec!["--test-pull-delay-ms".into(), "500".into()];
    c.start_node(slow);
    c.wait_members(4);
    let slow_addr = c.addr(slow);
    testkit::wait_until(
        "the rejoined node to be recovering",
        Duration::from_secs(20),
        || recovery_state(&c, &slow_addr) == "recovering",
    );
    c.kill9(0);
    replicas::wait_view(&c, &[1, 2, slow]);
    let state = recovery_state(&c, &slow_addr);
    assert!(
        state == "planning" || state == "recovering",
        "the slowed node should still be recovering in the new epoch (planning it, or pulling): {state}"
    );
    // And a new node joins while it still recovers.
    let fresh = add_node(&mut c);
    c.start_node(fresh);
    replicas::wait_view(&c, &[1, 2, slow, fresh]);
    c.wait_recovered();
    assert!(
        c.read_vdi("v", 0, OBJECTS * MIB) == data,
        "after two epochs"
    );
    let r = assert_consistent(&c, "v");
    assert_eq!((r.objects, r.copies), (OBJECTS as usize + 1, 3), "{r:?}");

    // Node 0 returns on its directory: one more epoch, same end state.
    c.start_node(0);
    c.wait_members(5);
    c.wait_recovered();
    assert!(
        c.read_vdi("v", 0, OBJECTS * MIB) == data,
        "after node 0 returned"
    );
    assert_consistent(&c, "v");
}

/// Failed pulls are visible and fail the harness's wait: a node joining on a 3 MiB disk cannot
/// take the objects it must hold; `dog node recovery` counts its failures, and
/// `try_wait_recovered` says so instead of waiting them out or calling the cluster recovered.
#[test]
fn failed_pulls_show_and_fail_wait_recovered() {
    let mut c = Cluster::start(&bins(), 3);
    c.dog_ok(&["cluster", "format", "--copies", "2", "--object-size", "1M"]);
    c.dog_ok(&["vdi", "create", "v", "32M"]);
    c.write_vdi("v", 0, &pseudo_random(24 << 20, 92));
    c.wait_recovered();
    let small = add_node(&mut c);
    let _disk = Tmpfs::mount(&c.node_dir(small), "3M");
    c.start_node(small);
    replicas::wait_view(&c, &[0, 1, 2, small]);
    let small_addr = c.addr(small);
    testkit::wait_until(
        "the small node to report failed pulls",
        Duration::from_secs(30),
        || {
            c.dog_json(&["node", "recovery"])
                .as_array()
                .unwrap()
                .iter()
                .any(|r| {
                    r["addr"] == small_addr.as_str()
                        && r["status"]["recovery"]["failed"].as_u64().unwrap_or(0) > 0
                })
        },
    );
    let e = c
        .try_wait_recovered()
        .expect_err("failed pulls must fail the wait")
        .to_string();
    assert!(
        e.contains("nodes report failed pulls") && e.contains(&small_addr),
        "{e}"
    );
}
