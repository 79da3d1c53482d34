//! `dog vdi ...`.

use std::sync::Arc;

use anyhow::{bail, Context};
use bytes::Bytes;
use clap::Subcommand;
use futures::stream::{FuturesUnordered, StreamExt};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use objstore_client::client::ClusterView;
use objstore_client::vdi::{self, PARALLEL};
use objstore_client::{Client, Vdi};
use objstore_proto::oid::ObjectId;
use objstore_proto::redundancy::Redundancy;
use objstore_proto::size::format_size;
use objstore_proto::table::{Align::Left, Table};
use serde::Serialize;
use std::io::{Read, Write};

use crate::{size_arg, Ctx};

mod locks;
pub use locks::LockCmd;

#[derive(Subcommand)]
pub enum VdiCmd {
    /// Create a thin VDI (no space is used until it is written).
    Create {
        name: String,
        /// Size, e.g. 10G.
        #[arg(value_parser = size_arg)]
        size: u64,
        /// How its data objects are kept: N full copies (the cluster's number), or x:y
        /// erasure coding, x data and y parity strips of each object on x + y nodes in
        /// distinct zones (4:2 survives two lost nodes at 1.5x the space). Default: the
        /// cluster's (`dog cluster format --copies`).
        #[arg(short, long)]
        copies: Option<Redundancy>,
        /// Needed for an x:y VDI while erasure coding is a preview (see `dog cluster format
        /// --help`).
        #[arg(long)]
        experimental: bool,
    },
    /// List every VDI, its snapshots (s) and clones (c), and the space each takes.
    ///
    /// Used: bytes of the objects it alone holds (what deleting it frees); Shared: of those it
    /// reads that others hold too; Raw: what Used takes on the nodes' disks. Counted in whole
    /// objects, as Sheepdog does.
    List,
    /// Show one VDI or snapshot (NAME@TAG).
    Info { name: String },
    /// Delete a VDI (its snapshots stay), or a snapshot NAME@TAG.
    ///
    /// A VDI's objects are deleted with it; a snapshot is refused while clones were made from
    /// it. Objects nothing reads any more are freed.
    Delete { name: String },
    /// Take a read-only snapshot NAME@TAG of a VDI; no data is copied.
    ///
    /// A VDI attached by a mount on this host is snapshotted by that mount (asked over its control socket: it
    /// flushes its cache first); attached on another host, refused (run `cachectl snapshot`
    /// there).
    Snapshot {
        name: String,
        /// The snapshot's tag (default: the UTC time, e.g. 2026-12-02-05-00-00).
        #[arg(short = 's', long)]
        tag: Option<String>,
    },
    /// Make VDI NEW from snapshot NAME@TAG; it shares the snapshot's objects until written.
    Clone { snapshot: String, new: String },
    /// Roll VDI NAME back to its snapshot NAME@TAG, discarding what was written since.
    ///
    /// A VDI attached by a mount on this host is rolled back by that mount (it drops what it
    /// cached, unpushed writes too); attached on another host, refused.
    Rollback {
        snapshot: String,
        /// Do not ask for confirmation (for scripts).
        #[arg(long, short = 'y')]
        yes: bool,
    },
    /// Show every VDI under the snapshot it was made from (snapshots, clones, deleted
    /// snapshots kept for others).
    Tree,
    /// Free the objects of deleted snapshots that nothing reads any more (delete does it too;
    /// this retries what a failed delete left).
    Gc,
    /// Grow a VDI (shrinking is refused).
    Resize {
        name: String,
        #[arg(value_parser = size_arg)]
        size: u64,
    },
    /// Back up a snapshot to stdout: all of it, or only what changed since an earlier one.
    ///
    /// Writes a delta (docs/backup.md): with FROM, only the 4 KiB blocks that changed since
    /// snapshot FROM of the same VDI; without, all of TO (holes and zero blocks left out).
    /// Progress and a summary go to stderr (the summary as JSON with --json). Refused onto a
    /// terminal.
    Backup {
        /// NAME@TO, or NAME@FROM then NAME@TO.
        #[arg(value_name = "[NAME@FROM] NAME@TO")]
        first: String,
        #[arg(hide = true)]
        second: Option<String>,
    },
    /// Restore a backup: apply a delta from stdin to VDI NAME, then take snapshot NAME@TO.
    ///
    /// A full delta creates
    /// NAME (or fills an empty one); an incremental one applies onto NAME only while it still
    /// equals NAME@FROM. Refused while NAME is attached.
    Restore {
        name: String,
        /// Restore a full delta over a VDI holding data (all of it is replaced), or an
        /// incremental one onto NAME as it is (without NAME@FROM, or changed since).
        #[arg(long)]
        force: bool,
    },
    /// Copy VDI contents to stdout (default: the whole VDI).
    Read {
        name: String,
        #[arg(value_parser = size_arg)]
        offset: Option<u64>,
        #[arg(value_parser = size_arg)]
        len: Option<u64>,
    },
    /// Copy stdin into a VDI at OFFSET (default 0), up to LEN bytes or the end of stdin.
    ///
    /// Refused while a cache has the VDI attached read-write (see `dog vdi lock list`).
    Write {
        name: String,
        #[arg(value_parser = size_arg)]
        offset: Option<u64>,
        #[arg(value_parser = size_arg)]
        len: Option<u64>,
        /// Write even while the VDI is attached: the cache that holds it does not see this
        /// write, and may serve its older copy or push over it.
        #[arg(long)]
        force: bool,
    },
    /// Show which nodes hold object INDEX of a VDI.
    Object { name: String, index: u64 },
    /// Show which nodes hold each object of a VDI: its inode, then every allocated data object,
    /// to see whether the copies agree (with --json, `index` is null for the inode).
    Objects { name: String },
    /// Attachment locks: who has a VDI attached read-write.
    #[command(subcommand)]
    Lock(LockCmd),
    /// Check every copy of every object of a VDI and repair the bad ones.
    ///
    /// Every owner of the VDI's inode and of each allocated object reads its copy back and
    /// hashes it; the newest version wins and, at one version, a
    /// copy that fails to read or whose digest is in a minority is bad. Bad copies are
    /// restored from a good one. Prints a summary; exits non-zero when an object has no good
    /// copy (unrecoverable) or a repair failed.
    Check {
        name: String,
        #[command(flatten)]
        args: crate::check::CheckArgs,
    },
}

pub(crate) fn progress(total: u64, what: &str) -> ProgressBar {
    let pb = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    pb.set_style(
        ProgressStyle::with_template(
            "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .unwrap()
        .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    pb
}

#[derive(Serialize)]
struct Holder {
    addr: std::net::SocketAddr,
    version: objstore_proto::version::Version,
    deleted: bool,
}

#[derive(Serialize)]
struct ObjectOut {
    vdi: String,
    /// None for the inode object.
    index: Option<u64>,
    oid: Option<String>,
    placement: Vec<std::net::SocketAddr>,
    holders: Vec<Holder>,
}

pub async fn vdi(ctx: &Ctx, cmd: VdiCmd) -> anyhow::Result<()> {
    let client = &ctx.client;
    match cmd {
        VdiCmd::Lock(c) => return locks::lock_cmd(ctx, c).await,
        VdiCmd::Check { name, args } => {
            let targets = vdi::check::targets(client, &name).await?;
            return crate::check::run(ctx, targets, args).await;
        }
        VdiCmd::Create {
            name,
            size,
            copies,
            experimental,
        } => {
            if copies.is_some_and(|r| r.is_ec()) && !experimental {
                bail!("{}", crate::cluster::EC_PREVIEW);
            }
            let info = vdi::create_with(client, &name, size, copies).await?;
            let kept = match info.redundancy {
                Some(r @ Redundancy::Ec { .. }) => format!("erasure-coded {r}"),
                Some(r) => format!("{r} copies"),
                None => String::new(),
            };
            ctx.print(&info, || {
                format!(
                    "created VDI '{name}' ({}, {kept}, id {:x})\n",
                    format_size(size),
                    info.vid
                )
            });
        }
        VdiCmd::List => {
            let list = vdi::list(client).await?;
            ctx.print(&list, || crate::snap::table(&list));
        }
        VdiCmd::Snapshot { name, tag } => {
            return crate::snap::snapshot(ctx, &name, tag.as_deref()).await
        }
        VdiCmd::Clone { snapshot, new } => return crate::snap::clone(ctx, &snapshot, &new).await,
        VdiCmd::Rollback { snapshot, yes } => {
            return crate::snap::rollback(ctx, &snapshot, yes).await
        }
        VdiCmd::Tree => return crate::snap::tree(ctx).await,
        VdiCmd::Backup { first, second } => {
            return crate::backup::backup(ctx, &first, second.as_deref()).await
        }
        VdiCmd::Restore { name, force } => return crate::backup::restore(ctx, &name, force).await,
        VdiCmd::Gc => return crate::snap::gc(ctx).await,
        VdiCmd::Info { name } => {
            let info = Vdi::open(client.clone(), &name).await?.info();
            ctx.print(&info, || {
                crate::snap::table(std::slice::from_ref(&info))
                    + &format!(
                        "{} of {} objects allocated: {} logical, {} raw\n",
                        info.allocated_objects,
                        info.size.div_ceil(info.object_size as u64),
                        format_size(info.used),
                        format_size(info.raw_used)
                    )
            });
        }
        VdiCmd::Delete { name } if name.contains('@') => {
            return crate::snap::delete_snapshot(ctx, &name).await
        }
        VdiCmd::Delete { name } => {
            vdi::delete(client, &name).await?;
            ctx.print(&serde_json::json!({"deleted": name}), || {
                format!("deleted VDI '{name}'\n")
            });
        }
        VdiCmd::Resize { name, size } => {
            let info = vdi::resize(client, &name, size).await?;
            ctx.print(&info, || {
                format!("resized VDI '{name}' to {}\n", format_size(info.size))
            });
        }
        VdiCmd::Read { name, offset, len } => {
            let v = Arc::new(Vdi::open(client.clone(), &name).await?);
            let offset = offset.unwrap_or(0);
            let len = match len {
                Some(l) => l,
                None => v.size().checked_sub(offset).with_context(|| {
                    format!(
                        "offset {offset} is past the end of VDI '{name}' ({} bytes)",
                        v.size()
                    )
                })?,
            };
            read(v, offset, len).await?;
        }
        VdiCmd::Write {
            name,
            offset,
            len,
            force,
        } => {
            if name.contains('@') {
                vdi::split_snapshot(&name)?;
                bail!("{}", vdi::VdiError::ReadOnly(name));
            }
            if !force {
                if let Err(e) = vdi::check_not_attached(client, &name).await {
                    bail!("{e}; --force writes behind that cache (it will not see this write)");
                }
            }
            let v = Arc::new(Vdi::open(client.clone(), &name).await?);
            let offset = offset.unwrap_or(0);
            let written = write(v.clone(), offset, len).await?;
            v.flush().await?;
            if let Some(l) = len {
                if written < l {
                    bail!("stdin ended after {written} of {l} bytes (those were written)");
                }
            }
        }
        VdiCmd::Object { name, index } => {
            let v = Vdi::open(client.clone(), &name).await?;
            let view = client.refresh().await?;
            let oid = v.object(index);
            if oid.is_none() && index >= v.size().div_ceil(v.object_size() as u64) {
                bail!("index {index} is past the end of VDI '{name}'");
            }
            let out = object_out(client, &view, &name, Some(index), oid).await?;
            ctx.print(&out, || object_text(&out));
        }
        VdiCmd::Objects { name } => {
            let v = Vdi::open(client.clone(), &name).await?;
            let view = client.refresh().await?;
            let mut wanted = vec![(None, Some(ObjectId::inode(v.info().vid)))];
            let indexes = v.size().div_ceil(v.object_size() as u64);
            wanted.extend((0..indexes).filter_map(|i| v.object(i).map(|o| (Some(i), Some(o)))));
            let outs: Vec<anyhow::Result<ObjectOut>> = futures::stream::iter(wanted)
                .map(|(index, oid)| {
                    let (view, name) = (&view, &name);
                    async move { object_out(client, view, name, index, oid).await }
                })
                .buffered(PARALLEL)
                .collect()
                .await;
            let outs = outs.into_iter().collect::<anyhow::Result<Vec<_>>>()?;
            ctx.print(&outs, || outs.iter().map(object_text).collect());
        }
    }
    Ok(())
}

/// Where object `oid` (index `index` of VDI `name`, None for its inode) should be and where it
/// is: every node of the view is asked for its version.
async fn object_out(
    client: &Client,
    view: &ClusterView,
    name: &str,
    index: Option<u64>,
    oid: Option<ObjectId>,
) -> anyhow::Result<ObjectOut> {
    let mut out = ObjectOut {
        vdi: name.to_string(),
        index,
        oid: oid.map(|o| o.to_string()),
        placement: Vec::new(),
        holders: Vec::new(),
    };
    let Some(oid) = oid else {
        return Ok(out);
    };
    out.placement = view.replicas(oid)?;
    let nodes = &view.info.view.nodes;
    let stats = futures::future::join_all(nodes.iter().map(|n| client.stat_obj(n.addr, oid))).await;
    for (n, s) in nodes.iter().zip(stats) {
        if let Some(st) = s? {
            out.holders.push(Holder {
                addr: n.addr,
                version: st.version,
                deleted: st.deleted,
            });
        }
    }
    Ok(out)
}

fn object_text(out: &ObjectOut) -> String {
    let what = match out.index {
        Some(i) => format!("index {i}"),
        None => "inode".to_string(),
    };
    let name = &out.vdi;
    match &out.oid {
        None => format!("{what} of VDI '{name}' is a hole: no object\n"),
        Some(oid) => {
            let mut t = Table::new(&[("Node", Left), ("Copy", Left)]);
            for h in &out.holders {
                let placed = if out.placement.contains(&h.addr) {
                    ""
                } else {
                    " (not an owner: will be dropped after recovery)"
                };
                let what = if h.deleted { "deleted at" } else { "version" };
                t.row([h.addr.to_string(), format!("{what} {}{placed}", h.version)]);
            }
            for p in &out.placement {
                if !out.holders.iter().any(|h| h.addr == *p) {
                    t.row([p.to_string(), "missing (to be recovered)".to_string()]);
                }
            }
            format!("object {oid} ({what} of VDI '{name}')\n{}", t.render())
        }
    }
}

/// Object-aligned chunks covering `[offset, offset+len)`.
fn chunks(offset: u64, len: u64, object_size: u64) -> impl Iterator<Item = (u64, u64)> {
    let end = offset + len;
    let mut pos = offset;
    std::iter::from_fn(move || {
        if pos >= end {
            return None;
        }
        let n = (object_size - pos % object_size).min(end - pos);
        let c = (pos, n);
        pos += n;
        Some(c)
    })
}

async fn read(v: Arc<Vdi>, offset: u64, len: u64) -> anyhow::Result<()> {
    let pb = progress(len, "reading");
    // stdout is written by its own thread so a slow consumer never stalls the runtime.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Bytes>(4);
    let writer = std::thread::spawn(move || -> std::io::Result<()> {
        let mut out = std::io::stdout().lock();
        while let Some(b) = rx.blocking_recv() {
            out.write_all(&b)?;
        }
        out.flush()
    });
    let mut stream = futures::stream::iter(chunks(offset, len, v.object_size() as u64))
        .map(|(off, n)| {
            let v = v.clone();
            async move { v.read_at(off, n).await }
        })
        .buffered(PARALLEL);
    while let Some(data) = stream.next().await {
        let data = data?;
        let n = data.len() as u64;
        if tx.send(data).await.is_err() {
            break; // the writer failed; its error is reported below
        }
        pb.inc(n);
    }
    drop(tx);
    writer
        .join()
        .expect("stdout writer")
        .context("writing to stdout")?;
    pb.finish_and_clear();
    Ok(())
}

/// Reads up to `n` bytes; fewer only at the end of the input.
fn fill(input: &mut impl Read, n: usize) -> std::io::Result<Bytes> {
    let mut buf = Vec::with_capacity(n);
    input.take(n as u64).read_to_end(&mut buf)?;
    Ok(Bytes::from(buf))
}

/// Copies stdin to the VDI at `offset`, object by object, many objects in flight. Without `len`
/// it reads to the end of stdin; input beyond the end of the VDI is an error.
async fn write(v: Arc<Vdi>, offset: u64, len: Option<u64>) -> anyhow::Result<u64> {
    let os = v.object_size() as u64;
    let end = offset + len.unwrap_or(v.size().saturating_sub(offset));
    let pb = progress(end - offset, "writing");
    // stdin is read by its own thread, in object-aligned chunks.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<std::io::Result<(u64, Bytes)>>(4);
    let bounded = len.is_some();
    std::thread::spawn(move || {
        let mut input = std::io::stdin().lock();
        let mut pos = offset;
        loop {
            let want = if pos < end {
                (os - pos % os).min(end - pos)
            } else if bounded {
                break;
            } else {
                1 // anything more is past the end of the VDI
            };
            let chunk = fill(&mut input, want as usize);
            let n = chunk.as_ref().map(|c| c.len() as u64).unwrap_or(0);
            let stop = chunk.is_err() || n < want;
            if (n > 0 || chunk.is_err()) && tx.blocking_send(chunk.map(|c| (pos, c))).is_err() {
                break;
            }
            if stop {
                break;
            }
            pos += n;
        }
    });
    let mut inflight = FuturesUnordered::new();
    let mut written = 0u64;
    while let Some(chunk) = rx.recv().await {
        let (at, data) = chunk.context("reading stdin")?;
        let n = data.len() as u64;
        let v2 = v.clone();
        inflight.push(async move { v2.write_at(at, data).await.map(|_| n) });
        while inflight.len() >= PARALLEL {
            let n = inflight.next().await.expect("non-empty")?;
            written += n;
            pb.inc(n);
        }
    }
    while let Some(r) = inflight.next().await {
        let n = r?;
        written += n;
        pb.inc(n);
    }
    pb.finish_and_clear();
    Ok(written)
}
