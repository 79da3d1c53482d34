//! Snapshots, clones and rollback (`dog vdi snapshot | clone | rollback | delete NAME@TAG`).
//!
//! A snapshot freezes the VDI's current inode: the table entry `NAME@TAG` takes its vid, and
//! `NAME` moves to a new inode whose parent is the snapshot and whose map is a copy of the
//! snapshot's. No data object is copied: the new inode's entries name the snapshot's objects
//! (or older ones), and the first write to such an index makes the VDI's own copy of that
//! object on the nodes (`CowWrite`). A snapshot's objects are never written again. A clone is
//! the same from a snapshot under a new name; a rollback replaces `NAME`'s inode by a new one
//! made from the snapshot, and the old one's objects are freed. See [`super::space`] for when
//! objects are freed and why that is safe.

use std::sync::Arc;

use objstore_proto::keys;
use objstore_proto::name::{snapshot_name, split_snapshot, validate_name, validate_tag};
use objstore_proto::oid::{ObjectId, Vid};

use super::inode::{read_inode, write_inode, InodeHeader};
use super::space::{self, GcReport};
use super::table::{alloc_vid, lookup, now_secs, table_entry, VdiInfo};
use super::{Vdi, VdiError};
use crate::client::Client;
use crate::lock;

/// Refuses when the attachment lock of `name` is held by anyone but `owner`; true if
/// `owner` holds it.
async fn check_lock(client: &Client, name: &str, owner: Option<&str>) -> Result<bool, VdiError> {
    match lock::holder(client, name).await? {
        Some(h) if Some(h.owner.as_str()) != owner => Err(VdiError::Attached {
            name: name.to_string(),
            host: h.host,
        }),
        Some(_) => Ok(true),
        None => Ok(false),
    }
}

/// Removes inode `vid` that an operation wrote but did not make reachable (undoing itself);
/// a failure leaves an inode nothing reaches (space, not data).
async fn drop_inode(client: &Client, vid: Vid) {
    if let Err(e) = client.remove_obj(ObjectId::inode(vid)).await {
        tracing::warn!("removing the unused inode of VDI id {:#x}: {e}", vid.0);
    }
}

/// A tag for a snapshot taken without one: the UTC time, made unique.
async fn new_tag(client: &Client, name: &str) -> Result<String, VdiError> {
    let base = lock::format_utc(now_secs())
        .replace([' ', ':'], "-")
        .trim_end_matches("-UTC")
        .to_string();
    let mut tag = base.clone();
    let mut n = 1;
    while client
        .kv_get(&keys::vdi(&snapshot_name(name, &tag)))
        .await?
        .is_some()
    {
        n += 1;
        tag = format!("{base}.{n}");
    }
    Ok(tag)
}

/// The new inode for `name` made from `from` (its parent): same size and map.
fn child(from: &InodeHeader, name: &str, vid: Vid, created: u64) -> InodeHeader {
    InodeHeader {
        name: name.to_string(),
        vid,
        object_size: from.object_size,
        size: from.size,
        created,
        parent: from.vid.0,
        snapshot: 0,
        copies: from.copies,
        checked: true,
    }
}

/// Takes snapshot `NAME@TAG` of VDI `name` (a tag is made from the time when none is given).
/// Refused while someone other than `owner` holds the VDI's attachment lock: a mount must
/// flush its cache and take the snapshot itself.
pub async fn snapshot(
    client: &Arc<Client>,
    name: &str,
    tag: Option<&str>,
    owner: Option<&str>,
) -> Result<VdiInfo, VdiError> {
    validate_name(name)?;
    let tag = match tag {
        Some(t) => {
            validate_tag(t)?;
            t.to_string()
        }
        None => new_tag(client, name).await?,
    };
    let full = snapshot_name(name, &tag);
    check_lock(client, name, owner).await?;
    let snap_key = keys::vdi(&full);
    if client.kv_get(&snap_key).await?.is_some() {
        return Err(VdiError::Exists(full));
    }
    let old = lookup(client, name).await?;
    let (mut header, map) = read_inode(client, name, old).await?;
    let new = alloc_vid(client).await?;
    write_inode(client, &child(&header, name, new, header.created), &map).await?;
    // Hidden while it is in neither table entry: a crash there leaves it to gc, which keeps
    // every object the new inode reads.
    space::hide(client, old, name, Some(&tag)).await?;
    let key = keys::vdi(name);
    if !client
        .kv_cas(&key, Some(&table_entry(old)), Some(&table_entry(new)))
        .await?
    {
        space::unhide_quietly(client, old).await;
        drop_inode(client, new).await;
        return Err(VdiError::Unavailable {
            name: name.to_string(),
            reason: "it changed while the snapshot was taken (deleted, rolled back or snapshotted by someone else); nothing was taken".into(),
        });
    }
    if !client
        .kv_cas(&snap_key, None, Some(&table_entry(old)))
        .await?
    {
        // Another snapshot took the tag meanwhile: this one stays hidden (gc frees it once
        // nothing reads it) and the VDI goes on from the new inode.
        return Err(VdiError::Exists(full));
    }
    space::unhide_quietly(client, old).await;
    header.snapshot = now_secs().min(u32::MAX as u64) as u32;
    // Marks the inode frozen (for `dog vdi tree` and check); the table is what makes it so.
    let _ = write_inode_header(client, &header).await;
    let mut info = Vdi::summary(&header, &map, Some(&tag));
    info.parent_vid = Vid(header.parent);
    Ok(info)
}

async fn write_inode_header(client: &Client, header: &InodeHeader) -> Result<(), VdiError> {
    client
        .write_obj(
            ObjectId::inode(header.vid),
            0,
            bytes::Bytes::from(header.encode()),
        )
        .await?;
    Ok(())
}

/// Splits `NAME@TAG`, refusing a plain name.
fn snapshot_parts(full: &str) -> Result<(&str, &str), VdiError> {
    match split_snapshot(full)? {
        (name, Some(tag)) => Ok((name, tag)),
        (name, None) => Err(VdiError::NotSnapshot(name.to_string())),
    }
}

/// Makes VDI `new` from snapshot `NAME@TAG`: it reads the snapshot's objects until it writes
/// its own.
pub async fn clone(client: &Arc<Client>, from: &str, new_name: &str) -> Result<VdiInfo, VdiError> {
    snapshot_parts(from)?;
    validate_name(new_name)?;
    let src = lookup(client, from).await?;
    let (header, map) = read_inode(client, from, src).await?;
    let key = keys::vdi(new_name);
    if client.kv_get(&key).await?.is_some() {
        return Err(VdiError::Exists(new_name.to_string()));
    }
    let vid = alloc_vid(client).await?;
    let h = child(&header, new_name, vid, now_secs());
    write_inode(client, &h, &map).await?;
    if !client.kv_cas(&key, None, Some(&table_entry(vid))).await? {
        drop_inode(client, vid).await;
        return Err(VdiError::Exists(new_name.to_string()));
    }
    still_there(client, from, src, new_name, vid).await?;
    let mut info = Vdi::summary(&h, &map, None);
    info.parent = Some(from.to_string());
    Ok(info)
}

/// After making `name` (inode `vid`) from snapshot `from` (inode `src`): if the snapshot was
/// deleted meanwhile, a gc may have freed objects the new inode reads, so the new inode is
/// taken back and the operation fails.
async fn still_there(
    client: &Arc<Client>,
    from: &str,
    src: Vid,
    name: &str,
    vid: Vid,
) -> Result<(), VdiError> {
    if client.kv_get(&keys::vdi(from)).await? == Some(table_entry(src)) {
        return Ok(());
    }
    space::hide(client, vid, name, None).await?;
    let key = keys::vdi(name);
    client.kv_cas(&key, Some(&table_entry(vid)), None).await?;
    let _ = space::gc(client).await;
    Err(VdiError::NotFound(from.to_string()))
}

/// Rolls VDI `NAME` back to snapshot `NAME@TAG`: `NAME` gets a new inode made from the
/// snapshot, and what was written since is freed. Refused while someone other than `owner`
/// holds the attachment lock. A VDI deleted since the snapshot is made again.
pub async fn rollback(
    client: &Arc<Client>,
    full: &str,
    owner: Option<&str>,
) -> Result<VdiInfo, VdiError> {
    let (name, _) = snapshot_parts(full)?;
    let held = check_lock(client, name, owner).await?;
    let src = lookup(client, full).await?;
    let (header, map) = read_inode(client, full, src).await?;
    let key = keys::vdi(name);
    let cur = client.kv_get(&key).await?;
    let old = match &cur {
        Some(_) => Some(lookup(client, name).await?),
        None => None,
    };
    let created = match old {
        Some(o) => read_inode(client, name, o).await?.0.created,
        None => header.created,
    };
    let vid = alloc_vid(client).await?;
    let h = child(&header, name, vid, created);
    write_inode(client, &h, &map).await?;
    if let Some(o) = old {
        space::hide(client, o, name, None).await?;
    }
    if !client
        .kv_cas(&key, cur.as_deref(), Some(&table_entry(vid)))
        .await?
    {
        if let Some(o) = old {
            space::unhide_quietly(client, o).await;
        }
        drop_inode(client, vid).await;
        return Err(VdiError::Unavailable {
            name: name.to_string(),
            reason: "it changed while it was rolled back; nothing was changed".into(),
        });
    }
    still_there(client, full, src, name, vid).await?;
    // The attachment generation moves on: a cache that had the VDI attached drops what it
    // held of the old inode when it attaches again. Not when the holder itself rolls back
    // (a mount, which dropped its cache of the VDI): its lock keeps its generation.
    if !held {
        let _ = lock::note_unlocked_change(client, name).await;
    }
    space::gc(client).await?;
    let mut info = Vdi::summary(&h, &map, None);
    info.parent = Some(full.to_string());
    Ok(info)
}

/// VDIs made from snapshot inode `vid` under another name (clones), by name.
pub async fn clones_of(client: &Arc<Client>, vid: Vid) -> Result<Vec<String>, VdiError> {
    let live = space::load_live(client).await?;
    let me = live.iter().find(|l| l.header.vid == vid);
    let Some(me) = me else {
        return Ok(Vec::new());
    };
    let mut out: Vec<String> = live
        .iter()
        .filter(|l| l.header.parent == vid.0 && l.header.name != me.header.name)
        .map(|l| l.full.clone())
        .collect();
    out.sort();
    Ok(out)
}

/// Deletes snapshot `NAME@TAG`, refused while clones were made from it; the objects nothing
/// else reads are freed.
pub async fn delete_snapshot(client: &Arc<Client>, full: &str) -> Result<GcReport, VdiError> {
    let (name, tag) = snapshot_parts(full)?;
    let vid = lookup(client, full).await?;
    let clones = clones_of(client, vid).await?;
    if !clones.is_empty() {
        return Err(VdiError::HasClones {
            name: full.to_string(),
            clones,
        });
    }
    space::hide(client, vid, name, Some(tag)).await?;
    let key = keys::vdi(full);
    if !client.kv_cas(&key, Some(&table_entry(vid)), None).await? {
        return Err(VdiError::NotFound(full.to_string()));
    }
    space::gc(client).await
}
