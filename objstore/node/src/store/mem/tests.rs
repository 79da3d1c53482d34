//! The memory store's tests.

use super::*;
use objstore_proto::oid::{ObjIndex, Vid};

#[test]
fn crash_keeps_only_flushed_writes() {
    let s = MemStore::default();
    let a = ObjectId::data(Vid(1), ObjIndex(0));
    s.write(a, 0, b"first", None, Version(1)).unwrap();
    // A new data object is durable at the next flush: before it, a crash drops it.
    assert!(matches!(
        s.crashed().read(a, 0, 5),
        Err(StoreError::NotFound(_))
    ));
    s.flush().unwrap();
    s.write(a, 0, b"FIRST", None, Version(2)).unwrap();
    assert_eq!(s.crashed().read(a, 0, 5).unwrap(), b"first");
    s.flush().unwrap();
    s.write(a, 0, b"later", None, Version(3)).unwrap();
    let c = s.crashed();
    assert_eq!(c.read(a, 0, 5).unwrap(), b"FIRST");
    assert_eq!(c.meta(a).unwrap().version, Version(2));
    assert_eq!(s.read(a, 3, 4).unwrap(), b"er\0\0");
}

#[test]
fn faults_fail_the_chosen_operation() {
    let s = MemStore::default();
    let a = ObjectId::data(Vid(1), ObjIndex(0));
    s.write(a, 0, b"x", None, Version(1)).unwrap();
    s.write(a, 0, b"z", None, Version(2)).unwrap();
    s.fail(Op::Flush, Fault::Io);
    // The failed flush names the object and loses its unsynced write.
    match s.flush() {
        Err(StoreError::SyncFailed { oids, .. }) => assert_eq!(oids, vec![(a, Version(2))]),
        other => panic!("{other:?}"),
    }
    // Unreadable until restored.
    assert!(matches!(s.read(a, 0, 1), Err(StoreError::Lost(_))));
    assert!(s.put_if_newer(a, b"x", ObjState::live(Version(2))).unwrap());
    assert_eq!(s.read(a, 0, 1).unwrap(), b"x");
    s.fail(Op::Write, Fault::NoSpace);
    assert!(matches!(
        s.write(a, 0, b"y", None, Version(3)),
        Err(StoreError::NoSpace)
    ));
    assert_eq!(s.read(a, 0, 1).unwrap(), b"x");
    s.clear_faults();
    s.flush().unwrap();
    assert!(s.corrupt(a, 0));
    // A flipped byte is never read: the copy is bad until a copy as new replaces it.
    assert!(matches!(
        s.read(a, 0, 1),
        Err(StoreError::Corrupt { block: 0, .. })
    ));
    assert!(matches!(s.read_whole(a), Err(StoreError::Corrupt { .. })));
    assert!(s.put_if_newer(a, b"x", ObjState::live(Version(2))).unwrap());
    assert_eq!(s.read(a, 0, 1).unwrap(), b"x");
}

/// A copy a failed flush lost keeps the version lost and takes no write until a whole
/// copy at least that new replaces it; kept as it is (`accept_lost`), or after a kill, it
/// is suspect at its durable version. (Seed 8330: a write applied over a lost copy moved
/// its version past the one lost, so the copy restoring it was refused as older.)
#[test]
fn a_lost_copy_keeps_its_version_and_takes_no_write() {
    let a = ObjectId::data(Vid(1), ObjIndex(0));
    let lost_store = || {
        let s = MemStore::default();
        s.write(a, 0, b"x", None, Version(1)).unwrap();
        s.flush().unwrap();
        s.write(a, 0, b"z", None, Version(2)).unwrap();
        s.fail(Op::Flush, Fault::Io);
        assert!(s.flush().is_err());
        s.clear_faults();
        s
    };
    let s = lost_store();
    assert_eq!(s.meta(a).unwrap().version, Version(2));
    assert!(matches!(
        s.write(a, 0, b"y", None, Version(3)),
        Err(StoreError::Lost(_))
    ));
    assert_eq!(s.meta(a).unwrap().version, Version(2));
    let suspect = ObjState {
        suspect: true,
        ..ObjState::live(Version(1))
    };
    assert_eq!(s.killed().meta(a), Some(suspect));
    assert!(s.put_if_newer(a, b"z", ObjState::live(Version(2))).unwrap());
    assert_eq!(s.read(a, 0, 1).unwrap(), b"z");
    s.write(a, 0, b"y", None, Version(3)).unwrap();

    let s = lost_store();
    assert_eq!(s.accept_lost(a).unwrap(), Some(suspect));
    assert_eq!(s.read(a, 0, 1).unwrap(), b"x");
}

/// A data object created since the last flush is gone after a kill or a crash; a failed
/// flush leaves it lost at its version with nothing durable, and keeping what remains
/// drops it. An inode (and an object written over a tombstone) is durable at once.
#[test]
fn a_new_data_object_is_durable_at_the_next_flush() {
    let a = ObjectId::data(Vid(1), ObjIndex(0));
    let ino = ObjectId::inode(Vid(1));
    let s = MemStore::default();
    s.write(a, 0, b"x", None, Version(1)).unwrap();
    s.write(ino, 0, b"i", None, Version(1)).unwrap();
    assert_eq!(s.killed().meta(a), None);
    assert_eq!(s.crashed().meta(a), None);
    assert_eq!(s.crashed().read(ino, 0, 1).unwrap(), b"i");
    s.flush().unwrap();
    assert_eq!(s.killed().read(a, 0, 1).unwrap(), b"x");

    let b = ObjectId::data(Vid(1), ObjIndex(1));
    s.write(b, 0, b"y", None, Version(2)).unwrap();
    s.fail(Op::Flush, Fault::Io);
    match s.flush() {
        Err(StoreError::SyncFailed { oids, .. }) => assert_eq!(oids, vec![(b, Version(2))]),
        other => panic!("{other:?}"),
    }
    s.clear_faults();
    assert_eq!(s.meta(b).unwrap().version, Version(2));
    assert!(matches!(s.read(b, 0, 1), Err(StoreError::Lost(_))));
    assert!(matches!(
        s.write(b, 0, b"w", None, Version(3)),
        Err(StoreError::Lost(_))
    ));
    assert_eq!(s.killed().meta(b), None);
    assert_eq!(s.accept_lost(b).unwrap(), None);
    assert_eq!(s.meta(b), None);

    // Over a tombstone: durable at once, so the tombstone never comes back alone.
    assert!(s
        .put_if_newer(b, &[], ObjState::tombstone(Version(4)))
        .unwrap());
    s.write(b, 0, b"v", None, Version(5)).unwrap();
    assert_eq!(s.crashed().read(b, 0, 1).unwrap(), b"v");
}

#[test]
fn a_hold_keeps_a_write_waiting_until_released() {
    let s = std::sync::Arc::new(MemStore::default());
    let a = ObjectId::data(Vid(1), ObjIndex(0));
    let b = ObjectId::data(Vid(1), ObjIndex(1));
    s.write(a, 0, b"x", None, Version(1)).unwrap();
    s.hold(Op::Write, a);
    let w = std::thread::spawn({
        let s = s.clone();
        move || s.write(a, 0, b"y", None, Version(2))
    });
    while s.held() == 0 {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    // Other objects, reads and listings go on; the held write changed nothing yet.
    s.write(b, 0, b"z", None, Version(1)).unwrap();
    assert_eq!(s.read(a, 0, 1).unwrap(), b"x");
    assert_eq!(s.meta(a).unwrap().version, Version(1));
    s.release();
    w.join().unwrap().unwrap();
    assert_eq!(s.held(), 0);
    assert_eq!(s.read(a, 0, 1).unwrap(), b"y");
    assert_eq!(s.meta(a).unwrap().version, Version(2));
}

/// Notes as the file backend keeps them: a kill keeps them, a crash keeps them as of the last
/// flush, an install or a forget drops them.
#[test]
fn notes_follow_kills_crashes_and_flushes() {
    let s = MemStore::default();
    let a = ObjectId::data(Vid(1), ObjIndex(0)).strip(0);
    s.set_note(a, b"flushed").unwrap();
    s.write(a, 0, b"x", None, Version(1)).unwrap();
    s.flush().unwrap();
    s.set_note(a, b"later").unwrap();
    assert_eq!(s.killed().note(a).as_deref(), Some(&b"later"[..]));
    assert_eq!(s.crashed().note(a).as_deref(), Some(&b"flushed"[..]));
    assert!(s.put_if_newer(a, b"y", ObjState::live(Version(2))).unwrap());
    assert_eq!(s.note(a), None);
    assert_eq!(s.crashed().note(a), None);
    s.set_note(a, b"n").unwrap();
    s.forget(a).unwrap();
    assert_eq!(s.note(a), None);
}

#[test]
fn sync_object_makes_one_object_durable_and_a_failed_one_lost() {
    let s = MemStore::default();
    let a = ObjectId::data(Vid(1), ObjIndex(0)).strip(0);
    let b = ObjectId::data(Vid(1), ObjIndex(1)).strip(0);
    for oid in [a, b] {
        s.set_note(oid, b"n1").unwrap();
        s.write(oid, 0, b"1", None, Version(1)).unwrap();
    }
    s.sync_object(a).unwrap();
    let c = s.crashed();
    assert_eq!(c.read(a, 0, 1).unwrap(), b"1");
    assert_eq!(c.note(a).as_deref(), Some(&b"n1"[..]));
    assert_eq!((c.meta(b), c.note(b)), (None, None));
    // A sync that fails loses the copy, back to its durable bytes, as a failed flush does.
    s.set_note(a, b"n2").unwrap();
    s.write(a, 0, b"2", None, Version(2)).unwrap();
    s.fail(Op::Flush, Fault::Io);
    assert!(s.sync_object(a).is_err());
    s.clear_faults();
    assert_eq!(s.meta(a).unwrap().version, Version(2));
    assert!(matches!(s.read(a, 0, 1), Err(StoreError::Lost(_))));
    assert_eq!(
        s.accept_lost(a).unwrap().map(|st| st.version),
        Some(Version(1))
    );
    assert_eq!(s.read(a, 0, 1).unwrap(), b"1");
}

/// A power cut leaves every unsynced copy in one of the forms the file backend can (its old
/// version as it was, or marked with old, new or mixed bytes), never new bytes under an
/// unmarked name; unsynced notes as they were, as set or none; synced ones as they were. Over
/// many draws every form comes up.
#[test]
fn a_power_cut_leaves_only_what_the_disk_can() {
    use rand::SeedableRng;
    let s = MemStore::default();
    let (a, b, c, d) = (
        ObjectId::data(Vid(1), ObjIndex(0)),
        ObjectId::data(Vid(1), ObjIndex(1)),
        ObjectId::data(Vid(1), ObjIndex(2)),
        ObjectId::data(Vid(1), ObjIndex(3)),
    );
    let old = vec![1u8; 3 * BLOCK];
    let new = vec![2u8; 3 * BLOCK];
    s.write(a, 0, &old, None, Version(1)).unwrap();
    s.write(b, 0, b"b", None, Version(1)).unwrap();
    s.set_note(a, b"synced").unwrap();
    s.flush().unwrap();
    s.write(a, 0, &new, None, Version(2)).unwrap();
    s.set_note(a, b"unsynced").unwrap();
    // b: its version alone; c: created since the flush; d: made and synced since.
    s.write(b, 0, &[], None, Version(2)).unwrap();
    s.write(c, 0, b"c", None, Version(2)).unwrap();
    s.write(d, 0, b"d", None, Version(2)).unwrap();
    s.set_note(d, b"d's").unwrap();
    s.sync_object(d).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut seen = HashSet::new();
    let mut notes = HashSet::new();
    for _ in 0..200 {
        let p = s.power_cut(&mut rng);
        let st = p.meta(a).unwrap();
        assert_eq!(st.version, Version(1));
        let bytes = p.read(a, 0, 3 * BLOCK).unwrap();
        let form = match (st.suspect, &bytes) {
            (false, x) if *x == old => "as it was",
            (true, x) if *x == old => "marked, old bytes",
            (true, x) if *x == new => "marked, new bytes",
            (true, x)
                if x.chunks(BLOCK)
                    .all(|k| k == &old[..BLOCK] || k == &new[..BLOCK]) =>
            {
                "marked, mixed"
            }
            other => panic!("not a state the disk can leave: {other:?}"),
        };
        seen.insert(form);
        notes.insert(p.note(a));
        assert_eq!(p.meta(b), Some(ObjState::live(Version(1))));
        assert_eq!(p.meta(c), None);
        assert_eq!(p.read(d, 0, 1).unwrap(), b"d");
        assert_eq!(p.note(d).as_deref(), Some(&b"d's"[..]));
    }
    assert_eq!(seen.len(), 4, "{seen:?}");
    assert_eq!(
        notes,
        HashSet::from([Some(b"synced".to_vec()), Some(b"unsynced".to_vec()), None])
    );
}
