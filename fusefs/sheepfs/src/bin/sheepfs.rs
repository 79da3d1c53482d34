//! `sheepfs`: mount the cluster's VDIs as files.

use std::ffi::OsString;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, ToSocketAddrs};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use cache_control::CacheMode;
use clap::{CommandFactory, FromArgMatches, Parser};
use objcache::{Cache, CacheConfig};
use objstore_client::{Client, ClientOptions};
use sheepfs::mount::{check_mountpoint, config, set_thread_sched, FuseSched};
use sheepfs::{fstab, LockMode, SheepFs, WriteLocks};

const READY: &str = "sheepfs-ready";

/// `sheepfs`'s command line.
#[derive(Parser)]
#[command(
    version,
    about = "sheepfs: mount the cluster's virtual disks as files, one per VDI, for qemu to use \
as raw disks",
    long_about = "sheepfs: mount the cluster's virtual disks as files. Every VDI appears as a \
regular file at the root of MOUNTPOINT (snapshots as read-only NAME@TAG files) that qemu, \
qemu-img and fio use as a raw disk; creating a file creates a VDI, growing it resizes it, \
removing it deletes it. With --cache-dir, a local object cache on fast disk sits between the \
mount and the cluster (control it with cachectl).",
    after_help = "Example: sheepfs --cluster 10.0.0.1:7000,10.0.0.2:7000 /mnt/sheep \
--key-file /etc/sheep/cluster.key --cache-dir /var/cache/sheepfs --cache-size 20G\n\
Unmount with: umount MOUNTPOINT (or fusermount3 -u). Guide: docs/sheepfs.md"
)]
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
    /// How long a read, write or fsync keeps retrying (unreachable, hung or changing nodes)
    /// before it fails with EIO: 30s, 2m, 500ms; a plain number is seconds.
    #[arg(long, value_parser = duration_arg, default_value = "30s")]
    timeout: Duration,
    /// How long one request to one node may go unanswered before that node counts as hung
    /// for it: a read moves to another replica, a write is retried on a fresh view. Keep it
    /// well under --timeout (it is capped at --timeout), so a hung node costs a pause and not
    /// an error.
    #[arg(long, value_parser = duration_arg, default_value = "5s")]
    request_timeout: Duration,
    /// Let other users (e.g. a qemu running as another user) use the mount.
    #[arg(long)]
    allow_other: bool,
    /// FUSE threads, each with its own /dev/fuse descriptor.
    #[arg(long, default_value_t = 4)]
    threads: usize,
    /// Scheduling policy of the FUSE threads: batch serves a guest that waits on each
    /// request (iodepth 1) on its own CPU more often (docs/sheepfs.md).
    #[arg(long, value_enum, default_value = "batch")]
    fuse_sched: FuseSched,
    /// The cluster key file the nodes were given (every connection proves it holds the key).
    #[arg(long, env = "SHEEP_KEY_FILE")]
    key_file: Option<PathBuf>,
    /// Log file (default: stderr).
    #[arg(long)]
    log_file: Option<PathBuf>,
    /// Object cache directory on fast local disk (created if missing). Without it there is
    /// no cache.
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    /// Object cache size bound, e.g. 10G.
    #[arg(long, value_parser = size_arg, default_value = "1G")]
    cache_size: u64,
    /// Default cache mode for VDIs: writeback, writethrough or off.
    #[arg(long, default_value = "writeback")]
    cache_mode: CacheMode,
    /// Dirty bytes the background flusher keeps the cache under (default: a quarter of
    /// --cache-size).
    #[arg(long, value_parser = size_arg)]
    cache_max_dirty: Option<u64>,
    /// Seconds after which dirty data is pushed even below --cache-max-dirty.
    #[arg(long, default_value_t = 10)]
    cache_max_dirty_age: u64,
    /// A sequential read of a VDI longer than this is a stream (a copy, a backup, a scan):
    /// past it, an object the stream misses is cached only the second time a stream passes
    /// through it, so a one-off pass neither slows down to fill the cache nor pushes hotter
    /// data out. 0 caches every stream on its first pass.
    #[arg(long, value_parser = size_arg, default_value = "16M")]
    cache_sequential_cutoff: u64,
    /// The VDIs this mount opens read-write (with a cache: attaches) are locked under a
    /// lease of this TTL (whole seconds, 1s to 1h), renewed every third of it through any
    /// node. If this sheepfs dies, or cannot reach the cluster for that long, its locks free
    /// themselves: another host may then attach the VDI without 'dog vdi lock break'.
    #[arg(long, value_parser = lock_ttl_arg, default_value = "15s")]
    lock_ttl: Duration,
    /// Without a cache: open VDIs read-write without taking their attachment lock, so this
    /// mount writes a VDI that another mount or host holds, and is not refused by it (for
    /// tools that coordinate writers themselves). Each file's first write still bumps the
    /// VDI's generation, so caches elsewhere drop what they hold of it when they next attach.
    /// Not with --cache-dir (the cache always locks what it attaches).
    #[arg(long)]
    no_lock: bool,
    /// What a read-write open does while another mount holds the VDI's lock. cooperative:
    /// it opens, and its first write asks the holder to hand the lock over (the holder
    /// flushes and releases it; its own next write asks it back), as RBD's exclusive lock
    /// does: live migration works. With a cache, the holder pushes its dirty data and drops
    /// what it cached of the VDI before it lets go. exclusive: the open is refused with EBUSY.
    #[arg(long, value_enum, default_value = "cooperative")]
    lock_mode: LockModeArg,
    /// How long a write waits for another mount to hand the VDI's lock over (a holder that
    /// died or hangs lets it go when its lease ends, --lock-ttl): then the write fails with EIO.
    #[arg(long, value_parser = duration_arg, default_value = "30s")]
    handover_timeout: Duration,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum LockModeArg {
    Cooperative,
    Exclusive,
}

fn lock_ttl_arg(s: &str) -> Result<Duration, String> {
    let d = duration_arg(s)?;
    if d.subsec_nanos() != 0 || d.as_secs() < 1 || d.as_secs() > 3600 {
        return Err(format!("'{s}': a lock TTL is whole seconds from 1s to 1h"));
    }
    Ok(d)
}

fn duration_arg(s: &str) -> Result<Duration, String> {
    objstore_proto::duration::parse_duration(s).map_err(|e| e.to_string())
}

fn size_arg(s: &str) -> Result<u64, String> {
    objstore_proto::size::parse_size(s).map_err(|e| e.to_string())
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

/// Re-runs this program with `args` in the foreground in a new session and returns once it
/// reports the mount ready (or fails).
fn daemonize(args: Vec<OsString>) -> anyhow::Result<()> {
    let exe = std::env::current_exe().context("finding sheepfs itself")?;
    let mut cmd = Command::new(exe);
    cmd.args(args)
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

/// Tells the waiting parent the mount is up. With `--log-file`, stderr is let go too: the
/// parent's caller (mount(8), a pipe) must not wait for the daemon to close it.
fn notify_ready(logs_to_file: bool) {
    if std::env::var_os("SHEEPFS_NOTIFY").is_none() {
        return;
    }
    let mut out = std::io::stdout();
    let _ = writeln!(out, "{READY}");
    let _ = out.flush();
    // Nobody reads our stdout any more: point it at /dev/null.
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        use std::os::unix::io::AsRawFd;
        // SAFETY: dup2 onto stdout (and stderr) with a valid descriptor.
        unsafe {
            libc::dup2(null.as_raw_fd(), 1);
            if logs_to_file {
                libc::dup2(null.as_raw_fd(), 2);
            }
        }
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

/// Every cached object keeps its two files open: lifts the soft limit on open files to the
/// hard one (a 10 GiB cache of 4 MiB objects alone needs over 5,000).
fn raise_fd_limit() {
    match objstore_proto::rlimit::raise_open_files() {
        Ok(n) => tracing::info!("open-file limit: {n}"),
        Err(e) => tracing::warn!("could not raise the open-file limit: {e}"),
    }
}

fn client_options(args: &Args) -> anyhow::Result<ClientOptions> {
    if args.request_timeout.is_zero() {
        bail!("--request-timeout must be more than 0");
    }
    Ok(ClientOptions {
        timeout: args.timeout,
        // A short --timeout shortens requests too: one request never outlasts its operation.
        request_timeout: args
            .request_timeout
            .min(args.timeout.max(Duration::from_millis(1))),
        key: args
            .key_file
            .as_ref()
            .map(|p| Arc::new(objstore_proto::auth::KeyFile::new(p))),
    })
}

fn serve(args: Args) -> anyhow::Result<()> {
    init_logs(args.log_file.as_ref())?;
    if args.cache_dir.is_none() && std::env::args().any(|a| a.starts_with("--cache-")) {
        bail!("--cache-size, --cache-mode, --cache-max-dirty* and --cache-sequential-cutoff need --cache-dir");
    }
    if args.cache_dir.is_some() && args.no_lock {
        bail!(
            "--no-lock is for a mount without a cache: the cache always locks the VDIs it attaches"
        );
    }
    if args.cache_size < 16 << 20 {
        bail!(
            "--cache-size {} is too small: at least 16M",
            args.cache_size
        );
    }
    raise_fd_limit();
    let mountpoint = check_mountpoint(&args.mountpoint)?;
    let addrs = addresses(&args.cluster)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let opts = client_options(&args)?;
    let client = rt
        .block_on(Client::connect(&addrs, opts))
        .with_context(|| format!("cannot reach the cluster at {}", args.cluster))?;
    if client.view().info.config.is_none() {
        bail!(
            "the cluster at {} is not formatted: run 'dog cluster format' first",
            args.cluster
        );
    }
    let client = Arc::new(client);
    let cache = match &args.cache_dir {
        None => None,
        Some(dir) => {
            let cfg = CacheConfig {
                dir: dir.clone(),
                size: args.cache_size,
                mode: args.cache_mode,
                max_dirty: args
                    .cache_max_dirty
                    .unwrap_or(args.cache_size / 4)
                    .min(args.cache_size),
                max_dirty_age: Duration::from_secs(args.cache_max_dirty_age),
                sequential_cutoff: args.cache_sequential_cutoff,
                lock_ttl: args.lock_ttl,
            };
            let _guard = rt.enter();
            let cache = Cache::open(cfg, client.clone())
                .with_context(|| format!("cannot use cache directory {}", dir.display()))?;
            cache.start(rt.handle())?;
            Some(cache)
        }
    };
    let locks = (!args.no_lock).then(|| WriteLocks {
        mountpoint: mountpoint.to_string_lossy().into_owned(),
        ttl: args.lock_ttl,
        mode: match args.lock_mode {
            LockModeArg::Cooperative => LockMode::Cooperative,
            LockModeArg::Exclusive => LockMode::Exclusive,
        },
        handover_timeout: args.handover_timeout,
    });
    let fs = SheepFs::new(client, cache.clone(), locks, rt.handle().clone());
    if let Some(cache) = &cache {
        let _guard = rt.enter();
        fs.serve_control().with_context(|| {
            format!("cache directory {}: control socket", cache.dir().display())
        })?;
    }
    let mut session = fuser::Session::new(fs, &mountpoint, &config(args.allow_other, args.threads))
        .with_context(|| format!("cannot mount on {}", mountpoint.display()))?;
    let mut unmounter = session.unmount_callable();
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let fuse_sched = args.fuse_sched;
    std::thread::Builder::new()
        .name("fuse".into())
        .spawn(move || {
            // The session's threads are started by this one and inherit its policy.
            if let Err(e) = set_thread_sched(fuse_sched) {
                tracing::warn!(
                    "--fuse-sched {fuse_sched:?}: {e}; FUSE threads keep the default policy"
                );
            }
            let _ = done_tx.send(session.run());
        })
        .context("starting the FUSE session")?;
    tracing::info!("mounted {} from {}", mountpoint.display(), args.cluster);
    notify_ready(args.log_file.is_some());

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
            let open_files = if cache.is_some() {
                "files still open are written straight to the cluster while the cache pushes its dirty data, and get errors once it is done"
            } else {
                "open files get errors"
            };
            tracing::warn!("unmount {}: {e}; detaching it: {open_files}", mountpoint.display());
            if let Ok(c) = std::ffi::CString::new(mountpoint.as_os_str().to_string_lossy().as_bytes()) {
                // SAFETY: a valid NUL-terminated path.
                unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
            }
        }
        Ok::<(), anyhow::Error>(())
    })?;
    if let Some(cache) = cache {
        tracing::info!("pushing the cache's dirty data before exit");
        let left = rt.block_on(cache.shutdown());
        sheepfs::socket::remove(cache.dir());
        if left > 0 {
            tracing::error!(
                "{} of unpushed writes stay in {}; they are pushed at the next mount",
                objstore_proto::size::format_size(left),
                cache.dir().display()
            );
            rt.shutdown_timeout(Duration::from_secs(2));
            bail!(
                "{} of unpushed writes stay in {} (the cluster did not take them); they are pushed at the next mount",
                objstore_proto::size::format_size(left),
                cache.dir().display()
            );
        }
        tracing::info!("cache clean: every write is in the cluster");
    }
    rt.shutdown_timeout(Duration::from_secs(2));
    Ok(())
}

/// The command line: the `Args` definition, with the mount(8) and fstab spellings of its
/// options in the long help (and so in the man page).
fn command() -> clap::Command {
    Args::command().after_long_help(fstab::LONG_HELP)
}

fn main() -> ExitCode {
    clidoc::run_if_asked("sheepfs", "8", command);
    let mut argv = std::env::args_os();
    let helper = argv.next().is_some_and(|a| fstab::called_as_helper(&a));
    let mut args_only: Vec<OsString> = argv.collect();
    if helper {
        // mount(8)'s own statuses: 1 for a bad command line, 32 for a mount that failed.
        match fstab::sheepfs_args(&command(), &args_only) {
            Ok(fstab::Request::Fake) => return ExitCode::SUCCESS,
            Ok(fstab::Request::Mount(a)) => args_only = a,
            Err(e) => {
                eprintln!("{}: {e}", fstab::HELPER);
                return ExitCode::from(1);
            }
        }
    }
    let matches = command()
        .get_matches_from(std::iter::once(OsString::from("sheepfs")).chain(args_only.clone()));
    let args = match Args::from_arg_matches(&matches) {
        Ok(a) => a,
        Err(e) => e.exit(),
    };
    let res = if args.foreground {
        serve(args)
    } else {
        daemonize(args_only)
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if helper => {
            eprintln!("{}: {e:#}", fstab::HELPER);
            ExitCode::from(32)
        }
        Err(e) => {
            eprintln!("sheepfs: {e:#}");
            ExitCode::FAILURE
        }
    }
}
