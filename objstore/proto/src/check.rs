//! Which copies of one object are good and which must be repaired, from what each owner
//! answered to `CheckObj`. Pure: `dog vdi check`, `dog cluster check` and the node's scrub
//! judge the same way.
//!
//! - The newest version wins: a copy at an older version, or no copy where another owner has
//!   one, is bad (behind, missing). A tombstone at the newest version wins over everything.
//! - At the newest version, a copy that failed verification (a read error; a checksum
//!   mismatch once blocks carry checksums) is bad, and so is a copy whose digest is in a
//!   minority: the largest group of equal digests is good when it is larger than every other.
//!   Two groups of one size (two copies that differ, say) have no majority: nothing can tell
//!   which is right, so the object is unrecoverable and named, and no copy is touched.
//! - An owner that did not answer, or is still recovering its copy, is neither good nor bad:
//!   it is skipped and said so.

use std::fmt;
use std::net::SocketAddr;

use crate::api::CopyCheck;
use crate::version::{ObjState, Version};

/// Why a copy is bad.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bad {
    /// The owner holds nothing of the object.
    Missing,
    /// The owner's copy is older than the newest.
    Behind(Version),
    /// The copy failed verification.
    Failed(String),
    /// Its digest differs from the majority's.
    Minority,
    /// A live copy where the newest version is a tombstone, or the reverse, at one version.
    Mismatch,
}

impl fmt::Display for Bad {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Bad::Missing => write!(f, "missing"),
            Bad::Behind(v) => write!(f, "behind (at {v})"),
            Bad::Failed(why) => write!(f, "failed verification: {why}"),
            Bad::Minority => write!(f, "bytes differ from the other copies"),
            Bad::Mismatch => write!(f, "deleted on one copy and live on another at one version"),
        }
    }
}

/// The judgement of one object's copies.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Judgement {
    /// The newest state any owner holds; None when no owner that answered holds anything.
    pub newest: Option<ObjState>,
    /// Owners holding a good copy of `newest` (repairs copy from these).
    pub good: Vec<SocketAddr>,
    /// Owners whose copy must be restored from a good one.
    pub bad: Vec<(SocketAddr, Bad)>,
    /// Owners not judged: they did not answer, or are recovering the copy.
    pub skipped: Vec<(SocketAddr, String)>,
    /// Why no copy can be trusted, when none can (the bad copies then stay as they are).
    pub unrecoverable: Option<String>,
}

/// Judges the answers of an object's owners (see the module documentation). `answers` has one
/// entry per owner: its `CheckObj` answer, or why it gave none.
pub fn judge(answers: &[(SocketAddr, Result<CopyCheck, String>)]) -> Judgement {
    let mut j = Judgement::default();
    let mut held: Vec<(SocketAddr, &CopyCheck)> = Vec::new();
    for (addr, a) in answers {
        match a {
            Err(why) => j.skipped.push((*addr, why.clone())),
            Ok(c) if c.lost => j.bad.push((
                *addr,
                Bad::Failed(
                    "its data was lost here (a read error or a checksum mismatch); it waits for a good copy".into(),
                ),
            )),
            Ok(c) if c.recovering => j.skipped.push((*addr, "recovering its copy".into())),
            Ok(c) => held.push((*addr, c)),
        }
    }
    let newest = held
        .iter()
        .filter_map(|(_, c)| c.state)
        .max_by_key(|s| (s.version, s.deleted));
    j.newest = newest;
    let Some(newest) = newest else {
        if j.skipped.is_empty() && !j.bad.is_empty() {
            j.unrecoverable = Some(
                "every copy failed verification or was lost: no good copy to restore from".into(),
            );
        } else if !held.is_empty() && j.skipped.is_empty() {
            j.unrecoverable = Some("no owner holds a copy".into());
        }
        return j;
    };
    // Copies at the newest version, live ones grouped by digest.
    let mut groups: Vec<(Option<&str>, Vec<SocketAddr>)> = Vec::new();
    for (addr, c) in &held {
        let st = match c.state {
            None => {
                j.bad.push((*addr, Bad::Missing));
                continue;
            }
            Some(st) if st.version < newest.version => {
                j.bad.push((*addr, Bad::Behind(st.version)));
                continue;
            }
            Some(st) => st,
        };
        if st.deleted != newest.deleted {
            j.bad.push((*addr, Bad::Mismatch));
        } else if let Some(why) = &c.error {
            j.bad.push((*addr, Bad::Failed(why.clone())));
        } else if newest.deleted {
            j.good.push(*addr);
        } else {
            let d = c.digest.as_deref();
            match groups.iter_mut().find(|(g, _)| *g == d) {
                Some((_, addrs)) => addrs.push(*addr),
                None => groups.push((d, vec![*addr])),
            }
        }
    }
    if newest.deleted {
        return j;
    }
    // Copies not hashed (an existence-only check) agree with any digest.
    let unhashed = groups
        .iter()
        .position(|(d, _)| d.is_none())
        .map(|i| groups.remove(i).1)
        .unwrap_or_default();
    groups.sort_by_key(|(_, addrs)| std::cmp::Reverse(addrs.len()));
    match groups.as_slice() {
        [] => {}
        [(_, addrs)] => j.good.extend(addrs),
        [(_, first), (_, second), ..] if first.len() > second.len() => {
            j.good.extend(first);
            for (_, addrs) in &groups[1..] {
                j.bad.extend(addrs.iter().map(|a| (*a, Bad::Minority)));
            }
        }
        _ => {
            j.unrecoverable = Some(format!(
                "the {} copies of version {} differ ({} different contents) and none has a majority",
                groups.iter().map(|(_, a)| a.len()).sum::<usize>(),
                newest.version,
                groups.len()
            ));
            j.good.clear();
            return j;
        }
    }
    j.good.extend(unhashed);
    if j.good.is_empty() {
        j.unrecoverable = Some(format!(
            "every copy of version {} failed verification",
            newest.version
        ));
    }
    j
}

/// The digest `CheckObj` reports for a copy's bytes: blake3 of the bytes with trailing zeros
/// left out, in hex.
pub fn digest(data: &[u8]) -> String {
    let end = data.iter().rposition(|&b| b != 0).map_or(0, |p| p + 1);
    blake3::hash(&data[..end]).to_hex().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(i: u8) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, i], 7000))
    }

    fn live(v: u64, digest: &str) -> Result<CopyCheck, String> {
        Ok(CopyCheck {
            state: Some(ObjState::live(Version(v))),
            digest: Some(digest.into()),
            ..Default::default()
        })
    }

    #[test]
    fn a_minority_digest_is_bad_and_the_majority_good() {
        let j = judge(&[
            (a(1), live(5, "x")),
            (a(2), live(5, "y")),
            (a(3), live(5, "x")),
        ]);
        assert_eq!(j.good, vec![a(1), a(3)]);
        assert_eq!(j.bad, vec![(a(2), Bad::Minority)]);
        assert_eq!(j.unrecoverable, None);
    }

    #[test]
    fn the_newest_version_wins_over_a_majority_of_older_copies() {
        let j = judge(&[
            (a(1), live(4, "x")),
            (a(2), live(5, "y")),
            (a(3), live(4, "x")),
        ]);
        assert_eq!(j.good, vec![a(2)]);
        assert_eq!(
            j.bad,
            vec![
                (a(1), Bad::Behind(Version(4))),
                (a(3), Bad::Behind(Version(4)))
            ]
        );
    }

    #[test]
    fn missing_failed_and_tombstones() {
        let failed = Ok(CopyCheck {
            state: Some(ObjState::live(Version(5))),
            error: Some("read failed".into()),
            ..Default::default()
        });
        let j = judge(&[
            (a(1), Ok(CopyCheck::default())),
            (a(2), failed.clone()),
            (a(3), live(5, "x")),
        ]);
        assert_eq!(j.good, vec![a(3)]);
        assert_eq!(
            j.bad,
            vec![
                (a(1), Bad::Missing),
                (a(2), Bad::Failed("read failed".into()))
            ]
        );
        let tomb = Ok(CopyCheck {
            state: Some(ObjState::tombstone(Version(6))),
            ..Default::default()
        });
        let j = judge(&[(a(1), tomb.clone()), (a(2), live(5, "x")), (a(3), tomb)]);
        assert_eq!(j.good, vec![a(1), a(3)]);
        assert_eq!(j.bad, vec![(a(2), Bad::Behind(Version(5)))]);
    }

    #[test]
    fn no_good_copy_is_unrecoverable() {
        let failed = Ok(CopyCheck {
            state: Some(ObjState::live(Version(5))),
            error: Some("checksum".into()),
            ..Default::default()
        });
        let j = judge(&[(a(1), failed.clone()), (a(2), failed)]);
        assert!(j.good.is_empty());
        assert!(j.unrecoverable.unwrap().contains("failed verification"));
        // Two copies that differ: no majority, nothing touched.
        let j = judge(&[(a(1), live(5, "x")), (a(2), live(5, "y"))]);
        assert!(j.good.is_empty() && j.bad.is_empty());
        assert!(j.unrecoverable.unwrap().contains("majority"));
        // No copy anywhere.
        let j = judge(&[(a(1), Ok(CopyCheck::default()))]);
        assert!(j.unrecoverable.is_some());
    }

    #[test]
    fn owners_not_answering_or_recovering_are_skipped() {
        let rec = Ok(CopyCheck {
            recovering: true,
            ..Default::default()
        });
        let j = judge(&[
            (a(1), Err("timed out".into())),
            (a(2), rec),
            (a(3), live(5, "x")),
        ]);
        assert_eq!(j.good, vec![a(3)]);
        assert!(j.bad.is_empty());
        assert_eq!(j.skipped.len(), 2);
        // Nothing known: not called unrecoverable.
        let j = judge(&[(a(1), Err("down".into())), (a(2), Ok(CopyCheck::default()))]);
        assert_eq!(j.unrecoverable, None);
    }

    #[test]
    fn lost_copies_are_bad_and_all_lost_is_unrecoverable() {
        let lost = || {
            Ok(CopyCheck {
                lost: true,
                ..Default::default()
            })
        };
        let j = judge(&[(a(1), lost()), (a(2), live(5, "x")), (a(3), live(5, "x"))]);
        assert_eq!(j.good, vec![a(2), a(3)]);
        assert_eq!(j.bad.len(), 1);
        assert_eq!(j.bad[0].0, a(1));
        assert_eq!(j.unrecoverable, None);
        let j = judge(&[(a(1), lost()), (a(2), lost()), (a(3), lost())]);
        assert!(j.good.is_empty());
        assert_eq!(j.bad.len(), 3);
        assert!(j
            .unrecoverable
            .unwrap()
            .contains("failed verification or was lost"));
        // One owner not answering: it may hold the good copy.
        let j = judge(&[(a(1), lost()), (a(2), Err("down".into()))]);
        assert_eq!(j.unrecoverable, None);
    }

    #[test]
    fn digest_ignores_trailing_zeros() {
        assert_eq!(digest(b"abc"), digest(b"abc\0\0\0"));
        assert_ne!(digest(b"abc"), digest(b"abd"));
        assert_eq!(digest(&[]), digest(&[0; 4096]));
    }
}
