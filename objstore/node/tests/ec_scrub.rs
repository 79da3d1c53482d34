//! The background scrub over erasure-coded objects, in one process (memory stores, an in-memory
//! network; passes run on demand with `MemCluster::scrub`): a strip whose block fails its
//! checksum is found by its holder's pass and rebuilt by the stripe's primary; a parity strip
//! whose bytes are wrong under valid checksums is found only by the primary's pass, by parity,
//! and rebuilt; a node holding two strips of one object counts a bad one once; with one parity
//! strip a mismatch is reported, never "repaired" from the wrong strip; tombstones are skipped.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use objstore_client::Client;
use objstore_node::store::ObjectBackend;
use objstore_node::testing::MemCluster;
use objstore_proto::api::{EcCheckReport, ScrubPass};
use objstore_proto::ec::Codec;
use objstore_proto::redundancy::Redundancy;
use objstore_proto::{ObjIndex, ObjectId, Vid};

const MIB: u64 = 1 << 20;
const EC42: Redundancy = Redundancy::Ec { data: 4, parity: 2 };
const EC21: Redundancy = Redundancy::Ec { data: 2, parity: 1 };

fn oid(i: u32) -> ObjectId {
    ObjectId::data(Vid(7), ObjIndex(i))
}

/// `n` nodes, formatted (1 MiB objects), a runtime and a client, and object `o` of `scheme`
/// written whole and flushed; returns its bytes too.
fn cluster_with(
    n: usize,
    o: ObjectId,
    scheme: Redundancy,
) -> (MemCluster, tokio::runtime::Runtime, Arc<Client>, Vec<u8>) {
    let c = MemCluster::start(n).expect("start");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let cl = c.client_on(&rt, Duration::from_secs(20));
    rt.block_on(cl.format(3, None, MIB)).unwrap();
    let data: Vec<u8> = (0..MIB as usize).map(|i| (i * 13 % 251) as u8).collect();
    rt.block_on(cl.ec_write_obj(o, scheme, 0, Bytes::from(data.clone())))
        .unwrap();
    rt.block_on(cl.flush()).unwrap();
    c.wait_recovered();
    (c, rt, cl, data)
}

/// Node indexes holding strips 0.. of `o`, in node 0's view.
fn holders(c: &MemCluster, o: ObjectId, strips: usize) -> Vec<usize> {
    let ep = c.node(0).expect("up").epoch();
    (0..strips)
        .map(|k| {
            let n = &ep.ring.nodes()[ep.ring.strip_holder(o, k).unwrap()];
            (0..64).find(|&i| c.addr(i) == n.addr).unwrap()
        })
        .collect()
}

/// Strip `k` of `o` as its holder `i` stores it, padded to the strip's length.
fn strip_here(c: &MemCluster, i: usize, o: ObjectId, k: usize, codec: &Codec) -> Vec<u8> {
    let (mut b, _) = c.store(i).read_whole(o.strip(k)).expect("strip readable");
    b.resize(codec.strip_len(), 0);
    b
}

/// Every strip of `o` on its holder reads back as `data`'s.
fn assert_strips(c: &MemCluster, o: ObjectId, scheme: Redundancy, data: &[u8]) {
    let codec = Codec::new(scheme, MIB).unwrap();
    let want = codec.encode(data);
    for (k, &i) in holders(c, o, want.len()).iter().enumerate() {
        assert!(
            strip_here(c, i, o, k, &codec) == want[k],
            "strip {k} of {o} on node {i} is not the stripe's"
        );
    }
}

fn pass_of(c: &MemCluster, i: usize) -> ScrubPass {
    c.scrub(i)
        .unwrap_or_else(|| panic!("node {i} stopped during its pass"))
}

fn counts(p: &ScrubPass) -> (u64, u64, u64, u64) {
    (p.objects, p.bad, p.repaired, p.unrecoverable)
}

/// A check by the primary, without repair.
fn dry_check(
    rt: &tokio::runtime::Runtime,
    cl: &Client,
    o: ObjectId,
    s: Redundancy,
) -> EcCheckReport {
    rt.block_on(cl.ec_check_obj(o, s, false)).unwrap()
}

/// A byte of data strip 1 flipped on its holder (not the primary): the holder's own pass finds
/// it by its checksum, asks the primary, and the strip is rebuilt; the pass counts it bad
/// once and repaired once.
#[test]
fn a_flipped_data_strip_is_found_by_its_holder_and_rebuilt_by_the_primary() {
    let o = oid(1);
    let (c, rt, cl, data) = cluster_with(6, o, EC42);
    let hs = holders(&c, o, 6);
    assert_ne!(hs[1], hs[0], "six nodes: strip 1 is not on the primary");
    assert!(c.store(hs[1]).corrupt(o.strip(1), 5000));

    let p = pass_of(&c, hs[1]);
    assert_eq!(
        counts(&p),
        (1, 1, 1, 0),
        "objects, bad, repaired, unrecoverable: {p:?}"
    );
    assert_strips(&c, o, EC42, &data);
    let r = dry_check(&rt, &cl, o, EC42);
    assert!(r.bad.is_empty() && r.unrecoverable.is_none(), "{r:?}");
    // The holder's next pass, and the primary's, find nothing.
    assert_eq!(counts(&pass_of(&c, hs[1])), (1, 0, 0, 0));
    let p = pass_of(&c, hs[0]);
    assert_eq!(counts(&p), (1, 0, 0, 0), "{p:?}");
    let codec = Codec::new(EC42, MIB).unwrap();
    assert_eq!(
        p.bytes,
        6 * codec.strip_len() as u64,
        "the primary's pass reads every strip"
    );
    let st = c.node(hs[1]).unwrap().scrub_status();
    assert_eq!(
        (st.bad_total, st.repaired_total, st.passes),
        (1, 1, 2),
        "{st:?}"
    );
}

/// Parity strip 5's bytes changed with their checksums: its holder's pass sees nothing wrong;
/// the primary's pass finds it by parity and rebuilds it.
#[test]
fn a_parity_strip_wrong_under_good_checksums_is_found_by_the_primary_and_rebuilt() {
    let o = oid(2);
    let (c, rt, cl, data) = cluster_with(6, o, EC42);
    let hs = holders(&c, o, 6);
    assert!(c
        .store(hs[5])
        .rewrite(o.strip(5), 70_000, b"not the parity"));

    let p = pass_of(&c, hs[5]);
    assert_eq!(counts(&p), (1, 0, 0, 0), "checksums pass: {p:?}");
    let r = dry_check(&rt, &cl, o, EC42);
    assert_eq!(r.bad.len(), 1, "{r:?}");
    assert_eq!((r.bad[0].strip, r.bad[0].repaired), (5, false), "{r:?}");
    assert!(r.bad[0].problem.contains("disagree"), "{r:?}");

    let p = pass_of(&c, hs[0]);
    assert_eq!(counts(&p), (1, 1, 1, 0), "{p:?}");
    assert_strips(&c, o, EC42, &data);
    let r = dry_check(&rt, &cl, o, EC42);
    assert!(r.bad.is_empty() && r.unrecoverable.is_none(), "{r:?}");
    let got = rt.block_on(cl.ec_read_obj(o, EC42, 0, MIB as u32)).unwrap();
    assert!(got[..] == data[..]);
}

/// Three nodes, six strips: each node holds two strips of the object. A bad parity strip on a
/// node that is not the primary is rebuilt at its request; a bad data strip on the primary
/// is found by its own stripe check, and counted once though the node holds two strips.
#[test]
fn with_fewer_nodes_than_strips_a_bad_strip_is_counted_once() {
    let o = oid(3);
    let (c, _rt, _cl, data) = cluster_with(3, o, EC42);
    let hs = holders(&c, o, 6);
    assert_eq!(
        (hs[3], hs[4]),
        (hs[0], hs[1]),
        "strips 3 and 4 wrap around: {hs:?}"
    );

    assert!(c.store(hs[4]).corrupt(o.strip(4), 100));
    let p = pass_of(&c, hs[4]);
    assert_eq!(counts(&p), (2, 1, 1, 0), "strips 1 and 4 here: {p:?}");
    assert_strips(&c, o, EC42, &data);

    assert!(c.store(hs[3]).corrupt(o.strip(3), 200_000));
    let p = pass_of(&c, hs[0]);
    assert_eq!(counts(&p), (2, 1, 1, 0), "strips 0 and 3 here: {p:?}");
    assert_strips(&c, o, EC42, &data);
}

/// 2:1: parity that does not match names no strip (any of the three could be wrong), so the
/// primary's pass reports the object unrecoverable and rebuilds nothing; once removed, the
/// object's tombstones are skipped by every pass.
#[test]
fn one_parity_strip_reports_a_mismatch_and_tombstones_are_skipped() {
    let o = oid(4);
    let (c, rt, cl, data) = cluster_with(3, o, EC21);
    let hs = holders(&c, o, 3);
    let codec = Codec::new(EC21, MIB).unwrap();
    let strip0 = strip_here(&c, hs[0], o, 0, &codec);
    assert!(c.store(hs[2]).rewrite(o.strip(2), 10, b"wrong"));

    let p = pass_of(&c, hs[0]);
    assert_eq!(counts(&p), (1, 0, 0, 1), "{p:?}");
    assert!(
        strip_here(&c, hs[0], o, 0, &codec) == strip0,
        "a data strip was rebuilt from the wrong parity"
    );
    let got = rt.block_on(cl.ec_read_obj(o, EC21, 0, MIB as u32)).unwrap();
    assert!(got[..] == data[..], "the data strips still read right");
    let r = dry_check(&rt, &cl, o, EC21);
    assert!(
        r.unrecoverable
            .as_deref()
            .is_some_and(|u| u.contains("1 parity strip")),
        "{r:?}"
    );

    rt.block_on(cl.ec_remove_obj(o, EC21)).unwrap();
    for i in 0..3 {
        let p = pass_of(&c, i);
        assert_eq!(counts(&p), (0, 0, 0, 0), "node {i}: {p:?}");
    }
}
