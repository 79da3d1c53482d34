//! Collection: once every node of the epoch has recovered it, a node drops the copies it no
//! longer owns, each only after every owner shows it holds that version or a newer one.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;

use super::recovery::{PEER_TIMEOUT, RETRY_FIRST, RETRY_MAX};
use super::{Epoch, Node};
use crate::store::ObjState;
use objstore_proto::api::RecoveryState;
use objstore_proto::frame::{Header, Opcode, ResultCode};
use objstore_proto::oid::ObjectId;

/// How many more times [`Node::collect`] asks about copies some owner did not hold yet
/// (pauses as recovery's retries, [`RETRY_FIRST`] doubling to [`RETRY_MAX`]: about half a
/// minute in all).
const KEPT_ROUNDS: u32 = 8;

impl Node {
    /// Whether every owner of `oid` in `ep` holds it at `state`'s version or newer (asked of
    /// each).
    async fn owners_hold(&self, ep: &Epoch, oid: ObjectId, state: ObjState, copies: usize) -> bool {
        let owners: Vec<SocketAddr> = ep
            .ring
            .replicas(oid, copies)
            .iter()
            .map(|n| n.addr)
            .collect();
        let stats = futures::future::join_all(owners.iter().map(|&a| async move {
            let mut h = Header::request(Opcode::StatObj, 0, ep.view.epoch);
            h.oid = oid.0;
            let conn = self.peers.get(a, PEER_TIMEOUT).await.ok()?;
            match conn.call(h, Bytes::new(), PEER_TIMEOUT).await {
                Ok(f) if f.header.result_code() == ResultCode::Ok => {
                    Some(ObjState::from_wire(f.header.offset, f.header.aux))
                }
                Ok(_) => None,
                Err(_) => {
                    self.peers.drop_conn(a).await;
                    None
                }
            }
        }))
        .await;
        !owners.is_empty()
            && stats
                .iter()
                .all(|s| s.is_some_and(|s| s.version >= state.version))
    }

    async fn peer_recovered(&self, addr: SocketAddr, epoch: u32) -> u32 {
        let h = Header::request(Opcode::PeerStatus, 0, epoch);
        let Ok(conn) = self.peers.get(addr, PEER_TIMEOUT).await else {
            return 0;
        };
        match conn.call(h, Bytes::new(), PEER_TIMEOUT).await {
            Ok(f) if f.header.result_code() == ResultCode::Ok => f.header.aux,
            _ => 0,
        }
    }

    /// Drops copies this node does not own once every owner holds them.
    pub(super) async fn collect(&self, ep: &Epoch, copies: usize) {
        let e = ep.view.epoch;
        let changed = || self.epoch().view.epoch != e;
        // Wait until every owner has recovered this epoch. A copy here lost meanwhile (a
        // failed flush after this round's plan) ends the round instead and plans the epoch
        // again: the other owners may be waiting for this node to settle that copy, which a
        // plan does (seed 8990), and a new plan happens only once this round ends.
        loop {
            if changed() {
                return;
            }
            if self.recovery.any_lost() {
                self.recovery.plan_again();
                return;
            }
            let others: Vec<SocketAddr> = ep
                .view
                .nodes
                .iter()
                .filter(|n| n.id != self.me.id)
                .map(|n| n.addr)
                .collect();
            let got =
                futures::future::join_all(others.iter().map(|&a| self.peer_recovered(a, e))).await;
            if got.iter().all(|&r| r >= e) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let mut removed = 0;
        let mut strays: Vec<ObjectId> = self
            .store
            .list()
            .into_iter()
            .map(|(oid, _)| oid)
            .filter(|&oid| !ep.ring.holds(self.me.id, oid, copies))
            .collect();
        // A copy some owner does not hold yet (one still taking a write's whole object, say)
        // is asked about again, with growing pauses, rather than left here until the next
        // epoch: a stray copy held for good is space lost, and a copy too many.
        let mut pause = RETRY_FIRST;
        for round in 0..=KEPT_ROUNDS {
            if round > 0 {
                if strays.is_empty() {
                    break;
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(RETRY_MAX);
            }
            let mut kept = Vec::new();
            for oid in strays {
                if changed() {
                    return;
                }
                // The copy as it is now (gone since: nothing to drop).
                let Some(state) = self.store.meta(oid) else {
                    continue;
                };
                // Every owner said it recovered the epoch; still, this copy goes only once
                // each owner shows it holds this version or a newer one.
                if !self.owners_hold(ep, oid, state, copies).await {
                    kept.push(oid);
                    continue;
                }
                let store = self.store.clone();
                if let Ok(Ok(())) = self.blocking(move || store.forget(oid)).await {
                    tracing::debug!("epoch {e}: dropped {oid} at {:?}", state.version);
                    removed += 1;
                }
            }
            strays = kept;
        }
        let kept = strays.len();
        if removed > 0 {
            tracing::info!("epoch {e}: dropped {removed} object(s) now held by others");
        }
        if kept > 0 {
            tracing::warn!(
                "epoch {e}: kept {kept} object(s) this node no longer owns: not every owner holds them yet"
            );
        }
        self.recovery.update(|s| {
            s.removed = removed;
            s.state = RecoveryState::Done;
        });
    }
}
