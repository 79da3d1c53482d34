//! Which inodes read which objects: space accounting (`dog vdi list`) and freeing the objects
//! of deleted snapshots and VDIs that nothing reads any more ([`gc`]).
//!
//! The rule that keeps data safe: an object is freed only when no inode reachable from the VDI
//! table (`vdi/NAME`, `vdi/NAME@TAG`), read after the object's owner left the table, names it
//! in its map. Every operation that makes a new reference (snapshot, clone, rollback) writes
//! the new inode before the table entry that makes it reachable, and checks afterwards that
//! the inode it copied from is still in the table (undoing itself if not), so a [`gc`] running
//! at the same time never frees an object a reachable inode reads. An inode stays while it is
//! an ancestor of a reachable one (their maps are checked against the parent chain).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt;
use serde::{Deserialize, Serialize};

use objstore_proto::keys;
use objstore_proto::oid::{ObjIndex, ObjectId, Vid, INODE_HEADER_LEN};

use super::inode::{entry, read_inode, read_inode_unchecked, InodeHeader};
use super::table::{list_names, VdiInfo};
use super::{Vdi, VdiError, PARALLEL};
use crate::client::{Client, ClientError};

/// An inode reachable from the VDI table.
#[derive(Debug, Clone)]
pub struct LiveInode {
    /// `NAME` or `NAME@TAG`.
    pub full: String,
    pub tag: Option<String>,
    pub header: InodeHeader,
    pub map: Vec<Vid>,
}

/// Every inode of the VDI table, with its map (entries deleted while listing are skipped).
pub async fn load_live(client: &Arc<Client>) -> Result<Vec<LiveInode>, VdiError> {
    let names = list_names(client).await?;
    let loaded: Vec<Result<LiveInode, VdiError>> = futures::stream::iter(names)
        .map(|(full, vid)| async move {
            let (header, map) = read_inode(client, &full, vid).await?;
            let tag = full.split_once('@').map(|(_, t)| t.to_string());
            Ok(LiveInode {
                full,
                tag,
                header,
                map,
            })
        })
        .buffered(PARALLEL)
        .collect()
        .await;
    let mut out = Vec::new();
    for l in loaded {
        match l {
            Ok(l) => out.push(l),
            Err(VdiError::NotFound(_)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// How many reachable inodes name each (vid, index).
fn references(inodes: &[LiveInode]) -> HashMap<(Vid, u32), u32> {
    let mut refs = HashMap::new();
    for l in inodes {
        for (i, &v) in l.map.iter().enumerate() {
            if v != Vid::NONE {
                *refs.entry((v, i as u32)).or_insert(0) += 1;
            }
        }
    }
    refs
}

/// What `dog vdi list` shows: each inode's summary with the bytes it alone holds and its
/// parent's name; sorted by name, each VDI before its snapshots (oldest first).
pub fn account(inodes: &[LiveInode]) -> Vec<VdiInfo> {
    let refs = references(inodes);
    let names: HashMap<Vid, &str> = inodes
        .iter()
        .map(|l| (l.header.vid, l.full.as_str()))
        .collect();
    let mut out: Vec<VdiInfo> = inodes
        .iter()
        .map(|l| {
            let mut info = Vdi::summary(&l.header, &l.map, l.tag.as_deref());
            let alone = l
                .map
                .iter()
                .enumerate()
                .filter(|(i, &v)| v != Vid::NONE && refs.get(&(v, *i as u32)) == Some(&1))
                .count() as u64;
            info.alone = Some(alone * l.header.object_size as u64);
            info.parent = names.get(&info.parent_vid).map(|n| n.to_string());
            info
        })
        .collect();
    out.sort_by(|a, b| {
        (&a.name, a.tag.is_some(), a.snapshot_time, &a.tag).cmp(&(
            &b.name,
            b.tag.is_some(),
            b.snapshot_time,
            &b.tag,
        ))
    });
    out
}

/// A deleted inode kept for others: what [`gc`] and `dog vdi tree` know of it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HiddenRecord {
    pub name: String,
    #[serde(default)]
    pub tag: Option<String>,
}

/// Marks inode `vid` (of `name`, snapshot `tag`) deleted: [`gc`] frees what nothing reads.
pub(super) async fn hide(
    client: &Client,
    vid: Vid,
    name: &str,
    tag: Option<&str>,
) -> Result<(), VdiError> {
    let rec = serde_json::to_string(&HiddenRecord {
        name: name.to_string(),
        tag: tag.map(str::to_string),
    })
    .expect("serializable");
    let key = keys::hidden(vid.0);
    let cur = client.kv_get(&key).await?;
    client.kv_cas(&key, cur.as_deref(), Some(&rec)).await?;
    Ok(())
}

async fn unhide(client: &Client, vid: Vid) -> Result<(), VdiError> {
    let key = keys::hidden(vid.0);
    if let Some(cur) = client.kv_get(&key).await? {
        client.kv_cas(&key, Some(&cur), None).await?;
    }
    Ok(())
}

/// [`unhide`] that only logs a failure (the record is then cleared by the next [`gc`]).
pub(super) async fn unhide_quietly(client: &Client, vid: Vid) {
    if let Err(e) = unhide(client, vid).await {
        tracing::warn!("clearing the deleted mark of VDI id {:#x}: {e}", vid.0);
    }
}

/// Every deleted inode still kept: vid and record.
pub async fn hidden(client: &Client) -> Result<Vec<(Vid, HiddenRecord)>, VdiError> {
    let mut out = Vec::new();
    for (key, raw) in client.kv_list(keys::HIDDEN_PREFIX).await? {
        let Some(vid) = key
            .strip_prefix(keys::HIDDEN_PREFIX)
            .and_then(|v| v.parse::<u32>().ok())
        else {
            continue;
        };
        let rec = serde_json::from_str(&raw).unwrap_or(HiddenRecord {
            name: format!("(vid {vid})"),
            tag: None,
        });
        out.push((Vid(vid), rec));
    }
    Ok(out)
}

/// What a [`gc`] did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct GcReport {
    /// Data objects removed (nothing read them).
    pub freed_objects: u64,
    /// Bytes those objects held.
    pub freed_bytes: u64,
    /// Deleted inodes removed for good.
    pub removed_inodes: u64,
    /// Deleted inodes still kept: others read their objects or descend from them.
    pub kept_inodes: u64,
}

/// Frees the objects of deleted inodes that no reachable inode reads, and removes the deleted
/// inodes nothing needs any more (see the module documentation for why this is safe).
pub async fn gc(client: &Arc<Client>) -> Result<GcReport, VdiError> {
    let live = load_live(client).await?;
    let hidden = hidden(client).await?;
    let live_vids: HashSet<Vid> = live.iter().map(|l| l.header.vid).collect();
    let refs = references(&live);
    let mut report = GcReport::default();

    // Every inode on a reachable inode's parent chain stays.
    let mut headers: HashMap<Vid, InodeHeader> = live
        .iter()
        .map(|l| (l.header.vid, l.header.clone()))
        .collect();
    let mut needed: HashSet<Vid> = HashSet::new();
    for l in &live {
        let mut parent = Vid(l.header.parent);
        while parent != Vid::NONE && needed.insert(parent) {
            let h = match headers.get(&parent) {
                Some(h) => h.clone(),
                None => match read_inode_unchecked(client, parent).await {
                    Ok((h, _)) => h,
                    Err(_) => break,
                },
            };
            headers.insert(parent, h.clone());
            parent = Vid(h.parent);
        }
    }

    // Every inode's own objects, by inode: a partial copy-on-write target among them reads
    // blocks from an object of the same index that this gc may free, and is made whole first.
    let mut holders: Vec<(Vid, Vec<Vid>)> =
        live.iter().map(|l| (l.header.vid, l.map.clone())).collect();
    for (vid, _) in &hidden {
        if let Ok((_, map)) = read_inode_unchecked(client, *vid).await {
            holders.push((*vid, map));
        }
    }
    let holders = &holders;

    for (vid, _) in hidden {
        if live_vids.contains(&vid) {
            // Hidden while a snapshot was being taken, and reachable again: not deleted.
            unhide(client, vid).await?;
            continue;
        }
        let (header, map) = match read_inode_unchecked(client, vid).await {
            Ok(r) => r,
            Err(VdiError::Cluster(ClientError::NotFound(_))) => {
                unhide(client, vid).await?;
                continue;
            }
            Err(e) => return Err(e),
        };
        let free: Vec<u64> = map
            .iter()
            .enumerate()
            .filter(|(i, &v)| v == vid && !refs.contains_key(&(vid, *i as u32)))
            .map(|(i, _)| i as u64)
            .collect();
        // An erasure-coded VDI's copies are whole objects: nothing reads through them.
        let (ec, checked) = (header.ec(), header.checked);
        let results: Vec<Result<u64, ClientError>> = futures::stream::iter(free)
            .map(|i| async move {
                let freed = ObjectId::data(vid, ObjIndex(i as u32));
                for (d, map) in holders {
                    if *d != vid && map.get(i as usize) == Some(d) && ec.is_none() {
                        let target = ObjectId::data(*d, ObjIndex(i as u32));
                        client.flatten_obj(target, freed).await?;
                    }
                }
                client.remove_data(freed, ec).await?;
                // Not read again by the next gc.
                let at = INODE_HEADER_LEN as u64 + 4 * i;
                let hole = entry(checked, i, Vid::NONE).to_be_bytes();
                client
                    .write_obj(ObjectId::inode(vid), at, Bytes::copy_from_slice(&hole))
                    .await?;
                Ok(i)
            })
            .buffer_unordered(PARALLEL)
            .collect()
            .await;
        let mut freed = HashSet::new();
        for r in results {
            freed.insert(r?);
        }
        report.freed_objects += freed.len() as u64;
        report.freed_bytes += freed.len() as u64 * header.object_size as u64;
        let still_read = map
            .iter()
            .enumerate()
            .any(|(i, &v)| v == vid && !freed.contains(&(i as u64)));
        if needed.contains(&vid) || still_read {
            report.kept_inodes += 1;
            continue;
        }
        client.remove_obj(ObjectId::inode(vid)).await?;
        unhide(client, vid).await?;
        report.removed_inodes += 1;
    }
    Ok(report)
}

/// One inode of `dog vdi tree`.
#[derive(Debug, Clone, Serialize)]
pub struct TreeNode {
    pub vid: Vid,
    /// `NAME`, `NAME@TAG`, or for a deleted inode kept for others what it was.
    pub name: String,
    /// The inode it was made from, [`Vid::NONE`] for none.
    pub parent_vid: Vid,
    /// What it is: `vdi`, `snapshot`, `clone` (a VDI made from another VDI's snapshot) or
    /// `deleted` (kept while others read its objects).
    pub kind: String,
    /// Unix seconds: when the snapshot was taken, or the VDI made.
    pub time: u64,
}

/// Every inode reachable from the table and every deleted one still kept, with its parent.
pub async fn tree(client: &Arc<Client>) -> Result<Vec<TreeNode>, VdiError> {
    let live = load_live(client).await?;
    let by_vid: HashMap<Vid, &LiveInode> = live.iter().map(|l| (l.header.vid, l)).collect();
    let mut out: Vec<TreeNode> = live
        .iter()
        .map(|l| {
            let parent_name = by_vid.get(&Vid(l.header.parent)).map(|p| &p.header.name);
            let kind = if l.tag.is_some() {
                "snapshot"
            } else if parent_name.is_some_and(|p| *p != l.header.name) {
                "clone"
            } else {
                "vdi"
            };
            TreeNode {
                vid: l.header.vid,
                name: l.full.clone(),
                parent_vid: Vid(l.header.parent),
                kind: kind.into(),
                time: if l.header.snapshot != 0 {
                    l.header.snapshot as u64
                } else {
                    l.header.created
                },
            }
        })
        .collect();
    for (vid, rec) in hidden(client).await? {
        if by_vid.contains_key(&vid) {
            continue;
        }
        let Ok((h, _)) = read_inode_unchecked(client, vid).await else {
            continue;
        };
        out.push(TreeNode {
            vid,
            name: match rec.tag {
                Some(t) => objstore_proto::name::snapshot_name(&rec.name, &t),
                None => rec.name,
            },
            parent_vid: Vid(h.parent),
            kind: "deleted".into(),
            time: if h.snapshot != 0 {
                h.snapshot as u64
            } else {
                h.created
            },
        });
    }
    out.sort_by_key(|n| (n.time, n.vid));
    Ok(out)
}
