//! Copy-on-write done by the nodes (`CowWrite`, issue 26), with real `sheep` processes: the
//! first write to an object shared with an ancestor makes the VDI's own object, on every owner,
//! without the object passing through the client: a partial target holding the blocks written
//! and reading the others from the source (copied whole only from a source partial itself);
//! the source never changes; a target that exists takes the write as a plain write; a
//! missing source is an error and creates nothing; and COWs acknowledged while a primary is
//! killed read back right from every surviving replica.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use objstore_client::{Client, ClientError};
use objstore_proto::cowrec::CowRecord;
use objstore_proto::frame::ResultCode;
use objstore_proto::{ObjIndex, ObjectId, Vid};
use testkit::cluster::{Bins, Cluster};
use testkit::replicas::{copy_data, copy_path};

const KIB4: usize = 4096;

/// The ancestor (a snapshot) and the VDI that copies from it.
const PARENT: Vid = Vid(0x51);
const CHILD: Vid = Vid(0x52);

fn src(i: u32) -> ObjectId {
    ObjectId::data(PARENT, ObjIndex(i))
}

fn dst(i: u32) -> ObjectId {
    ObjectId::data(CHILD, ObjIndex(i))
}

/// `len` bytes that differ with `seed` and with the position (so a shifted copy shows).
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| ((i / 7) as u8).wrapping_mul(31) ^ seed ^ (i as u8))
        .collect()
}

fn applied(base: &[u8], offset: usize, data: &[u8]) -> Vec<u8> {
    let mut v = base.to_vec();
    v[offset..offset + data.len()].copy_from_slice(data);
    v
}

struct Rig {
    c: Cluster,
    rt: tokio::runtime::Runtime,
    cl: Arc<Client>,
    object_size: usize,
}

impl Rig {
    fn start(nodes: usize, copies: u32, object_size: &str) -> Rig {
        let c = Cluster::start(&Bins::fresh(), nodes);
        c.format(copies, object_size);
        let rt = tokio::runtime::Runtime::new().unwrap();
        let addrs: Vec<SocketAddr> = (0..nodes).map(|i| c.addr(i).parse().unwrap()).collect();
        let cl = Arc::new(
            rt.block_on(Client::connect(&addrs, testkit::auth::client_options()))
                .unwrap(),
        );
        let object_size = cl.view().config().unwrap().object_size as usize;
        Rig {
            c,
            rt,
            cl,
            object_size,
        }
    }

    fn owners(&self, oid: ObjectId) -> Vec<SocketAddr> {
        self.cl.view().replicas(oid).unwrap()
    }

    /// Writes `data` at the start of `oid` and flushes it: a snapshot's objects are durable
    /// before anything copies them (a copy from a source not durable yet is whole).
    fn write(&self, oid: ObjectId, data: &[u8]) {
        self.rt
            .block_on(self.cl.write_obj(oid, 0, Bytes::copy_from_slice(data)))
            .unwrap();
        self.rt.block_on(self.cl.flush()).unwrap();
    }

    fn cow(&self, oid: ObjectId, source: ObjectId, offset: usize, data: &[u8]) {
        self.rt
            .block_on(self.cl.cow_write_obj(
                oid,
                source,
                offset as u64,
                Bytes::copy_from_slice(data),
            ))
            .unwrap_or_else(|e| panic!("COW of {oid} from {source}: {e}"));
    }

    fn read(&self, oid: ObjectId) -> Vec<u8> {
        self.rt
            .block_on(self.cl.read_obj(oid, 0, self.object_size as u32))
            .unwrap()
            .to_vec()
    }

    /// Every owner of `oid` in the client's view holds it at one version, the same bytes on
    /// each, reading as `want`: a whole copy holds `want` itself (trailing zeros do not
    /// count); a partial target (its record past the object size) holds `want`'s bytes in
    /// every block it marks present and zeros elsewhere. Returns the record, if partial.
    fn assert_replicas(&self, oid: ObjectId, want: &[u8]) -> Option<CowRecord> {
        self.rt.block_on(self.cl.flush()).unwrap();
        assert!(self.read(oid) == want, "{oid} reads other bytes");
        let trim = |b: &[u8]| b[..b.iter().rposition(|&x| x != 0).map_or(0, |p| p + 1)].to_vec();
        let os = self.object_size;
        let mut versions = BTreeSet::new();
        let mut raws = BTreeSet::new();
        let mut record = None;
        let owners = self.owners(oid);
        for addr in &owners {
            let st = self
                .rt
                .block_on(self.cl.stat_obj(*addr, oid))
                .unwrap()
                .unwrap_or_else(|| panic!("{addr} holds no copy of {oid}"));
            assert!(!st.deleted, "{addr} holds a tombstone of {oid}");
            versions.insert(st.version);
            let path = copy_path(&self.c, &addr.to_string(), &oid.to_string())
                .unwrap_or_else(|| panic!("{addr} has no file for {oid}"));
            let got = copy_data(&path).unwrap();
            if got.len() > os {
                let rec = CowRecord::decode(&got[os..], os as u64).unwrap_or_else(|| {
                    panic!("{addr}'s copy of {oid} is longer than an object and holds no record")
                });
                for b in 0..os / KIB4 {
                    let block = &got[b * KIB4..(b + 1) * KIB4];
                    if rec.present(b as u64) {
                        assert!(
                            block == &want[b * KIB4..(b + 1) * KIB4],
                            "{addr}'s copy of {oid}: present block {b} differs"
                        );
                    } else {
                        assert!(
                            block.iter().all(|&x| x == 0),
                            "{addr}'s copy of {oid}: absent block {b} holds bytes"
                        );
                    }
                }
                record = Some(rec);
            } else {
                assert!(
                    trim(&got) == trim(want),
                    "{addr}'s copy of {oid} differs from what was expected"
                );
            }
            raws.insert(trim(&got));
        }
        assert_eq!(
            versions.len(),
            1,
            "owners {owners:?} of {oid}: {versions:?}"
        );
        assert_eq!(
            raws.len(),
            1,
            "owners {owners:?} of {oid} hold different bytes at one version"
        );
        record
    }

    fn assert_absent(&self, oid: ObjectId) {
        for addr in self.owners(oid) {
            let st = self.rt.block_on(self.cl.stat_obj(addr, oid)).unwrap();
            assert!(st.is_none_or(|s| s.deleted), "{addr} holds {oid}: {st:?}");
        }
    }
}

/// A 4 KiB COW into a new target from a whole-object source: the target reads back as the
/// source with the write, on every owner at one version; the source is unchanged.
fn cow_of(r: &Rig, i: u32, seed: u8, offset: usize) {
    let source = pattern(r.object_size, seed);
    r.write(src(i), &source);
    let data = vec![0xc5 ^ seed; KIB4];
    r.cow(dst(i), src(i), offset, &data);
    let want = applied(&source, offset, &data);
    assert!(r.read(dst(i)) == want, "target {} reads wrong", dst(i));
    assert!(r.read(src(i)) == source, "source {} changed", src(i));
    let rec = r
        .assert_replicas(dst(i), &want)
        .unwrap_or_else(|| panic!("{} was copied whole", dst(i)));
    assert_eq!(rec.source, src(i));
    let block = (offset / KIB4) as u64;
    assert_eq!(
        rec.count(),
        1,
        "{} holds more than the block written",
        dst(i)
    );
    assert!(rec.present(block));
    assert!(r.assert_replicas(src(i), &source).is_none());
}

/// Three nodes, three copies: every node owns the source (the primary copies its own copy).
#[test]
fn cow_copies_the_source_with_the_write_3_nodes_3_copies() {
    let r = Rig::start(3, 3, "4M");
    cow_of(&r, 0, 1, 12 * KIB4);
    cow_of(&r, 1, 2, 0);
    cow_of(&r, 2, 3, r.object_size - KIB4);
}

/// Four nodes, two copies: the target's primary may own the source or not; both ways are
/// taken (not owning it: the source is read from its owners over the network).
#[test]
fn cow_copies_the_source_with_the_write_4_nodes_2_copies() {
    let r = Rig::start(4, 2, "4M");
    let apart = (0..256u32)
        .find(|&i| {
            let s = r.owners(src(i));
            r.owners(dst(i)).iter().all(|a| !s.contains(a))
        })
        .expect("an index whose source and target owners differ");
    let shared = (0..256u32)
        .find(|&i| r.owners(src(i)).contains(&r.owners(dst(i))[0]))
        .expect("an index whose target primary owns the source");
    cow_of(&r, apart, 7, 100 * KIB4);
    cow_of(&r, shared, 8, 3 * KIB4);
}

/// A COW onto a target that exists is a plain write: the source is not copied again (the
/// target keeps its own bytes around the write), and sending it twice is harmless. A COW
/// onto a removed target copies the source again.
#[test]
fn cow_onto_an_existing_target_is_a_plain_write() {
    let r = Rig::start(3, 2, "1M");
    let source = pattern(r.object_size, 11);
    let own = pattern(r.object_size, 12);
    r.write(src(4), &source);
    r.write(dst(4), &own);
    let data = vec![0x77; KIB4];
    r.cow(dst(4), src(4), 2 * KIB4, &data);
    r.cow(dst(4), src(4), 2 * KIB4, &data);
    let want = applied(&own, 2 * KIB4, &data);
    assert!(
        r.read(dst(4)) == want,
        "the existing target was copied over"
    );
    r.assert_replicas(dst(4), &want);

    r.rt.block_on(r.cl.remove_obj(dst(4))).unwrap();
    r.cow(dst(4), src(4), 0, &data);
    let want = applied(&source, 0, &data);
    assert!(
        r.read(dst(4)) == want,
        "a removed target is copied from its source"
    );
    r.assert_replicas(dst(4), &want);
}

/// A source that does not exist (never written, or removed) is an error naming it, and the
/// target is not created; a source that cannot be one is refused with the reason.
#[test]
fn cow_from_a_missing_source_fails_and_creates_nothing() {
    let r = Rig::start(3, 2, "1M");
    let data = Bytes::from(vec![1u8; KIB4]);
    // COW of index i from a source that is not there: NotFound naming it, no target made.
    let not_found = |i: u32, what: &str| {
        match r
            .rt
            .block_on(r.cl.cow_write_obj(dst(i), src(i), 0, data.clone()))
        {
            Err(ClientError::NotFound(o)) => assert_eq!(o, src(i)),
            other => panic!("COW from a {what} source: {other:?}"),
        }
        r.assert_absent(dst(i));
    };
    not_found(5, "missing");

    r.write(src(6), &[9u8; 4096]);
    r.rt.block_on(r.cl.remove_obj(src(6))).unwrap();
    not_found(6, "removed");

    for (source, why) in [
        (dst(7), "is the target itself"),
        (src(8), "another index"),
        (ObjectId::inode(PARENT), "data objects"),
    ] {
        match r
            .rt
            .block_on(r.cl.cow_write_obj(dst(7), source, 0, data.clone()))
        {
            Err(ClientError::Refused { code, message, .. }) => {
                assert_eq!(code, ResultCode::InvalidRequest, "{message}");
                assert!(message.contains(why), "{message}");
            }
            other => panic!("COW from {source}: {other:?}"),
        }
    }
    r.assert_absent(dst(7));
}

/// A flood of COWs (16 at a time) while a node that is the primary of some targets is
/// killed: every COW acknowledged reads back right at once, and once the cluster recovered,
/// from every owner of the new epoch, at one version.
#[test]
fn cows_acknowledged_while_a_primary_is_killed_read_back_from_every_replica() {
    let mut r = Rig::start(4, 3, "1M");
    const N: u32 = 64;
    let sources: Vec<Vec<u8>> = (0..N).map(|i| pattern(r.object_size, i as u8)).collect();
    for i in 0..N {
        r.write(src(i), &sources[i as usize]);
    }
    let victim = 1;
    let victim_addr: SocketAddr = r.c.addr(victim).parse().unwrap();
    let primaries = (0..N)
        .filter(|&i| r.owners(dst(i))[0] == victim_addr)
        .count();
    assert!(primaries > 0, "node {victim} is the primary of no target");

    let slots = r.object_size / KIB4;
    let offset = move |i: u32| (i as usize * 5 % slots) * KIB4;
    let object_size = r.object_size;
    let cl = r.cl.clone();
    let sources = Arc::new(sources);
    let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let flood = {
        let (sources, done) = (sources.clone(), done.clone());
        r.rt.spawn(async move {
            use futures::StreamExt;
            futures::stream::iter(0..N)
                .map(|i| {
                    let (cl, sources, done) = (cl.clone(), sources.clone(), done.clone());
                    async move {
                        let data = vec![0xa0 ^ i as u8; KIB4];
                        let res = cl
                            .cow_write_obj(
                                dst(i),
                                src(i),
                                offset(i) as u64,
                                Bytes::from(data.clone()),
                            )
                            .await;
                        done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                        if let Err(e) = res {
                            return (i, Err(e.to_string()));
                        }
                        let want = applied(&sources[i as usize], offset(i), &data);
                        let read = match cl.read_obj(dst(i), 0, object_size as u32).await {
                            Ok(b) if b[..] == want[..] => Ok(()),
                            Ok(_) => Err("other bytes".to_string()),
                            Err(e) => Err(e.to_string()),
                        };
                        (i, Ok((want, read)))
                    }
                })
                .buffer_unordered(16)
                .collect::<Vec<_>>()
                .await
        })
    };
    testkit::wait_until("some COWs done", std::time::Duration::from_secs(60), || {
        done.load(std::sync::atomic::Ordering::SeqCst) >= 8
    });
    r.c.kill9(victim);
    let results = r.rt.block_on(flood).unwrap();
    r.c.wait_members(3);
    r.c.wait_recovered();
    r.rt.block_on(r.cl.refresh()).unwrap();
    let mut acked = Vec::new();
    for (i, res) in results {
        match res {
            Ok((want, Ok(()))) => acked.push((i, want)),
            Ok((_, Err(e))) => panic!("COW {i} was acknowledged but its read right after: {e}"),
            Err(e) => eprintln!("COW {i} failed: {e}"),
        }
    }
    assert!(
        acked.len() > N as usize / 2,
        "only {} of {N} COWs were acknowledged",
        acked.len()
    );
    for (i, want) in &acked {
        assert!(
            r.read(dst(*i)) == *want,
            "COW {i} reads other bytes after recovery"
        );
        r.assert_replicas(dst(*i), want);
        r.assert_replicas(src(*i), &sources[*i as usize]);
    }
}

/// Writes into a partial target: one that touches only blocks it holds is a plain write; one
/// that touches blocks it lacks (whole, or in part) fills them, the source's bytes around the
/// write, and marks them. A copy-on-write that covers blocks in part merges them too.
#[test]
fn writes_into_a_partial_target_fill_the_blocks_it_lacks() {
    let r = Rig::start(3, 3, "1M");
    let source = pattern(r.object_size, 21);
    r.write(src(9), &source);
    // A COW covering blocks 3 and 4 in part.
    let first = vec![0x11; KIB4];
    let at = 3 * KIB4 + 1000;
    r.cow(dst(9), src(9), at, &first);
    let mut want = applied(&source, at, &first);
    let rec = r.assert_replicas(dst(9), &want).expect("partial");
    assert_eq!(rec.count(), 2);
    assert!(rec.present(3) && rec.present(4));

    let write = |offset: usize, data: &[u8], want: &mut Vec<u8>| {
        r.rt.block_on(r.cl.write_obj(dst(9), offset as u64, Bytes::copy_from_slice(data)))
            .unwrap();
        *want = applied(want, offset, data);
    };
    // Inside blocks it holds: plain.
    write(3 * KIB4 + 10, &[0x22; 100], &mut want);
    // A whole block it lacks, then a piece of two blocks it lacks.
    write(10 * KIB4, &[0x33; KIB4], &mut want);
    write(20 * KIB4 + 4000, &[0x44; 200], &mut want);
    let rec = r.assert_replicas(dst(9), &want).expect("still partial");
    let present: Vec<u64> = (0..(r.object_size / KIB4) as u64)
        .filter(|&b| rec.present(b))
        .collect();
    assert_eq!(present, vec![3, 4, 10, 20, 21]);
    assert!(r.read(src(9)) == source, "the source never changes");
}

/// A copy from a source that is a partial target itself, or not durable yet, is whole (one
/// hop at most, never outliving its source); a flatten makes a partial target whole, after which its source may go; a flatten naming
/// another source leaves the target as it is.
#[test]
fn a_copy_of_a_partial_copy_is_whole_and_flatten_makes_one_whole() {
    let r = Rig::start(3, 2, "1M");
    let grand = ObjectId::data(Vid(0x53), ObjIndex(4));
    let source = pattern(r.object_size, 31);
    r.write(src(4), &source);
    r.cow(dst(4), src(4), 5 * KIB4, &[0x55; KIB4]);
    let mid = applied(&source, 5 * KIB4, &[0x55; KIB4]);
    assert!(r.assert_replicas(dst(4), &mid).is_some());

    r.cow(grand, dst(4), 7 * KIB4, &[0x66; KIB4]);
    let last = applied(&mid, 7 * KIB4, &[0x66; KIB4]);
    assert!(
        r.assert_replicas(grand, &last).is_none(),
        "a copy of a partial copy is whole"
    );

    // Another source named: nothing changes.
    r.rt.block_on(r.cl.flatten_obj(dst(4), src(5))).unwrap();
    assert!(r.assert_replicas(dst(4), &mid).is_some());
    r.rt.block_on(r.cl.flatten_obj(dst(4), src(4))).unwrap();
    assert!(r.assert_replicas(dst(4), &mid).is_none(), "flattened");
    r.rt.block_on(r.cl.remove_obj(src(4))).unwrap();
    assert!(r.read(dst(4)) == mid, "reads the same without its source");
    // A missing target: nothing to do.
    r.rt.block_on(r.cl.flatten_obj(dst(6), src(6))).unwrap();
    r.assert_absent(dst(6));

    // A source written and not flushed (a crash could drop it): the copy is whole.
    let unflushed = pattern(r.object_size, 33);
    r.rt.block_on(r.cl.write_obj(src(7), 0, Bytes::copy_from_slice(&unflushed)))
        .unwrap();
    r.cow(dst(7), src(7), 0, &[0x77; KIB4]);
    let want = applied(&unflushed, 0, &[0x77; KIB4]);
    assert!(
        r.assert_replicas(dst(7), &want).is_none(),
        "a copy of a source not durable yet is whole"
    );
}
