//! `dog cluster ...` and `dog node ...`.

use clap::Subcommand;
use objstore_proto::size::format_size;
use objstore_proto::table::{
    Align::{Left, Right},
    Table,
};
use objstore_proto::view::DEFAULT_OBJECT_SIZE;
use serde::Serialize;

use crate::{size_arg, Ctx};
use objstore_client::client::ClusterView;
use objstore_proto::api::FormatRequest;
use objstore_proto::keys;
use objstore_proto::redundancy::Redundancy;

/// Why an x:y scheme needs `--experimental` for now.
pub const EC_PREVIEW: &str = "erasure coding is a preview in this version: the fault simulator still finds stripes it cannot make whole after node crashes, full disks and failed fsyncs (issue 44); add --experimental to use it anyway";

#[derive(Subcommand)]
pub enum ClusterCmd {
    /// Format a new cluster (once): set the copy count and object size.
    ///
    /// With --key-file PATH and no file at PATH, a new cluster key is written there first.
    Format {
        /// Copies of every object (on distinct nodes, in distinct zones where possible), or
        /// x:y to erasure-code VDIs by default: x data and y parity strips of each object on
        /// x + y nodes in distinct zones (inodes then keep y + 1 full copies).
        #[arg(short, long)]
        copies: Redundancy,
        /// Needed for x:y while erasure coding is a preview: the fault simulator still finds
        /// stripes it cannot make whole after node crashes, full disks and failed fsyncs
        /// (issue 44; docs/architecture.md, "Erasure-coded objects", "Limits").
        #[arg(long)]
        experimental: bool,
        /// Live owners a write needs; below it writes wait (default: a majority of the copies,
        /// 2 of 3, 1 of 2, as Ceph's min_size).
        #[arg(long)]
        min_copies: Option<u32>,
        /// Object size: a power of two from 1M to 64M.
        #[arg(long, value_parser = size_arg, default_value_t = DEFAULT_OBJECT_SIZE as u64)]
        object_size: u64,
    },
    /// Show the cluster's state, format and membership epoch, and what I/O waits for.
    Info,
    /// Accept that objects waiting for nodes that are down may go back to older versions.
    ///
    /// When every node that may hold the newest copy of some objects is down, their I/O waits
    /// (`dog cluster info` says for whom). If those nodes are gone for good, this lets the
    /// nodes that are up serve and recover the newest copies they have: the writes only the
    /// missing nodes held are lost.
    Recover {
        /// Required: this may lose acknowledged writes.
        #[arg(long)]
        force: bool,
        /// Do not ask for confirmation (for scripts).
        #[arg(long)]
        yes: bool,
    },
    /// Check every copy of every object of every VDI and repair the bad ones.
    ///
    /// As `dog vdi check` for each VDI; an object shared by several VDIs is checked once.
    /// Exits non-zero when an object has no good copy (unrecoverable) or a repair failed.
    Check {
        #[command(flatten)]
        args: crate::check::CheckArgs,
    },
    /// Make the cluster key file (needs no running cluster).
    #[command(subcommand)]
    Key(crate::key::KeyCmd),
}

#[derive(Subcommand)]
pub enum NodeCmd {
    /// List the nodes: address, zone, objects, disk space, health, last scrub.
    List,
    /// Show each node's recovery progress for the current epoch.
    Recovery,
    /// Show one node's counters: requests, bytes and latency per operation, errors, disk health.
    ///
    /// The same numbers `sheep --metrics` serves, recovery included. ADDR: any node, fenced
    /// ones included; default the first --address.
    Stat {
        /// The node to ask (HOST:PORT).
        addr: Option<String>,
    },
    /// Show each node's background scrub: its rate, this pass and the last one.
    ///
    /// The rate is `sheep --scrub-rate`; for the pass in progress and the last one: copies
    /// verified (a strip of an erasure-coded object counts as one copy, on its holder), bytes
    /// read (a stripe's primary reads every strip), bad copies or strips found and repaired.
    Scrub,
}

#[derive(Serialize)]
struct InfoOut {
    cluster_id: String,
    status: &'static str,
    epoch: u32,
    copies: Option<u32>,
    min_copies: Option<u32>,
    /// How new VDIs keep their data objects by default ("3", "4:2").
    vdi_redundancy: Option<Redundancy>,
    /// Objects whose I/O waits for nodes that are down (summed over the nodes up).
    waiting_objects: u64,
    /// The nodes they wait for.
    waiting_for: Vec<std::net::SocketAddr>,
    /// The newest epoch in which those nodes could have taken writes.
    waiting_epoch: u32,
    object_size: Option<u32>,
    formatted_at: Option<u64>,
    nodes: usize,
    zones: usize,
    /// The membership driver the node asked uses.
    membership: String,
}

pub async fn cluster(ctx: &Ctx, cmd: ClusterCmd) -> anyhow::Result<()> {
    match cmd {
        ClusterCmd::Format {
            copies,
            min_copies,
            object_size,
            experimental,
        } => {
            if copies.is_ec() && !experimental {
                anyhow::bail!("{EC_PREVIEW}");
            }
            let (vdi_redundancy, copies) = match copies {
                Redundancy::Copies(n) => (None, n),
                ec @ Redundancy::Ec { parity, .. } => (Some(ec), parity as u32 + 1),
            };
            ctx.client
                .format_with(FormatRequest {
                    copies,
                    min_copies,
                    object_size,
                    vdi_redundancy,
                })
                .await?;
            let info = ctx.client.view().info.clone();
            let note = if info.degraded() {
                format!(
                    " (degraded: {} zone(s) for {copies} copies)",
                    info.view.zones()
                )
            } else {
                String::new()
            };
            ctx.print(&info, || {
                let vdis = match vdi_redundancy {
                    Some(r) => format!("VDIs erasure-coded {r} by default, inodes in "),
                    None => String::new(),
                };
                format!(
                    "formatted: {vdis}{copies} copies (writes need {}), {} objects, {} node(s){note}\n",
                    info.config.map(|c| c.min_copies()).unwrap_or(0),
                    format_size(object_size),
                    info.view.nodes.len()
                )
            });
        }
        ClusterCmd::Info => {
            let v = ctx.client.refresh().await?;
            let info = &v.info;
            let waiting = waiting(ctx, &v).await;
            let status = match info.config {
                None => "unformatted",
                Some(_) if waiting.objects > 0 || !waiting.nodes.is_empty() => "waiting",
                Some(_) if info.degraded() => "degraded",
                Some(_) => "ok",
            };
            let out = InfoOut {
                cluster_id: info.cluster_id.clone(),
                status,
                epoch: info.view.epoch,
                copies: info.config.map(|c| c.copies),
                min_copies: info.config.map(|c| c.min_copies()),
                vdi_redundancy: info.config.map(|c| c.default_redundancy()),
                waiting_objects: waiting.objects,
                waiting_for: waiting.nodes.clone(),
                waiting_epoch: waiting.epoch,
                object_size: info.config.map(|c| c.object_size),
                formatted_at: info.config.map(|c| c.formatted_at),
                nodes: info.view.nodes.len(),
                zones: info.view.zones(),
                membership: info.membership.clone(),
            };
            ctx.print(&out, || {
                let mut s = format!("Cluster {}\nStatus: {status}", out.cluster_id);
                if status == "waiting" {
                    s += &format!(
                        " for {} (they may hold objects written at epoch {}; {} object(s) known to wait; 'dog cluster recover --force' accepts the loss)",
                        list_addrs(&out.waiting_for),
                        out.waiting_epoch,
                        out.waiting_objects,
                    );
                }
                if status == "degraded" {
                    s += &format!(
                        " ({} zone(s) for {} copies: objects have fewer copies than asked)",
                        out.zones,
                        out.copies.unwrap_or(0)
                    );
                }
                if let Some(c) = info.config {
                    s += &format!(
                        "\nCopies: {} (writes need {})\nObject size: {}",
                        c.copies,
                        c.min_copies(),
                        format_size(c.object_size as u64)
                    );
                    if let Some(r) = c.vdi_redundancy {
                        s += &format!(
                            "\nNew VDIs: erasure-coded {r} ({:.2}x raw, survives {} lost nodes)",
                            r.raw_per_logical(),
                            r.tolerates()
                        );
                    }
                } else {
                    s += "\nNot formatted: run 'dog cluster format --copies N'";
                }
                if !out.membership.is_empty() {
                    s += &format!("\nMembership: {}", out.membership);
                }
                s += &format!(
                    "\nEpoch: {}\nNodes: {} in {} zone(s)\n",
                    out.epoch, out.nodes, out.zones
                );
                let mut t = Table::new(&[("Id", Left), ("Address", Left), ("Zone", Right)]);
                for n in &info.view.nodes {
                    t.row([
                        format!("{:016x}", n.id),
                        n.addr.to_string(),
                        n.zone.to_string(),
                    ]);
                }
                s + &t.render()
            });
        }
        ClusterCmd::Recover { force, yes } => recover(ctx, force, yes).await?,
        ClusterCmd::Check { args } => {
            let mut targets = Vec::new();
            let mut seen = std::collections::HashSet::new();
            for (name, _) in objstore_client::vdi::list_names(&ctx.client).await? {
                match objstore_client::vdi::check::targets(&ctx.client, &name).await {
                    Ok(t) => targets.extend(t.into_iter().filter(|t| seen.insert(t.oid))),
                    // Deleted while we listed.
                    Err(objstore_client::VdiError::NotFound(_)) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            // Deleted snapshots kept for others: their inodes (their objects that others
            // read are among those VDIs' targets).
            for (vid, rec) in objstore_client::vdi::space::hidden(&ctx.client).await? {
                let oid = objstore_proto::oid::ObjectId::inode(vid);
                if seen.insert(oid) {
                    targets.push(objstore_client::vdi::check::Target {
                        vdi: format!("{} (deleted, kept for others)", rec.name),
                        index: None,
                        oid,
                        ec: None,
                    });
                }
            }
            crate::check::run(ctx, targets, args).await?;
        }
        // Run before connecting, in main.
        ClusterCmd::Key(_) => unreachable!("key commands need no connection"),
    }
    Ok(())
}

fn list_addrs(addrs: &[std::net::SocketAddr]) -> String {
    addrs
        .iter()
        .map(|a| a.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// What the nodes up say they wait for.
#[derive(Default)]
struct Waiting {
    objects: u64,
    nodes: Vec<std::net::SocketAddr>,
    epoch: u32,
}

async fn waiting(ctx: &Ctx, v: &ClusterView) -> Waiting {
    let mut w = Waiting::default();
    for (_, st) in ctx.client.node_statuses(v).await {
        let Ok(st) = st else { continue };
        let r = &st.recovery;
        if r.epoch != v.epoch() {
            continue;
        }
        w.objects += r.incomplete;
        w.nodes.extend(r.waiting_for.iter().copied());
        w.epoch = w.epoch.max(r.waiting_epoch);
    }
    w.nodes.sort();
    w.nodes.dedup();
    w
}

#[derive(Serialize)]
struct RecoverOut {
    epoch: u32,
    /// Objects the nodes up hold that were waiting and may now be older than their last
    /// write (objects only the missing nodes held are not counted: nobody up knows them).
    objects_maybe_older: u64,
    waited_for: Vec<std::net::SocketAddr>,
}

async fn recover(ctx: &Ctx, force: bool, yes: bool) -> anyhow::Result<()> {
    if !force {
        anyhow::bail!(
            "'dog cluster recover' only accepts a loss knowingly: add --force (see --help)"
        );
    }
    let v = ctx.client.refresh().await?;
    let w = waiting(ctx, &v).await;
    let epoch = v.epoch();
    crate::snap::confirm(
        yes,
        &format!(
            "{} object(s) wait for {} (they may hold writes of epoch {}). Forcing recovery makes the nodes up serve what they have: those writes are lost if the nodes never come back.",
            w.objects,
            if w.nodes.is_empty() { "no node".to_string() } else { list_addrs(&w.nodes) },
            w.epoch
        ),
    )
    .map_err(|e| anyhow::anyhow!("forced recovery: {e}"))?;
    let cur = ctx.client.kv_get(keys::FORCED).await?;
    if !ctx
        .client
        .kv_cas(keys::FORCED, cur.as_deref(), Some(&epoch.to_string()))
        .await?
    {
        anyhow::bail!("another 'dog cluster recover' ran at the same time: run it again");
    }
    tracing::warn!("recovery forced at epoch {epoch}");
    let out = RecoverOut {
        epoch,
        objects_maybe_older: w.objects,
        waited_for: w.nodes,
    };
    ctx.print(&out, || {
        format!(
            "recovery forced at epoch {epoch}: {} object(s) held by the nodes up may be older than their last write, and objects only {} held are lost; the nodes recover from the copies they have\n",
            out.objects_maybe_older,
            if out.waited_for.is_empty() {
                "the missing nodes".to_string()
            } else {
                list_addrs(&out.waited_for)
            }
        )
    });
    Ok(())
}

#[derive(Serialize)]
struct NodeOut {
    id: String,
    addr: std::net::SocketAddr,
    zone: u32,
    vnodes: u32,
    status: Option<objstore_proto::api::NodeStatus>,
    error: Option<String>,
}

async fn node_rows(ctx: &Ctx) -> anyhow::Result<Vec<NodeOut>> {
    let v = ctx.client.refresh().await?;
    Ok(ctx
        .client
        .node_statuses(&v)
        .await
        .into_iter()
        .map(|(n, s)| NodeOut {
            id: format!("{:016x}", n.id),
            addr: n.addr,
            zone: n.zone,
            vnodes: n.vnodes,
            error: s.as_ref().err().map(|e| e.to_string()),
            status: s.ok(),
        })
        .collect())
}

/// A node's membership lease for `dog node list`: `-` without one (local driver), the time
/// left, or `expired` (the node serves no I/O until it reaches etcd again).
fn lease_left(ms: Option<i64>) -> String {
    match ms {
        None => "-".into(),
        Some(ms) if ms <= 0 => "expired".into(),
        Some(ms) => format!("{:.1}s", ms as f64 / 1000.0),
    }
}

pub async fn node(ctx: &Ctx, cmd: NodeCmd) -> anyhow::Result<()> {
    if let NodeCmd::Stat { addr } = &cmd {
        return crate::stat::node_stat(ctx, addr.as_deref()).await;
    }
    let rows = node_rows(ctx).await?;
    match cmd {
        NodeCmd::Stat { .. } => unreachable!("answered above"),
        NodeCmd::List => ctx.print(&rows, || {
            let mut t = Table::new(&[
                ("Id", Left),
                ("Address", Left),
                ("Zone", Right),
                ("VNodes", Right),
                ("Objects", Right),
                ("Disk", Right),
                ("Free", Right),
                ("Lease", Right),
                ("Health", Left),
                ("Last scrub", Left),
            ]);
            for r in &rows {
                let (id, addr, zone, vnodes) = (
                    r.id.clone(),
                    r.addr.to_string(),
                    r.zone.to_string(),
                    r.vnodes.to_string(),
                );
                match &r.status {
                    Some(st) => t.row([
                        id,
                        addr,
                        zone,
                        vnodes,
                        st.objects.to_string(),
                        format_size(st.disk_total),
                        format_size(st.disk_free),
                        lease_left(st.lease_left_ms),
                        crate::stat::health_word(&st.health),
                        crate::check::last_scrub(&st.scrub),
                    ]),
                    None => t.row([
                        id,
                        addr,
                        zone,
                        vnodes,
                        format!("unreachable: {}", r.error.as_deref().unwrap_or("")),
                    ]),
                }
            }
            t.render()
        }),
        NodeCmd::Recovery => ctx.print(&rows, || {
            let mut t = Table::new(&[
                ("Address", Left),
                ("Epoch", Right),
                ("State", Left),
                ("Recovered", Right),
                ("Failed", Right),
                ("Waiting", Right),
            ]);
            for r in &rows {
                match &r.status {
                    Some(st) => {
                        let rc = &st.recovery;
                        let pct = if rc.total == 0 {
                            100.0
                        } else {
                            rc.done as f64 * 100.0 / rc.total as f64
                        };
                        t.row([
                            r.addr.to_string(),
                            rc.epoch.to_string(),
                            format!("{:?}", rc.state).to_lowercase(),
                            format!("{}/{} {:.1}%", rc.done, rc.total, pct),
                            rc.failed.to_string(),
                            rc.incomplete.to_string(),
                        ]);
                        if !rc.waiting_for.is_empty() {
                            t.note(
                                1,
                                format!(
                                    "waiting for {} (they may hold objects written at epoch {})",
                                    list_addrs(&rc.waiting_for),
                                    rc.waiting_epoch
                                ),
                            );
                        }
                        if rc.data_lost > 0 {
                            t.note(
                                1,
                                format!(
                                    "{} object(s) lost data with failed fdatasyncs that no \
                                     other node held (see the node's log)",
                                    rc.data_lost
                                ),
                            );
                        }
                    }
                    None => t.row([r.addr.to_string(), "unreachable".to_string()]),
                }
            }
            t.render()
        }),
        NodeCmd::Scrub => ctx.print(&rows, || {
            let mut t = crate::check::scrub_table();
            for r in &rows {
                match &r.status {
                    Some(st) => crate::check::scrub_rows(&mut t, r.addr, &st.scrub),
                    None => t.row([r.addr.to_string(), "unreachable".to_string()]),
                }
            }
            t.render()
        }),
    }
    Ok(())
}
