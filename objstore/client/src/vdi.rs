//! VDIs: virtual disks cut into objects.
//!
//! The VDI table (`vdi/<name>` → vid) lives in the membership store; vids come from a counter
//! there and are never reused. Each VDI has an inode object (`ObjectId::inode(vid)`):
//!
//! ```text
//! 0     8    12           16    24       32      36        40      41    46        48
//! [magic][vid][object_size][size][created][parent][snapshot][copies][rsv][name_len][name ...]
//! 4096: allocation map, one big-endian u32 per object index: 0 = hole, else the vid owning it
//! ```
//! Holes read as zeros and cost no object and no request. The first write to an index writes the
//! data object on every replica, then records it in the map.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use thiserror::Error;

use objstore_proto::extent::extents;
use objstore_proto::keys;
pub use objstore_proto::name::{validate_name, InvalidName};
use objstore_proto::oid::{ObjectId, INODE_HEADER_LEN, MAX_INDEXES, MAX_VID};
use objstore_proto::size::format_size;

use crate::client::{Client, ClientError};
use crate::lock;

const INODE_MAGIC: &[u8; 8] = b"SHINODE1";
/// Most object requests one VDI operation keeps in flight.
pub const PARALLEL: usize = 16;

#[derive(Debug, Error)]
#[non_exhaustive]
pub enum VdiError {
    #[error(transparent)]
    InvalidName(#[from] InvalidName),
    #[error("VDI '{0}' already exists")]
    Exists(String),
    #[error("no VDI named '{0}'")]
    NotFound(String),
    #[error("invalid size for VDI '{name}': {reason}")]
    InvalidSize { name: String, reason: String },
    /// Larger than the cluster can address with the VDI's object size.
    #[error(
        "invalid size for VDI '{name}': {} is over the limit of {} with {} objects",
        format_size(*size),
        format_size(*max),
        format_size(*object_size as u64)
    )]
    TooLarge {
        name: String,
        size: u64,
        max: u64,
        object_size: u32,
    },
    #[error("range {offset}+{len} is past the end of VDI '{name}' ({size} bytes)")]
    OutOfRange {
        name: String,
        offset: u64,
        len: u64,
        size: u64,
    },
    #[error("VDI '{name}' is damaged: {reason}")]
    Corrupt { name: String, reason: String },
    #[error("no VDI id left (all {MAX_VID} are used)")]
    NoVid,
    /// A layer above the cluster (e.g. sheepfs's cache) could not do its part.
    #[error("VDI '{name}': {reason}")]
    Unavailable { name: String, reason: String },
    #[error("VDI '{name}' is attached read-write by {host}: detach it (unmount) or 'dog vdi lock break {name}' first")]
    Attached { name: String, host: String },
    #[error(transparent)]
    Cluster(#[from] ClientError),
}

impl From<lock::LockError> for VdiError {
    fn from(e: lock::LockError) -> Self {
        use lock::LockError as L;
        match e {
            L::Held { vdi, host, .. } => VdiError::Attached { name: vdi, host },
            L::InvalidName(e) => VdiError::InvalidName(e),
            L::NotFound(name) => VdiError::NotFound(name),
            L::Corrupt { name, reason } => VdiError::Corrupt { name, reason },
            L::Cluster(e) => VdiError::Cluster(e),
        }
    }
}

/// The largest VDI the cluster can hold with objects of `object_size` bytes.
pub fn max_size(object_size: u32) -> u64 {
    object_size as u64 * MAX_INDEXES
}

fn check_size(name: &str, size: u64, object_size: u32) -> Result<(), VdiError> {
    if size > max_size(object_size) {
        return Err(VdiError::TooLarge {
            name: name.to_string(),
            size,
            max: max_size(object_size),
            object_size,
        });
    }
    Ok(())
}

#[derive(Serialize, Deserialize)]
struct TableEntry {
    vid: u32,
}

/// The part of a `lock/<name>` record (`lock::LockInfo`) that delete needs; read here so this
/// module does not depend on the lock module above it.
#[derive(Deserialize)]
struct LockHolder {
    host: String,
}

/// The fixed part of an inode.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InodeHeader {
    pub name: String,
    pub vid: u32,
    pub object_size: u32,
    pub size: u64,
    /// Unix seconds.
    pub created: u64,
    pub parent: u32,
    pub snapshot: u32,
    pub copies: u8,
}

impl InodeHeader {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; INODE_HEADER_LEN];
        b[0..8].copy_from_slice(INODE_MAGIC);
        b[8..12].copy_from_slice(&self.vid.to_be_bytes());
        b[12..16].copy_from_slice(&self.object_size.to_be_bytes());
        b[16..24].copy_from_slice(&self.size.to_be_bytes());
        b[24..32].copy_from_slice(&self.created.to_be_bytes());
        b[32..36].copy_from_slice(&self.parent.to_be_bytes());
        b[36..40].copy_from_slice(&self.snapshot.to_be_bytes());
        b[40] = self.copies;
        let name = self.name.as_bytes();
        b[46..48].copy_from_slice(&(name.len() as u16).to_be_bytes());
        b[48..48 + name.len()].copy_from_slice(name);
        b
    }

    pub fn decode(b: &[u8]) -> Result<InodeHeader, String> {
        if b.len() < INODE_HEADER_LEN {
            return Err(format!(
                "inode is {} bytes, shorter than its header",
                b.len()
            ));
        }
        if &b[0..8] != INODE_MAGIC {
            return Err("inode has a bad magic number".into());
        }
        let u32_at = |i: usize| u32::from_be_bytes(b[i..i + 4].try_into().unwrap());
        let u64_at = |i: usize| u64::from_be_bytes(b[i..i + 8].try_into().unwrap());
        let name_len = u16::from_be_bytes([b[46], b[47]]) as usize;
        if name_len == 0 || name_len > 255 {
            return Err(format!("inode name length {name_len} is out of range"));
        }
        let object_size = u32_at(12);
        if !object_size.is_power_of_two() {
            return Err(format!(
                "inode object size {object_size} is not a power of two"
            ));
        }
        Ok(InodeHeader {
            vid: u32_at(8),
            object_size,
            size: u64_at(16),
            created: u64_at(24),
            parent: u32_at(32),
            snapshot: u32_at(36),
            copies: b[40],
            name: String::from_utf8(b[48..48 + name_len].to_vec())
                .map_err(|_| "inode name is not UTF-8".to_string())?,
        })
    }

    /// Number of object indexes the VDI spans.
    pub fn indexes(&self) -> u64 {
        self.size.div_ceil(self.object_size as u64)
    }
}

/// What `dog vdi list` and `dog vdi info` show.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VdiInfo {
    pub name: String,
    pub vid: u32,
    pub size: u64,
    /// Bytes of allocated objects.
    pub used: u64,
    pub allocated_objects: u64,
    pub object_size: u32,
    pub copies: u8,
    pub created: u64,
}

async fn lookup(client: &Client, name: &str) -> Result<u32, VdiError> {
    validate_name(name)?;
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

async fn alloc_vid(client: &Client) -> Result<u32, VdiError> {
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
            return Ok(next);
        }
    }
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Creates a thin VDI: no data object exists until it is written.
pub async fn create(client: &Client, name: &str, size: u64) -> Result<VdiInfo, VdiError> {
    validate_name(name)?;
    let cfg = client.view().config()?;
    check_size(name, size, cfg.object_size)?;
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
        copies: cfg.copies as u8,
    };
    if let Err(e) = client
        .write_obj(ObjectId::inode(vid), 0, Bytes::from(header.encode()))
        .await
    {
        let _ = client.kv_cas(&key, Some(&entry), None).await;
        return Err(e.into());
    }
    Ok(Vdi::summary(&header, &[]))
}

/// Every VDI, sorted by name.
pub async fn list(client: &Arc<Client>) -> Result<Vec<VdiInfo>, VdiError> {
    use futures::StreamExt;
    let entries = client.kv_list(keys::VDI_PREFIX).await?;
    let names: Vec<String> = entries
        .into_iter()
        .filter_map(|(k, _)| k.strip_prefix(keys::VDI_PREFIX).map(str::to_string))
        .collect();
    let infos: Vec<Result<VdiInfo, VdiError>> = futures::stream::iter(names)
        .map(|n| {
            let client = client.clone();
            async move { Ok(Vdi::open(client, &n).await?.info()) }
        })
        .buffered(PARALLEL)
        .collect()
        .await;
    let mut out = Vec::new();
    for i in infos {
        match i {
            Ok(i) => out.push(i),
            // Deleted while we listed.
            Err(VdiError::NotFound(_)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// Fails with [`VdiError::Attached`] while someone holds the VDI's attachment lock.
pub async fn check_not_attached(client: &Client, name: &str) -> Result<(), VdiError> {
    validate_name(name)?;
    if let Some(raw) = client.kv_get(&keys::lock(name)).await? {
        let holder: LockHolder = serde_json::from_str(&raw).map_err(|e| VdiError::Corrupt {
            name: name.to_string(),
            reason: format!("bad lock record: {e} (free it with 'dog vdi lock break {name}')"),
        })?;
        return Err(VdiError::Attached {
            name: name.to_string(),
            host: holder.host,
        });
    }
    Ok(())
}

/// Deletes a VDI and every object it owns.
pub async fn delete(client: &Arc<Client>, name: &str) -> Result<(), VdiError> {
    use futures::StreamExt;
    check_not_attached(client, name).await?;
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
        .map(|(i, _)| ObjectId::data(vid, i as u32))
        .collect();
    let results: Vec<Result<(), ClientError>> = futures::stream::iter(owned)
        .map(|oid| client.remove_obj(oid))
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
    Ok(())
}

/// Grows a VDI; shrinking is refused.
pub async fn resize(client: &Arc<Client>, name: &str, new_size: u64) -> Result<VdiInfo, VdiError> {
    let vdi = Vdi::open(client.clone(), name).await?;
    vdi.grow(new_size).await?;
    Ok(vdi.info())
}

/// Every VDI's name and id, sorted by name (one request, no inode reads).
pub async fn list_names(client: &Client) -> Result<Vec<(String, u32)>, VdiError> {
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

/// Reads a VDI's inode: its header and allocation map.
async fn read_inode(
    client: &Client,
    name: &str,
    vid: u32,
) -> Result<(InodeHeader, Vec<u32>), VdiError> {
    let inode = ObjectId::inode(vid);
    let corrupt = |reason: String| VdiError::Corrupt {
        name: name.to_string(),
        reason,
    };
    let head = client
        .read_obj(inode, 0, INODE_HEADER_LEN as u32)
        .await
        .map_err(|e| match e {
            ClientError::NotFound(_) => corrupt("its inode object is missing".into()),
            e => e.into(),
        })?;
    let header = InodeHeader::decode(&head).map_err(corrupt)?;
    let n = header.indexes();
    if n > MAX_INDEXES {
        return Err(corrupt(format!("{n} objects is over the limit")));
    }
    let raw = if n == 0 {
        Bytes::new()
    } else {
        client
            .read_obj(inode, INODE_HEADER_LEN as u64, (n * 4) as u32)
            .await?
    };
    let map = raw
        .chunks_exact(4)
        .map(|c| u32::from_be_bytes(c.try_into().unwrap()))
        .collect();
    Ok((header, map))
}

/// An open VDI: its inode header and allocation map, cached.
pub struct Vdi {
    client: Arc<Client>,
    header: RwLock<InodeHeader>,
    map: RwLock<Vec<u32>>,
    /// Held shared by every change of the inode made through this handle (an object mapped
    /// or unmapped, the size grown) from its write to the cluster until the copy here has it
    /// too, and exclusively by [`Vdi::refresh`]: a refresh that read the inode before such a
    /// change landed would otherwise put the older inode back over it (a freshly allocated
    /// object would then read as a hole, zeros).
    changes: tokio::sync::RwLock<()>,
    /// Set on a handle whose writes are made under the VDI's attachment lock (a cache that
    /// attached it keeps itself coherent with them).
    under_lock: AtomicBool,
    /// Done once this handle's first change of the data has bumped the VDI's attachment
    /// generation ([`lock::note_unlocked_change`]): a cache that attaches the VDI later then
    /// sees that it was written without the lock, and drops what it had cached.
    change_noted: tokio::sync::OnceCell<()>,
}

impl Vdi {
    pub async fn open(client: Arc<Client>, name: &str) -> Result<Vdi, VdiError> {
        let vid = lookup(&client, name).await?;
        let (header, map) = read_inode(&client, name, vid).await?;
        Ok(Vdi {
            client,
            header: RwLock::new(header),
            map: RwLock::new(map),
            changes: tokio::sync::RwLock::new(()),
            under_lock: AtomicBool::new(false),
            change_noted: tokio::sync::OnceCell::new(),
        })
    }

    /// Marks this handle as writing under the VDI's attachment lock, which the caller holds:
    /// its writes then leave the attachment generation alone.
    pub fn set_under_lock(&self) {
        self.under_lock.store(true, Ordering::Relaxed);
    }

    /// Before this handle's first change of the data without the lock, bumps the VDI's
    /// attachment generation (once per handle; concurrent first writes wait for it).
    async fn note_change(&self) -> Result<(), VdiError> {
        if self.under_lock.load(Ordering::Relaxed) || self.change_noted.initialized() {
            return Ok(());
        }
        self.change_noted
            .get_or_try_init(|| async {
                let name = self.header.read().unwrap().name.clone();
                lock::note_unlocked_change(&self.client, &name)
                    .await
                    .map(drop)
                    .map_err(VdiError::from)
            })
            .await
            .map(drop)
    }

    /// Reads the inode again, picking up objects allocated and size changes made through
    /// another client. Fails with NotFound if the VDI was deleted or replaced meanwhile.
    pub async fn refresh(&self) -> Result<(), VdiError> {
        let (name, vid) = {
            let h = self.header.read().unwrap();
            (h.name.clone(), h.vid)
        };
        let _no_changes = self.changes.write().await;
        if lookup(&self.client, &name).await? != vid {
            return Err(VdiError::NotFound(name));
        }
        let (header, map) = read_inode(&self.client, &name, vid).await?;
        *self.header.write().unwrap() = header;
        *self.map.write().unwrap() = map;
        Ok(())
    }

    pub fn header(&self) -> InodeHeader {
        self.header.read().unwrap().clone()
    }

    pub fn size(&self) -> u64 {
        self.header.read().unwrap().size
    }

    pub fn object_size(&self) -> u32 {
        self.header.read().unwrap().object_size
    }

    fn summary(h: &InodeHeader, map: &[u32]) -> VdiInfo {
        let allocated = map.iter().filter(|&&v| v != 0).count() as u64;
        VdiInfo {
            name: h.name.clone(),
            vid: h.vid,
            size: h.size,
            used: allocated * h.object_size as u64,
            allocated_objects: allocated,
            object_size: h.object_size,
            copies: h.copies,
            created: h.created,
        }
    }

    pub fn info(&self) -> VdiInfo {
        Vdi::summary(&self.header.read().unwrap(), &self.map.read().unwrap())
    }

    /// The object holding `index`, or None for a hole.
    pub fn object(&self, index: u64) -> Option<ObjectId> {
        let map = self.map.read().unwrap();
        match map.get(index as usize) {
            Some(&v) if v != 0 => Some(ObjectId::data(v, index as u32)),
            _ => None,
        }
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<(), VdiError> {
        let h = self.header.read().unwrap();
        match offset.checked_add(len) {
            Some(end) if end <= h.size => Ok(()),
            _ => Err(VdiError::OutOfRange {
                name: h.name.clone(),
                offset,
                len,
                size: h.size,
            }),
        }
    }

    /// Splits `[offset, offset+len)` into (index, offset in object, length, offset in buffer).
    fn pieces(&self, offset: u64, len: u64) -> Vec<(u64, u64, u64, usize)> {
        extents(offset, len, self.object_size() as u64)
            .map(|e| (e.index, e.offset, e.len, e.at))
            .collect()
    }

    /// Reads `len` bytes at `offset`. Holes read as zeros without a request.
    pub async fn read_at(&self, offset: u64, len: u64) -> Result<Bytes, VdiError> {
        self.check_range(offset, len)?;
        let pieces = self.pieces(offset, len);
        if let [(idx, off, n, _)] = pieces[..] {
            // One object: hand its bytes on without a copy.
            return match self.object(idx) {
                None => Ok(Bytes::from(vec![0u8; n as usize])),
                Some(oid) => Ok(self.client.read_obj(oid, off, n as u32).await?),
            };
        }
        let mut buf = vec![0u8; len as usize];
        let reads = pieces.into_iter().filter_map(|(idx, off, n, at)| {
            let oid = self.object(idx)?;
            Some(async move {
                let data = self.client.read_obj(oid, off, n as u32).await?;
                Ok::<_, VdiError>((at, data))
            })
        });
        for r in futures::future::join_all(reads).await {
            let (at, data) = r?;
            buf[at..at + data.len()].copy_from_slice(&data);
        }
        Ok(Bytes::from(buf))
    }

    /// Writes `data` at `offset`, allocating objects as needed.
    pub async fn write_at(&self, offset: u64, data: Bytes) -> Result<(), VdiError> {
        self.check_range(offset, data.len() as u64)?;
        self.note_change().await?;
        let vid = self.header.read().unwrap().vid;
        let writes = self
            .pieces(offset, data.len() as u64)
            .into_iter()
            .map(|(idx, off, n, at)| {
                let piece = data.slice(at..at + n as usize);
                async move {
                    let oid = self
                        .object(idx)
                        .unwrap_or_else(|| ObjectId::data(vid, idx as u32));
                    self.client.write_obj(oid, off, piece).await?;
                    if self.object(idx).is_none() {
                        self.record(idx, vid).await?;
                    }
                    Ok::<_, VdiError>(())
                }
            });
        for r in futures::future::join_all(writes).await {
            r?;
        }
        Ok(())
    }

    /// Records in the inode that `index` is now held by object `vid` (0: a hole).
    async fn record(&self, index: u64, vid: u32) -> Result<(), VdiError> {
        let _changing = self.changes.read().await;
        let inode = ObjectId::inode(self.header.read().unwrap().vid);
        let at = INODE_HEADER_LEN as u64 + 4 * index;
        self.client
            .write_obj(inode, at, Bytes::copy_from_slice(&vid.to_be_bytes()))
            .await?;
        let mut map = self.map.write().unwrap();
        if map.len() <= index as usize {
            map.resize(index as usize + 1, 0);
        }
        map[index as usize] = vid;
        Ok(())
    }

    /// Grows the VDI to `new_size` bytes; shrinking is refused, the same size is a no-op.
    pub async fn grow(&self, new_size: u64) -> Result<(), VdiError> {
        let _changing = self.changes.read().await;
        let mut h = self.header();
        if new_size < h.size {
            return Err(VdiError::InvalidSize {
                name: h.name.clone(),
                reason: format!(
                    "shrinking from {} to {} is not supported",
                    format_size(h.size),
                    format_size(new_size)
                ),
            });
        }
        if new_size == h.size {
            return Ok(());
        }
        check_size(&h.name, new_size, h.object_size)?;
        h.size = new_size;
        self.client
            .write_obj(ObjectId::inode(h.vid), 0, Bytes::from(h.encode()))
            .await?;
        *self.header.write().unwrap() = h;
        Ok(())
    }

    /// Discards `[offset, offset+len)`: objects wholly inside are removed (the range becomes a
    /// hole), partly covered objects have that part zeroed. Reads return zeros afterwards.
    pub async fn discard(&self, offset: u64, len: u64) -> Result<(), VdiError> {
        self.check_range(offset, len)?;
        self.note_change().await?;
        let (vid, size, os) = {
            let h = self.header.read().unwrap();
            (h.vid, h.size, h.object_size as u64)
        };
        let work = self
            .pieces(offset, len)
            .into_iter()
            .map(|(idx, off, n, _)| async move {
                let Some(oid) = self.object(idx) else {
                    return Ok(()); // already a hole
                };
                let object_end = os.min(size - idx * os);
                if off == 0 && n >= object_end && oid.vid() == vid {
                    // Unmap first: a crash in between leaves an orphan object, never a map entry
                    // pointing at nothing.
                    self.record(idx, 0).await?;
                    self.client.remove_obj(oid).await?;
                } else {
                    let zeros = Bytes::from(vec![0u8; n as usize]);
                    self.client.write_obj(oid, off, zeros).await?;
                }
                Ok::<_, VdiError>(())
            });
        for r in futures::future::join_all(work).await {
            r?;
        }
        Ok(())
    }

    /// Makes every earlier write durable on every replica.
    pub async fn flush(&self) -> Result<(), VdiError> {
        Ok(self.client.flush().await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(validate_name("demo-1.img").is_ok());
        for bad in ["", "a/b", "a\0b", "snap@1", ".", ".."] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
        assert!(validate_name(&"x".repeat(255)).is_ok());
        assert!(validate_name(&"x".repeat(256)).is_err());
    }

    #[test]
    fn inode_header_round_trip() {
        let h = InodeHeader {
            name: "disk".into(),
            vid: 42,
            object_size: 4 << 20,
            size: 10 << 30,
            created: 1_700_000_000,
            parent: 0,
            snapshot: 0,
            copies: 3,
        };
        let b = h.encode();
        assert_eq!(b.len(), INODE_HEADER_LEN);
        assert_eq!(&b[0..8], b"SHINODE1");
        assert_eq!(InodeHeader::decode(&b).unwrap(), h);
        assert_eq!(h.indexes(), 2560);
        let mut bad = b.clone();
        bad[0] = b'X';
        assert!(InodeHeader::decode(&bad).is_err());
    }

    #[test]
    fn four_tib_fits() {
        assert!(check_size("x", 4 << 40, 4 << 20).is_ok());
        assert!(check_size("x", 64 << 40, 4 << 20).is_ok());
        let e = check_size("x", (64 << 40) + 1, 4 << 20).unwrap_err();
        assert!(matches!(e, VdiError::TooLarge { .. }));
        assert_eq!(
            e.to_string(),
            "invalid size for VDI 'x': 64.0 TiB is over the limit of 64.0 TiB with 4.0 MiB objects"
        );
    }
}
