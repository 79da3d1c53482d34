//! Issue 25, checksums, in one process (memory stores, an in-memory network): a copy whose
//! bytes no longer match their checksums is never served; the client reads another replica,
//! and the node restores the bad copy from a good one in the background. A bad copy is never
//! the source another node copies.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use objstore_client::conn::Conn;
use objstore_client::Client;
use objstore_node::store::sums::{self, BLOCK};
use objstore_node::store::{FileStore, MemStore, ObjectBackend, StoreError, Version};
use objstore_node::testing::MemCluster;
use objstore_proto::frame::{Header, Opcode, ResultCode};
use objstore_proto::payload::peer_write_prefix;
use objstore_proto::{ObjIndex, ObjectId, Vid};

const MIB: u64 = 1 << 20;

fn oid(i: u32) -> ObjectId {
    ObjectId::data(Vid(9), ObjIndex(i))
}

fn bytes_of(i: u32) -> Vec<u8> {
    (0..3 * 4096 + 123)
        .map(|k| (k as u32).wrapping_mul(31).wrapping_add(i) as u8)
        .collect()
}

/// Node index of the first replica a client asks for `oid` (the ring's first owner).
fn first_owner(c: &MemCluster, o: ObjectId) -> usize {
    let ep = c.node(0).unwrap().epoch();
    let first = ep.ring.replicas(o, 3)[0].addr;
    (0..3).find(|&i| c.addr(i) == first).unwrap()
}

fn wait_until(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn setup(n: u32) -> (MemCluster, tokio::runtime::Runtime, Arc<Client>) {
    let c = MemCluster::start(3).expect("start");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let cl = c.client_on(&rt, Duration::from_secs(10));
    rt.block_on(cl.format(3, None, MIB)).unwrap();
    for i in 0..n {
        rt.block_on(cl.write_obj(oid(i), 0, Bytes::from(bytes_of(i))))
            .unwrap();
    }
    rt.block_on(cl.flush()).unwrap();
    (c, rt, cl)
}

/// One flipped byte in each of 20 objects, on the replica every read asks first: every read
/// returns the right bytes, and every bad copy is restored from another replica.
#[test]
fn a_corrupt_copy_is_never_read_and_is_restored() {
    let (c, rt, cl) = setup(20);
    let mut bad = Vec::new();
    for i in 0..20 {
        let o = oid(i);
        let n = first_owner(&c, o);
        assert!(c.store(n).corrupt(o, 4096 + i as usize * 7));
        bad.push((n, o, i));
    }
    for &(_, o, i) in &bad {
        let got = rt
            .block_on(cl.read_obj(o, 0, bytes_of(i).len() as u32))
            .unwrap();
        assert!(got[..] == bytes_of(i)[..], "object {o} read wrong bytes");
    }
    for &(n, o, i) in &bad {
        wait_until(&format!("node {n}'s copy of {o} is restored"), || {
            c.store(n)
                .read_whole(o)
                .is_ok_and(|(d, _)| d == bytes_of(i))
        });
    }
    for &(_, o, _) in &bad {
        assert_eq!(c.replicas_agree(o), 3, "{o}");
    }
}

/// A node that comes back behind pulls the object from the others; the copy on one of them
/// is corrupt: the pull never takes it (its `PeerRead` fails, the puller takes the other
/// source), and the corrupt copy found that way is restored too.
#[test]
fn a_node_recovering_never_takes_a_corrupt_copy() {
    let (mut c, rt, cl) = setup(4);
    let o = oid(1);
    let ep = c.node(0).unwrap().epoch();
    let owners: Vec<usize> = ep
        .ring
        .replicas(o, 3)
        .iter()
        .map(|n| (0..3).find(|&i| c.addr(i) == n.addr).unwrap())
        .collect();
    let (behind, corrupt) = (owners[2], owners[1]);
    c.kill(behind);
    let fresh: Vec<u8> = bytes_of(1).iter().map(|b| b ^ 0x5a).collect();
    rt.block_on(cl.write_obj(o, 0, Bytes::from(fresh.clone())))
        .unwrap();
    rt.block_on(cl.flush()).unwrap();
    // Flipped in every block, so that whatever the puller reads of it is bad.
    for at in [1, 4096 + 2, 2 * 4096 + 3, 3 * 4096 + 4] {
        assert!(c.store(corrupt).corrupt(o, at));
    }
    c.start_node(behind).unwrap();
    wait_until("the node back has the fresh copy", || {
        c.store(behind).read_whole(o).is_ok_and(|(d, _)| d == fresh)
    });
    c.wait_recovered();
    let got = rt.block_on(cl.read_obj(o, 0, fresh.len() as u32)).unwrap();
    assert!(got[..] == fresh[..]);
    // Whether the puller tried the corrupt copy first or not, no node holds bad bytes that it
    // would serve: the corrupt copy is either still refused or restored.
    for n in 0..3 {
        match c.store(n).read_whole(o) {
            Ok((d, _)) => assert!(d == fresh, "node {n} serves bad bytes"),
            Err(StoreError::Corrupt { .. }) => assert_eq!(n, corrupt),
            Err(e) => panic!("node {n}: {e}"),
        }
    }
}

/// The sums a primary sends with a write of whole blocks (`PeerWrite`'s `aux`) are kept as
/// given by both backends, for a new object and for one written in place: bytes damaged after
/// the primary summed them fail their check on read instead of being blessed with fresh sums.
/// Sums that do not fit the write (not whole blocks, not one a block) are ignored.
#[test]
fn sums_a_primary_sends_are_kept_as_given_so_bytes_damaged_on_the_way_are_found() {
    let dir = tempfile::tempdir().unwrap();
    let file = FileStore::open(dir.path()).unwrap();
    let mem = MemStore::new(1 << 30);
    let stores: [(&str, &dyn ObjectBackend); 2] = [("file", &file), ("mem", &mem)];
    for (name, s) in stores {
        let (a, b, c) = (oid(1), oid(2), oid(3));
        // Right sums: read back whole, new object and in place.
        let two = [1u8; 2 * BLOCK];
        s.write(a, 0, &two, Some(&sums::sums_of(&two)), Version(1))
            .unwrap();
        let one = [2u8; BLOCK];
        s.write(
            a,
            BLOCK as u64,
            &one,
            Some(&sums::sums_of(&one)),
            Version(2),
        )
        .unwrap();
        let (got, _) = s.read_whole(a).unwrap();
        assert!(
            got[..BLOCK] == two[..BLOCK] && got[BLOCK..] == one[..],
            "{name}"
        );
        // Sums of other bytes (the bytes changed on the way): the block is bad here.
        s.write(b, 0, &two, Some(&[sums::sum(&[1u8; BLOCK]), 7]), Version(1))
            .unwrap();
        assert_eq!(s.read(b, 0, BLOCK).unwrap(), [1u8; BLOCK], "{name}");
        assert!(
            matches!(
                s.read(b, BLOCK as u64, 1),
                Err(StoreError::Corrupt { block: 1, .. })
            ),
            "{name}"
        );
        s.write(a, 0, &one, Some(&[99]), Version(3)).unwrap();
        assert!(
            matches!(s.read(a, 0, 1), Err(StoreError::Corrupt { block: 0, .. })),
            "{name}"
        );
        // Sums that cannot be the write's are not used: the store sums the bytes itself.
        s.write(c, 512, &two, Some(&[5, 6]), Version(1)).unwrap();
        s.write(c, 0, &one, Some(&[5, 6]), Version(2)).unwrap();
        assert_eq!(s.read(c, 0, BLOCK).unwrap(), one, "{name}");
        assert_eq!(s.read(c, BLOCK as u64 + 512, 1).unwrap(), [1], "{name}");
    }
}

/// A `PeerWrite` whose block sums cannot be the write's is refused with a message that says
/// why, and nothing is written.
#[test]
fn a_peer_write_with_sums_that_do_not_fit_is_refused() {
    let (c, rt, _cl) = setup(1);
    let o = oid(0);
    let replica = {
        let ep = c.node(0).unwrap().epoch();
        let a = ep.ring.replicas(o, 3)[1].addr;
        (0..3).find(|&i| c.addr(i) == a).unwrap()
    };
    let before = c.store(replica).read_whole(o).unwrap();
    let epoch = c.epoch(0).unwrap();
    let (v, next) = (before.1.version, Version(before.1.version.0 + 1));
    // (offset, length, sums): not block-aligned, not whole blocks, one sum short.
    for (offset, length, sums) in [
        (512, BLOCK, vec![1]),
        (0, 100, vec![1]),
        (0, 2 * BLOCK, vec![1]),
    ] {
        let frame = rt.block_on(async {
            let conn = Conn::connect_via(&c.net, c.addr(replica), Duration::from_secs(5))
                .await
                .unwrap();
            let mut h = Header::request(Opcode::PeerWrite, 0, epoch);
            (h.oid, h.offset, h.length, h.aux) = (o.0, offset, length as u32, sums.len() as u32);
            conn.call_with_prefix(
                h,
                peer_write_prefix(v, next, &sums),
                Bytes::from(vec![0xee; length]),
                Duration::from_secs(5),
            )
            .await
            .unwrap()
        });
        assert_eq!(frame.header.result_code(), ResultCode::InvalidRequest);
        assert!(frame.message().contains("block sum"), "{}", frame.message());
        assert!(c.store(replica).read_whole(o).unwrap() == before);
    }
}
