//! `EcCheck`: an erasure-coded object's strips read back whole by its primary, judged, and
//! repaired (`dog vdi check`, `dog cluster check`). A strip is bad when its holder cannot read
//! it (a block fails its checksum, an I/O error), when it is missing or at another version
//! than the stripe, or when every checksum is good but its bytes disagree with the other
//! strips (the one strip whose removal leaves the rest consistent). Repairs rebuild bad strips
//! from x good ones (a `PeerStrip` of op `Put`, which replaces a bad copy of the same version).
//! Parity that does not match with no one strip to blame (x:1 cannot locate a wrong strip, and
//! two wrong strips fit no single one) is reported unrecoverable and nothing is rebuilt, as
//! copies that differ without a majority are.

use std::sync::Arc;

use super::{StripRead, Stripe};
use crate::node::server::Failure;
use crate::node::{Epoch, Node};
use objstore_proto::api::{BadStrip, EcCheckReport};
use objstore_proto::ec::resolve::{resolve, Resolution, Strip, StripSet};
use objstore_proto::ec::Codec;
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
        let _ordered = self.ec_lock(oid).write().await;
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
        // The bad strips, and why; those of `replace` read back well but are wrong.
        let mut bad: Vec<(usize, String)> = Vec::new();
        let mut replace = StripSet::default();
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
            let strips: Option<Vec<&[u8]>> = first
                .iter()
                .map(|r| r.as_ref().ok().map(|r| &r.bytes[..]))
                .collect();
            match strips.map(|s| parity_check(&stripe.codec, &s)) {
                Some(Parity::Odd(k)) => {
                    bad.push((k, "its bytes disagree with the other strips".into()));
                    replace.insert(k);
                }
                Some(Parity::Unlocated(why)) => {
                    report.version = Some(version);
                    report.unrecoverable = Some(why);
                    return Ok(report);
                }
                Some(Parity::Matches) | None => {}
            }
        }
        report.version = Some(version);
        let repaired = if repair && !bad.is_empty() {
            Some(
                self.repair_strips(ep, cfg, &stripe, mixed, version, &bad, replace)
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
    /// instead, which rebuilds what it must); the copies of `replace` are replaced though
    /// they are at `version` and read back.
    #[allow(clippy::too_many_arguments)]
    async fn repair_strips(
        self: &Arc<Self>,
        ep: &Epoch,
        cfg: &ClusterConfig,
        stripe: &Stripe,
        mixed: bool,
        version: Version,
        bad: &[(usize, String)],
        replace: StripSet,
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
        self.rebuild_replacing(ep, cfg, stripe, version, sources, rebuild, None, replace)
            .await
            .map_err(|f| f.message)?;
        self.ec_count(super::EcEvent::Rebuilt);
        Ok(())
    }
}

/// What the parity of a stripe whose strips all read back at one version says.
#[derive(Debug, PartialEq, Eq)]
enum Parity {
    /// It matches the data.
    Matches,
    /// It does not, and strip k is the one whose bytes disagree: the others decode to a
    /// stripe that differs from it only.
    Odd(usize),
    /// It does not, and no one strip explains it (or with one parity strip, any could):
    /// nothing can tell which bytes are right, so nothing may be rebuilt.
    Unlocated(String),
}

/// Judges `strips` (every strip of one stripe, whole, at one version) by their parity. One
/// wrong strip is located only with two parity strips or more: with y = 1 the x strips other
/// than any one decode to a stripe that agrees with the rest, the wrong one included, so
/// taking the first that fits would rebuild a good strip from a bad one.
fn parity_check(codec: &Codec, strips: &[&[u8]]) -> Parity {
    let x = codec.data();
    let Ok(parity) = codec.parity_of(&strips[..x]) else {
        return Parity::Matches; // not the codec's shape: the reads already failed
    };
    if parity.iter().zip(&strips[x..]).all(|(p, s)| &p[..] == *s) {
        return Parity::Matches;
    }
    if codec.parity() < 2 {
        return Parity::Unlocated(format!(
            "parity does not match the data, and with {} parity strip nothing tells which strip is wrong",
            codec.parity()
        ));
    }
    let fits: Vec<usize> = (0..strips.len())
        .filter(|&j| {
            // Decode from x strips other than j; the rest must agree with the result.
            let mut some: Vec<Option<Vec<u8>>> = vec![None; strips.len()];
            for k in (0..strips.len()).filter(|&k| k != j).take(x) {
                some[k] = Some(strips[k].to_vec());
            }
            codec.reconstruct(&mut some).is_ok()
                && (0..strips.len())
                    .filter(|&k| k != j)
                    .all(|k| some[k].as_deref() == Some(strips[k]))
        })
        .collect();
    match fits[..] {
        [k] => Parity::Odd(k),
        _ => Parity::Unlocated(
            "parity does not match the data, and no one strip explains it (more than one is wrong)"
                .into(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stripe_of(codec: &Codec, seed: u8) -> Vec<Vec<u8>> {
        let object: Vec<u8> = (0..codec.strip_len() * codec.data())
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect();
        codec.encode(&object)
    }

    fn judge(strips: &[Vec<u8>], codec: &Codec) -> Parity {
        let s: Vec<&[u8]> = strips.iter().map(|s| &s[..]).collect();
        parity_check(codec, &s)
    }

    #[test]
    fn one_wrong_strip_is_located_with_two_parity_strips() {
        let codec = Codec::new(Redundancy::Ec { data: 4, parity: 2 }, 64 << 10).unwrap();
        let good = stripe_of(&codec, 1);
        assert_eq!(judge(&good, &codec), Parity::Matches);
        for k in 0..6 {
            let mut s = good.clone();
            s[k][100] ^= 0x5a;
            assert_eq!(judge(&s, &codec), Parity::Odd(k), "strip {k}");
        }
        let mut two = good.clone();
        two[1][7] ^= 1;
        two[4][9] ^= 1;
        assert!(matches!(judge(&two, &codec), Parity::Unlocated(_)));
    }

    /// x:1 finds a mismatch but cannot say where: never "strip 0" (which a repair would then
    /// rebuild from the bad strip).
    #[test]
    fn one_parity_strip_finds_a_mismatch_but_never_names_a_strip() {
        let codec = Codec::new(Redundancy::Ec { data: 2, parity: 1 }, 64 << 10).unwrap();
        let good = stripe_of(&codec, 2);
        assert_eq!(judge(&good, &codec), Parity::Matches);
        for k in 0..3 {
            let mut s = good.clone();
            s[k][3] ^= 0x80;
            match judge(&s, &codec) {
                Parity::Unlocated(why) => assert!(why.contains("1 parity strip"), "{why}"),
                other => panic!("strip {k} changed: {other:?}"),
            }
        }
    }
}
