//! Redundancy schemes: `N` full copies, or `x:y` erasure coding (x data strips and y parity
//! strips of every object, on x + y nodes in distinct zones), spelled as `dog` takes them
//! (`--copies 3`, `--copies 4:2`, as Sheepdog's `-c`).
//!
//! The rules every scheme keeps: how many holders an object has ([`Redundancy::width`]), how
//! many of them a change needs by default ([`Redundancy::default_min`]: a majority of copies,
//! or `x + y - y/2` strips), how many losses it survives ([`Redundancy::tolerates`]) and the
//! raw bytes it stores per logical byte ([`Redundancy::raw_per_logical`]).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::view::MAX_COPIES;

/// Data strips an erasure-coded object may have.
pub const EC_DATA: std::ops::RangeInclusive<u8> = 2..=16;
/// Parity strips an erasure-coded object may have.
pub const EC_PARITY: std::ops::RangeInclusive<u8> = 1..=8;

/// How an object survives the loss of nodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Redundancy {
    /// `N` full copies on N nodes.
    Copies(u32),
    /// Reed-Solomon: `data` strips of the object and `parity` strips computed from them, each on
    /// its own node.
    Ec { data: u8, parity: u8 },
}

impl Redundancy {
    /// Nodes that hold an object: its copies, or its strips.
    pub fn width(self) -> usize {
        match self {
            Redundancy::Copies(n) => n as usize,
            Redundancy::Ec { data, parity } => (data + parity) as usize,
        }
    }

    /// Holders a change needs by default: a majority of the copies (as Ceph's `min_size`), or
    /// `x + y - y/2` strips, so that an acknowledged change stays decodable with `y - y/2`
    /// more strips lost; and at least `y + 1`, so that the strips of an older version at hand
    /// never reach x while every holder of an acknowledged change is down and no more than y
    /// strips are lost (only schemes of x at most y/2, as 2:4, need it).
    pub fn default_min(self) -> u32 {
        let w = self.width() as u32;
        match self {
            Redundancy::Copies(n) => n - n / 2,
            Redundancy::Ec { parity, .. } => (w - parity as u32 / 2).max(parity as u32 + 1),
        }
    }

    /// Holders that can be lost with no data lost.
    pub fn tolerates(self) -> u32 {
        match self {
            Redundancy::Copies(n) => n.saturating_sub(1),
            Redundancy::Ec { parity, .. } => parity as u32,
        }
    }

    /// Raw bytes stored per logical byte (3.0 for 3 copies, 1.5 for 4:2), padding aside.
    pub fn raw_per_logical(self) -> f64 {
        match self {
            Redundancy::Copies(n) => n as f64,
            Redundancy::Ec { data, parity } => (data + parity) as f64 / data as f64,
        }
    }

    pub fn is_ec(self) -> bool {
        matches!(self, Redundancy::Ec { .. })
    }

    /// Checks the scheme for a cluster of `zones` zones, and `min` (0: the default) against
    /// it; the error names what is wrong. Copies may outnumber zones (the cluster is then
    /// degraded, as before); strips may not: two strips in one zone would make one zone's loss
    /// cost two of the y the object survives.
    pub fn validate(self, min: u32, zones: usize) -> Result<(), String> {
        match self {
            Redundancy::Copies(n) => {
                if n == 0 || n > MAX_COPIES {
                    return Err(format!("copies must be 1 to {MAX_COPIES}, not {n}"));
                }
            }
            Redundancy::Ec { data, parity } => {
                if !EC_DATA.contains(&data) || !EC_PARITY.contains(&parity) {
                    return Err(format!(
                        "erasure coding {self} is not offered: data strips must be {} to {} and parity strips {} to {}",
                        EC_DATA.start(),
                        EC_DATA.end(),
                        EC_PARITY.start(),
                        EC_PARITY.end()
                    ));
                }
                if self.width() > zones {
                    return Err(format!(
                        "erasure coding {self} puts {} strips in distinct zones, and the cluster has {zones} zone(s)",
                        self.width()
                    ));
                }
            }
        }
        let least = match self {
            Redundancy::Copies(_) => 1,
            Redundancy::Ec { data, .. } => data as u32,
        };
        if min != 0 && (min < least || min > self.width() as u32) {
            return Err(format!(
                "min-copies for {self} must be {least} to {}, not {min}",
                self.width()
            ));
        }
        Ok(())
    }
}

impl fmt::Display for Redundancy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Redundancy::Copies(n) => write!(f, "{n}"),
            Redundancy::Ec { data, parity } => write!(f, "{data}:{parity}"),
        }
    }
}

impl FromStr for Redundancy {
    type Err = String;

    /// `N` or `x:y`; the scheme's own limits are [`Redundancy::validate`]'s.
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("'{s}' is not a redundancy: give N copies (3) or x:y strips (4:2)");
        let num = |t: &str| -> Result<u32, String> {
            if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            t.parse::<u32>().map_err(|_| bad())
        };
        match s.trim().split_once(':') {
            None => Ok(Redundancy::Copies(num(s.trim())?)),
            Some((x, y)) => {
                let (x, y) = (num(x)?, num(y)?);
                let strip = |n: u32| u8::try_from(n).map_err(|_| bad());
                Ok(Redundancy::Ec {
                    data: strip(x)?,
                    parity: strip(y)?,
                })
            }
        }
    }
}

impl Serialize for Redundancy {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Redundancy {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_both_spellings() {
        for (s, r) in [
            ("3", Redundancy::Copies(3)),
            ("1", Redundancy::Copies(1)),
            ("4:2", Redundancy::Ec { data: 4, parity: 2 }),
            (
                " 16:8 ",
                Redundancy::Ec {
                    data: 16,
                    parity: 8,
                },
            ),
        ] {
            assert_eq!(s.parse::<Redundancy>().unwrap(), r);
            assert_eq!(r.to_string().parse::<Redundancy>().unwrap(), r);
            let j = serde_json::to_string(&r).unwrap();
            assert_eq!(serde_json::from_str::<Redundancy>(&j).unwrap(), r);
        }
        for bad in [
            "",
            "x",
            "4:",
            ":2",
            "4:2:1",
            "-3",
            "4:-2",
            "3.0",
            "4:300",
            "99999999999",
        ] {
            let e = bad.parse::<Redundancy>().unwrap_err();
            assert!(e.contains(&format!("'{bad}'")), "{e}");
        }
    }

    #[test]
    fn widths_minimums_and_costs() {
        let ec = |d, p| Redundancy::Ec { data: d, parity: p };
        assert_eq!((ec(4, 2).width(), ec(4, 2).default_min()), (6, 5));
        assert_eq!((ec(2, 1).width(), ec(2, 1).default_min()), (3, 3));
        assert_eq!(ec(16, 8).default_min(), 20);
        assert_eq!(Redundancy::Copies(3).default_min(), 2);
        assert_eq!(ec(4, 2).raw_per_logical(), 1.5);
        assert_eq!(
            (ec(4, 2).tolerates(), Redundancy::Copies(3).tolerates()),
            (2, 2)
        );
        // An acknowledged change survives y - y/2 more lost strips (min - data of them); and
        // with every holder of it down, fewer than x strips are left or more than y are lost.
        for d in EC_DATA {
            for p in EC_PARITY {
                let r = ec(d, p);
                let min = r.default_min();
                assert!(min >= d as u32 && min <= r.width() as u32);
                assert!(min - d as u32 >= (p - p / 2) as u32);
                assert!(r.width() as u32 - min < d as u32 || min > p as u32, "{r}");
            }
        }
        assert_eq!(ec(2, 4).default_min(), 5);
    }

    #[test]
    fn impossible_schemes_are_refused_by_name() {
        let ec = |d, p| Redundancy::Ec { data: d, parity: p };
        assert!(ec(4, 2).validate(0, 6).is_ok());
        assert!(ec(4, 2).validate(4, 6).is_ok());
        let cases = [
            (
                ec(4, 2),
                0,
                5,
                "6 strips in distinct zones, and the cluster has 5 zone(s)",
            ),
            (ec(1, 1), 0, 9, "data strips must be 2 to 16"),
            (ec(17, 1), 0, 99, "data strips must be 2 to 16"),
            (ec(4, 0), 0, 9, "parity strips 1 to 8"),
            (ec(4, 9), 0, 99, "parity strips 1 to 8"),
            (ec(4, 2), 3, 6, "min-copies for 4:2 must be 4 to 6, not 3"),
            (ec(4, 2), 7, 6, "not 7"),
            (Redundancy::Copies(0), 0, 3, "copies must be 1 to"),
            (
                Redundancy::Copies(3),
                4,
                3,
                "min-copies for 3 must be 1 to 3",
            ),
        ];
        for (r, min, zones, why) in cases {
            let e = r.validate(min, zones).unwrap_err();
            assert!(e.contains(why), "{r} min {min} zones {zones}: {e}");
        }
        // Copies may outnumber zones: the cluster is degraded, not refused.
        assert!(Redundancy::Copies(3).validate(0, 1).is_ok());
    }
}
