//! `sheep`: the storage node daemon.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::{CommandFactory, Parser};
use objstore_node::{Access, Limits, Node, NodeOptions};
use objstore_proto::auth::KeyFile;

/// `sheep`'s command line.
#[derive(Parser)]
#[command(
    name = "sheep",
    version,
    about = "sheep: a storage node of the cluster; stores object copies on a local disk and \
serves them",
    long_about = "sheep: a storage node of the cluster. It stores copies of the VDIs' objects as \
files under --dir and serves them over TCP to clients (dog, sheepfs) and to the other nodes. \
Nodes find each other through a membership driver (--cluster): local:STATE_DIR for nodes on one \
host, etcd://... for nodes on several hosts. Run one sheep per data disk; every node of a \
cluster needs the cluster key (--key-file).",
    after_help = "Example: sheep --dir /srv/sheep/disk0 --listen 10.0.0.1:7000 \
--cluster etcd://10.0.0.1:2379/sheep --zone 1 --key-file /etc/sheep/cluster.key\n\
SIGTERM or SIGINT: the node leaves the cluster at once, then exits. Guide: docs/README.md"
)]
// The field docs are `--help` text, not rustdoc: `[/PREFIX]` is an optional part, not a link.
#[allow(rustdoc::broken_intra_doc_links)]
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
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u32).range(1..=objstore_proto::view::MAX_VNODES as i64))]
    vnodes: u32,
    /// Disk I/O errors (reads, writes, fsyncs) within --io-error-window after which the node
    /// fences itself: it leaves the cluster, serves no object I/O, and recovery restores its
    /// copies on the other nodes. 0: never fenced (errors are still counted and the copies
    /// they hit restored from other replicas).
    #[arg(long, default_value_t = objstore_node::health::DEFAULT_LIMIT)]
    io_error_limit: u32,
    /// The window --io-error-limit counts errors in (e.g. 10m, 60s).
    #[arg(long, default_value = "10m", value_parser = parse_window)]
    io_error_window: std::time::Duration,
    /// Serve Prometheus metrics over HTTP at ADDR (GET /metrics), e.g. 127.0.0.1:9100.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<SocketAddr>,
    /// Test hook: milliseconds to pause before each recovery pull (keeps a node recovering
    /// long enough for a test to read from it meanwhile).
    #[arg(long, default_value_t = 0, hide = true)]
    test_pull_delay_ms: u64,
    /// Background scrub: bytes per second it reads at most while it verifies this node's
    /// copies (e.g. 10M, 512K; a trailing /s is allowed); 0 turns the scrub off.
    #[arg(long, default_value = "10M", value_parser = parse_rate)]
    scrub_rate: u64,
    /// Time from the start of one scrub pass to the start of the next (e.g. 24h, 30m, 10s).
    #[arg(long, default_value = "24h", value_parser = parse_interval)]
    scrub_interval: std::time::Duration,
    /// The cluster key file (one key of 64 hex digits a line, two during a rotation; mode
    /// 0600): every connection, from clients and from other nodes, must prove it holds the
    /// key. Made by 'dog cluster key new PATH' or 'dog cluster format --key-file PATH'; it may
    /// appear after the node starts (it is read again whenever it changes).
    #[arg(long, env = "SHEEP_KEY_FILE")]
    key_file: Option<PathBuf>,
    /// Serve without a cluster key: anyone who reaches the port can read, change and delete
    /// every VDI. Only for a node no one else can reach.
    #[arg(long, conflicts_with = "key_file")]
    no_auth: bool,
    /// Open connections the node keeps at most (clients and peers, authenticated or not);
    /// one more is refused with LimitReached.
    #[arg(long, default_value_t = objstore_node::node::gate::DEFAULT_MAX_CONNECTIONS)]
    max_connections: usize,
    /// Requests in flight on one connection; past it the node stops reading that connection
    /// until answers go out.
    #[arg(long, default_value_t = objstore_node::node::gate::DEFAULT_MAX_REQUESTS)]
    max_requests: usize,
    /// Bytes in flight on one connection (request payloads plus the answers of reads), e.g.
    /// 64M; past it the node stops reading that connection until answers go out.
    #[arg(long, default_value = "64M", value_parser = parse_size)]
    max_inflight: u64,
    /// How long a new connection has to prove it holds the cluster key before it is closed
    /// (so idle unauthenticated connections do not pile up): 5s, 500ms.
    #[arg(long, default_value = "5s", value_parser = parse_handshake_timeout)]
    handshake_timeout: std::time::Duration,
    /// Log filter when RUST_LOG is not set.
    #[arg(long, default_value = "info")]
    log: String,
}

fn parse_handshake_timeout(s: &str) -> Result<std::time::Duration, String> {
    let d = objstore_proto::duration::parse_duration(s).map_err(|e| e.to_string())?;
    if d.is_zero() || d.as_secs() > 600 {
        return Err(format!("'{s}': expected more than 0 and at most 10m"));
    }
    Ok(d)
}

fn parse_size(s: &str) -> Result<u64, String> {
    let n = objstore_proto::size::parse_size(s).map_err(|e| e.to_string())?;
    if n < 1 << 20 || n > u32::MAX as u64 {
        return Err(format!("'{s}': expected 1M to 4G"));
    }
    Ok(n)
}

/// The key and limits from the command line. A node without a key must be asked for
/// explicitly (`--no-auth`), and says so loudly.
fn access(args: &Args) -> anyhow::Result<Access> {
    let key = match (&args.key_file, args.no_auth) {
        (Some(path), _) => {
            let kf = KeyFile::new(path);
            match kf.keys() {
                Ok(keys) => tracing::info!(
                    "cluster key from {} ({} key(s))",
                    path.display(),
                    keys.all().len()
                ),
                Err(e) => tracing::warn!(
                    "every connection is refused until the cluster key can be read: {e}"
                ),
            }
            Some(Arc::new(kf))
        }
        (None, true) => {
            tracing::warn!(
                "RUNNING WITHOUT A CLUSTER KEY (--no-auth): anyone who reaches {} can read, change and delete every VDI",
                args.listen
            );
            None
        }
        (None, false) => anyhow::bail!(
            "no cluster key: give --key-file PATH (or SHEEP_KEY_FILE); make one with 'dog cluster key new PATH'. --no-auth runs without one (anyone who reaches the port can read and destroy every VDI)"
        ),
    };
    if args.max_connections == 0 || args.max_requests == 0 {
        anyhow::bail!("--max-connections and --max-requests must be at least 1");
    }
    Ok(Access {
        key,
        limits: Limits {
            max_connections: args.max_connections,
            max_requests: args.max_requests,
            max_bytes: args.max_inflight as usize,
            handshake_timeout: args.handshake_timeout,
        },
    })
}

/// A lease TTL: a human duration of whole seconds, 1s to 1h.
fn parse_ttl(s: &str) -> Result<std::time::Duration, String> {
    let d = objstore_proto::duration::parse_duration(s).map_err(|e| e.to_string())?;
    if d.subsec_nanos() != 0 || d.as_secs() < 1 || d.as_secs() > 3600 {
        return Err(format!("'{s}': a lease TTL is whole seconds from 1s to 1h"));
    }
    Ok(d)
}

/// The --io-error-window: a human duration from 1s to 1 day.
fn parse_window(s: &str) -> Result<std::time::Duration, String> {
    let d = objstore_proto::duration::parse_duration(s).map_err(|e| e.to_string())?;
    if d.as_secs() < 1 || d.as_secs() > 86_400 {
        return Err(format!("'{s}': the error window is from 1s to 1 day"));
    }
    Ok(d)
}

/// A scrub rate: a human size per second (`10M`, `10M/s`, `0`).
fn parse_rate(s: &str) -> Result<u64, String> {
    let bytes = s.strip_suffix("/s").unwrap_or(s);
    objstore_proto::size::parse_size(bytes).map_err(|e| format!("scrub rate '{s}': {e}"))
}

/// A scrub interval: a human duration of at least 1s.
fn parse_interval(s: &str) -> Result<std::time::Duration, String> {
    let d = objstore_proto::duration::parse_duration(s).map_err(|e| e.to_string())?;
    if d < std::time::Duration::from_secs(1) {
        return Err(format!("'{s}': a scrub interval is at least 1s"));
    }
    Ok(d)
}

fn main() -> anyhow::Result<()> {
    clidoc::run_if_asked("sheep", "8", Args::command);
    let args = Args::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&args.log));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    let access = access(&args)?;
    match objstore_proto::rlimit::raise_open_files() {
        Ok(n) => tracing::info!("open-file limit: {n}"),
        Err(e) => tracing::warn!("could not raise the open-file limit: {e}"),
    }
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
            settle_from: objstore_node::node::SETTLE_FROM,
            driver_opts: objstore_node::membership::DriverOptions {
                lease_ttl: args.lease_ttl,
            },
            health: objstore_node::health::HealthOptions {
                limit: args.io_error_limit,
                window: args.io_error_window,
            },
            scrub: objstore_node::node::ScrubOptions {
                rate: args.scrub_rate,
                interval: args.scrub_interval,
            },
            access,
        })
        .await
        .with_context(|| format!("sheep on {} could not start", args.listen))?;
        if let Some(addr) = args.metrics {
            let l = objstore_node::metrics::http::bind(addr)
                .await
                .with_context(|| format!("cannot serve metrics on {addr}"))?;
            tracing::info!("metrics at http://{}/metrics", l.local_addr()?);
            tokio::spawn(objstore_node::metrics::http::serve(running.node.clone(), l));
        }
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: leaving"),
            _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: leaving"),
        }
        running.shutdown().await;
        Ok(())
    })
}
