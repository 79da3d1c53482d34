//! Reads of erasure-coded objects: straight from the holders of the data strips they cover
//! (`EcStripRead`) when this client knows the stripe's version, else through the object's
//! primary (`EcRead`), which resolves the stripe and decodes what a holder cannot give.
//!
//! A holder answers a strip read only if its strip is at exactly the version the client
//! names. Bytes of one version belong to one stripe, and an acknowledged version never goes
//! back (docs/architecture.md, "Erasure-coded objects"), so a strip at that version holds what
//! the primary would have decoded. The version a client knows is the one its last change of
//! the object was acknowledged at, or the one the primary's last read answered. It is
//! forgotten while a change of the object is under way and after one fails (the stripe may
//! then be resolved forward or back), and a read learns a version only if no change of the
//! object started since it did: otherwise a holder that missed a later change, still at the
//! older version, would serve bytes from before it. Any refusal (another version, a strip
//! the holder lost or cannot read, another epoch, a holder down) sends the read to the
//! primary.

use std::collections::HashMap;
use std::sync::Mutex;

use bytes::{Bytes, BytesMut};

use super::{answer, targets, Answer, Client, ClientError, Step};
use objstore_proto::ec::{wire, Codec};
use objstore_proto::frame::{Header, Opcode};
use objstore_proto::oid::ObjectId;
use objstore_proto::payload;
use objstore_proto::redundancy::Redundancy;
use objstore_proto::version::Version;
use objstore_proto::Vid;

/// What this client knows of each erasure-coded object's stripe.
#[derive(Default)]
pub(super) struct Stripes {
    known: Mutex<HashMap<ObjectId, Known>>,
}

#[derive(Default, Clone, Copy)]
struct Known {
    /// The stripe's version, if this client knows it now.
    version: Option<Version>,
    /// Changes of the object this client started.
    changes: u64,
}

impl Stripes {
    /// A change of `oid` starts: its stripe's version is unknown until one is acknowledged.
    pub(super) fn changing(&self, oid: ObjectId) {
        let mut m = self.known.lock().unwrap();
        let k = m.entry(oid).or_default();
        k.version = None;
        k.changes += 1;
    }

    /// A change of `oid` was acknowledged at `v` (this client changes an object one change
    /// at a time: no other started since).
    pub(super) fn changed(&self, oid: ObjectId, v: Version) {
        self.known.lock().unwrap().entry(oid).or_default().version = Some(v);
    }

    /// The changes of `oid` started so far (see [`Stripes::learned`]).
    fn ticket(&self, oid: ObjectId) -> u64 {
        self.known
            .lock()
            .unwrap()
            .get(&oid)
            .map_or(0, |k| k.changes)
    }

    /// The primary answered a read of `oid` that started at `ticket` at version `v`: known
    /// only if no change of the object started since.
    fn learned(&self, oid: ObjectId, ticket: u64, v: Version) {
        let mut m = self.known.lock().unwrap();
        let k = m.entry(oid).or_default();
        if k.changes == ticket && v != Version::NONE {
            k.version = Some(v);
        }
    }

    fn version(&self, oid: ObjectId) -> Option<Version> {
        self.known.lock().unwrap().get(&oid).and_then(|k| k.version)
    }

    /// Forgets what is known of VDI `vid`'s objects (another writer may have changed them).
    pub(super) fn forget_vdi(&self, vid: Vid) {
        self.known.lock().unwrap().retain(|oid, _| oid.vid() != vid);
    }
}

impl Client {
    /// Reads `len` bytes at `offset` of erasure-coded object `oid`: from the holders of the
    /// data strips the range covers when this client knows the stripe's version, else (or
    /// when one of them refuses) from its primary, which reads them from the strips that hold
    /// them, or decodes them from any x strips when one of those fails. An object never
    /// written, or removed, is `ClientError::NotFound`.
    pub async fn ec_read_obj(
        &self,
        oid: ObjectId,
        scheme: Redundancy,
        offset: u64,
        len: u32,
    ) -> Result<Bytes, ClientError> {
        if let Some(b) = self.read_strips(oid, scheme, offset, len).await {
            return Ok(b);
        }
        let mut h = Header::request(Opcode::EcRead, 0, 0);
        h.oid = oid.0;
        h.offset = offset;
        h.length = len;
        h.aux = wire::scheme_aux(scheme);
        let ticket = self.stripes.ticket(oid);
        self.retry(|v| async move {
            let primary = match targets(&v, oid) {
                Ok(t) => t[0],
                Err(step) => return step,
            };
            let mut h = h;
            h.epoch = v.epoch();
            match answer(primary, self.call(primary, h, Bytes::new()).await) {
                Answer::Ok(f) if f.payload.len() == len as usize => {
                    self.stripes.learned(oid, ticket, Version(f.header.offset));
                    Step::Done(f.payload)
                }
                Answer::Ok(f) => Step::Retry(format!(
                    "{primary} sent {} bytes, not {len}",
                    f.payload.len()
                )),
                Answer::NotFound => Step::Fatal(ClientError::NotFound(oid)),
                Answer::Retry(why) => Step::Retry(why),
                Answer::Fatal(e) => Step::Fatal(e),
            }
        })
        .await
    }

    /// The range read from the holders of its data strips at the stripe's version this
    /// client knows, one request per strip; None when the version is not known or any holder
    /// refuses (see the module documentation).
    async fn read_strips(
        &self,
        oid: ObjectId,
        scheme: Redundancy,
        offset: u64,
        len: u32,
    ) -> Option<Bytes> {
        let want = self.stripes.version(oid)?;
        let v = self.view();
        let codec = Codec::new(scheme, v.config().ok()?.object_size as u64).ok()?;
        let pieces = codec.locate(offset as usize, len as usize);
        let mut calls = Vec::with_capacity(pieces.len());
        for p in &pieces {
            let addr = v.ring.nodes()[v.ring.strip_holder(oid, p.strip)?].addr;
            if self.suspects.lock().unwrap().contains(&addr) {
                return None;
            }
            let mut h = Header::request(Opcode::EcStripRead, 0, 0);
            h.epoch = v.epoch();
            h.oid = oid.strip(p.strip).0;
            h.offset = p.strip_offset as u64;
            h.length = p.len as u32;
            h.aux = wire::scheme_aux(scheme);
            let want = payload::expected_prefix(want);
            calls.push(async move {
                match answer(addr, self.call(addr, h, want).await) {
                    Answer::Ok(f) if f.payload.len() == h.length as usize => Some(f.payload),
                    Answer::Fatal(e) => {
                        tracing::debug!(
                            "{oid}: strip read from {addr} refused ({e}): through the primary"
                        );
                        None
                    }
                    _ => {
                        tracing::debug!(
                            "{oid}: strip read from {addr} failed: through the primary"
                        );
                        None
                    }
                }
            });
        }
        let mut read = futures::future::join_all(calls).await.into_iter();
        if let [_] = &pieces[..] {
            return read.next().flatten();
        }
        let mut out = BytesMut::zeroed(len as usize);
        for (p, b) in pieces.iter().zip(read) {
            out[p.at..p.at + p.len].copy_from_slice(&b?);
        }
        Some(out.freeze())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use objstore_proto::ObjIndex;

    #[test]
    fn a_read_learns_a_version_only_if_no_change_started_since() {
        let s = Stripes::default();
        let o = ObjectId::data(Vid(1), ObjIndex(2));
        assert_eq!(s.version(o), None);
        let t = s.ticket(o);
        s.learned(o, t, Version(5));
        assert_eq!(s.version(o), Some(Version(5)));
        // A read that started before a change answers after it: its version is not taken.
        let t = s.ticket(o);
        s.changing(o);
        assert_eq!(s.version(o), None, "known while a change is under way");
        s.changed(o, Version(7));
        s.learned(o, t, Version(5));
        assert_eq!(s.version(o), Some(Version(7)));
        // A change that fails leaves nothing known until a read after it.
        s.changing(o);
        let t = s.ticket(o);
        s.learned(o, t, Version(8));
        assert_eq!(s.version(o), Some(Version(8)));
        s.forget_vdi(Vid(1));
        assert_eq!(s.version(o), None);
    }
}
