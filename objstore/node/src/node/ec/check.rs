//! `EcCheck`: an erasure-coded object's strips read back whole by its primary, judged, and
//! repaired (`dog vdi check`, `dog cluster check`). A strip is bad when its holder cannot read
//! it (a block fails its checksum, an I/O error), when it is missing or at another version
//! than the stripe, or when every checksum is good but its bytes disagree with the other
//! strips (the one strip whose removal leaves the rest consistent). Repairs rebuild bad strips
//! from x good ones (a `PeerStrip` of op `Put`, which replaces a bad copy of the same version).

use std::sync::Arc;

use super::{StripRead, Stripe};
use crate::node::server::Failure;
use crate::node::{Epoch, Node};
use objstore_proto::api::{BadStrip, EcCheckReport};
use objstore_proto::ec::resolve::{resolve, Resolution, Strip, StripSet};
use objstore_proto::oid::ObjectId;
use objstore_proto::redundancy::Redundancy;
use objstore_proto::version::Version;
use objstore_proto::view::ClusterConfig;

impl Node {
    /// `EcCheck` of `oid` as its primary: its strips judged, and with `repair` the bad ones
    /// rebuilt (a stripe a change left mixed is resolved first).
    pub(in crate::node) async fn ec_check(
        self: &Arc<Self>,
        ep: &Epoch,
        cfg: &ClusterConfig,
        oid: ObjectId,
        scheme: Redundancy,
        repair: bool,
    ) -> Result<EcCheckReport, Failure> {
        let stripe = self.ec_stripe(ep, cfg, oid, scheme)?;
        let _ordered = self.obj_lock(oid).lock().await;
        let first = self.read_whole_stripe(ep, cfg, &stripe).await;
        let mut report = EcCheckReport {
            strips: first.iter().filter(|r| r.is_ok()).count() as u64,
            bytes: first.iter().flatten().map(|r| r.bytes.len() as u64).sum(),
            ..Default::default()
        };
        let strips: Vec<Strip> = first
            .iter()
            .map(|r| r.as_ref().map_or(Strip::Missing, |r| r.head.strip()))
            .collect();
        let (version, mixed) = match resolve(stripe.codec.data(), &strips) {
            Resolution::Whole { version, .. } => (version, false),
            Resolution::Forward { version, .. } | Resolution::Back { version, .. } => {
                (version, true)
            }
            Resolution::Undecided { valid, need } => {
                report.unrecoverable = Some(format!(
                    "{valid} of the {need} strips needed at one version"
                ));
                return Ok(report);
            }
            Resolution::Inconsistent(why) => {
                report.unrecoverable = Some(why);
                return Ok(report);
            }
        };
        if version == Version::NONE {
            return Ok(report);
        }
        // The bad strips, and why.
        let mut bad: Vec<(usize, String)> = Vec::new();
        for (k, r) in first.iter().enumerate() {
            match r {
                Err(f) => bad.push((k, f.message.clone())),
                Ok(r) if mixed || r.head.version != version => bad.push((
                    k,
                    format!(
                        "at {:?}, the stripe at {version:?}{}",
                        r.head.version,
                        if mixed {
                            " (a change left it mixed)"
                        } else {
                            ""
                        }
                    ),
                )),
                Ok(_) => {}
            }
        }
        if bad.is_empty() {
            if let Some(k) = odd_one_out(&stripe, &first) {
                bad.push((k, "its bytes disagree with the other strips".into()));
            }
        }
        report.version = Some(version);
        let repaired = if repair && !bad.is_empty() {
            Some(
                self.repair_strips(ep, cfg, &stripe, mixed, version, &bad)
                    .await,
            )
        } else {
            None
        };
        for (k, problem) in bad {
            let (repaired, repair_error) = match &repaired {
                Some(Ok(())) => (true, None),
                Some(Err(e)) => (false, Some(e.clone())),
                None => (false, None),
            };
            report.bad.push(BadStrip {
                strip: k as u32,
                addr: stripe.holders[k].as_ref().map_or(self.me.addr, |n| n.addr),
                problem,
                repaired,
                repair_error,
            });
        }
        Ok(report)
    }

    /// Every strip of `stripe`, whole, from its holder.
    async fn read_whole_stripe(
        self: &Arc<Self>,
        ep: &Epoch,
        cfg: &ClusterConfig,
        stripe: &Stripe,
    ) -> Vec<Result<StripRead, Failure>> {
        let len = stripe.codec.strip_len();
        futures::future::join_all(
            (0..stripe.width()).map(|k| self.strip_read(ep, cfg, stripe, k, 0, len)),
        )
        .await
    }

    /// Rebuilds the strips of `bad` at `version` from the others (a mixed stripe is resolved
    /// instead, which rebuilds what it must).
    async fn repair_strips(
        self: &Arc<Self>,
        ep: &Epoch,
        cfg: &ClusterConfig,
        stripe: &Stripe,
        mixed: bool,
        version: Version,
        bad: &[(usize, String)],
    ) -> Result<(), String> {
        if mixed {
            self.ec_known.remove(stripe.oid);
            return self
                .resolve_stripe(ep, cfg, stripe)
                .await
                .map(|d| {
                    if d.whole {
                        self.ec_known.insert(ep.view.epoch, stripe.oid)
                    }
                })
                .map_err(|f| f.message);
        }
        let mut rebuild = StripSet::default();
        for (k, _) in bad {
            rebuild.insert(*k);
        }
        let sources = StripSet::first(stripe.width()).minus(rebuild);
        self.rebuild(ep, cfg, stripe, version, sources, rebuild, None)
            .await
            .map_err(|f| f.message)?;
        self.ec_count(super::EcEvent::Rebuilt);
        Ok(())
    }
}

/// With every strip read back at one version: the one strip whose bytes disagree with the
/// others (the others decode to a stripe that differs from it only), if parity does not match.
fn odd_one_out(stripe: &Stripe, reads: &[Result<StripRead, Failure>]) -> Option<usize> {
    let strips: Vec<&[u8]> = reads
        .iter()
        .map(|r| r.as_ref().ok().map(|r| &r.bytes[..]))
        .collect::<Option<_>>()?;
    let x = stripe.codec.data();
    let parity = stripe.codec.parity_of(&strips[..x]).ok()?;
    if parity.iter().zip(&strips[x..]).all(|(p, s)| &p[..] == *s) {
        return None;
    }
    (0..strips.len()).find(|&j| {
        // Decode from x strips other than j; the rest must agree with the result.
        let mut some: Vec<Option<Vec<u8>>> = vec![None; strips.len()];
        for k in (0..strips.len()).filter(|&k| k != j).take(x) {
            some[k] = Some(strips[k].to_vec());
        }
        stripe.codec.reconstruct(&mut some).is_ok()
            && (0..strips.len())
                .filter(|&k| k != j)
                .all(|k| some[k].as_deref() == Some(strips[k]))
    })
}
