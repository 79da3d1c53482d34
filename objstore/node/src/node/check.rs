//! Check and repair of one copy: `CheckObj` answers what this node holds of an object and
//! whether its bytes read back (their digest); `RepairObj` drops a bad copy here and restores
//! it from a good one.
//!
//! A repair is issue 22's lost copy again, on purpose: the copy is marked lost at the version
//! wanted (from then on no request uses it: its I/O waits, `Busy`), held pending, dropped from
//! the store, and pulled by the recovery machinery from an owner holding that version
//! ([`Node::ensure_recovered`]; a pull installs only what is newer, and `Recovery::restored`
//! says when the loss is made good). A pull that fails leaves the copy lost and asks the
//! recovery task to plan again, which keeps pulling it. A copy is dropped only once some owner
//! up holds the version wanted, so a repair never leaves an object with fewer good copies.

use std::net::SocketAddr;

use bytes::Bytes;

use super::server::Failure;
use super::Node;
use crate::store::{ObjState, StoreError, Version};
use objstore_proto::api::{CopyCheck, RepairReply, RepairRequest};
use objstore_proto::frame::{Header, Opcode, ResultCode};
use objstore_proto::oid::ObjectId;

/// How long a node waits for a peer's `CheckObj` or `RepairObj` (a repair pulls a whole
/// object, so this is above the forwarded writes' timeout).
const CHECK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// A failure's text with its sources, as a client sees it.
fn store_message(e: StoreError) -> String {
    Failure::from(e).message
}

impl Node {
    /// `CheckObj`: what this node holds of `oid`, read back and hashed unless `state_only`.
    pub(super) async fn check_copy(&self, oid: ObjectId, state_only: bool) -> CopyCheck {
        let state = self.store.meta(oid);
        if self.recovery.lost(oid).is_some() {
            return CopyCheck {
                state,
                lost: true,
                ..Default::default()
            };
        }
        if self.recovery.is_pending(oid) {
            return CopyCheck {
                state,
                recovering: true,
                ..Default::default()
            };
        }
        let Some(state) = state else {
            return CopyCheck::default();
        };
        if state.deleted || state_only {
            return CopyCheck {
                state: Some(state),
                ..Default::default()
            };
        }
        let store = self.store.clone();
        match self.blocking(move || store.verify(oid)).await {
            Ok(Ok(v)) => CopyCheck {
                state: Some(v.state),
                digest: Some(v.digest),
                bytes: v.bytes,
                ..Default::default()
            },
            // Removed since the state was read: nothing here now.
            Ok(Err(StoreError::NotFound(_))) => CopyCheck {
                state: self.store.meta(oid),
                ..Default::default()
            },
            Ok(Err(e)) => {
                tracing::warn!("object {oid}: the copy here failed verification: {e}");
                CopyCheck {
                    state: Some(state),
                    error: Some(store_message(e)),
                    ..Default::default()
                }
            }
            Err(e) => CopyCheck {
                state: Some(state),
                error: Some(format!("store task failed: {e}")),
                ..Default::default()
            },
        }
    }

    /// `RepairObj` (see the module documentation): restores the copy of `oid` here at `want`
    /// or newer, from `source` or else from any other owner holding that version. Returns the
    /// state installed, or why the copy could not be restored (it stays as it was when no
    /// source holds `want`).
    pub(super) async fn repair_copy(
        &self,
        oid: ObjectId,
        want: Version,
        source: Option<SocketAddr>,
    ) -> Result<ObjState, Failure> {
        let ep = self.epoch();
        let epoch = ep.view.epoch;
        let cfg = self.config().ok_or_else(|| {
            Failure::new(
                ResultCode::NotFormatted,
                "the cluster is not formatted: run 'dog cluster format'",
            )
        })?;
        let copies = cfg.copies as usize;
        if !ep.ring.holds(self.me.id, oid, copies) {
            return Err(Failure::invalid(format!(
                "{} is not an owner of object {oid} in epoch {epoch}",
                self.me.addr
            )));
        }
        let candidates: Vec<SocketAddr> = match source {
            Some(s) => vec![s],
            None => ep
                .ring
                .replicas(oid, copies)
                .iter()
                .map(|n| n.addr)
                .collect(),
        };
        let sources = self.holders_from(candidates, epoch, oid, want).await;
        if sources.is_empty() {
            return Err(Failure::new(
                ResultCode::NotFound,
                format!(
                    "no owner up holds object {oid} at {want} or newer{}: the copy here is left as it is",
                    match source {
                        Some(s) => format!(" (asked {s})"),
                        None => String::new(),
                    }
                ),
            ));
        }
        let hold = {
            // Both locks: neither a change as primary nor one forwarded to this replica is
            // applied while the copy is dropped; either finds it gone afterwards and is
            // refused (a version conflict) or installs a whole newer copy.
            let _primary = self.obj_lock(oid).lock().await;
            let _replica = self.replica_lock(oid).lock().await;
            let local = self.store.meta(oid);
            if let Some(l) = local.filter(|l| l.version > want) {
                return Err(Failure::new(
                    ResultCode::Conflict,
                    format!(
                        "object {oid} is at {} here, newer than the {want} to restore: it changed since it was checked",
                        l.version
                    ),
                ));
            }
            // From here on nothing uses this copy as it is.
            self.recovery.lose(oid, want);
            let hold = self.recovery.hold(oid, ObjState::live(want));
            // One more object to pull in this round (`dog node recovery` counts it).
            self.recovery.update(|s| s.total += 1);
            if local.is_some_and(|l| l.version == want) {
                let store = self.store.clone();
                let forgot = super::server::blocking(self, move || store.forget(oid)).await;
                if let Err(f) = forgot {
                    self.recovery.release(oid, &hold, sources);
                    self.recovery.plan_again();
                    return Err(f);
                }
            }
            hold
        };
        self.recovery.release(oid, &hold, sources.clone());
        let pulled = self.ensure_recovered(oid).await;
        if pulled.is_ok() && self.recovery.lost(oid).is_none() {
            let st = self.store.meta(oid).unwrap_or(ObjState::live(want));
            tracing::info!(
                "object {oid}: bad copy here restored at {st:?} from one of {sources:?}"
            );
            return Ok(st);
        }
        self.recovery.plan_again();
        Err(Failure::new(
            ResultCode::Busy,
            format!(
                "object {oid}: the copy here is dropped and its pull from {sources:?} failed ({pulled:?}); recovery keeps pulling it"
            ),
        ))
    }

    /// `CheckObj` to another node.
    pub(super) async fn check_peer(
        &self,
        addr: SocketAddr,
        oid: ObjectId,
    ) -> Result<CopyCheck, String> {
        let mut h = Header::request(Opcode::CheckObj, 0, self.epoch().view.epoch);
        h.oid = oid.0;
        let f = self
            .peer_call_within(addr, h, Bytes::new(), CHECK_TIMEOUT)
            .await
            .map_err(|e| format!("{addr}: {e}"))?;
        if f.header.result_code() != ResultCode::Ok {
            return Err(format!("{addr}: {}", f.message()));
        }
        serde_json::from_slice(&f.payload).map_err(|e| format!("{addr}: bad CheckObj answer: {e}"))
    }

    /// `RepairObj` to another node: restore its copy of `oid` at `want` from `source`.
    pub(super) async fn repair_peer(
        &self,
        addr: SocketAddr,
        oid: ObjectId,
        want: Version,
        source: Option<SocketAddr>,
    ) -> Result<ObjState, String> {
        if addr == self.me.addr {
            return self
                .repair_copy(oid, want, source)
                .await
                .map_err(|f| f.message);
        }
        let mut h = Header::request(Opcode::RepairObj, 0, self.epoch().view.epoch);
        h.oid = oid.0;
        let body = serde_json::to_vec(&RepairRequest {
            version: want,
            source,
        })
        .expect("serializable");
        let f = self
            .peer_call_within(addr, h, Bytes::from(body), CHECK_TIMEOUT)
            .await
            .map_err(|e| format!("{addr}: {e}"))?;
        if f.header.result_code() != ResultCode::Ok {
            return Err(format!("{addr}: {}", f.message()));
        }
        let r: RepairReply = serde_json::from_slice(&f.payload)
            .map_err(|e| format!("{addr}: bad RepairObj answer: {e}"))?;
        Ok(r.state)
    }
}
