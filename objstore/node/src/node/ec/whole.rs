//! Making a stripe whole: the resolution of a stripe that may be mixed (rule 4 of
//! docs/architecture.md, "Erasure-coded objects") and the rebuild of missing or stale strips
//! from x good ones.

use std::sync::Arc;

use bytes::Bytes;

use super::peer::holders;
use super::primary::Decision;
use super::{EcEvent, StripRead, Stripe};
use crate::node::server::Failure;
use crate::node::{Epoch, Node};
use objstore_proto::ec::resolve::{resolve, Resolution, Strip, StripSet};
use objstore_proto::ec::wire::{self, StripHead, StripOp};
use objstore_proto::frame::ResultCode;
use objstore_proto::version::Version;
use objstore_proto::view::ClusterConfig;

impl Node {
    /// Asks every holder for its strip's state and makes the stripe whole at one version
    /// (see [`objstore_proto::ec::resolve`]).
    pub(super) async fn resolve_stripe(
        self: &Arc<Self>,
        ep: &Epoch,
        cfg: &ClusterConfig,
        stripe: &Stripe,
    ) -> Result<Decision, Failure> {
        let w = stripe.width();
        let waiting = self.stripe_waiting_for(stripe.oid, w, stripe.scheme.default_min() as usize);
        if let Some((nodes, epoch)) = waiting {
            return Err(crate::node::failure::not_recovered(
                stripe.oid,
                crate::node::recovery::PullFailed::Waiting { nodes, epoch },
            ));
        }
        let heads =
            futures::future::join_all((0..w).map(|k| self.strip_read(ep, cfg, stripe, k, 0, 0)))
                .await;
        let mut strips: Vec<Strip> = heads
            .iter()
            .map(|r| match r {
                Ok(r) => r.head.strip(),
                Err(_) => Strip::Missing,
            })
            .collect();
        // A holder that has nothing of its strip says it was never made only if every node
        // that held that strip since the newest change's epoch is a member now (recovery
        // pulled the strip from any that had it): else the strip may be on a node that is
        // gone, and this "nothing" would take the stripe back over acknowledged writes (seed
        // 70588 with crashes: a strip never rebuilt once its holder died left a later holder
        // that "knew" it since a clean epoch). Such a strip counts as missing.
        let newest = (strips.iter().filter_map(Strip::version).max()).unwrap_or_default();
        if newest != Version::NONE {
            for (k, s) in strips.iter_mut().enumerate() {
                let absent = matches!(*s, Strip::At { version, .. } if version == Version::NONE);
                if absent && !self.held_by_members(ep, stripe, k, newest.epoch()).await {
                    *s = Strip::Missing;
                }
            }
        }
        tracing::debug!("object {}: strips {strips:?}", stripe.oid);
        let all = StripSet::first(w);
        match self.with_newer_unsure(stripe, &heads, &strips) {
            Resolution::Whole { version, rebuild } => {
                let mut whole = true;
                if !rebuild.is_empty() && version != Version::NONE {
                    // The stripe is decided: a strip that cannot be rebuilt now (its holder
                    // unreachable) is decoded by reads meanwhile, and the next access tries
                    // again (the stripe is not known whole).
                    let sources = all.minus(rebuild);
                    // The strips rebuilt keep the change that made the version, when a strip
                    // says it (so a later resolution can tell their base).
                    let made = heads
                        .iter()
                        .flatten()
                        .find(|r| r.head.version == version && r.head.flags & wire::FLAG_KNOWN != 0)
                        .map(|r| stripe.head(StripOp::Put, r.head.base, version, r.head.touched));
                    match self
                        .rebuild(ep, cfg, stripe, version, sources, rebuild, made)
                        .await
                    {
                        Ok(()) => self.ec_count(EcEvent::Rebuilt),
                        Err(f) => {
                            whole = false;
                            tracing::warn!(
                                "object {}: strips {rebuild:?} not rebuilt yet: {}",
                                stripe.oid,
                                f.message
                            )
                        }
                    }
                }
                let empty = self.stripe_empty(stripe, &heads, version);
                Ok(Decision {
                    version,
                    empty,
                    whole,
                })
            }
            Resolution::Forward {
                version,
                sources,
                rebuild,
                relabel,
                home,
            } => {
                let t = heads
                    .iter()
                    .flatten()
                    .find(|r| r.head.version == version && r.head.flags & wire::FLAG_KNOWN != 0)
                    .map(|r| r.head)
                    .expect("a strip at the version says its change");
                tracing::info!(
                    "object {}: a change left it mixed; going forward to {version:?}",
                    stripe.oid
                );
                self.ec_count(EcEvent::Forward);
                // Strips at an undone sibling change return to the base first.
                let homes = home.iter().filter_map(|k| {
                    let r = heads[k].as_ref().ok()?;
                    let head = stripe.head(StripOp::Back, t.base, r.head.version, StripSet::default());
                    Some(self.strip_call(ep, cfg, stripe, k, head, 0, Bytes::new()))
                });
                for r in futures::future::join_all(homes).await {
                    r?;
                }
                let bumps = relabel.iter().map(|k| {
                    let head = stripe.head(StripOp::Bump, t.base, version, t.touched);
                    self.strip_call(ep, cfg, stripe, k, head, 0, Bytes::new())
                });
                for r in futures::future::join_all(bumps).await {
                    r?;
                }
                let head = stripe.head(StripOp::Put, t.base, version, t.touched);
                self.rebuild(ep, cfg, stripe, version, sources, rebuild, Some(head))
                    .await?;
                let empty = self.stripe_empty(stripe, &heads, version);
                Ok(Decision {
                    version,
                    empty,
                    whole: true,
                })
            }
            Resolution::Back { version, sources, .. } => {
                tracing::info!(
                    "object {}: a change left it mixed and too few strips hold it; going back to {version:?}",
                    stripe.oid
                );
                self.ec_count(EcEvent::Back);
                // 1. Every strip valid at the base returns to it: those the change touched from
                //    what they kept, those it left alone by their number. One that cannot is
                //    rebuilt instead.
                let mut at_base = self.strips_at(&heads, version);
                for k in sources.minus(at_base).iter() {
                    let Ok(r) = &heads[k] else { continue };
                    let head = stripe.head(StripOp::Back, version, r.head.version, StripSet::default());
                    if self
                        .strip_call(ep, cfg, stripe, k, head, 0, Bytes::new())
                        .await
                        .is_ok()
                    {
                        at_base.insert(k);
                    }
                }
                // 2. The others rebuilt at the base from those.
                let rebuilt = self
                    .rebuild(ep, cfg, stripe, version, at_base, all.minus(at_base), None)
                    .await;
                // 3. Every strip moved to a new version, no byte changed, so that a strip left at
                //    the undone version on a holder that was away never brings it back. Done
                //    even when a strip could not be rebuilt: else the undone version stays the
                //    newest, and recovery may bring it back from a holder that kept it (seed
                //    60031 with crashes). A strip not at the base refuses the bump; the stripe
                //    stands at the new version once x strips took it.
                let newest = heads.iter().flatten().map(|r| r.head.version).max();
                let again = (self.version_floor(stripe.oid, newest.unwrap_or_default()))
                    .next(ep.view.epoch);
                self.raise_floor(stripe.oid, again);
                let bumps = stripe.held().iter().map(|k| {
                    let head = stripe.head(StripOp::Bump, version, again, StripSet::default());
                    self.strip_call(ep, cfg, stripe, k, head, 0, Bytes::new())
                });
                let bumped = futures::future::join_all(bumps).await;
                let took = bumped.iter().filter(|r| r.is_ok()).count();
                let failed = bumped.into_iter().find_map(Result::err);
                if took < stripe.codec.data() {
                    return Err(failed.or(rebuilt.err()).unwrap_or_else(|| {
                        Failure::new(ResultCode::Busy, format!("object {}: too few strips took {again:?}", stripe.oid))
                    }));
                }
                let whole = failed.is_none() && rebuilt.is_ok();
                if whole {
                    self.issued.lock().unwrap().remove(&stripe.oid);
                }
                let empty = self.stripe_empty(stripe, &heads, version);
                Ok(Decision {
                    version: again,
                    empty,
                    whole,
                })
            }
            Resolution::Undecided { valid, need } => Err(Failure::new(
                ResultCode::Busy,
                format!(
                    "object {} has {valid} of the {need} strips it needs at one version: waiting for its holders ({})",
                    stripe.oid,
                    holders(stripe)
                ),
            )),
            Resolution::Inconsistent(why) => Err(Failure::new(
                ResultCode::Io,
                format!("object {}: {why}", stripe.oid),
            )),
        }
    }

    /// The resolution of `strips`, taking into account a strip its holder was unsure of
    /// (`FLAG_UNSURE`, read as missing: it may be older than a version on a node not listed)
    /// when it is *newer* than the version the others decide on. Such a strip proves the
    /// stripe went past that version (a change, or the new version of a stripe gone back,
    /// reached it), and no strip can be put back to an older version than it holds: deciding
    /// without it would make the stripe "whole" at a version that strip refuses, and the next
    /// change would start from the wrong base (seed 99 with crashes, SIM_EC=2:1 and
    /// SIM_EC_VDIS=1: the stripe went back to v5.1 and took v15.1 on strip 0 only; once that
    /// strip was unsure, v11.1, the change undone, came forward again from a holder that had
    /// been away, and strip 0 stayed at v15.1 for good). A decision to go back is no
    /// exception (seed 1491 with crashes, SIM_EC=2:2 and SIM_EC_VDIS=1: the primary's own
    /// strip 0, unsure at v43.3, was left out and the others went back to v43.1, which strip
    /// 0's undo cannot reach; going back rewrote strip 2's note, and the stripe was
    /// undecided for good). Counted in, it can only move the decision to a newer version,
    /// never back over one the others vouch for; if the stripe is then undecided it waits.
    fn with_newer_unsure(
        &self,
        stripe: &Stripe,
        heads: &[Result<StripRead, Failure>],
        strips: &[Strip],
    ) -> Resolution {
        let x = stripe.codec.data();
        let first = resolve(x, strips);
        let decided = match first {
            Resolution::Whole { version, .. }
            | Resolution::Forward { version, .. }
            | Resolution::Back { version, .. } => version,
            _ => return first,
        };
        let mut with = strips.to_vec();
        let mut newer = StripSet::default();
        for (k, r) in heads.iter().enumerate() {
            let Ok(r) = r else { continue };
            if r.head.flags & wire::FLAG_UNSURE != 0 && r.head.version > decided {
                with[k] = StripHead {
                    flags: r.head.flags & !wire::FLAG_UNSURE,
                    ..r.head
                }
                .strip();
                newer.insert(k);
            }
        }
        if newer.is_empty() {
            return first;
        }
        let again = resolve(x, &with);
        tracing::info!(
            "object {}: strips {newer:?} are newer than {decided:?}, which the others decide on (their holders are unsure no newer version is elsewhere): counted in, {again:?}",
            stripe.oid
        );
        match again {
            Resolution::Whole { .. } | Resolution::Forward { .. } | Resolution::Back { .. } => {
                again
            }
            _ => Resolution::Undecided { valid: 0, need: x },
        }
    }

    /// Whether every node that held strip `k` of the stripe in an epoch from `from` to now is a
    /// member of `ep` (views read from the cluster store; an epoch whose view is gone counts
    /// as held by a node that is gone).
    async fn held_by_members(
        self: &Arc<Self>,
        ep: &Epoch,
        stripe: &Stripe,
        k: usize,
        from: u32,
    ) -> bool {
        let members: std::collections::HashSet<u64> = ep.view.nodes.iter().map(|n| n.id).collect();
        let (oid, cur, driver) = (stripe.oid, ep.view.epoch, self.driver.clone());
        let held = self
            .blocking(move || {
                (from.max(1)..cur).all(|e| match driver.view_at(e) {
                    Ok(Some(view)) => {
                        let ring = objstore_proto::placement::Ring::new(&view.nodes);
                        (ring.strip_holder(oid, k))
                            .is_none_or(|i| members.contains(&ring.nodes()[i].id))
                    }
                    _ => false,
                })
            })
            .await;
        held.unwrap_or(false)
    }

    /// Whether the stripe at `version` holds nothing (never written, or removed): what the
    /// strips at that version say (tombstones), not whether this node's strip 0 is here: a
    /// primary whose strip 0 is missing or not rebuilt yet must not read zeros for data that
    /// exists (seed 70588 with crashes).
    fn stripe_empty(
        &self,
        stripe: &Stripe,
        heads: &[Result<StripRead, Failure>],
        version: Version,
    ) -> bool {
        if version == Version::NONE {
            return true;
        }
        let mut at = (heads.iter().flatten())
            .filter(|r| r.head.version == version)
            .peekable();
        if at.peek().is_none() {
            return self.store.meta(stripe.key(0)).is_none_or(|s| s.deleted);
        }
        at.all(|r| r.head.flags & wire::FLAG_DELETED != 0)
    }

    /// The strips whose holder answered at `version`.
    fn strips_at(&self, heads: &[Result<StripRead, Failure>], version: Version) -> StripSet {
        let mut s = StripSet::default();
        for (k, r) in heads.iter().enumerate() {
            if r.as_ref().is_ok_and(|r| r.head.version == version) {
                s.insert(k);
            }
        }
        s
    }

    /// Decodes the strips of `rebuild` at `version` from `sources` (whole strips) and installs
    /// them on their holders (`head` or a bare `Put`).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn rebuild(
        self: &Arc<Self>,
        ep: &Epoch,
        cfg: &ClusterConfig,
        stripe: &Stripe,
        version: Version,
        sources: StripSet,
        rebuild: StripSet,
        head: Option<StripHead>,
    ) -> Result<(), Failure> {
        self.rebuild_replacing(
            ep,
            cfg,
            stripe,
            version,
            sources,
            rebuild,
            head,
            StripSet::default(),
        )
        .await
    }

    /// [`Node::rebuild`], the copies of `replace` (which read back but are wrong) replaced
    /// though they are at `version` ([`wire::PUT_REPLACES`]).
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn rebuild_replacing(
        self: &Arc<Self>,
        ep: &Epoch,
        cfg: &ClusterConfig,
        stripe: &Stripe,
        version: Version,
        sources: StripSet,
        rebuild: StripSet,
        head: Option<StripHead>,
        replace: StripSet,
    ) -> Result<(), Failure> {
        // A strip with no holder (fewer nodes than strips) is rebuilt once one joins.
        let rebuild = rebuild.and(stripe.held());
        if rebuild.is_empty() {
            return Ok(());
        }
        let len = stripe.codec.strip_len();
        let reads = (0..stripe.width()).map(|k| async move {
            if !sources.contains(k) {
                return None;
            }
            let r = self.strip_read(ep, cfg, stripe, k, 0, len).await.ok()?;
            (r.head.version == version)
                .then(|| (r.bytes.to_vec(), r.head.flags & wire::FLAG_DELETED != 0))
        });
        let read: Vec<Option<(Vec<u8>, bool)>> = futures::future::join_all(reads).await;
        // Rebuilt from tombstones (a removed object): tombstones again.
        let deleted = read.iter().flatten().count() > 0 && read.iter().flatten().all(|r| r.1);
        let mut strips: Vec<Option<Vec<u8>>> = read.into_iter().map(|r| r.map(|r| r.0)).collect();
        stripe.codec.reconstruct(&mut strips).map_err(|e| {
            Failure::new(
                ResultCode::Busy,
                format!("object {} cannot be rebuilt: {e}", stripe.oid),
            )
        })?;
        let mut head = head.unwrap_or_else(|| {
            stripe.head(StripOp::Put, Version::NONE, version, StripSet::default())
        });
        if deleted {
            head.flags |= wire::FLAG_DELETED;
        }
        let puts = rebuild.iter().map(|k| {
            let bytes = Bytes::from(strips[k].clone().expect("reconstructed"));
            let aux = if replace.contains(k) {
                wire::PUT_REPLACES
            } else {
                0
            };
            self.strip_call_as(ep, cfg, stripe, k, head, 0, bytes, aux)
        });
        for r in futures::future::join_all(puts).await {
            r?;
        }
        Ok(())
    }
}
