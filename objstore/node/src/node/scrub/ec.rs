//! The scrub of erasure-coded objects (issue 44): a pass over a node's strips.
//!
//! A strip key `oid.strip(k)` has one owner, its holder (`Ring::strip_holder`), so the
//! replicated path's comparison with other owners does not apply: strips are judged against
//! each other by the stripe's primary instead, as `dog vdi check` judges them
//! ([`Node::ec_check`]).
//!
//! - Strip 0 here, this node the stripe's primary in the current epoch: the whole stripe is
//!   checked and repaired. Every strip is read back whole from its holder; a strip that fails
//!   to read (a block fails its checksum), is missing, is at another version than the stripe,
//!   or whose bytes disagree with parity is rebuilt from x good ones. The pass counts the
//!   strip here as one copy verified, every strip's bytes as read (they count against the
//!   rate as other owners' bytes do for replicas), each bad strip (on any holder) as bad,
//!   each rebuilt one as repaired, and a stripe that cannot be made whole as unrecoverable.
//! - Strip k > 0 here: verified here only (its block checksums), cheap rot detection between
//!   the primary's passes. One that fails (or that this node lost) is not unrecoverable: the
//!   primary is asked to check and repair the object (`EcCheck` with the repair flag; run here
//!   when this node is the primary too, with fewer nodes than strips). It counts bad here,
//!   and repaired when the primary's report says strip k was rebuilt.
//! - Tombstones, strips being recovered, and strips this node no longer holds are skipped; a
//!   strip whose note names no scheme is verified here only (without a scheme no stripe can
//!   be formed), and counted unrecoverable if it fails.
//!
//! A parity strip whose bytes are wrong but whose checksums pass is found only by its
//! primary's pass (or `dog vdi check`), once per pass; a flipped byte in any strip is found
//! by its holder's pass too.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use objstore_proto::api::{EcCheckReport, ScrubPass};
use objstore_proto::ec::wire::scheme_aux;
use objstore_proto::frame::{Header, Opcode, ResultCode};
use objstore_proto::oid::ObjectId;
use objstore_proto::redundancy::Redundancy;
use objstore_proto::view::NodeInfo;

use crate::node::ec::Note;
use crate::node::server::io_epoch;
use crate::node::Node;

/// How long a holder waits for its primary's `EcCheck`: the primary reads every strip whole
/// and may rebuild some, each synced on its holder.
const EC_CHECK_TIMEOUT: Duration = Duration::from_secs(30);

impl Node {
    /// Scrubs strip `k` of an erasure-coded object held under `key` (see the module
    /// documentation); returns the bytes read for it (here and, as primary, on the other
    /// holders).
    pub(super) async fn scrub_strip(
        self: &Arc<Self>,
        key: ObjectId,
        k: usize,
        pass: &mut ScrubPass,
    ) -> u64 {
        if self.config().is_none() {
            return 0;
        }
        let oid = key.base();
        let ep = self.epoch();
        let holder = |k: usize| {
            ep.ring
                .strip_holder(oid, k)
                .map(|i| ep.ring.nodes()[i].clone())
        };
        if holder(k).map(|n| n.id) != Some(self.me.id) {
            return 0; // awaiting collection
        }
        let Some(primary) = holder(0) else { return 0 };
        let scheme = self
            .store
            .note(key)
            .and_then(|b| Note::decode(&b))
            .map(|n| n.head.scheme());
        if k == 0 {
            if let Some(scheme) = scheme {
                return self.scrub_stripe(oid, scheme, pass).await;
            }
        }
        let local = self.check_copy(key, false).await;
        if local.recovering || local.state.is_none_or(|s| s.deleted) {
            return 0;
        }
        pass.objects += 1;
        pass.bytes += local.bytes;
        let why = match (&local.error, local.lost) {
            (Some(e), _) => e.clone(),
            (None, true) => "lost here".to_string(),
            (None, false) => return local.bytes,
        };
        pass.bad += 1;
        let Some(scheme) = scheme else {
            tracing::error!(
                "scrub: object {oid}: strip {k} here is bad ({why}) and its note names no erasure code: it cannot be rebuilt"
            );
            pass.unrecoverable += 1;
            return local.bytes;
        };
        tracing::warn!(
            "scrub: object {oid}: strip {k} here is bad ({why}): asking its primary {} to rebuild it",
            primary.addr
        );
        match self.ec_check_at(&primary, oid, scheme).await {
            Ok(report) => {
                let mine = report
                    .bad
                    .iter()
                    .find(|b| b.strip as usize == k && b.addr == self.me.addr);
                match mine {
                    Some(b) if b.repaired => {
                        pass.repaired += 1;
                        tracing::info!(
                            "scrub: object {oid}: strip {k} here rebuilt from the others by {}",
                            primary.addr
                        );
                    }
                    Some(b) => tracing::warn!(
                        "scrub: object {oid}: strip {k} here not rebuilt by {}: {}",
                        primary.addr,
                        b.repair_error.as_deref().unwrap_or("no repair made")
                    ),
                    None => tracing::warn!(
                        "scrub: object {oid}: {} found strip {k} here good (restored meanwhile?){}",
                        primary.addr,
                        match &report.unrecoverable {
                            Some(u) => format!("; the object cannot be made whole: {u}"),
                            None => String::new(),
                        }
                    ),
                }
            }
            Err(e) => tracing::warn!(
                "scrub: object {oid}: its primary {} did not check strip {k}: {e}",
                primary.addr
            ),
        }
        local.bytes
    }

    /// As primary: the whole stripe of `oid` checked and repaired, counted into `pass`.
    async fn scrub_stripe(
        self: &Arc<Self>,
        oid: ObjectId,
        scheme: Redundancy,
        pass: &mut ScrubPass,
    ) -> u64 {
        let key = oid.strip(0);
        let here = self.check_copy(key, true).await;
        if here.recovering || here.state.is_none_or(|s| s.deleted) {
            return 0;
        }
        let me = self.me.clone();
        let report = match self.ec_check_at(&me, oid, scheme).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!("scrub: object {oid}: not checked: {e}");
                return 0;
            }
        };
        pass.objects += 1;
        pass.bytes += report.bytes;
        pass.bad += report.bad.len() as u64;
        for b in &report.bad {
            if b.repaired {
                pass.repaired += 1;
                tracing::warn!(
                    "scrub: object {oid}: strip {} on {} is bad ({}): rebuilt from the others",
                    b.strip,
                    b.addr,
                    b.problem
                );
            } else {
                tracing::warn!(
                    "scrub: object {oid}: strip {} on {} is bad ({}): not rebuilt: {}",
                    b.strip,
                    b.addr,
                    b.problem,
                    b.repair_error.as_deref().unwrap_or("no repair made")
                );
            }
        }
        if let Some(why) = &report.unrecoverable {
            tracing::error!("scrub: object {oid}: its strips cannot be made whole: {why}");
            pass.unrecoverable += 1;
        }
        report.bytes
    }

    /// `EcCheck` of `oid` with the repair flag as `primary` answers it: run here when this
    /// node is the primary (with the checks the server makes of an `EcCheck`), else sent to it.
    async fn ec_check_at(
        self: &Arc<Self>,
        primary: &NodeInfo,
        oid: ObjectId,
        scheme: Redundancy,
    ) -> Result<EcCheckReport, String> {
        let epoch = self.epoch().view.epoch;
        let mut h = Header::request(Opcode::EcCheck, 0, epoch);
        h.oid = oid.0;
        h.offset = 1; // repair
        h.aux = scheme_aux(scheme);
        if primary.id == self.me.id {
            let _change = self.enter(epoch);
            let (ep, cfg) = io_epoch(self, &h).await.map_err(|f| f.message)?;
            return self
                .ec_check(&ep, &cfg, oid, scheme, true)
                .await
                .map_err(|f| f.message);
        }
        let addr = primary.addr;
        let f = self
            .peer_call_within(addr, h, Bytes::new(), EC_CHECK_TIMEOUT)
            .await
            .map_err(|e| format!("{addr}: {e}"))?;
        if f.header.result_code() != ResultCode::Ok {
            return Err(format!("{addr}: {}", f.message()));
        }
        serde_json::from_slice(&f.payload).map_err(|e| format!("{addr}: bad EcCheck answer: {e}"))
    }
}
