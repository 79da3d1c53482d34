//! Recovery at scale in simulated time (issue 43): the scale harness's clusters
//! (`objstore_node::testing::scale`: nodes on metadata-only stores, filled where the ring
//! places each object) run here as the simulator runs its nodes, inline in one runtime with a
//! paused clock and the in-memory membership driver.
//!
//! Why not real threads: hundreds of nodes sharing two cores miss their heartbeats and their
//! listings' timeouts while they plan, the membership churns, and every churn is one more
//! epoch change to plan (200 nodes went through 600 epochs and never settled). In simulated
//! time, computing costs no time at all: a node is late only when the protocol makes it
//! wait, and the figures that matter (entries fetched to plan, requests, how many rounds) are
//! the protocol's own. Times reported are simulated, except each plan's `plan_ms`, wall time
//! on the one thread all nodes share.

use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use objstore_client::transport::MemNetwork;
use objstore_client::{Client, ClientOptions};
use objstore_node::store::meta::MetaStore;
use objstore_node::testing::scale::{cost, fill, EpochCost, Shape};
use objstore_node::{Node, RecoveryState};

use crate::cluster::SimCluster;
use crate::SimError;

/// Virtual nodes a node: as `sheep`'s default.
const VNODES: u32 = 128;
/// The longest an epoch change may take to settle, in simulated time.
const SETTLE_LIMIT: Duration = Duration::from_secs(3600);

/// A simulated cluster of metadata-only nodes.
pub struct SimScale {
    rt: tokio::runtime::Runtime,
    cluster: SimCluster,
    shape: Shape,
    rng: StdRng,
}

impl SimScale {
    /// Starts `shape.nodes` nodes, formats the cluster with `shape.copies` copies and puts
    /// every object on its owners (ids and network delays drawn from `seed`).
    pub fn start(shape: Shape, seed: u64) -> Result<SimScale, SimError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .map_err(SimError::Runtime)?;
        let mut rng = StdRng::seed_from_u64(seed);
        let net = MemNetwork::seeded(rng.gen());
        // Every node talks to every other while it plans: small buffers (see
        // `MemNetwork::set_io_buffer`).
        net.set_io_buffer(16 << 10);
        let mut cluster = SimCluster::new(net.clone(), &[]);
        let stores: Vec<Arc<MetaStore>> = (0..shape.nodes).map(|_| Arc::default()).collect();
        for store in &stores {
            cluster.add_meta_node(rng.gen::<u64>() >> 1, store.clone());
        }
        let incarnations: Vec<u64> = (0..shape.nodes).map(|_| rng.gen()).collect();
        rt.block_on(async {
            for (i, &inc) in incarnations.iter().enumerate() {
                cluster.start(i, inc, VNODES).await?;
            }
            if !settle(&cluster, Duration::from_secs(600), false).await {
                return Err(SimError::NoCluster(Duration::from_secs(600)));
            }
            let admin = Client::connect_via(
                Arc::new(net.endpoint(std::net::SocketAddr::from(([10, 0, 2, 1], 4000)))),
                &cluster.addrs(),
                ClientOptions::default(),
            )
            .await?;
            admin.format(shape.copies, None, 4 << 20).await?;
            if !settle(&cluster, Duration::from_secs(600), true).await {
                return Err(SimError::NoCluster(Duration::from_secs(600)));
            }
            Ok(())
        })?;
        let ep = cluster.nodes[0].node().expect("node 0 is up").epoch();
        fill(&stores, &cluster.addrs(), &ep, shape);
        Ok(SimScale {
            rt,
            cluster,
            shape,
            rng,
        })
    }

    /// Adds a node with an empty store and measures the epoch change.
    pub fn join(&mut self) -> Result<EpochCost, SimError> {
        let i = (self.cluster).add_meta_node(self.rng.gen::<u64>() >> 1, Arc::default());
        let incarnation = self.rng.gen();
        let (cluster, rt) = (&mut self.cluster, &self.rt);
        rt.block_on(async {
            let started = tokio::time::Instant::now();
            cluster.start(i, incarnation, VNODES).await?;
            measure(cluster, "join", self.shape, started).await
        })
    }

    /// Crashes node `i` and measures the epoch change.
    pub fn kill(&mut self, i: usize) -> Result<EpochCost, SimError> {
        let (cluster, rt) = (&mut self.cluster, &self.rt);
        rt.block_on(async {
            let started = tokio::time::Instant::now();
            cluster.crash(i);
            measure(cluster, "kill", self.shape, started).await
        })
    }

    /// The simulated cluster.
    pub fn cluster(&self) -> &SimCluster {
        &self.cluster
    }
}

/// Waits until the nodes up are all members of the newest epoch (and, with `recovered`, have
/// recovered it).
async fn settle(cluster: &SimCluster, limit: Duration, recovered: bool) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let latest = cluster.membership.latest();
        let up: Vec<&Arc<Node>> = cluster.nodes.iter().filter_map(|n| n.node()).collect();
        let done = latest.nodes.len() == up.len()
            && up.iter().all(|node| {
                let s = node.recovery_status();
                node.epoch().view.epoch == latest.epoch
                    && (!recovered || (s.epoch == latest.epoch && s.state == RecoveryState::Done))
            });
        if done {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn measure(
    cluster: &SimCluster,
    event: &'static str,
    shape: Shape,
    started: tokio::time::Instant,
) -> Result<EpochCost, SimError> {
    if !settle(cluster, SETTLE_LIMIT, false).await {
        return Err(SimError::NoCluster(SETTLE_LIMIT));
    }
    let members_in = started.elapsed();
    if !settle(cluster, SETTLE_LIMIT, true).await {
        return Err(SimError::NoCluster(SETTLE_LIMIT));
    }
    let recovered_in = started.elapsed();
    let nodes: Vec<_> = (cluster.nodes.iter())
        .filter_map(|n| Some((n.addr, &**n.node()?)))
        .collect();
    Ok(cost(event, &nodes, shape, members_in, recovered_in))
}
