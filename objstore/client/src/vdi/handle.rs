//! An open VDI.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use bytes::Bytes;

use objstore_proto::extent::extents;
use objstore_proto::oid::{ObjIndex, ObjectId, Vid, INODE_HEADER_LEN};
use objstore_proto::redundancy::Redundancy;
use objstore_proto::size::format_size;

use super::entries::EntryLog;
use super::inode::{read_inode, InodeHeader};
use super::table::{lookup, VdiInfo};
use super::{check_size, VdiError};
use crate::client::{Client, ClientError};
use crate::lock;

/// An open VDI: its inode header and allocation map, cached.
pub struct Vdi {
    client: Arc<Client>,
    header: RwLock<InodeHeader>,
    pub(super) map: RwLock<Vec<Vid>>,
    /// Held shared by every change of the inode made through this handle (an object mapped
    /// or unmapped: while the map here takes it and its entry is queued; the size grown: from
    /// its write to the cluster until the header here has it), and exclusively by
    /// [`Vdi::refresh`], which then writes every queued entry and waits for those on their way
    /// before it reads the inode: a refresh that read the inode before such a change landed
    /// would otherwise put the older inode back over it (a freshly allocated object would then
    /// read as a hole, zeros: issue 41).
    changes: tokio::sync::RwLock<()>,
    /// Set on a handle whose writes are made under the VDI's attachment lock (a cache that
    /// attached it keeps itself coherent with them).
    under_lock: AtomicBool,
    /// Done once this handle's first change of the data has bumped the VDI's attachment
    /// generation ([`lock::note_unlocked_change`]): a cache that attaches the VDI later then
    /// sees that it was written without the lock, and drops what it had cached.
    change_noted: tokio::sync::OnceCell<()>,
    /// `NAME@TAG` when this is a snapshot (read-only), else None.
    snapshot: Option<String>,
    /// Taken by a write that copies an ancestor's object or allocates one, per index shard:
    /// two writes to one shared index make one copy, the second writes into it.
    allocating: Vec<tokio::sync::Mutex<()>>,
    /// Map entries on their way to the inode (see [`super::entries`]).
    entries: Arc<EntryLog>,
    /// Indexes where the nodes may hold an object of this VDI that the map here does not
    /// name: a first write or copy-on-write into it failed (an owner may have taken it), a
    /// discard of it failed after it was unmapped here, or a refresh found the inode without
    /// the entry the map here had (a crash lost it before a flush). A discard of such an index removes
    /// that object all the same: left there, the next first write would write into it and
    /// bring its older blocks back over the acknowledged discard.
    doubtful: std::sync::Mutex<std::collections::HashSet<u64>>,
    /// Mapped objects found on no node, each logged once (see [`Vdi::read_mapped`]).
    missing: std::sync::Mutex<std::collections::HashSet<ObjectId>>,
    /// Ancestors' inodes read for [`Vdi::fallback`] (never written again): vid → (its
    /// parent, its map).
    ancestors: RwLock<std::collections::HashMap<Vid, Ancestor>>,
    /// Held while an ancestor's inode is read into [`Vdi::ancestors`] (one read, not one per
    /// waiting write).
    reading_ancestor: tokio::sync::Mutex<()>,
}

/// An ancestor inode as [`Vdi::fallback`] needs it: its parent and its map.
type Ancestor = (Vid, Arc<Vec<Vid>>);

const ALLOC_SHARDS: usize = 64;

impl Vdi {
    /// Opens VDI `name`, or snapshot `NAME@TAG` (read-only).
    pub async fn open(client: Arc<Client>, name: &str) -> Result<Vdi, VdiError> {
        let vid = lookup(&client, name).await?;
        let (header, map) = read_inode(&client, name, vid).await?;
        let snapshot = name.contains('@').then(|| name.to_string());
        let entries = EntryLog::new(client.clone(), ObjectId::inode(header.vid), header.checked);
        Ok(Vdi {
            client,
            header: RwLock::new(header),
            map: RwLock::new(map),
            changes: tokio::sync::RwLock::new(()),
            under_lock: AtomicBool::new(false),
            change_noted: tokio::sync::OnceCell::new(),
            snapshot,
            allocating: (0..ALLOC_SHARDS)
                .map(|_| tokio::sync::Mutex::new(()))
                .collect(),
            entries,
            doubtful: std::sync::Mutex::default(),
            missing: std::sync::Mutex::default(),
            ancestors: RwLock::default(),
            reading_ancestor: tokio::sync::Mutex::new(()),
        })
    }

    /// `NAME@TAG` when this handle is a snapshot (read-only).
    pub fn snapshot(&self) -> Option<&str> {
        self.snapshot.as_deref()
    }

    /// The name it was opened by: `NAME` or `NAME@TAG`.
    pub fn full_name(&self) -> String {
        match &self.snapshot {
            Some(s) => s.clone(),
            None => self.header.read().unwrap().name.clone(),
        }
    }

    fn check_writable(&self) -> Result<(), VdiError> {
        match &self.snapshot {
            Some(s) => Err(VdiError::ReadOnly(s.clone())),
            None => Ok(()),
        }
    }

    /// The map entry of `index`: the vid holding it, or [`Vid::NONE`] for a hole.
    pub fn entry(&self, index: u64) -> Vid {
        let map = self.map.read().unwrap();
        map.get(index as usize).copied().unwrap_or(Vid::NONE)
    }

    /// The whole allocation map (index → vid holding it, [`Vid::NONE`] for a hole).
    pub fn map(&self) -> Vec<Vid> {
        self.map.read().unwrap().clone()
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
        let name = self.full_name();
        let vid = self.header.read().unwrap().vid;
        let _no_changes = self.changes.write().await;
        // Entries recorded before are written first (queued or in a batch on its way), this
        // handle's and those of every other handle of the client (a plain handle that a
        // cached one takes over): the inode read then has them. Read without them, the map
        // would lose objects that acknowledged first writes made, and they would read as
        // holes (issue 41).
        self.client.write_held().await?;
        if lookup(&self.client, &name).await? != vid {
            return Err(VdiError::NotFound(name));
        }
        let (header, mut map) = read_inode(&self.client, &name, vid).await?;
        // Entries this handle set and no flush made durable stay as they are here: the inode
        // read may lack them (a crash lost them, or a replica left behind answered), and the
        // next flush writes them again (simulator seed 3137).
        for (i, v) in self.entries.not_durable() {
            if let Some(e) = map.get_mut(i as usize) {
                *e = v;
            }
        }
        *self.header.write().unwrap() = header;
        // An index this VDI's own object held here and the inode no longer names (its entry
        // lost in a crash before any flush): the object may still be on the nodes, and a
        // discard of the index must remove it (simulator seed 3489).
        let dropped: Vec<u64> = {
            let mut here = self.map.write().unwrap();
            let dropped = here
                .iter()
                .enumerate()
                .filter(|&(i, &v)| v == vid && map.get(i) != Some(&vid))
                .map(|(i, _)| i as u64)
                .collect();
            *here = map;
            dropped
        };
        self.doubtful.lock().unwrap().extend(dropped);
        Ok(())
    }

    /// Reads the map entries of the objects under `[offset, offset+len)` from the inode
    /// again, for a handle that does not hold the VDI's lock while another handle may write
    /// it (sheepfs after handing the lock over to another mount): the map here may lack the
    /// objects the holder made or copied since, and would read them as holes or as the
    /// ancestor's data. An entry may only have become this VDI's own object or a hole; any
    /// other value is a damaged inode.
    pub async fn reload_entries(&self, offset: u64, len: u64) -> Result<(), VdiError> {
        self.check_range(offset, len)?;
        let pieces = self.pieces(offset, len);
        let (Some(first), Some(last)) = (pieces.first(), pieces.last()) else {
            return Ok(());
        };
        let (first, last) = (first.0, last.0);
        let (vid, checked) = {
            let h = self.header.read().unwrap();
            (h.vid, h.checked)
        };
        let _no_changes = self.changes.write().await;
        let raw = self
            .client
            .read_obj(
                ObjectId::inode(vid),
                INODE_HEADER_LEN as u64 + 4 * first,
                (4 * (last - first + 1)) as u32,
            )
            .await?;
        let mut map = self.map.write().unwrap();
        for (i, c) in (first..).zip(raw.chunks_exact(4)) {
            let raw = u32::from_be_bytes(c.try_into().unwrap());
            let now =
                super::inode::entry_vid(checked, i, raw).map_err(|reason| VdiError::Corrupt {
                    name: self.full_name(),
                    reason,
                })?;
            let Some(here) = map.get_mut(i as usize) else {
                break;
            };
            if now != *here && now != vid && !now.is_none() {
                return Err(VdiError::Corrupt {
                    name: self.full_name(),
                    reason: format!(
                        "allocation entry {i} changed from VDI id {:#x} to {:#x}, neither its own ({:#x}) nor a hole",
                        here.0, now.0, vid.0
                    ),
                });
            }
            *here = now;
        }
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

    pub(super) fn summary(h: &InodeHeader, map: &[Vid], tag: Option<&str>) -> VdiInfo {
        let allocated = map.iter().filter(|v| !v.is_none()).count() as u64;
        VdiInfo {
            name: h.name.clone(),
            vid: h.vid,
            size: h.size,
            used: allocated * h.object_size as u64,
            allocated_objects: allocated,
            object_size: h.object_size,
            copies: h.copies,
            redundancy: Some(h.redundancy()),
            raw_used: allocated * raw_object_bytes(h),
            created: h.created,
            tag: tag.map(str::to_string),
            snapshot_time: h.snapshot as u64,
            parent_vid: Vid(h.parent),
            parent: None,
            alone: None,
        }
    }

    pub fn info(&self) -> VdiInfo {
        let tag = self
            .snapshot
            .as_deref()
            .and_then(|s| s.split_once('@'))
            .map(|(_, t)| t);
        Vdi::summary(&self.header.read().unwrap(), &self.map.read().unwrap(), tag)
    }

    /// The object holding `index`, or None for a hole.
    pub fn object(&self, index: u64) -> Option<ObjectId> {
        let map = self.map.read().unwrap();
        match map.get(index as usize) {
            Some(&v) if !v.is_none() => Some(ObjectId::data(v, ObjIndex(index as u32))),
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
                Some(oid) => self.read_mapped(oid, off, n).await,
            };
        }
        let mut buf = vec![0u8; len as usize];
        let reads = pieces.into_iter().filter_map(|(idx, off, n, at)| {
            let oid = self.object(idx)?;
            Some(async move {
                let data = self.read_mapped(oid, off, n).await?;
                Ok::<_, VdiError>((at, data))
            })
        });
        for r in futures::future::join_all(reads).await {
            let (at, data) = r?;
            buf[at..at + data.len()].copy_from_slice(&data);
        }
        Ok(Bytes::from(buf))
    }

    /// Writes `data` at `offset`, allocating objects as needed; the first write to an index
    /// shared with an ancestor (a snapshot, or the VDI a clone was made from) makes the VDI's
    /// own copy of that object, on the nodes.
    pub async fn write_at(&self, offset: u64, data: Bytes) -> Result<(), VdiError> {
        self.check_writable()?;
        self.check_range(offset, data.len() as u64)?;
        self.note_change().await?;
        let writes = self
            .pieces(offset, data.len() as u64)
            .into_iter()
            .map(|(idx, off, n, at)| self.write_piece(idx, off, data.slice(at..at + n as usize)));
        for r in futures::future::join_all(writes).await {
            r?;
        }
        Ok(())
    }

    /// Writes `piece` at `off` of index `idx`'s object.
    async fn write_piece(&self, idx: u64, off: u64, piece: Bytes) -> Result<(), VdiError> {
        let (vid, parent, ec) = {
            let h = self.header.read().unwrap();
            (h.vid, h.parent, h.ec())
        };
        if let Some(scheme) = ec {
            return self.write_piece_ec(scheme, idx, off, piece).await;
        }
        let own = ObjectId::data(vid, ObjIndex(idx as u32));
        if self.entry(idx) == vid {
            if parent == 0 {
                return Ok(self.client.write_obj(own, off, piece).await?);
            }
            // The VDI's own object may be gone although its map entry is written: a partial
            // copy-on-write target is created unsynced, and a crash of every owner before
            // the next flush drops it. It is then as if never copied, so a write copies it
            // again from the object the ancestors read there (a copy-on-write onto an object
            // that exists is a plain write). Two such writes at once make one copy: the
            // second is a plain write into it.
            return match self.fallback(vid, idx).await? {
                None => Ok(self.client.write_obj(own, off, piece).await?),
                Some(source) => self.copy_on_write(own, source, off, piece).await,
            };
        }
        let _allocating = self.allocating[idx as usize % ALLOC_SHARDS].lock().await;
        match self.entry(idx) {
            v if v == vid => {
                drop(_allocating);
                return Box::pin(self.write_piece(idx, off, piece)).await;
            }
            Vid::NONE => {
                let written = self.client.write_obj(own, off, piece).await;
                self.doubt_unless(idx, &written);
                written?;
                self.record(idx, vid).await?;
            }
            ancestor => {
                let source = ObjectId::data(ancestor, ObjIndex(idx as u32));
                let copied = self.copy_on_write(own, source, off, piece).await;
                self.doubt_unless(idx, &copied);
                copied?;
                self.record(idx, vid).await?;
            }
        }
        Ok(())
    }

    /// [`Vdi::write_piece`] for an erasure-coded VDI. Its copy-on-write is the client's: the
    /// ancestor's object is read whole, the piece laid over it and the object written whole
    /// (the nodes keep no partial copies of strips), and only then mapped.
    async fn write_piece_ec(
        &self,
        scheme: Redundancy,
        idx: u64,
        off: u64,
        piece: Bytes,
    ) -> Result<(), VdiError> {
        let (vid, os) = {
            let h = self.header.read().unwrap();
            (h.vid, h.object_size)
        };
        let own = ObjectId::data(vid, ObjIndex(idx as u32));
        if self.entry(idx) == vid {
            return Ok(self.client.ec_write_obj(own, scheme, off, piece).await?);
        }
        let _allocating = self.allocating[idx as usize % ALLOC_SHARDS].lock().await;
        let (at, data) = match self.entry(idx) {
            v if v == vid => (off, piece),
            Vid::NONE => (off, piece),
            ancestor => {
                let source = ObjectId::data(ancestor, ObjIndex(idx as u32));
                let mut whole = self.read_mapped(source, 0, os as u64).await?.to_vec();
                whole[off as usize..off as usize + piece.len()].copy_from_slice(&piece);
                (0, Bytes::from(whole))
            }
        };
        let written = self.client.ec_write_obj(own, scheme, at, data).await;
        if self.entry(idx) != vid {
            self.doubt_unless(idx, &written);
            written?;
            self.record(idx, vid).await?;
        } else {
            written?;
        }
        Ok(())
    }

    /// Notes index `idx` as doubtful (see [`Vdi::doubtful`]) when `res` failed.
    fn doubt_unless<T, E>(&self, idx: u64, res: &Result<T, E>) {
        if res.is_err() {
            self.doubtful.lock().unwrap().insert(idx);
        }
    }

    /// A `CowWrite` of `piece` into `own` from `source`; a source on no node (an ancestor's
    /// copy dropped the same way, see [`Vdi::write_piece`]) is replaced by the object its
    /// own ancestors read there, and where none does, the copy starts from zeros.
    async fn copy_on_write(
        &self,
        own: ObjectId,
        mut source: ObjectId,
        off: u64,
        piece: Bytes,
    ) -> Result<(), VdiError> {
        loop {
            match self
                .client
                .cow_write_obj(own, source, off, piece.clone())
                .await
            {
                Ok(()) => return Ok(()),
                Err(ClientError::NotFound(o)) if o == source => {
                    match self.fallback(source.vid(), own.index().0 as u64).await? {
                        Some(older) => source = older,
                        None => {
                            tracing::warn!("copy-on-write of {own}: its source {source} is on no node and nothing older is; it read as zeros, so the copy starts from zeros");
                            return Ok(self.client.write_obj(own, off, piece).await?);
                        }
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// The object VDI `holder`'s parent reads at index `idx` (its map names the ancestor
    /// holding it), None for a hole or no parent: what `holder`'s object of that index holds
    /// where `holder` never wrote it.
    async fn fallback(&self, holder: Vid, idx: u64) -> Result<Option<ObjectId>, VdiError> {
        let (own, own_parent) = {
            let h = self.header.read().unwrap();
            (h.vid, Vid(h.parent))
        };
        let parent = if holder == own {
            own_parent
        } else {
            self.ancestor(holder).await?.0
        };
        if parent.is_none() {
            return Ok(None);
        }
        let (_, map) = self.ancestor(parent).await?;
        Ok(match map.get(idx as usize) {
            Some(&v) if !v.is_none() => Some(ObjectId::data(v, ObjIndex(idx as u32))),
            _ => None,
        })
    }

    /// An ancestor's parent and map, read once per handle.
    /// On every write into a clone's own object: a lookup without waiting once it was read.
    async fn ancestor(&self, vid: Vid) -> Result<Ancestor, VdiError> {
        if let Some(a) = self.ancestors.read().unwrap().get(&vid) {
            return Ok(a.clone());
        }
        let _reading = self.reading_ancestor.lock().await;
        if let Some(a) = self.ancestors.read().unwrap().get(&vid) {
            return Ok(a.clone());
        }
        let (h, map) = super::inode::read_inode_unchecked(&self.client, vid).await?;
        let a = (Vid(h.parent), Arc::new(map));
        self.ancestors.write().unwrap().insert(vid, a.clone());
        Ok(a)
    }

    /// Records that `index` is now held by object `vid` (0: a hole): in the map here at once,
    /// and in the inode by a task that writes it with the entries recorded at the same time,
    /// or by the next flush at the latest (see [`super::entries`]).
    async fn record(&self, index: u64, vid: Vid) -> Result<(), VdiError> {
        {
            let _changing = self.changes.read().await;
            self.set_entry(index, vid);
            self.entries.push(index, vid);
        }
        self.entries.schedule();
        Ok(())
    }

    /// [`Vdi::record`], returning once the entry is written to the inode.
    async fn record_now(&self, index: u64, vid: Vid) -> Result<(), VdiError> {
        let ticket = {
            let _changing = self.changes.read().await;
            self.set_entry(index, vid);
            self.entries.push(index, vid)
        };
        Ok(self.entries.write_upto(ticket).await?)
    }

    fn set_entry(&self, index: u64, vid: Vid) {
        let mut map = self.map.write().unwrap();
        if map.len() <= index as usize {
            map.resize(index as usize + 1, Vid::NONE);
        }
        map[index as usize] = vid;
    }

    /// Grows the VDI to `new_size` bytes; shrinking is refused, the same size is a no-op.
    pub async fn grow(&self, new_size: u64) -> Result<(), VdiError> {
        self.check_writable()?;
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
        self.check_writable()?;
        self.check_range(offset, len)?;
        self.note_change().await?;
        let (vid, size, os, ec) = {
            let h = self.header.read().unwrap();
            (h.vid, h.size, h.object_size as u64, h.ec())
        };
        let work = self
            .pieces(offset, len)
            .into_iter()
            .map(|(idx, off, n, _)| async move {
                let own = ObjectId::data(vid, ObjIndex(idx as u32));
                let doubtful = self.doubtful.lock().unwrap().contains(&idx);
                let object_end = os.min(size - idx * os);
                let whole = off == 0 && n >= object_end;
                let Some(oid) = self.object(idx) else {
                    // A hole here; an object a failed change left on the nodes goes too.
                    if whole && doubtful {
                        let removed = self.client.remove_data(own, ec).await;
                        if removed.is_ok() {
                            self.doubtful.lock().unwrap().remove(&idx);
                        }
                        removed?;
                    }
                    return Ok(());
                };
                if whole {
                    // Unmap first: a crash in between leaves an orphan object, never a map entry
                    // pointing at nothing. An ancestor's object stays: others read it (but
                    // this VDI's own, which a failed copy-on-write may have left, goes).
                    // Doubtful from the unmap here until the object is gone: a discard of the
                    // index meanwhile finds a hole, and must remove the object itself.
                    self.doubtful.lock().unwrap().insert(idx);
                    let unmapped = async {
                        self.record_now(idx, Vid::NONE).await?;
                        if oid.vid() == vid || doubtful {
                            self.client.remove_data(own, ec).await?;
                        }
                        Ok::<_, VdiError>(())
                    }
                    .await;
                    if unmapped.is_ok() {
                        self.doubtful.lock().unwrap().remove(&idx);
                    }
                    unmapped?;
                } else {
                    // Zeros written like any write: a shared object gets its own copy first.
                    self.write_piece(idx, off, Bytes::from(vec![0u8; n as usize]))
                        .await?;
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

    /// `n` bytes at `off` of `oid`, an object the VDI's map names. One that no node holds
    /// reads as what the VDI that holds it would read without it (see [`Vdi::fallback`]):
    /// the object it was copied from, or zeros. A data object is durable only from the flush
    /// after its creation (a partial copy-on-write target too), so a crash may drop an object
    /// created since while the map's entry for it, written in place, survives (a discard
    /// removes the object after unmapping it, and the unmap may be lost the same way). Either
    /// way no write to it was ever flushed. Logged once per object and handle, so a loss of
    /// data that was durable does not pass unseen (and a guest reading it over and over does
    /// not flood the log).
    async fn read_mapped(&self, oid: ObjectId, off: u64, n: u64) -> Result<Bytes, VdiError> {
        let mut oid = oid;
        let ec = self.header.read().unwrap().ec();
        loop {
            let read = match ec {
                Some(scheme) => self.client.ec_read_obj(oid, scheme, off, n as u32).await,
                None => self.client.read_obj(oid, off, n as u32).await,
            };
            match read {
                Err(ClientError::NotFound(_)) => {
                    let older = self.fallback(oid.vid(), oid.index().0 as u64).await?;
                    if self.missing.lock().unwrap().insert(oid) {
                        match older {
                            Some(o) => tracing::warn!("object {oid} is in the VDI's map but on no node: it reads as {o}, which it was copied from (created and not flushed before a crash)"),
                            None => tracing::warn!("object {oid} is in the VDI's map but on no node: it reads as zeros (created, or removed, and not flushed before a crash)"),
                        }
                    }
                    match older {
                        Some(o) => oid = o,
                        None => return Ok(Bytes::from(vec![0u8; n as usize])),
                    }
                }
                r => return Ok(r?),
            }
        }
    }
}

/// Raw bytes one allocated object of `h` takes on the nodes: its copies, or its strips.
fn raw_object_bytes(h: &InodeHeader) -> u64 {
    match h.redundancy() {
        Redundancy::Copies(n) => h.object_size as u64 * n as u64,
        r => objstore_proto::ec::Codec::new(r, h.object_size as u64)
            .map(|c| (c.strip_len() * c.strips()) as u64)
            .unwrap_or(0),
    }
}
