//! The whole cluster stops and starts again on its directories: every VDI reads back exactly
//! what was written, and every replica agrees. Once with a clean stop (SIGTERM, each node
//! leaves), once with every node killed (-9) at one instant.

use std::time::Duration;

use testkit::cluster::{Bins, Cluster};
use testkit::pseudo_random;
use testkit::replicas::assert_consistent;

const MIB: u64 = 1 << 20;
const NODES: usize = 4;

/// What each VDI should hold: name, size, bytes (holes are zeros).
struct Model(Vec<(&'static str, Vec<u8>)>);

impl Model {
    fn write(&mut self, c: &Cluster, name: &str, at: u64, bytes: &[u8]) {
        c.write_vdi(name, at, bytes);
        let v = &mut self.0.iter_mut().find(|(n, _)| *n == name).unwrap().1;
        v[at as usize..at as usize + bytes.len()].copy_from_slice(bytes);
    }

    fn verify(&self, c: &Cluster, when: &str) {
        for (name, want) in &self.0 {
            let got = c.read_vdi(name, 0, want.len() as u64);
            assert_eq!(got.len(), want.len(), "{when}: VDI {name} length");
            if let Some(at) = (0..want.len()).find(|&i| got[i] != want[i]) {
                panic!("{when}: VDI {name} differs first at byte {at}");
            }
            assert_consistent(c, name);
        }
    }
}

fn all_down(c: &Cluster) -> bool {
    (0..NODES).all(|i| !c.dog_at(&c.addr(i), &["node", "list"]).status.success())
}

fn restart_all(c: &mut Cluster) {
    // In reverse order: the first node back is the last one that stopped, or not.
    for i in (0..NODES).rev() {
        c.start_node(i);
    }
    c.wait_members(NODES);
    c.wait_recovered();
}

#[test]
fn whole_cluster_stop_and_restart_keeps_every_byte() {
    let mut c = Cluster::start(&Bins::fresh(), NODES);
    c.dog_ok(&["cluster", "format", "--copies", "2", "--object-size", "1M"]);
    c.dog_ok(&["vdi", "create", "a", "32M"]);
    c.dog_ok(&["vdi", "create", "b", "16M"]);
    let mut m = Model(vec![("a", vec![0; 32 << 20]), ("b", vec![0; 16 << 20])]);
    m.write(&c, "a", 0, &pseudo_random(24 << 20, 61));
    // Unaligned, across objects, leaving holes on both sides.
    m.write(&c, "b", 3 * MIB + 7, &pseudo_random((5 << 20) + 123, 62));
    c.wait_recovered();
    m.verify(&c, "before any stop");
    let epoch = c.dog_json(&["cluster", "info"])["epoch"].as_u64().unwrap();

    // 1. A clean stop: SIGTERM to every node; each leaves the cluster and exits.
    for i in 0..NODES {
        let mut p = c.nodes[i].take().unwrap();
        assert!(
            p.terminate(Duration::from_secs(20)),
            "sheep{i} did not exit on SIGTERM"
        );
    }
    assert!(all_down(&c), "a node still answers after the stop");
    restart_all(&mut c);
    let after = c.dog_json(&["cluster", "info"]);
    assert!(
        after["epoch"].as_u64().unwrap() > epoch,
        "a restart makes new epochs: {after}"
    );
    m.verify(&c, "after a clean stop and restart");

    // Change some data, then 2. every node killed at one instant.
    m.write(&c, "a", 20 * MIB + 4096, &pseudo_random((6 << 20) + 5, 63));
    m.write(&c, "b", 0, &pseudo_random(MIB as usize, 64));
    c.wait_recovered();
    for i in 0..NODES {
        // SAFETY: signals to children of this process, reaped by kill9 below.
        unsafe {
            libc::kill(
                c.nodes[i].as_ref().unwrap().pid() as libc::pid_t,
                libc::SIGKILL,
            )
        };
    }
    for i in 0..NODES {
        c.kill9(i);
    }
    assert!(all_down(&c), "a node still answers after kill -9");
    restart_all(&mut c);
    m.verify(&c, "after kill -9 of every node and restart");
    let names: Vec<String> = c
        .dog_json(&["vdi", "list"])
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["a", "b"]);
}
