//! `dog vdi snapshot | clone | rollback | tree | gc`, and the VDI table with snapshots.

use std::collections::HashMap;

use anyhow::bail;
use objstore_client::lock;
use objstore_client::vdi::{self, TreeNode, VdiInfo};
use objstore_proto::oid::Vid;
use objstore_proto::redundancy::Redundancy;
use objstore_proto::size::format_size;
use objstore_proto::table::{
    Align::{Left, Right},
    Table,
};

use crate::Ctx;

/// Asks on the terminal (stdin) before something that cannot be undone; `yes` skips it.
pub fn confirm(yes: bool, question: &str) -> anyhow::Result<()> {
    use std::io::{BufRead, IsTerminal, Write};
    if yes {
        return Ok(());
    }
    if !std::io::stdin().is_terminal() {
        bail!("refusing without confirmation: add --yes");
    }
    eprint!("{question} Type 'yes' to go on: ");
    std::io::stderr().flush()?;
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    if line.trim() != "yes" {
        bail!("not confirmed: nothing changed");
    }
    Ok(())
}

/// `dog vdi list`: each VDI, then its snapshots (`s`), clones marked `c`. Used is what it
/// alone holds (what deleting it frees), Shared what it reads that others hold too, Raw what
/// Used takes on the nodes' disks (its copies, or its strips).
pub fn table(list: &[VdiInfo]) -> String {
    let by_vid: HashMap<Vid, &VdiInfo> = list.iter().map(|v| (v.vid, v)).collect();
    let mut t = Table::new(&[
        ("", Left),
        ("Name", Left),
        ("Tag", Left),
        ("Id", Right),
        ("Size", Right),
        ("Used", Right),
        ("Shared", Right),
        ("Raw", Right),
        ("Redundancy", Right),
        ("Object", Right),
        ("Created", Left),
    ]);
    for v in list {
        let clone = by_vid.get(&v.parent_vid).is_some_and(|p| v.is_clone_of(p));
        let mark = if v.tag.is_some() {
            "s"
        } else if clone {
            "c"
        } else {
            ""
        };
        let alone = v.alone.unwrap_or(v.used);
        let time = if v.snapshot_time != 0 {
            v.snapshot_time
        } else {
            v.created
        };
        // Raw: what the objects it alone holds take on the nodes' disks.
        let raw = if v.used == 0 {
            0
        } else {
            (alone as u128 * v.raw_used as u128 / v.used as u128) as u64
        };
        let redundancy = match v.redundancy {
            Some(r @ Redundancy::Ec { .. }) => r.to_string(),
            Some(r) => format!("{r} copies"),
            None => format!("{} copies", v.copies),
        };
        t.row([
            mark.to_string(),
            v.name.clone(),
            v.tag.clone().unwrap_or_default(),
            format!("{:x}", v.vid),
            format_size(v.size),
            format_size(alone),
            format_size(v.used.saturating_sub(alone)),
            format_size(raw),
            redundancy,
            format_size(v.object_size as u64),
            lock::format_utc(time),
        ]);
    }
    t.render()
}

/// `dog vdi tree`: every inode under the one it was made from.
pub fn tree_text(nodes: &[TreeNode]) -> String {
    let known: std::collections::HashSet<Vid> = nodes.iter().map(|n| n.vid).collect();
    let mut children: HashMap<Vid, Vec<&TreeNode>> = HashMap::new();
    let mut roots = Vec::new();
    for n in nodes {
        if n.parent_vid == Vid::NONE || !known.contains(&n.parent_vid) {
            roots.push(n);
        } else {
            children.entry(n.parent_vid).or_default().push(n);
        }
    }
    fn label(n: &TreeNode) -> String {
        match n.kind.as_str() {
            "vdi" => format!("{} (current)", n.name),
            "clone" => format!("{} (clone)", n.name),
            "deleted" => format!("{} (deleted, kept for others)", n.name),
            _ => n.name.clone(),
        }
    }
    fn walk(
        out: &mut String,
        n: &TreeNode,
        prefix: &str,
        last: bool,
        root: bool,
        children: &HashMap<Vid, Vec<&TreeNode>>,
    ) {
        if root {
            *out += &format!("{}\n", label(n));
        } else {
            *out += &format!(
                "{prefix}{}{}\n",
                if last { "└── " } else { "├── " },
                label(n)
            );
        }
        let next = if root {
            String::new()
        } else {
            format!("{prefix}{}", if last { "    " } else { "│   " })
        };
        let kids = children.get(&n.vid).map(Vec::as_slice).unwrap_or(&[]);
        for (i, k) in kids.iter().enumerate() {
            walk(out, k, &next, i + 1 == kids.len(), false, children);
        }
    }
    let mut out = String::new();
    for r in roots {
        walk(&mut out, r, "", true, true, &children);
    }
    if out.is_empty() {
        out = "no VDIs\n".into();
    }
    out
}

/// The holder of `name`'s attachment lock, if anyone holds it.
async fn holder(ctx: &Ctx, name: &str) -> anyhow::Result<Option<lock::LockInfo>> {
    Ok(lock::holder(&ctx.client, name)
        .await
        .map_err(vdi::VdiError::from)?)
}

pub async fn snapshot(ctx: &Ctx, name: &str, tag: Option<&str>) -> anyhow::Result<()> {
    vdi::validate_name(name)?;
    if let Some(h) = holder(ctx, name).await? {
        // Attached read-write: only the holder can flush what it caches and go on with the
        // new inode.
        let path = crate::mount::route(name, &h, "snapshot")?;
        let req = serde_json::json!({"cmd": "snapshot", "vdi": name, "tag": tag});
        let reply = crate::mount::ask(&path, &req, &h.host).await?;
        let reply = reply.get("snapshot").cloned().unwrap_or(reply);
        ctx.print(&reply, || crate::mount::text(&reply, false));
        return Ok(());
    }
    let info = vdi::snapshot(&ctx.client, name, tag, None).await?;
    let full = info.full_name();
    ctx.print(&info, || {
        format!("took snapshot '{full}' (id {:x})\n", info.vid)
    });
    Ok(())
}

pub async fn clone(ctx: &Ctx, from: &str, new: &str) -> anyhow::Result<()> {
    let info = vdi::clone(&ctx.client, from, new).await?;
    ctx.print(&info, || {
        format!(
            "cloned '{from}' into VDI '{new}' ({}, id {:x})\n",
            format_size(info.size),
            info.vid
        )
    });
    Ok(())
}

pub async fn rollback(ctx: &Ctx, full: &str, yes: bool) -> anyhow::Result<()> {
    let (name, _) = vdi::split_snapshot(full)?;
    confirm(
        yes,
        &format!("Rolling back VDI '{name}' to '{full}' discards everything written to '{name}' since that snapshot."),
    )?;
    if let Some(h) = holder(ctx, name).await? {
        let path = crate::mount::route(name, &h, "rollback")?;
        let req = serde_json::json!({"cmd": "rollback", "snapshot": full});
        let reply = crate::mount::ask(&path, &req, &h.host).await?;
        let reply = reply.get("rollback").cloned().unwrap_or(reply);
        ctx.print(&reply, || crate::mount::text(&reply, true));
        return Ok(());
    }
    let info = vdi::rollback(&ctx.client, full, None).await?;
    ctx.print(&info, || {
        format!(
            "rolled VDI '{name}' back to '{full}' (now id {:x})\n",
            info.vid
        )
    });
    Ok(())
}

pub async fn delete_snapshot(ctx: &Ctx, full: &str) -> anyhow::Result<()> {
    let report = vdi::delete_snapshot(&ctx.client, full).await?;
    ctx.print(&serde_json::json!({"deleted": full, "gc": report}), || {
        format!(
            "deleted snapshot '{full}': freed {} object(s), {}\n",
            report.freed_objects,
            format_size(report.freed_bytes)
        )
    });
    Ok(())
}

pub async fn gc(ctx: &Ctx) -> anyhow::Result<()> {
    let r = vdi::gc(&ctx.client).await?;
    ctx.print(&r, || {
        format!(
            "freed {} object(s) ({}); removed {} deleted inode(s), {} kept for others\n",
            r.freed_objects,
            format_size(r.freed_bytes),
            r.removed_inodes,
            r.kept_inodes
        )
    });
    Ok(())
}

pub async fn tree(ctx: &Ctx) -> anyhow::Result<()> {
    let nodes = vdi::tree(&ctx.client).await?;
    ctx.print(&nodes, || tree_text(&nodes));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(vid: u32, parent: u32, name: &str, kind: &str) -> TreeNode {
        TreeNode {
            vid: Vid(vid),
            name: name.into(),
            parent_vid: Vid(parent),
            kind: kind.into(),
            time: vid as u64,
        }
    }

    #[test]
    fn tree_draws_children_under_parents() {
        let t = tree_text(&[
            node(1, 0, "golden@base", "snapshot"),
            node(2, 1, "golden@v2", "snapshot"),
            node(3, 2, "golden", "vdi"),
            node(4, 1, "vm1", "clone"),
        ]);
        assert_eq!(
            t,
            "golden@base\n├── golden@v2\n│   └── golden (current)\n└── vm1 (clone)\n"
        );
    }
}
