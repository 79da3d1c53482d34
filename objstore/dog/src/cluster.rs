//! `dog cluster ...` and `dog node ...`.

use clap::Subcommand;
use objstore_proto::size::format_size;
use objstore_proto::view::DEFAULT_OBJECT_SIZE;
use serde::Serialize;

use crate::{size_arg, Ctx};

#[derive(Subcommand)]
pub enum ClusterCmd {
    /// Format a new cluster (once): set the copy count and object size.
    Format {
        /// Copies of every object (on distinct nodes, in distinct zones where possible).
        #[arg(short, long)]
        copies: u32,
        /// Object size: a power of two from 1M to 64M.
        #[arg(long, value_parser = size_arg, default_value_t = DEFAULT_OBJECT_SIZE as u64)]
        object_size: u64,
    },
    /// Show the cluster's state, format and membership epoch.
    Info,
}

#[derive(Subcommand)]
pub enum NodeCmd {
    /// List the nodes of the current epoch.
    List,
    /// Show each node's recovery progress for the current epoch.
    Recovery,
}

#[derive(Serialize)]
struct InfoOut {
    cluster_id: String,
    status: &'static str,
    epoch: u32,
    copies: Option<u32>,
    object_size: Option<u32>,
    formatted_at: Option<u64>,
    nodes: usize,
    zones: usize,
}

pub async fn cluster(ctx: &Ctx, cmd: ClusterCmd) -> anyhow::Result<()> {
    match cmd {
        ClusterCmd::Format {
            copies,
            object_size,
        } => {
            ctx.client.format(copies, object_size).await?;
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
                format!(
                    "formatted: {copies} copies, {} objects, {} node(s){note}\n",
                    format_size(object_size),
                    info.view.nodes.len()
                )
            });
        }
        ClusterCmd::Info => {
            let v = ctx.client.refresh().await?;
            let info = &v.info;
            let status = match info.config {
                None => "unformatted",
                Some(_) if info.degraded() => "degraded",
                Some(_) => "ok",
            };
            let out = InfoOut {
                cluster_id: info.cluster_id.clone(),
                status,
                epoch: info.view.epoch,
                copies: info.config.map(|c| c.copies),
                object_size: info.config.map(|c| c.object_size),
                formatted_at: info.config.map(|c| c.formatted_at),
                nodes: info.view.nodes.len(),
                zones: info.view.zones(),
            };
            ctx.print(&out, || {
                let mut s = format!("Cluster {}\nStatus: {status}", out.cluster_id);
                if status == "degraded" {
                    s += &format!(
                        " ({} zone(s) for {} copies: objects have fewer copies than asked)",
                        out.zones,
                        out.copies.unwrap_or(0)
                    );
                }
                if let Some(c) = info.config {
                    s += &format!(
                        "\nCopies: {}\nObject size: {}",
                        c.copies,
                        format_size(c.object_size as u64)
                    );
                } else {
                    s += "\nNot formatted: run 'dog cluster format --copies N'";
                }
                s += &format!(
                    "\nEpoch: {}\nNodes: {} in {} zone(s)\n",
                    out.epoch, out.nodes, out.zones
                );
                for n in &info.view.nodes {
                    s += &format!("  {:016x}  {}  zone {}\n", n.id, n.addr, n.zone);
                }
                s
            });
        }
    }
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

pub async fn node(ctx: &Ctx, cmd: NodeCmd) -> anyhow::Result<()> {
    let rows = node_rows(ctx).await?;
    match cmd {
        NodeCmd::List => ctx.print(&rows, || {
            let mut s = format!(
                "{:<18} {:<22} {:>6} {:>6} {:>8} {:>11} {:>11}\n",
                "Id", "Address", "Zone", "VNodes", "Objects", "Disk", "Free"
            );
            for r in &rows {
                match &r.status {
                    Some(st) => {
                        s += &format!(
                            "{:<18} {:<22} {:>6} {:>6} {:>8} {:>11} {:>11}\n",
                            r.id,
                            r.addr,
                            r.zone,
                            r.vnodes,
                            st.objects,
                            format_size(st.disk_total),
                            format_size(st.disk_free)
                        )
                    }
                    None => {
                        s += &format!(
                            "{:<18} {:<22} {:>6} {:>6} unreachable: {}\n",
                            r.id,
                            r.addr,
                            r.zone,
                            r.vnodes,
                            r.error.as_deref().unwrap_or("")
                        )
                    }
                }
            }
            s
        }),
        NodeCmd::Recovery => ctx.print(&rows, || {
            let mut s = format!(
                "{:<22} {:>6} {:<11} {:>17} {:>7}\n",
                "Address", "Epoch", "State", "Recovered", "Failed"
            );
            for r in &rows {
                match &r.status {
                    Some(st) => {
                        let rc = &st.recovery;
                        let pct = if rc.total == 0 {
                            100.0
                        } else {
                            rc.done as f64 * 100.0 / rc.total as f64
                        };
                        s += &format!(
                            "{:<22} {:>6} {:<11} {:>8}/{:<8} {:>6.1}% {:>7}\n",
                            r.addr,
                            rc.epoch,
                            format!("{:?}", rc.state).to_lowercase(),
                            rc.done,
                            rc.total,
                            pct,
                            rc.failed
                        )
                    }
                    None => s += &format!("{:<22} unreachable\n", r.addr),
                }
            }
            s
        }),
    }
    Ok(())
}
