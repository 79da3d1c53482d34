//! Whole clusters in one process, for tests of the node, the client and the layers above: every
//! node on a [`MemStore`] in its own tokio runtime, all of them and the clients on one
//! [`MemNetwork`], membership through the `local` driver in a temporary directory. No ports,
//! no root, no child processes.
//!
//! A node crash drops the node's runtime (every task and connection of it ends at once) and
//! keeps only what its store had made durable ([`MemStore::crashed`]); a restart brings the
//! node back on that state, as `sheep` restarting on its directory would.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use objstore_client::transport::MemNetwork;
use objstore_client::{Client, ClientError, ClientOptions};

use crate::health::HealthOptions;
use crate::node::{NodeError, NodeOptions, NodeParts, Running};
use crate::store::meta::MetaStore;
use crate::store::MemStore;
use crate::Node;

pub mod scale;

/// One node of a [`MemCluster`].
struct MemNode {
    addr: SocketAddr,
    dir: PathBuf,
    store: Arc<MemStore>,
    /// A metadata-only store the node runs on instead of `store` ([`MemCluster::start_meta`]).
    meta: Option<Arc<MetaStore>>,
    /// The runtime its tasks run on and the started node; None while it is down.
    up: Option<(tokio::runtime::Runtime, Running)>,
}

/// See the module documentation.
pub struct MemCluster {
    pub net: MemNetwork,
    nodes: Vec<MemNode>,
    state: PathBuf,
    /// Every node's fencing (never fenced unless the cluster was started with
    /// [`MemCluster::start_with_health`]).
    health: HealthOptions,
    /// How long a node stays a member after its last heartbeat (nodes started from now on).
    pub lease_ttl: std::time::Duration,
    _dir: tempfile::TempDir,
}

impl MemCluster {
    /// Starts `n` nodes and waits until each sees all `n` as members. Call from a thread that
    /// is not inside a tokio runtime (a plain `#[test]`).
    pub fn start(n: usize) -> Result<MemCluster, NodeError> {
        MemCluster::start_with_health(n, HealthOptions::never_fenced())
    }

    /// [`MemCluster::start`] with nodes that fence themselves as `health` says.
    pub fn start_with_health(n: usize, health: HealthOptions) -> Result<MemCluster, NodeError> {
        let dir = tempfile::tempdir().map_err(|source| NodeError::Io {
            dir: std::env::temp_dir(),
            op: "create a temporary directory",
            source,
        })?;
        let mut c = MemCluster {
            net: MemNetwork::new(),
            nodes: Vec::new(),
            state: dir.path().join("state"),
            health,
            lease_ttl: crate::membership::DEFAULT_LEASE_TTL,
            _dir: dir,
        };
        for _ in 0..n {
            let i = c.add_node();
            c.start_node(i)?;
        }
        c.wait_members(n);
        Ok(c)
    }

    /// [`MemCluster::start`] of nodes on metadata-only stores (versions, no bytes), node `i` on
    /// `stores[i]`: the scale harness's clusters of millions of objects.
    /// `lease_ttl`: how long a node stays a member after its last heartbeat (hundreds of nodes
    /// on a few cores miss the default's). Connections get 16 KiB buffers instead of 256 KiB
    /// ([`MemNetwork::set_io_buffer`]): every node talks to every other while it plans, and at
    /// 200 nodes, 40,000 connections of 1 MiB of buffers outgrew this machine's 24 GB.
    pub fn start_meta(
        stores: Vec<Arc<MetaStore>>,
        lease_ttl: std::time::Duration,
    ) -> Result<MemCluster, NodeError> {
        let mut c = MemCluster::start(0)?;
        c.net.set_io_buffer(16 << 10);
        c.lease_ttl = lease_ttl;
        let n = stores.len();
        for store in stores {
            let i = c.add_node_on(store);
            c.start_node(i)?;
        }
        c.wait_members_within(n, std::time::Duration::from_secs(120));
        Ok(c)
    }

    /// A new node, down (start it with [`MemCluster::start_node`]); returns its index. At
    /// most 250 nodes.
    pub fn add_node(&mut self) -> usize {
        let i = self.nodes.len();
        assert!(i < 250, "a MemCluster has at most 250 nodes");
        self.nodes.push(MemNode {
            addr: SocketAddr::from(([10, 0, 0, i as u8 + 1], 7000)),
            dir: self._dir.path().join(format!("node{i}")),
            store: Arc::new(MemStore::default()),
            meta: None,
            up: None,
        });
        i
    }

    /// [`MemCluster::add_node`] on a metadata-only store.
    pub fn add_node_on(&mut self, store: Arc<MetaStore>) -> usize {
        let i = self.add_node();
        self.nodes[i].meta = Some(store);
        i
    }

    /// Node `i`'s address on the in-memory network.
    pub fn addr(&self, i: usize) -> SocketAddr {
        self.nodes[i].addr
    }

    /// The owners of `oid` in node `from`'s view (`copies` of them), primary first, as node
    /// indexes.
    pub fn owners(
        &self,
        from: usize,
        oid: objstore_proto::oid::ObjectId,
        copies: usize,
    ) -> Vec<usize> {
        let ep = self.node(from).expect("node is up").epoch();
        ep.ring
            .replicas(oid, copies)
            .iter()
            .filter_map(|o| self.nodes.iter().position(|n| n.addr == o.addr))
            .collect()
    }

    /// Every node's address.
    pub fn addrs(&self) -> Vec<SocketAddr> {
        self.nodes.iter().map(|n| n.addr).collect()
    }

    /// Node `i`'s object store.
    pub fn store(&self, i: usize) -> &Arc<MemStore> {
        &self.nodes[i].store
    }

    /// Node `i` itself, while it is up.
    pub fn node(&self, i: usize) -> Option<&Arc<Node>> {
        self.nodes[i].up.as_ref().map(|(_, r)| &r.node)
    }

    /// Starts (or restarts) node `i` on its store.
    pub fn start_node(&mut self, i: usize) -> Result<(), NodeError> {
        let n = &mut self.nodes[i];
        assert!(n.up.is_none(), "node {i} is already up");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(format!("node{i}"))
            .enable_all()
            .build()
            .map_err(|source| NodeError::Io {
                dir: n.dir.clone(),
                op: "start a runtime",
                source,
            })?;
        let listener = self.net.listen(n.addr).map_err(|source| NodeError::Bind {
            addr: n.addr,
            source,
        })?;
        let opts = NodeOptions {
            dir: n.dir.clone(),
            listen: n.addr,
            cluster: format!("local:{}", self.state.display()),
            zone: None,
            vnodes: 128,
            pull_delay: std::time::Duration::ZERO,
            settle_from: crate::node::SETTLE_FROM,
            driver_opts: crate::membership::DriverOptions {
                lease_ttl: self.lease_ttl,
            },
            health: self.health,
            scrub: Default::default(),
            access: Default::default(),
        };
        let parts = NodeParts {
            store: Some(match &n.meta {
                Some(m) => m.clone() as Arc<dyn crate::store::ObjectBackend>,
                None => n.store.clone(),
            }),
            listener: Some(listener),
            // Connections from this node come from its address: link faults apply to them.
            ..NodeParts::new(Arc::new(self.net.endpoint(n.addr)))
        };
        let running = rt.block_on(Node::start_with(opts, parts))?;
        n.up = Some((rt, running));
        Ok(())
    }

    /// Crashes node `i` as a power cut would: its tasks and connections end, writes it had not
    /// flushed are lost.
    pub fn crash(&mut self, i: usize) {
        self.stop(i, MemStore::crashed);
    }

    /// Kills node `i` as `kill -9` would: its tasks and connections end, its bytes stay (the
    /// kernel's page cache), and copies written since their last flush come back suspect at
    /// their last flushed version ([`MemStore::killed`]).
    pub fn kill(&mut self, i: usize) {
        self.stop(i, MemStore::killed);
    }

    /// Gives node `i`, which is down, an empty store: a replaced disk, which joins as a new
    /// node would, holding nothing.
    pub fn wipe(&mut self, i: usize) {
        let n = &mut self.nodes[i];
        assert!(n.up.is_none(), "node {i} is up: stop it first");
        n.store = Arc::new(MemStore::default());
        if n.meta.is_some() {
            n.meta = Some(Arc::default());
        }
    }

    fn stop(&mut self, i: usize, after: fn(&MemStore) -> MemStore) {
        let n = &mut self.nodes[i];
        if let Some((rt, running)) = n.up.take() {
            self.net.close(n.addr);
            running.halt();
            rt.shutdown_background();
            n.store = Arc::new(after(&n.store));
        }
    }

    /// The epoch node `i` is in (None while it is down).
    pub fn epoch(&self, i: usize) -> Option<u32> {
        self.node(i).map(|n| n.epoch().view.epoch)
    }

    /// Waits until every node that is up sees exactly `n` members; panics after 30 s.
    pub fn wait_members(&self, n: usize) {
        self.wait_members_within(n, std::time::Duration::from_secs(30));
    }

    /// [`MemCluster::wait_members`] with a deadline of `within`.
    pub fn wait_members_within(&self, n: usize, within: std::time::Duration) {
        self.wait_within("members", within, || {
            self.nodes
                .iter()
                .filter_map(|x| x.up.as_ref())
                .all(|(_, r)| r.node.epoch().view.nodes.len() == n)
        });
    }

    /// Waits until every node that is up has finished recovery of its current epoch.
    pub fn wait_recovered(&self) {
        self.wait_recovered_within(std::time::Duration::from_secs(30));
    }

    /// [`MemCluster::wait_recovered`] with a deadline of `within`.
    pub fn wait_recovered_within(&self, within: std::time::Duration) {
        self.wait_within("recovery", within, || {
            self.nodes
                .iter()
                .filter_map(|x| x.up.as_ref())
                .all(|(_, r)| {
                    let s = r.node.recovery_status();
                    s.epoch == r.node.epoch().view.epoch
                        && s.state == objstore_proto::api::RecoveryState::Done
                })
        });
    }

    fn wait_within(&self, what: &str, within: std::time::Duration, mut cond: impl FnMut() -> bool) {
        let deadline = std::time::Instant::now() + within;
        while !cond() {
            assert!(
                std::time::Instant::now() < deadline,
                "timed out waiting for {what}"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// Every node whose store holds `oid` (nodes down included) holds the same bytes and
    /// state; returns how many hold it. Panics naming the object otherwise.
    pub fn replicas_agree(&self, oid: objstore_proto::oid::ObjectId) -> usize {
        use crate::store::ObjectBackend;
        let copies: Vec<_> = self
            .nodes
            .iter()
            .filter_map(|n| n.store.read_whole(oid).ok())
            .collect();
        for w in copies.windows(2) {
            if w[0] != w[1] {
                let at = w[0].0.iter().zip(&w[1].0).position(|(a, b)| a != b);
                panic!(
                    "replicas of {oid} differ: {:?} ({} bytes) and {:?} ({} bytes), first at byte {at:?}; all: {:?}",
                    w[0].1,
                    w[0].0.len(),
                    w[1].1,
                    w[1].0.len(),
                    copies.iter().map(|c| c.1).collect::<Vec<_>>()
                );
            }
        }
        copies.len()
    }

    /// Runs one scrub pass on node `i` now, at no rate limit (`sheep --scrub-rate` without its
    /// interval), and returns it; None if the node stopped meanwhile. Node `i` must be up.
    pub fn scrub(&self, i: usize) -> Option<objstore_proto::api::ScrubPass> {
        let (rt, running) = self.nodes[i].up.as_ref().expect("node is up");
        let node = running.node.clone();
        rt.block_on(async move { node.scrub_now().await })
    }

    /// A client on the in-memory network (call inside a tokio runtime).
    pub async fn client(&self, opts: ClientOptions) -> Result<Client, ClientError> {
        Client::connect_via(Arc::new(self.net.clone()), &self.addrs(), opts).await
    }

    /// A client whose operations give up after `timeout`, connected on `rt` (for tests that
    /// drive the cluster from a plain thread).
    pub fn client_on(
        &self,
        rt: &tokio::runtime::Runtime,
        timeout: std::time::Duration,
    ) -> Arc<Client> {
        let opts = ClientOptions {
            timeout,
            ..ClientOptions::default()
        };
        Arc::new(rt.block_on(self.client(opts)).expect("client"))
    }
}

impl Drop for MemCluster {
    fn drop(&mut self) {
        for i in 0..self.nodes.len() {
            self.crash(i);
        }
    }
}
