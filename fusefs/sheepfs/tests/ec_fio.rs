//! An erasure-coded (4:2) VDI through the mount, plain and cached (issue 44): fio writes and
//! verifies while one node is killed, the data verifies with two nodes down (y), and again
//! after both come back and the cluster recovered.

mod common;

use std::process::{Command, Output, Stdio};
use std::time::Duration;

use common::{cache_args, cachectl_ok, Rig};
use testkit::wait_until;

fn fio(args: Vec<String>) -> std::process::Child {
    let mut fio = Command::new("fio");
    testkit::die_with_parent(&mut fio, libc::SIGKILL);
    fio.args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run fio (make test installs it)")
}

fn assert_ok(out: Output, what: &str) -> serde_json::Value {
    assert!(
        out.status.success(),
        "fio {what}:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["jobs"][0]["error"], 0, "fio {what}");
    v
}

/// fio verifying what the first run wrote (the same job, reads only).
fn verify_only(file: &str) -> Output {
    fio(common::fio_verify_args(
        file,
        "32M",
        &["--verify_only", "--number_ios=6000", "--randseed=44"],
    ))
    .wait_with_output()
    .unwrap()
}

fn run(cache: Option<&std::path::Path>) {
    let extra: Vec<String> = cache.map(|d| cache_args(d, "64M")).unwrap_or_default();
    let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
    let mut rig = Rig::start(6, 3, "1M", &extra);
    rig.cluster.dog_ok(&[
        "vdi",
        "create",
        "f",
        "32M",
        "--copies",
        "4:2",
        "--experimental",
    ]);
    let f = rig.path("f");
    let writer = fio(common::fio_verify_args(
        &f,
        "32M",
        &["--do_verify=1", "--number_ios=6000", "--randseed=44"],
    ));
    if cache.is_none() {
        wait_until("fio to allocate objects", Duration::from_secs(60), || {
            rig.cluster.dog_json(&["vdi", "info", "f"])["allocated_objects"]
                .as_u64()
                .unwrap()
                >= 8
        });
        // One node of six: writes go on (5 strips of 6 is min-copies for 4:2).
        rig.cluster.kill9(2);
    }
    let v = assert_ok(writer.wait_with_output().unwrap(), "after a node died");
    assert!(v["jobs"][0]["read"]["total_ios"].as_u64().unwrap() > 0);
    if let Some(dir) = cache {
        // Everything on the cluster, and nothing served from the cache from here on.
        cachectl_ok(dir, &["flush"]);
        cachectl_ok(dir, &["evict", "f"]);
        rig.cluster.kill9(2);
    }
    rig.cluster.wait_members(5);
    // Two of six (y): every block still verifies, decoded from the other strips.
    rig.cluster.kill9(4);
    rig.cluster.wait_members(4);
    let v = assert_ok(verify_only(&f), "with two nodes down");
    assert!(
        v["jobs"][0]["read"]["total_ios"].as_u64().unwrap() > 1000,
        "{v}"
    );
    // Both back and recovered: verifies again.
    rig.cluster.start_node(2);
    rig.cluster.start_node(4);
    rig.cluster.wait_members(6);
    rig.cluster.wait_recovered();
    let v = assert_ok(verify_only(&f), "after both came back");
    assert!(
        v["jobs"][0]["read"]["total_ios"].as_u64().unwrap() > 1000,
        "{v}"
    );
    let info = rig.cluster.dog_json(&["vdi", "info", "f"]);
    assert_eq!(info["redundancy"], "4:2");
}

#[test]
fn fio_verify_on_a_4_2_vdi_while_nodes_die() {
    run(None);
}

#[test]
fn fio_verify_on_a_cached_4_2_vdi_while_nodes_die() {
    let cache = tempfile::tempdir().unwrap();
    run(Some(cache.path()));
}
