//! The object cache against its cluster, with a real cluster, a real mount and cachectl: the
//! cluster created anew under a cache with dirty data (a VDI of the same name gets the same
//! id and the same first lock generation); the cluster down under a flush with a time limit,
//! and what stats say of it (push retries, the oldest dirty data's age).

mod common;

use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{cache_args, cachectl, cachectl_ok, open_rw, stats, stdout, strs, Rig, SHEEPFS};
use testkit::cluster::{Bins, Cluster};
use testkit::mount::Mount;
use testkit::{pseudo_random, wait_until};

/// One node, one copy, 1 MiB objects, mounted with a 64 MiB cache in `tmp/cache` and `extra`
/// options; returns the rig, the cache directory and the mount's options.
fn one_node_rig(tmp: &Path, extra: &[&str]) -> (Rig, PathBuf, Vec<String>) {
    let cache = tmp.join("cache");
    let mut args = cache_args(&cache, "64M");
    args.extend(extra.iter().map(|a| a.to_string()));
    (Rig::start(1, 1, "1M", &strs(&args)), cache, args)
}

#[test]
fn a_recreated_cluster_never_gets_the_old_clusters_unpushed_writes() {
    let tmp = tempfile::tempdir().unwrap();
    let (mut rig, cache, args) = one_node_rig(tmp.path(), &[]);
    rig.cluster.dog_ok(&["vdi", "create", "r", "16M"]);
    let old_id = rig.cluster.dog_json(&["cluster", "info"])["cluster_id"].clone();
    // Written, not fsynced: dirty in the cache (object 2 of 1 MiB objects).
    let data = pseudo_random(1 << 20, 7);
    open_rw(rig.path("r")).write_all_at(&data, 2 << 20).unwrap();
    assert_eq!(stats(&cache)["dirty"], 1 << 20);
    rig.mount.kill9();

    // Another cluster: new nodes, a new membership store, formatted, and a VDI named "r".
    let new = Cluster::start(&Bins::fresh(), 1);
    new.dog_ok(&["cluster", "format", "--copies", "1", "--object-size", "1M"]);
    new.dog_ok(&["vdi", "create", "r", "16M"]);
    let new_id = new.dog_json(&["cluster", "info"])["cluster_id"].clone();
    assert_ne!(old_id, new_id);
    drop(std::mem::replace(&mut rig.cluster, new));
    let log = rig.cluster.dir.path().join("sheepfs-new-cluster.log");
    rig.mount = Mount::start(
        Path::new(SHEEPFS),
        &rig.cluster.addr(0),
        &rig.cluster.dir.path().join("mnt"),
        &log,
        &strs(&args),
    );
    wait_until(
        "the old cluster's dirty data to leave the cache",
        Duration::from_secs(30),
        || stats(&cache)["dirty"] == 0,
    );
    // A push, had it been started, would be done by now.
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        rig.cluster
            .read_vdi("r", 0, 16 << 20)
            .iter()
            .all(|&b| b == 0),
        "the old cluster's writes reached the new cluster's VDI"
    );
    // Set aside, with the old record, and said so in the log.
    let aside: Vec<_> = std::fs::read_dir(cache.join("orphaned"))
        .expect("an orphaned directory in the cache")
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    let kept = std::fs::read(aside[0].join("00000002.data")).unwrap();
    assert!(kept == data, "the unpushed writes are kept as they were");
    let rec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(aside[0].join("record.json")).unwrap()).unwrap();
    assert_eq!(rec["name"], "r");
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(
        said.contains("was cached from another cluster") && said.contains("set aside"),
        "{said}"
    );
    // The new VDI works through the cache.
    let f = open_rw(rig.path("r"));
    let mine = pseudo_random(8192, 8);
    f.write_all_at(&mine, 4096).unwrap();
    f.sync_all().unwrap();
    assert_eq!(rig.cluster.read_vdi("r", 4096, 8192), mine);
}

#[test]
fn flush_timeout_push_retries_and_dirty_age_with_the_cluster_down() {
    let tmp = tempfile::tempdir().unwrap();
    // The client gives up on the cluster after 3 s.
    let (mut rig, cache, _) = one_node_rig(tmp.path(), &["--timeout", "3"]);
    rig.cluster.dog_ok(&["vdi", "create", "p", "8M"]);
    let f = open_rw(rig.path("p"));
    let data = pseudo_random(1 << 20, 5);
    f.write_all_at(&data, 0).unwrap();
    std::thread::sleep(Duration::from_millis(1200));
    // The age of the oldest dirty data, in JSON, text and Prometheus.
    let s = stats(&cache);
    let age = s["oldest_dirty_ms"].as_u64().unwrap();
    assert!((1200..600_000).contains(&age), "{s}");
    let text = stdout(&cachectl_ok(&cache, &["stats"]));
    assert!(text.contains("\nOldest dirty:    "), "{text}");
    assert!(!text.contains("\nOldest dirty:    -"), "{text}");
    let prom = stdout(&cachectl_ok(&cache, &["stats", "--prometheus"]));
    let secs: f64 = metric(&prom, "sheepfs_cache_oldest_dirty_seconds")
        .parse()
        .unwrap();
    assert!(secs >= 1.2, "{prom}");
    assert_eq!(metric(&prom, "sheepfs_cache_push_retries_total"), "0");
    assert_eq!(metric(&prom, "sheepfs_cache_full_writethroughs_total"), "0");

    // The cluster gone: a flush with a time limit gives up in time, says why, exits 1.
    rig.cluster.kill9(0);
    for json in [false, true] {
        let mut a = vec!["flush", "p", "--timeout", "1s"];
        if json {
            a.insert(0, "--json");
        }
        let start = std::time::Instant::now();
        let out = cachectl(&cache, &a);
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "{:?}",
            start.elapsed()
        );
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(
            e.starts_with("cachectl: flush not done within 1s") && e.contains("stays dirty"),
            "{e}"
        );
        assert!(out.stdout.is_empty());
    }
    assert_eq!(stats(&cache)["dirty"], 1 << 20);
    // Those flushes fail in sheepfs (the client's timeout): the next push is a retry.
    wait_until("a failed push", Duration::from_secs(30), || {
        stats(&cache)["push_errors"].as_u64().unwrap() > 0
    });
    assert!(!cachectl(&cache, &["flush", "p"]).status.success());
    let s = stats(&cache);
    assert!(s["push_retries"].as_u64().unwrap() >= 1, "{s}");
    let text = stdout(&cachectl_ok(&cache, &["stats"]));
    assert!(!text.contains("\nPush retries:    0\n"), "{text}");

    // Back: a flush within its limit succeeds, in JSON too; nothing is dirty any more.
    rig.cluster.start_node(0);
    let out = cachectl_ok(&cache, &["--json", "flush", "p", "--timeout", "60s"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["vdi"], "p");
    let s = stats(&cache);
    assert_eq!(
        (s["dirty"].as_u64(), s["oldest_dirty_ms"].as_u64()),
        (Some(0), Some(0))
    );
    let prom = stdout(&cachectl_ok(&cache, &["stats", "--prometheus"]));
    assert_eq!(metric(&prom, "sheepfs_cache_oldest_dirty_seconds"), "0.000");
    assert_ne!(metric(&prom, "sheepfs_cache_push_retries_total"), "0");
    assert_eq!(rig.cluster.read_vdi("p", 0, 1 << 20), data);
}

/// The value of an unlabelled series in Prometheus text.
fn metric<'a>(text: &'a str, name: &str) -> &'a str {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
}
