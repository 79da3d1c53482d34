//! Clusters across hosts (issue 23): `sheep` on the etcd driver with every node as its own host.
//!
//! - On distinct loopback addresses (127.0.0.2, 127.0.0.3, ...): the cluster forms and serves;
//!   a node's join to six and the epoch after a kill -9 are timed against the lease TTL.
//! - In network namespaces (`testkit::netns`, root only), one sheep per namespace, etcd on the
//!   bridge, a client (`sheepfs`, fio, dog) in another namespace: the mount serves what dog
//!   wrote and what fio verifies; a node cut off from everyone acknowledges no write and, once
//!   healed, converges with the majority's data (and a client elsewhere under fio verify
//!   pauses and goes on); a rolling restart of every node and etcd's restart (within and
//!   past the lease TTL) under fio verify give no error, no EIO.
//!
//! Skipped, loudly, when etcd is missing, or (for the namespace tests) when not root or
//! without `ip netns`. To look into a failure, see [`debugging`] (`MULTIHOST_KEEP`,
//! `MULTIHOST_SHEEP_LOG`).

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::{fio_verify_args, SHEEPFS};
use serde_json::Value;
use testkit::cluster::{Bins, Cluster, ClusterOptions, NodeHost, NodeLog};
use testkit::etcd::{skip_without_etcd, Etcd};
use testkit::mount::{Mount, MountOptions};
use testkit::netns::{self, Netns};
use testkit::replicas::assert_consistent;
use testkit::{or_panic, pseudo_random, wait_until};

/// `sheep --lease-ttl`: the bounds are stated for 5 s.
const TTL: Duration = Duration::from_secs(5);
const MIB: usize = 1 << 20;

fn etcd_missing() -> bool {
    skip_without_etcd("clusters across hosts are")
}

fn netns_missing() -> bool {
    if etcd_missing() {
        return true;
    }
    let Some(why) = netns::unavailable() else {
        return false;
    };
    eprintln!(
        "\n*** SKIPPED: network namespaces are unavailable ({why}), so nodes as separate \
         hosts are NOT tested. Run the tests as root. ***\n"
    );
    true
}

fn options(etcd: &Etcd, hosts: Vec<NodeHost>) -> ClusterOptions {
    ClusterOptions {
        driver: Some(etcd.cluster_spec("/multihost")),
        lease_ttl: Some(TTL),
        hosts,
        ..ClusterOptions::default()
    }
}

/// For a failure to look into: `MULTIHOST_KEEP=DIR` keeps each cluster's directory (data,
/// node logs, sheepfs logs) as `DIR-TAG`; `MULTIHOST_SHEEP_LOG=FILTER` sets the nodes'
/// `RUST_LOG` (keep `info` in it: a start counts once the log says the node serves).
fn debugging(o: &mut ClusterOptions, tag: &str) {
    if let Ok(d) = std::env::var("MULTIHOST_KEEP") {
        o.dir = Some(format!("{d}-{tag}").into());
    }
    if let Ok(f) = std::env::var("MULTIHOST_SHEEP_LOG") {
        o.log = NodeLog::Env(f);
    }
}

fn loopback(n: usize) -> Vec<NodeHost> {
    (0..n)
        .map(|i| NodeHost {
            ip: format!("127.0.0.{}", i + 2),
            wrap: Vec::new(),
        })
        .collect()
}

fn epoch(c: &Cluster, addr: &str) -> Option<(u64, u64)> {
    let out = c.dog_at(addr, &["cluster", "info", "--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).ok()?;
    Some((v["epoch"].as_u64()?, v["nodes"].as_u64()?))
}

#[test]
fn nodes_on_distinct_loopback_addresses_serve() {
    if etcd_missing() {
        return;
    }
    let etcd = Etcd::single();
    let c = or_panic(Cluster::try_start_with(
        &Bins::fresh(),
        3,
        options(&etcd, loopback(3)),
    ));
    c.dog_ok(&["cluster", "format", "--copies", "3", "--object-size", "1M"]);
    let nodes = c.dog_json(&["node", "list"]);
    let mut addrs: Vec<&str> = nodes
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n["addr"].as_str())
        .map(|a| a.rsplit_once(':').unwrap().0)
        .collect();
    addrs.sort();
    assert_eq!(addrs, ["127.0.0.2", "127.0.0.3", "127.0.0.4"], "{nodes}");
    c.dog_ok(&["vdi", "create", "v", "16M"]);
    let data = pseudo_random(16 * MIB, 23);
    c.write_vdi("v", 0, &data);
    for i in 0..3 {
        let got = c.dog_at(
            &c.addr(i),
            &["vdi", "read", "v", "0", &(16 * MIB).to_string()],
        );
        assert!(
            got.status.success() && got.stdout == data,
            "read through node {i}"
        );
    }
    assert_consistent(&c, "v");
}

/// A node's join to a cluster of six, and the epoch that drops a node killed with SIGKILL:
/// each within the lease TTL and a second. `hosts` places seven nodes (the 7th joins).
fn join_and_kill9(etcd: &Etcd, hosts: Vec<NodeHost>, where_: &str) {
    let mut o = options(etcd, hosts);
    let tag = o.hosts[0].ip.clone();
    debugging(&mut o, &tag);
    let mut c = or_panic(Cluster::try_start_with(&Bins::fresh(), 6, o));
    c.dog_ok(&["cluster", "format", "--copies", "3", "--object-size", "1M"]);
    c.dog_ok(&["vdi", "create", "v", "8M"]);
    c.write_vdi("v", 0, &pseudo_random(8 * MIB, 6));
    let addr0 = c.addr(0);
    let (before, _) = epoch(&c, &addr0).unwrap();

    let t = Instant::now();
    let i = c.add_node(Vec::new());
    let serving = t.elapsed();
    wait_until("the 7th node to join", TTL * 4, || {
        epoch(&c, &addr0).is_some_and(|(_, n)| n == 7)
    });
    let join = t.elapsed();
    let (joined, _) = epoch(&c, &addr0).unwrap();
    assert!(joined > before, "no new epoch for the join");
    c.wait_recovered();

    c.kill9(i);
    let t = Instant::now();
    wait_until("the killed node's epoch", TTL * 4, || {
        epoch(&c, &addr0).is_some_and(|(e, n)| e > joined && n == 6)
    });
    let death = t.elapsed();
    eprintln!(
        "MEASURED (lease TTL {TTL:?}, 6 nodes {where_}, one etcd): join of a 7th node \
         {join:?} from its start ({serving:?} to serve); epoch without a node killed with \
         SIGKILL {death:?} after the kill"
    );
    assert!(join <= TTL + Duration::from_secs(1), "join took {join:?}");
    assert!(
        death <= TTL + Duration::from_secs(1),
        "the epoch after a kill -9 took {death:?}"
    );
    c.wait_recovered();
    assert_consistent(&c, "v");
}

#[test]
fn join_and_kill9_within_the_lease_ttl_on_loopback_addresses() {
    if etcd_missing() {
        return;
    }
    let etcd = Etcd::single();
    join_and_kill9(&etcd, loopback(7), "on loopback addresses");
}

#[test]
fn join_and_kill9_within_the_lease_ttl_in_namespaces() {
    if netns_missing() {
        return;
    }
    let net = Netns::new(7);
    let etcd = or_panic(Etcd::try_start_on(&net.bridge_ip(), 1));
    let hosts = (0..7).map(|i| net.host(i)).collect();
    join_and_kill9(&etcd, hosts, "in network namespaces, etcd on the bridge");
}

/// Nodes in namespaces `0..nodes`, etcd on the bridge, clients in the namespaces after them.
/// Fields drop in order: the mount, the nodes, etcd, then the namespaces.
struct Hosts {
    mount: Option<Mount>,
    c: Cluster,
    etcd: Etcd,
    net: Netns,
    nodes: usize,
}

impl Hosts {
    fn start(nodes: usize, clients: usize) -> Hosts {
        let net = Netns::new(nodes + clients);
        let etcd = or_panic(Etcd::try_start_on(&net.bridge_ip(), 1));
        let hosts = (0..nodes).map(|i| net.host(i)).collect();
        let mut o = options(&etcd, hosts);
        debugging(&mut o, net.name(0));
        let c = or_panic(Cluster::try_start_with(&Bins::fresh(), nodes, o));
        c.dog_ok(&["cluster", "format", "--copies", "3", "--object-size", "1M"]);
        Hosts {
            mount: None,
            c,
            etcd,
            net,
            nodes,
        }
    }

    /// The first client's namespace.
    fn client(&self) -> usize {
        self.nodes
    }

    /// sheepfs in the client's namespace, given every node's address.
    fn mount(&mut self, extra: &[&str]) {
        self.mount = Some(self.mount_in(self.client(), "mnt", extra));
    }

    /// sheepfs in namespace `ns` on `c.dir/NAME`, given every node's address.
    fn mount_in(&self, ns: usize, name: &str, extra: &[&str]) -> Mount {
        let dir = self.c.dir.path().join(name);
        let log = self.c.dir.path().join(format!("sheepfs-{name}.log"));
        let mut cmd = self.net.command(ns, SHEEPFS);
        testkit::auth::with_key(&mut cmd)
            .arg("--cluster")
            .arg(self.c.addresses());
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        let spawn = move |dir: &Path| {
            cmd.arg(dir)
                .arg("--foreground")
                .args(&extra)
                .env("RUST_LOG", "info");
            cmd
        };
        or_panic(Mount::try_spawn(
            "sheepfs",
            spawn,
            &dir,
            &log,
            MountOptions::default(),
        ))
    }

    fn path(&self, name: &str) -> String {
        self.mount
            .as_ref()
            .unwrap()
            .path(name)
            .to_string_lossy()
            .into_owned()
    }

    /// dog in namespace `ns` against `addr`, `data` on its stdin.
    fn dog_in(&self, ns: usize, addr: &str, args: &[&str], data: &[u8]) -> Output {
        let mut cmd = self.net.command(ns, &self.c.bins.dog);
        cmd.env(testkit::auth::KEY_ENV, self.c.key_file())
            .arg("--address")
            .arg(addr)
            .args(args);
        testkit::die_with_parent(&mut cmd, libc::SIGKILL);
        testkit::output_with_stdin(cmd, data)
    }

    /// Restarts node `i` (SIGTERM, or SIGKILL when `hard`, then started again at once on its
    /// data) and waits until all nodes are members and recovered.
    fn restart(&mut self, i: usize, hard: bool) {
        if hard {
            self.c.kill9(i);
        } else if let Some(mut p) = self.c.nodes[i].take() {
            assert!(
                p.terminate(Duration::from_secs(20)),
                "sheep{i} did not stop on SIGTERM"
            );
        }
        self.c.start_node(i);
        self.c.wait_members(self.nodes);
        self.c.wait_recovered();
    }
}

/// fio write-and-verify runs, one after another in the client's namespace, until stopped:
/// every run must end with no error (an EIO fails fio at once). An fsync every 32 writes, as
/// a guest flushes: with the cache too, the load reaches the nodes.
/// Dropped unfinished (the test failed), it stops after the run under way.
struct Load {
    stop: Arc<AtomicBool>,
    runs: Arc<AtomicU64>,
    thread: Option<JoinHandle<Result<u64, String>>>,
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

impl Load {
    fn start(h: &Hosts, file: &str) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let runs = Arc::new(AtomicU64::new(0));
        let wrap = h.net.wrap(h.client());
        let file = file.to_string();
        let (s, r) = (stop.clone(), runs.clone());
        let thread = std::thread::spawn(move || {
            let mut ios = 0;
            while !s.load(Ordering::SeqCst) {
                let mut cmd = Command::new(&wrap[0]);
                cmd.args(&wrap[1..]).arg("fio").args(fio_verify_args(
                    &file,
                    "32M",
                    &["--do_verify=1", "--number_ios=1000", "--fsync=32"],
                ));
                // Killed with this thread (the test gone).
                testkit::die_with_parent(&mut cmd, libc::SIGKILL);
                let out = cmd.output().map_err(|e| format!("run fio: {e}"))?;
                let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
                if !out.status.success() || v["jobs"][0]["error"] != 0 {
                    return Err(format!(
                        "fio run {} failed ({}):\n{}\n{}",
                        r.load(Ordering::SeqCst) + 1,
                        out.status,
                        String::from_utf8_lossy(&out.stdout),
                        String::from_utf8_lossy(&out.stderr)
                    ));
                }
                ios += v["jobs"][0]["read"]["total_ios"].as_u64().unwrap_or(0);
                r.fetch_add(1, Ordering::SeqCst);
            }
            Ok(ios)
        });
        Load {
            stop,
            runs,
            thread: Some(thread),
        }
    }

    fn runs(&self) -> u64 {
        self.runs.load(Ordering::SeqCst)
    }

    /// Waits for `n` more runs to complete (or the load to fail).
    fn wait_runs(&self, n: u64, timeout: Duration) {
        let want = self.runs() + n;
        wait_until(&format!("{n} more fio run(s)"), timeout, || {
            self.runs() >= want || self.thread.as_ref().is_none_or(JoinHandle::is_finished)
        });
    }

    /// Stops after the run under way; the verified reads of every run, or the first failure.
    fn finish(mut self) -> u64 {
        self.stop.store(true, Ordering::SeqCst);
        let thread = self.thread.take().expect("finished once");
        match thread.join().expect("fio thread panicked") {
            Ok(ios) => ios,
            Err(e) => panic!("{e}"),
        }
    }
}

#[test]
fn client_in_another_namespace_mounts_and_verifies() {
    if netns_missing() {
        return;
    }
    let mut h = Hosts::start(3, 1);
    h.c.dog_ok(&["vdi", "create", "d", "16M"]);
    let data = pseudo_random(16 * MIB, 7);
    h.c.write_vdi("d", 0, &data);
    h.mount(&[]);
    let got = std::fs::read(h.path("d")).unwrap();
    assert!(
        got == data,
        "the mount in another namespace reads other bytes"
    );
    h.c.dog_ok(&["vdi", "create", "f", "32M"]);
    let load = Load::start(&h, &h.path("f"));
    load.wait_runs(1, Duration::from_secs(120));
    assert!(load.finish() >= 1000);
    assert_consistent(&h.c, "f");
    // The client really is another host: it reaches node 0 at its address on the bridge, and
    // nothing at that port on its own loopback.
    let out = h.dog_in(h.client(), &h.c.addr(0), &["node", "list"], &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let local = format!("127.0.0.1:{}", h.c.ports[0]);
    let out = h.dog_in(
        h.client(),
        &local,
        &["--timeout", "2s", "node", "list"],
        &[],
    );
    assert!(
        !out.status.success(),
        "a node answered on the client's own loopback"
    );
}

#[test]
fn a_node_cut_off_acknowledges_no_write_and_converges_after_heal() {
    if netns_missing() {
        return;
    }
    let h = Hosts::start(3, 0);
    h.c.dog_ok(&["vdi", "create", "v", "8M"]);
    let d1 = pseudo_random(8 * MIB, 1);
    h.c.write_vdi("v", 0, &d1);
    let cut = 2;
    // A client on the node's host with the VDI open, as a qemu there would have it: it
    // reaches only that node once it is cut off.
    let timeout = format!("{}s", (TTL * 2).as_secs());
    let local = h.mount_in(cut, "mnt-cut", &["--timeout", &timeout]);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(local.path("v"))
        .unwrap();
    let cut_addr = h.c.addr(cut);
    let addr0 = h.c.addr(0);
    let (before, _) = epoch(&h.c, &addr0).unwrap();

    h.net.cut(cut);
    let cut_at = Instant::now();
    // The open file, writing for twice the lease TTL: neither the write nor the fsync after
    // it may succeed.
    let d2 = pseudo_random(4 * MIB, 2);
    {
        use std::os::unix::fs::FileExt;
        let w = file.write_all_at(&d2, 0).and_then(|()| file.sync_all());
        let e = w.expect_err("a write through a node cut off from everyone was acknowledged");
        eprintln!(
            "the cut host's write failed {:?} after the cut: {e}; end of its sheepfs log:\n{}",
            cut_at.elapsed(),
            local.log_tail()
        );
        assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    }
    // dog there, trying for twice the lease TTL (`--force`: past the check for a cache
    // attached to the VDI, which the cut node cannot ask the store about).
    let attempt = h.dog_in(
        cut,
        &cut_addr,
        &["--timeout", &timeout, "vdi", "write", "--force", "v", "0"],
        &d2,
    );
    assert!(
        !attempt.status.success(),
        "a write through a node cut off from everyone was acknowledged after {:?}",
        cut_at.elapsed()
    );
    eprintln!(
        "dog on the cut host failed ({:?} since the cut): {}",
        cut_at.elapsed(),
        String::from_utf8_lossy(&attempt.stderr).trim()
    );
    // The majority dropped it.
    wait_until("an epoch without the cut node", TTL * 4, || {
        epoch(&h.c, &addr0).is_some_and(|(e, n)| e > before && n == 2)
    });
    // Past its lease, still nothing is acknowledged there (it answers Busy, or not at all).
    let late = h.dog_in(
        cut,
        &cut_addr,
        &["--timeout", "3s", "vdi", "write", "--force", "v", "0"],
        &d2,
    );
    assert!(
        !late.status.success(),
        "the cut node acknowledged a write past its lease"
    );
    eprintln!(
        "past its lease, the cut node's write failed: {}",
        String::from_utf8_lossy(&late.stderr).trim()
    );
    // The majority writes over the region the cut node was asked to write.
    let d3 = pseudo_random(4 * MIB, 3);
    h.c.write_vdi("v", 0, &d3);

    h.net.heal(cut);
    h.c.wait_members(3);
    h.c.wait_recovered();
    for i in 0..3 {
        let got = h.c.dog_at(
            &h.c.addr(i),
            &["vdi", "read", "v", "0", &(8 * MIB).to_string()],
        );
        assert!(got.status.success(), "read through node {i}");
        assert!(
            got.stdout[..4 * MIB] == d3[..],
            "node {i}: the majority's write is lost"
        );
        assert!(
            got.stdout[4 * MIB..] == d1[4 * MIB..],
            "node {i}: data before the cut"
        );
    }
    assert_consistent(&h.c, "v");
    // The cut host's client, connected again, reads what the majority wrote.
    let mut got = vec![0u8; 8 * MIB];
    {
        use std::os::unix::fs::FileExt;
        file.read_exact_at(&mut got, 0).unwrap();
    }
    assert!(
        got[..4 * MIB] == d3[..],
        "the cut host's client reads stale data"
    );
    drop(file);
    drop(local);
}

/// A node cut off while a client elsewhere runs fio verify on the mount: its I/O pauses until
/// the others drop the node, then goes on; healed, the node joins again and recovers; no error.
#[test]
fn a_node_cut_off_under_fio_verify_costs_a_pause_and_no_error() {
    if netns_missing() {
        return;
    }
    let mut h = Hosts::start(3, 1);
    h.c.dog_ok(&["vdi", "create", "f", "32M"]);
    h.mount(&[]);
    let load = Load::start(&h, &h.path("f"));
    load.wait_runs(1, Duration::from_secs(120));
    let addr0 = h.c.addr(0);
    let (before, _) = epoch(&h.c, &addr0).unwrap();
    h.net.cut(1);
    let t = Instant::now();
    wait_until("an epoch without the cut node", TTL * 4, || {
        epoch(&h.c, &addr0).is_some_and(|(e, n)| e > before && n == 2)
    });
    eprintln!("the cut node left the view {:?} after the cut", t.elapsed());
    load.wait_runs(1, Duration::from_secs(120));
    eprintln!("a fio run completed {:?} after the cut", t.elapsed());
    h.net.heal(1);
    let t = Instant::now();
    h.c.wait_members(3);
    eprintln!(
        "the healed node was back in the view {:?} after the heal",
        t.elapsed()
    );
    h.c.wait_recovered();
    load.wait_runs(1, Duration::from_secs(120));
    let ios = load.finish();
    eprintln!("a node cut off and healed: {ios} verified reads, no error");
    assert_consistent(&h.c, "f");
}

fn rolling_restart(hard: bool, extra: &[&str]) {
    let mut h = Hosts::start(3, 1);
    h.c.dog_ok(&["vdi", "create", "f", "32M"]);
    h.mount(extra);
    let load = Load::start(&h, &h.path("f"));
    load.wait_runs(1, Duration::from_secs(120));
    for i in 0..3 {
        let t = Instant::now();
        h.restart(i, hard);
        eprintln!("node {i} restarted and recovered in {:?}", t.elapsed());
        // The load went on across it.
        load.wait_runs(1, Duration::from_secs(120));
    }
    let ios = load.finish();
    eprintln!("rolling restart: {ios} verified reads, no error");
    assert_consistent(&h.c, "f");
}

#[test]
fn rolling_restart_under_fio_verify() {
    if netns_missing() {
        return;
    }
    rolling_restart(false, &[]);
}

/// Each node killed with SIGKILL and started again at once, before its old lease ends (its
/// new lease takes its key over).
#[test]
fn rolling_kill9_restart_under_fio_verify() {
    if netns_missing() {
        return;
    }
    rolling_restart(true, &[]);
}

#[test]
fn rolling_restart_under_fio_verify_with_the_cache() {
    if netns_missing() {
        return;
    }
    let cache = tempfile::tempdir().unwrap();
    let dir = cache.path().to_string_lossy().into_owned();
    rolling_restart(false, &["--cache-dir", &dir, "--cache-size", "64M"]);
}

#[test]
fn etcd_restarted_under_load_within_and_past_the_lease_ttl() {
    if netns_missing() {
        return;
    }
    let mut h = Hosts::start(3, 1);
    h.c.dog_ok(&["vdi", "create", "f", "32M"]);
    h.c.dog_ok(&["vdi", "create", "w", "4M"]);
    h.mount(&[]);
    let load = Load::start(&h, &h.path("f"));
    load.wait_runs(1, Duration::from_secs(120));
    let addr0 = h.c.addr(0);
    let (e0, _) = epoch(&h.c, &addr0).unwrap();

    // Within the TTL: stopped and started again at once.
    let t = Instant::now();
    h.etcd.stop(0);
    h.etcd.start_member(0);
    eprintln!("etcd down for {:?} (within the lease TTL)", t.elapsed());
    load.wait_runs(1, Duration::from_secs(120));
    let (e1, n1) = epoch(&h.c, &addr0).unwrap();
    assert_eq!(
        (e1, n1),
        (e0, 3),
        "a node lost its lease to an etcd restart within the TTL"
    );

    // Past the TTL: the nodes' leases run out, their I/O waits; back in time for the client.
    // A write issued once every lease has ended (as a guest's, on a file it holds open) is
    // acknowledged only after etcd is back.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(h.path("w"))
        .unwrap();
    let block = pseudo_random(64 << 10, 9);
    let t = Instant::now();
    h.etcd.stop(0);
    let runs = load.runs();
    std::thread::sleep(TTL + Duration::from_millis(500)); // the outage itself, not a wait
    let writer = {
        let block = block.clone();
        std::thread::spawn(move || {
            use std::os::unix::fs::FileExt;
            let r = file.write_all_at(&block, 0).and_then(|()| file.sync_all());
            (r, Instant::now())
        })
    };
    std::thread::sleep(Duration::from_millis(2500)); // the outage itself, not a wait
    let stalled = load.runs() - runs;
    let restarting = Instant::now();
    h.etcd.start_member(0);
    let back = Instant::now();
    eprintln!(
        "etcd down for {:?} (past the lease TTL): {stalled} fio run(s) completed meanwhile",
        t.elapsed()
    );
    let (written, done) = writer.join().unwrap();
    written
        .expect("a write during etcd's outage failed (etcd came back within the client's timeout)");
    assert!(
        done > restarting,
        "a write issued past every node's lease was acknowledged {:?} before etcd came back",
        restarting - done
    );
    eprintln!(
        "the write issued during the outage was acknowledged {:?} after etcd was back",
        done.saturating_duration_since(back)
    );
    let got =
        h.c.dog_ok(&["vdi", "read", "w", "0", &block.len().to_string()]);
    assert!(
        got == block,
        "the write made during the outage reads back otherwise"
    );
    load.wait_runs(1, Duration::from_secs(120));
    eprintln!(
        "a fio run completed {:?} after etcd was back",
        back.elapsed()
    );
    load.wait_runs(1, Duration::from_secs(120));
    h.c.wait_members(3);
    h.c.wait_recovered();
    let ios = load.finish();
    eprintln!("etcd restarts: {ios} verified reads, no error");
    assert_consistent(&h.c, "f");
}
