//! Fuzz target `deltas`: the stream `dog vdi restore` reads (docs/backup.md), decoded from a
//! slice and from a reader that hands out one byte at a time. See the crate documentation.
//!
//! What must hold: no panic and no allocation beyond what was read; both readers agree; an
//! error names a byte inside the input (a cut names its end); a stream that decodes has its
//! records in order, inside the VDI, data records inside one object, and encodes back to
//! exactly its bytes.

use std::io::Read;

use bytes::Bytes;
use fuzz_targets::{config, inputs};
use objstore_client::backup::format::{decode_all, encode_all, DeltaErrorKind, DeltaReader};
use objstore_client::backup::{Header, Record};
use proptest::prelude::*;

const TARGET: &str = "deltas";
const MIB: u64 = 1 << 20;

/// A reader that returns at most one byte per call.
struct OneByte<'a>(&'a [u8]);

impl Read for OneByte<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match (self.0.split_first(), buf.is_empty()) {
            (Some((b, rest)), false) => {
                buf[0] = *b;
                self.0 = rest;
                Ok(1)
            }
            _ => Ok(0),
        }
    }
}

fn decode_slow(bytes: &[u8]) -> Result<Vec<Record>, (u64, Option<u64>)> {
    let mut r = DeltaReader::new(OneByte(bytes)).map_err(|e| (e.at, e.record))?;
    let mut out = Vec::new();
    while let Some(rec) = r.next().map_err(|e| (e.at, e.record))? {
        out.push(rec);
    }
    Ok(out)
}

fn check(bytes: &[u8]) -> Result<(), TestCaseError> {
    let fast = decode_all(bytes);
    let slow = decode_slow(bytes);
    match fast {
        Ok((h, recs, sum)) => {
            prop_assert_eq!(slow.as_ref().ok(), Some(&recs), "both readers decode it");
            prop_assert_eq!(sum.stream_bytes, bytes.len() as u64);
            let os = h.object_size as u64;
            let mut end = 0;
            for r in &recs {
                prop_assert!(!r.is_empty() && r.offset() >= end && r.end() <= h.size);
                if let Record::Data { .. } = r {
                    prop_assert_eq!(r.offset() / os, (r.end() - 1) / os);
                }
                end = r.end();
            }
            prop_assert_eq!(&encode_all(&h, &recs).unwrap()[..], bytes, "re-encodes");
        }
        Err(e) => {
            prop_assert_eq!(
                slow.err(),
                Some((e.at, e.record)),
                "both readers refuse it: {}",
                e
            );
            prop_assert!(e.at <= bytes.len() as u64, "{}", e);
            if let DeltaErrorKind::Truncated(_) = e.kind {
                prop_assert_eq!(e.at, bytes.len() as u64, "a cut names its end: {}", e);
            }
            prop_assert!(!e.to_string().is_empty());
        }
    }
    Ok(())
}

fn header(from: Option<&str>, name: &str, size: u64) -> Header {
    Header {
        object_size: MIB as u32,
        size,
        from_size: if from.is_some() { size / 2 } else { 0 },
        from_time: if from.is_some() { 1_700_000_000 } else { 0 },
        to_time: 1_700_000_100,
        name: name.into(),
        from_tag: from.map(str::to_string),
        to_tag: "s2".into(),
    }
}

fn seeds() -> Vec<(String, Vec<u8>)> {
    let data = |offset: u64, b: &'static [u8]| Record::Data {
        offset,
        data: Bytes::from_static(b),
    };
    let zero = |offset: u64, len: u64| Record::Zero { offset, len };
    let list: Vec<(&str, Header, Vec<Record>)> = vec![
        ("empty-full", header(None, "disk", 8 * MIB), vec![]),
        (
            "full",
            header(None, "disk", 8 * MIB),
            vec![data(0, b"boot"), data(MIB - 3, b"end"), data(3 * MIB, b"x")],
        ),
        (
            "incremental",
            header(Some("s1"), "vm-disk0", 16 * MIB),
            vec![
                data(4096, b"changed block"),
                zero(MIB, 2 * MIB),
                data(5 * MIB + 8192, b"4k"),
                zero(9 * MIB + 65536, 65536),
            ],
        ),
        (
            "tail",
            header(Some("2026-01-01-00-00-00"), "n", 2 * MIB + 100),
            vec![zero(0, MIB), data(2 * MIB + 90, b"0123456789")],
        ),
    ];
    fuzz_targets::named(
        "delta",
        list.into_iter()
            .map(|(n, h, r)| (n, encode_all(&h, &r).expect("a valid seed"))),
    )
}

#[test]
fn seeds_are_in_the_corpus() {
    fuzz_targets::check_seeds_pass(TARGET, &seeds(), |b| {
        prop_assert!(decode_all(b).is_ok(), "a seed decodes");
        check(b)
    });
}

proptest! {
    #![proptest_config(config())]
    #[test]
    fn deltas(bytes in inputs(TARGET)) {
        check(&bytes)?;
    }
}
