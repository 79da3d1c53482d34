//! Which version a stripe stands at when its strips disagree: rule 4 of the invariant of
//! erasure-coded objects (docs/architecture.md, "Erasure-coded objects").
//!
//! Rules 1 to 3 make this decidable: every change moves every strip to its version and
//! records the version it was made on (`base`) and the set `T` of strips whose bytes it
//! touched; a change starts only on a stripe whose strips all hold its base; and a holder keeps
//! what returns its strip to the base until the next change. So with `new` the newest version
//! present and `old` its base,
//!
//! - a strip is valid at `new` if it holds `new`, or holds `old` and is not in `T` (the change
//!   left its bytes alone);
//! - a strip is valid at `old` if it holds `old`, or holds `new` and is not in `T` or can go
//!   back;
//! - a strip at a *sibling* version (older than `new`, made by a change on `old` too: one that
//!   was undone, the strip's holder away when it went back) counts at `old` once returned to
//!   it, by what it kept or, if that change left its bytes alone, by its number;
//! - a strip at any other version is stale (its holder missed changes: it was down) and is
//!   rebuilt, like a missing one.
//!
//! The stripe goes forward when x strips are valid at `new`, else back when x are valid at
//! `old`; each way it decodes to exactly the bytes of one version, never a mix. Going back is
//! written as a new change of every strip, so a strip still at `new` whose holder was away is
//! stale afterwards and never brings the change back. Fewer than x valid strips either way
//! leaves it undecided: its I/O waits for the holders that are down.
//!
//! What is at hand is the caller's to judge: a holder that is down may hold a newer version
//! only if the history says one could have been acknowledged without the holders up (the
//! rule of "Consistency"); `resolve` decides among the strips it is given.

use std::fmt;

use crate::oid::MAX_STRIPS;
use crate::version::Version;

/// A set of strips of one stripe: bit `k` for strip `k`.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct StripSet(pub u32);

impl StripSet {
    /// Strips `0 .. n`.
    pub fn first(n: usize) -> StripSet {
        debug_assert!(n <= MAX_STRIPS);
        StripSet(((1u64 << n) - 1) as u32)
    }

    pub fn contains(self, k: usize) -> bool {
        k < 32 && self.0 & (1 << k) != 0
    }

    pub fn insert(&mut self, k: usize) {
        debug_assert!(k < MAX_STRIPS);
        self.0 |= 1 << k;
    }

    pub fn len(self) -> usize {
        self.0.count_ones() as usize
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn union(self, o: StripSet) -> StripSet {
        StripSet(self.0 | o.0)
    }

    pub fn minus(self, o: StripSet) -> StripSet {
        StripSet(self.0 & !o.0)
    }

    pub fn and(self, o: StripSet) -> StripSet {
        StripSet(self.0 & o.0)
    }

    pub fn iter(self) -> impl Iterator<Item = usize> {
        (0..32).filter(move |&k| self.contains(k))
    }
}

impl fmt::Debug for StripSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

/// What the holder of one strip says of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strip {
    /// Not at hand: its holder is down, or the strip failed its checksums.
    Missing,
    /// The strip at `version` (`Version(0)`: the holder has nothing of the object, which reads
    /// as zeros). `change`: the base of the change that made `version` and the strips whose
    /// bytes it touched (None when the holder lost that record in a crash: the strip is
    /// trusted at `version`, but says nothing of other versions); `back`: the holder kept what
    /// returns it to the base (rule 3).
    At {
        version: Version,
        change: Option<(Version, StripSet)>,
        back: bool,
    },
}

impl Strip {
    /// The version of a strip at hand.
    pub fn version(&self) -> Option<Version> {
        match self {
            Strip::At { version, .. } => Some(*version),
            Strip::Missing => None,
        }
    }
}

/// How a stripe is made whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// Every strip present holds `version` but `rebuild` (missing or stale), which are decoded
    /// from the others.
    Whole { version: Version, rebuild: StripSet },
    /// The newest change stands: decode from `sources`; `rebuild` (strips of `T` still at the
    /// base, stale and missing ones) get their bytes at `version`; `relabel` (untouched, at
    /// the base) only its number, once `home` (at an undone sibling change) went back to the
    /// base.
    Forward {
        version: Version,
        sources: StripSet,
        rebuild: StripSet,
        relabel: StripSet,
        home: StripSet,
    },
    /// The newest change goes: `sources` hold `version` (the base) once `roll_back` returned
    /// to it (from what they kept, or by number where their change left them alone); the
    /// stripe is then written whole at a new version.
    Back {
        version: Version,
        sources: StripSet,
        roll_back: StripSet,
    },
    /// Fewer than `need` strips are valid at either version: wait for the missing holders.
    Undecided { valid: usize, need: usize },
    /// The strips break the invariant (two changes say they made one version).
    Inconsistent(String),
}

/// Resolves a stripe of `data` data strips from what each of its holders says (`strips[k]`
/// for strip `k`).
///
/// A newest version that fewer than `data` strips can show, on a stripe whose every other
/// strip is at hand, was never acknowledged (a change is acknowledged once more than `data`
/// strips took it, a strip never goes below an acknowledged version, and a strip at hand
/// holds the newest version of itself: the caller's judgement), and nothing was ever made
/// on it: it is what a decision that failed half way left (a stripe going back whose new
/// version reached one strip before its primary stopped), on a stripe another primary,
/// without that strip, decided otherwise since. The stripe is resolved without those strips,
/// and goes back to what the others decide, written whole at a new version past it (seed
/// 1701 with crashes, SIM_EC=2:2 and SIM_EC_VDIS=1: strip 3 at v21.1, a going back that
/// only it took, the others at v16.1 gone forward by a primary that did not see strip 3,
/// and the stripe undecided for good).
pub fn resolve(data: usize, strips: &[Strip]) -> Resolution {
    let first = resolve_newest(data, strips);
    if !matches!(first, Resolution::Undecided { .. }) || strips.contains(&Strip::Missing) {
        return first;
    }
    let Some(new) = strips.iter().filter_map(Strip::version).max() else {
        return first;
    };
    let without: Vec<Strip> = (strips.iter())
        .map(|s| match s.version() {
            Some(v) if v == new => Strip::Missing,
            _ => *s,
        })
        .collect();
    // The newest change started on a stripe standing at its base: a version made on that base
    // before it (a sibling) had been undone by then, and the others never go back to it (a
    // state the resolver's model made: three strips at an undone sibling, none kept its undo,
    // and one at the newest; going "back" to the sibling decoded undone bytes).
    let base = strips.iter().find_map(|s| match *s {
        Strip::At {
            version,
            change: Some((base, _)),
            ..
        } if version == new => Some(base),
        _ => None,
    });
    let sibling = |target: Version| {
        target < new
            && strips.iter().any(|s| {
                matches!(*s, Strip::At { version, change: Some((b, _)), .. }
                    if version == target && Some(b) == base)
            })
    };
    match resolve_newest(data, &without) {
        Resolution::Whole { version, rebuild } if version != Version::NONE && !sibling(version) => {
            Resolution::Back {
                version,
                sources: StripSet::first(strips.len()).minus(rebuild),
                roll_back: StripSet::default(),
            }
        }
        Resolution::Back { version, .. } if sibling(version) => first,
        back @ Resolution::Back { .. } => back,
        _ => first,
    }
}

/// [`resolve`] by the newest version present and its base alone.
fn resolve_newest(data: usize, strips: &[Strip]) -> Resolution {
    let Some(new) = strips.iter().filter_map(Strip::version).max() else {
        return Resolution::Undecided {
            valid: 0,
            need: data,
        };
    };
    let mut change: Option<(Version, StripSet)> = None;
    for s in strips {
        if let Strip::At {
            version,
            change: Some(c),
            ..
        } = *s
        {
            if version != new {
                continue;
            }
            match change {
                Some(seen) if seen != c => {
                    return Resolution::Inconsistent(format!(
                        "two changes made version {new}: on {} touching {:?}, and on {} touching {:?}",
                        seen.0, seen.1, c.0, c.1
                    ));
                }
                _ => change = Some(c),
            }
        }
    }
    let (mut at_new, mut at_old, mut back, mut home) = (
        StripSet::default(),
        StripSet::default(),
        StripSet::default(),
        StripSet::default(),
    );
    for (k, s) in strips.iter().enumerate() {
        if let Strip::At {
            version,
            back: b,
            change: own,
        } = *s
        {
            if version == new {
                at_new.insert(k);
                if b {
                    back.insert(k);
                }
            } else if change.is_some_and(|(base, _)| version == base) {
                at_old.insert(k);
            } else if let (Some((base, _)), Some((own_base, own_t))) = (change, own) {
                // A sibling: a change made on the same base as the newest, older than it, so
                // one that was undone (the newest started only once the stripe stood at the
                // base again). The strip shows the base once returned to it: by its undo, or
                // by its number if that change left its bytes alone.
                if own_base == base && version < new && (b || !own_t.contains(k)) {
                    at_old.insert(k);
                    home.insert(k);
                }
            }
        }
    }
    // Missing or stale: neither version's bytes are known to be there.
    let lost = StripSet::first(strips.len()).minus(at_new.union(at_old));
    let Some((old, t)) = change.filter(|_| !at_old.is_empty()) else {
        return if at_new.len() >= data {
            Resolution::Whole {
                version: new,
                rebuild: lost,
            }
        } else {
            Resolution::Undecided {
                valid: at_new.len(),
                need: data,
            }
        };
    };
    let valid_new = at_new.union(at_old.minus(t));
    if valid_new.len() >= data {
        return Resolution::Forward {
            version: new,
            sources: valid_new,
            rebuild: at_old.and(t).union(lost),
            relabel: at_old.minus(t),
            home: home.minus(t),
        };
    }
    let roll_back = at_new.and(t).and(back).union(home);
    let valid_old = at_old.union(at_new.minus(t)).union(roll_back);
    if valid_old.len() >= data {
        return Resolution::Back {
            version: old,
            sources: valid_old,
            roll_back,
        };
    }
    Resolution::Undecided {
        valid: valid_new.len().max(valid_old.len()),
        need: data,
    }
}
