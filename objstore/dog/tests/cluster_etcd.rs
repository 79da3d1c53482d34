//! Real `sheep` processes on the etcd membership driver, against real etcd servers
//! (`testkit::etcd`): the cluster forms and serves, a node killed with SIGKILL leaves the view
//! within its lease TTL, and losing one member of a 3-member etcd changes nothing for the
//! nodes. Skipped, loudly, only when `/usr/bin/etcd` is missing (`make test` installs it).

mod common;

use std::time::{Duration, Instant};

use common::{bins, MIB};
use testkit::cluster::{Cluster, ClusterOptions};
use testkit::etcd::{skip_without_etcd, Etcd, EtcdCluster};
use testkit::pseudo_random;

const TTL: Duration = Duration::from_secs(2);

fn etcd_missing() -> bool {
    skip_without_etcd("sheep on etcd is")
}

/// `n` nodes on `etcd` under `prefix`, with a short lease TTL.
fn cluster_on(etcd: &Etcd, prefix: &str, n: usize) -> Cluster {
    testkit::or_panic(Cluster::try_start_with(
        &bins(),
        n,
        ClusterOptions {
            driver: Some(etcd.cluster_spec(prefix)),
            lease_ttl: Some(TTL),
            ..ClusterOptions::default()
        },
    ))
}

/// Kills node `i` and waits until the others list `left` members: within the lease TTL, a
/// tick and a second of slack (plus dog's own polling).
fn kill_and_expect_dropped(c: &mut Cluster, i: usize, left: usize) {
    c.kill9(i);
    let t = Instant::now();
    c.wait_members(left);
    let took = t.elapsed();
    assert!(
        took <= TTL + Duration::from_secs(3),
        "a killed node left the view {took:?} after its death (lease TTL {TTL:?})"
    );
}

#[test]
fn etcd_cluster_serves_and_drops_a_dead_node() {
    if etcd_missing() {
        return;
    }
    // Declared first, dropped last: the nodes go before their store.
    let etcd = Etcd::single();
    let mut c = cluster_on(&etcd, "/e2e", 3);
    c.dog_ok(&["cluster", "format", "--copies", "2", "--object-size", "1M"]);
    c.dog_ok(&["vdi", "create", "v", "8M"]);
    let data = pseudo_random((8 * MIB) as usize, 11);
    c.write_vdi("v", 0, &data);
    assert!(c.read_vdi("v", 0, 8 * MIB) == data, "read back differs");
    kill_and_expect_dropped(&mut c, 2, 2);
    c.wait_recovered();
    assert!(c.read_vdi("v", 0, 8 * MIB) == data, "after a node's death");
    // A second cluster on the same etcd under another prefix is another cluster.
    let other = cluster_on(&etcd, "/e2e-other", 1);
    let info = other.dog_json(&["cluster", "info"]);
    assert_eq!(info["nodes"], 1, "{info}");
    assert_eq!(info["status"], "unformatted", "{info}");
}

#[test]
fn etcd_member_loss_changes_nothing_for_the_nodes() {
    if etcd_missing() {
        return;
    }
    let mut etcd = EtcdCluster::start(3);
    let mut c = cluster_on(&etcd, "/e2e", 3);
    c.dog_ok(&["cluster", "format", "--copies", "2", "--object-size", "1M"]);
    c.dog_ok(&["vdi", "create", "v", "4M"]);
    // The first endpoint every node was given goes away: the nodes use the others.
    etcd.kill(0);
    let data = pseudo_random((4 * MIB) as usize, 12);
    c.write_vdi("v", 0, &data);
    c.dog_ok(&["vdi", "create", "w", "4M"]);
    let before = c.dog_json(&["cluster", "info"])["epoch"].clone();
    // Well past the lease TTL: nobody lost its lease.
    std::thread::sleep(TTL * 2);
    let info = c.dog_json(&["cluster", "info"]);
    assert_eq!(info["nodes"], 3, "{info}");
    assert_eq!(
        info["epoch"], before,
        "a node lost its lease with 2 of 3 etcd members up"
    );
    // Membership changes still go through.
    kill_and_expect_dropped(&mut c, 1, 2);
    assert!(
        c.read_vdi("v", 0, 4 * MIB) == data,
        "after an etcd member and a node died"
    );
}
