//! The file store's checksums: the on-disk format, bad blocks, holes, unaligned writes, torn
//! sums on a suspect copy, and the conversion of a store written before checksums.

use super::*;
use crate::store::sums::{self, BLOCK, HEADER_LEN, MAGIC};
use objstore_proto::oid::{ObjIndex, Vid};
use std::os::unix::fs::FileExt;

fn v(n: u64) -> Version {
    Version(n)
}

fn oid() -> ObjectId {
    ObjectId::data(Vid(3), ObjIndex(1))
}

/// The one file of `oid` in `dir`.
fn file_of(dir: &Path, oid: ObjectId) -> PathBuf {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_str()
                .unwrap()
                .starts_with(&oid.to_string())
        })
        .expect("the object's file")
}

/// Flips one byte of the object's data at `at` in its file, behind the store's back.
fn flip(dir: &Path, oid: ObjectId, at: u64) {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(file_of(dir, oid))
        .unwrap();
    let mut b = [0u8];
    f.read_exact_at(&mut b, HEADER_LEN + at).unwrap();
    b[0] ^= 0x10;
    f.write_all_at(&b, HEADER_LEN + at).unwrap();
}

#[test]
fn a_flipped_byte_is_never_read_and_a_copy_as_new_replaces_it() {
    let d = tempfile::tempdir().unwrap();
    let s = FileStore::open(d.path()).unwrap();
    let data: Vec<u8> = (0..3 * BLOCK + 100).map(|i| (i % 251) as u8).collect();
    assert!(s.put_if_newer(oid(), &data, ObjState::live(v(4))).unwrap());
    let path = file_of(d.path(), oid());
    assert_eq!(
        fs::metadata(&path).unwrap().len(),
        HEADER_LEN + data.len() as u64,
        "the file's length gives the object's"
    );
    let head = fs::read(&path).unwrap();
    assert_eq!(&head[..8], &MAGIC);
    flip(d.path(), oid(), 2 * BLOCK as u64 + 7);
    // Blocks that check are still served; the bad block never is.
    assert_eq!(s.read(oid(), 0, BLOCK).unwrap(), &data[..BLOCK]);
    assert!(matches!(
        s.read(oid(), 2 * BLOCK as u64 + 5, 3),
        Err(StoreError::Corrupt { block: 2, .. })
    ));
    // From then on the copy is bad as a whole, until replaced by a copy at least as new.
    assert!(matches!(
        s.read(oid(), 0, 1),
        Err(StoreError::Corrupt { .. })
    ));
    assert!(matches!(
        s.read_whole(oid()),
        Err(StoreError::Corrupt { .. })
    ));
    assert!(!s.put_if_newer(oid(), b"old", ObjState::live(v(3))).unwrap());
    assert!(s.put_if_newer(oid(), &data, ObjState::live(v(4))).unwrap());
    assert_eq!(s.read_whole(oid()).unwrap().0, data);
    // Found again after a restart, which forgets what was known bad.
    s.flush().unwrap();
    drop(s);
    flip(d.path(), oid(), 0);
    let s = FileStore::open(d.path()).unwrap();
    assert!(matches!(
        s.read_whole(oid()),
        Err(StoreError::Corrupt { block: 0, .. })
    ));
}

#[test]
fn a_flipped_sum_or_header_is_found_too() {
    let d = tempfile::tempdir().unwrap();
    let s = FileStore::open(d.path()).unwrap();
    s.write(oid(), 0, &[9u8; 2 * BLOCK], None, v(1)).unwrap();
    let f = OpenOptions::new()
        .write(true)
        .open(file_of(d.path(), oid()))
        .unwrap();
    f.write_all_at(&[0xee], sums::TABLE_AT + 4 + 1).unwrap();
    assert!(matches!(
        s.read(oid(), BLOCK as u64, 1),
        Err(StoreError::Corrupt { block: 1, .. })
    ));
    let d = tempfile::tempdir().unwrap();
    let s = FileStore::open(d.path()).unwrap();
    s.write(oid(), 0, b"x", None, v(1)).unwrap();
    let f = OpenOptions::new()
        .write(true)
        .open(file_of(d.path(), oid()))
        .unwrap();
    f.write_all_at(b"N", 0).unwrap();
    assert!(matches!(
        s.read_whole(oid()),
        Err(StoreError::Corrupt { .. })
    ));
}

/// Unaligned writes and holes, against a model of the bytes; all of it checks after a
/// reopen, and the hole blocks have no sum written (they read as zeros and check).
#[test]
fn unaligned_writes_and_holes_check() {
    let d = tempfile::tempdir().unwrap();
    let s = FileStore::open(d.path()).unwrap();
    let mut model = vec![0u8; 40 * BLOCK];
    let writes: &[(usize, usize, u8)] = &[
        (20 * BLOCK + 3, 10, 1),
        (5, 3, 2),
        (BLOCK - 1, 2, 3),
        (3 * BLOCK, 2 * BLOCK, 4),
        (3 * BLOCK + 100, 5000, 5),
        (20 * BLOCK, 20 * BLOCK, 6),
        (7 * BLOCK + 4095, 1, 7),
    ];
    let mut end = 0;
    for (i, &(off, len, byte)) in writes.iter().enumerate() {
        s.write(oid(), off as u64, &vec![byte; len], None, v(i as u64 + 1))
            .unwrap();
        model[off..off + len].fill(byte);
        end = end.max(off + len);
        if i == 3 {
            s.flush().unwrap();
        }
    }
    s.flush().unwrap();
    assert_eq!(s.read(oid(), 0, end).unwrap(), &model[..end]);
    drop(s);
    let s = FileStore::open(d.path()).unwrap();
    assert_eq!(s.read_whole(oid()).unwrap().0, &model[..end]);
    for (off, len) in [(0, 1), (BLOCK - 2, 5), (10 * BLOCK, BLOCK), (end - 3, 10)] {
        let mut want = model[off.min(end)..(off + len).min(end)].to_vec();
        want.resize(len, 0);
        assert_eq!(s.read(oid(), off as u64, len).unwrap(), want);
    }
    // The sums of the blocks in the hole (10..20) were never written.
    let f = File::open(file_of(d.path(), oid())).unwrap();
    let mut t = [0u8; 40];
    f.read_exact_at(&mut t, sums::TABLE_AT + 4 * 10).unwrap();
    assert_eq!(t, [0u8; 40]);
}

/// An unaligned write reads its edge blocks back: one that does not check fails the write
/// and is never given a fresh sum.
#[test]
fn a_write_does_not_bless_a_bad_edge_block() {
    let d = tempfile::tempdir().unwrap();
    let s = FileStore::open(d.path()).unwrap();
    s.write(oid(), 0, &[1u8; 2 * BLOCK], None, v(1)).unwrap();
    flip(d.path(), oid(), 10);
    assert!(matches!(
        s.write(oid(), 5, b"abc", None, v(2)),
        Err(StoreError::Corrupt { block: 0, .. })
    ));
    assert!(matches!(
        s.read(oid(), 0, 1),
        Err(StoreError::Corrupt { .. })
    ));
}

/// A crash with writes not yet flushed may leave a marked (suspect) file whose bytes and sums
/// are out of step: that is not corruption. It reads unchecked; settled, its sums are
/// recomputed from its bytes and checked again from then on.
#[test]
fn a_suspect_copy_with_torn_sums_is_resealed_when_settled() {
    let d = tempfile::tempdir().unwrap();
    {
        let s = FileStore::open(d.path()).unwrap();
        s.write(oid(), 0, &[1u8; 2 * BLOCK], None, v(1)).unwrap();
        s.flush().unwrap();
        s.write(oid(), 0, &[2u8; BLOCK], None, v(2)).unwrap();
    }
    // The crash: block 1 got bytes whose sum never landed.
    flip(d.path(), oid(), BLOCK as u64 + 1);
    let s = FileStore::open(d.path()).unwrap();
    let st = s.meta(oid()).unwrap();
    assert!(st.suspect);
    let (bytes, _) = s.read_whole(oid()).unwrap();
    assert_eq!(bytes[BLOCK + 1], 1 ^ 0x10);
    s.settle(oid()).unwrap();
    assert!(!s.meta(oid()).unwrap().suspect);
    assert_eq!(s.read_whole(oid()).unwrap().0, bytes);
    drop(s);
    let s = FileStore::open(d.path()).unwrap();
    assert_eq!(s.read_whole(oid()).unwrap().0, bytes);
    flip(d.path(), oid(), 3);
    assert!(matches!(
        s.read(oid(), 0, 4),
        Err(StoreError::Corrupt { block: 0, .. })
    ));
    // Kept when no replica has it (accept_lost): suspect, resealed, readable.
    assert!(s.accept_lost(oid()).unwrap().unwrap().suspect);
    s.settle(oid()).unwrap();
    assert_eq!(s.read(oid(), 3, 1).unwrap(), [2 ^ 0x10]);
}

/// A store written before checksums (no format marker, files of bare bytes) is converted
/// when opened; a store of an unknown format is refused with an error naming it.
#[test]
fn an_old_store_is_converted_and_an_unknown_format_refused() {
    let d = tempfile::tempdir().unwrap();
    let a = ObjectId::data(Vid(5), ObjIndex(0));
    let b = ObjectId::data(Vid(5), ObjIndex(1));
    let old: Vec<u8> = (0..BLOCK * 2 + 17).map(|i| (i * 7) as u8).collect();
    fs::write(d.path().join(format!("{a}.3")), &old).unwrap();
    fs::write(d.path().join(format!("{b}.2.w")), b"suspect bytes").unwrap();
    fs::write(d.path().join(format!("{b}.4.del")), b"").unwrap();
    let s = FileStore::open(d.path()).unwrap();
    assert_eq!(
        s.read_whole(a).unwrap(),
        (old.clone(), ObjState::live(v(3)))
    );
    assert_eq!(s.meta(b).unwrap(), ObjState::tombstone(v(4)));
    assert_eq!(
        fs::read_to_string(d.path().join(layout::FORMAT_FILE)).unwrap(),
        "1\n"
    );
    drop(s);
    // Opening again converts nothing twice.
    let s = FileStore::open(d.path()).unwrap();
    assert_eq!(s.read_whole(a).unwrap().0, old);
    drop(s);
    // A conversion cut short (marker not yet written) resumes: converted files are kept.
    fs::remove_file(d.path().join(layout::FORMAT_FILE)).unwrap();
    let s = FileStore::open(d.path()).unwrap();
    assert_eq!(s.read_whole(a).unwrap().0, old);
    drop(s);
    fs::write(d.path().join(layout::FORMAT_FILE), "7\n").unwrap();
    let err = FileStore::open(d.path())
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains(&d.path().display().to_string()), "{err}");
    assert!(err.contains("format \"7\""), "{err}");
}
