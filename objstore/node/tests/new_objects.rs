//! Data objects created without a sync each, with real `sheep` processes: a write that creates
//! a data object leaves it as an unsynced `<oid>.0.n` file on every owner, and the next flush
//! names it after its version; every node killed (kill -9) before that flush comes back
//! without it, and the VDI, whose map kept the entry (written in place, it survived the kill),
//! reads zeros there (the bytes before the write), not an error. Flushed, it survives the same.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use objstore_client::vdi::{self, Vdi};
use objstore_client::Client;
use objstore_proto::{ObjIndex, ObjectId};
use testkit::cluster::{Bins, Cluster};

const MIB: u64 = 1 << 20;
const NODES: usize = 3;

/// The names of the object files of `oid` under node directory `dir`.
fn files_of(dir: &Path, oid: ObjectId) -> Vec<String> {
    let prefix = format!("{oid}.");
    let mut v: Vec<String> = std::fs::read_dir(dir.join("obj"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with(&prefix))
        .collect();
    v.sort();
    v
}

fn connect(rt: &tokio::runtime::Runtime, c: &Cluster) -> Arc<Client> {
    let addrs: Vec<SocketAddr> = (0..NODES).map(|i| c.addr(i).parse().unwrap()).collect();
    Arc::new(
        rt.block_on(Client::connect(&addrs, testkit::auth::client_options()))
            .expect("client"),
    )
}

fn restart_all(c: &mut Cluster) {
    for i in 0..NODES {
        c.kill9(i);
    }
    for i in 0..NODES {
        c.start_node(i);
    }
    c.wait_members(NODES);
    c.wait_recovered();
}

#[test]
fn a_new_object_is_durable_from_the_next_flush_and_reads_as_zeros_before() {
    let mut c = Cluster::start(&Bins::fresh(), NODES);
    c.format(3, "1M");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let cl = connect(&rt, &c);
    let vid = rt.block_on(vdi::create(&cl, "thin", 8 * MIB)).unwrap().vid;
    let disk = rt.block_on(Vdi::open(cl.clone(), "thin")).unwrap();
    let flushed = ObjectId::data(vid, ObjIndex(0));
    let unflushed = ObjectId::data(vid, ObjIndex(1));

    rt.block_on(disk.write_at(0, Bytes::from(vec![0xf1; 4096])))
        .unwrap();
    rt.block_on(disk.flush()).unwrap();
    rt.block_on(disk.write_at(MIB, Bytes::from(vec![0xe2; 4096])))
        .unwrap();
    assert_eq!(
        &rt.block_on(disk.read_at(MIB, 4096)).unwrap()[..],
        &[0xe2; 4096][..]
    );
    for i in 0..NODES {
        let dir = c.node_dir(i);
        assert_eq!(files_of(&dir, unflushed), vec![format!("{unflushed}.0.n")]);
        let f = files_of(&dir, flushed);
        assert!(
            f.len() == 1 && !f[0].ends_with(".n") && !f[0].ends_with(".w"),
            "node {i}: the flushed object is {f:?}"
        );
    }
    // The map entry is written by a task after the write returns (a flush would also make
    // the object durable, which this test must not): wait until the inode holds it.
    let entry_at = objstore_proto::oid::INODE_HEADER_LEN as u64 + 4;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while rt
        .block_on(cl.read_obj(ObjectId::inode(vid), entry_at, 4))
        .unwrap()
        .iter()
        .all(|&b| b == 0)
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the map entry of index 1 never reached the inode"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    drop((disk, cl));

    // Killed before any flush: the new object is gone everywhere; its map entry is not.
    restart_all(&mut c);
    for i in 0..NODES {
        assert_eq!(files_of(&c.node_dir(i), unflushed), Vec::<String>::new());
    }
    let back = c.read_vdi("thin", 0, 2 * MIB);
    assert!(
        back[..4096].iter().all(|&b| b == 0xf1),
        "flushed write lost"
    );
    assert!(
        back[MIB as usize..].iter().all(|&b| b == 0),
        "the lost object does not read as zeros"
    );
    let cl = connect(&rt, &c);
    let disk = rt.block_on(Vdi::open(cl.clone(), "thin")).unwrap();
    assert_eq!(
        disk.object(1),
        Some(unflushed),
        "the map entry should have survived the kill (else this test proves less)"
    );

    // Written again and flushed: it survives the same kill.
    rt.block_on(disk.write_at(MIB + 4096, Bytes::from(vec![0xd3; 4096])))
        .unwrap();
    rt.block_on(disk.flush()).unwrap();
    drop((disk, cl));
    restart_all(&mut c);
    let back = c.read_vdi("thin", MIB, 8192);
    assert!(back[..4096].iter().all(|&b| b == 0));
    assert!(
        back[4096..].iter().all(|&b| b == 0xd3),
        "flushed write lost"
    );
    for i in 0..NODES {
        let f = files_of(&c.node_dir(i), unflushed);
        assert!(
            f.len() == 1 && !f[0].ends_with(".n"),
            "node {i}: the flushed object is {f:?}"
        );
    }
}
