//! The command line and what each command does.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::Duration;

use anyhow::bail;
use cache_control::CacheMode;
use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use objstore_proto::duration::parse_duration;
use objstore_proto::size::{format_size, parse_size};
use serde_json::json;

use crate::client::{dirty_of, Client, Target};
use crate::render;

/// `cachectl`'s command line.
#[derive(Parser, Debug)]
#[command(
    name = "cachectl",
    version,
    about = "cachectl: inspect, flush and evict the local object cache of a running sheepfs mount",
    long_about = "cachectl: inspect, flush and evict the local object cache of a running sheepfs \
mount. It talks to the mount through the control socket in the mount's cache directory (name the \
directory with --cache-dir DIR, or the socket with --socket PATH); run it as the user who \
mounted.",
    after_help = "Examples:\n  cachectl --cache-dir /var/cache/sheepfs stats\n  \
cachectl --cache-dir /var/cache/sheepfs flush disk0 --timeout 30s\n\
Guide: docs/cache.md",
    override_usage = "cachectl [--cache-dir DIR | --socket PATH] [--json] <COMMAND>"
)]
pub struct Args {
    /// The sheepfs cache directory (its control socket is DIR/control.sock).
    #[arg(long, value_name = "DIR", global = true, conflicts_with = "socket")]
    pub cache_dir: Option<PathBuf>,
    /// The control socket itself, instead of --cache-dir.
    #[arg(long, value_name = "PATH", global = true)]
    pub socket: Option<PathBuf>,
    /// Print JSON instead of text.
    #[arg(long, global = true)]
    pub json: bool,
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Show the cache's size, usage, dirty data and hit ratio, and a line per VDI.
    Stats {
        /// Only this VDI.
        vdi: Option<String>,
        /// Print Prometheus text exposition instead.
        #[arg(long, conflicts_with = "json")]
        prometheus: bool,
    },
    /// Push dirty data (of one VDI, or all) to the cluster, and wait until it is there.
    Flush {
        /// Only this VDI.
        vdi: Option<String>,
        /// Fail (exit status 1) unless the flush is done within this long, e.g. 30s, 5m
        /// (sheepfs goes on with it; what is not pushed yet stays dirty).
        #[arg(long, value_name = "DURATION", value_parser = duration_arg)]
        timeout: Option<Duration>,
    },
    /// Drop cached data (of one VDI, or all); dirty data is flushed first.
    Evict {
        /// Only this VDI.
        vdi: Option<String>,
        /// Throw away dirty data instead of flushing it: writes not yet on the cluster are lost.
        #[arg(long)]
        discard_dirty: bool,
        /// Confirm --discard-dirty.
        #[arg(long, requires = "discard_dirty")]
        yes: bool,
    },
    /// Change the cache's size bound, e.g. 20G.
    Resize {
        #[arg(value_parser = size_arg)]
        size: u64,
    },
    /// Change a VDI's cache mode (leaving writeback flushes first; applies at once, to files
    /// already open too).
    Mode {
        vdi: String,
        #[arg(value_name = "writeback|writethrough|off")]
        mode: CacheMode,
    },
    /// Take snapshot VDI@TAG of a VDI this mount has attached, pushing its cached writes first.
    ///
    /// Its writes wait, its dirty data is pushed and flushed, the snapshot is taken, and the mount goes on with the VDI
    /// (`dog vdi snapshot` asks the mount the same way when it finds the VDI attached here).
    Snapshot {
        vdi: String,
        /// The snapshot's tag (default: the time, e.g. 2025-01-31-12-00-00).
        #[arg(short = 's', long)]
        tag: Option<String>,
    },
    /// Roll a VDI back to snapshot NAME@TAG, dropping what this mount cached of it.
    ///
    /// Unpushed writes are dropped too (a rollback discards everything written since the
    /// snapshot); its open files go on reading the rolled-back data.
    Rollback {
        #[arg(value_name = "NAME@TAG")]
        snapshot: String,
        /// Confirm: writes made since the snapshot are lost.
        #[arg(long)]
        yes: bool,
    },
}

/// A duration argument: `30s`, `500ms`, `5m`, `30` (seconds).
pub fn duration_arg(s: &str) -> Result<Duration, String> {
    let d = parse_duration(s).map_err(|e| e.to_string())?;
    if d.is_zero() {
        return Err("must be more than 0".into());
    }
    Ok(d)
}

/// A size argument: `10G`, `512M`, `4096`.
pub fn size_arg(s: &str) -> Result<u64, String> {
    parse_size(s).map_err(|e| e.to_string())
}

impl Args {
    /// Where the control socket is: from `--cache-dir` or `--socket`, one of which is required.
    pub fn target(&self) -> anyhow::Result<Target> {
        match (&self.cache_dir, &self.socket) {
            (Some(dir), _) => Ok(Target::cache_dir(dir)),
            (None, Some(sock)) => Ok(Target::socket(sock)),
            (None, None) => bail!(
                "which cache? pass --cache-dir DIR (the sheepfs cache directory) or --socket PATH"
            ),
        }
    }
}

/// Prints `value` as JSON when asked to, else `human`.
fn print(
    out: &mut dyn Write,
    json: bool,
    value: serde_json::Value,
    human: impl FnOnce() -> String,
) -> anyhow::Result<()> {
    let text = if json {
        serde_json::to_string_pretty(&value)? + "\n"
    } else {
        human()
    };
    emit(out, &text)
}

/// Writes `text`; a reader that went away (`| head`) is not an error.
fn emit(out: &mut dyn Write, text: &str) -> anyhow::Result<()> {
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        r => Ok(r?),
    }
}

fn of_vdi(vdi: &Option<String>) -> String {
    vdi.as_ref()
        .map(|v| format!(" of VDI '{v}'"))
        .unwrap_or_default()
}

/// A bar of bytes pushed, drawn on stderr only when it is a terminal.
fn flush_bar() -> Option<ProgressBar> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let pb = ProgressBar::with_draw_target(Some(0), ProgressDrawTarget::stderr());
    pb.set_style(
        ProgressStyle::with_template(
            "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    pb.set_message("flushing");
    Some(pb)
}

pub fn run(args: Args, out: &mut dyn Write) -> anyhow::Result<()> {
    let client = Client::new(args.target()?);
    let json = args.json;
    match args.cmd {
        Cmd::Stats { vdi, prometheus } => {
            let stats = client.stats(vdi)?;
            if prometheus {
                emit(out, &render::prometheus(&stats))?;
            } else {
                print(out, json, serde_json::to_value(&stats)?, || {
                    render::human(&stats)
                })?;
            }
        }
        Cmd::Flush { vdi, timeout } => {
            let bar = flush_bar();
            let res = client.flush(
                vdi.clone(),
                &mut |pushed, total| {
                    if let Some(pb) = &bar {
                        pb.set_length(total.max(pushed));
                        pb.set_position(pushed);
                    }
                },
                timeout,
            );
            if let Some(pb) = bar {
                pb.finish_and_clear();
            }
            let bytes = res?;
            print(out, json, json!({ "vdi": vdi, "flushed": bytes }), || {
                format!("flushed {}{}\n", format_size(bytes), of_vdi(&vdi))
            })?;
        }
        Cmd::Evict {
            vdi,
            discard_dirty,
            yes,
        } => {
            if discard_dirty && !yes {
                let stats = client.stats(vdi.clone())?;
                let dirty = dirty_of(&stats, vdi.as_deref());
                bail!(
                    "refusing to evict with --discard-dirty: it throws away writes not yet on the \
                     cluster; this would discard {} of dirty data{}; add --yes",
                    format_size(dirty),
                    of_vdi(&vdi)
                );
            }
            let (bytes, discarded) = client.evict(vdi.clone(), discard_dirty)?;
            print(
                out,
                json,
                json!({ "vdi": vdi, "evicted": bytes, "discarded_dirty": discarded }),
                || {
                    let mut s = format!("evicted {}{}", format_size(bytes), of_vdi(&vdi));
                    if discarded > 0 {
                        s += &format!(
                            "; discarded {} of dirty data (never pushed to the cluster)",
                            format_size(discarded)
                        );
                    }
                    s + "\n"
                },
            )?;
        }
        Cmd::Resize { size } => {
            let size = client.resize(size)?;
            print(out, json, json!({ "size": size }), || {
                format!("cache size is now {}\n", format_size(size))
            })?;
        }
        Cmd::Mode { vdi, mode } => {
            let (vdi, mode, attached) = client.mode(vdi, mode)?;
            print(
                out,
                json,
                json!({ "vdi": vdi, "mode": mode, "attached": attached }),
                || mode_line(&vdi, mode, attached),
            )?;
        }
        Cmd::Snapshot { vdi, tag } => {
            let done = client.snapshot(vdi, tag)?;
            print(out, json, serde_json::to_value(&done)?, || {
                switched_text(&done, false)
            })?;
        }
        Cmd::Rollback { snapshot, yes } => {
            if !yes {
                bail!(
                    "refusing to roll back without --yes: everything written to the VDI since \
                     '{snapshot}' is lost, unpushed writes in this cache included"
                );
            }
            let done = client.rollback(snapshot)?;
            print(out, json, serde_json::to_value(&done)?, || {
                switched_text(&done, true)
            })?;
        }
    }
    Ok(())
}

/// What `cachectl snapshot | rollback` (and `dog`, asking a mount) print.
pub fn switched_text(d: &cache_control::Switched, rollback: bool) -> String {
    let mut s = if rollback {
        format!(
            "rolled VDI '{}' back to '{}' (now id {:x})\n",
            d.vdi, d.snapshot, d.new_vid
        )
    } else {
        format!(
            "took snapshot '{}' (id {:x}) of VDI '{}' (now id {:x})\n",
            d.snapshot, d.vid, d.vdi, d.new_vid
        )
    };
    if !d.attached {
        s += "the VDI was not attached to this cache: nothing cached to flush or drop\n";
        return s;
    }
    if rollback {
        s += &format!(
            "the cache dropped {} of the VDI, of which {} were writes never pushed to the cluster (discarded by the rollback)\n",
            format_size(d.dropped),
            format_size(d.discarded_dirty)
        );
    } else {
        s += &format!(
            "flushed {} of dirty data first; the cache dropped {} of the VDI's old inode\n",
            format_size(d.flushed),
            format_size(d.dropped)
        );
    }
    if d.open {
        s += "its open files on the mount go on with the VDI's new inode\n";
    }
    s
}

/// What `cachectl mode` prints: the new mode, and when it does not apply to the VDI's open
/// handles yet, why and when it will.
fn mode_line(vdi: &str, mode: CacheMode, attached: Option<bool>) -> String {
    let mut s = format!("VDI '{vdi}' is now {mode}\n");
    if mode != CacheMode::Off && attached == Some(false) {
        s += &format!(
            "note: '{vdi}' is not attached to this cache (no file of it is open read-write \
             here): files of it open read-only go straight to the cluster; the cache takes it \
             at its next read-write open\n"
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mode_line_says_when_the_mode_waits_for_an_open() {
        assert_eq!(
            mode_line("d", CacheMode::Writeback, Some(true)),
            "VDI 'd' is now writeback\n"
        );
        assert_eq!(
            mode_line("d", CacheMode::Off, Some(false)),
            "VDI 'd' is now off\n"
        );
        assert_eq!(
            mode_line("d", CacheMode::Writethrough, None),
            "VDI 'd' is now writethrough\n"
        );
        let waits = mode_line("d", CacheMode::Writeback, Some(false));
        assert!(waits.starts_with("VDI 'd' is now writeback\nnote: 'd' is not attached"));
        assert!(waits.contains("at its next read-write open"), "{waits}");
    }

    fn parse(args: &[&str]) -> Result<Args, clap::Error> {
        Args::try_parse_from(std::iter::once("cachectl").chain(args.iter().copied()))
    }

    #[test]
    fn command_lines() {
        let a = parse(&["--cache-dir", "/c", "stats", "disk0", "--json"]).unwrap();
        assert!(a.json);
        assert_eq!(a.target().unwrap(), Target::cache_dir("/c"));
        assert!(
            matches!(a.cmd, Cmd::Stats { vdi: Some(ref v), prometheus: false } if v == "disk0")
        );

        let a = parse(&["stats", "--socket", "/s.sock", "--prometheus"]).unwrap();
        assert_eq!(a.target().unwrap(), Target::socket("/s.sock"));

        let a = parse(&["--socket", "/s", "resize", "1.5G"]).unwrap();
        assert!(matches!(a.cmd, Cmd::Resize { size } if size == 3 << 29));

        let a = parse(&["--socket", "/s", "mode", "disk0", "writethrough"]).unwrap();
        assert!(matches!(
            a.cmd,
            Cmd::Mode {
                mode: CacheMode::Writethrough,
                ..
            }
        ));

        let a = parse(&["--socket", "/s", "flush", "disk0", "--timeout", "1.5s"]).unwrap();
        assert!(matches!(
            a.cmd,
            Cmd::Flush { vdi: Some(_), timeout: Some(t) } if t == Duration::from_millis(1500)
        ));
        let a = parse(&["--socket", "/s", "flush"]).unwrap();
        assert!(matches!(
            a.cmd,
            Cmd::Flush {
                vdi: None,
                timeout: None
            }
        ));

        let a = parse(&["--socket", "/s", "evict", "--discard-dirty", "--yes"]).unwrap();
        assert!(matches!(
            a.cmd,
            Cmd::Evict {
                vdi: None,
                discard_dirty: true,
                yes: true
            }
        ));
    }

    #[test]
    fn snapshot_command_lines() {
        let a = parse(&["--socket", "/s", "snapshot", "disk0", "-s", "before"]).unwrap();
        assert!(
            matches!(a.cmd, Cmd::Snapshot { ref vdi, tag: Some(ref t) } if vdi == "disk0" && t == "before")
        );
        let a = parse(&["--socket", "/s", "snapshot", "disk0"]).unwrap();
        assert!(matches!(a.cmd, Cmd::Snapshot { tag: None, .. }));
        let a = parse(&["--socket", "/s", "rollback", "disk0@before", "--yes"]).unwrap();
        assert!(matches!(a.cmd, Cmd::Rollback { yes: true, .. }));
        let mut out = Vec::new();
        let a = parse(&["--socket", "/nonexistent/s", "rollback", "disk0@before"]).unwrap();
        let e = run(a, &mut out).unwrap_err();
        assert!(e.to_string().contains("--yes"), "{e}");
        let d = cache_control::Switched {
            vdi: "d".into(),
            snapshot: "d@t".into(),
            vid: 1,
            new_vid: 2,
            attached: true,
            open: true,
            discarded_dirty: 4096,
            dropped: 8192,
            flushed: 0,
        };
        let t = switched_text(&d, true);
        assert!(
            t.starts_with("rolled VDI 'd' back to 'd@t' (now id 2)"),
            "{t}"
        );
        assert!(
            t.contains("4.0 KiB were writes never pushed") || t.contains("writes never pushed"),
            "{t}"
        );
    }

    #[test]
    fn bad_command_lines() {
        let e = parse(&["stats"]).unwrap().target().unwrap_err();
        assert!(e.to_string().contains("--cache-dir DIR"), "{e}");
        assert!(parse(&["--cache-dir", "/c", "--socket", "/s", "stats"]).is_err());
        assert!(parse(&["--socket", "/s", "stats", "--json", "--prometheus"]).is_err());
        assert!(parse(&["--socket", "/s", "evict", "--yes"]).is_err());
        let e = parse(&["--socket", "/s", "flush", "--timeout", "soon"]).unwrap_err();
        assert!(e.to_string().contains("is not a duration"), "{e}");
        let e = parse(&["--socket", "/s", "flush", "--timeout", "0"]).unwrap_err();
        assert!(e.to_string().contains("must be more than 0"), "{e}");
        let e = parse(&["--socket", "/s", "resize", "10X"]).unwrap_err();
        assert!(e.to_string().contains("is not a size"), "{e}");
        let e = parse(&["--socket", "/s", "mode", "d", "fast"]).unwrap_err();
        assert!(
            e.to_string()
                .contains("expected writeback, writethrough or off"),
            "{e}"
        );
    }
}
