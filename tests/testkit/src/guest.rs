//! A real VM, booted by a real qemu and live-migrated between qemu processes while it writes
//! to its disk (issue 42: live migration of a running VM between hosts).
//!
//! ```text
//!          boot                 migrate(B)                 migrate(A)            finish
//!   qemu-1 ───────► writing ──► qemu-2 -incoming ───────► qemu-3 -incoming ───► "stop" on ttyS0
//!   disk A                      disk B                     disk A                GUEST-SUM, poweroff
//!          QMP migrate, poll query-migrate, source quit once the destination runs
//! ```
//!
//! The guest ([`GuestImage`], built by `scripts/fetch-guest.sh` from Debian packages, which
//! documents it): Debian's cloud kernel and a busybox initramfs whose `/init` loads
//! virtio-blk, then writes the counter pattern of [`pattern`] to `/dev/vda` without pause
//! (O_DIRECT and fsync per 4 KiB block, some 100 writes a second under TCG here), printing
//! `GUEST-W <i>` after each. On `stop` from the host on its console it finishes the block in
//! hand, prints `GUEST-LAST <i>` and `GUEST-SUM <sha256 of /dev/vda>` (read back through the
//! page-cache-dropped device, so through the last qemu) and powers off.
//!
//! Each [`Qemu`] runs TCG (`-accel tcg`: no KVM on these machines), 256 MiB, `-nodefaults
//! -no-reboot -display none`, the disk as `-drive file=PATH,<GuestConfig::drive>`, its
//! serial console on a unix-socket chardev with a log file (qemu logs the output whether or
//! not anyone is connected; the harness connects only to send `stop`), and QMP on a unix
//! socket ([`qmp::Qmp`]). [`Guest::migrate`] starts the destination with `-incoming defer`,
//! `migrate-incoming` on a unix socket (or loopback TCP), `migrate` on the source, polls
//! `query-migrate` until `completed`, waits for the destination to run, then quits the
//! source, which was paused since the switch-over. [`Migration::downtime`] is qemu's own
//! measure of that pause. Every process is a [`Proc`]: killed by pid on drop, pass or fail,
//! with the consoles' and qemu's log tails printed when the test panics.
//!
//! Shared storage and locking: source and destination have the disk open at the same time.
//! qemu's image locking (`file.locking`, on by default for local files: OFD locks on bytes
//! of the image) lets them: the destination opens the image inactive and takes no write lock
//! until the switch-over, when the source has flushed and given up its own. So two qemu
//! processes on one local path need nothing special, and [`LOCAL_DRIVE`] keeps the default.
//!
//! The sheepfs test (two mounts of one VDI as two hosts sharing storage): boot on
//! `mount_a/VDI`, migrate to `mount_b/VDI`, back to `mount_a/VDI`, with `drive` =
//! [`LOCAL_DRIVE`] (`cache=none` works: sheepfs serves O_DIRECT, as its qemu-io tests show),
//! or `cache=directsync` to make every guest write synchronous. How qemu 7.2 moves the image
//! (strace): the waiting destination opens it read-only; at the switch-over the source
//! flushes, opens it again read-only and closes its read-write descriptor, and a few
//! milliseconds later the destination opens it read-write. A mount without a cache thus
//! usually sees the lock released by the source's close before the destination's open takes
//! it; a mount with a cache keeps it after the close, and the destination's first write asks
//! for it (sheepfs's cooperative hand-over). qemu's own OFD locks stay local to each
//! mount (FUSE without lock support), so they neither help nor hinder there.

mod image;
pub mod pattern;
pub mod qmp;

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::{log_tail, or_panic, output, try_free_port, try_wait_until, Error, Proc, Result};
pub use image::GuestImage;
pub use pattern::{check as check_pattern, PatternReport};
use qmp::Qmp;

/// Drive options for a raw image on a local file system: host page cache bypassed
/// (O_DIRECT), a thread pool for I/O, qemu's default image locking.
pub const LOCAL_DRIVE: &str = "format=raw,if=virtio,cache=none,aio=threads";

/// Where a unix socket path must fit (`sun_path`, NUL included).
const SUN_PATH_MAX: usize = 108;

/// How migrations travel between qemu processes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// A unix socket in the guest's directory.
    Unix,
    /// A free port on 127.0.0.1.
    Tcp,
}

/// How the guest and its qemu processes run.
#[derive(Debug, Clone)]
pub struct GuestConfig {
    /// `-drive` options after `file=`, the same on every host: [`LOCAL_DRIVE`], or with
    /// `cache=writeback` (host page cache, for a file system without O_DIRECT) or
    /// `cache=directsync` (every write synchronous); `file.locking=off` drops qemu's
    /// image locks.
    pub drive: String,
    pub memory_mib: u32,
    /// `-accel`: `tcg` (no KVM here).
    pub accel: String,
    /// The guest's write slots, 4 KiB each from offset 0 (the disk must hold them). The
    /// default, 4096 (16 MiB), outnumbers the writes of a test of a minute or so, so every
    /// write the guest made is checked, none overwritten by a later one.
    pub slots: u64,
    /// A pause after each guest write; zero writes as fast as the disk allows.
    pub pace: Duration,
    pub transport: Transport,
    /// The migration's bandwidth cap, bytes/s (qemu's default: 128 MiB/s). The default,
    /// 32 MiB/s, makes a migration last a few seconds, so the guest writes some hundreds of
    /// blocks while its memory is copied.
    pub max_bandwidth: u64,
    /// The pause qemu aims for at switch-over (its default: 300 ms).
    pub downtime_limit: Duration,
    /// From qemu's start until the guest writes (TCG boots in seconds; shared cores vary).
    pub boot_timeout: Duration,
    /// From `migrate` until `query-migrate` says completed.
    pub migrate_timeout: Duration,
    /// For one QMP answer.
    pub qmp_timeout: Duration,
    /// From `stop` until `GUEST-DONE` (the guest reads its whole disk).
    pub finish_timeout: Duration,
}

impl Default for GuestConfig {
    fn default() -> GuestConfig {
        GuestConfig {
            drive: LOCAL_DRIVE.into(),
            memory_mib: 256,
            accel: "tcg".into(),
            slots: 4096,
            pace: Duration::ZERO,
            transport: Transport::Unix,
            max_bandwidth: 32 << 20,
            downtime_limit: Duration::from_millis(300),
            boot_timeout: Duration::from_secs(180),
            migrate_timeout: Duration::from_secs(300),
            qmp_timeout: Duration::from_secs(60),
            finish_timeout: Duration::from_secs(180),
        }
    }
}

/// One qemu process: its QMP connection, console and disk.
pub struct Qemu {
    proc: Proc,
    qmp: Qmp,
    disk: PathBuf,
    serial: PathBuf,
    console: PathBuf,
}

impl Qemu {
    /// Starts qemu number `n` on `disk` (as a migration destination if `incoming`) with its
    /// sockets and logs in `dir`, and connects to its QMP socket.
    fn start(
        image: &GuestImage,
        cfg: &GuestConfig,
        disk: &Path,
        dir: &Path,
        n: usize,
        incoming: bool,
    ) -> Result<Qemu> {
        let qmp_sock = socket_path(dir, &format!("qmp-{n}.sock"))?;
        let serial = socket_path(dir, &format!("serial-{n}.sock"))?;
        let console = dir.join(format!("console-{n}.log"));
        let mut cmd = Command::new(&image.qemu);
        cmd.args(["-machine", "pc", "-accel", &cfg.accel, "-smp", "1"])
            .args(["-m", &format!("{}M", cfg.memory_mib)])
            .args([
                "-nodefaults",
                "-no-user-config",
                "-no-reboot",
                "-display",
                "none",
            ])
            .arg("-kernel")
            .arg(&image.kernel)
            .arg("-initrd")
            .arg(&image.initrd)
            .arg("-append")
            .arg(format!(
                "console=ttyS0 loglevel=3 panic=-1 guest.slots={} guest.pace={}",
                cfg.slots,
                cfg.pace.as_secs_f64()
            ))
            .arg("-drive")
            .arg(format!("file={},{}", opt_value(disk), cfg.drive))
            .arg("-chardev")
            .arg(format!(
                "socket,id=ser0,path={},server=on,wait=off,logfile={}",
                opt_value(&serial),
                opt_value(&console)
            ))
            .args(["-serial", "chardev:ser0"])
            .arg("-qmp")
            .arg(format!("unix:{},server=on,wait=off", opt_value(&qmp_sock)));
        if incoming {
            cmd.args(["-incoming", "defer"]);
        }
        let name = format!("qemu-{n}");
        let mut proc = Proc::try_spawn(&name, cmd, &dir.join(format!("{name}.log")))?;
        let qmp = Qmp::connect(&qmp_sock, &mut proc, cfg.boot_timeout, cfg.qmp_timeout)?;
        Ok(Qemu {
            proc,
            qmp,
            disk: disk.to_path_buf(),
            serial,
            console,
        })
    }

    pub fn name(&self) -> &str {
        self.proc.name()
    }

    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    pub fn disk(&self) -> &Path {
        &self.disk
    }

    /// Its QMP connection, for commands the harness does not wrap.
    pub fn qmp(&mut self) -> &mut Qmp {
        &mut self.qmp
    }

    /// `query-status`: `running`, `paused`, `inmigrate`, `postmigrate`, ...
    pub fn status(&mut self) -> Result<String> {
        let st = self.qmp.execute("query-status", json!({}))?;
        Ok(st["status"].as_str().unwrap_or("?").to_string())
    }

    /// `quit`, then up to `grace` for the process to exit; killed after that.
    fn quit(&mut self, grace: Duration) {
        let _ = self.qmp.execute("quit", json!({}));
        if self.proc.wait_exit(grace).is_none() {
            eprintln!("{} did not quit within {grace:?}: killed", self.name());
            self.proc.kill9();
        }
    }
}

/// One live migration, as qemu measured it.
#[derive(Debug, Clone)]
pub struct Migration {
    pub from: PathBuf,
    pub to: PathBuf,
    /// The guest's pause at switch-over (`query-migrate` `downtime`).
    pub downtime: Duration,
    /// From `migrate` to completion (`total-time`).
    pub total: Duration,
    /// Before the first RAM was sent (`setup-time`).
    pub setup: Duration,
    /// RAM bytes sent, and how many passes over dirty memory it took.
    pub ram_transferred: u64,
    pub dirty_syncs: u64,
    /// The guest's acknowledged writes when the migration started, and when it completed.
    pub writes_before: u64,
    pub writes_after: u64,
}

/// What the guest reported as it finished.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    /// Its last acknowledged write.
    pub last: u64,
    /// The sha256 of its whole disk, hex.
    pub sum: String,
}

/// A running guest and the qemu that currently runs it.
pub struct Guest {
    image: GuestImage,
    cfg: GuestConfig,
    dir: PathBuf,
    qemu: Option<Qemu>,
    started: usize,
    consoles: Vec<PathBuf>,
    migrations: Vec<Migration>,
    boot_time: Duration,
}

impl Guest {
    /// Boots the guest on `disk` (sockets and logs in `dir`), and waits until it writes.
    pub fn try_boot(
        image: &GuestImage,
        cfg: GuestConfig,
        disk: &Path,
        dir: &Path,
    ) -> Result<Guest> {
        let t0 = Instant::now();
        let qemu = Qemu::start(image, &cfg, disk, dir, 1, false)?;
        let mut g = Guest {
            image: image.clone(),
            consoles: vec![qemu.console.clone()],
            qemu: Some(qemu),
            cfg,
            dir: dir.to_path_buf(),
            started: 1,
            migrations: Vec::new(),
            boot_time: Duration::ZERO,
        };
        g.wait_console("the guest to start writing", g.cfg.boot_timeout, |c| {
            c.contains("GUEST-WRITING")
        })?;
        g.boot_time = t0.elapsed();
        Ok(g)
    }

    /// Like [`Guest::try_boot`]; panics on failure.
    #[track_caller]
    pub fn boot(image: &GuestImage, cfg: GuestConfig, disk: &Path, dir: &Path) -> Guest {
        or_panic(Guest::try_boot(image, cfg, disk, dir))
    }

    /// From qemu's start until the guest wrote.
    pub fn boot_time(&self) -> Duration {
        self.boot_time
    }

    pub fn config(&self) -> &GuestConfig {
        &self.cfg
    }

    /// The configuration the next migration uses: its transport, bandwidth and timeouts may
    /// change between migrations; the drive options and memory must stay what the guest was
    /// booted with (the destination's devices must match the source's).
    pub fn config_mut(&mut self) -> &mut GuestConfig {
        &mut self.cfg
    }

    /// The qemu running the guest now (None once it finished).
    pub fn qemu(&mut self) -> Option<&mut Qemu> {
        self.qemu.as_mut()
    }

    /// The migrations so far, oldest first.
    pub fn migrations(&self) -> &[Migration] {
        &self.migrations
    }

    /// The guest's console so far, every qemu's in turn.
    pub fn console(&self) -> String {
        self.consoles
            .iter()
            .map(|p| String::from_utf8_lossy(&std::fs::read(p).unwrap_or_default()).into_owned())
            .collect()
    }

    /// The guest's last acknowledged write seen on its console, 0 before the first.
    pub fn writes(&self) -> u64 {
        for p in self.consoles.iter().rev() {
            if let Some(n) = last_marker(&log_tail(p, 4096), "GUEST-W ") {
                return n.parse().unwrap_or(0);
            }
        }
        0
    }

    /// Waits until the guest acknowledged write `n`; returns its count then.
    pub fn try_wait_writes(&mut self, n: u64, timeout: Duration) -> Result<u64> {
        let what = format!("guest write {n}");
        let mut seen = 0;
        try_wait_until(&what, timeout, || {
            self.check_running()?;
            seen = self.writes();
            Ok(seen >= n)
        })
        .map_err(|e| self.with_console(e))?;
        Ok(seen)
    }

    /// Like [`Guest::try_wait_writes`]; panics on failure.
    #[track_caller]
    pub fn wait_writes(&mut self, n: u64, timeout: Duration) -> u64 {
        or_panic(self.try_wait_writes(n, timeout))
    }

    /// Live-migrates the guest to a new qemu on `disk` (the same image, seen by another host)
    /// and quits the old one; returns qemu's measures.
    pub fn try_migrate(&mut self, disk: &Path) -> Result<Migration> {
        let n = self.started + 1;
        let mut dst = Qemu::start(&self.image, &self.cfg, disk, &self.dir, n, true)?;
        self.started = n;
        self.consoles.push(dst.console.clone());
        let uri = match self.cfg.transport {
            Transport::Unix => format!(
                "unix:{}",
                socket_path(&self.dir, &format!("migrate-{n}.sock"))?.display()
            ),
            Transport::Tcp => format!("tcp:127.0.0.1:{}", try_free_port()?),
        };
        dst.qmp.execute("migrate-incoming", json!({ "uri": uri }))?;
        let writes_before = self.writes();
        let cfg = self.cfg.clone();
        let src = self.qemu.as_mut().ok_or_else(|| finished("migrate"))?;
        src.qmp.execute(
            "migrate-set-parameters",
            json!({
                "max-bandwidth": cfg.max_bandwidth,
                "downtime-limit": cfg.downtime_limit.as_millis() as u64,
            }),
        )?;
        src.qmp.execute("migrate", json!({ "uri": uri }))?;
        let mut done = Value::Null;
        let waited = try_wait_until(
            &format!("migration {} -> {}", src.name(), dst.name()),
            cfg.migrate_timeout,
            || {
                src.proc.check_alive()?;
                dst.proc.check_alive()?;
                let st = src.qmp.execute("query-migrate", json!({}))?;
                match st["status"].as_str() {
                    // qemu says completed a moment before it has its timings: until then
                    // total-time reads 0.
                    Some("completed") if st["total-time"].as_u64().unwrap_or(0) > 0 => {
                        done = st;
                        Ok(true)
                    }
                    Some(s @ ("failed" | "cancelled")) => Err(Error::Unexpected {
                        what: "the migration".into(),
                        detail: format!(
                            "{s}: {}",
                            st["error-desc"].as_str().unwrap_or("no reason given")
                        ),
                    }),
                    _ => Ok(false),
                }
            },
        );
        if let Err(e) = waited {
            let _ = src.qmp.execute("migrate_cancel", json!({}));
            return Err(self.with_console(e));
        }
        let running = try_wait_until(
            &format!("{} to run after the migration", dst.name()),
            cfg.qmp_timeout,
            || {
                dst.proc.check_alive()?;
                match dst.status()?.as_str() {
                    "running" => Ok(true),
                    // It could not take the image over (an open refused at the switch-over):
                    // it stays paused; its log says why.
                    s @ ("io-error" | "internal-error" | "shutdown" | "guest-panicked") => {
                        Err(Error::Unexpected {
                            what: format!("{} after the migration", dst.name()),
                            detail: format!("status {s}"),
                        })
                    }
                    _ => Ok(false),
                }
            },
        );
        if let Err(e) = running {
            // Its own log says why (an image it could not open, say).
            let e = Error::Unexpected {
                what: e.chain(),
                detail: format!("{} log (end):\n{}", dst.name(), dst.proc.log_tail(1500)),
            };
            return Err(self.with_console(e));
        }
        let ms = |k: &str| Duration::from_millis(done[k].as_u64().unwrap_or(0));
        let m = Migration {
            from: src.disk.clone(),
            to: dst.disk.clone(),
            downtime: ms("downtime"),
            total: ms("total-time"),
            setup: ms("setup-time"),
            ram_transferred: done["ram"]["transferred"].as_u64().unwrap_or(0),
            dirty_syncs: done["ram"]["dirty-sync-count"].as_u64().unwrap_or(0),
            writes_before,
            writes_after: self.writes(),
        };
        // The source stays paused ("postmigrate") until it is told to go.
        let mut old = self.qemu.replace(dst).expect("a source");
        old.quit(Duration::from_secs(30));
        self.migrations.push(m.clone());
        Ok(m)
    }

    /// Like [`Guest::try_migrate`]; panics on failure.
    #[track_caller]
    pub fn migrate(&mut self, disk: &Path) -> Migration {
        or_panic(self.try_migrate(disk))
    }

    /// Tells the guest to stop writing, waits for its checksum and its power-off.
    pub fn try_finish(&mut self) -> Result<Finished> {
        let q = self.qemu.as_mut().ok_or_else(|| finished("finish"))?;
        let mut s = UnixStream::connect(&q.serial)
            .map_err(|e| Error::io(format!("connecting to {}", q.serial.display()), e))?;
        s.write_all(b"stop\n")
            .map_err(|e| Error::io("sending stop to the guest", e))?;
        // Read what qemu sends on the socket (it is in the log too), so the console never
        // waits on a full socket; the thread ends when qemu closes it.
        let mut drain = s
            .try_clone()
            .map_err(|e| Error::io("duplicating the console socket", e))?;
        std::thread::spawn(move || std::io::copy(&mut drain, &mut std::io::sink()));
        let timeout = self.cfg.finish_timeout;
        self.wait_console("GUEST-DONE", timeout, |c| c.contains("GUEST-DONE"))?;
        let text = self.console();
        let field = |m: &str| {
            last_marker(&text, m).ok_or_else(|| Error::Unexpected {
                what: "the guest's console".into(),
                detail: format!("no {m} line before GUEST-DONE"),
            })
        };
        let last = field("GUEST-LAST ")?;
        let fin = Finished {
            last: last.parse().map_err(|_| Error::Unexpected {
                what: "the guest's console".into(),
                detail: format!("GUEST-LAST {last:?}"),
            })?,
            sum: field("GUEST-SUM ")?.to_string(),
        };
        let mut q = self.qemu.take().expect("checked above");
        if q.proc.wait_exit(Duration::from_secs(60)).is_none() {
            eprintln!("{} did not power off: quit", q.name());
            q.quit(Duration::from_secs(10));
        }
        Ok(fin)
    }

    /// Like [`Guest::try_finish`]; panics on failure.
    #[track_caller]
    pub fn finish(&mut self) -> Finished {
        or_panic(self.try_finish())
    }

    /// An error if the guest failed (`GUEST-FAIL`) or its qemu exited.
    fn check_running(&mut self) -> Result<()> {
        let q = self.qemu.as_mut().ok_or_else(|| finished("run"))?;
        if let Some(why) = last_marker(&log_tail(&q.console, 4096), "GUEST-FAIL ") {
            return Err(Error::Unexpected {
                what: "the guest".into(),
                detail: why.to_string(),
            });
        }
        q.proc.check_alive()
    }

    /// Polls the current console until `done` holds for it, failing early as
    /// [`Guest::check_running`] does.
    fn wait_console(
        &mut self,
        what: &str,
        timeout: Duration,
        done: impl Fn(&str) -> bool,
    ) -> Result<()> {
        try_wait_until(what, timeout, || {
            let q = self.qemu.as_mut().ok_or_else(|| finished(what))?;
            let text = String::from_utf8_lossy(&std::fs::read(&q.console).unwrap_or_default())
                .into_owned();
            if done(&text) {
                return Ok(true);
            }
            self.check_running()?;
            Ok(false)
        })
        .map_err(|e| self.with_console(e))
    }

    /// `e` with the end of the guest's console on its current qemu.
    fn with_console(&self, e: Error) -> Error {
        let console = self.qemu.as_ref().map(|q| &q.console);
        let tail = console
            .or(self.consoles.last())
            .map(|p| log_tail(p, 1500))
            .unwrap_or_default();
        Error::Unexpected {
            what: e.chain(),
            detail: format!("guest console (end):\n{tail}"),
        }
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for p in &self.consoles {
                eprintln!(
                    "---- guest console {} (tail) ----\n{}",
                    p.display(),
                    log_tail(p, 1500)
                );
            }
        }
        // Each qemu's Proc kills it (by pid, with its group) as it drops.
    }
}

/// The sha256 of a file, hex, as the guest prints it (`sha256sum`).
pub fn sha256_file(path: &Path) -> Result<String> {
    let mut cmd = Command::new("sha256sum");
    cmd.arg(path);
    let out = output(cmd, "sha256sum")?;
    let text = String::from_utf8_lossy(&out);
    Ok(text
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string())
}

fn finished(what: &str) -> Error {
    Error::Unexpected {
        what: what.into(),
        detail: "the guest has finished: no qemu runs it".into(),
    }
}

/// What follows `marker` on the last complete line containing it.
fn last_marker<'a>(text: &'a str, marker: &str) -> Option<&'a str> {
    let complete = &text[..text.rfind('\n')? + 1];
    complete.lines().rev().find_map(|l| {
        let at = l.find(marker)?;
        Some(l[at + marker.len()..].trim_end_matches('\r').trim())
    })
}

/// A path as a qemu option value (commas doubled).
fn opt_value(p: &Path) -> String {
    p.display().to_string().replace(',', ",,")
}

/// `dir/name`, if it fits in a unix socket address.
fn socket_path(dir: &Path, name: &str) -> Result<PathBuf> {
    let p = dir.join(name);
    if p.as_os_str().len() >= SUN_PATH_MAX {
        return Err(Error::Unexpected {
            what: format!("the socket {}", p.display()),
            detail: format!("longer than a unix socket path may be ({SUN_PATH_MAX} bytes): use a shorter directory"),
        });
    }
    let _ = std::fs::remove_file(&p);
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markers_come_from_complete_lines_only() {
        let text = "GUEST-W 1\r\nGUEST-W 2\r\n[ 3.1] noise GUEST-W 3\r\nGUEST-W 4";
        assert_eq!(last_marker(text, "GUEST-W "), Some("3"));
        assert_eq!(last_marker("GUEST-W 5", "GUEST-W "), None);
        assert_eq!(
            last_marker("x\nGUEST-SUM ab12 \r\n", "GUEST-SUM "),
            Some("ab12")
        );
        assert_eq!(opt_value(Path::new("/a,b/c")), "/a,,b/c");
    }
}
