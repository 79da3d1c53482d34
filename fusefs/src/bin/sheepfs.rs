//! `sheepfs`: mount the cluster's VDIs as files.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, ToSocketAddrs};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Parser;
use fusefs::mount::{check_mountpoint, config};
use fusefs::SheepFs;
use objstore::{Client, ClientOptions};

const READY: &str = "sheepfs-ready";

/// Mount every VDI of a sheep cluster as a file at MOUNTPOINT (use them as raw disks).
#[derive(Parser)]
#[command(version, about, long_about = None)]
struct Args {
    /// Node(s) of the cluster, comma-separated HOST:PORT.
    #[arg(long)]
    cluster: String,
    /// An empty directory to mount on.
    mountpoint: PathBuf,
    /// Stay in the foreground (otherwise return once the mount is ready, serving in the
    /// background).
    #[arg(short, long)]
    foreground: bool,
    /// Seconds an I/O keeps retrying an unreachable cluster before it fails with EIO.
    #[arg(long, default_value_t = 30)]
    timeout: u64,
    /// Let other users (e.g. a qemu running as another user) use the mount.
    #[arg(long)]
    allow_other: bool,
    /// FUSE threads, each with its own /dev/fuse descriptor.
    #[arg(long, default_value_t = 4)]
    threads: usize,
    /// Log file (default: stderr).
    #[arg(long)]
    log_file: Option<PathBuf>,
    /// Object cache directory (the object cache is not available yet).
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// Object cache size, e.g. 10G (with --cache-dir).
    #[arg(long)]
    cache_size: Option<String>,
    /// Object cache mode: writeback, writethrough or off (with --cache-dir).
    #[arg(long)]
    cache_mode: Option<String>,
}

fn addresses(spec: &str) -> anyhow::Result<Vec<SocketAddr>> {
    let mut out = Vec::new();
    for part in spec.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        out.extend(
            part.to_socket_addrs()
                .with_context(|| format!("bad cluster address '{part}': expected HOST:PORT"))?,
        );
    }
    if out.is_empty() {
        bail!("--cluster names no address");
    }
    Ok(out)
}

/// Re-runs this program in the foreground in a new session and returns once it reports the
/// mount ready (or fails).
fn daemonize() -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("finding sheepfs itself")?;
    let mut cmd = Command::new(exe);
    cmd.args(std::env::args_os().skip(1))
        .arg("--foreground")
        .env("SHEEPFS_NOTIFY", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    // SAFETY: setsid is async-signal-safe; it detaches the child from our terminal.
    unsafe {
        cmd.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = cmd.spawn().context("starting sheepfs in the background")?;
    let mut line = String::new();
    let _ = BufReader::new(child.stdout.take().unwrap()).read_line(&mut line);
    if line.trim() == READY {
        return Ok(());
    }
    let status = child.wait()?;
    bail!("sheepfs could not mount ({status})")
}

fn notify_ready() {
    if std::env::var_os("SHEEPFS_NOTIFY").is_none() {
        return;
    }
    let mut out = std::io::stdout();
    let _ = writeln!(out, "{READY}");
    let _ = out.flush();
    // Nobody reads our stdout any more: point it at /dev/null.
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        use std::os::unix::io::AsRawFd;
        // SAFETY: dup2 onto stdout with a valid descriptor.
        unsafe { libc::dup2(null.as_raw_fd(), 1) };
    }
}

fn init_logs(file: Option<&PathBuf>) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let b = tracing_subscriber::fmt().with_env_filter(filter);
    match file {
        Some(p) => {
            let f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .with_context(|| format!("opening log file {}", p.display()))?;
            b.with_ansi(false).with_writer(Arc::new(f)).init();
        }
        None => b.with_writer(std::io::stderr).init(),
    }
    Ok(())
}

fn serve(args: Args) -> anyhow::Result<()> {
    init_logs(args.log_file.as_ref())?;
    if args.cache_dir.is_some() || args.cache_size.is_some() || args.cache_mode.is_some() {
        bail!("the object cache (--cache-dir, --cache-size, --cache-mode) is not available yet: mount without it");
    }
    let mountpoint = check_mountpoint(&args.mountpoint)?;
    let addrs = addresses(&args.cluster)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let opts = ClientOptions {
        timeout: Duration::from_secs(args.timeout),
        request_timeout: Duration::from_secs(args.timeout.max(1)),
    };
    let client = rt
        .block_on(Client::connect(&addrs, opts))
        .with_context(|| format!("cannot reach the cluster at {}", args.cluster))?;
    if client.view().info.config.is_none() {
        bail!(
            "the cluster at {} is not formatted: run 'dog cluster format' first",
            args.cluster
        );
    }
    let fs = SheepFs::new(Arc::new(client), rt.handle().clone());
    let mut session = fuser::Session::new(fs, &mountpoint, &config(args.allow_other, args.threads))
        .with_context(|| format!("cannot mount on {}", mountpoint.display()))?;
    let mut unmounter = session.unmount_callable();
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("fuse".into())
        .spawn(move || {
            let _ = done_tx.send(session.run());
        })
        .context("starting the FUSE session")?;
    tracing::info!("mounted {} from {}", mountpoint.display(), args.cluster);
    notify_ready();

    rt.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())?;
        let mut hup = signal(SignalKind::hangup())?;
        tokio::select! {
            r = done_rx => {
                if let Ok(Err(e)) = r {
                    tracing::error!("FUSE session ended: {e}");
                } else {
                    tracing::info!("unmounted {}", mountpoint.display());
                }
                return Ok(());
            }
            _ = term.recv() => tracing::info!("SIGTERM: unmounting {}", mountpoint.display()),
            _ = hup.recv() => tracing::info!("SIGHUP: unmounting {}", mountpoint.display()),
            _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT: unmounting {}", mountpoint.display()),
        }
        if let Err(e) = unmounter.unmount() {
            tracing::warn!("unmount {}: {e}; detaching it (open files get errors)", mountpoint.display());
            if let Ok(c) = std::ffi::CString::new(mountpoint.as_os_str().to_string_lossy().as_bytes()) {
                // SAFETY: a valid NUL-terminated path.
                unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
            }
        }
        Ok::<(), anyhow::Error>(())
    })?;
    rt.shutdown_timeout(Duration::from_secs(2));
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    let res = if args.foreground {
        serve(args)
    } else {
        daemonize()
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sheepfs: {e:#}");
            ExitCode::FAILURE
        }
    }
}
