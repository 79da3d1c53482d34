//! Helpers shared by the cluster test files (each file uses some of them).
#![allow(dead_code)]

use serde_json::Value;
use testkit::cluster::{Bins, Cluster};
use testkit::replicas;

pub const MIB: u64 = 1 << 20;

pub fn bins() -> Bins {
    Bins::fresh()
}

pub fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

pub fn object(data: &[u8], i: u64) -> &[u8] {
    &data[(i * MIB) as usize..((i + 1) * MIB) as usize]
}

/// Node `addr`'s recovery state as `dog node recovery` shows it ("recovering", "done", ...).
pub fn recovery_state(c: &Cluster, addr: &str) -> String {
    let rows = c.dog_json(&["node", "recovery"]);
    rows.as_array()
        .unwrap()
        .iter()
        .find(|r| r["addr"] == addr)
        .map(|r| match &r["status"]["recovery"]["state"] {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
        .unwrap_or_else(|| "not a member".into())
}

/// Adds a node slot to the cluster (not started); returns its index.
pub fn add_node(c: &mut Cluster) -> usize {
    c.nodes.push(None);
    c.ports.push(testkit::free_port());
    c.node_args.push(Vec::new());
    c.nodes.len() - 1
}

pub fn live_node(c: &Cluster) -> usize {
    c.nodes
        .iter()
        .position(|n| n.is_some())
        .expect("a live node")
}

/// SIGKILL to all of `nodes` first, then reaping: no epoch in between in which a survivor could
/// copy from one of them.
pub fn kill_at_once(c: &mut Cluster, nodes: &[usize]) {
    for &i in nodes {
        // SAFETY: signals to children of this process, reaped by kill9 below.
        unsafe {
            libc::kill(
                c.nodes[i].as_ref().unwrap().pid() as libc::pid_t,
                libc::SIGKILL,
            )
        };
    }
    for &i in nodes {
        c.kill9(i);
    }
}

/// A pair of nodes holding both copies of some data objects of VDI `name` (returned with their ids) but not
/// both copies of the inode.
pub fn lost_pair(c: &Cluster, name: &str) -> ((usize, usize), Vec<(u64, String)>) {
    let objs = replicas::objects(c, name).unwrap();
    let inode = objs.iter().find(|o| o.index.is_none()).unwrap().addrs();
    (0..c.nodes.len())
        .flat_map(|a| (a + 1..c.nodes.len()).map(move |b| (a, b)))
        .map(|(a, b)| {
            let pair = sorted(vec![c.addr(a), c.addr(b)]);
            let lost: Vec<(u64, String)> = objs
                .iter()
                .filter(|o| o.index.is_some() && o.addrs() == pair)
                .map(|o| (o.index.unwrap(), o.oid.clone().unwrap()))
                .collect();
            ((a, b), lost, pair)
        })
        .find(|(_, lost, pair)| !lost.is_empty() && inode != *pair)
        .map(|(p, lost, _)| (p, lost))
        .expect("some pair of nodes holds both copies of a data object")
}

/// A child process killed and reaped if the test fails before it waits for it.
pub struct KillOnDrop(pub Option<std::process::Child>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A tmpfs of a given size over a directory, detached on drop (even when the test fails).
pub struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    pub fn mount(dir: &std::path::Path, size: &str) -> Tmpfs {
        std::fs::create_dir_all(dir).unwrap();
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "mount a tmpfs on {}: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        Tmpfs(dir.to_path_buf())
    }

    pub fn resize(&self, size: &str) {
        let out = std::process::Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.0)
            .output()
            .expect("run mount");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        testkit::mount::detach(&self.0);
    }
}

/// Discards `[offset, offset+len)` of VDI `name` through the client library (dog has no
/// discard command; sheepfs turns hole punching into this call).
pub fn discard(c: &Cluster, name: &str, offset: u64, len: u64) {
    use objstore_client::{Client, Vdi};
    let addr: std::net::SocketAddr = c.addr(live_node(c)).parse().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let client = std::sync::Arc::new(
            Client::connect(&[addr], testkit::auth::client_options())
                .await
                .unwrap(),
        );
        let v = Vdi::open(client, name).await.unwrap();
        v.discard(offset, len).await.unwrap();
        v.flush().await.unwrap();
    });
}
