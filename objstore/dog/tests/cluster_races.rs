//! Several `dog` processes racing for one thing: creating one VDI name, taking one VDI's
//! attachment lock. Exactly one wins; every other gets a clear error saying who did.

use std::process::{Child, Command, Output, Stdio};

use serde_json::Value;
use testkit::cluster::{Bins, Cluster};

const RACERS: usize = 8;
const ROUNDS: usize = 3;

/// Starts every command before waiting for any, so they run at the same time.
fn race(c: &Cluster, argv: impl Fn(usize) -> Vec<String>) -> Vec<Output> {
    let children: Vec<Child> = (0..RACERS)
        .map(|k| {
            Command::new(&c.bins.dog)
                .env(testkit::auth::KEY_ENV, c.key_file())
                .arg("--address")
                .arg(c.addr(k % c.nodes.len()))
                .args(argv(k))
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("run dog")
        })
        .collect();
    // Every child is waited for (none outlives the test), then judged.
    children
        .into_iter()
        .map(|ch| ch.wait_with_output().expect("dog output"))
        .collect()
}

fn winners(outs: &[Output]) -> Vec<usize> {
    (0..outs.len())
        .filter(|&k| outs[k].status.success())
        .collect()
}

#[test]
fn concurrent_create_of_one_name_has_one_winner() {
    let c = Cluster::start(&Bins::fresh(), 3);
    c.dog_ok(&["cluster", "format", "--copies", "2", "--object-size", "1M"]);
    for round in 0..ROUNDS {
        let name = format!("disk{round}");
        let outs = race(&c, |k| {
            // Sizes differ, so the VDI that exists tells whose create won.
            ["vdi", "create", &name, &format!("{}M", 8 + k), "--json"]
                .map(String::from)
                .to_vec()
        });
        let won = winners(&outs);
        assert_eq!(won.len(), 1, "round {round}: winners {won:?}");
        let w = won[0];
        for (k, o) in outs.iter().enumerate().filter(|(k, _)| *k != w) {
            let e = String::from_utf8_lossy(&o.stderr);
            assert!(
                e.trim() == format!("dog: VDI '{name}' already exists"),
                "round {round}, racer {k}: {e}"
            );
        }
        let info = c.dog_json(&["vdi", "info", &name]);
        assert_eq!(info["size"], (8 + w as u64) << 20, "round {round}: {info}");
        let created: Value = serde_json::from_slice(&outs[w].stdout).unwrap();
        assert_eq!(info["vid"], created["vid"], "round {round}");
    }
    // Distinct names created at once get distinct ids and stay apart.
    let outs = race(&c, |k| {
        ["vdi", "create", &format!("own{k}"), "4M"]
            .map(String::from)
            .to_vec()
    });
    assert_eq!(winners(&outs).len(), RACERS, "{outs:?}");
    let list = c.dog_json(&["vdi", "list"]);
    let mut vids: Vec<u64> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["vid"].as_u64().unwrap())
        .collect();
    assert_eq!(vids.len(), ROUNDS + RACERS, "{list}");
    vids.sort_unstable();
    vids.dedup();
    assert_eq!(vids.len(), ROUNDS + RACERS, "two VDIs share an id: {list}");
    for k in 0..RACERS {
        c.write_vdi(&format!("own{k}"), 0, format!("racer {k}").as_bytes());
    }
    for k in 0..RACERS {
        let want = format!("racer {k}");
        assert_eq!(
            c.read_vdi(&format!("own{k}"), 0, want.len() as u64),
            want.as_bytes()
        );
    }
}

#[test]
fn concurrent_lock_acquires_have_one_holder() {
    let c = Cluster::start(&Bins::fresh(), 3);
    c.dog_ok(&["cluster", "format", "--copies", "2"]);
    for round in 0..ROUNDS {
        let name = format!("v{round}");
        c.dog_ok(&["vdi", "create", &name, "8M"]);
        let outs = race(&c, |k| {
            [
                "vdi",
                "lock",
                "acquire",
                &name,
                "--owner",
                &format!("owner{k}"),
                "--host",
                &format!("host{k}"),
                "--json",
            ]
            .map(String::from)
            .to_vec()
        });
        let won = winners(&outs);
        assert_eq!(won.len(), 1, "round {round}: holders {won:?}");
        let w = won[0];
        let held: Value = serde_json::from_slice(&outs[w].stdout).unwrap();
        assert_eq!(held["owner"], format!("owner{w}"));
        for (k, o) in outs.iter().enumerate().filter(|(k, _)| *k != w) {
            let e = String::from_utf8_lossy(&o.stderr);
            assert!(
                e.contains(&format!(
                    "VDI '{name}' is attached read-write by host{w} (owner owner{w}) since "
                )),
                "round {round}, racer {k}: {e}"
            );
        }
        // The lock table agrees: one lock for this VDI, the winner's.
        let locks = c.dog_json(&["vdi", "lock", "list"]);
        let mine: Vec<&Value> = locks
            .as_array()
            .unwrap()
            .iter()
            .filter(|l| l["vdi"] == name.as_str())
            .collect();
        assert_eq!(mine, [&held], "round {round}: {locks}");
    }
}
