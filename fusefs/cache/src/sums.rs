//! Checksums of cached blocks (issue 25): a `<idx>.sums` file beside each object's data and
//! meta files, two crc32c (u32 LE) per [`BLOCK`]: the block's sum and the one it had before
//! its last write. Every write of the data file (user writes and fills) writes the sums
//! first, then the data, before it is acknowledged or marked valid: a `kill -9` between the
//! two leaves a block that matches one of its sums (old bytes, or new), never a false alarm.
//!
//! An object's sums file is mapped into memory at its first write (at most [`MAX_MAPPED`] at
//! once), so that keeping a block's sums costs a store, not two syscalls (which cost more
//! than a third of a cached 4 KiB write).
//!
//! The sums are checked once per block after a load from disk (a restart): the first read of
//! a block loaded valid checks it. A clean block that fails is dropped (its next read fetches
//! it from the cluster); a dirty one is quarantined: never served (reads get EIO), never
//! pushed, kept dirty, until a write covers the whole block again. In a running mount reads
//! check nothing: what the cache wrote itself is served as written.
//!
//! An object written by an older sheepfs has no sums file: it loads as before, unverified,
//! and stays without sums until it is evicted.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use memmap2::{MmapMut, MmapOptions};

use crate::object::{CachedObject, BLOCK};
use crate::stats::Counters;
use crate::{Backend, Inner};

/// The sums file of one cached object, mapped into memory once the object is written (see
/// [`Sums::record`]); until then, or past [`MAX_MAPPED`], read and written with syscalls.
pub struct Sums {
    file: File,
    map: Mutex<Mapping>,
}

enum Mapping {
    /// Not written since it was opened.
    NotYet,
    Mapped(MmapMut),
    /// Could not be mapped (or too many are): kept with syscalls.
    Syscalls,
}

/// Bytes of sums per block: its sum, then its sum before its last write.
const SUMS: u64 = 8;

/// Sums files mapped at once, at most: each mapping is one entry of the process's memory map,
/// which the kernel caps (`vm.max_map_count`, 65,530 by default). Objects written beyond it
/// keep their sums with `pread`/`pwrite`.
const MAX_MAPPED: usize = 16_384;

static MAPPED: AtomicUsize = AtomicUsize::new(0);

/// Reads block `b` of `data` (zeros past its end: the file is sparse).
fn read_block(data: &File, b: usize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; BLOCK as usize];
    let mut got = 0;
    while got < buf.len() {
        let n = data.read_at(&mut buf[got..], b as u64 * BLOCK + got as u64)?;
        if n == 0 {
            break;
        }
        got += n;
    }
    Ok(buf)
}

/// The sums of the blocks `bytes` (to be written at `offset` of `data`) touches, as
/// [`Sums::record`] lays them over `pairs` (the current pairs of those blocks).
fn update(data: &File, bytes: &[u8], offset: u64, pairs: &mut [u8]) -> io::Result<()> {
    let end = offset + bytes.len() as u64;
    let (b0, b1) = CachedObject::block_range(offset, bytes.len() as u64);
    for (i, b) in (b0..b1).enumerate() {
        let (s, e) = (b as u64 * BLOCK, (b as u64 + 1) * BLOCK);
        let sum = if s >= offset && e <= end {
            crc_fast::crc32_iscsi(&bytes[(s - offset) as usize..(e - offset) as usize])
        } else {
            let mut blk = read_block(data, b)?;
            let (from, to) = (s.max(offset), e.min(end));
            blk[(from - s) as usize..(to - s) as usize]
                .copy_from_slice(&bytes[(from - offset) as usize..(to - offset) as usize]);
            crc_fast::crc32_iscsi(&blk)
        };
        let pair = &mut pairs[i * SUMS as usize..(i + 1) * SUMS as usize];
        pair.copy_within(0..4, 4);
        pair[..4].copy_from_slice(&sum.to_le_bytes());
    }
    Ok(())
}

/// `file` mapped whole, its disk blocks allocated first; None if either fails (or it is empty).
fn map_allocated(file: &File) -> Option<MmapMut> {
    let len = file.metadata().ok()?.len();
    // SAFETY: a plain syscall on a file descriptor we own.
    let r = unsafe { libc::posix_fallocate(file.as_raw_fd(), 0, len as libc::off_t) };
    if r != 0 || len == 0 {
        return None;
    }
    // SAFETY: the file is this cache's own, never truncated while its object lives (retiring
    // it unlinks the file; the pages stay), and its blocks are allocated, so no access
    // through the mapping faults.
    unsafe { MmapOptions::new().len(len as usize).map_mut(file) }.ok()
}

impl Sums {
    /// A new sums file of `blocks` zero sums (replacing any older one).
    pub fn create(path: &Path, blocks: usize) -> io::Result<Sums> {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        f.set_len(blocks as u64 * SUMS)?;
        Ok(Sums::with(f))
    }

    /// The sums file at `path`, if there is one of the right size for `blocks` blocks. A
    /// missing one is an object of an older sheepfs; one of the wrong size is removed (the
    /// object is then served unverified, as an old one).
    pub fn open(path: &Path, blocks: usize) -> Option<Sums> {
        let f = OpenOptions::new().read(true).write(true).open(path).ok()?;
        match f.metadata() {
            Ok(m) if m.len() == blocks as u64 * SUMS => Some(Sums::with(f)),
            _ => {
                tracing::warn!(
                    "cache sums file {} has the wrong size: removed, the object's blocks are \
                     not verified",
                    path.display()
                );
                drop(f);
                let _ = std::fs::remove_file(path);
                None
            }
        }
    }

    fn with(file: File) -> Sums {
        Sums {
            file,
            map: Mutex::new(Mapping::NotYet),
        }
    }

    /// Maps the file, unless [`MAX_MAPPED`] are mapped or its disk blocks cannot be reserved
    /// first: a store into a mapped hole that finds the disk full is a SIGBUS, so every block
    /// is allocated before the file is mapped.
    fn map(&self) -> Mapping {
        if MAPPED.fetch_add(1, Ordering::Relaxed) >= MAX_MAPPED {
            MAPPED.fetch_sub(1, Ordering::Relaxed);
            return Mapping::Syscalls;
        }
        match map_allocated(&self.file) {
            Some(m) => Mapping::Mapped(m),
            None => {
                MAPPED.fetch_sub(1, Ordering::Relaxed);
                Mapping::Syscalls
            }
        }
    }

    /// Records the sums the blocks `bytes` touch will have once `bytes` are written into
    /// `data` at `offset` (called just before), each block's sum until now kept as its
    /// previous one. Blocks it covers whole are summed from `bytes`; partly covered ones from
    /// the file with `bytes` laid over. The first call maps the file: later ones are stores
    /// into memory (the page cache), with no syscall, which a `kill -9` keeps as a write would.
    pub fn record(&self, data: &File, bytes: &[u8], offset: u64) -> io::Result<()> {
        if bytes.is_empty() {
            return Ok(());
        }
        let (b0, b1) = CachedObject::block_range(offset, bytes.len() as u64);
        let (lo, hi) = (b0 * SUMS as usize, b1 * SUMS as usize);
        let mut map = self.map.lock().unwrap();
        if matches!(*map, Mapping::NotYet) {
            *map = self.map();
        }
        match &mut *map {
            Mapping::Mapped(m) if hi <= m.len() => update(data, bytes, offset, &mut m[lo..hi]),
            _ => {
                let mut out = vec![0u8; hi - lo];
                self.file.read_exact_at(&mut out, lo as u64)?;
                update(data, bytes, offset, &mut out)?;
                self.file.write_all_at(&out, lo as u64)
            }
        }
    }

    /// Whether block `b` of `data` matches its sum, or the one it had before its last write
    /// (a write cut short by a `kill -9` before its data reached the file).
    pub fn check(&self, data: &File, b: usize) -> io::Result<bool> {
        let mut pair = [0u8; SUMS as usize];
        let at = b * SUMS as usize;
        match &*self.map.lock().unwrap() {
            Mapping::Mapped(m) if at + SUMS as usize <= m.len() => {
                pair.copy_from_slice(&m[at..at + SUMS as usize])
            }
            _ => self.file.read_exact_at(&mut pair, at as u64)?,
        }
        let sum = crc_fast::crc32_iscsi(&read_block(data, b)?).to_le_bytes();
        Ok(pair[..4] == sum || pair[4..] == sum)
    }

    pub fn sync(&self) -> io::Result<()> {
        if let Mapping::Mapped(m) = &*self.map.lock().unwrap() {
            m.flush()?;
        }
        self.file.sync_data()
    }
}

impl Drop for Sums {
    fn drop(&mut self) {
        if let Mapping::Mapped(_) = self.map.get_mut().unwrap() {
            MAPPED.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
impl Sums {
    /// Keeps this object's sums with syscalls, as past [`MAX_MAPPED`].
    pub(crate) fn never_map(&self) {
        *self.map.lock().unwrap() = Mapping::Syscalls;
    }

    pub(crate) fn is_mapped(&self) -> bool {
        matches!(*self.map.lock().unwrap(), Mapping::Mapped(_))
    }
}

/// What [`CachedObject::verify`] found in a range.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Verified {
    /// Clean blocks found corrupt now, and dropped from the cache (no longer valid).
    pub dropped: usize,
    /// Dirty blocks found corrupt now, and quarantined.
    pub quarantined: usize,
    /// Whether the range holds a quarantined block (found now or before): not to be served.
    pub refused: bool,
}

impl CachedObject {
    /// Checks blocks `[b0, b1)` not checked since the object was loaded from disk (see the
    /// module's comment), and says what it found. Cheap when there is nothing to check.
    pub fn verify(&self, b0: usize, b1: usize) -> Verified {
        let mut out = Verified::default();
        let Some(sums) = self.sums.as_ref() else {
            return out;
        };
        let todo: Vec<usize> = {
            let st = self.state.lock().unwrap();
            match &st.unverified {
                Some(u) => (b0..b1).filter(|&b| u.get(b) && st.valid.get(b)).collect(),
                None => Vec::new(),
            }
        };
        if !todo.is_empty() {
            // No write is halfway through a block while it is checked.
            let _writing = self.writing.lock().unwrap();
            let checked: Vec<(usize, io::Result<bool>)> = todo
                .into_iter()
                .map(|b| (b, sums.check(self.data_file(), b)))
                .collect();
            let mut st = self.state.lock().unwrap();
            let mut changed = false;
            for (b, ok) in checked {
                let st = &mut *st;
                match st.unverified.as_mut() {
                    Some(u) if u.get(b) => u.set_range(b, b + 1, false),
                    _ => continue, // checked meanwhile
                }
                let why = match ok {
                    Ok(true) => continue,
                    Ok(false) => "its checksum does not match".to_string(),
                    Err(e) => format!("it cannot be read: {e}"),
                };
                if !st.valid.get(b) {
                    continue;
                }
                if st.dirty.get(b) {
                    tracing::error!(
                        "cached block {b} of object {:?} is dirty and corrupt ({why}): \
                         quarantined, reads of it fail with EIO and it is never pushed",
                        self.key
                    );
                    st.quarantined
                        .get_or_insert_with(|| crate::object::State::empty_like(&st.valid))
                        .set_range(b, b + 1, true);
                    out.quarantined += 1;
                } else {
                    tracing::warn!(
                        "cached block {b} of object {:?} is corrupt ({why}): dropped, it is \
                         fetched again from the cluster",
                        self.key
                    );
                    st.valid.set_range(b, b + 1, false);
                    out.dropped += 1;
                    changed = true;
                }
            }
            if st.unverified.as_ref().is_some_and(|u| u.is_empty()) {
                st.unverified = None;
            }
            if changed && !st.retired {
                if let Err(e) = self.save(&st) {
                    tracing::warn!("saving the bitmaps of cached object {:?}: {e}", self.key);
                }
            }
        }
        let st = self.state.lock().unwrap();
        out.refused = st.quarantined.as_ref().is_some_and(|q| q.any(b0, b1));
        out
    }
}

impl<B: Backend> Inner<B> {
    /// Counts what [`CachedObject::verify`] found; dropped blocks no longer take room.
    pub(crate) fn corrupt_found(&self, counters: &Counters, v: &Verified) {
        let found = v.dropped + v.quarantined;
        if found > 0 {
            Counters::add(&counters.corrupt_blocks, found as u64);
            let dropped = v.dropped as u64 * BLOCK;
            self.space.used.fetch_sub(dropped, Ordering::SeqCst);
            self.space.room.tell();
        }
    }
}

#[cfg(test)]
#[path = "sums_tests.rs"]
mod tests;
