//! Old holders stand in for an owner that cannot store an object (Ceph's acting set, its
//! `pg_temp`).
//!
//! A node that became an object's owner in a new epoch pulls it from the nodes that hold its
//! newest version. When that pull fails because this node's disk is full, the object stays
//! pending here, and before this module every request for it got `NoSpace`, though the old
//! holders still had it: a read of data that exists failed.
//!
//! **Invariant.** While this node's pull of an object failed for lack of space, the node
//! that the pull would copy from (the *stand-in*) holds the object's newest acknowledged
//! version, and every change this node takes of the object is applied on the stand-in
//! before it is acknowledged. So:
//! - a read here is answered by the stand-in (a `ReadObj` relayed as it came);
//! - a change here (as primary, or a forwarded `PeerWrite` or `PeerPut`) is applied on the
//!   stand-in at the version the primary gives it, instead of on the copy here, and the
//!   pending pull then wants that version from that stand-in;
//! - a change goes through only a stand-in that no longer owns the object in this epoch
//!   (an owner gets the change from the primary itself; applying it twice would diverge).
//!   With none (the old holders are all still owners), the change is refused `NoSpace`, as
//!   before: nothing acknowledged is lost, the client sees the full disk.
//!
//! Why the stand-in keeps its copy: a node drops a copy it no longer owns only once every
//! node of the epoch recovered it and every owner shows it holds that version or a newer one
//! ([`super::collect`]); this node does neither while it cannot store the object.
//!
//! Why nobody waits for this node if it dies: a change taken through a stand-in is not
//! recorded as this node's (`changed/<epoch>`, [`Node::note_change`]) since nothing of it is
//! here; the stand-in records its own.
//!
//! Ordering: a change through a stand-in holds the object's replica lock here, which a pull
//! takes to install, and replaces the pending pull by one wanting the new version; a pull
//! that read the stand-in's copy before the change and installs it after is not taken as the
//! end of the object's recovery (only the pull still pending is), so the copy here is never
//! served while older than the stand-in's.

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::OnceCell;

use super::recovery::{Pull, PullFailed};
use super::replicate::FORWARD_TIMEOUT;
use super::server::Failure;
use super::{Epoch, Node};
use crate::store::{ObjState, Version};
use objstore_proto::frame::{Header, ResultCode};
use objstore_proto::oid::ObjectId;
use objstore_proto::view::ClusterConfig;

/// How this node takes a change of an object.
pub(super) enum Acting {
    /// On its own copy (recovered, or nothing to recover).
    Here,
    /// Through a stand-in: this node's disk could not take the object.
    Through(StandIn),
}

/// An old holder of an object that this node could not store, with the newest version as
/// this node knows it.
#[derive(Debug, Clone, Copy)]
pub(super) struct StandIn {
    pub(super) addr: SocketAddr,
    pub(super) state: ObjState,
}

impl Node {
    /// Before a change of `oid` here: `Here` once the copy here may be changed (and this node
    /// has recorded that it takes changes in the epoch); `Through` a stand-in that no longer
    /// owns `oid` when this node's disk could not take it; else why not.
    pub(super) async fn acting(
        &self,
        ep: &Epoch,
        cfg: &ClusterConfig,
        oid: ObjectId,
    ) -> Result<Acting, Failure> {
        match self.ensure_recovered(oid).await {
            Ok(()) => {
                self.note_change(ep.view.epoch).await?;
                Ok(Acting::Here)
            }
            Err(PullFailed::NoSpace) => {
                let owners = ep.ring.replicas(oid, cfg.copies as usize);
                let not_owner = |a: &SocketAddr| owners.iter().all(|n| n.addr != *a);
                match self.stand_in(oid, not_owner) {
                    Some(s) => Ok(Acting::Through(s)),
                    None => Err(super::failure::not_recovered(oid, PullFailed::NoSpace)),
                }
            }
            Err(why) => Err(super::failure::not_recovered(oid, why)),
        }
    }

    /// Before a `PeerPut` of `oid` (which installs the object whole and needs no recovery
    /// first): `Through` a stand-in that no longer owns it while this node's pull of it failed
    /// for lack of space, else `Here` once the change is recorded.
    pub(super) async fn put_acting(
        &self,
        ep: &Epoch,
        cfg: &ClusterConfig,
        oid: ObjectId,
    ) -> Result<Acting, Failure> {
        let owners = ep.ring.replicas(oid, cfg.copies as usize);
        if let Some(s) = self.stand_in(oid, |a| owners.iter().all(|n| n.addr != *a)) {
            return Ok(Acting::Through(s));
        }
        self.note_change(ep.view.epoch).await?;
        Ok(Acting::Here)
    }

    /// A forwarded change (`PeerWrite`, `PeerPut`) that this node cannot store, applied on
    /// the stand-in `s` as it came; `state` is what it makes of the object.
    pub(super) async fn forward_through(
        &self,
        s: StandIn,
        h: &Header,
        payload: Bytes,
        state: ObjState,
    ) -> Result<(), Failure> {
        let oid = ObjectId(h.oid);
        let _ordered = self.replica_lock(oid).lock().await;
        self.still_standing_in(oid, &s)?;
        let res = match self.peers.get(s.addr, FORWARD_TIMEOUT).await {
            Ok(c) => c.call(*h, payload, FORWARD_TIMEOUT).await,
            Err(e) => Err(e),
        };
        match res {
            Ok(f) => match f.header.result_code() {
                ResultCode::Ok => {
                    self.relayed(oid, state, s.addr);
                    Ok(())
                }
                // The primary's own answers to these: the whole object, a higher version.
                code @ (ResultCode::Diverged | ResultCode::Conflict) => {
                    let mut fail = Failure::new(code, f.message());
                    fail.version = Some(Version(f.header.offset));
                    Err(fail)
                }
                code => Err(stand_in_failure(s.addr, code, f.message())),
            },
            Err(e) => {
                self.peers.drop_conn(s.addr).await;
                Err(stand_in_failure(s.addr, ResultCode::Busy, e.to_string()))
            }
        }
    }

    /// A stand-in for `oid` among the sources of its pull that `fits`, while that pull failed
    /// for lack of space here.
    fn stand_in(&self, oid: ObjectId, fits: impl Fn(&SocketAddr) -> bool) -> Option<StandIn> {
        let pending = self.recovery.pending.lock().unwrap();
        let pull = pending.get(&oid)?;
        if pull.result.get() != Some(&Err(PullFailed::NoSpace)) {
            return None;
        }
        let addr = *pull.sources.iter().find(|a| fits(a))?;
        Some(StandIn {
            addr,
            state: pull.want,
        })
    }

    /// Under `oid`'s replica lock, before a change goes through `s`: `s` still stands in (no
    /// pull installed the object here and ended its recovery while the change waited for the
    /// lock, which would leave the copy here behind the stand-in's). Else `Busy`: the client
    /// tries again, and the change then applies here.
    pub(super) fn still_standing_in(&self, oid: ObjectId, s: &StandIn) -> Result<(), Failure> {
        let pending = self.recovery.pending.lock().unwrap();
        let standing = pending.get(&oid).is_some_and(|p| {
            p.result.get() == Some(&Err(PullFailed::NoSpace))
                && p.want == s.state
                && p.sources.contains(&s.addr)
        });
        if standing {
            return Ok(());
        }
        Err(Failure::new(
            ResultCode::Busy,
            format!("object {oid} changed hands here while a change waited for it; try again"),
        ))
    }

    /// A change of `oid` to `state` was applied on the stand-in at `addr`: the pull pending
    /// here now wants that version from it (and has failed for lack of space, as the one it
    /// replaces had: only the recovery round tries it again).
    pub(super) fn relayed(&self, oid: ObjectId, state: ObjState, addr: SocketAddr) {
        let mut pending = self.recovery.pending.lock().unwrap();
        if let Some(p) = pending.get_mut(&oid) {
            *p = Arc::new(Pull {
                want: state,
                sources: vec![addr],
                result: OnceCell::new_with(Some(Err(PullFailed::NoSpace))),
            });
        }
        drop(pending);
        self.recovery.update(|s| s.relayed += 1);
    }

    /// A read of `oid` this node cannot answer for lack of space (`why`), answered by a
    /// node holding its newest version: the request as it came, relayed.
    pub(super) async fn read_through(&self, h: &Header, why: PullFailed) -> Result<Bytes, Failure> {
        let oid = ObjectId(h.oid);
        let stand_in = match why {
            PullFailed::NoSpace => self.stand_in(oid, |_| true),
            _ => None,
        };
        let Some(s) = stand_in else {
            return Err(super::failure::not_recovered(oid, why));
        };
        let res = match self.peers.get(s.addr, FORWARD_TIMEOUT).await {
            Ok(c) => c.call(*h, Bytes::new(), FORWARD_TIMEOUT).await,
            Err(e) => Err(e),
        };
        match res {
            Ok(f) if f.header.result_code() == ResultCode::Ok => {
                self.recovery.update(|st| st.relayed += 1);
                Ok(f.payload)
            }
            Ok(f) => Err(stand_in_failure(
                s.addr,
                f.header.result_code(),
                f.message(),
            )),
            Err(e) => {
                self.peers.drop_conn(s.addr).await;
                Err(stand_in_failure(s.addr, ResultCode::Busy, e.to_string()))
            }
        }
    }
}

/// A stand-in's failure as this node answers it: a node that moved on (or is behind) or a
/// missing copy is a retry for the client, never its own final answer.
fn stand_in_failure(addr: SocketAddr, code: ResultCode, message: String) -> Failure {
    let code = match code {
        ResultCode::Io | ResultCode::Corrupt | ResultCode::InvalidRequest => code,
        _ => ResultCode::Busy,
    };
    Failure::new(
        code,
        format!("standing in for this node's full disk, {addr}: {message}"),
    )
}
