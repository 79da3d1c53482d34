//! The object cache across clusters: a real cluster, a real mount, sheepfs killed with dirty
//! data, the cluster created anew with a VDI of the same name (so the same id and the same
//! first lock generation), and a remount on the same cache.

mod common;

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::time::Duration;

use common::{cache_args, open_rw, stats, strs, Rig, SHEEPFS};
use testkit::cluster::{Bins, Cluster};
use testkit::mount::Mount;
use testkit::{pseudo_random, wait_until};

#[test]
fn a_recreated_cluster_never_gets_the_old_clusters_unpushed_writes() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let args = cache_args(&cache, "64M");
    let mut rig = Rig::start(1, 1, "1M", &strs(&args));
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
