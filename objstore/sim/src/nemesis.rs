//! The nemesis: from its own seeded generator, at random moments while the clients run, it
//! crashes and restarts nodes (also in the middle of requests: the network has a small base
//! latency, so operations take simulated time), takes links down or makes them hang (between
//! two nodes or a client and a node, or all of one node's links), raises delays so messages
//! overtake each other across connections, resets connections, fills disks (also of nodes as
//! they restart, so they own objects they cannot store) and makes fdatasync fail (losing the
//! dirty pages). Every fault is undone after a random span; all are
//! undone when the clients have finished.

use std::net::SocketAddr;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;
use tokio::task::JoinHandle;

use objstore_client::transport::{Delay, Link};
use objstore_node::store::mem::{Fault, Op as StoreOp};

use crate::cluster::SimCluster;
use crate::workload::Shared;
use crate::{Config, SimError};

/// The network's latency when no fault raises it.
pub const BASE_DELAY: Delay = Delay {
    min: Duration::from_micros(20),
    max: Duration::from_micros(400),
};

/// Which faults the nemesis may inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Faults {
    pub crashes: bool,
    pub partitions: bool,
    pub hangs: bool,
    pub delays: bool,
    pub resets: bool,
    pub disk_full: bool,
    pub fsync_errors: bool,
    /// A crashed node restarts with a full disk: it cannot pull the objects it owns again, and
    /// their old holders stand in for it (issue 43).
    pub full_restarts: bool,
    /// A crash is a power cut that wrote back part of what the node had not synced: copies
    /// come back marked with their old bytes, their new ones or a mix, notes as they were, as
    /// set or torn ([`objstore_node::store::mem::MemStore::power_cut`]); without it a crash
    /// loses everything unsynced, cleanly.
    pub power_cuts: bool,
}

impl Faults {
    pub const ALL: Faults = Faults {
        crashes: true,
        partitions: true,
        hangs: true,
        delays: true,
        resets: true,
        disk_full: true,
        fsync_errors: true,
        full_restarts: true,
        power_cuts: true,
    };
    pub const NONE: Faults = Faults {
        crashes: false,
        partitions: false,
        hangs: false,
        delays: false,
        resets: false,
        disk_full: false,
        fsync_errors: false,
        full_restarts: false,
        power_cuts: false,
    };
}

impl std::str::FromStr for Faults {
    type Err = String;

    /// A comma-separated list of `crashes`, `partitions`, `hangs`, `delays`, `resets`,
    /// `disk_full`, `fsync_errors`, `full_restarts`, `power_cuts`; `all` or `none`.
    fn from_str(s: &str) -> Result<Faults, String> {
        let mut f = Faults::NONE;
        for name in s.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            match name {
                "all" => f = Faults::ALL,
                "none" => f = Faults::NONE,
                "crashes" => f.crashes = true,
                "partitions" => f.partitions = true,
                "hangs" => f.hangs = true,
                "delays" => f.delays = true,
                "resets" => f.resets = true,
                "disk_full" => f.disk_full = true,
                "fsync_errors" => f.fsync_errors = true,
                "full_restarts" => f.full_restarts = true,
                "power_cuts" => f.power_cuts = true,
                other => return Err(format!("unknown fault class '{other}'")),
            }
        }
        Ok(f)
    }
}

/// How a fault is undone.
#[derive(Debug)]
enum Undo {
    Restart(usize),
    LinkUp(SocketAddr, SocketAddr),
    BaseDelay,
    ClearStore(usize),
}

fn span(rng: &mut StdRng, min_ms: u64, max_ms: u64) -> Duration {
    Duration::from_micros(rng.gen_range(min_ms * 1000..=max_ms * 1000))
}

/// Runs faults until every client task has finished, then undoes them all.
pub async fn run(
    cluster: &mut SimCluster,
    clients: &[JoinHandle<()>],
    client_addrs: &[SocketAddr],
    mut rng: StdRng,
    cfg: &Config,
    shared: &Shared,
) -> Result<(), SimError> {
    let f = cfg.faults;
    let mut undo: Vec<(Duration, Undo)> = Vec::new();
    let start = tokio::time::Instant::now();
    let endpoints: Vec<SocketAddr> = cluster
        .addrs()
        .into_iter()
        .chain(client_addrs.iter().copied())
        .collect();
    let n = cluster.nodes.len();
    while !clients.iter().all(JoinHandle::is_finished) {
        tokio::time::sleep(span(&mut rng, 1, cfg.nemesis_pause_ms)).await;
        let now = start.elapsed();
        // Due repairs, in the order they were scheduled.
        let (due, later): (Vec<_>, Vec<_>) = undo.into_iter().partition(|(at, _)| *at <= now);
        undo = later;
        for (_, u) in due {
            if let Undo::Restart(i) = u {
                // Drawn only with the fault on: runs without it replay as before it existed.
                if f.full_restarts && !cluster.nodes[i].is_up() && rng.gen_bool(0.3) {
                    cluster.nodes[i].store.fail(StoreOp::Write, Fault::NoSpace);
                    shared.event(format!("node {i} restarts with a full disk"));
                    undo.push((later_of(now, &mut rng, 200, 4000), Undo::ClearStore(i)));
                }
            }
            apply_undo(cluster, u, &mut rng, shared, cfg.vnodes).await?;
        }
        let roll = rng.gen_range(0..100);
        let later = |rng: &mut StdRng, min, max| later_of(now, rng, min, max);
        match roll {
            0..=14 if f.crashes => {
                let up = cluster.up();
                if up.len() > n - cfg.max_down {
                    let i = up[rng.gen_range(0..up.len())];
                    if f.power_cuts {
                        cluster.power_cut(i, &mut rng);
                    } else {
                        cluster.crash(i);
                    }
                    shared.history.lock().unwrap().crashes.push(shared.now());
                    shared.event(format!("crash node {i}"));
                    undo.push((later(&mut rng, 50, 4000), Undo::Restart(i)));
                }
            }
            15..=24 if f.partitions => {
                let (a, b) = two(&mut rng, &endpoints, n);
                cluster.net.set_link(a, b, Link::Down);
                shared.event(format!("link {a} - {b} down"));
                undo.push((later(&mut rng, 50, 3000), Undo::LinkUp(a, b)));
            }
            25..=32 if f.hangs => {
                let (a, b) = two(&mut rng, &endpoints, n);
                cluster.net.set_link(a, b, Link::Hang);
                shared.event(format!("link {a} - {b} hangs"));
                undo.push((later(&mut rng, 50, 3000), Undo::LinkUp(a, b)));
            }
            33..=37 if f.hangs || f.partitions => {
                // One node cut off from everyone, while membership still sees it ticking.
                let i = rng.gen_range(0..n);
                let link = if f.hangs && (!f.partitions || rng.gen_bool(0.5)) {
                    Link::Hang
                } else {
                    Link::Down
                };
                let a = cluster.nodes[i].addr;
                let back = later(&mut rng, 50, 2500);
                for &b in endpoints.iter().filter(|&&b| b != a) {
                    cluster.net.set_link(a, b, link);
                    undo.push((back, Undo::LinkUp(a, b)));
                }
                shared.event(format!("node {i} isolated ({link:?})"));
            }
            38..=45 if f.delays => {
                let max = span(&mut rng, 1, 1500);
                cluster.net.set_delay(Some(Delay {
                    min: Duration::ZERO,
                    max,
                }));
                shared.event(format!("delays up to {max:?}"));
                undo.push((later(&mut rng, 100, 3000), Undo::BaseDelay));
            }
            46..=57 if f.resets => {
                let conns = cluster.net.connections();
                if !conns.is_empty() {
                    let c = conns[rng.gen_range(0..conns.len())];
                    cluster.net.reset_connection(c.id);
                    shared.event(format!("reset {} -> {}", c.from, c.to));
                }
            }
            58..=63 if f.disk_full => {
                let i = rng.gen_range(0..n);
                cluster.nodes[i].store.fail(StoreOp::Write, Fault::NoSpace);
                shared.event(format!("node {i} disk full"));
                undo.push((later(&mut rng, 10, 2000), Undo::ClearStore(i)));
            }
            64..=69 if f.fsync_errors => {
                let i = rng.gen_range(0..n);
                cluster.nodes[i].store.fail(StoreOp::Flush, Fault::Io);
                shared.event(format!("node {i} fdatasync fails"));
                undo.push((later(&mut rng, 10, 1000), Undo::ClearStore(i)));
            }
            _ => {}
        }
    }
    for (_, u) in undo {
        apply_undo(cluster, u, &mut rng, shared, cfg.vnodes).await?;
    }
    Ok(())
}

/// A moment `min_ms` to `max_ms` after `now`.
fn later_of(now: Duration, rng: &mut StdRng, min_ms: u64, max_ms: u64) -> Duration {
    now + span(rng, min_ms, max_ms)
}

/// Two distinct endpoints, at least one of them a node (the first `nodes` endpoints).
fn two(rng: &mut StdRng, endpoints: &[SocketAddr], nodes: usize) -> (SocketAddr, SocketAddr) {
    let a = rng.gen_range(0..nodes);
    let mut b = rng.gen_range(0..endpoints.len() - 1);
    if b >= a {
        b += 1;
    }
    (endpoints[a], endpoints[b])
}

async fn apply_undo(
    cluster: &mut SimCluster,
    u: Undo,
    rng: &mut StdRng,
    shared: &Shared,
    vnodes: u32,
) -> Result<(), SimError> {
    match u {
        Undo::Restart(i) => {
            if !cluster.nodes[i].is_up() {
                cluster.start(i, rng.gen(), vnodes).await?;
                shared.event(format!("restart node {i}"));
            }
        }
        Undo::LinkUp(a, b) => cluster.net.set_link(a, b, Link::Up),
        Undo::BaseDelay => cluster.net.set_delay(Some(BASE_DELAY)),
        Undo::ClearStore(i) => cluster.nodes[i].store.clear_faults(),
    }
    Ok(())
}
