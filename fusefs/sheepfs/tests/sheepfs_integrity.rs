//! Issue 25, checksums, end to end with real processes: one byte flipped in each of 100
//! objects, in the copy every read asks first, on the disks of running `sheep`s. Nothing wrong
//! is ever read (through a real sheepfs mount, then through `dog vdi read`), and every bad
//! copy is restored from another replica (the files agree again).

mod common;

use std::os::unix::fs::FileExt;
use std::time::Duration;

use common::Rig;
use testkit::replicas;
use testkit::{pseudo_random, wait_until};

const MIB: u64 = 1 << 20;
const OBJECTS: u64 = 100;

/// Flips one byte of the object's data (not of its header) in the first replica's file of
/// each of the VDI's data objects; returns how many it flipped.
fn flip_first_copies(rig: &Rig, name: &str, salt: u64) -> usize {
    let mut flipped = 0;
    for o in replicas::objects(&rig.cluster, name).unwrap() {
        let (Some(_), Some(oid)) = (o.index, o.oid.as_deref()) else {
            continue;
        };
        let path = replicas::copy_path(&rig.cluster, &o.placement[0], oid)
            .unwrap_or_else(|| panic!("no file for {oid} on {}", o.placement[0]));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        // The object is written whole: its data is the file's last MIB, after the header.
        let header = f.metadata().unwrap().len() - MIB;
        let at = header + (o.index.unwrap() * 4099 + salt * 7919) % MIB;
        let mut b = [0u8];
        f.read_exact_at(&mut b, at).unwrap();
        b[0] ^= 0x01;
        f.write_all_at(&b, at).unwrap();
        flipped += 1;
    }
    flipped
}

fn wrong_bytes(got: &[u8], want: &[u8]) -> usize {
    assert_eq!(got.len(), want.len());
    got.iter().zip(want).filter(|(a, b)| a != b).count()
}

/// Waits until every copy of every object of `name` agrees byte for byte, on disk.
fn wait_restored(rig: &Rig, name: &str) {
    wait_until(
        "every corrupt copy to be restored",
        Duration::from_secs(120),
        || replicas::check(&rig.cluster, name).is_ok(),
    );
}

#[test]
fn flipped_bytes_in_100_objects_are_never_read_and_are_restored() {
    let rig = Rig::start(3, 3, "1M", &[]);
    rig.cluster
        .dog_ok(&["vdi", "create", "v", &format!("{OBJECTS}M")]);
    let data = pseudo_random((OBJECTS * MIB) as usize, 25);
    rig.cluster.write_vdi("v", 0, &data);
    rig.cluster.wait_recovered();
    replicas::assert_consistent(&rig.cluster, "v");

    // Through the mount.
    assert_eq!(flip_first_copies(&rig, "v", 1), OBJECTS as usize);
    assert!(
        replicas::check(&rig.cluster, "v").is_err(),
        "the flips are on disk"
    );
    let got = std::fs::read(rig.path("v")).unwrap();
    assert_eq!(
        wrong_bytes(&got, &data),
        0,
        "wrong bytes read through the mount"
    );
    wait_restored(&rig, "v");

    // Through dog.
    assert_eq!(flip_first_copies(&rig, "v", 2), OBJECTS as usize);
    let got = rig.cluster.read_vdi("v", 0, OBJECTS * MIB);
    assert_eq!(
        wrong_bytes(&got, &data),
        0,
        "wrong bytes read by dog vdi read"
    );
    wait_restored(&rig, "v");
    rig.cluster.wait_recovered();
    let got = rig.cluster.read_vdi("v", 0, OBJECTS * MIB);
    assert_eq!(wrong_bytes(&got, &data), 0);
}
