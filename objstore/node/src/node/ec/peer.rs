//! The primary's requests to strip holders (`PeerStrip`, `PeerStripRead`), or the same work
//! here for the strips it holds itself.

use std::sync::Arc;

use bytes::Bytes;

use super::{StripRead, Stripe};
use crate::node::replicate::FORWARD_TIMEOUT;
use crate::node::server::Failure;
use crate::node::{Epoch, Node};
use objstore_proto::ec::resolve::StripSet;
use objstore_proto::ec::wire::{self, StripHead, StripOp};
use objstore_proto::frame::{Header, Opcode, ResultCode};
use objstore_proto::oid::ObjectId;
use objstore_proto::version::Version;
use objstore_proto::view::ClusterConfig;

impl Node {
    /// Sends strip `k`'s op to its holder (this node: applied here).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn strip_call(
        self: &Arc<Self>,
        ep: &Epoch,
        cfg: &ClusterConfig,
        stripe: &Stripe,
        k: usize,
        head: StripHead,
        offset: u64,
        bytes: Bytes,
    ) -> Result<(), Failure> {
        self.strip_call_as(ep, cfg, stripe, k, head, offset, bytes, 0)
            .await
    }

    /// [`Node::strip_call`] with the `PeerStrip` header's `aux` flags
    /// ([`wire::PUT_REPLACES`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn strip_call_as(
        self: &Arc<Self>,
        ep: &Epoch,
        cfg: &ClusterConfig,
        stripe: &Stripe,
        k: usize,
        head: StripHead,
        offset: u64,
        bytes: Bytes,
        aux: u32,
    ) -> Result<(), Failure> {
        let key = stripe.key(k);
        let holder = holder_of(stripe, k)?;
        if holder.id == self.me.id {
            self.replacing(key, &head, aux);
            return self.apply_strip(ep, cfg, key, head, offset, bytes).await;
        }
        let mut h = Header::request(Opcode::PeerStrip, 0, ep.view.epoch);
        h.oid = key.0;
        h.offset = offset;
        h.length = bytes.len() as u32;
        h.aux = aux;
        let f = self
            .strip_peer_call(
                holder.addr,
                h,
                Bytes::copy_from_slice(&head.encode()),
                bytes,
            )
            .await?;
        match f.header.result_code() {
            ResultCode::Ok => Ok(()),
            code => Err(strip_failure(holder.addr, code, f.message())),
        }
    }

    /// Before a `Put` flagged [`wire::PUT_REPLACES`] of strip `key` here: the copy here at the
    /// Put's version reads back but is wrong, so it is marked lost in the store (unreadable;
    /// a copy as new replaces it), and the Put installs over it and keeps no undo of it. A
    /// copy at another version is left to the Put's own rules.
    pub(in crate::node) fn replacing(&self, key: ObjectId, head: &StripHead, aux: u32) {
        if aux & wire::PUT_REPLACES == 0 || head.op != StripOp::Put {
            return;
        }
        let here = self.store.meta(key);
        if here.is_some_and(|s| s.version == head.version && !s.deleted) {
            tracing::warn!(
                "strip {key}: the copy here at {:?} is wrong (its bytes disagree with parity): replaced by its primary's rebuild",
                head.version
            );
            self.store.mark_lost(key);
        }
    }

    /// Bytes `offset .. offset + len` of strip `k` from its holder, with its head.
    pub(super) async fn strip_read(
        self: &Arc<Self>,
        ep: &Epoch,
        cfg: &ClusterConfig,
        stripe: &Stripe,
        k: usize,
        offset: u64,
        len: usize,
    ) -> Result<StripRead, Failure> {
        let key = stripe.key(k);
        let like = stripe.head(
            StripOp::Write,
            Version::NONE,
            Version::NONE,
            StripSet::default(),
        );
        let holder = holder_of(stripe, k)?;
        if holder.id == self.me.id {
            return self.read_strip(ep, cfg, key, like, offset, len).await;
        }
        let mut h = Header::request(Opcode::PeerStripRead, 0, ep.view.epoch);
        h.oid = key.0;
        h.offset = offset;
        h.length = len as u32;
        h.aux = wire::scheme_aux(stripe.scheme);
        let f = self
            .strip_peer_call(holder.addr, h, Bytes::new(), Bytes::new())
            .await?;
        if f.header.result_code() != ResultCode::Ok {
            return Err(strip_failure(
                holder.addr,
                f.header.result_code(),
                f.message(),
            ));
        }
        match wire::split(&f.payload) {
            Some((head, bytes)) if bytes.len() == len => Ok(StripRead { head, bytes }),
            _ => Err(Failure::new(
                ResultCode::Io,
                format!("holder {} answered strip {key} malformed", holder.addr),
            )),
        }
    }

    /// For the sweep of a node holding strips `own` of `stripe` that is not its primary
    /// ([`Node::ec_sweep`]): asks the primary to read the stripe (a read resolves it and
    /// rebuilds the strips missing), then checks that each strip of `own` here is at the
    /// version the primary answers. Err says why the stripe is not known whole.
    pub(super) async fn ask_whole(
        self: &Arc<Self>,
        ep: &Epoch,
        stripe: &Stripe,
        own: &[ObjectId],
    ) -> Result<(), String> {
        let primary = holder_of(stripe, 0).map_err(|f| f.message)?;
        let mut h = Header::request(Opcode::EcRead, 0, ep.view.epoch);
        h.oid = stripe.oid.0;
        h.aux = wire::scheme_aux(stripe.scheme);
        let f = (self.strip_peer_call(primary.addr, h, Bytes::new(), Bytes::new()))
            .await
            .map_err(|f| f.message)?;
        let version = match f.header.result_code() {
            ResultCode::Ok => Version(f.header.offset),
            // Never written, or removed: decided (its strips hold nothing or tombstones).
            ResultCode::NotFound => return Ok(()),
            code => {
                return Err(format!(
                    "its primary {} answered {code:?}: {}",
                    primary.addr,
                    f.message()
                ))
            }
        };
        for &key in own {
            let here = self.store.meta(key).map(|s| s.version);
            if here != Some(version) {
                return Err(format!(
                    "strip {key} is at {here:?} here, the stripe at {version:?}"
                ));
            }
        }
        Ok(())
    }

    /// One request to a peer; a connection that failed is dropped and reported `Busy`.
    async fn strip_peer_call(
        &self,
        addr: std::net::SocketAddr,
        h: Header,
        prefix: Bytes,
        payload: Bytes,
    ) -> Result<objstore_proto::frame::Frame, Failure> {
        let conn = self
            .peers
            .get(addr, FORWARD_TIMEOUT)
            .await
            .map_err(|e| Failure::new(ResultCode::Busy, format!("strip holder {addr}: {e}")))?;
        match conn
            .call_with_prefix(h, prefix, payload, FORWARD_TIMEOUT)
            .await
        {
            Ok(f) => Ok(f),
            Err(e) => {
                self.peers.drop_conn(addr).await;
                Err(Failure::new(
                    ResultCode::Busy,
                    format!("strip holder {addr}: {e}"),
                ))
            }
        }
    }
}

/// A holder's refusal as the client sees it: its disk's errors as they are, anything else a
/// wait (the primary resolves the stripe at the next attempt).
fn strip_failure(addr: std::net::SocketAddr, code: ResultCode, message: String) -> Failure {
    match code {
        ResultCode::NoSpace | ResultCode::Io | ResultCode::InvalidRequest => {
            Failure::new(code, format!("strip holder {addr}: {message}"))
        }
        _ => Failure::new(ResultCode::Busy, format!("strip holder {addr}: {message}")),
    }
}

pub(super) fn holders(stripe: &Stripe) -> String {
    stripe
        .holders
        .iter()
        .map(|n| {
            n.as_ref()
                .map_or("none".to_string(), |n| n.addr.to_string())
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The holder of strip `k`, or why there is none.
fn holder_of(stripe: &Stripe, k: usize) -> Result<&objstore_proto::view::NodeInfo, Failure> {
    stripe.holders[k].as_ref().ok_or_else(|| {
        Failure::new(
            ResultCode::Busy,
            format!(
                "strip {k} of object {} has no holder: the cluster has fewer nodes than its {} strips",
                stripe.oid,
                stripe.width()
            ),
        )
    })
}
