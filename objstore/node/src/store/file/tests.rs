//! The file store's tests.

use super::*;
use objstore_proto::oid::{ObjIndex, Vid};

fn v(n: u64) -> Version {
    Version(n)
}

#[test]
fn write_read_version_tombstone() {
    let d = tempfile::tempdir().unwrap();
    let s = FileStore::open(d.path()).unwrap();
    let oid = ObjectId::data(Vid(1), ObjIndex(2));
    assert!(matches!(s.read(oid, 0, 4), Err(StoreError::NotFound(_))));
    s.write(oid, 4096, b"hello", None, v(3)).unwrap();
    assert_eq!(s.read(oid, 4094, 9).unwrap(), b"\0\0hello\0\0");
    assert_eq!(s.meta(oid).unwrap(), ObjState::live(v(3)));
    s.write(oid, 0, b"x", None, v(5)).unwrap();
    assert_eq!(s.meta(oid).unwrap().version, v(5));
    s.flush().unwrap();
    drop(s);
    let s = FileStore::open(d.path()).unwrap();
    assert_eq!(s.list(), vec![(oid, ObjState::live(v(5)))]);
    assert_eq!(s.read(oid, 0, 1).unwrap(), b"x");
    // A delete is a tombstone that survives a reopen and reads as missing.
    assert!(s.put_if_newer(oid, &[], ObjState::tombstone(v(6))).unwrap());
    assert!(s.is_empty());
    assert!(matches!(s.read(oid, 0, 1), Err(StoreError::NotFound(_))));
    assert!(!s.put_if_newer(oid, b"old", ObjState::live(v(5))).unwrap());
    drop(s);
    let s = FileStore::open(d.path()).unwrap();
    assert_eq!(s.list(), vec![(oid, ObjState::tombstone(v(6)))]);
    assert_eq!(
        s.read_whole(oid).unwrap(),
        (vec![], ObjState::tombstone(v(6)))
    );
    // A write over the tombstone makes a new object of zeros.
    s.write(oid, 2, b"y", None, v(7)).unwrap();
    assert_eq!(s.read(oid, 0, 4).unwrap(), b"\0\0y\0");
    s.forget(oid).unwrap();
    s.forget(oid).unwrap();
    assert!(s.list().is_empty());
    assert_eq!(
        fs::read_dir(d.path()).unwrap().count(),
        3,
        "only .tmp, .notes and the format marker are left"
    );
}

/// `a` at v1 and `b` at v2, flushed, then `c` at v3 not flushed.
fn written_flushed_then_again(s: &FileStore, oid: ObjectId) {
    s.write(oid, 0, b"a", None, v(1)).unwrap();
    s.write(oid, 0, b"b", None, v(2)).unwrap();
    s.flush().unwrap();
    s.write(oid, 0, b"c", None, v(3)).unwrap();
}

/// [`written_flushed_then_again`], then what a failed fdatasync does to the copy (see
/// `flush`): no longer dirty, and lost at v3.
fn lost_after_a_failed_sync(s: &FileStore, oid: ObjectId) {
    written_flushed_then_again(s, oid);
    s.dirty.lock().unwrap().remove(&oid);
    s.bad.lock().unwrap().insert(oid, None);
}

/// `write_now` writes in place into an existing object whose lock is free, and declines
/// (doing nothing) to create one or to wait for its lock.
#[test]
fn write_now_only_writes_what_needs_no_waiting() {
    let d = tempfile::tempdir().unwrap();
    let oid = ObjectId::data(Vid(1), ObjIndex(4));
    let s = FileStore::open(d.path()).unwrap();
    assert!(s.write_now(oid, 0, b"a", None, v(1)).is_none());
    assert!(s.meta(oid).is_none());
    s.write(oid, 0, b"a", None, v(1)).unwrap();
    s.write_now(oid, 1, b"b", None, v(2)).unwrap().unwrap();
    assert_eq!(s.read(oid, 0, 2).unwrap(), b"ab");
    assert_eq!(s.meta(oid).unwrap().version, v(2));
    {
        let _flushing = s.lock(oid).read().unwrap();
        assert!(s.write_now(oid, 0, b"c", None, v(3)).is_none());
    }
    assert_eq!(s.meta(oid).unwrap().version, v(2));
}

/// `create_now` creates a data object this store holds nothing of (unsynced, as a write
/// creating it would), and declines (doing nothing) anything else: an object or tombstone
/// here, an inode (created synced), an object whose lock is taken.
#[test]
fn create_now_only_creates_what_needs_no_waiting() {
    let d = tempfile::tempdir().unwrap();
    let oid = ObjectId::data(Vid(1), ObjIndex(6));
    let s = FileStore::open(d.path()).unwrap();
    {
        let _flushing = s.lock(oid).read().unwrap();
        assert!(s.create_now(oid, &[(0, b"a", None)], v(1)).is_none());
    }
    assert!(s.meta(oid).is_none());
    let parts: [Part<'_>; 2] = [(4096, b"bb", None), (8190, b"cc", None)];
    s.create_now(oid, &parts, v(1)).unwrap().unwrap();
    assert_eq!(s.meta(oid), Some(ObjState::live(v(1))));
    assert_eq!(s.read(oid, 4095, 4).unwrap(), b"\0bb\0");
    assert_eq!(s.read(oid, 8190, 2).unwrap(), b"cc");
    assert_eq!(s.object_len(oid), Some(8192));
    assert!(
        !s.is_durable(oid),
        "created unsynced, durable at the next flush"
    );
    assert!(s.create_now(oid, &[(0, b"x", None)], v(2)).is_none());
    s.flush().unwrap();
    assert!(s.is_durable(oid));
    assert!(s.put_if_newer(oid, &[], ObjState::tombstone(v(3))).unwrap());
    assert!(s.create_now(oid, &[(0, b"x", None)], v(4)).is_none());
    let inode = ObjectId::inode(Vid(1));
    assert!(s.create_now(inode, &[(0, b"x", None)], v(1)).is_none());
    assert!(s.meta(inode).is_none());
    drop(s);
    let s = FileStore::open(d.path()).unwrap();
    assert_eq!(s.meta(oid), Some(ObjState::tombstone(v(3))));
}

/// A copy whose fdatasync failed is unreadable; kept with `accept_lost` (no replica holds
/// its data), it is suspect at the version last synced, readable, and stays suspect after a
/// reopen.
#[test]
fn a_lost_copy_kept_is_suspect_at_its_synced_version() {
    let d = tempfile::tempdir().unwrap();
    let oid = ObjectId::data(Vid(1), ObjIndex(3));
    let s = FileStore::open(d.path()).unwrap();
    lost_after_a_failed_sync(&s, oid);
    assert!(s.read(oid, 0, 1).is_err());
    let kept = s.accept_lost(oid).unwrap().unwrap();
    assert_eq!(
        kept,
        ObjState {
            suspect: true,
            ..ObjState::live(v(2))
        }
    );
    assert_eq!(s.meta(oid), Some(kept));
    assert!(s.read(oid, 0, 1).is_ok());
    // Accepting a copy that is not lost changes nothing.
    assert_eq!(s.accept_lost(oid).unwrap(), Some(kept));
    drop(s);
    let s = FileStore::open(d.path()).unwrap();
    assert_eq!(s.meta(oid), Some(kept));
}

/// A lost copy takes no write (it would move its version past the one lost, which the copy
/// restoring it must reach); a whole copy of the version lost replaces it.
#[test]
fn a_lost_copy_takes_no_write_until_replaced() {
    let d = tempfile::tempdir().unwrap();
    let oid = ObjectId::data(Vid(1), ObjIndex(5));
    let s = FileStore::open(d.path()).unwrap();
    lost_after_a_failed_sync(&s, oid);
    assert!(matches!(s.read(oid, 0, 1), Err(StoreError::Lost(_))));
    for w in [
        s.write(oid, 0, b"d", None, v(4)),
        s.write_now(oid, 0, b"d", None, v(4)).unwrap(),
    ] {
        assert!(matches!(w, Err(StoreError::Lost(_))), "{w:?}");
    }
    assert_eq!(s.meta(oid).unwrap().version, v(3));
    assert!(s.put_if_newer(oid, b"c", ObjState::live(v(3))).unwrap());
    assert_eq!(s.read(oid, 0, 1).unwrap(), b"c");
    s.write(oid, 0, b"d", None, v(4)).unwrap();
}

/// The version in a file's name is the last one synced: a reopen without a flush shows the
/// version of the bytes known durable, never a newer one, and marks the copy suspect (its
/// bytes may be newer); a copy flushed since its last write is not suspect.
#[test]
fn unflushed_versions_are_not_claimed_after_a_crash() {
    let d = tempfile::tempdir().unwrap();
    let oid = ObjectId::data(Vid(1), ObjIndex(0));
    {
        let s = FileStore::open(d.path()).unwrap();
        written_flushed_then_again(&s, oid);
        // Dropped without a flush: as after kill -9.
    }
    let s = FileStore::open(d.path()).unwrap();
    let st = s.meta(oid).unwrap();
    assert_eq!((st.version, st.suspect), (v(2), true));
    assert_eq!(s.read(oid, 0, 1).unwrap(), b"c");
    // The same version from elsewhere replaces a suspect copy; settling keeps it.
    assert!(s.put_if_newer(oid, b"b", ObjState::live(v(2))).unwrap());
    assert!(!s.meta(oid).unwrap().suspect);
    s.write(oid, 0, b"d", None, v(3)).unwrap();
    s.flush().unwrap();
    s.write(oid, 1, b"e", None, v(4)).unwrap();
    drop(s);
    let s = FileStore::open(d.path()).unwrap();
    assert!(s.meta(oid).unwrap().suspect);
    s.settle(oid).unwrap();
    drop(s);
    let s = FileStore::open(d.path()).unwrap();
    let st = s.meta(oid).unwrap();
    assert_eq!((st.version, st.suspect), (v(3), false));
    assert_eq!(s.read(oid, 0, 2).unwrap(), b"de");
}

/// A write of the version alone (an erasure-coded strip a change left alone) leaves the file
/// unmarked: reopened before a sync it is its old version with its bytes, not suspect; synced,
/// it is named after the new version.
#[test]
fn a_version_alone_is_never_suspect() {
    let d = tempfile::tempdir().unwrap();
    let oid = ObjectId::data(Vid(1), ObjIndex(0)).strip(2);
    {
        let s = FileStore::open(d.path()).unwrap();
        s.write(oid, 0, b"ab", None, v(1)).unwrap();
        s.sync_object(oid).unwrap();
        s.write(oid, 0, b"", None, v(2)).unwrap();
        assert_eq!(s.meta(oid).unwrap().version, v(2));
        // Dropped before the sync: as after kill -9.
    }
    let s = FileStore::open(d.path()).unwrap();
    let st = s.meta(oid).unwrap();
    assert_eq!((st.version, st.suspect), (v(1), false));
    assert_eq!(s.read(oid, 0, 2).unwrap(), b"ab");
    s.write(oid, 0, b"", None, v(3)).unwrap();
    s.sync_object(oid).unwrap();
    drop(s);
    let s = FileStore::open(d.path()).unwrap();
    let st = s.meta(oid).unwrap();
    assert_eq!((st.version, st.suspect), (v(3), false));
    assert_eq!(s.read(oid, 0, 2).unwrap(), b"ab");
}

#[test]
fn reopen_keeps_newest_copy_and_clears_tmp() {
    let d = tempfile::tempdir().unwrap();
    let oid = ObjectId::data(Vid(9), ObjIndex(0));
    {
        let s = FileStore::open(d.path()).unwrap();
        assert!(s.put_if_newer(oid, b"new", ObjState::live(v(7))).unwrap());
        assert!(!s.put_if_newer(oid, b"older", ObjState::live(v(6))).unwrap());
    }
    // An older copy left by a crash, and a name written by an older release (decimal).
    fs::write(d.path().join(format!("{oid}.4")), b"old").unwrap();
    fs::write(d.path().join(".tmp/junk"), b"partial").unwrap();
    let s = FileStore::open(d.path()).unwrap();
    assert_eq!(
        s.read_whole(oid).unwrap(),
        (b"new".to_vec(), ObjState::live(v(7)))
    );
    assert!(!d.path().join(format!("{oid}.4")).exists());
    assert!(!d.path().join(".tmp/junk").exists());
}

/// A flush that starts while an earlier one is still syncing what it took must not return
/// before that sync: its caller's writes may be among them. (Before the fix, the second
/// flush found nothing dirty and returned at once.)
#[test]
fn a_flush_waits_for_an_earlier_flush_still_syncing() {
    let d = tempfile::tempdir().unwrap();
    let s = FileStore::open(d.path()).unwrap();
    let (x, y) = (
        ObjectId::data(Vid(1), ObjIndex(0)),
        ObjectId::data(Vid(1), ObjIndex(1)),
    );
    for oid in [x, y] {
        s.write(oid, 0, b"created", None, v(1)).unwrap();
        s.write(oid, 0, b"written", None, v(2)).unwrap();
    }
    // The first flush will stop at x until the test lets go of its lock.
    let s = &s;
    let held = s.lock(x).write().unwrap();
    std::thread::scope(move |scope| {
        let first = scope.spawn(move || s.flush());
        // It has taken both objects: nothing is dirty now.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !s.dirty.lock().unwrap().is_empty() {
            assert!(
                std::time::Instant::now() < deadline,
                "the first flush never started"
            );
            std::thread::yield_now();
        }
        let (tx, rx) = std::sync::mpsc::channel();
        scope.spawn(move || tx.send(s.flush().is_ok()).unwrap());
        assert!(
            rx.recv_timeout(std::time::Duration::from_millis(300))
                .is_err(),
            "a flush returned while an earlier one had not synced x yet"
        );
        drop(held);
        assert!(first.join().unwrap().is_ok());
        assert!(rx.recv().unwrap());
    });
}

/// A data object a write creates is an unsynced `<oid>.0.n` until the next flush names it
/// after its version; reopened before that, it is gone (a kill, a crash). An inode is created
/// durable at once. After a failed sync of a new object, keeping what remains drops it.
#[test]
fn a_new_data_object_is_durable_at_the_next_flush() {
    let d = tempfile::tempdir().unwrap();
    let names = || {
        let mut n: Vec<String> = fs::read_dir(d.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| !n.starts_with('.'))
            .collect();
        n.sort();
        n
    };
    let a = ObjectId::data(Vid(1), ObjIndex(0));
    let ino = ObjectId::inode(Vid(1));
    let s = FileStore::open(d.path()).unwrap();
    s.write(a, 0, b"x", None, v(1)).unwrap();
    s.write(a, 1, b"y", None, v(2)).unwrap();
    s.write(ino, 0, b"i", None, v(1)).unwrap();
    assert_eq!(names(), vec![format!("{a}.0.n"), format!("{ino}.1")]);
    assert_eq!(s.read(a, 0, 2).unwrap(), b"xy");
    drop(s);
    let s = FileStore::open(d.path()).unwrap();
    assert_eq!(s.list(), vec![(ino, ObjState::live(v(1)))]);
    assert_eq!(names(), vec![format!("{ino}.1")]);

    s.write(a, 0, b"x", None, v(3)).unwrap();
    s.flush().unwrap();
    assert_eq!(names(), vec![format!("{a}.3"), format!("{ino}.1")]);
    drop(s);
    let s = FileStore::open(d.path()).unwrap();
    assert_eq!(s.meta(a), Some(ObjState::live(v(3))));
    assert_eq!(s.read(a, 0, 1).unwrap(), b"x");

    // What a failed fdatasync of a new object does (see `flush`): lost at its version.
    let b = ObjectId::data(Vid(1), ObjIndex(1));
    s.write(b, 0, b"z", None, v(4)).unwrap();
    s.dirty.lock().unwrap().remove(&b);
    s.bad.lock().unwrap().insert(b, None);
    assert_eq!(s.meta(b).unwrap().version, v(4));
    assert!(matches!(s.read(b, 0, 1), Err(StoreError::Lost(_))));
    assert_eq!(s.accept_lost(b).unwrap(), None);
    assert_eq!(s.meta(b), None);
    assert_eq!(names(), vec![format!("{a}.3"), format!("{ino}.1")]);
}

/// A change of several parts that fails after its first part is in (here the second part lies
/// past the largest object) leaves the copy lost, as a failed sync does: never at a version
/// whose bytes are neither the old ones nor the new.
#[test]
fn parts_failing_halfway_lose_the_copy() {
    let d = tempfile::tempdir().unwrap();
    let s = FileStore::open(d.path()).unwrap();
    let oid = ObjectId::data(Vid(1), ObjIndex(2));
    s.write(oid, 0, b"old", None, v(1)).unwrap();
    let past = crate::store::sums::MAX_BLOCKS * crate::store::sums::BLOCK as u64;
    let res = s.write_parts(oid, &[(0, b"new", None), (past, b"x", None)], false, v(2));
    match res {
        Err(StoreError::SyncFailed { oids, .. }) => assert_eq!(oids, vec![(oid, v(2))]),
        other => panic!("expected the copy lost, got {other:?}"),
    }
    assert!(matches!(s.read(oid, 0, 3), Err(StoreError::Lost(_))));
    // A first part that fails changes nothing and loses nothing.
    let other = ObjectId::data(Vid(1), ObjIndex(3));
    s.write(other, 0, b"old", None, v(1)).unwrap();
    assert!(matches!(
        s.write_parts(other, &[(past, b"x", None)], false, v(2)),
        Err(StoreError::Io { .. })
    ));
    assert_eq!(s.read(other, 0, 3).unwrap(), b"old");
}

/// A note is read back until the object is forgotten or installed whole; it survives a
/// reopen; a torn one reads as none.
#[test]
fn a_notes_start_is_read_without_its_tail() {
    let d = tempfile::tempdir().unwrap();
    let a = ObjectId::data(Vid(1), ObjIndex(0)).strip(1);
    let long: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
    {
        let s = FileStore::open(d.path()).unwrap();
        assert_eq!(s.note_prefix(a, 24), None);
        s.set_note(a, &long).unwrap();
        assert_eq!(s.note_prefix(a, 24).as_deref(), Some(&long[..24]));
        assert_eq!(
            s.note_prefix(a, 1000).as_deref(),
            Some(&long[..1000]),
            "past the kept start"
        );
        s.set_note(a, b"short").unwrap();
        assert_eq!(s.note_prefix(a, 24).as_deref(), Some(&b"short"[..]));
        s.set_note(a, &long).unwrap();
        s.flush().unwrap();
    }
    // A store opened afresh reads it from the file, whole and checked.
    let s = FileStore::open(d.path()).unwrap();
    assert_eq!(s.note_prefix(a, 24).as_deref(), Some(&long[..24]));
    let path = d.path().join(".notes").join(a.to_string());
    let mut b = fs::read(&path).unwrap();
    b[50_000] ^= 1;
    fs::write(&path, &b).unwrap();
    drop(s);
    let s = FileStore::open(d.path()).unwrap();
    assert_eq!(
        s.note_prefix(a, 24),
        None,
        "torn in its tail: no note, not its start"
    );
    s.set_note(a, b"n").unwrap();
    s.write(a, 0, b"x", None, v(1)).unwrap();
    assert_eq!(s.note_prefix(a, 24).as_deref(), Some(&b"n"[..]));
    s.forget(a).unwrap();
    assert_eq!(s.note_prefix(a, 24), None, "forgotten: the note went");
}

#[test]
fn notes_last_with_their_object() {
    let d = tempfile::tempdir().unwrap();
    let s = FileStore::open(d.path()).unwrap();
    let a = ObjectId::data(Vid(1), ObjIndex(0)).strip(2);
    assert_eq!(s.note(a), None);
    s.set_note(a, b"first note").unwrap();
    s.write(a, 0, b"x", None, v(1)).unwrap();
    s.set_note(a, b"2nd").unwrap();
    assert_eq!(s.note(a).as_deref(), Some(&b"2nd"[..]));
    let path = d.path().join(".notes").join(a.to_string());
    assert_eq!(
        fs::metadata(&path).unwrap().len(),
        8 + 3,
        "a shorter note frees its tail"
    );
    s.flush().unwrap();
    drop(s);
    let s = FileStore::open(d.path()).unwrap();
    assert_eq!(s.note(a).as_deref(), Some(&b"2nd"[..]));
    assert_eq!(s.list().len(), 1, "the notes are not objects");
    // Torn: its sum no longer matches.
    let mut b = fs::read(&path).unwrap();
    b[8] ^= 1;
    fs::write(&path, &b).unwrap();
    assert_eq!(s.note(a), None);
    s.set_note(a, b"again").unwrap();
    assert!(s.put_if_newer(a, b"whole", ObjState::live(v(5))).unwrap());
    assert_eq!(s.note(a), None, "installed whole: the note went");
    s.set_note(a, b"n").unwrap();
    s.forget(a).unwrap();
    assert_eq!(s.note(a), None, "forgotten: the note went");
}

/// `sync_object` makes one object's version, bytes and note durable as a flush would: a reopen
/// shows that version, not suspect, with its note; an object not synced stays as it was.
#[test]
fn sync_object_makes_one_object_durable() {
    let d = tempfile::tempdir().unwrap();
    let a = ObjectId::data(Vid(1), ObjIndex(0)).strip(0);
    let b = ObjectId::data(Vid(1), ObjIndex(1)).strip(0);
    {
        let s = FileStore::open(d.path()).unwrap();
        for (oid, n) in [(a, b"a"), (b, b"b")] {
            s.set_note(oid, n).unwrap();
            s.write(oid, 0, b"1", None, v(1)).unwrap();
        }
        s.sync_object(a).unwrap();
        s.flush().unwrap();
        s.set_note(a, b"a2").unwrap();
        s.write(a, 0, b"2", None, v(2)).unwrap();
        s.sync_object(a).unwrap();
        s.write(b, 0, b"2", None, v(2)).unwrap();
        // Dropped without a flush: as after kill -9.
    }
    let s = FileStore::open(d.path()).unwrap();
    let st = s.meta(a).unwrap();
    assert_eq!((st.version, st.suspect), (v(2), false));
    assert_eq!(s.read(a, 0, 1).unwrap(), b"2");
    assert_eq!(s.note(a).as_deref(), Some(&b"a2"[..]));
    let st = s.meta(b).unwrap();
    assert_eq!((st.version, st.suspect), (v(1), true));
}

/// Objects at v1, flushed, then each written again at v2 with a new note: every object and
/// note dirty, the notes' files fresh. The objects, in the order a flush syncs them.
fn many_dirty(s: &FileStore) -> Vec<ObjectId> {
    let mut oids: Vec<ObjectId> = (0..300)
        .map(|i| ObjectId::data(Vid(1), ObjIndex(i)))
        .collect();
    oids.sort_unstable();
    let data = vec![7u8; 256 << 10];
    for &oid in &oids {
        s.write(oid, 0, &data, None, v(1)).unwrap();
    }
    s.flush().unwrap();
    for &oid in &oids {
        s.set_note(oid, b"what undoes v2").unwrap();
        s.write(oid, 0, &data[..4096], None, v(2)).unwrap();
    }
    oids
}

/// Spins until `taken` says a flush took what it syncs.
fn until(taken: impl Fn() -> bool) {
    let start = std::time::Instant::now();
    while !taken() {
        assert!(start.elapsed() < std::time::Duration::from_secs(30));
        std::thread::yield_now();
    }
}

/// A change synced while a flush that took its note (the undo of an erasure-coded strip's
/// change) is still syncing waits for that flush: answering at once, its holder would then
/// overwrite the bytes the note undoes while the note may not be durable yet, and a power cut
/// could keep the new bytes without the undo. (Without the wait, `sync_object` returned while
/// the flush had synced a few of the 300 notes.)
#[test]
fn a_sync_waits_for_the_flush_that_took_its_note() {
    let d = tempfile::tempdir().unwrap();
    let s = FileStore::open(d.path()).unwrap();
    let last = *many_dirty(&s).last().unwrap();
    std::thread::scope(|scope| {
        let flush = scope.spawn(|| s.flush());
        until(|| s.notes.dirty.lock().unwrap().is_empty());
        s.notes.sync_one(last).unwrap();
        assert!(
            s.notes.fresh.lock().unwrap().is_empty(),
            "the flush syncing the note was done"
        );
        flush.join().unwrap().unwrap();
    });
}

/// The same for the bytes: a strip's change acknowledged while the flush that took it is
/// still syncing other objects would be acknowledged before it is durable. (Without the wait,
/// the object was still marked as being written when `sync_object` returned.)
#[test]
fn a_sync_waits_for_the_flush_that_took_its_object() {
    let d = tempfile::tempdir().unwrap();
    let s = FileStore::open(d.path()).unwrap();
    let last = *many_dirty(&s).last().unwrap();
    std::thread::scope(|scope| {
        let flush = scope.spawn(|| s.flush());
        until(|| s.dirty.lock().unwrap().is_empty());
        s.sync_object(last).unwrap();
        let e = s.entry(last).unwrap();
        assert!(!e.marked, "synced and named after v2 by the flush");
        assert_eq!(e.disk, v(2));
        flush.join().unwrap().unwrap();
    });
}
