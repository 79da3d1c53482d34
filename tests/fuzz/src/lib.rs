//! Fuzz targets that run in `cargo test` (issue 25). cargo-fuzz needs a nightly toolchain and
//! a sanitizer runtime; these use proptest as the engine instead, so CI runs every target
//! briefly with the stable toolchain, and a failing input shrinks and replays like any
//! proptest failure.
//!
//! - Each target (a file in `tests/`) reads a corpus, `corpus/<target>/`, kept in the
//!   repository: valid inputs made by our own encoders, and inputs that once found a defect.
//!   Every target has a test that checks the seeds it makes are in its corpus
//!   (`FUZZ_WRITE_CORPUS=1` writes them after a format change).
//! - An input is a seed changed by a few mutations (bit flips, bytes set, interesting integers
//!   written, bytes inserted or deleted, a cut, a splice of two seeds, a repeated run, a
//!   number in JSON text replaced by a boundary value) or, one
//!   time in eight, plain noise.
//! - `FUZZ_CASES` is the number of inputs per target (default 256, which is what CI runs);
//!   `make fuzz` runs many more. A failing input is saved by proptest under
//!   `proptest-regressions/`; once fixed, copy its bytes into the corpus.

use std::path::PathBuf;

pub mod frames;
pub mod json;

use proptest::prelude::*;
use proptest::test_runner::Config;

/// Inputs per target when `FUZZ_CASES` is not set.
pub const DEFAULT_CASES: u32 = 256;

/// The proptest configuration of every target: `FUZZ_CASES` inputs.
pub fn config() -> Config {
    config_or(DEFAULT_CASES)
}

/// [`config`] with `cases` inputs when `FUZZ_CASES` is not set (live targets, whose inputs
/// cost a round trip to a running process, run fewer in `cargo test`).
pub fn config_or(cases: u32) -> Config {
    let cases = std::env::var("FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(cases);
    Config {
        cases,
        max_shrink_iters: 4096,
        ..Config::default()
    }
}

/// Where target `target`'s corpus lives.
pub fn corpus_dir(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target)
}

/// Every input in `target`'s corpus, in file-name order.
///
/// # Panics
/// When the corpus is missing or empty: a target without seeds fuzzes only noise.
pub fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = corpus_dir(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("fuzz corpus {}: {e}", dir.display()))
        .map(|e| e.expect("corpus entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    assert!(
        !files.is_empty(),
        "fuzz corpus {} is empty: run the target's seeds test with FUZZ_WRITE_CORPUS=1",
        dir.display()
    );
    files
        .iter()
        .map(|p| std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .collect()
}

/// Checks that each seed `(file name, bytes)` is in `target`'s corpus with those bytes; with
/// `FUZZ_WRITE_CORPUS=1` writes them there instead.
pub fn check_seeds(target: &str, seeds: &[(String, Vec<u8>)]) {
    let dir = corpus_dir(target);
    let write = std::env::var_os("FUZZ_WRITE_CORPUS").is_some();
    if write {
        std::fs::create_dir_all(&dir).expect("create the corpus directory");
    }
    for (name, bytes) in seeds {
        let path = dir.join(name);
        if write {
            std::fs::write(&path, bytes).expect("write a seed");
            continue;
        }
        let held = std::fs::read(&path).unwrap_or_else(|e| {
            panic!(
                "seed {} is not in the corpus ({e}): run with FUZZ_WRITE_CORPUS=1 and commit it",
                path.display()
            )
        });
        assert!(
            held == *bytes,
            "seed {} differs from what the encoders make now: run with FUZZ_WRITE_CORPUS=1 and commit it",
            path.display()
        );
    }
}

/// A position in an input, as a fraction of its length (so it fits inputs of any length).
#[derive(Debug, Clone, Copy)]
struct Pos(u64);

impl Pos {
    /// The position in `0..len` (`len` > 0).
    fn index(self, len: usize) -> usize {
        ((len as u128 * self.0 as u128) >> 64) as usize
    }
}

fn pos() -> impl Strategy<Value = Pos> {
    any::<u64>().prop_map(Pos)
}

/// Seeds named `NAME.EXT` from `(NAME, bytes)` pairs.
pub fn named<'a>(
    ext: &str,
    list: impl IntoIterator<Item = (&'a str, Vec<u8>)>,
) -> Vec<(String, Vec<u8>)> {
    list.into_iter()
        .map(|(n, b)| (format!("{n}.{ext}"), b))
        .collect()
}

/// The `seeds_are_in_the_corpus` test of a target: each seed passes the target's `check` as
/// made, and is in the corpus ([`check_seeds`]).
pub fn check_seeds_pass(
    target: &str,
    seeds: &[(String, Vec<u8>)],
    check: impl Fn(&[u8]) -> Result<(), proptest::test_runner::TestCaseError>,
) {
    for (name, bytes) in seeds {
        check(bytes).unwrap_or_else(|e| panic!("seed {name}: {e}"));
    }
    check_seeds(target, seeds);
}

/// One change to an input.
#[derive(Debug, Clone)]
enum Mutation {
    FlipBit(Pos, u8),
    SetByte(Pos, u8),
    /// Writes a boundary value (0, 1, max, max-1, a power of two) of 1, 2, 4 or 8 bytes, big-
    /// or little-endian: lengths and counts are where decoders go wrong.
    Interesting(Pos, u8, u8, bool),
    Insert(Pos, Vec<u8>),
    Delete(Pos, usize),
    Cut(Pos),
    /// Replaces the tail from a point with the tail of another seed from another point.
    Splice(Pos, Pos, Pos),
    /// Repeats a run of the input in place.
    Repeat(Pos, usize, u8),
    /// Replaces a run of decimal digits with a boundary number written in decimal: JSON
    /// bodies carry their counts and sizes as text.
    Number(Pos, u8),
}

/// Boundary numbers as JSON text.
const NUMBERS: [&str; 10] = [
    "0",
    "1",
    "-1",
    "255",
    "4294967295",
    "4294967296",
    "18446744073709551615",
    "18446744073709551616",
    "1e400",
    "0.5",
];

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        3 => (pos(), 0u8..8).prop_map(|(i, b)| Mutation::FlipBit(i, b)),
        2 => (pos(), any::<u8>()).prop_map(|(i, v)| Mutation::SetByte(i, v)),
        2 => (pos(), 0u8..4, 0u8..8, any::<bool>())
            .prop_map(|(i, w, k, be)| Mutation::Interesting(i, w, k, be)),
        1 => (pos(), prop::collection::vec(any::<u8>(), 1..16))
            .prop_map(|(i, b)| Mutation::Insert(i, b)),
        1 => (pos(), 1usize..32).prop_map(|(i, n)| Mutation::Delete(i, n)),
        1 => pos().prop_map(Mutation::Cut),
        1 => (pos(), pos(), pos())
            .prop_map(|(a, s, b)| Mutation::Splice(a, s, b)),
        1 => (pos(), 1usize..64, 1u8..4).prop_map(|(i, n, k)| Mutation::Repeat(i, n, k)),
        2 => (pos(), 0..NUMBERS.len() as u8).prop_map(|(i, k)| Mutation::Number(i, k)),
    ]
}

fn interesting(width: u8, kind: u8, big_endian: bool) -> Vec<u8> {
    let bytes = 1usize << width;
    let bits = bytes * 8;
    let max = if bits == 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    };
    let v = match kind {
        0 => 0,
        1 => 1,
        2 => max,
        3 => max - 1,
        4 => max >> 1,
        5 => (max >> 1) + 1,
        6 => 1u64 << (bits / 2),
        _ => 4096.min(max),
    };
    let all = if big_endian {
        v.to_be_bytes()
    } else {
        v.to_le_bytes()
    };
    if big_endian {
        all[8 - bytes..].to_vec()
    } else {
        all[..bytes].to_vec()
    }
}

fn apply(mut v: Vec<u8>, m: &Mutation, seeds: &[Vec<u8>]) -> Vec<u8> {
    match m {
        Mutation::FlipBit(i, b) if !v.is_empty() => {
            let at = i.index(v.len());
            v[at] ^= 1 << b;
        }
        Mutation::SetByte(i, x) if !v.is_empty() => {
            let at = i.index(v.len());
            v[at] = *x;
        }
        Mutation::Interesting(i, w, k, be) if !v.is_empty() => {
            let val = interesting(*w, *k, *be);
            let at = i.index(v.len());
            let end = (at + val.len()).min(v.len());
            v[at..end].copy_from_slice(&val[..end - at]);
        }
        Mutation::Insert(i, b) => {
            let at = i.index(v.len() + 1);
            v.splice(at..at, b.iter().copied());
        }
        Mutation::Delete(i, n) if !v.is_empty() => {
            let at = i.index(v.len());
            let end = (at + n).min(v.len());
            v.drain(at..end);
        }
        Mutation::Cut(i) => v.truncate(i.index(v.len() + 1)),
        Mutation::Splice(a, s, b) => {
            let other = &seeds[s.index(seeds.len())];
            v.truncate(a.index(v.len() + 1));
            v.extend_from_slice(&other[b.index(other.len() + 1)..]);
        }
        Mutation::Repeat(i, n, k) if !v.is_empty() => {
            let at = i.index(v.len());
            let end = (at + n).min(v.len());
            let run = v[at..end].to_vec();
            for _ in 0..*k {
                v.splice(end..end, run.iter().copied());
            }
        }
        Mutation::Number(i, k) => {
            // The digit runs, one picked evenly whatever lies between them.
            let mut runs = Vec::new();
            let mut at = 0;
            while at < v.len() {
                let len = v[at..].iter().take_while(|b| b.is_ascii_digit()).count();
                if len > 0 {
                    runs.push((at, len));
                }
                at += len.max(1);
            }
            if !runs.is_empty() {
                let (start, len) = runs[i.index(runs.len())];
                v.splice(start..start + len, NUMBERS[*k as usize].bytes());
            }
        }
        _ => {}
    }
    v
}

/// Inputs for `target`: its corpus's seeds, each changed by up to eight mutations, or noise.
pub fn inputs(target: &str) -> BoxedStrategy<Vec<u8>> {
    let seeds = corpus(target);
    let mutated = {
        let seeds = seeds.clone();
        (pos(), prop::collection::vec(mutation(), 0..8)).prop_map(move |(pick, ms)| {
            let start = seeds[pick.index(seeds.len())].clone();
            ms.iter().fold(start, |v, m| apply(v, m, &seeds))
        })
    };
    prop_oneof![
        7 => mutated,
        1 => prop::collection::vec(any::<u8>(), 0..512),
    ]
    .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interesting_values_have_their_width_and_order() {
        assert_eq!(interesting(1, 2, true), vec![0xff, 0xff]);
        assert_eq!(interesting(2, 1, true), vec![0, 0, 0, 1]);
        assert_eq!(interesting(2, 1, false), vec![1, 0, 0, 0]);
        assert_eq!(interesting(3, 5, true), (1u64 << 63).to_be_bytes().to_vec());
        assert_eq!(interesting(0, 7, true), vec![0xff]);
    }

    #[test]
    fn mutations_stay_in_bounds_of_any_input() {
        let seeds = vec![vec![], vec![1, 2, 3], vec![9; 40]];
        let ms = [
            Mutation::FlipBit(Pos(u64::MAX), 7),
            Mutation::Interesting(Pos(u64::MAX), 3, 2, false),
            Mutation::Delete(Pos(0), 1000),
            Mutation::Splice(Pos(5), Pos(2), Pos(7)),
            Mutation::Repeat(Pos(1), 10, 3),
            Mutation::Cut(Pos(0)),
        ];
        for s in &seeds {
            for m in &ms {
                let _ = apply(s.clone(), m, &seeds);
            }
        }
        assert_eq!(
            apply(vec![1, 2, 3], &Mutation::Repeat(Pos(0), 2, 1), &seeds),
            vec![1, 2, 1, 2, 3]
        );
        assert_eq!(
            apply(
                br#"{"a":128}"#.to_vec(),
                &Mutation::Number(Pos(0), 4),
                &seeds
            ),
            br#"{"a":4294967295}"#.to_vec()
        );
    }
}
