//! `sheep`: the storage node daemon.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use objstore_node::{Node, NodeOptions};

/// A storage node: keeps objects under DIR and serves them to clients and peers.
#[derive(Parser)]
#[command(version, about, long_about = None)]
struct Args {
    /// Data directory (objects and the node's identity); created if missing.
    #[arg(long)]
    dir: PathBuf,
    /// Address to serve on.
    #[arg(long, default_value = "127.0.0.1:7000")]
    listen: SocketAddr,
    /// Membership driver: local:STATE_DIR (nodes on one host share STATE_DIR) or
    /// etcd://HOST:PORT[,HOST:PORT...][/PREFIX] (nodes on many hosts; PREFIX default /sheep).
    #[arg(long)]
    cluster: String,
    /// How long the cluster keeps a silent node (etcd: its lease TTL, whole seconds, e.g. 5s).
    /// A node cut off from etcd this long stops serving I/O until it hears from etcd again.
    #[arg(long, default_value = "5s", value_parser = parse_ttl)]
    lease_ttl: std::time::Duration,
    /// Failure domain; copies of one object go to distinct zones. Default: one zone per node.
    #[arg(long)]
    zone: Option<u32>,
    /// Virtual nodes on the placement ring (the node's weight; scale it with capacity).
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..=65536))]
    vnodes: u32,
    /// Test hook: milliseconds to pause before each recovery pull (keeps a node recovering
    /// long enough for a test to read from it meanwhile).
    #[arg(long, default_value_t = 0, hide = true)]
    test_pull_delay_ms: u64,
    /// Log filter when RUST_LOG is not set.
    #[arg(long, default_value = "info")]
    log: String,
}

/// A lease TTL: a human duration of whole seconds, 1s to 1h.
fn parse_ttl(s: &str) -> Result<std::time::Duration, String> {
    let d = objstore_proto::duration::parse_duration(s).map_err(|e| e.to_string())?;
    if d.subsec_nanos() != 0 || d.as_secs() < 1 || d.as_secs() > 3600 {
        return Err(format!("'{s}': a lease TTL is whole seconds from 1s to 1h"));
    }
    Ok(d)
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&args.log));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    rt.block_on(async {
        let running = Node::start(NodeOptions {
            dir: args.dir.clone(),
            listen: args.listen,
            cluster: args.cluster.clone(),
            zone: args.zone,
            vnodes: args.vnodes,
            pull_delay: std::time::Duration::from_millis(args.test_pull_delay_ms),
            driver_opts: objstore_node::membership::DriverOptions {
                lease_ttl: args.lease_ttl,
            },
        })
        .await
        .with_context(|| format!("sheep on {} could not start", args.listen))?;
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: leaving"),
            _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: leaving"),
        }
        running.shutdown().await;
        Ok(())
    })
}
