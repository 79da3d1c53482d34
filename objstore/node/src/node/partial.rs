//! Partial copy-on-write targets (issue 26; the format is [`objstore_proto::cowrec`]): a data
//! object that holds only the blocks written since its copy, with a record past the object
//! size naming its source and the blocks present. The invariants (docs/snapshots.md):
//!
//! - *One record per version*: the record is bytes of the object, changed only by versioned
//!   changes (`Change::Cow`), applied alike on every owner, so every owner holding a version
//!   holds the same record; whole-object transfers carry it.
//! - *Present blocks are the target's, absent ones the source's*: a read of an absent block
//!   reads the source (never written again: a snapshot's object), and a write that covers an
//!   absent block in part merges the source's block first, on the primary, so the change
//!   replicated is whole blocks.
//! - *A bit never outruns its data after a crash*: a new target is created unsynced whole
//!   (data and record in one file, dropped whole by a crash before the next flush); blocks
//!   filled in an existing target are synced before their bits are written.
//! - *A source outlives its partial copies after a crash*: a copy is partial only from a
//!   source the answering owner holds durably; else it is whole.
//! - *One hop*: a copy from a source that is itself partial copies it whole.
//!
//! A target whose source is freed (`dog vdi gc`) is first made whole (`FlattenObj`).

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use super::replicate::{Change, FORWARD_TIMEOUT, INLINE_WRITE};
use super::server::{blocking, not_recovered, Failure, INLINE_READ};
use super::{Epoch, Node};
use crate::store::{sums, Version};
use objstore_proto::api::READ_COW_RECORD;
use objstore_proto::cowrec::{record_len, touched, CowRecord, BLOCK};
use objstore_proto::frame::{Header, Opcode, ResultCode};
use objstore_proto::oid::ObjectId;
use objstore_proto::view::ClusterConfig;

/// How deep a read follows sources that are themselves partial (one hop is the rule; more
/// only after a copy raced with a flatten).
const MAX_HOPS: u32 = 4;

/// Flag of a `READ_COW_RECORD` answer: the copy that answered is durable.
const RECORD_DURABLE: u8 = 1;

/// What [`Node::ask_source`] asks an owner of a source.
#[derive(Clone, Copy)]
enum Want {
    Range(u64, usize),
    Record,
}

/// `blocks` (starting at byte `lo` of the object) with `data` written at `offset`.
fn overlay(mut blocks: BytesMut, lo: u64, offset: u64, data: &[u8]) -> Bytes {
    let at = (offset - lo) as usize;
    blocks[at..at + data.len()].copy_from_slice(data);
    blocks.freeze()
}

impl Node {
    /// The record of `oid` here, if this copy is a partial target.
    pub(super) fn record_of(
        &self,
        oid: ObjectId,
        object_size: u64,
    ) -> Result<Option<CowRecord>, Failure> {
        if oid.is_inode() {
            return Ok(None);
        }
        match self.store.object_len(oid) {
            Some(len) if len > object_size => {}
            _ => return Ok(None),
        }
        let raw = self.store.read(oid, object_size, record_len(object_size))?;
        Ok(CowRecord::decode(&raw, object_size))
    }

    /// Whether a plain write of `len` bytes at `offset` may go into the copy of `oid` here: it
    /// is whole, or a partial copy-on-write target whose touched blocks are all present (as
    /// the primary decides in [`Node::write_change`]). A plain write into absent blocks would
    /// leave them read from the source.
    pub(super) fn plain_write_fits(
        &self,
        oid: ObjectId,
        object_size: u64,
        offset: u64,
        len: usize,
    ) -> Result<bool, Failure> {
        Ok(match self.record_of(oid, object_size)? {
            None => true,
            Some(rec) => {
                let (first, end) = touched(offset, len as u64);
                rec.all_present(first, end)
            }
        })
    }

    /// `len` bytes at `offset` of object `oid` as a client reads them: the bytes here, and a
    /// partial target's absent blocks from its source.
    pub(super) async fn read_data(
        self: &Arc<Self>,
        ep: &Epoch,
        cfg: &ClusterConfig,
        oid: ObjectId,
        offset: u64,
        len: usize,
    ) -> Result<Bytes, Failure> {
        self.read_data_hops(ep, cfg, oid, offset, len, 0).await
    }

    fn read_data_hops<'a>(
        self: &'a Arc<Self>,
        ep: &'a Epoch,
        cfg: &'a ClusterConfig,
        oid: ObjectId,
        offset: u64,
        len: usize,
        hops: u32,
    ) -> futures::future::BoxFuture<'a, Result<Bytes, Failure>> {
        Box::pin(async move {
            let os = cfg.object_size as u64;
            // The record before the bytes: a bit is set only after its block is written, so a
            // block the record says present is present in the bytes read after it.
            let record = self.record_of(oid, os)?;
            let store = self.store.clone();
            let data = if len <= INLINE_READ {
                store.read(oid, offset, len)?
            } else {
                blocking(self, move || store.read(oid, offset, len)).await?
            };
            let Some(rec) = record else {
                return Ok(Bytes::from(data));
            };
            let (first, end) = touched(offset, len as u64);
            let runs = rec.absent_runs(first, end);
            if runs.is_empty() {
                return Ok(Bytes::from(data));
            }
            if hops >= MAX_HOPS {
                return Err(Failure::new(
                    ResultCode::Io,
                    format!("object {oid}: a chain of more than {MAX_HOPS} partial copies"),
                ));
            }
            let mut data = data;
            let stop = offset + len as u64;
            for (a, b) in runs {
                let (lo, hi) = ((a * BLOCK).max(offset), (b * BLOCK).min(stop));
                let src = self
                    .source_range(ep, cfg, rec.source, oid, lo, (hi - lo) as usize, hops + 1)
                    .await
                    .map_err(|f| match f.code {
                        ResultCode::NotFound => Failure::new(
                            ResultCode::Io,
                            format!(
                                "object {oid} reads blocks from {}, which no owner holds: {}",
                                rec.source, f.message
                            ),
                        ),
                        _ => f,
                    })?;
                data[(lo - offset) as usize..(hi - offset) as usize].copy_from_slice(&src);
            }
            Ok(Bytes::from(data))
        })
    }

    /// `len` bytes at `offset` of `source` as a client reads them, for the target `target`:
    /// from this node's copy if it owns the source, else from the other owners.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn source_range(
        self: &Arc<Self>,
        ep: &Epoch,
        cfg: &ClusterConfig,
        source: ObjectId,
        target: ObjectId,
        offset: u64,
        len: usize,
        hops: u32,
    ) -> Result<Bytes, Failure> {
        self.ask_source(ep, cfg, source, target, Want::Range(offset, len), hops)
            .await
    }

    /// Whether a partial target may read from `source` (asked of its owners): the source is
    /// whole (not a partial target itself: one hop) and durable on the owner that answered
    /// (a source a crash could drop must not be outlived by a flushed target reading it).
    pub(super) async fn source_takes_partial(
        self: &Arc<Self>,
        ep: &Epoch,
        cfg: &ClusterConfig,
        source: ObjectId,
        target: ObjectId,
    ) -> Result<bool, Failure> {
        let raw = self
            .ask_source(ep, cfg, source, target, Want::Record, 0)
            .await?;
        let durable = raw.first().is_some_and(|f| f & RECORD_DURABLE != 0);
        let partial = raw
            .get(1..)
            .and_then(|r| CowRecord::decode(r, cfg.object_size as u64))
            .is_some();
        Ok(durable && !partial)
    }

    /// The answer to a `READ_COW_RECORD` read of `oid`: a flags byte ([`RECORD_DURABLE`]),
    /// then its record (nothing for a whole object). A missing object is `NotFound`.
    pub(super) fn record_answer(&self, oid: ObjectId, object_size: u64) -> Result<Bytes, Failure> {
        if self.store.meta(oid).is_none_or(|s| s.deleted) {
            return Err(crate::store::StoreError::NotFound(oid).into());
        }
        let durable = self.store.is_durable(oid);
        let mut out = vec![if durable { RECORD_DURABLE } else { 0 }];
        if let Some(r) = self.record_of(oid, object_size)? {
            out.extend_from_slice(&r.encode());
        }
        Ok(Bytes::from(out))
    }

    /// Asks `source`'s owners, this node first when it is one, for what `want` names: the
    /// first answer wins. A source no owner holds is `NotFound`; owners that failed otherwise
    /// make it `Busy` (the client retries).
    async fn ask_source(
        self: &Arc<Self>,
        ep: &Epoch,
        cfg: &ClusterConfig,
        source: ObjectId,
        target: ObjectId,
        want: Want,
        hops: u32,
    ) -> Result<Bytes, Failure> {
        let mut owners: Vec<SocketAddr> = ep
            .ring
            .replicas(source, cfg.copies as usize)
            .iter()
            .map(|n| n.addr)
            .collect();
        // A stable sort: this node first, the others in placement order.
        owners.sort_by_key(|&a| a != self.me.addr);
        let deadline = tokio::time::Instant::now() + FORWARD_TIMEOUT;
        let mut failed: Option<Failure> = None;
        for addr in owners {
            let res = if addr == self.me.addr {
                self.local_source(ep, cfg, source, want, hops).await
            } else {
                self.remote_source(addr, ep.view.epoch, source, want, deadline)
                    .await
            };
            match res {
                Ok(b) => return Ok(b),
                Err(f) if f.code == ResultCode::NotFound => {}
                Err(f) => {
                    tracing::debug!(
                        "copy-on-write to {target}: source {source} from {addr}: {} {}",
                        f.code as u16,
                        f.message
                    );
                    failed.get_or_insert(f);
                }
            }
        }
        Err(match failed {
            None => Failure::new(
                ResultCode::NotFound,
                format!("source object {source} of copy-on-write to {target} does not exist"),
            ),
            Some(f) => Failure::new(
                ResultCode::Busy,
                format!(
                    "source object {source} of copy-on-write to {target} could not be read: {}",
                    f.message
                ),
            ),
        })
    }

    async fn local_source(
        self: &Arc<Self>,
        ep: &Epoch,
        cfg: &ClusterConfig,
        source: ObjectId,
        want: Want,
        hops: u32,
    ) -> Result<Bytes, Failure> {
        self.ensure_recovered(source)
            .await
            .map_err(|why| not_recovered(source, why))?;
        match want {
            Want::Range(offset, len) => {
                self.read_data_hops(ep, cfg, source, offset, len, hops)
                    .await
            }
            Want::Record => self.record_answer(source, cfg.object_size as u64),
        }
    }

    async fn remote_source(
        &self,
        addr: SocketAddr,
        epoch: u32,
        source: ObjectId,
        want: Want,
        deadline: tokio::time::Instant,
    ) -> Result<Bytes, Failure> {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        if left.is_zero() {
            return Err(Failure::new(
                ResultCode::Busy,
                format!("owner {addr} not asked: out of time"),
            ));
        }
        let mut h = Header::request(Opcode::ReadObj, 0, epoch);
        h.oid = source.0;
        let len = match want {
            Want::Range(offset, len) => {
                h.offset = offset;
                h.length = len as u32;
                Some(len)
            }
            Want::Record => {
                h.aux = READ_COW_RECORD;
                None
            }
        };
        let res = match self.peers.get(addr, left).await {
            Ok(c) => c.call(h, Bytes::new(), left).await,
            Err(e) => Err(e),
        };
        match res {
            Ok(f) => match f.header.result_code() {
                ResultCode::Ok if len.is_none_or(|n| f.payload.len() == n) => Ok(f.payload),
                ResultCode::Ok => Err(Failure::new(
                    ResultCode::Busy,
                    format!(
                        "owner {addr} sent {} bytes, not {}",
                        f.payload.len(),
                        len.unwrap_or_default()
                    ),
                )),
                code => Err(Failure::new(code, format!("owner {addr}: {}", f.message()))),
            },
            Err(e) => {
                self.peers.drop_conn(addr).await;
                Err(Failure::new(ResultCode::Busy, format!("owner {addr}: {e}")))
            }
        }
    }

    /// The change a write of `data` at `offset` of `oid` makes, as its primary sees the copy
    /// here: a plain write, or for blocks a partial target does not hold yet, those blocks
    /// whole (the source's bytes under the write) marked present. `expected` is the version
    /// the client expects; the blocks merged are read at it.
    pub(super) async fn write_change(
        self: &Arc<Self>,
        ep: &Epoch,
        cfg: &ClusterConfig,
        oid: ObjectId,
        expected: Version,
        offset: u64,
        data: Bytes,
    ) -> Result<Change, Failure> {
        let os = cfg.object_size as u64;
        let rec = match self.record_of(oid, os)? {
            Some(r) => r,
            None => return Ok(Change::Write { offset, data }),
        };
        let (first, end) = touched(offset, data.len() as u64);
        if rec.all_present(first, end) {
            return Ok(Change::Write { offset, data });
        }
        let here = self.store.meta(oid).map(|s| s.version).unwrap_or_default();
        if here != expected {
            return Err(super::replicate::conflict(oid, here, expected));
        }
        let lo = first * BLOCK;
        let data = if sums::whole_blocks(offset, data.len()) {
            data
        } else {
            // `change` checks the version again under the object's lock: a change between
            // this read and that check makes it a conflict, never a merge of stale bytes.
            let merged = self
                .read_data(ep, cfg, oid, lo, ((end - first) * BLOCK) as usize)
                .await?;
            overlay(BytesMut::from(&merged[..]), lo, offset, &data)
        };
        Ok(Change::Cow {
            offset: lo,
            data,
            source: None,
            object_size: os,
        })
    }

    /// The change that creates the missing `target` as a partial copy of `source` (which must
    /// be whole) holding the blocks a write of `data` at `offset` touches: edge blocks the
    /// write covers in part take the source's bytes first.
    pub(super) async fn cow_start(
        self: &Arc<Self>,
        ep: &Epoch,
        cfg: &ClusterConfig,
        source: ObjectId,
        target: ObjectId,
        offset: u64,
        data: Bytes,
    ) -> Result<Change, Failure> {
        let os = cfg.object_size as u64;
        let (first, end) = touched(offset, data.len() as u64);
        let lo = first * BLOCK;
        let data = if data.is_empty() || sums::whole_blocks(offset, data.len()) {
            data
        } else {
            let mut buf = BytesMut::zeroed(((end - first) * BLOCK) as usize);
            for b in [first, end - 1] {
                let (blo, bhi) = (b * BLOCK, (b + 1) * BLOCK);
                if blo >= offset && bhi <= offset + data.len() as u64 {
                    continue; // covered whole by the write
                }
                let src = self
                    .source_range(ep, cfg, source, target, blo, BLOCK as usize, 1)
                    .await?;
                buf[(blo - lo) as usize..(bhi - lo) as usize].copy_from_slice(&src);
            }
            overlay(buf, lo, offset, &data)
        };
        Ok(Change::Cow {
            offset: lo,
            data,
            source: Some(source),
            object_size: os,
        })
    }

    /// Applies a `Change::Cow` to the store here at version `new` (primary and replicas
    /// alike): the blocks, then (for blocks of an existing target, once they are synced) the
    /// record with their bits set.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn apply_cow_store(
        self: &Arc<Self>,
        oid: ObjectId,
        offset: u64,
        data: Bytes,
        sums: Option<Arc<[u32]>>,
        source: Option<ObjectId>,
        new: Version,
        object_size: u64,
    ) -> Result<(), Failure> {
        let (first, end) = touched(offset, data.len() as u64);
        if let Some(s) = source.filter(|_| data.len() <= INLINE_WRITE) {
            // A new target's few blocks: a new file in the page cache, on this task when its
            // lock is free (a hop to the blocking pool costs about what the creation does).
            let mut rec = CowRecord::new(s, object_size);
            rec.set(first, end);
            let record = rec.encode_block();
            let record_sums = sums::sums_of(&record);
            let parts = [
                (offset, &data[..], sums.as_deref()),
                (object_size, &record[..], Some(&record_sums[..])),
            ];
            if let Some(r) = self.store.create_now(oid, &parts, new) {
                return r.map_err(Failure::from);
            }
        }
        let store = self.store.clone();
        let res = blocking(self, move || {
            let mut rec = match source {
                // A new object: data and record land in one file, created unsynced and
                // dropped whole by a crash before the next flush.
                Some(s) => CowRecord::new(s, object_size),
                None => {
                    let raw = store.read(oid, object_size, record_len(object_size))?;
                    CowRecord::decode(&raw, object_size).ok_or_else(|| {
                        crate::store::StoreError::Io {
                            oid,
                            op: "copy-on-write",
                            source: std::io::Error::new(
                                std::io::ErrorKind::InvalidData,
                                "blocks to fill in an object that is not a partial target here",
                            ),
                        }
                    })?
                }
            };
            rec.set(first, end);
            let record = rec.encode_block();
            let record_sums = sums::sums_of(&record);
            // One change: no read sees the blocks without the record. Filling an existing
            // target, the blocks reach the disk before their bits (`sync_last`).
            let res = store.write_parts(
                oid,
                &[
                    (offset, &data[..], sums.as_deref()),
                    (object_size, &record[..], Some(&record_sums[..])),
                ],
                source.is_none(),
                new,
            );
            if let Err(crate::store::StoreError::SyncFailed { oids, .. }) = &res {
                return Ok(Err(oids.clone()));
            }
            res.map(Ok)
        })
        .await?;
        match res {
            Ok(()) => Ok(()),
            Err(lost) => {
                // As a failed flush: the copy is lost here (its I/O waits) and restored from
                // another owner at once, in the background (outside the caller's object
                // lock); no flush need follow for that.
                for &(oid, want) in &lost {
                    self.recovery.lose(oid, want);
                }
                let node = self.clone();
                tokio::spawn(async move {
                    if node.restore_lost(&lost).await.is_ok() {
                        tracing::info!("object {oid}: the copy a failed fill lost was restored");
                    }
                });
                Err(Failure::new(
                    ResultCode::Io,
                    format!("could not apply the change of object {oid} here (its blocks not durable, or only some parts written); restoring it from a replica"),
                ))
            }
        }
    }

    /// `FlattenObj`: makes `target` whole if it is a partial target of `source` (before
    /// `source` is freed); anything else is left as it is. Returns the target's version.
    pub(super) async fn flatten(
        self: &Arc<Self>,
        ep: &Epoch,
        cfg: &ClusterConfig,
        others: &[SocketAddr],
        target: ObjectId,
        source: ObjectId,
    ) -> Result<Version, Failure> {
        let os = cfg.object_size as u64;
        let Some(here) = self.store.meta(target).filter(|s| !s.deleted) else {
            return Ok(Version::NONE);
        };
        match self.record_of(target, os)? {
            Some(rec) if rec.source == source => {}
            _ => return Ok(here.version),
        }
        let whole = self.read_data(ep, cfg, target, 0, os as usize).await?;
        let used = whole.iter().rposition(|&b| b != 0).map_or(0, |p| p + 1);
        tracing::info!("making object {target} whole before its source {source} is freed");
        self.change(
            ep,
            target,
            others,
            here.version,
            Change::Put {
                data: whole.slice(..used),
            },
            &super::acting::Acting::Here,
        )
        .await
    }
}
