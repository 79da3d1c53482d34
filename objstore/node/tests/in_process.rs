//! Nodes and a client in one process over memory stores and an in-memory network: the data
//! path, a node crash, the epoch change it makes, and recovery when the node comes back. No
//! ports, no root, no child processes.

use std::sync::Arc;

use bytes::Bytes;
use objstore_client::vdi::{self, Vdi};
use objstore_client::ClientOptions;
use objstore_node::store::ObjectBackend;
use objstore_node::testing::MemCluster;
use objstore_proto::{ObjIndex, ObjectId, Vid};

const MIB: u64 = 1 << 20;

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

#[test]
fn write_read_crash_epoch_change_and_recovery() {
    let mut c = MemCluster::start(3).expect("start 3 in-memory nodes");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let opts = ClientOptions::default();
    let client = Arc::new(rt.block_on(c.client(opts.clone())).expect("client"));
    rt.block_on(client.format(3, None, MIB)).expect("format");
    rt.block_on(vdi::create(&client, "disk", 8 * MIB))
        .expect("create");
    let disk = rt.block_on(Vdi::open(client.clone(), "disk")).unwrap();
    let vid = disk.header().vid;

    // Write across objects, read back, flush: three identical copies of each object.
    let first = pattern(3 * MIB as usize, 1);
    rt.block_on(disk.write_at(MIB / 2, Bytes::from(first.clone())))
        .unwrap();
    rt.block_on(disk.flush()).unwrap();
    let back = rt
        .block_on(disk.read_at(MIB / 2, first.len() as u64))
        .unwrap();
    assert!(back[..] == first[..], "read back differs");
    for idx in 0..4 {
        assert_eq!(c.replicas_agree(ObjectId::data(vid, ObjIndex(idx))), 3);
    }
    let epoch = c.epoch(0).unwrap();

    // A node crashes: the others move to a new epoch without it, and I/O goes on.
    c.crash(2);
    c.wait_members(2);
    assert!(c.epoch(0).unwrap() > epoch, "no new epoch after a crash");
    let second = pattern(MIB as usize, 2);
    rt.block_on(disk.write_at(4 * MIB, Bytes::from(second.clone())))
        .unwrap();
    rt.block_on(disk.flush()).unwrap();
    let back = rt.block_on(disk.read_at(4 * MIB, MIB)).unwrap();
    assert!(back[..] == second[..], "read after the crash differs");
    assert_eq!(c.replicas_agree(ObjectId::data(vid, ObjIndex(4))), 2);

    // It comes back on what it had made durable, recovers the object it missed, and every
    // object has three identical copies again.
    c.start_node(2).expect("restart node 2");
    c.wait_members(3);
    c.wait_recovered();
    for idx in 0..5 {
        assert_eq!(
            c.replicas_agree(ObjectId::data(vid, ObjIndex(idx))),
            3,
            "object {idx} after recovery"
        );
    }
    let all = rt
        .block_on(disk.read_at(MIB / 2, 4 * MIB + MIB / 2))
        .unwrap();
    assert!(all[..first.len()] == first[..]);
    assert!(all[first.len() + MIB as usize / 2..] == second[..]);
}

#[test]
fn a_write_never_flushed_is_lost_only_on_the_crashed_node() {
    let mut c = MemCluster::start(2).expect("start 2 in-memory nodes");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = Arc::new(rt.block_on(c.client(ClientOptions::default())).unwrap());
    rt.block_on(client.format(2, None, MIB)).unwrap();
    let oid = ObjectId::data(Vid(5), ObjIndex(0));
    rt.block_on(client.write_obj(oid, 0, Bytes::from_static(b"durable")))
        .unwrap();
    rt.block_on(client.flush()).unwrap();
    rt.block_on(client.write_obj(oid, 0, Bytes::from_static(b"VOLATIL")))
        .unwrap();
    // The crash keeps the flushed bytes on node 1 and loses the later, unflushed write there.
    c.crash(1);
    assert_eq!(c.store(1).read(oid, 0, 7).unwrap(), b"durable");
    assert_eq!(c.store(0).read(oid, 0, 7).unwrap(), b"VOLATIL");
}

/// Many first writes into new objects at once from one handle: their map entries are written
/// together (group commit, adjacent indexes in one write), and every one lands, in the handle
/// that wrote them at once and, after a flush, in the inode as a new handle reads it. A write into the same objects
/// afterwards and a discard of one (its entry back to a hole) land too.
#[test]
fn concurrent_first_writes_record_every_map_entry() {
    let c = MemCluster::start(3).expect("start 3 in-memory nodes");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = Arc::new(rt.block_on(c.client(ClientOptions::default())).unwrap());
    rt.block_on(client.format(3, None, MIB)).unwrap();
    const N: u64 = 48;
    rt.block_on(vdi::create(&client, "thin", N * MIB)).unwrap();
    let disk = Arc::new(rt.block_on(Vdi::open(client.clone(), "thin")).unwrap());
    let vid = disk.header().vid;
    // Every other object first, then the rest: runs of adjacent indexes and gaps.
    let order: Vec<u64> = (0..N).step_by(2).chain((1..N).step_by(2)).collect();
    rt.block_on(async {
        let writes = order.iter().map(|&i| {
            let disk = disk.clone();
            async move {
                disk.write_at(i * MIB + 512, Bytes::from(vec![i as u8 + 1; 4096]))
                    .await
            }
        });
        for r in futures::future::join_all(writes).await {
            r.unwrap();
        }
    });
    // The entries reach the inode by a task, and at the latest with the next flush.
    rt.block_on(disk.flush()).unwrap();
    let fresh = rt.block_on(Vdi::open(client.clone(), "thin")).unwrap();
    for i in 0..N {
        assert_eq!(disk.entry(i), vid, "index {i} in the writing handle");
        assert_eq!(fresh.entry(i), vid, "index {i} in the inode");
        let got = rt.block_on(fresh.read_at(i * MIB + 512, 4096)).unwrap();
        assert!(
            got.iter().all(|&b| b == i as u8 + 1),
            "index {i} reads back"
        );
    }
    rt.block_on(disk.discard(5 * MIB, MIB)).unwrap();
    let fresh = rt.block_on(Vdi::open(client.clone(), "thin")).unwrap();
    assert_eq!(fresh.entry(5), Vid::NONE);
    assert_eq!(disk.entry(5), Vid::NONE);
    assert_eq!(fresh.entry(6), vid);
}
