//! The cluster key, end to end on real `sheep` processes over TCP: connections without the key
//! (raw sockets sending valid client and peer frames) change and read nothing and are closed;
//! a wrong key is refused with a clear error; a key rotation serves throughout; the data and
//! state directories are owner-only.

mod common;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use objstore_proto::api::{FormatRequest, KvCasRequest, LeaseGrantRequest};
use objstore_proto::frame::{Header, Opcode, ResultCode, HEADER_LEN};
use testkit::cluster::{Cluster, ClusterOptions};

/// Files by relative path, with their contents.
type Files = BTreeMap<PathBuf, Vec<u8>>;

/// Every file under `dir`, for before/after comparisons.
fn files(dir: &Path) -> Files {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if let Ok(data) = std::fs::read(&p) {
                out.insert(p.strip_prefix(dir).unwrap().to_path_buf(), data);
            }
        }
    }
    out
}

/// The objects of every node (the `obj` directories) and the cluster's key-value store (the
/// local driver's `kv` directory: the VDI table, the id counter, the format).
fn snapshot(c: &Cluster) -> (Vec<Files>, Files) {
    let objs = (0..c.nodes.len())
        .map(|i| files(&c.node_dir(i).join("obj")))
        .collect();
    (objs, files(&c.state_dir().join("kv")))
}

fn frame(op: Opcode, epoch: u32, oid: u64, offset: u64, length: u32, payload: &[u8]) -> Vec<u8> {
    let mut h = Header::request(op, 7, epoch);
    h.oid = oid;
    h.offset = offset;
    h.length = length;
    h.payload_len = payload.len() as u32;
    let mut b = h.encode().to_vec();
    b.extend_from_slice(payload);
    b
}

/// What a connection answered before the node closed it.
fn everything_answered(mut s: TcpStream) -> Vec<u8> {
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut got = Vec::new();
    match s.read_to_end(&mut got) {
        Ok(_) => {}
        // A reset after the answer: the answer is what counts.
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        Err(e) => panic!("the node neither answered nor closed the connection: {e}"),
    }
    got
}

/// `bytes` is exactly one `Unauthenticated` answer and nothing else (no object data).
fn one_refusal(bytes: &[u8], what: &str) -> String {
    assert!(bytes.len() >= HEADER_LEN, "{what}: no answer at all");
    let h = Header::decode(bytes[..HEADER_LEN].try_into().unwrap()).unwrap();
    assert!(h.is_response(), "{what}");
    assert_eq!(
        h.result_code(),
        ResultCode::Unauthenticated,
        "{what}: answered {:?}",
        h.result_code()
    );
    assert_eq!(
        bytes.len(),
        HEADER_LEN + h.payload_len as usize,
        "{what}: more than one answer"
    );
    String::from_utf8(bytes[HEADER_LEN..].to_vec()).unwrap()
}

#[test]
fn connections_without_the_key_read_and_change_nothing() {
    let c = Cluster::start(&bins(), 3);
    c.dog_ok(&["cluster", "format", "--copies", "3", "--object-size", "1M"]);
    c.dog_ok(&["vdi", "create", "secret", "8M"]);
    let data: Vec<u8> = (0..2 * MIB).map(|i| (i * 7 % 251) as u8).collect();
    c.write_vdi("secret", 0, &data);
    let info = c.dog_json(&["cluster", "info"]);
    let epoch = info["epoch"].as_u64().unwrap() as u32;
    let obj = c.dog_json(&["vdi", "object", "secret", "0"]);
    let oid = u64::from_str_radix(obj["oid"].as_str().unwrap(), 16).unwrap();
    let inode = oid >> 32 << 32 | 1 << 63;
    let before = snapshot(&c);
    assert!(
        before.0.iter().all(|o| !o.is_empty()),
        "every node holds objects"
    );
    assert!(!before.1.is_empty(), "the VDI table is in the kv store");

    let mut version_and_data = 0u64.to_be_bytes().to_vec();
    version_and_data.extend_from_slice(&[0xee; 4096]);
    // A COW into another VDI's object of the same index, copying the secret one.
    let mut cow = [0u64.to_be_bytes(), oid.to_be_bytes()].concat();
    cow.extend_from_slice(&[0xee; 4096]);
    let requests: Vec<(&str, Vec<u8>)> = vec![
        (
            "ReadObj",
            frame(Opcode::ReadObj, epoch, oid, 0, 1 << 20, &[]),
        ),
        (
            "ReadObj of the inode",
            frame(Opcode::ReadObj, epoch, inode, 0, 4096, &[]),
        ),
        (
            "WriteObj",
            frame(Opcode::WriteObj, epoch, oid, 0, 4096, &version_and_data),
        ),
        (
            "CowWrite",
            frame(Opcode::CowWrite, epoch, oid ^ 1 << 32, 0, 4096, &cow),
        ),
        (
            "RemoveObj",
            frame(Opcode::RemoveObj, epoch, oid, 0, 0, &0u64.to_be_bytes()),
        ),
        ("Flush", frame(Opcode::Flush, epoch, 0, 0, 0, &[])),
        ("ClusterInfo", frame(Opcode::ClusterInfo, 0, 0, 0, 0, &[])),
        ("KvList", frame(Opcode::KvList, 0, 0, 0, 0, b"")),
        ("KvGet", frame(Opcode::KvGet, 0, 0, 0, 0, b"vdi/secret")),
        (
            "KvCas resetting the VDI id counter",
            frame(
                Opcode::KvCas,
                0,
                0,
                0,
                0,
                &body(&KvCasRequest {
                    key: objstore_proto::keys::NEXT_VID.into(),
                    expected: None,
                    new: Some("1".into()),
                }),
            ),
        ),
        (
            "Format",
            frame(
                Opcode::Format,
                0,
                0,
                0,
                0,
                &body(&FormatRequest {
                    copies: 1,
                    min_copies: None,
                    object_size: 1 << 20,
                    vdi_redundancy: None,
                }),
            ),
        ),
        (
            "LeaseGrant",
            frame(
                Opcode::LeaseGrant,
                0,
                0,
                0,
                0,
                &body(&LeaseGrantRequest { ttl_secs: 60 }),
            ),
        ),
        ("PeerList", frame(Opcode::PeerList, epoch, 0, 0, 0, &[])),
        ("PeerRead", frame(Opcode::PeerRead, epoch, oid, 0, 0, &[])),
        (
            "PeerPut",
            frame(Opcode::PeerPut, epoch, oid, 99, 0, &[0xdd; 1 << 20]),
        ),
        ("PeerWrite", {
            let mut p = 1u64.to_be_bytes().to_vec();
            p.extend_from_slice(&99u64.to_be_bytes());
            p.extend_from_slice(&[0xcc; 4096]);
            frame(Opcode::PeerWrite, epoch, oid, 0, 4096, &p)
        }),
        ("PeerStatus", frame(Opcode::PeerStatus, epoch, 0, 0, 0, &[])),
        (
            "a handshake proof without its hello",
            frame(Opcode::AuthProof, 0, 0, 0, 0, &[0; 32]),
        ),
    ];
    for i in 0..3 {
        let addr = c.addr(i);
        for (what, bytes) in &requests {
            let mut s = TcpStream::connect(&addr).unwrap();
            s.write_all(bytes).unwrap();
            let why = one_refusal(&everything_answered(s), what);
            assert!(why.contains("cluster key"), "{what}: {why}");
        }
        // All of them pipelined on one connection: the first is refused, the rest never read.
        let mut s = TcpStream::connect(&addr).unwrap();
        let all: Vec<u8> = requests.iter().flat_map(|(_, b)| b.clone()).collect();
        // The node may close before taking all of it: a failed write is fine.
        let _ = s.write_all(&all);
        one_refusal(&everything_answered(s), "pipelined requests");
        // A hello with the right shape, then a guessed proof: refused too.
        let mut s = TcpStream::connect(&addr).unwrap();
        s.write_all(&frame(Opcode::AuthHello, 0, 0, 0, 0, &[1; 32]))
            .unwrap();
        let mut ok = [0u8; HEADER_LEN + 64];
        s.read_exact(&mut ok).unwrap();
        let h = Header::decode(ok[..HEADER_LEN].try_into().unwrap()).unwrap();
        assert_eq!(
            h.result_code(),
            ResultCode::Ok,
            "the node's half of the hello"
        );
        s.write_all(&frame(Opcode::AuthProof, 0, 0, 0, 0, &[2; 32]))
            .unwrap();
        let why = one_refusal(&everything_answered(s), "a guessed proof");
        assert!(why.contains("matches none of the node's keys"), "{why}");
        // Then a request on the refused connection is never read: it is closed.
    }
    assert!(before == snapshot(&c), "objects or the kv store changed");
    // And the cluster still serves the holder of the key.
    assert_eq!(c.read_vdi("secret", 0, 2 * MIB), data);
}

/// The stderr of a command that must have failed.
fn failed(out: &std::process::Output) -> String {
    let e = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "should have failed: {e}");
    e
}

/// A JSON body, as the wire carries it.
fn body<T: serde::Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).unwrap()
}

#[test]
fn a_wrong_key_or_none_is_refused_with_a_clear_error() {
    let c = Cluster::start(&bins(), 1);
    c.dog_ok(&["cluster", "format", "--copies", "1"]);
    let dir = tempfile::tempdir().unwrap();
    let wrong = dir.path().join("wrong.key");
    c.dog_ok(&["cluster", "key", "new", wrong.to_str().unwrap()]);
    let mode = std::fs::metadata(&wrong).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "a new key file is owner-only");
    let out = c.dog(&["--key-file", wrong.to_str().unwrap(), "vdi", "list"]);
    let e = failed(&out);
    assert!(
        e.contains(&format!(
            "node {} did not prove it holds the cluster key",
            c.addr(0)
        )),
        "{e}"
    );
    let out = c
        .dog_command(&["vdi", "list"])
        .env_remove("SHEEP_KEY_FILE")
        .output()
        .unwrap();
    let e = failed(&out);
    assert!(
        e.contains(&format!("node {} refused the cluster key", c.addr(0)))
            && e.contains("--key-file"),
        "{e}"
    );
    // A key file others can read is refused by the side that holds it.
    let loose = dir.path().join("loose.key");
    std::fs::copy(testkit::auth::key_file(), &loose).unwrap();
    std::fs::set_permissions(&loose, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = c.dog(&["--key-file", loose.to_str().unwrap(), "vdi", "list"]);
    let e = failed(&out);
    assert!(e.contains("chmod 600"), "{e}");
    // A node needs a key, or an explicit --no-auth.
    let out = std::process::Command::new(bins().sheep)
        .args(["--dir", dir.path().join("n").to_str().unwrap()])
        .args(["--listen", &format!("127.0.0.1:{}", testkit::free_port())])
        .args([
            "--cluster",
            &format!("local:{}", dir.path().join("s").display()),
        ])
        .env_remove("SHEEP_KEY_FILE")
        .output()
        .unwrap();
    let e = failed(&out);
    assert!(
        e.contains("no cluster key") && e.contains("--no-auth"),
        "{e}"
    );
}

/// Writes `text` to `path` as an operator should: a new file renamed over the old one.
fn replace(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .unwrap();
    f.write_all(text.as_bytes()).unwrap();
    drop(f);
    std::fs::rename(&tmp, path).unwrap();
}

use std::os::unix::fs::OpenOptionsExt;

fn new_key() -> String {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("k");
    testkit::auth::write_new_key(&p).unwrap();
    std::fs::read_to_string(p).unwrap().trim().to_string()
}

/// The rotation of docs/operations.md, on three nodes that each hold their own copy of the key
/// file (as on three hosts): add the new key second everywhere, put it first everywhere, drop
/// the old one. After every single file changes, a client with either file state is served,
/// and writes (forwarded node to node) land on every copy; a node restarted at the end
/// reconnects to its peers with the new key only.
#[test]
fn a_cluster_keeps_serving_through_a_key_rotation() {
    let dir = tempfile::tempdir().unwrap();
    let (old, new) = (new_key(), new_key());
    let node_key = |i: usize| dir.path().join(format!("node{i}.key"));
    for i in 0..3 {
        replace(&node_key(i), &format!("{old}\n"));
    }
    let args = (0..3)
        .map(|i| vec!["--key-file".to_string(), node_key(i).display().to_string()])
        .collect();
    let client_key = dir.path().join("client.key");
    replace(&client_key, &format!("{old}\n"));
    // The cluster's own dogs (readiness, membership waits) use the client's file.
    let opts = ClusterOptions {
        key_file: Some(client_key.clone()),
        ..ClusterOptions::default()
    };
    let mut c = testkit::or_panic(Cluster::try_start_with_args(&bins(), args, opts));
    c.dog_ok(&["cluster", "format", "--copies", "3", "--object-size", "1M"]);
    c.dog_ok(&["vdi", "create", "v", "16M"]);
    let mut round = 0u8;
    let mut check = |c: &Cluster, step: &str| {
        round += 1;
        let data = vec![round; MIB as usize];
        let at = (round as u64 % 16 * MIB).to_string();
        let out = c.dog_stdin(&["vdi", "write", "v", &at], &data);
        assert!(
            out.status.success(),
            "{step}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let back = c.dog_ok(&["vdi", "read", "v", &at, &MIB.to_string()]);
        assert!(back == data, "{step}: read back other data");
    };
    check(&c, "before");
    let steps = [
        (format!("{old}\n{new}\n"), "the new key added second"),
        (format!("{new}\n{old}\n"), "the new key put first"),
        (format!("{new}\n"), "the old key dropped"),
    ];
    for (text, step) in &steps {
        for i in 0..3 {
            replace(&node_key(i), text);
            check(&c, &format!("{step}, node {i}"));
        }
        replace(&client_key, text);
        check(&c, &format!("{step}, the client"));
    }
    c.kill9(1);
    c.start_node(1);
    c.wait_members(3);
    c.wait_recovered();
    check(&c, "node 1 restarted with the new key only");
    testkit::replicas::check(&c, "v").unwrap();
    // The old key alone no longer opens anything (the node proves itself first, so the
    // client is the one to refuse).
    replace(&client_key, &format!("{old}\n"));
    let out = c.dog(&["vdi", "list"]);
    let e = failed(&out);
    assert!(e.contains("did not prove it holds the cluster key"), "{e}");
}

#[test]
fn data_and_state_directories_are_owner_only() {
    let c = Cluster::start(&bins(), 1);
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&c.node_dir(0)), 0o700, "the node's data directory");
    assert_eq!(
        mode(&c.state_dir()),
        0o700,
        "the local driver's state directory"
    );
}

/// A node started before its key exists is served once `dog cluster format --key-file PATH`
/// has written the key to the path it was given.
#[test]
fn format_creates_the_key_a_waiting_node_then_uses() {
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("cluster.key");
    let addr = format!("127.0.0.1:{}", testkit::free_port());
    let mut cmd = std::process::Command::new(bins().sheep);
    cmd.args(["--dir", dir.path().join("n").to_str().unwrap()])
        .args(["--listen", &addr])
        .args([
            "--cluster",
            &format!("local:{}", dir.path().join("s").display()),
        ])
        .arg("--key-file")
        .arg(&key);
    let _node = testkit::Proc::spawn("sheep", cmd, &dir.path().join("sheep.log"));
    testkit::wait_until("the node to listen", Duration::from_secs(20), || {
        TcpStream::connect(&addr).is_ok()
    });
    let dog = |args: &[&str]| {
        let mut cmd = std::process::Command::new(bins().dog);
        cmd.args(["--address", &addr, "--key-file", key.to_str().unwrap()])
            .args(args)
            .env_remove("SHEEP_KEY_FILE");
        cmd.output().unwrap()
    };
    let out = dog(&["vdi", "list"]);
    assert!(!out.status.success(), "no key file yet");
    let out = dog(&["cluster", "format", "--copies", "1"]);
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{e}");
    assert!(e.contains("created cluster key"), "{e}");
    let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let out = dog(&["vdi", "create", "a", "1M"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Formatting again keeps the key (and is refused as before).
    let text = std::fs::read_to_string(&key).unwrap();
    assert!(!dog(&["cluster", "format", "--copies", "1"])
        .status
        .success());
    assert_eq!(std::fs::read_to_string(&key).unwrap(), text);
}
