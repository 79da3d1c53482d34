//! Changes of objects: writes, copy-on-writes and removes, each sent to the object's primary
//! with the version this client last saw it at (see [`Client::write_obj`]).

use bytes::Bytes;

use super::{answer, targets, Answer, Client, ClientError, ClusterView, Step};
use objstore_proto::ec::wire;
use objstore_proto::frame::{Header, Opcode, ResultCode};
use objstore_proto::oid::ObjectId;
use objstore_proto::payload;
use objstore_proto::redundancy::Redundancy;
use objstore_proto::version::Version;

impl Client {
    /// Sends a change of `oid` to its primary, which orders it and applies it on every owner.
    ///
    /// The change carries the version this client last saw the object at (8 bytes before the
    /// data; 0: none seen), and the primary applies it only if the object is still at that
    /// version (0: the primary has no copy). So an attempt this client gave up on (no answer
    /// in time) that reaches the primary later, after a newer change, is refused instead of
    /// applied over it. When the object changed otherwise (another writer, an attempt that
    /// did land), the primary says at which version it is and the client tries again from
    /// there: at once the first time it sees the object, after the usual backoff otherwise.
    ///
    /// With `source`, the change is a copy-on-write (`CowWrite`): the prefix also names the
    /// object the primary copies when the target does not exist, and a `NotFound` answer means
    /// that source does not exist.
    async fn to_primary(
        &self,
        v: &ClusterView,
        h: Header,
        source: Option<ObjectId>,
        payload: Bytes,
    ) -> Step<()> {
        let oid = ObjectId(h.oid);
        let primary = match targets(v, oid) {
            Ok(t) => t[0],
            Err(step) => return step,
        };
        let mut h = h;
        h.epoch = v.epoch();
        let mut expected = self
            .versions
            .lock()
            .unwrap()
            .get(&oid)
            .copied()
            .unwrap_or_default();
        let mut first_sight = expected == Version::NONE;
        if matches!(h.opcode, Opcode::EcWrite | Opcode::EcRemove) {
            // No strip read at a version known before this change until it is acknowledged.
            self.stripes.changing(oid);
        }
        let res = loop {
            let prefix = match source {
                None => payload::expected_prefix(expected),
                Some(source) => payload::cow_prefix(expected, source),
            };
            let res = self
                .call_with_prefix(primary, h, prefix, payload.clone())
                .await;
            if let Ok(f) = &res {
                match f.header.result_code() {
                    ResultCode::Ok => {
                        let now = Version(f.header.offset);
                        self.versions.lock().unwrap().insert(oid, now);
                        if h.opcode == Opcode::EcWrite {
                            self.stripes.changed(oid, now);
                        }
                    }
                    ResultCode::Conflict => {
                        let now = Version(f.header.offset);
                        self.versions.lock().unwrap().insert(oid, now);
                        if first_sight {
                            // This client had seen no version: now it has, try again at once.
                            first_sight = false;
                            expected = now;
                            continue;
                        }
                        return Step::Retry(format!(
                            "{primary}: object {oid} is at {now:?}, not at {expected:?} as this client last changed it"
                        ));
                    }
                    _ => {}
                }
            }
            break res;
        };
        match answer(primary, res) {
            Answer::Ok(_) => Step::Done(()),
            Answer::NotFound => Step::Fatal(ClientError::NotFound(source.unwrap_or(oid))),
            Answer::Retry(why) => Step::Retry(why),
            Answer::Fatal(e) => Step::Fatal(e),
        }
    }

    /// Forgets the versions this client last changed VDI `vid`'s objects at (its data objects
    /// and its inode), after another writer took the VDI over and changed them (a lock handed
    /// over and back): the next change of each learns the object's version from its primary
    /// at once ("first sight"), instead of being refused as out of date and retried after a
    /// backoff. Safe for that reason only: no change of the VDI by this client is in flight.
    /// The stripe versions its erasure-coded objects' reads went by go too, and that is
    /// needed: a strip that missed the other writer's change, still at the version this
    /// client knew, would be read as if current (`direct`).
    pub fn forget_versions(&self, vid: objstore_proto::Vid) {
        self.versions
            .lock()
            .unwrap()
            .retain(|oid, _| oid.vid() != vid);
        self.stripes.forget_vdi(vid);
    }

    /// Writes `data` at `offset` of object `oid` on every replica.
    pub async fn write_obj(
        &self,
        oid: ObjectId,
        offset: u64,
        data: Bytes,
    ) -> Result<(), ClientError> {
        self.write_via_primary(Opcode::WriteObj, oid, None, offset, data, 0)
            .await
    }

    /// Writes `data` at `offset` of erasure-coded object `oid` of scheme `scheme` (`x:y`): its
    /// primary cuts the change into its strips and parity. Ordered and retried as
    /// [`Client::write_obj`].
    ///
    /// Writes of the object that wait meanwhile for this client's change in flight go
    /// together as one (see `batch`).
    pub async fn ec_write_obj(
        &self,
        oid: ObjectId,
        scheme: Redundancy,
        offset: u64,
        data: Bytes,
    ) -> Result<(), ClientError> {
        let aux = wire::scheme_aux(scheme);
        let mut queued = Queued {
            batches: &self.batches,
            oid,
            ticket: self.batches.enqueue(oid, offset, data.clone()),
        };
        let order = self.order_lock(oid).lock().await;
        let Some(runs) = self.batches.take(oid, &queued.ticket) else {
            drop(order);
            if (&mut queued.ticket.answer).await == Ok(true) {
                return Ok(());
            }
            // The batch that took it failed or was dropped: on its own now.
            return self
                .write_via_primary(Opcode::EcWrite, oid, None, offset, data, aux)
                .await;
        };
        let mut mine = Ok(());
        for run in runs {
            if run.writes() > 1 {
                tracing::debug!(
                    "object {oid}: {} waiting writes sent as one of {} bytes at {}",
                    run.writes(),
                    run.data.len(),
                    run.offset
                );
            }
            let r = (self.send_change(
                Opcode::EcWrite,
                oid,
                None,
                run.offset,
                run.data.clone(),
                aux,
            ))
            .await;
            let written = r.is_ok();
            if run.mine {
                mine = r;
            }
            run.finish(written);
        }
        mine
    }

    /// [`Client::write_obj`], or [`Client::ec_write_obj`] for an object of erasure code `ec`.
    pub async fn write_data(
        &self,
        oid: ObjectId,
        ec: Option<Redundancy>,
        offset: u64,
        data: Bytes,
    ) -> Result<(), ClientError> {
        match ec {
            Some(r) => self.ec_write_obj(oid, r, offset, data).await,
            None => self.write_obj(oid, offset, data).await,
        }
    }

    /// [`Client::remove_obj`], or [`Client::ec_remove_obj`] for an object of erasure code `ec`.
    pub async fn remove_data(
        &self,
        oid: ObjectId,
        ec: Option<Redundancy>,
    ) -> Result<(), ClientError> {
        match ec {
            Some(r) => self.ec_remove_obj(oid, r).await,
            None => self.remove_obj(oid).await,
        }
    }

    /// Removes erasure-coded object `oid` (every strip keeps a tombstone at a new version).
    pub async fn ec_remove_obj(
        &self,
        oid: ObjectId,
        scheme: Redundancy,
    ) -> Result<(), ClientError> {
        let _order = self.order_lock(oid).lock().await;
        let mut h = Header::request(Opcode::EcRemove, 0, 0);
        h.oid = oid.0;
        h.aux = wire::scheme_aux(scheme);
        self.retry(|v| async move { self.to_primary(&v, h, None, Bytes::new()).await })
            .await
    }

    /// Writes `data` at `offset` of object `oid`, which is copied first from object `source`
    /// when it does not exist (or was removed): a copy-on-write, done by the nodes (the
    /// target's primary stores the blocks written and a record naming the source on every
    /// owner of `oid`; the other blocks read from the source; a source that is such a copy
    /// itself, or a target removed before, is copied whole). When `oid` exists this is [`Client::write_obj`]
    /// (the source is not read again). `source` must be a data object of the same index in
    /// another VDI (else `ClientError::Refused`, `InvalidRequest`); a source that does not
    /// exist is `ClientError::NotFound(source)`, and the target is not created. Ordered with
    /// this client's other changes of `oid`, and retried like them.
    pub async fn cow_write_obj(
        &self,
        oid: ObjectId,
        source: ObjectId,
        offset: u64,
        data: Bytes,
    ) -> Result<(), ClientError> {
        self.write_via_primary(Opcode::CowWrite, oid, Some(source), offset, data, 0)
            .await
    }

    /// A `WriteObj` or `CowWrite` of `data` at `offset` of `oid`, ordered with this client's
    /// other changes of `oid` and retried through its primary.
    async fn write_via_primary(
        &self,
        op: Opcode,
        oid: ObjectId,
        source: Option<ObjectId>,
        offset: u64,
        data: Bytes,
        aux: u32,
    ) -> Result<(), ClientError> {
        let _order = self.order_lock(oid).lock().await;
        self.send_change(op, oid, source, offset, data, aux).await
    }

    /// [`Client::write_via_primary`] with the object's turn ([`Client::order_lock`]) held.
    async fn send_change(
        &self,
        op: Opcode,
        oid: ObjectId,
        source: Option<ObjectId>,
        offset: u64,
        data: Bytes,
        aux: u32,
    ) -> Result<(), ClientError> {
        let mut h = Header::request(op, 0, 0);
        h.oid = oid.0;
        h.offset = offset;
        h.length = data.len() as u32;
        h.aux = aux;
        self.retry(|v| {
            let data = data.clone();
            async move { self.to_primary(&v, h, source, data).await }
        })
        .await
    }

    /// Makes `target` whole if it is a partial copy-on-write target of `source` (it holds
    /// only the blocks written since its copy and reads the others from `source`): done
    /// before `source` is freed. Anything else is left as it is.
    pub async fn flatten_obj(&self, target: ObjectId, source: ObjectId) -> Result<(), ClientError> {
        self.write_via_primary(Opcode::FlattenObj, target, Some(source), 0, Bytes::new(), 0)
            .await
    }

    /// Removes object `oid` from every replica (each keeps a tombstone at a new version).
    pub async fn remove_obj(&self, oid: ObjectId) -> Result<(), ClientError> {
        let _order = self.order_lock(oid).lock().await;
        let mut h = Header::request(Opcode::RemoveObj, 0, 0);
        h.oid = oid.0;
        self.retry(|v| async move { self.to_primary(&v, h, None, Bytes::new()).await })
            .await
    }
}

/// A write queued for a batch (`batch`), dropped from the queue if its caller gives up before
/// a batch takes it.
struct Queued<'a> {
    batches: &'a super::batch::Batches,
    oid: ObjectId,
    ticket: super::batch::Ticket,
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.batches.cancel(self.oid, &self.ticket);
    }
}
