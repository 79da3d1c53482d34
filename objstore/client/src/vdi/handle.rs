//! An open VDI.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use bytes::Bytes;

use objstore_proto::extent::extents;
use objstore_proto::oid::{ObjectId, INODE_HEADER_LEN};
use objstore_proto::size::format_size;

use super::inode::{read_inode, InodeHeader};
use super::table::{lookup, VdiInfo};
use super::{check_size, VdiError};
use crate::client::Client;
use crate::lock;

/// An open VDI: its inode header and allocation map, cached.
pub struct Vdi {
    client: Arc<Client>,
    header: RwLock<InodeHeader>,
    pub(super) map: RwLock<Vec<u32>>,
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

    pub(super) fn summary(h: &InodeHeader, map: &[u32]) -> VdiInfo {
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
