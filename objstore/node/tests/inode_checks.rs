//! Issue 25: a VDI's inode header and allocation map are checked when the VDI is opened. A
//! corrupted header, an entry that fails its check byte, or a well-formed entry naming
//! another VDI's id (a misdirected write) is an error naming the VDI, the index and the
//! value; it is never followed (no I/O goes to the object it names). Inodes made before the
//! checks still open.

use std::sync::Arc;

use bytes::Bytes;
use objstore_client::vdi::{self, inode, Vdi, VdiError};
use objstore_client::{Client, ClientOptions};
use objstore_node::testing::MemCluster;
use objstore_proto::oid::INODE_HEADER_LEN;
use objstore_proto::{ObjectId, Vid};

const MIB: u64 = 1 << 20;

fn setup() -> (MemCluster, tokio::runtime::Runtime, Arc<Client>, Vid, Vid) {
    let c = MemCluster::start(3).expect("start");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let cl = Arc::new(rt.block_on(c.client(ClientOptions::default())).unwrap());
    rt.block_on(cl.format(3, None, MIB)).unwrap();
    let a = rt.block_on(vdi::create(&cl, "a", 8 * MIB)).unwrap().vid;
    let b = rt.block_on(vdi::create(&cl, "b", 8 * MIB)).unwrap().vid;
    for name in ["a", "b"] {
        let v = rt.block_on(Vdi::open(cl.clone(), name)).unwrap();
        rt.block_on(v.write_at(0, Bytes::from(vec![name.as_bytes()[0]; 4096])))
            .unwrap();
        // Map entries are written by a task, and by a flush at the latest: the tests below
        // read and overwrite them in the inode.
        rt.block_on(v.flush()).unwrap();
    }
    (c, rt, cl, a, b)
}

fn poke(rt: &tokio::runtime::Runtime, cl: &Client, vid: Vid, at: u64, bytes: &[u8]) {
    rt.block_on(cl.write_obj(ObjectId::inode(vid), at, Bytes::copy_from_slice(bytes)))
        .unwrap();
}

fn open_err(rt: &tokio::runtime::Runtime, cl: &Arc<Client>, name: &str) -> String {
    match rt.block_on(Vdi::open(cl.clone(), name)) {
        Err(e @ VdiError::Corrupt { .. }) => e.to_string(),
        Err(e) => panic!("expected a Corrupt error, got {e}"),
        Ok(_) => panic!("VDI {name} opened over a damaged inode"),
    }
}

fn entry_at(index: u64) -> u64 {
    INODE_HEADER_LEN as u64 + 4 * index
}

#[test]
fn a_misdirected_allocation_entry_is_not_followed() {
    let (_c, rt, cl, a, b) = setup();
    // A well-formed entry (right check byte) naming VDI b's id, in a's map: a read of a's
    // index 1 would return b's data.
    let raw = inode::entry(true, 1, b);
    poke(&rt, &cl, a, entry_at(1), &raw.to_be_bytes());
    let e = open_err(&rt, &cl, "a");
    assert!(
        e.contains("'a'") && e.contains("entry 1") && e.contains(&format!("{:#x}", b.0)),
        "{e}"
    );
    // b is untouched and still opens.
    let vb = rt.block_on(Vdi::open(cl.clone(), "b")).unwrap();
    assert_eq!(rt.block_on(vb.read_at(0, 1)).unwrap()[..], [b'b']);
}

#[test]
fn a_flipped_allocation_entry_is_detected() {
    let (_c, rt, cl, a, _b) = setup();
    let raw = inode::entry(true, 0, a) ^ 0x0000_0100;
    poke(&rt, &cl, a, entry_at(0), &raw.to_be_bytes());
    let e = open_err(&rt, &cl, "a");
    assert!(
        e.contains("'a'") && e.contains("entry 0") && e.contains(&format!("{raw:#010x}")),
        "{e}"
    );
}

#[test]
fn a_corrupted_inode_header_is_detected() {
    let (_c, rt, cl, a, _b) = setup();
    // Byte 20 is inside the size field: the VDI would look 1 TiB larger than it is.
    let mut h = [0u8; 1];
    h[0] = 0x40;
    poke(&rt, &cl, a, 20, &h);
    let e = open_err(&rt, &cl, "a");
    assert!(e.contains("'a'") && e.contains("checksum"), "{e}");
}

#[test]
fn an_inode_from_before_the_checks_still_opens_and_is_checked_as_far_as_it_can() {
    let (_c, rt, cl, a, _b) = setup();
    let va = rt.block_on(Vdi::open(cl.clone(), "a")).unwrap();
    let old = inode::InodeHeader {
        checked: false,
        ..va.header()
    };
    drop(va);
    poke(&rt, &cl, a, 0, &old.encode());
    poke(&rt, &cl, a, entry_at(0), &a.0.to_be_bytes());
    let va = rt.block_on(Vdi::open(cl.clone(), "a")).unwrap();
    assert!(!va.header().checked);
    assert_eq!(rt.block_on(va.read_at(0, 1)).unwrap()[..], [b'a']);
    // New objects of an old VDI are recorded the old way (no check byte).
    rt.block_on(va.write_at(MIB, Bytes::from_static(b"z")))
        .unwrap();
    rt.block_on(va.flush()).unwrap();
    let raw = rt
        .block_on(cl.read_obj(ObjectId::inode(a), entry_at(1), 4))
        .unwrap();
    assert_eq!(raw[..], a.0.to_be_bytes());
    drop(va);
    // Its entries' top byte must be 0.
    poke(&rt, &cl, a, entry_at(1), &(0x0100_0000 | a.0).to_be_bytes());
    let e = open_err(&rt, &cl, "a");
    assert!(e.contains("entry 1"), "{e}");
}
