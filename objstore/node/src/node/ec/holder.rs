//! A strip holder's side: `PeerStrip` applies one change to one strip (its note first, then its
//! bytes), `PeerStripRead` answers a range of a strip with what its note says of it.

use std::sync::Arc;

use bytes::Bytes;

use super::{Note, StripRead, Undo, NOTE_HEAD_LEN};
use crate::node::acting::Acting;
use crate::node::server::Failure;
use crate::node::{Epoch, Node};
use crate::store::{ObjState, StoreError};
use objstore_proto::ec::wire::{
    StripHead, StripOp, FLAG_BACK, FLAG_DELETED, FLAG_KNOWN, FLAG_UNSURE,
};
use objstore_proto::ec::{xor_into, Codec};
use objstore_proto::frame::ResultCode;
use objstore_proto::oid::ObjectId;
use objstore_proto::version::Version;
use objstore_proto::view::ClusterConfig;

/// Where a strip's change lands in it, checked against the strip's length.
fn fits(codec: &Codec, key: ObjectId, offset: u64, len: usize) -> Result<(), Failure> {
    if offset.saturating_add(len as u64) > codec.strip_len() as u64 {
        return Err(Failure::invalid(format!(
            "bytes {offset}..{} are past the end of strip {key} ({} bytes)",
            offset + len as u64,
            codec.strip_len()
        )));
    }
    Ok(())
}

impl Node {
    /// Checks that `key` is the key of a strip this node holds in `ep` under `head`'s scheme;
    /// the scheme's code.
    pub(super) fn own_strip(
        &self,
        ep: &Epoch,
        cfg: &ClusterConfig,
        key: ObjectId,
        head: &StripHead,
    ) -> Result<Codec, Failure> {
        let codec = Codec::new(head.scheme(), cfg.object_size as u64).map_err(Failure::invalid)?;
        let Some(k) = key.strip_index().filter(|&k| k < codec.strips()) else {
            return Err(Failure::invalid(format!(
                "{key} is not the key of a strip of a {} object",
                head.scheme()
            )));
        };
        let holder = ep
            .ring
            .strip_holder(key.base(), k)
            .map(|i| ep.ring.nodes()[i].id);
        if holder != Some(self.me.id) {
            return Err(Failure::invalid(format!(
                "{} does not hold strip {k} of object {} in epoch {}",
                self.me.addr,
                key.base(),
                ep.view.epoch
            )));
        }
        Ok(codec)
    }

    /// `PeerStrip`: applies `head`'s change to strip `key` here (see the module doc).
    pub(in crate::node) async fn apply_strip(
        self: &Arc<Self>,
        ep: &Epoch,
        cfg: &ClusterConfig,
        key: ObjectId,
        head: StripHead,
        offset: u64,
        bytes: Bytes,
    ) -> Result<(), Failure> {
        let codec = self.own_strip(ep, cfg, key, &head)?;
        fits(&codec, key, offset, bytes.len())?;
        // A `Put` (a strip made whole by its primary, rebuilt from the others) needs no pull
        // first, and ends one its holder could not do (its old holder is down); a `Settle`
        // changes nothing but the note of a strip already here. Neither makes a version, so
        // neither is recorded as a change (`acting`): a node gone after taking only rebuilds
        // hides no newer version of any strip (`Safety::knows_present_strip`) and took no
        // acknowledged change (`Safety::stripe_waiting_for`).
        let changes = !matches!(head.op, StripOp::Put | StripOp::Settle);
        if changes {
            if let Acting::Through(_) = self.acting(ep, cfg, key).await? {
                return Err(Failure::new(
                    ResultCode::NoSpace,
                    format!("strip {key} is not recovered here: no space left on the node's disk"),
                ));
            }
        }
        let _ordered = self.replica_lock(key).lock().await;
        let node = self.clone();
        let len = bytes.len();
        let epoch = ep.view.epoch;
        let res = in_store(self, move || {
            node.apply_strip_here(epoch, key, head, offset, &bytes)
        })
        .await;
        tracing::debug!(
            "strip {key}: {:?} {:?} -> {:?} touching {:?} ({len} bytes at {offset}): {}",
            head.op,
            head.base,
            head.version,
            head.touched,
            match &res {
                Ok(()) => "applied".to_string(),
                Err(f) => format!("{:?} {}", f.code, f.message),
            }
        );
        res?;
        if head.op == StripOp::Put {
            self.recovery.settled(key, head.version);
        }
        Ok(())
    }

    /// [`Node::apply_strip`] with the strip's replica lock held, on the blocking pool, in
    /// `epoch`.
    fn apply_strip_here(
        &self,
        epoch: u32,
        key: ObjectId,
        head: StripHead,
        offset: u64,
        bytes: &[u8],
    ) -> Result<(), Failure> {
        let store = &self.store;
        let cur = store.meta(key);
        let state = cur.unwrap_or_default();
        if head.op == StripOp::Put {
            // A strip installed whole (rebuilt, repaired, or the stripe written again after
            // going back): over any older copy, or a bad one (lost, corrupt) of its version.
            // What it replaces undoes the change only if it was good and at the change's base.
            let good = !(state.lost || state.suspect) && store.verify(key).is_ok();
            let at_base = good && state.version == head.base && head.base != Version::NONE;
            let undo = if good {
                self.whole_undo(key, cur)?
            } else {
                Undo::Nothing
            };
            let installs = if head.flags & FLAG_DELETED != 0 {
                ObjState::tombstone(head.version)
            } else {
                ObjState::live(head.version)
            };
            if !store.put_if_newer(key, bytes, installs)? {
                if good && cur.is_some() && state.version == head.version {
                    // The copy here is the one the primary rebuilds (it answered unsure): the
                    // primary resolved the stripe at this version in this epoch, so the copy
                    // holds every change before it, which its note now says.
                    self.vouch_note(epoch, key, &head)?;
                }
                return Ok(());
            }
            let flags = if at_base {
                FLAG_KNOWN | FLAG_BACK
            } else {
                FLAG_KNOWN
            };
            let known = head.base != Version::NONE || !head.touched.is_empty();
            let head = StripHead {
                flags: if known { flags } else { 0 } | (head.flags & FLAG_DELETED),
                ..head
            };
            // Made whole by the primary, which resolved the stripe in this epoch: it holds
            // every change before it.
            let note = Note {
                head,
                current: epoch,
                undo,
            };
            store.set_note(key, &note.encode())?;
            store.sync_object(key)?;
            return Ok(());
        }
        if state.lost || state.suspect {
            return Err(Failure::new(
                ResultCode::Diverged,
                format!(
                    "strip {key} is {} here",
                    if state.lost { "lost" } else { "suspect" }
                ),
            ));
        }
        if head.op == StripOp::Back {
            return self.undo_strip(key, head, state);
        }
        if head.op == StripOp::Settle {
            // The change is acknowledged: its undo is never needed. Not synced: an undo a
            // crash brings back costs only space.
            // Only the note's head is read: its undo may be as large as the strip.
            let now = store
                .note_prefix(key, NOTE_HEAD_LEN)
                .and_then(|b| Note::decode_head(&b));
            if let Some((n, current)) = now.filter(|(n, _)| {
                n.version == head.version && state.version == head.version && cur.is_some()
            }) {
                let head = StripHead {
                    flags: n.flags & !FLAG_BACK,
                    ..n
                };
                let note = Note {
                    head,
                    current,
                    undo: Undo::Nothing,
                };
                store.set_note(key, &note.encode())?;
            }
            return Ok(());
        }
        if state.version == head.version && cur.is_some() {
            return Ok(()); // a retry of a change applied already
        }
        if state.version != head.base {
            let mut f = Failure::new(
                ResultCode::Diverged,
                format!(
                    "strip {key} is at {:?} here, the change applies on {:?}",
                    state.version, head.base
                ),
            );
            f.version = Some(state.version);
            return Err(f);
        }
        let live = cur.is_some_and(|s| !s.deleted);
        let len = bytes.len();
        let old = if live && matches!(head.op, StripOp::Write | StripOp::Xor) {
            read_or_zeros(store.read(key, offset, len), len)?
        } else {
            vec![0u8; len]
        };
        let undo = match (head.op, cur) {
            (StripOp::Remove, _) => self.whole_undo(key, cur)?,
            (_, None) => Undo::Absent,
            (_, Some(s)) if s.deleted => Undo::Tombstone,
            (StripOp::Bump, _) => Undo::Nothing,
            _ => Undo::Range {
                offset,
                old: old.clone(),
            },
        };
        let head = StripHead {
            flags: FLAG_KNOWN | FLAG_BACK,
            ..head
        };
        // Its version, made in this epoch, says which changes it holds.
        let note = Note {
            head,
            current: 0,
            undo,
        }
        .encode();
        match head.op {
            StripOp::Remove => {
                store.put_if_newer(key, &[], ObjState::tombstone(head.version))?;
                store.set_note(key, &note)?;
            }
            StripOp::Write | StripOp::Xor | StripOp::Bump => {
                store.set_note(key, &note)?;
                if !live && cur.is_some() {
                    // Over a tombstone the strip starts again from zeros, written durable at
                    // once (as any object over a tombstone): its note first. (Forgetting the
                    // tombstone instead dropped the note with it: a strip at a version no note
                    // explained, that no resolution could take back; seed 60017 with crashes.)
                    store.sync_object(key)?;
                }
                let data = match head.op {
                    StripOp::Xor => {
                        let mut new = old;
                        xor_into(&mut new, bytes);
                        new
                    }
                    StripOp::Write => bytes.to_vec(),
                    _ => Vec::new(),
                };
                let at = if head.op == StripOp::Bump { 0 } else { offset };
                store.write(key, at, &data, None, head.version)?;
            }
            StripOp::Put | StripOp::Back | StripOp::Settle => unreachable!("handled above"),
        }
        // On stable storage before the primary hears of it: a crash of this node takes back
        // only a change it never answered, so rule 2 (one undecided change) holds after it.
        store.sync_object(key)?;
        Ok(())
    }

    /// Records in the note of strip `key`, here at `head.version`, that it holds every change
    /// before `epoch`. Not synced: a crash that loses it leaves the copy unsure, as before.
    fn vouch_note(&self, epoch: u32, key: ObjectId, head: &StripHead) -> Result<(), Failure> {
        let store = &self.store;
        let mut note = (store.note(key).and_then(|b| Note::decode(&b)))
            .filter(|n| n.head.version == head.version)
            .unwrap_or_else(|| Note::bare(head, head.version));
        if note.current < epoch {
            note.current = epoch;
            store.set_note(key, &note.encode())?;
        }
        Ok(())
    }

    /// What undoes replacing strip `key` whole, from its state `cur` here.
    fn whole_undo(&self, key: ObjectId, cur: Option<ObjState>) -> Result<Undo, Failure> {
        Ok(match cur {
            None => Undo::Absent,
            Some(s) if s.deleted => Undo::Tombstone,
            Some(_) => Undo::Whole(self.store.read_whole(key)?.0),
        })
    }

    /// `PeerStrip` of op `Back`: strip `key`, at `head.version` by a change on `head.base`,
    /// returns to `head.base` from its note (a stripe resolved back). Already there: done.
    fn undo_strip(&self, key: ObjectId, head: StripHead, state: ObjState) -> Result<(), Failure> {
        let store = &self.store;
        if state.version == head.base {
            return Ok(());
        }
        let note = store.note(key).and_then(|b| Note::decode(&b));
        // A strip the change left alone goes back by its number, whatever it kept (one pulled
        // by recovery keeps its holder's undo, if it had one).
        let untouched = |n: &Note| {
            n.head.flags & FLAG_KNOWN != 0
                && key
                    .strip_index()
                    .is_some_and(|k| !n.head.touched.contains(k))
        };
        let Some(note) = note.filter(|n| {
            (n.head.flags & FLAG_BACK != 0 || untouched(n))
                && n.head.version == state.version
                && state.version == head.version
                && n.head.base == head.base
        }) else {
            return Err(Failure::new(
                ResultCode::Diverged,
                format!(
                    "strip {key} is at {:?} here and keeps nothing to return to {:?}",
                    state.version, head.base
                ),
            ));
        };
        let base = head.base;
        let undo = if note.head.flags & FLAG_BACK != 0 {
            &note.undo
        } else {
            &Undo::Nothing // untouched
        };
        match undo {
            Undo::Nothing => store.write(key, 0, &[], None, base)?,
            Undo::Range { offset, old } => store.write(key, *offset, old, None, base)?,
            Undo::Whole(old) => {
                store.forget(key)?;
                store.put_if_newer(key, old, ObjState::live(base))?;
            }
            Undo::Absent => store.forget(key)?,
            Undo::Tombstone => {
                store.forget(key)?;
                store.put_if_newer(key, &[], ObjState::tombstone(base))?;
            }
        }
        if store.meta(key).is_some() {
            store.set_note(key, &Note::bare(&head, base).encode())?;
        }
        store.sync_object(key)?;
        Ok(())
    }

    /// `PeerStripRead`: bytes `offset .. offset + len` of strip `key` here (zeros where it has
    /// none), with what its note says of its version.
    pub(in crate::node) async fn read_strip(
        self: &Arc<Self>,
        ep: &Epoch,
        cfg: &ClusterConfig,
        key: ObjectId,
        like: StripHead,
        offset: u64,
        len: usize,
    ) -> Result<StripRead, Failure> {
        self.readable_strip(ep, cfg, key, &like, offset, len)
            .await?;
        let knows = self.knows_strip(key);
        let store = self.store.clone();
        let node = self.clone();
        let read = in_store(self, move || {
            let state = store.meta(key);
            let version = state.map_or(Version::NONE, |s| s.version);
            if state.is_some_and(|s| s.lost || s.suspect) {
                return Err(Failure::new(
                    ResultCode::Busy,
                    format!("strip {key} is not settled here"),
                ));
            }
            let bytes = match state {
                Some(s) if !s.deleted && len > 0 => {
                    read_or_zeros(store.read(key, offset, len), len)?
                }
                _ => vec![0u8; len],
            };
            let noted = store
                .note_prefix(key, NOTE_HEAD_LEN)
                .and_then(|b| Note::decode_head(&b));
            let current = Note::current_of(version, noted.map_or(0, |(_, c)| c));
            let knows_present = node.knows_present_strip(key, current);
            let noted = noted.map(|(head, _)| head);
            let mut head = Note::answer(noted.as_ref(), &like, version);
            // Nothing here is "never made" only if the strip's holder of every epoch since
            // the clean one is listed; a version here is the newest unless this node missed
            // an epoch whose holder is not listed (seed 70393 with crashes and SIM_EC=2:1: a
            // node back from a crash answered its strip at the base of an acknowledged change
            // it had missed, which with a strip at the change that kept its undo took the
            // stripe back over it). Either way, unsure counts as missing.
            if (state.is_none() && !knows) || (state.is_some() && !knows_present) {
                head.flags |= FLAG_UNSURE;
            }
            if state.is_some_and(|s| s.deleted) {
                head.flags |= FLAG_DELETED;
            }
            Ok(StripRead {
                head,
                bytes: Bytes::from(bytes),
            })
        })
        .await?;
        // What this node has of a strip, and what it knows of it, are of its current epoch:
        // a request of an older one that waited here while the node moved on is answered
        // for no epoch at all (seed 70588 with crashes and SIM_EC=2:1: a node that held strip
        // 2 in epoch 17, and never got it, answered "nothing, known" in epoch 18, where
        // another node held it; the stripe went back over an acknowledged write).
        self.same_epoch(ep)?;
        Ok(read)
    }

    /// `EcStripRead`: bytes `offset .. offset + len` of strip `key` here, for a client that
    /// knows the stripe at version `want` (acknowledged to it, or answered by the primary's
    /// read), only if the strip here is at exactly that version and readable. Any other
    /// strip is `Conflict` naming the version here, and the client reads through the
    /// primary. Bytes of one version are one stripe's (rule 1), and a version acknowledged
    /// never goes back, so a strip at `want` holds the bytes the primary would decode. The
    /// strip's replica lock orders the read with the changes of the strip (a change, a
    /// `Back`, a `Put` are applied under it): its version and bytes are read as one.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::node) async fn read_strip_at(
        self: &Arc<Self>,
        ep: &Epoch,
        cfg: &ClusterConfig,
        key: ObjectId,
        like: StripHead,
        want: Version,
        offset: u64,
        len: usize,
    ) -> Result<Bytes, Failure> {
        let r = async {
            self.readable_strip(ep, cfg, key, &like, offset, len)
                .await?;
            let _ordered = self.replica_lock(key).lock().await;
            let store = self.store.clone();
            let bytes = in_store(self, move || {
                let state = store
                    .meta(key)
                    .filter(|s| !(s.lost || s.suspect || s.deleted));
                let here = state.map_or(Version::NONE, |s| s.version);
                if here != want || want == Version::NONE {
                    let mut f = Failure::new(
                        ResultCode::Conflict,
                        format!("strip {key} is at {here:?} here, not at {want:?}"),
                    );
                    f.version = Some(here);
                    return Err(f);
                }
                Ok(store.read(key, offset, len)?)
            })
            .await?;
            self.same_epoch(ep)?;
            Ok(Bytes::from(bytes))
        }
        .await;
        self.ec_count(super::EcEvent::StripRead(r.is_ok()));
        r
    }

    /// Checks that strip `key` is held here in `ep` under `like`'s scheme, that
    /// `offset .. offset + len` lies in it, and waits until it is recovered here.
    async fn readable_strip(
        &self,
        ep: &Epoch,
        cfg: &ClusterConfig,
        key: ObjectId,
        like: &StripHead,
        offset: u64,
        len: usize,
    ) -> Result<(), Failure> {
        let codec = self.own_strip(ep, cfg, key, like)?;
        fits(&codec, key, offset, len)?;
        self.ensure_recovered(key)
            .await
            .map_err(|why| crate::node::failure::not_recovered(key, why))
    }

    /// `StaleEpoch` unless this node is still at `ep`'s epoch.
    fn same_epoch(&self, ep: &Epoch) -> Result<(), Failure> {
        let now = self.epoch().view.epoch;
        if now == ep.view.epoch {
            return Ok(());
        }
        Err(crate::node::server::stale_epoch(ep.view.epoch, now))
    }
}

/// Runs `f` (store calls that answer as the node does) on the blocking pool.
async fn in_store<T: Send + 'static>(
    node: &Node,
    f: impl FnOnce() -> Result<T, Failure> + Send + 'static,
) -> Result<T, Failure> {
    node.blocking(f)
        .await
        .unwrap_or_else(|e| Err(crate::node::failure::task_failure(e)))
}

/// A read's bytes, or zeros for an object not (or no longer) here.
fn read_or_zeros(r: Result<Vec<u8>, StoreError>, len: usize) -> Result<Vec<u8>, Failure> {
    match r {
        Ok(b) => Ok(b),
        Err(StoreError::NotFound(_)) => Ok(vec![0u8; len]),
        Err(e) => Err(e.into()),
    }
}
