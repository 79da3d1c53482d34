//! The node's caps, end to end on a real `sheep` over TCP: thousands of idle connections and a
//! pipelined flood of large reads leave its memory bounded and its other clients served; past
//! `--max-connections` a connection is refused with a clear error.
//!
//! Bounds on the node's resident memory (VmRSS), and why:
//! - idle connections: each unauthenticated connection holds a socket, a small task and the
//!   handshake's 48-byte header buffer, never the 256 KiB buffers of an authenticated one, and
//!   is closed at the handshake deadline (5 s by default; 40 s here, so that all are open at
//!   once). [`IDLE_BOUND`] allows 12 KiB for each of
//!   5,000 (about 60 MiB), several times what they cost.
//! - a flood of reads: a connection has at most `--max-inflight` bytes (64 MiB by default) of
//!   requests and read answers in flight; a node whose reader stops taking answers holds at
//!   most that much for it. [`FLOOD_BOUND`] is three times that budget: the budget, the other
//!   client's reads meanwhile, and what the allocator keeps of freed 4 MiB buffers (measured:
//!   about +120 MiB); without the cap 2,000 reads of 4 MiB would hold up to 8 GiB.

mod common;

use std::io::Read;
use std::net::TcpStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use objstore_client::transport::{Tcp, Transport};
use objstore_proto::auth::KeyFile;
use objstore_proto::frame::{write_frame, Header, Opcode};
use testkit::cluster::Cluster;
use testkit::wait_until;
use tokio::io::AsyncWriteExt;

const IDLE: usize = 5000;
const IDLE_BOUND: u64 = 60 << 20;
const FLOOD_READS: usize = 2000;
const FLOOD_BOUND: u64 = 3 * (64 << 20);

fn rss(pid: u32) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = s.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    let kib: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kib << 10
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// The node's open descriptors once they stopped changing for a second: the connections of
/// the commands before (a `dog` that just exited) are closed, so they neither count in a
/// baseline nor hold a place under a connection cap.
fn settled_fds(pid: u32) -> usize {
    let mut last = open_fds(pid);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        std::thread::sleep(Duration::from_secs(1));
        let now = open_fds(pid);
        if now == last || Instant::now() > deadline {
            return now;
        }
        last = now;
    }
}

fn pid(c: &Cluster) -> u32 {
    c.nodes[0].as_ref().unwrap().pid()
}

/// One node holding VDI `v` with `data` at its start.
fn one_node(extra: &[&str], data: &[u8]) -> Cluster {
    let args = vec![extra.iter().map(|s| s.to_string()).collect()];
    let c = Cluster::start_with_args(&bins(), args);
    c.dog_ok(&["cluster", "format", "--copies", "1", "--object-size", "4M"]);
    c.dog_ok(&["vdi", "create", "v", "64M"]);
    c.write_vdi("v", 0, data);
    c
}

fn pattern(len: u64) -> Vec<u8> {
    (0..len).map(|i| (i % 253) as u8).collect()
}

#[test]
fn thousands_of_idle_connections_cost_little_and_others_are_served() {
    objstore_proto::rlimit::raise_open_files().unwrap();
    let data = pattern(4 * MIB);
    // A long deadline, so that all of them are open at once.
    let c = one_node(&["--handshake-timeout", "40s"], &data);
    let p = pid(&c);
    let fds = settled_fds(p);
    let before = rss(p);
    let addr = c.addr(0);
    let idle: Vec<TcpStream> = (0..IDLE)
        .map(|i| {
            TcpStream::connect(&addr).unwrap_or_else(|e| panic!("connection {i} of {IDLE}: {e}"))
        })
        .collect();
    wait_until(
        "the node to hold every idle connection",
        Duration::from_secs(30),
        || open_fds(p) >= fds + IDLE,
    );
    let held = rss(p);
    // Served meanwhile.
    assert_eq!(c.read_vdi("v", 0, 4 * MIB), data);
    let grown = held.saturating_sub(before);
    eprintln!(
        "{IDLE} idle connections: node RSS {} -> {} KiB (+{} KiB, {} B each)",
        before >> 10,
        held >> 10,
        grown >> 10,
        grown / IDLE as u64
    );
    assert!(grown < IDLE_BOUND, "node RSS grew by {grown} bytes");
    // None of them proved anything: the handshake deadline closes them all.
    wait_until(
        "the idle connections to be closed",
        Duration::from_secs(60),
        || open_fds(p) < fds + 10,
    );
    for mut s in idle.into_iter().step_by(97) {
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut b = [0u8; 1];
        assert!(matches!(s.read(&mut b), Ok(0) | Err(_)), "still open");
    }
    assert_eq!(c.read_vdi("v", 0, 4 * MIB), data);
}

#[test]
fn past_the_connection_cap_a_client_is_refused_with_a_clear_error() {
    let data = pattern(MIB);
    // A handshake deadline well past the wait below, so that a loaded machine does not see
    // the idle connections closed before it counted them.
    let c = one_node(
        &["--max-connections", "20", "--handshake-timeout", "20s"],
        &data,
    );
    let addr = c.addr(0);
    let p = pid(&c);
    let fds = settled_fds(p);
    let idle: Vec<TcpStream> = (0..20)
        .map(|_| TcpStream::connect(&addr).unwrap())
        .collect();
    wait_until(
        "the node to hold the idle connections",
        Duration::from_secs(15),
        || open_fds(p) >= fds + 20,
    );
    let out = c.dog(&["vdi", "list"]);
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(
        e.contains(&format!("node {addr} refused the connection"))
            && e.contains("limit of 20 open connections")
            && e.contains("--max-connections"),
        "{e}"
    );
    // The idle ones never prove anything; once the handshake deadline closes them, the
    // node serves again.
    wait_until("the node to serve again", Duration::from_secs(60), || {
        c.dog(&["vdi", "list"]).status.success()
    });
    drop(idle);
    assert_eq!(c.read_vdi("v", 0, MIB), data);
}

#[test]
fn a_pipelined_flood_of_large_reads_holds_bounded_memory() {
    let data = pattern(4 * MIB);
    let c = one_node(&[], &data);
    let p = pid(&c);
    let info = c.dog_json(&["cluster", "info"]);
    let epoch = info["epoch"].as_u64().unwrap() as u32;
    let obj = c.dog_json(&["vdi", "object", "v", "0"]);
    let oid = u64::from_str_radix(obj["oid"].as_str().unwrap(), 16).unwrap();
    let addr = c.addr(0).parse().unwrap();
    let before = rss(p);
    let rt = tokio::runtime::Runtime::new().unwrap();
    // An authenticated connection that asks for 2,000 whole objects and never reads an answer.
    let (_rd, _wr) = rt.block_on(async {
        let key = Arc::new(KeyFile::new(testkit::auth::key_file()));
        let (rd, mut wr) = Tcp::with_key(Some(key)).connect(addr).await.unwrap();
        let mut h = Header::request(Opcode::ReadObj, 0, epoch);
        h.oid = oid;
        h.length = (4 * MIB) as u32;
        for i in 0..FLOOD_READS {
            h.req_id = i as u64 + 1;
            write_frame(&mut wr, &h, &[]).await.unwrap();
        }
        wr.flush().await.unwrap();
        (rd, wr)
    });
    // Watch the node for a while: its memory stays within the budget, and another client is
    // served meanwhile.
    let mut peak = 0;
    let start = Instant::now();
    let mut served = 0;
    while start.elapsed() < Duration::from_secs(8) {
        peak = peak.max(rss(p));
        assert_eq!(c.read_vdi("v", 0, 4 * MIB), data, "another client's read");
        served += 1;
        peak = peak.max(rss(p));
    }
    let grown = peak.saturating_sub(before);
    eprintln!(
        "{FLOOD_READS} pipelined 4 MiB reads never read: node RSS {} KiB -> peak {} KiB (+{} KiB); {served} reads by another client meanwhile",
        before >> 10,
        peak >> 10,
        grown >> 10
    );
    assert!(grown < FLOOD_BOUND, "node RSS grew by {grown} bytes");
}
