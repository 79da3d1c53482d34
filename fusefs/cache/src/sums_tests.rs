use super::*;
use crate::spare::Spares;

const B: usize = BLOCK as usize;

/// Object (1, 2) of 64 KiB with blocks 0..4 written (`dirty` ones 2..4) and saved, then
/// loaded again from its files with the byte at `flip` (if any) changed meanwhile.
fn loaded(flip: Option<u64>) -> (tempfile::TempDir, CachedObject) {
    let d = tempfile::tempdir().unwrap();
    let spares = Spares::open(d.path().join("spare"));
    let o = CachedObject::create(d.path(), (1, 2), 64 << 10, &spares).unwrap();
    o.write_data(&vec![5u8; 4 * B], 0).unwrap();
    {
        let mut st = o.state.lock().unwrap();
        st.valid.set_range(0, 4, true);
        st.dirty.set_range(2, 4, true);
        o.save(&st).unwrap();
    }
    drop(o);
    if let Some(at) = flip {
        let f = OpenOptions::new()
            .write(true)
            .open(d.path().join("000001/00000002.data"))
            .unwrap();
        f.write_all_at(&[6], at).unwrap();
    }
    let o = CachedObject::load(d.path(), (1, 2)).unwrap();
    (d, o)
}

#[test]
fn partial_writes_sum_the_whole_block() {
    let (_d, o) = loaded(None);
    // Bytes 100..200 of block 1 and the start of block 2, summed with the bytes around them.
    o.write_data(&vec![9u8; B], B as u64 + 100).unwrap();
    let sums = o.sums.as_ref().unwrap();
    for b in 0..4 {
        assert!(sums.check(o.data_file(), b).unwrap(), "block {b}");
    }
    assert_eq!(o.verify(0, 16), Verified::default());
}

#[test]
fn a_corrupt_clean_block_is_dropped_once() {
    let (_d, o) = loaded(Some(B as u64 + 3));
    assert!(o.state.lock().unwrap().needs_check(0, 1));
    assert_eq!(o.verify(0, 1), Verified::default(), "block 0 is good");
    let v = o.verify(0, 4);
    assert_eq!((v.dropped, v.quarantined, v.refused), (1, 0, false));
    let st = o.state.lock().unwrap();
    assert_eq!(st.valid.runs(), vec![(0, 1), (2, 4)]);
    assert!(st.unverified.is_none(), "every block checked");
    assert!(!st.needs_check(0, 16));
    drop(st);
    // Saved: a restart does not bring it back.
    assert_eq!(
        CachedObject::load(_d.path(), (1, 2))
            .unwrap()
            .state
            .lock()
            .unwrap()
            .valid
            .runs(),
        vec![(0, 1), (2, 4)]
    );
}

#[test]
fn a_corrupt_dirty_block_is_quarantined_and_blocks_are_checked_once_per_load() {
    let (d, o) = loaded(Some(3 * B as u64));
    let v = o.verify(0, 16);
    assert_eq!((v.dropped, v.quarantined, v.refused), (0, 1, true));
    assert!(!o.verify(0, 3).refused);
    let again = o.verify(3, 4);
    assert_eq!((again.quarantined, again.refused), (0, true), "found once");
    let st = o.state.lock().unwrap();
    assert!(st.dirty.get(3) && st.valid.get(3), "kept dirty");
    drop(st);
    // Checked blocks are not checked again in this mount: a byte changed now goes unseen.
    let f = OpenOptions::new()
        .write(true)
        .open(d.path().join("000001/00000002.data"))
        .unwrap();
    f.write_all_at(&[7], 0).unwrap();
    assert!(!o.state.lock().unwrap().needs_check(0, 1));
    assert_eq!(o.verify(0, 1), Verified::default());
}

#[test]
fn a_new_object_has_nothing_to_check() {
    let d = tempfile::tempdir().unwrap();
    let spares = Spares::open(d.path().join("spare"));
    let o = CachedObject::create(d.path(), (1, 2), 64 << 10, &spares).unwrap();
    o.write_data(&[1u8; 10], 0).unwrap();
    o.state.lock().unwrap().valid.set_range(0, 1, true);
    assert!(!o.state.lock().unwrap().needs_check(0, 16));
}

#[test]
fn a_write_cut_between_its_sums_and_its_data_leaves_a_block_that_matches() {
    let (_d, o) = loaded(None);
    let sums = o.sums.as_ref().unwrap();
    // A kill -9 after the sums of a write, before its data: the old bytes still match.
    sums.record(o.data_file(), &[8u8; 300], B as u64 + 10)
        .unwrap();
    assert!(sums.check(o.data_file(), 1).unwrap(), "old bytes");
    // Once the data is in, the new bytes match (summed with the block's other bytes).
    o.data_file()
        .write_all_at(&[8u8; 300], B as u64 + 10)
        .unwrap();
    assert!(sums.check(o.data_file(), 1).unwrap(), "new bytes");
    // Anything else does not.
    o.data_file().write_all_at(&[9u8], B as u64 + 2000).unwrap();
    assert!(!sums.check(o.data_file(), 1).unwrap(), "other bytes");
    assert!(sums.check(o.data_file(), 0).unwrap());
}

/// Sums kept through the mapping and with syscalls (past `MAX_MAPPED`) are the same bytes in
/// the file, there for another reader while the writer still runs, unflushed (what a restart
/// after a `kill -9` finds).
#[test]
fn mapped_and_syscall_sums_write_the_same_file() {
    let d = tempfile::tempdir().unwrap();
    let spares = Spares::open(d.path().join("spare"));
    let a = CachedObject::create(d.path(), (1, 2), 64 << 10, &spares).unwrap();
    let b = CachedObject::create(d.path(), (1, 3), 64 << 10, &spares).unwrap();
    b.sums.as_ref().unwrap().never_map();
    for o in [&a, &b] {
        o.write_data(&vec![5u8; 4 * B], 0).unwrap();
        o.write_data(&vec![9u8; B], B as u64 + 100).unwrap();
    }
    assert!(a.sums.as_ref().unwrap().is_mapped());
    assert!(!b.sums.as_ref().unwrap().is_mapped());
    let file = |k: u32| std::fs::read(d.path().join(format!("000001/0000000{k}.sums"))).unwrap();
    assert_eq!(file(2), file(3));
    let block0 = crc_fast::crc32_iscsi(&[5u8; B]).to_le_bytes();
    assert_eq!(file(2)[..4], block0, "block 0's sum");
    let again = CachedObject::load(d.path(), (1, 2)).unwrap();
    let sums = again.sums.as_ref().unwrap();
    for blk in 0..3 {
        assert!(sums.check(again.data_file(), blk).unwrap(), "block {blk}");
    }
}
