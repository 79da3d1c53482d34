//! One object file's layout (see [`crate::store::sums`]): a header region with the block sums,
//! then the object's bytes. Reads check every block they return; writes keep the sums of the
//! blocks they touch, reading back (and checking) the edge blocks a write covers only in part.
//! Also the store directory's format marker and the conversion of a store written before
//! checksums existed.

use std::fs::{self, File};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use objstore_proto::oid::ObjectId;

use super::{fsync_dir, parse_name, StoreError};
use crate::store::sums::{self, BLOCK, HEADER_LEN, MAX_BLOCKS, TABLE_AT};
use crate::store::Part;

/// The file in the store directory naming its format.
pub(super) const FORMAT_FILE: &str = ".format";

/// The sum of the header itself is not kept: a bad header reads as this block.
pub const HEADER_BLOCK: u64 = u64::MAX;

/// Removes a temporary file unless disarmed (the write that made it succeeded).
pub(super) struct DeleteOnDrop(pub(super) Option<PathBuf>);

impl Drop for DeleteOnDrop {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = fs::remove_file(p);
        }
    }
}

/// Reads into `buf` from `at` until it is full or the file ends; returns the bytes read.
fn read_full(f: &File, buf: &mut [u8], at: u64) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read_at(&mut buf[n..], at + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Up to `len` bytes of `f` from `at` (fewer where the file ends), read straight into a new
/// vector's capacity with pread: a large read pays no zero fill before the kernel's copy (on
/// a node's sequential reads the fill cost about a tenth of its CPU).
fn read_fresh(f: &File, at: u64, len: usize) -> io::Result<Vec<u8>> {
    let mut buf: Vec<u8> = Vec::with_capacity(len);
    while buf.len() < len {
        let done = buf.len();
        let off = libc::off_t::try_from(at + done as u64)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset too large"))?;
        let spare = &mut buf.spare_capacity_mut()[..len - done];
        // SAFETY: the pointer and length name `spare`, writable memory owned by `buf`; pread
        // writes at most that many bytes and returns how many it wrote.
        let n = unsafe { libc::pread(f.as_raw_fd(), spare.as_mut_ptr().cast(), spare.len(), off) };
        match n {
            0 => break,
            n if n > 0 => {
                // SAFETY: pread initialised the first n bytes of the spare capacity.
                unsafe { buf.set_len(done + n as usize) }
            }
            _ => {
                let e = io::Error::last_os_error();
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
    Ok(buf)
}

/// A read or write past the largest object: no table has room for its blocks' sums.
fn past_largest(oid: ObjectId, op: &'static str) -> StoreError {
    let why = format!("{op} past the largest object");
    StoreError::io(oid, op, io::Error::new(io::ErrorKind::InvalidInput, why))
}

/// The sums of blocks `[first, end)`.
fn table(f: &File, oid: ObjectId, first: u64, end: u64) -> Result<Vec<u32>, StoreError> {
    let mut t = vec![0u8; 4 * (end - first) as usize];
    let n =
        read_full(f, &mut t, TABLE_AT + 4 * first).map_err(|e| StoreError::io(oid, "read", e))?;
    t[n..].fill(0);
    Ok(sums::decode(&t))
}

/// `len` bytes at `offset` of the object in `f` (zeros past its end), every block they touch
/// checked against its sum when `check`.
pub(super) fn read(
    f: &File,
    oid: ObjectId,
    offset: u64,
    len: usize,
    check: bool,
) -> Result<Vec<u8>, StoreError> {
    let (first, end) = sums::blocks(offset, len);
    if end > MAX_BLOCKS {
        return Err(past_largest(oid, "read"));
    }
    let start = first * BLOCK as u64;
    let want = ((end - first) as usize) * BLOCK;
    let mut buf =
        read_fresh(f, HEADER_LEN + start, want).map_err(|e| StoreError::io(oid, "read", e))?;
    let n = buf.len();
    buf.resize(want, 0);
    if check {
        if let Some(block) = sums::first_bad(first, &buf[..n], &table(f, oid, first, end)?) {
            return Err(StoreError::Corrupt { oid, block });
        }
    }
    let skip = (offset - start) as usize;
    if skip > 0 {
        buf.drain(..skip);
    }
    buf.truncate(len);
    Ok(buf)
}

/// The object's length: the file's, less the header region.
fn data_len(f: &File, oid: ObjectId) -> Result<u64, StoreError> {
    let len = f
        .metadata()
        .map_err(|e| StoreError::io(oid, "stat", e))?
        .len();
    Ok(len.saturating_sub(HEADER_LEN))
}

/// The whole object in `f`, checked (its header included) when `check`.
pub(super) fn read_all(f: &File, oid: ObjectId, check: bool) -> Result<Vec<u8>, StoreError> {
    if check {
        let mut h = [0u8; 12];
        let n = read_full(f, &mut h, 0).map_err(|e| StoreError::io(oid, "read", e))?;
        if n < h.len() || h != sums::header() {
            return Err(StoreError::Corrupt {
                oid,
                block: HEADER_BLOCK,
            });
        }
    }
    let len = data_len(f, oid)?;
    read(f, oid, 0, len as usize, check)
}

/// Writes `data` at `offset` into the object in `f` and the sums of the blocks it touches:
/// `given` as they are when they fit the write ([`sums::given`]: the primary's), else summed
/// here. An edge block the write covers in part is read back first, checked when `check` (a
/// bad block is never given a fresh sum).
pub(super) fn write(
    f: &File,
    oid: ObjectId,
    offset: u64,
    data: &[u8],
    given: Option<&[u32]>,
    check: bool,
) -> Result<(), StoreError> {
    if data.is_empty() {
        return Ok(());
    }
    if let Some(table) = sums::given(offset, data.len(), given) {
        let first = offset / BLOCK as u64;
        if first + table.len() as u64 > MAX_BLOCKS {
            return Err(past_largest(oid, "write"));
        }
        return write_with(f, oid, offset, data, first, table);
    }
    let (first, end) = sums::blocks(offset, data.len());
    if end > MAX_BLOCKS {
        return Err(past_largest(oid, "write"));
    }
    let stop = offset + data.len() as u64;
    let mut table = Vec::with_capacity((end - first) as usize);
    for b in first..end {
        let (lo, hi) = (b * BLOCK as u64, (b + 1) * BLOCK as u64);
        let (from, to) = (lo.max(offset), hi.min(stop));
        let part = &data[(from - offset) as usize..(to - offset) as usize];
        if from == lo && to == hi {
            table.push(sums::sum(part));
        } else {
            let mut old = read(f, oid, lo, BLOCK, check)?;
            old[(from - lo) as usize..(to - lo) as usize].copy_from_slice(part);
            table.push(sums::sum(&old));
        }
    }
    write_with(f, oid, offset, data, first, &table)
}

/// Writes `data` at `offset` and `table`, the sums of blocks `first..`.
fn write_with(
    f: &File,
    oid: ObjectId,
    offset: u64,
    data: &[u8],
    first: u64,
    table: &[u32],
) -> Result<(), StoreError> {
    f.write_all_at(data, HEADER_LEN + offset)
        .map_err(|e| StoreError::io(oid, "write", e))?;
    f.write_all_at(&sums::encode(table), TABLE_AT + 4 * first)
        .map_err(|e| StoreError::io(oid, "write", e))
}

/// Makes `f` (new and empty) an object file holding `data` at `offset` (with `given` sums as
/// [`write`] takes them).
pub(super) fn create(
    f: &File,
    oid: ObjectId,
    offset: u64,
    data: &[u8],
    given: Option<&[u32]>,
) -> Result<(), StoreError> {
    create_parts(f, oid, &[(offset, data, given)])
}

/// [`create`] with several parts (offset, data, sums), written in turn.
pub(super) fn create_parts(f: &File, oid: ObjectId, parts: &[Part<'_>]) -> Result<(), StoreError> {
    f.write_all_at(&sums::header(), 0)
        .map_err(|e| StoreError::io(oid, "write", e))?;
    if parts.iter().all(|p| p.1.is_empty()) {
        // Nothing past the header extends the file to it.
        f.set_len(HEADER_LEN)
            .map_err(|e| StoreError::io(oid, "write", e))?;
    }
    for &(offset, data, given) in parts {
        write(f, oid, offset, data, given, false)?;
    }
    Ok(())
}

/// Recomputes every sum from the bytes (a suspect copy made the reference, or kept after a
/// loss) and syncs them: from now on the bytes as they are read back as good.
pub(super) fn reseal(f: &File, oid: ObjectId) -> Result<(), StoreError> {
    let data = read_all(f, oid, false)?;
    let mut t = sums::sums_of(&data);
    t.resize(MAX_BLOCKS as usize, 0);
    f.write_all_at(&sums::header(), 0)
        .and_then(|()| f.write_all_at(&sums::encode(&t), TABLE_AT))
        .and_then(|()| f.sync_data())
        .map_err(|e| StoreError::io(oid, "write", e))
}

/// Whether `f` is an object file of this format whose every block checks.
fn is_current(f: &File, oid: ObjectId) -> bool {
    f.metadata().is_ok_and(|m| m.len() >= HEADER_LEN) && read_all(f, oid, true).is_ok()
}

/// Makes `dir` a store of this format: a new store is marked at once; a store written before
/// checksums (no marker) has each object file rewritten with its sums (new file, synced, then
/// renamed over the old one), then is marked. A conversion cut short is resumed: files
/// already converted are recognised and kept. A store of another format is refused.
pub(super) fn open_format(dir: &Path, tmp: &Path) -> io::Result<()> {
    let marker = dir.join(FORMAT_FILE);
    match fs::read_to_string(&marker) {
        Ok(s) if s.trim() == sums::FORMAT.to_string() => return Ok(()),
        Ok(s) => {
            return Err(io::Error::other(format!(
                "object store {} is in format {:?}, and this sheep reads format {} only; use the sheep release that wrote it",
                dir.display(),
                s.trim(),
                sums::FORMAT
            )))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    let mut converted = 0usize;
    for e in fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some((oid, state)) = parse_name(name) else {
            continue;
        };
        if state.deleted {
            continue;
        }
        let path = e.path();
        let old = File::open(&path)?;
        if is_current(&old, oid) {
            continue;
        }
        let bytes = fs::read(&path)?;
        let t = tmp.join(format!("{name}.convert"));
        let f = fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&t)?;
        create(&f, oid, 0, &bytes, None).map_err(io::Error::other)?;
        f.sync_all()?;
        fs::rename(&t, &path)?;
        converted += 1;
    }
    if converted > 0 {
        tracing::warn!(
            "object store {}: converted {converted} object file(s) written before checksums to the checked format",
            dir.display()
        );
    }
    fsync_dir(dir)?;
    let t = tmp.join(FORMAT_FILE);
    fs::write(&t, format!("{}\n", sums::FORMAT))?;
    File::open(&t)?.sync_all()?;
    fs::rename(&t, &marker)?;
    fsync_dir(dir)
}
