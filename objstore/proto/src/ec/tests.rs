use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::resolve::{resolve, Resolution, Strip, StripSet};
use super::*;
use crate::version::Version;

fn codec(data: u8, parity: u8, object_size: u64) -> Codec {
    Codec::new(Redundancy::Ec { data, parity }, object_size).unwrap()
}

fn random(rng: &mut StdRng, n: usize) -> Vec<u8> {
    (0..n).map(|_| rng.gen()).collect()
}

#[test]
fn strips_are_whole_columns_that_cover_the_object() {
    assert_eq!(codec(4, 2, 4 << 20).strip_len(), 1 << 20);
    assert_eq!(codec(2, 1, 1 << 20).strip_len(), 512 << 10);
    // 1 MiB / 3 = 349,525.3: rounded up to whole columns.
    let c = codec(3, 2, 1 << 20);
    assert_eq!(c.strip_len(), 349_568);
    assert!(c.strip_len() * 3 >= 1 << 20 && c.strip_len().is_multiple_of(COLUMN));
    assert_eq!(codec(16, 8, 1 << 20).strip_len(), 65_536);
    assert!(Codec::new(Redundancy::Copies(3), 1 << 20)
        .unwrap_err()
        .contains("not an erasure code"));
    assert!(Codec::new(Redundancy::Ec { data: 1, parity: 1 }, 1 << 20).is_err());
}

#[test]
fn a_range_is_cut_at_strip_boundaries() {
    let c = codec(3, 1, 1 << 20);
    let l = c.strip_len();
    let p = c.locate(l - 10, 30);
    assert_eq!(
        p,
        vec![
            Piece {
                strip: 0,
                strip_offset: l - 10,
                at: 0,
                len: 10
            },
            Piece {
                strip: 1,
                strip_offset: 0,
                at: 10,
                len: 20
            },
        ]
    );
    // The padding past the object's end is never a piece.
    let all = c.locate(0, 1 << 20);
    assert_eq!(all.iter().map(|p| p.len).sum::<usize>(), 1 << 20);
    assert_eq!(all.len(), 3);
    assert!(c.locate(1 << 20, 4096).is_empty());
    assert_eq!(c.columns(70, 10), 64..128);
    assert_eq!(c.columns(l - 1, 1), l - 64..l);
}

#[test]
fn fewer_than_x_strips_are_named_and_change_nothing() {
    let c = codec(4, 2, 1 << 20);
    let mut rng = StdRng::seed_from_u64(1);
    let strips = c.encode(&random(&mut rng, 1 << 20));
    let mut some: Vec<Option<Vec<u8>>> = strips.into_iter().map(Some).collect();
    for k in [0, 2, 5] {
        some[k] = None;
    }
    let before = some.clone();
    let e = c.reconstruct(&mut some).unwrap_err();
    assert_eq!(e, EcError::TooFew { have: 3, need: 4 });
    assert_eq!(
        e.to_string(),
        "only 3 of the 4 strips needed to decode are available"
    );
    assert_eq!(some, before);
    let mut bad = vec![Some(vec![0u8; 64]); 6];
    bad[1] = Some(vec![0u8; 128]);
    assert!(matches!(c.reconstruct(&mut bad), Err(EcError::Shape(_))));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Any x of the x + y strips give back the object and the other strips, bit for bit.
    #[test]
    fn any_x_strips_give_back_the_others(
        data in 2u8..=8, parity in 1u8..=4, seed: u64, len_frac in 0.0f64..=1.0,
    ) {
        let size = 64 * 1024;
        let c = codec(data, parity, size as u64);
        let mut rng = StdRng::seed_from_u64(seed);
        let object = random(&mut rng, (size as f64 * len_frac) as usize);
        let strips = c.encode(&object);
        prop_assert_eq!(strips.len(), c.strips());
        let mut padded = object.clone();
        padded.resize(size, 0);
        prop_assert_eq!(c.join(&strips[..data as usize]), padded.clone());
        let mut lost: Vec<usize> = (0..c.strips()).collect();
        for i in (1..lost.len()).rev() {
            lost.swap(i, rng.gen_range(0..=i));
        }
        let mut some: Vec<Option<Vec<u8>>> = strips.iter().cloned().map(Some).collect();
        for &k in &lost[..parity as usize] {
            some[k] = None;
        }
        c.reconstruct(&mut some).unwrap();
        let back: Vec<Vec<u8>> = some.into_iter().map(Option::unwrap).collect();
        prop_assert_eq!(&back, &strips);
        prop_assert_eq!(c.join(&back[..data as usize]), padded);
    }

    /// Parity of a range of columns is that range of the parity, and a change of one data
    /// strip changes parity by the delta's parity: what a partial write relies on.
    #[test]
    fn parity_is_column_local_and_linear(
        data in 2u8..=6, parity in 1u8..=3, seed: u64, at in 0usize..4096, len in 1usize..3000,
    ) {
        let c = codec(data, parity, 16 * 4096);
        let mut rng = StdRng::seed_from_u64(seed);
        let old = random(&mut rng, 16 * 4096);
        let strips = c.encode(&old);
        let k = rng.gen_range(0..data as usize);
        let at = at.min(c.strip_len() - 1);
        let len = len.min(c.strip_len() - at);
        let cols = c.columns(at, len);
        let sub: Vec<&[u8]> = strips[..data as usize].iter().map(|s| &s[cols.clone()]).collect();
        let sub_parity = c.parity_of(&sub).unwrap();
        for j in 0..parity as usize {
            prop_assert_eq!(&sub_parity[j][..], &strips[data as usize + j][cols.clone()]);
        }
        let mut new_strip = strips[k].clone();
        let fresh = random(&mut rng, len);
        new_strip[at..at + len].copy_from_slice(&fresh);
        let delta = c.parity_delta(k, &strips[k][cols.clone()], &new_strip[cols.clone()]).unwrap();
        let mut new_data: Vec<Vec<u8>> = strips[..data as usize].to_vec();
        new_data[k] = new_strip;
        let full = c.parity_of(&new_data).unwrap();
        for j in 0..parity as usize {
            let mut p = strips[data as usize + j].clone();
            xor_into(&mut p[cols.clone()], &delta[j]);
            prop_assert_eq!(&p, &full[j]);
        }
    }
}

// ---- resolution ----

const V1: Version = Version(1 << 32 | 1);
const V2: Version = Version(1 << 32 | 2);
const V3: Version = Version(2 << 32 | 1);
/// A sibling of V3 in the crash model: a change on V2 that was undone.
const VS: Version = Version(1 << 32 | 3);

fn at(version: Version, base: Version, touched: &[usize], back: bool) -> Strip {
    let mut t = StripSet::default();
    for &k in touched {
        t.insert(k);
    }
    Strip::At {
        version,
        change: Some((base, t)),
        back,
    }
}

fn set(ks: &[usize]) -> StripSet {
    let mut s = StripSet::default();
    for &k in ks {
        s.insert(k);
    }
    s
}

#[test]
fn the_write_hole_of_a_degraded_stripe_goes_back() {
    // 4:2, a write of data strips 0 and 1 (and both parities) on a stripe whose strip 2 is
    // missing, cut short: 0 and 4 took it, 1 and 5 did not. In-place updates alone would leave
    // 3 strips valid at either version; with what strips 0 and 4 kept, the stripe goes back.
    let t = [0, 1, 4, 5];
    let s = [
        at(V2, V1, &t, true),
        at(V1, V0, &[], false),
        Strip::Missing,
        at(V1, V0, &[], false),
        at(V2, V1, &t, true),
        at(V1, V0, &[], false),
    ];
    assert_eq!(
        resolve(4, &s),
        Resolution::Back {
            version: V1,
            sources: set(&[0, 1, 3, 4, 5]),
            roll_back: set(&[0, 4]),
        }
    );
    let mut lost_undo = s;
    lost_undo[0] = at(V2, V1, &t, false);
    lost_undo[4] = at(V2, V1, &t, false);
    assert_eq!(
        resolve(4, &lost_undo),
        Resolution::Undecided { valid: 3, need: 4 }
    );
}

const V0: Version = Version(0);

/// A change undone (going back) while a holder was away leaves a sibling: a strip at a version
/// made on the same base as the newest. The state of simulator seed 60178 (2:1, with crashes):
/// a write touching strips 0 and 2 went back to V1, the stripe moved to V3 with no byte changed
/// (strip 0 took it), and strips 1 and 2 came back from holders that still had the write.
/// Strip 1 (untouched by it) and strip 2 (by its undo) return to V1 and count at V3.
#[test]
fn strips_of_an_undone_sibling_change_return_to_the_base() {
    let s = [
        at(V3, V1, &[], true),
        at(V2, V1, &[0, 2], false),
        at(V2, V1, &[0, 2], true),
    ];
    assert_eq!(
        resolve(2, &s),
        Resolution::Forward {
            version: V3,
            sources: set(&[0, 1, 2]),
            rebuild: set(&[]),
            relabel: set(&[1, 2]),
            home: set(&[1, 2]),
        }
    );
    // Strip 2 kept nothing to undo the write with: rebuilt; strip 1 still counts.
    let s = [
        at(V3, V1, &[], true),
        at(V2, V1, &[0, 2], false),
        at(V2, V1, &[0, 2], false),
    ];
    assert_eq!(
        resolve(2, &s),
        Resolution::Forward {
            version: V3,
            sources: set(&[0, 1]),
            rebuild: set(&[2]),
            relabel: set(&[1]),
            home: set(&[1]),
        }
    );
}

#[test]
fn untouched_strips_count_for_the_change_and_stale_ones_for_nothing() {
    // 2:1, a write of data strip 0 reached strip 0 only; strip 1 (untouched) at the base
    // counts for it: forward, parity rebuilt.
    let s = [
        at(V2, V1, &[0, 2], true),
        at(V1, V0, &[0, 1, 2], true),
        at(V1, V0, &[0, 1, 2], true),
    ];
    assert_eq!(
        resolve(2, &s),
        Resolution::Forward {
            version: V2,
            sources: set(&[0, 1]),
            rebuild: set(&[2]),
            relabel: set(&[1]),
            home: set(&[]),
        }
    );
    // A strip two changes behind (its holder was away) is rebuilt, never a source.
    let s = [
        at(V3, V2, &[0, 2], true),
        at(V1, V0, &[], false),
        at(V3, V2, &[0, 2], true),
    ];
    assert_eq!(
        resolve(2, &s),
        Resolution::Whole {
            version: V3,
            rebuild: set(&[1]),
        }
    );
    // A new object: the untouched strip's holder has nothing, which is its zeros.
    let s = [
        at(V1, V0, &[0, 2], true),
        Strip::At {
            version: V0,
            change: None,
            back: false,
        },
        Strip::Missing,
    ];
    assert!(matches!(
        resolve(2, &s),
        Resolution::Forward { version: V1, .. }
    ));
    assert_eq!(
        resolve(2, &[Strip::Missing, Strip::Missing, at(V1, V0, &[0], true)]),
        Resolution::Undecided { valid: 1, need: 2 }
    );
    let two = [
        at(V2, V1, &[0], true),
        at(V2, V0, &[1], true),
        Strip::Missing,
    ];
    assert!(matches!(resolve(2, &two), Resolution::Inconsistent(_)));
}

/// The stripes a crash can leave: a stripe written whole at V1 (object A), a change to V2
/// (object B) that some holders missed (they were away: their strips stay at V1), then a change
/// to V3 (object C) cut short, reaching a random subset of the strips at V2, some holders
/// having lost what they kept, and random strips missing. Whatever `resolve` decides decodes,
/// from the strips it names, to exactly A, B or C of the version it names: never a mix.
fn crash_case(seed: u64) -> Result<(), TestCaseError> {
    let mut rng = StdRng::seed_from_u64(seed);
    let data = rng.gen_range(2u8..=5);
    let parity = rng.gen_range(1u8..=3);
    let c = codec(data, parity, data as u64 * 256);
    let n = c.strips();
    let size = data as usize * 256;
    let write = |rng: &mut StdRng, from: &[u8]| -> (Vec<u8>, StripSet) {
        let at = rng.gen_range(0..size);
        let len = rng.gen_range(1..=(size - at).min(300));
        let mut to = from.to_vec();
        for b in &mut to[at..at + len] {
            *b = rng.gen();
        }
        let mut t = StripSet::default();
        for p in c.locate(at, len) {
            t.insert(p.strip);
        }
        for j in data as usize..n {
            t.insert(j);
        }
        (to, t)
    };
    let a = random(&mut rng, size);
    let (b, t2) = write(&mut rng, &a);
    // A change on V2 to VS, undone (the stripe went back to V2) while some holders were away:
    // they still hold it (siblings of the change to V3).
    let (sib, ts) = write(&mut rng, &b);
    let (cc, t3) = write(&mut rng, &b);
    let (ea, eb, ec) = (c.encode(&a), c.encode(&b), c.encode(&cc));
    let es = c.encode(&sib);
    let mut strips = Vec::new();
    let mut bytes = Vec::new();
    let mut rolled = Vec::new();
    let mut all_took = true;
    // Strips that took V3, missing or not: a change is acknowledged only once `min` took it.
    let mut took_v3 = 0;
    let min = crate::redundancy::Redundancy::Ec { data, parity }.default_min() as usize;
    let mut siblings = StripSet::default();
    for k in 0..n {
        let away = rng.gen_bool(0.1);
        let sibling = !away && rng.gen_bool(0.15);
        let took = !away && !sibling && rng.gen_bool(0.5);
        let mut kept = true;
        let (s, now) = if away {
            (at(V1, V0, &[], false), ea[k].clone())
        } else if sibling {
            siblings.insert(k);
            kept = rng.gen_bool(0.7);
            (
                Strip::At {
                    version: VS,
                    change: Some((V2, ts)),
                    back: kept,
                },
                es[k].clone(),
            )
        } else if took {
            kept = rng.gen_bool(0.9);
            (
                Strip::At {
                    version: V3,
                    change: Some((V2, t3)),
                    back: kept,
                },
                ec[k].clone(),
            )
        } else {
            (
                Strip::At {
                    version: V2,
                    change: Some((V1, t2)),
                    back: true,
                },
                eb[k].clone(),
            )
        };
        // A holder restarted after a kill returns a strip it was changing to the change's base
        // from what it kept, and no longer knows which change made that version.
        let (s, now) = match s {
            Strip::At {
                version,
                change: Some((base, _)),
                back: true,
            } if rng.gen_bool(0.1) => {
                let rolled_to = if version == V3 || version == VS {
                    eb[k].clone()
                } else {
                    ea[k].clone()
                };
                (
                    Strip::At {
                        version: base,
                        change: None,
                        back: false,
                    },
                    rolled_to,
                )
            }
            _ => (s, now),
        };
        let missing = rng.gen_bool(0.2);
        took_v3 += usize::from(matches!(s, Strip::At { version, .. } if version == V3));
        all_took &= missing || away || matches!(s, Strip::At { version, .. } if version == V3);
        strips.push(if missing { Strip::Missing } else { s });
        bytes.push(now);
        // What a holder kept returns its strip to the base of the change it took last; one
        // that kept nothing has only the bytes it holds.
        rolled.push(match (took || sibling, kept) {
            (true, true) => eb[k].clone(),
            (true, false) if sibling => es[k].clone(),
            (true, false) => ec[k].clone(),
            _ => ea[k].clone(),
        });
    }
    let decode = |sources: StripSet, use_rolled: StripSet| -> Vec<u8> {
        let mut some: Vec<Option<Vec<u8>>> = (0..n)
            .map(|k| {
                sources.contains(k).then(|| {
                    if use_rolled.contains(k) {
                        rolled[k].clone()
                    } else {
                        bytes[k].clone()
                    }
                })
            })
            .collect();
        c.reconstruct(&mut some).expect("sources are at least x");
        c.join(&some.into_iter().map(Option::unwrap).collect::<Vec<_>>()[..data as usize])
    };
    let at_v3_or_v2 = (strips.iter().enumerate())
        .filter(|(k, s)| match s {
            Strip::At {
                version, back: b, ..
            } if *version == VS => *b || !ts.contains(*k),
            Strip::At { version, .. } => *version != V1,
            Strip::Missing => false,
        })
        .count();
    // With no strip at V3 at hand, the siblings are the newest the resolver sees (the caller
    // waits for the nodes that may hold V3: `resolve` decides among the strips it is given).
    let v3_at_hand = strips
        .iter()
        .any(|s| matches!(s, Strip::At { version, .. } if *version == V3));
    let _ = siblings;
    let newest = |version: Version| {
        if version == V3 {
            &cc
        } else if version == VS && !v3_at_hand {
            &sib
        } else {
            &b
        }
    };
    match resolve(data as usize, &strips) {
        Resolution::Whole { version, rebuild } => {
            let sources = StripSet::first(n).minus(rebuild);
            prop_assert!(sources.len() >= data as usize);
            let want = if version == V1 { &a } else { newest(version) };
            prop_assert_eq!(&decode(sources, StripSet::default()), want);
        }
        Resolution::Forward {
            version,
            sources,
            rebuild,
            relabel,
            home,
        } => {
            prop_assert!(sources.len() >= data as usize);
            prop_assert_eq!(sources.union(rebuild), StripSet::first(n));
            prop_assert!(relabel.minus(sources).is_empty());
            prop_assert!(home.minus(relabel).is_empty());
            prop_assert!(version == V3 || version == VS || version == V2);
            prop_assert_eq!(&decode(sources, home), newest(version));
        }
        Resolution::Back {
            version,
            sources,
            roll_back,
        } => {
            prop_assert!(
                !(all_took && took_v3 >= min),
                "every holder at hand took the change, enough to acknowledge it, yet it went back"
            );
            prop_assert!(roll_back.minus(sources).is_empty());
            let want = if version == V2 { &b } else { &a };
            prop_assert_eq!(&decode(sources, roll_back), want);
        }
        Resolution::Undecided { valid, need } => {
            prop_assert!(valid < need);
            // With every holder able to go back, x strips at V2 or V3 always decide.
            let all_kept = strips
                .iter()
                .all(|s| !matches!(s, Strip::At { back: false, version, .. } if *version == V3));
            prop_assert!(
                !(all_kept && v3_at_hand && at_v3_or_v2 >= data as usize),
                "undecided with {at_v3_or_v2} strips at hand"
            );
        }
        Resolution::Inconsistent(why) => prop_assert!(false, "{}", why),
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1000))]

    #[test]
    fn a_stripe_a_crash_left_mixed_decodes_to_one_version(seed: u64) {
        crash_case(seed)?;
    }
}

/// A going back that only one strip took (its primary stopped), on a stripe another primary,
/// without that strip, took forward since: the state of simulator seed 1701 (2:2, with
/// crashes). Its version is the newest but was never acknowledged; the others decide, written
/// at a new version. With a strip missing, that strip might show the newest: it waits.
#[test]
fn a_lone_newest_strip_on_a_stripe_at_hand_gives_way() {
    let v10 = Version(10 << 32 | 1);
    let (v12, v16, v21) = (
        Version(12 << 32 | 1),
        Version(16 << 32 | 1),
        Version(21 << 32 | 1),
    );
    let t = [0, 2, 3];
    let s = [
        at(v16, v12, &t, true),
        at(v16, v12, &t, true),
        at(v16, v12, &t, true),
        at(v21, v10, &[], true),
    ];
    assert_eq!(
        resolve(2, &s),
        Resolution::Back {
            version: v16,
            sources: set(&[0, 1, 2]),
            roll_back: set(&[]),
        }
    );
    let mut missing = s;
    missing[1] = Strip::Missing;
    assert_eq!(
        resolve(2, &missing),
        Resolution::Undecided { valid: 1, need: 2 }
    );
    // Two strips at the newest are enough to decode it: it stands.
    let mut two = s;
    two[2] = at(v21, v10, &[], true);
    assert!(matches!(resolve(2, &two), Resolution::Whole { version, .. } if version == v21));
}

/// Seeds that broke a resolver which counted strips at the base as valid whatever the change
/// touched, took any older version for the base, or rolled back strips that kept nothing; or
/// counted a sibling at the base though it kept nothing and its change touched it, or did not
/// return siblings to the base before going back; or, giving way to the others when a lone
/// strip held the newest version, went "back" to an undone sibling of that version
/// (12_624_760_964_426_746_221).
#[test]
fn stripes_that_broke_wrong_resolvers() {
    for seed in [
        12_624_760_964_426_746_221,
        1_371_581_196_932_751_348,
        7_153_157_082_186_685_045,
        3_330_829_537_757_105_031,
        4_979_882_878_681_236_238,
        15_547_622_877_860_497_849,
        4_911_798_540_130_186_002,
    ] {
        crash_case(seed).unwrap();
    }
}
