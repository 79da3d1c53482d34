//! `dog`: the cluster administration tool, shaped after Sheepdog's.

mod backup;
mod check;
mod cluster;
mod key;
mod mount;
mod snap;
mod stat;
mod vdi;

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{CommandFactory, Parser, Subcommand};
use objstore_client::{Client, ClientOptions};
use objstore_proto::auth::KeyFile;
use objstore_proto::size::parse_size;

/// `dog`'s command line.
#[derive(Parser)]
#[command(
    name = "dog",
    version,
    about = "dog: administer a sheep cluster: format it, watch its nodes and recovery, and \
create, snapshot, check and back up its virtual disks (VDIs)",
    long_about = None,
    after_help = "dog talks to the nodes named by --address (default 127.0.0.1:7000, or \
$DOG_ADDRESS) and proves it holds the cluster key (--key-file, or $SHEEP_KEY_FILE). \
Every command takes --help. Guide: docs/README.md"
)]
struct Args {
    /// Node(s) to talk to, comma-separated HOST:PORT.
    #[arg(
        short,
        long,
        global = true,
        default_value = "127.0.0.1:7000",
        env = "DOG_ADDRESS"
    )]
    address: String,
    /// How long an operation keeps retrying (dead or hung nodes, epoch changes) before it
    /// fails: 30s, 2m, 500ms; a plain number is seconds.
    #[arg(long, global = true, value_parser = duration_arg, default_value = "30s")]
    timeout: Duration,
    /// How long one request to one node may go unanswered before that node counts as hung
    /// for it (a read moves to another replica, a write is retried); at most --timeout.
    #[arg(long, global = true, value_parser = duration_arg, default_value = "5s")]
    request_timeout: Duration,
    /// Print JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,
    /// The cluster key file the nodes were given (every connection proves it holds the key).
    /// With 'cluster format', a missing file is created with a new key.
    #[arg(long, global = true, env = "SHEEP_KEY_FILE")]
    key_file: Option<PathBuf>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// The whole cluster: its key, format, status, recovery after losses, check.
    #[command(subcommand)]
    Cluster(cluster::ClusterCmd),
    /// The storage nodes: their disks, recovery, scrub and counters.
    #[command(subcommand)]
    Node(cluster::NodeCmd),
    /// Virtual disk images (VDIs): create, list, read, write, snapshot, back up, check.
    #[command(subcommand)]
    Vdi(vdi::VdiCmd),
}

/// A duration argument: `5s`, `500ms`, `2m`, `30` (seconds).
fn duration_arg(s: &str) -> Result<Duration, String> {
    objstore_proto::duration::parse_duration(s).map_err(|e| e.to_string())
}

/// A size argument: `10G`, `512M`, `4096`.
pub fn size_arg(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| e.to_string())
}

fn addresses(spec: &str) -> anyhow::Result<Vec<SocketAddr>> {
    let mut out = Vec::new();
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let addrs = part
            .to_socket_addrs()
            .with_context(|| format!("bad address '{part}': expected HOST:PORT"))?;
        out.extend(addrs);
    }
    if out.is_empty() {
        bail!("no address given");
    }
    Ok(out)
}

pub struct Ctx {
    pub client: Arc<Client>,
    pub json: bool,
}

impl Ctx {
    /// Prints `value` as JSON when asked to, else `human`.
    pub fn print<T: serde::Serialize>(&self, value: &T, human: impl FnOnce() -> String) {
        if self.json {
            println!(
                "{}",
                serde_json::to_string_pretty(value).expect("serializable")
            );
        } else {
            print!("{}", human());
        }
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    let cmd = match args.cmd {
        Cmd::Cluster(cluster::ClusterCmd::Key(k)) => return key::key(k, args.json),
        cmd => cmd,
    };
    if let (Cmd::Cluster(cluster::ClusterCmd::Format { .. }), Some(path)) = (&cmd, &args.key_file) {
        key::create_for_format(path)?;
    }
    let addrs = addresses(&args.address)?;
    if args.request_timeout.is_zero() {
        bail!("--request-timeout must be more than 0");
    }
    let opts = ClientOptions {
        timeout: args.timeout,
        // A short --timeout shortens requests too: one request never outlasts its operation.
        request_timeout: args
            .request_timeout
            .min(args.timeout.max(Duration::from_millis(1))),
        key: args.key_file.map(|p| Arc::new(KeyFile::new(p))),
    };
    let client = Arc::new(Client::connect(&addrs, opts).await?);
    let ctx = Ctx {
        client,
        json: args.json,
    };
    match cmd {
        Cmd::Cluster(c) => cluster::cluster(&ctx, c).await,
        Cmd::Node(c) => cluster::node(&ctx, c).await,
        Cmd::Vdi(c) => vdi::vdi(&ctx, c).await,
    }
}

fn main() -> ExitCode {
    clidoc::run_if_asked("dog", "8", Args::command);
    // Output into a pipe whose reader has gone (`dog vdi list | head -1`) ends dog quietly,
    // as it ends cat, instead of failing on the next print.
    // SAFETY: restoring the default action of a signal, before any thread is started.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error")),
        )
        .with_writer(std::io::stderr)
        .init();
    let rt = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("dog: cannot start: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("dog: {e:#}");
            ExitCode::FAILURE
        }
    }
}
