//! The VDI table and the operations on whole VDIs.

use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use objstore_proto::keys;
use objstore_proto::oid::{ObjIndex, ObjectId, Vid, MAX_VID};
use objstore_proto::redundancy::Redundancy;

use super::inode::InodeHeader;
use super::{check_size, validate_name, Vdi, VdiError, PARALLEL};
use crate::client::{Client, ClientError};
use crate::lock;

#[derive(Serialize, Deserialize)]
struct TableEntry {
    vid: Vid,
}

/// What `dog vdi list` and `dog vdi info` show.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VdiInfo {
    pub name: String,
    pub vid: Vid,
    pub size: u64,
    /// Bytes of allocated objects.
    pub used: u64,
    pub allocated_objects: u64,
    pub object_size: u32,
    pub copies: u8,
    /// How its data objects are kept: N full copies or an `x:y` erasure code.
    #[serde(default)]
    pub redundancy: Option<Redundancy>,
    /// Bytes its allocated objects take on the nodes' disks: `used` times the copies, or
    /// times (x + y) / x (strips rounded up to whole columns).
    #[serde(default)]
    pub raw_used: u64,
    /// Unix seconds; a snapshot keeps its VDI's.
    pub created: u64,
    /// The snapshot's tag (the entry is `NAME@TAG`), None for a VDI.
    #[serde(default)]
    pub tag: Option<String>,
    /// When the snapshot was taken (Unix seconds), 0 for a VDI.
    #[serde(default)]
    pub snapshot_time: u64,
    /// The inode it was made from (a snapshot, or the snapshot a clone was made from), or
    /// [`Vid::NONE`].
    #[serde(default)]
    pub parent_vid: Vid,
    /// The parent's name (`NAME@TAG`), when listed and still there.
    #[serde(default)]
    pub parent: Option<String>,
    /// Bytes of objects that nothing else reads (what deleting it would free), when listed.
    #[serde(default)]
    pub alone: Option<u64>,
}

impl VdiInfo {
    /// `NAME` or `NAME@TAG`.
    pub fn full_name(&self) -> String {
        match &self.tag {
            Some(t) => objstore_proto::name::snapshot_name(&self.name, t),
            None => self.name.clone(),
        }
    }

    /// A clone: made from a snapshot of another VDI.
    pub fn is_clone_of(&self, parent: &VdiInfo) -> bool {
        self.parent_vid == parent.vid && self.name != parent.name
    }
}

/// The vid of VDI `name` or snapshot `NAME@TAG`.
pub(crate) async fn lookup(client: &Client, name: &str) -> Result<Vid, VdiError> {
    objstore_proto::name::split_snapshot(name)?;
    let raw = client
        .kv_get(&keys::vdi(name))
        .await?
        .ok_or_else(|| VdiError::NotFound(name.to_string()))?;
    let e: TableEntry = serde_json::from_str(&raw).map_err(|e| VdiError::Corrupt {
        name: name.to_string(),
        reason: format!("bad VDI table entry: {e}"),
    })?;
    Ok(e.vid)
}

pub(super) fn table_entry(vid: Vid) -> String {
    serde_json::to_string(&TableEntry { vid }).expect("serializable")
}

pub(super) async fn alloc_vid(client: &Client) -> Result<Vid, VdiError> {
    loop {
        let cur = client.kv_get(keys::NEXT_VID).await?;
        let next: u32 = cur.as_deref().and_then(|s| s.parse().ok()).unwrap_or(1);
        if next > MAX_VID {
            return Err(VdiError::NoVid);
        }
        let new = (next + 1).to_string();
        if client
            .kv_cas(keys::NEXT_VID, cur.as_deref(), Some(&new))
            .await?
        {
            return Ok(Vid(next));
        }
    }
}

pub(super) fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Creates a thin VDI: no data object exists until it is written.
pub async fn create(client: &Client, name: &str, size: u64) -> Result<VdiInfo, VdiError> {
    create_with(client, name, size, None).await
}

/// [`create`] with its data objects kept as `redundancy` (None: the cluster's default). Full
/// copies must be the cluster's number of copies; an erasure code needs as many zones as
/// strips.
pub async fn create_with(
    client: &Client,
    name: &str,
    size: u64,
    redundancy: Option<Redundancy>,
) -> Result<VdiInfo, VdiError> {
    validate_name(name)?;
    let view = client.view();
    let cfg = view.config()?;
    check_size(name, size, cfg.object_size)?;
    let redundancy = redundancy.unwrap_or(cfg.default_redundancy());
    let refuse = |reason: String| VdiError::Redundancy {
        name: name.to_string(),
        reason,
    };
    match redundancy {
        Redundancy::Copies(n) if n != cfg.copies => {
            return Err(refuse(format!(
                "the cluster keeps {} full copies of every object; a VDI of {n} copies is not offered (erasure coding is: x:y)",
                cfg.copies
            )))
        }
        Redundancy::Copies(_) => {}
        r => r
            .validate(0, view.info.view.zones())
            .map_err(refuse)?,
    }
    let key = keys::vdi(name);
    if client.kv_get(&key).await?.is_some() {
        return Err(VdiError::Exists(name.to_string()));
    }
    let vid = alloc_vid(client).await?;
    let entry = serde_json::to_string(&TableEntry { vid }).expect("serializable");
    if !client.kv_cas(&key, None, Some(&entry)).await? {
        return Err(VdiError::Exists(name.to_string()));
    }
    let header = InodeHeader {
        name: name.to_string(),
        vid,
        object_size: cfg.object_size,
        size,
        created: now_secs(),
        parent: 0,
        snapshot: 0,
        copies: super::inode::redundancy_byte(redundancy),
        checked: true,
    };
    if let Err(e) = client
        .write_obj(ObjectId::inode(vid), 0, Bytes::from(header.encode()))
        .await
    {
        let _ = client.kv_cas(&key, Some(&entry), None).await;
        return Err(e.into());
    }
    Ok(Vdi::summary(&header, &[], None))
}

/// Every VDI and snapshot, sorted by name (a VDI's snapshots right after it, oldest first),
/// with the bytes each alone holds and its parent's name.
pub async fn list(client: &Arc<Client>) -> Result<Vec<VdiInfo>, VdiError> {
    let inodes = super::space::load_live(client).await?;
    Ok(super::space::account(&inodes))
}

/// Fails with [`VdiError::Attached`] while someone holds the VDI's attachment lock.
pub async fn check_not_attached(client: &Client, name: &str) -> Result<(), VdiError> {
    if let Some(holder) = lock::holder(client, name).await? {
        return Err(VdiError::Attached {
            name: name.to_string(),
            host: holder.host,
        });
    }
    Ok(())
}

/// Deletes a VDI and every object it owns (its snapshots stay), or snapshot `NAME@TAG`
/// ([`super::delete_snapshot`]).
pub async fn delete(client: &Arc<Client>, name: &str) -> Result<(), VdiError> {
    if name.contains('@') {
        return super::delete_snapshot(client, name).await.map(drop);
    }
    delete_held(client, name, None).await
}

/// [`delete`], also when the VDI's attachment lock is held by `owner` (the caller itself: a
/// mount deleting a VDI it attached); the lock goes with the VDI.
pub async fn delete_held(
    client: &Arc<Client>,
    name: &str,
    owner: Option<&str>,
) -> Result<(), VdiError> {
    use futures::StreamExt;
    match lock::holder(client, name).await? {
        Some(holder) if Some(holder.owner.as_str()) != owner => {
            return Err(VdiError::Attached {
                name: name.to_string(),
                host: holder.host,
            })
        }
        _ => {}
    }
    let lock_key = keys::lock(name);
    let vdi = Vdi::open(client.clone(), name).await?;
    let vid = vdi.header().vid;
    let owned: Vec<ObjectId> = vdi
        .map
        .read()
        .unwrap()
        .iter()
        .enumerate()
        .filter(|(_, &v)| v == vid)
        .map(|(i, _)| ObjectId::data(vid, ObjIndex(i as u32)))
        .collect();
    let ec = vdi.header().ec();
    let results: Vec<Result<(), ClientError>> = futures::stream::iter(owned)
        .map(|oid| client.remove_data(oid, ec))
        .buffer_unordered(PARALLEL)
        .collect()
        .await;
    results.into_iter().collect::<Result<Vec<()>, _>>()?;
    client.remove_obj(ObjectId::inode(vid)).await?;
    let key = keys::vdi(name);
    let entry = serde_json::to_string(&TableEntry { vid }).expect("serializable");
    client.kv_cas(&key, Some(&entry), None).await?;
    // Attachment records of the VDI go with it (a lock taken while we deleted is dropped).
    for key in [lock_key, keys::gen(name)] {
        if let Some(cur) = client.kv_get(&key).await? {
            let _ = client.kv_cas(&key, Some(&cur), None).await?;
        }
    }
    if vdi.header().parent != 0 {
        // Objects of deleted snapshots that only this VDI still read are free now.
        if let Err(e) = super::gc(client).await {
            tracing::warn!("VDI '{name}' deleted; freeing its deleted snapshots' objects failed (the next delete or 'dog vdi gc' retries): {e}");
        }
    }
    Ok(())
}

/// Grows a VDI; shrinking is refused.
pub async fn resize(client: &Arc<Client>, name: &str, new_size: u64) -> Result<VdiInfo, VdiError> {
    let vdi = Vdi::open(client.clone(), name).await?;
    vdi.grow(new_size).await?;
    Ok(vdi.info())
}

/// Every VDI's name and id, sorted by name (one request, no inode reads).
pub async fn list_names(client: &Client) -> Result<Vec<(String, Vid)>, VdiError> {
    let mut out = Vec::new();
    for (key, raw) in client.kv_list(keys::VDI_PREFIX).await? {
        let Some(name) = key.strip_prefix(keys::VDI_PREFIX) else {
            continue;
        };
        if let Ok(e) = serde_json::from_str::<TableEntry>(&raw) {
            out.push((name.to_string(), e.vid));
        }
    }
    Ok(out)
}
