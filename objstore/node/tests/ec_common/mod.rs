//! Helpers of the one-process tests of erasure-coded objects (`ec.rs`, `ec_stale.rs`).

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use objstore_client::Client;
use objstore_node::store::ObjectBackend;
use objstore_node::testing::MemCluster;
use objstore_proto::ec::Codec;
use objstore_proto::redundancy::Redundancy;
use objstore_proto::{ObjIndex, ObjectId, Vid};

pub const MIB: u64 = 1 << 20;

pub fn oid(i: u32) -> ObjectId {
    ObjectId::data(Vid(9), ObjIndex(i))
}

/// How many times node `i` counted `name` (with `labels`).
pub fn counted(c: &MemCluster, i: usize, name: &str, labels: &[(&str, &str)]) -> u64 {
    let r = c.node(i).expect("up").metrics().registry();
    r.counter(name, "", labels).get()
}

/// `n` nodes formatted with 3 copies and 1 MiB objects, a runtime, and a client on it.
pub fn cluster(n: usize) -> (MemCluster, tokio::runtime::Runtime, Arc<Client>) {
    let c = MemCluster::start(n).expect("start");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let cl = c.client_on(&rt, Duration::from_secs(20));
    rt.block_on(cl.format(3, None, MIB)).unwrap();
    (c, rt, cl)
}

/// Node indexes holding strip 0.. of `oid`, in node `from`'s view.
pub fn holders(c: &MemCluster, from: usize, oid: ObjectId, strips: usize) -> Vec<usize> {
    let ep = c.node(from).expect("up").epoch();
    (0..strips)
        .map(|k| {
            let n = &ep.ring.nodes()[ep.ring.strip_holder(oid, k).unwrap()];
            (0..64).find(|&i| c.addr(i) == n.addr).unwrap()
        })
        .collect()
}

/// Every strip of `oid` (of `scheme`) on its holder, at one version, with parity that
/// matches the data.
pub fn assert_consistent(c: &MemCluster, from: usize, oid: ObjectId, scheme: Redundancy) {
    let codec = Codec::new(scheme, MIB).unwrap();
    let x = codec.data();
    let mut strips = Vec::new();
    let mut versions = Vec::new();
    for (k, &i) in holders(c, from, oid, codec.strips()).iter().enumerate() {
        let (mut bytes, st) = c.store(i).read_whole(oid.strip(k)).expect("strip held");
        bytes.resize(codec.strip_len(), 0);
        strips.push(bytes);
        versions.push(st.version);
    }
    assert!(
        versions.windows(2).all(|w| w[0] == w[1]),
        "{oid}: {versions:?}"
    );
    let parity = codec.parity_of(&strips[..x]).unwrap();
    assert_eq!(
        parity[..],
        strips[x..],
        "{oid}: parity does not match the data"
    );
}

/// Waits (up to 20 s) until [`assert_consistent`] holds.
pub fn wait_consistent(c: &MemCluster, from: usize, oid: ObjectId, scheme: Redundancy) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            assert_consistent(c, from, oid, scheme)
        }));
        if ok.is_ok() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{oid} never made whole"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
