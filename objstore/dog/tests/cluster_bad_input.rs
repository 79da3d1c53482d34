//! Bad input against real nodes: malformed frames, bad names and sizes, out-of-range I/O,
//! formatting twice, an unformatted cluster. Each gets a clear error; nodes keep serving.

use std::io::{Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use testkit::cluster::{Bins, Cluster};
use testkit::replicas;

fn bins() -> Bins {
    Bins::fresh()
}
use objstore_proto::frame::{
    Header, Opcode, CLIENT_VERSION, HEADER_LEN, MAX_PAYLOAD, PEER_VERSION,
};

fn valid_header() -> [u8; HEADER_LEN] {
    Header::request(Opcode::ClusterInfo, 1, 0).encode()
}

/// Sends `bytes` on a connection that passed the key's handshake (then half-closes if
/// `shutdown`) and checks the node closes the connection without answering.
fn send_bad(addr: &str, bytes: &[u8], shutdown: bool) {
    let mut s = testkit::auth::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(bytes).expect("send");
    if shutdown {
        s.shutdown(std::net::Shutdown::Write).unwrap();
    }
    let mut buf = Vec::new();
    match s.read_to_end(&mut buf) {
        Ok(_) => assert!(buf.is_empty(), "node answered a malformed frame: {buf:?}"),
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}"),
    }
}

#[test]
fn malformed_frames_close_only_their_connection() {
    let c = Cluster::start(&bins(), 1);
    c.dog_ok(&["cluster", "format", "--copies", "1"]);
    c.dog_ok(&["vdi", "create", "v", "4M"]);
    c.write_vdi("v", 0, b"still here");
    let addr = c.addr(0);

    // A healthy connection opened before the attacks must keep working after them.
    let mut keep = testkit::auth::connect(&addr).unwrap();

    let mut bad_magic = valid_header();
    bad_magic[0] = 0xde;
    let mut bad_opcode = valid_header();
    bad_opcode[3] = 0x7f;
    let mut bad_client_version = valid_header();
    bad_client_version[2] = 9;
    let mut bad_peer_version = Header::request(Opcode::PeerList, 1, 0).encode();
    bad_peer_version[2] = PEER_VERSION + 1;
    let mut too_long = valid_header();
    too_long[12..16].copy_from_slice(&(MAX_PAYLOAD + 1).to_be_bytes());
    let mut short_payload = Header::request(Opcode::KvGet, 1, 0);
    short_payload.payload_len = 100;
    let mut truncated_payload = short_payload.encode().to_vec();
    truncated_payload.extend_from_slice(b"only ten b");
    let garbage = testkit::pseudo_random(4096, 99);

    let garbage_magic = u16::from_be_bytes([garbage[0], garbage[1]]);
    assert_ne!(garbage_magic, objstore_proto::frame::MAGIC);
    // What each case must make the node log: the precise reason, on its "closing" line.
    let cases: Vec<(&str, Vec<u8>, bool, String)> = vec![
        (
            "bad magic",
            bad_magic.to_vec(),
            false,
            "bad magic 0xde48 (expected 0x5348)".into(),
        ),
        (
            "unknown opcode",
            bad_opcode.to_vec(),
            false,
            "unknown opcode 0x7f".into(),
        ),
        (
            "bad client version",
            bad_client_version.to_vec(),
            false,
            format!("protocol version 9 for opcode ClusterInfo, expected {CLIENT_VERSION}"),
        ),
        (
            "bad peer version",
            bad_peer_version.to_vec(),
            false,
            format!(
                "protocol version {} for opcode PeerList, expected {PEER_VERSION}",
                PEER_VERSION + 1
            ),
        ),
        (
            "length over limit",
            too_long.to_vec(),
            false,
            format!(
                "payload of {} bytes is over the limit of {MAX_PAYLOAD}",
                MAX_PAYLOAD + 1
            ),
        ),
        (
            "truncated header",
            valid_header()[..20].to_vec(),
            true,
            "frame truncated: connection closed after 20 bytes of it".into(),
        ),
        (
            "truncated payload",
            truncated_payload,
            true,
            format!(
                "frame truncated: connection closed after {} bytes of it",
                HEADER_LEN + 10
            ),
        ),
        (
            "garbage",
            garbage,
            false,
            format!("bad magic {garbage_magic:#06x}"),
        ),
    ];
    for (what, bytes, shutdown, logged) in cases {
        // The log is cumulative: only what this case adds counts.
        let mark = replicas::log_mark(&c, 0);
        send_bad(&addr, &bytes, shutdown);
        // The node logged why and still serves everyone.
        testkit::wait_until(
            &format!("log line for {what}: {logged:?}"),
            Duration::from_secs(5),
            || {
                replicas::log_since(&c, 0, mark)
                    .lines()
                    .any(|l| l.contains("closing connection from") && l.contains(&logged))
            },
        );
        assert_eq!(c.read_vdi("v", 0, 10), b"still here", "after {what}");
    }

    let h = Header::request(Opcode::ClusterInfo, 7, 0).encode();
    keep.write_all(&h).unwrap();
    let mut resp = [0u8; HEADER_LEN];
    keep.read_exact(&mut resp).unwrap();
    let rh = Header::decode(&resp).unwrap();
    assert!(rh.is_response());
    assert_eq!(rh.req_id, 7);
}

#[test]
fn bad_names_sizes_ranges_and_formats() {
    let c = Cluster::start(&bins(), 2);

    // Unformatted cluster.
    let e = c.dog_err(&["vdi", "create", "x", "1G"]);
    assert!(e.contains("not formatted"), "{e}");
    assert_eq!(c.dog_json(&["cluster", "info"])["status"], "unformatted");

    // Bad formats, then format twice.
    let e = c.dog_err(&["cluster", "format", "--copies", "0"]);
    assert!(e.contains("copies"), "{e}");
    let e = c.dog_err(&["cluster", "format", "--copies", "2", "--object-size", "3M"]);
    assert!(e.contains("power of two"), "{e}");
    let e = c.dog_err(&[
        "cluster",
        "format",
        "--copies",
        "2",
        "--object-size",
        "banana",
    ]);
    assert!(e.contains("banana"), "{e}");
    c.dog_ok(&["cluster", "format", "--copies", "2"]);
    let e = c.dog_err(&["cluster", "format", "--copies", "2"]);
    assert!(e.contains("already formatted"), "{e}");

    // Names.
    c.dog_ok(&["vdi", "create", "ok", "8M"]);
    let long = "n".repeat(256);
    for (name, why) in [
        ("", "empty"),
        ("a/b", "'/'"),
        ("a@b", "'@'"),
        (long.as_str(), "255"),
        ("..", "not names"),
    ] {
        let e = c.dog_err(&["vdi", "create", name, "1G"]);
        assert!(e.contains(why), "name {name:?}: {e}");
    }
    let e = c.dog_err(&["vdi", "create", "ok", "1G"]);
    assert!(e.contains("already exists"), "{e}");
    let longest = "m".repeat(255);
    c.dog_ok(&["vdi", "create", &longest, "1M"]);
    assert_eq!(
        c.dog_json(&["vdi", "info", &longest])["name"],
        longest.as_str()
    );
    let e = c.dog_err(&["vdi", "info", "missing"]);
    assert!(e.contains("no VDI named 'missing'"), "{e}");

    // Sizes.
    let e = c.dog_err(&["vdi", "create", "s", "10X"]);
    assert!(e.contains("10X"), "{e}");
    let e = c.dog_err(&["vdi", "create", "s", "-1"]);
    assert!(e.contains("-1"), "{e}");
    let e = c.dog_err(&["vdi", "create", "s", "100P"]);
    assert!(e.contains("over the limit"), "{e}");
    c.dog_ok(&["vdi", "create", "huge", "4T"]);
    assert_eq!(c.dog_json(&["vdi", "info", "huge"])["size"], 4u64 << 40);
    assert_eq!(
        c.read_vdi("huge", (4u64 << 40) - 4096, 4096),
        vec![0u8; 4096]
    );
    c.write_vdi("huge", (4u64 << 40) - 5, b"tail!");
    assert_eq!(c.read_vdi("huge", (4u64 << 40) - 5, 5), b"tail!");
    let e = c.dog_err(&["vdi", "resize", "ok", "4M"]);
    assert!(e.contains("shrinking"), "{e}");

    // Out of range.
    let e = c.dog_err(&["vdi", "read", "ok", "8M", "1"]);
    assert!(e.contains("past the end"), "{e}");
    let out = c.dog_stdin(&["vdi", "write", "ok", &((8 << 20) - 1).to_string()], b"xy");
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("past the end"), "{e}");
    let e = c.dog_err(&["vdi", "object", "ok", "99"]);
    assert!(e.contains("past the end"), "{e}");

    // Bad addresses.
    let out = c.dog_at("127.0.0.1:1", &["cluster", "info"]);
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("127.0.0.1:1"), "{e}");
    let out = c.dog_at("nonsense", &["cluster", "info"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("nonsense"));

    // A reader that goes away (`dog ... | head -1`) ends dog quietly, as it ends cat: killed by
    // SIGPIPE at its first write, nothing on stderr, no panic.
    for args in [
        &["vdi", "list"][..],
        &["cluster", "info", "--json"],
        &["vdi", "read", "ok"],
    ] {
        let mut child = c
            .dog_command(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run dog");
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(
            !e.contains("panicked"),
            "dog {args:?} into a closed pipe: {e}"
        );
        assert_eq!(
            out.status.signal(),
            Some(libc::SIGPIPE),
            "dog {args:?} into a closed pipe: {}, stderr {e:?}",
            out.status
        );
        assert!(e.is_empty(), "dog {args:?} into a closed pipe: {e}");
    }

    // The nodes still serve.
    c.dog_ok(&["node", "list"]);
}

#[test]
fn foreign_data_dir_is_refused() {
    let a = Cluster::start(&bins(), 1);
    let b = Cluster::start(&bins(), 1);
    // Start a node of cluster B on node 0's directory of cluster A... after stopping A's node.
    let mut a = a;
    a.kill9(0);
    let mut cmd = std::process::Command::new(Bins::fresh().sheep);
    let out = testkit::auth::with_key(&mut cmd)
        .arg("--dir")
        .arg(a.node_dir(0))
        .arg("--listen")
        .arg(format!("127.0.0.1:{}", testkit::free_port()))
        .arg("--cluster")
        .arg(format!("local:{}", b.state_dir().display()))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("belongs to cluster"), "{e}");
}
