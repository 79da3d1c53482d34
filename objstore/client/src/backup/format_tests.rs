use super::*;
use proptest::prelude::*;

const MIB: u64 = 1 << 20;

fn header(incremental: bool) -> Header {
    Header {
        object_size: MIB as u32,
        size: 8 * MIB,
        from_size: if incremental { 8 * MIB } else { 0 },
        from_time: if incremental { 1_700_000_000 } else { 0 },
        to_time: 1_700_000_060,
        name: "disk".into(),
        from_tag: incremental.then(|| "s1".to_string()),
        to_tag: "s2".into(),
    }
}

fn records() -> Vec<Record> {
    vec![
        Record::Data {
            offset: 4096,
            data: Bytes::from_static(b"hello"),
        },
        Record::Zero {
            offset: MIB,
            len: 2 * MIB,
        },
        Record::Data {
            offset: 5 * MIB,
            data: Bytes::from(vec![7u8; 4096]),
        },
    ]
}

#[test]
fn header_bytes_field_by_field() {
    let b = header(true).encode();
    assert_eq!(&b[0..8], b"DOGDELTA", "magic");
    assert_eq!(&b[8..10], &[0, 1], "version 1");
    assert_eq!(&b[10..12], &[0, 1], "flags: incremental");
    assert_eq!(&b[12..16], &[0, 0x10, 0, 0], "object size 1 MiB");
    assert_eq!(&b[16..24], &(8 * MIB).to_be_bytes(), "TO's size");
    assert_eq!(&b[24..32], &(8 * MIB).to_be_bytes(), "FROM's size");
    assert_eq!(&b[32..40], &1_700_000_000u64.to_be_bytes(), "FROM's time");
    assert_eq!(&b[40..48], &1_700_000_060u64.to_be_bytes(), "TO's time");
    assert_eq!(&b[48..54], b"\0\x04disk", "name");
    assert_eq!(&b[54..58], b"\0\x02s1", "FROM's tag");
    assert_eq!(&b[58..62], b"\0\x02s2", "TO's tag");
    assert_eq!(
        &b[62..66],
        &crc_fast::crc32_iscsi(&b[..62]).to_be_bytes(),
        "crc"
    );
    assert_eq!(b.len(), 66);
    let full = header(false).encode();
    assert_eq!(&full[10..12], &[0, 0], "flags: full");
    assert_eq!(&full[54..56], &[0, 0], "no FROM tag");
}

#[test]
fn record_and_trailer_bytes_field_by_field() {
    let h = header(false);
    let rec = Record::Data {
        offset: 4096,
        data: Bytes::from_static(b"hi"),
    };
    let b = encode_all(&h, std::slice::from_ref(&rec)).unwrap();
    let r = &b[h.encode().len()..];
    assert_eq!(r[0], b'D');
    assert_eq!(&r[1..9], &4096u64.to_be_bytes());
    assert_eq!(&r[9..17], &2u64.to_be_bytes());
    assert_eq!(&r[17..19], b"hi");
    assert_eq!(&r[19..23], &crc_fast::crc32_iscsi(&r[..19]).to_be_bytes());
    let t = &r[23..];
    assert_eq!(t[0], b'E');
    assert_eq!(&t[1..9], &1u64.to_be_bytes(), "one record");
    assert_eq!(&t[9..17], &2u64.to_be_bytes(), "two data bytes");
    assert_eq!(
        &t[17..21],
        &crc_fast::crc32_iscsi(&b[..b.len() - 4]).to_be_bytes(),
        "stream crc"
    );
    assert_eq!(t.len(), 21);
}

#[test]
fn round_trip() {
    for inc in [false, true] {
        let b = encode_all(&header(inc), &records()).unwrap();
        let (h, recs, sum) = decode_all(&b).unwrap();
        assert_eq!(h, header(inc));
        assert_eq!(recs, records());
        assert_eq!(sum.records, 3);
        assert_eq!(sum.data_bytes, 5 + 4096);
        assert_eq!(sum.zero_bytes, 2 * MIB);
        assert_eq!(sum.stream_bytes, b.len() as u64);
    }
}

#[test]
fn every_cut_is_refused_as_truncated_at_its_length() {
    let b = encode_all(&header(true), &records()).unwrap();
    for n in 0..b.len() {
        let e = decode_all(&b[..n]).unwrap_err();
        assert!(
            matches!(e.kind, DeltaErrorKind::Truncated(_)),
            "cut at {n}: {e}"
        );
        assert_eq!(e.at, n as u64, "cut at {n}: {e}");
    }
}

#[test]
fn every_flipped_bit_is_refused() {
    let b = encode_all(&header(true), &records()).unwrap();
    for i in 0..b.len() {
        for bit in [0, 3, 7] {
            let mut c = b.clone();
            c[i] ^= 1 << bit;
            assert!(decode_all(&c).is_err(), "flip bit {bit} of byte {i}");
        }
    }
}

#[test]
fn errors_name_where() {
    let h = header(true);
    let mut b = encode_all(&h, &records()).unwrap();
    let at = h.encode().len() + (RECORD_HEAD + 5 + 4) + (RECORD_HEAD + 4) + RECORD_HEAD; // 3rd record's data
    b[at + 1] ^= 1;
    let e = decode_all(&b).unwrap_err();
    assert_eq!(e.record, Some(3), "{e}");
    assert!(
        e.to_string().contains("record 3") && e.to_string().contains("checksum"),
        "{e}"
    );

    let e = decode_all(b"not a delta at all").unwrap_err();
    assert!(matches!(e.kind, DeltaErrorKind::NotDelta), "{e}");
    let mut v2 = header(false).encode();
    v2[9] = 2;
    let e = decode_all(&v2).unwrap_err();
    assert!(e.to_string().contains("version 2 is not supported"), "{e}");

    let mut extra = encode_all(&h, &records()).unwrap();
    extra.push(0);
    let e = decode_all(&extra).unwrap_err();
    assert!(e.to_string().contains("after the end"), "{e}");
}

#[test]
fn writer_refuses_bad_records() {
    let h = header(false);
    let mut out = Vec::new();
    let mut w = DeltaWriter::new(&mut out, &h).unwrap();
    let bad = [
        Record::Zero { offset: 0, len: 0 },
        Record::Zero {
            offset: 8 * MIB - 1,
            len: 2,
        },
        Record::Data {
            offset: MIB - 1,
            data: Bytes::from_static(b"ab"),
        },
        Record::Zero {
            offset: u64::MAX,
            len: 2,
        },
    ];
    for r in &bad {
        assert!(w.record(r).is_err(), "{r:?}");
    }
    w.record(&Record::Zero {
        offset: MIB,
        len: 1,
    })
    .unwrap();
    assert!(w
        .record(&Record::Zero {
            offset: MIB,
            len: 1
        })
        .is_err());
    let mut bad_header = h.clone();
    bad_header.object_size = 3 << 20;
    assert!(DeltaWriter::new(Vec::new(), &bad_header).is_err());
    bad_header = h;
    bad_header.name = "a/b".into();
    assert!(DeltaWriter::new(Vec::new(), &bad_header).is_err());
}

proptest! {
    #[test]
    fn any_records_round_trip(parts in prop::collection::vec((0u64..64 * 1024, 1u64..70_000, any::<bool>()), 0..20)) {
        let mut h = header(true);
        h.size = 64 * MIB;
        let mut recs = Vec::new();
        let mut pos = 0u64;
        for (gap, len, data) in parts {
            let offset = pos + gap;
            let len = if data { len.min(MIB - offset % MIB) } else { len };
            if offset + len > h.size {
                break;
            }
            recs.push(if data {
                Record::Data { offset, data: Bytes::from(vec![(offset % 251) as u8; len as usize]) }
            } else {
                Record::Zero { offset, len }
            });
            pos = offset + len;
        }
        let b = encode_all(&h, &recs).unwrap();
        let (h2, r2, s) = decode_all(&b).unwrap();
        prop_assert_eq!(h2, h);
        prop_assert_eq!(r2, recs);
        prop_assert_eq!(s.stream_bytes, b.len() as u64);
    }

    #[test]
    fn noise_never_panics(b in prop::collection::vec(any::<u8>(), 0..256)) {
        let mut with_magic = MAGIC.to_vec();
        with_magic.extend_from_slice(&b);
        let _ = decode_all(&b);
        let _ = decode_all(&with_magic);
    }
}

#[test]
fn crc_append_is_the_crc_of_the_bytes_joined() {
    let b: Vec<u8> = (0..10_000u32).map(|i| (i * 7 + i / 13) as u8).collect();
    let whole = crc_fast::crc32_iscsi(&b);
    for cut in [0, 1, 9, 4096, 5000, b.len()] {
        let (x, y) = b.split_at(cut);
        assert_eq!(
            crc_append(crc_fast::crc32_iscsi(x), y),
            whole,
            "cut at {cut}"
        );
    }
    assert_eq!(crc_append(0, b"123456789"), 0xe306_9283);
}
