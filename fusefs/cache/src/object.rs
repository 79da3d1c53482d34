//! One cached object: a sparse data file and a metadata file with two bitmaps (valid, dirty),
//! one bit per [`BLOCK`] bytes.
//!
//! ```text
//! <idx>.meta: [magic "SHCACHE1"][object_size u32 LE][blocks u32 LE][valid bitmap][dirty bitmap]
//! ```
//! A write puts the data in the data file first, then sets its bits in the meta file, then is
//! acknowledged: after a kill -9 of sheepfs (the host's page cache survives) the dirty bits say
//! exactly which blocks hold unpushed writes.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

use super::bitmap::Bitmap;
use super::error::LoadError;
use super::spare::Spares;
use super::sums::Sums;
pub use crate::files::{remove_key, scan};

/// Cache granularity: misses fetch, and bitmaps track, 4 KiB blocks.
pub const BLOCK: u64 = 4096;
/// Fills of at least this many bytes start their own writeback ([`CachedObject::write_fill_data`]).
pub const WRITEBACK_FILL: u64 = 256 << 10;
/// Cache data is written in pieces of at most this size. One large write puts the data in
/// large page-cache folios, and ext4 then walks every block of a folio on each later 4 KiB
/// write into it: random writes over filled data ran at a third of their speed.
const WRITE_PIECE: usize = 16 << 10;
const META_MAGIC: &[u8; 8] = b"SHCACHE1";
const META_HEAD: usize = 16;

/// (vid, index): a VDI's data object.
pub type Key = (u32, u32);

pub struct State {
    pub valid: Bitmap,
    pub dirty: Bitmap,
    /// While a push is in flight: blocks written since it took its snapshot.
    pub rewritten: Option<Bitmap>,
    pub dirty_since: Option<Instant>,
    /// Blocks were filled since the meta file was last written: fills leave the write to the
    /// flusher (a lost valid bit only costs a fetch), writes never do.
    pub unsaved: bool,
    /// The files were given up (evicted): nothing may be written to them any more.
    pub retired: bool,
    /// Valid blocks loaded from disk whose sums were not checked yet ([`crate::sums`]).
    pub unverified: Option<Bitmap>,
    /// Dirty blocks found corrupt: never served, never pushed ([`crate::sums`]).
    pub quarantined: Option<Bitmap>,
}

impl State {
    /// An empty bitmap of the same size as `like`.
    pub fn empty_like(like: &Bitmap) -> Bitmap {
        Bitmap::new(like.bits())
    }

    /// Whether blocks `[b0, b1)` need [`CachedObject::verify`] before they are served.
    pub fn needs_check(&self, b0: usize, b1: usize) -> bool {
        self.unverified.as_ref().is_some_and(|u| u.any(b0, b1))
            || self.quarantined.as_ref().is_some_and(|q| q.any(b0, b1))
    }
}

pub struct CachedObject {
    pub key: Key,
    pub object_size: u64,
    data: File,
    meta: File,
    /// None: an object of an older sheepfs, without sums ([`crate::sums`]).
    pub(crate) sums: Option<Sums>,
    paths: (PathBuf, PathBuf),
    pub state: Mutex<State>,
    /// Held by whoever writes the data file (then `state`, to change the bits): writes and
    /// fills of the object take turns, while readers, which need only `state`, do not wait
    /// for a fill's disk write.
    pub writing: Mutex<()>,
    /// One push of this object at a time: a second pusher (fsync, flush) waits for the first
    /// and then pushes what is still dirty, so it never returns before its data is out.
    pub pushing: tokio::sync::Mutex<()>,
    /// When it was last read or written ([`clock_ms`]; 0: not since this mount started).
    used_at: AtomicU64,
    /// Holders of a pin on it (`crate::space::Pinned`): while any, it is not evicted.
    pub(crate) pins: AtomicUsize,
}

/// Milliseconds on a monotonic clock that starts at 1 when first asked: when cached objects
/// were last used and when ranges last missed (admission compares the two). Read on every
/// request: it is the kernel's coarse clock (a few ms a tick), which costs no time-stamp
/// counter read and no division of a 128-bit duration.
pub fn clock_ms() -> u64 {
    static START: OnceLock<u64> = OnceLock::new();
    let now = coarse_ms();
    now.saturating_sub(*START.get_or_init(|| now)) + 1
}

fn coarse_ms() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec to write to; CLOCK_MONOTONIC_COARSE exists on every
    // Linux sheepfs runs on (2.6.32 and later), and a failure leaves `ts` at 0.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut ts) };
    ts.tv_sec as u64 * 1000 + ts.tv_nsec as u64 / 1_000_000
}

/// Cache reads are exact block ranges, mostly random: the kernel's read-ahead on the data file
/// would read (and keep) far more of the disk than asked. Reads of large ranges still go to
/// the disk as one request. Reads also leave the access time alone (`O_NOATIME`, where the
/// file's owner or root reads): a hit is then one less inode check and, once a day, one less
/// inode write.
fn tune_for_reads(f: &File) {
    use std::os::fd::AsRawFd;
    let fd = f.as_raw_fd();
    // SAFETY: plain advice and status flags on an open descriptor; failure only leaves
    // read-ahead or access times on.
    unsafe {
        libc::posix_fadvise(fd, 0, 0, libc::POSIX_FADV_RANDOM);
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags >= 0 {
            libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NOATIME);
        }
    }
}

pub(crate) fn paths(dir: &Path, key: Key) -> (PathBuf, PathBuf) {
    let d = dir.join(format!("{:06x}", key.0));
    (
        d.join(format!("{:08x}.data", key.1)),
        d.join(format!("{:08x}.meta", key.1)),
    )
}

/// The sums file beside a meta file ([`crate::sums`]).
pub(crate) fn sums_path(meta: &Path) -> PathBuf {
    meta.with_extension("sums")
}

impl CachedObject {
    /// Records a use now (a store only when the clock moved: hits on other CPUs share the line).
    pub fn touch(&self) {
        let now = clock_ms();
        if self.used_at.load(Ordering::Relaxed) != now {
            self.used_at.store(now, Ordering::Relaxed);
        }
    }

    /// Whether someone holds a pin on it (it is in use: not to be evicted).
    pub fn pinned(&self) -> bool {
        self.pins.load(Ordering::SeqCst) > 0
    }

    /// When it was last used ([`clock_ms`]; 0: not since this mount started).
    pub fn used_at(&self) -> u64 {
        self.used_at.load(Ordering::Relaxed)
    }

    /// Creates an empty cached object, in the files of an evicted one when there are spares.
    pub fn create(
        dir: &Path,
        key: Key,
        object_size: u64,
        spares: &Spares,
    ) -> io::Result<CachedObject> {
        let (dp, mp) = paths(dir, key);
        fs::create_dir_all(dp.parent().unwrap())?;
        spares.take_into(&dp, &mp);
        let blocks = object_size.div_ceil(BLOCK) as usize;
        let data = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&dp)?;
        tune_for_reads(&data);
        let meta = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&mp)?;
        let sums = Some(Sums::create(&sums_path(&mp), blocks)?);
        let o = CachedObject {
            key,
            object_size,
            data,
            meta,
            sums,
            paths: (dp, mp),
            writing: Mutex::new(()),
            pushing: tokio::sync::Mutex::new(()),
            used_at: AtomicU64::new(clock_ms()),
            pins: AtomicUsize::new(0),
            state: Mutex::new(State {
                valid: Bitmap::new(blocks),
                dirty: Bitmap::new(blocks),
                rewritten: None,
                dirty_since: None,
                unsaved: false,
                retired: false,
                unverified: None,
                quarantined: None,
            }),
        };
        let mut head = Vec::with_capacity(META_HEAD);
        head.extend_from_slice(META_MAGIC);
        head.extend_from_slice(&(object_size as u32).to_le_bytes());
        head.extend_from_slice(&(blocks as u32).to_le_bytes());
        o.meta.write_all_at(&head, 0)?;
        o.save(&o.state.lock().unwrap())?;
        Ok(o)
    }

    /// Loads a cached object from its files; None (with the reason) if they cannot be trusted.
    pub fn load(dir: &Path, key: Key) -> Result<CachedObject, LoadError> {
        let (dp, mp) = paths(dir, key);
        let raw = fs::read(&mp).map_err(|source| LoadError::Read {
            path: mp.clone(),
            source,
        })?;
        let untrusted = |why| LoadError::Untrusted {
            path: mp.clone(),
            why,
        };
        if raw.len() < META_HEAD || &raw[..8] != META_MAGIC {
            return Err(untrusted("has no valid header"));
        }
        let object_size = u32::from_le_bytes(raw[8..12].try_into().unwrap()) as u64;
        let blocks = u32::from_le_bytes(raw[12..16].try_into().unwrap()) as usize;
        if !object_size.is_power_of_two() || blocks as u64 != object_size.div_ceil(BLOCK) {
            return Err(untrusted("has a bad geometry"));
        }
        let bl = Bitmap::byte_len(blocks);
        if raw.len() != META_HEAD + 2 * bl {
            return Err(untrusted("is truncated"));
        }
        let valid = Bitmap::from_bytes(&raw[META_HEAD..META_HEAD + bl], blocks)
            .ok_or_else(|| untrusted("has a bad valid map"))?;
        let dirty = Bitmap::from_bytes(&raw[META_HEAD + bl..], blocks)
            .ok_or_else(|| untrusted("has a bad dirty map"))?;
        if !dirty.minus(&valid).is_empty() {
            return Err(untrusted("marks blocks dirty that are not valid"));
        }
        let open = |p: &Path| {
            OpenOptions::new()
                .read(true)
                .write(true)
                .open(p)
                .map_err(|source| LoadError::Open {
                    path: p.to_path_buf(),
                    source,
                })
        };
        let dirty_since = (!dirty.is_empty()).then(Instant::now);
        let sums = Sums::open(&sums_path(&mp), blocks);
        let unverified = (sums.is_some() && !valid.is_empty()).then(|| valid.clone());
        Ok(CachedObject {
            key,
            object_size,
            data: open(&dp).inspect(tune_for_reads)?,
            meta: open(&mp)?,
            sums,
            paths: (dp, mp),
            writing: Mutex::new(()),
            pushing: tokio::sync::Mutex::new(()),
            used_at: AtomicU64::new(0),
            pins: AtomicUsize::new(0),
            state: Mutex::new(State {
                valid,
                dirty,
                rewritten: None,
                dirty_since,
                unsaved: false,
                retired: false,
                unverified,
                quarantined: None,
            }),
        })
    }

    /// Writes the bitmaps that fills left unsaved, unless the object was retired since.
    pub fn save_if_unsaved(&self) -> io::Result<()> {
        let mut st = self.state.lock().unwrap();
        if st.retired || !std::mem::take(&mut st.unsaved) {
            return Ok(());
        }
        self.save(&st)
    }

    /// Writes both bitmaps to the meta file.
    pub fn save(&self, st: &State) -> io::Result<()> {
        let mut b = st.valid.to_bytes();
        b.extend_from_slice(&st.dirty.to_bytes());
        self.meta.write_all_at(&b, META_HEAD as u64)
    }

    pub fn read_data(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let mut got = 0;
        while got < buf.len() {
            let n = self.data.read_at(&mut buf[got..], offset + got as u64)?;
            if n == 0 {
                buf[got..].fill(0); // sparse tail
                break;
            }
            got += n;
        }
        Ok(())
    }

    /// [`CachedObject::read_data`] only if the data is in the page cache already (never waits
    /// for the disk); false when it would have to.
    pub fn read_data_nowait(&self, buf: &mut [u8], offset: u64) -> io::Result<bool> {
        use std::os::fd::AsRawFd;
        let mut got = 0;
        while got < buf.len() {
            let rest = &mut buf[got..];
            let iov = libc::iovec {
                iov_base: rest.as_mut_ptr().cast(),
                iov_len: rest.len(),
            };
            // SAFETY: the iovec points into `buf`, which outlives the call.
            let n = unsafe {
                libc::preadv2(
                    self.data.as_raw_fd(),
                    &iov,
                    1,
                    (offset + got as u64) as libc::off_t,
                    libc::RWF_NOWAIT,
                )
            };
            match n {
                0 => {
                    rest.fill(0); // sparse tail
                    break;
                }
                n if n > 0 => got += n as usize,
                _ => {
                    let e = io::Error::last_os_error();
                    return match e.raw_os_error() {
                        Some(libc::EAGAIN) | Some(libc::EOPNOTSUPP) => Ok(false),
                        Some(libc::EINTR) => continue,
                        _ => Err(e),
                    };
                }
            }
        }
        Ok(true)
    }

    /// Writes the sums of the blocks `data` touches ([`crate::sums`]), then `data` at
    /// `offset`, in pieces of at most [`WRITE_PIECE`] (so a long write leaves no large
    /// page-cache folios for later small writes to walk).
    pub fn write_data(&self, data: &[u8], offset: u64) -> io::Result<()> {
        if let Some(s) = &self.sums {
            s.record(&self.data, data, offset)?;
        }
        let mut at = offset;
        for chunk in data.chunks(WRITE_PIECE) {
            self.data.write_all_at(chunk, at)?;
            at += chunk.len() as u64;
        }
        Ok(())
    }

    pub(crate) fn data_file(&self) -> &File {
        &self.data
    }

    /// Writes data fetched from the cluster at a block-aligned `offset`: `parts` one after
    /// the other (several fetches that continue each other), in pieces of [`WRITE_PIECE`],
    /// through the page cache. What is filled was asked for twice (a second miss, a second
    /// pass of a stream) or found the cache with room: later hits then mostly find it in
    /// memory, where a hit costs no disk request. A run of [`WRITEBACK_FILL`] or more has
    /// its writeback started at once (`sync_file_range`, without waiting for it): a stream's
    /// fills would otherwise pile up as dirty pages for the kernel to write back later, in
    /// one go, under whatever runs then.
    pub fn write_fill_data(&self, parts: &[&[u8]], offset: u64) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        debug_assert_eq!(offset % BLOCK, 0);
        let mut at = offset;
        for p in parts {
            self.write_data(p, at)?;
            at += p.len() as u64;
        }
        let len = at - offset;
        if len >= WRITEBACK_FILL {
            // SAFETY: a plain syscall on a file descriptor we own.
            let r = unsafe {
                libc::sync_file_range(
                    self.data.as_raw_fd(),
                    offset as libc::off64_t,
                    len as libc::off64_t,
                    libc::SYNC_FILE_RANGE_WRITE,
                )
            };
            // Only a hint: the data is written either way.
            if r != 0 {
                tracing::debug!(
                    "sync_file_range on a cache file: {}",
                    io::Error::last_os_error()
                );
            }
        }
        Ok(())
    }

    /// Makes both files durable (clean shutdown).
    pub fn sync(&self) -> io::Result<()> {
        self.data.sync_data()?;
        if let Some(s) = &self.sums {
            s.sync()?;
        }
        self.meta.sync_data()
    }

    /// Gives up the files: emptied and kept as spares (or removed). Nobody else may hold
    /// this object.
    pub fn retire(&self, spares: &Spares) {
        // Under the state lock: a deferred meta write in progress finishes first, and none
        // starts after.
        self.state.lock().unwrap().retired = true;
        let _ = fs::remove_file(sums_path(&self.paths.1));
        spares.keep((&self.data, &self.meta), &self.paths.0, &self.paths.1);
    }

    /// Gives up the files as [`CachedObject::retire`] does, but moves them into `dir` as
    /// they are (data set aside for people to recover), under their own names.
    pub fn retire_into(&self, dir: &Path) -> io::Result<()> {
        self.state.lock().unwrap().retired = true;
        for p in [&self.paths.0, &self.paths.1] {
            fs::rename(p, dir.join(p.file_name().unwrap_or_default()))?;
        }
        let s = sums_path(&self.paths.1);
        if self.sums.is_some() {
            fs::rename(&s, dir.join(s.file_name().unwrap_or_default()))?;
        }
        Ok(())
    }

    /// Blocks `[first, last)` covering bytes `[offset, offset+len)`.
    pub fn block_range(offset: u64, len: u64) -> (usize, usize) {
        (
            (offset / BLOCK) as usize,
            (offset + len).div_ceil(BLOCK) as usize,
        )
    }

    /// Bytes held by `blocks` valid blocks of this object.
    pub fn bytes_of(&self, blocks: usize) -> u64 {
        blocks as u64 * BLOCK
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Object (1, 2) of `size` bytes, created in a fresh directory with its spare pool.
    fn object_1_2(size: u64) -> (tempfile::TempDir, Spares, CachedObject) {
        let d = tempfile::tempdir().unwrap();
        let spares = Spares::open(d.path().join("spare"));
        let o = CachedObject::create(d.path(), (1, 2), size, &spares).unwrap();
        (d, spares, o)
    }

    #[test]
    fn data_files_are_read_without_access_times() {
        use std::os::fd::AsRawFd;
        let (d, _spares, o) = object_1_2(1 << 20);
        let noatime = |f: &File| {
            // SAFETY: reading the status flags of an open descriptor.
            let flags = unsafe { libc::fcntl(f.as_raw_fd(), libc::F_GETFL) };
            flags >= 0 && flags & libc::O_NOATIME != 0
        };
        // The files are ours, so the flag takes, on creation and on load.
        assert!(noatime(&o.data));
        o.sync().unwrap();
        drop(o);
        let o = CachedObject::load(d.path(), (1, 2)).unwrap();
        assert!(noatime(&o.data));
    }

    #[test]
    fn create_save_load() {
        let d = tempfile::tempdir().unwrap();
        let o = CachedObject::create(
            d.path(),
            (1, 2),
            1 << 20,
            &Spares::open(d.path().join("spare")),
        )
        .unwrap();
        o.write_data(b"abc", 4096).unwrap();
        {
            let mut st = o.state.lock().unwrap();
            st.valid.set_range(1, 3, true);
            st.dirty.set_range(1, 2, true);
            o.save(&st).unwrap();
        }
        drop(o);
        assert_eq!(scan(d.path()), vec![(1, 2)]);
        let o = CachedObject::load(d.path(), (1, 2)).unwrap();
        let st = o.state.lock().unwrap();
        assert_eq!(st.valid.runs(), vec![(1, 3)]);
        assert_eq!(st.dirty.runs(), vec![(1, 2)]);
        let mut buf = [0u8; 3];
        o.read_data(&mut buf, 4096).unwrap();
        assert_eq!(&buf, b"abc");
    }

    #[test]
    fn untrusted_meta_is_refused() {
        let d = tempfile::tempdir().unwrap();
        drop(
            CachedObject::create(
                d.path(),
                (1, 2),
                1 << 20,
                &Spares::open(d.path().join("spare")),
            )
            .unwrap(),
        );
        let (_, mp) = paths(d.path(), (1, 2));
        let mut raw = fs::read(&mp).unwrap();
        raw.truncate(20);
        fs::write(&mp, &raw).unwrap();
        assert!(CachedObject::load(d.path(), (1, 2)).is_err());
        fs::write(&mp, b"").unwrap();
        assert!(
            CachedObject::load(d.path(), (1, 2)).is_err(),
            "zero-length meta"
        );
    }

    #[test]
    fn scan_finds_meta_files_and_removes_lone_data_files() {
        let d = tempfile::tempdir().unwrap();
        let spares = Spares::open(d.path().join("spare"));
        drop(CachedObject::create(d.path(), (1, 2), 1 << 20, &spares).unwrap());
        let lone = d.path().join("000001/00000003.data");
        fs::write(&lone, b"x").unwrap();
        let lone_sums = d.path().join("000001/00000003.sums");
        fs::write(&lone_sums, b"x").unwrap();
        assert_eq!(scan(d.path()), vec![(1, 2)]);
        assert!(!lone.exists(), "a data file without meta is removed");
        assert!(!lone_sums.exists(), "a sums file without meta is removed");
        assert!(d.path().join("000001/00000002.data").exists());
    }

    #[test]
    fn deferred_bitmaps_are_saved_once_and_never_into_a_retired_objects_files() {
        let (d, spares, o) = object_1_2(1 << 20);
        let (_, mp) = paths(d.path(), (1, 2));
        let saved = || CachedObject::load(d.path(), (1, 2)).unwrap();
        // A fill: data written, bitmaps changed but not saved yet.
        let fill = |o: &CachedObject, start: u64, parts: &[&[u8]]| {
            crate::fill::write_fill(o, start, parts, || true)
        };
        assert_eq!(fill(&o, 0, &[&[7u8; 4096]]), (1, true));
        // Already valid: nothing added, and the object is already listed as unsaved.
        assert_eq!(fill(&o, 0, &[&[7u8; 4096]]), (0, false));
        assert!(
            saved().state.lock().unwrap().valid.is_empty(),
            "not saved yet"
        );
        o.save_if_unsaved().unwrap();
        assert_eq!(saved().state.lock().unwrap().valid.runs(), vec![(0, 1)]);
        assert!(!o.state.lock().unwrap().unsaved);
        // Saved once: with nothing marked unsaved, it writes nothing.
        o.state.lock().unwrap().valid.set_range(2, 3, true);
        o.save_if_unsaved().unwrap();
        assert_eq!(saved().state.lock().unwrap().valid.runs(), vec![(0, 1)]);
        o.state.lock().unwrap().valid.set_range(2, 3, false);
        // Changed again, then evicted before the flusher came: its files (now spares) stay
        // empty.
        o.state.lock().unwrap().valid.set_range(1, 2, true);
        o.state.lock().unwrap().unsaved = true;
        o.retire(&spares);
        o.save_if_unsaved().unwrap();
        assert!(!mp.exists());
        for e in fs::read_dir(d.path().join("spare")).unwrap() {
            let p = e.unwrap().path();
            assert_eq!(
                fs::metadata(&p).unwrap().len(),
                0,
                "{} written after retire",
                p.display()
            );
        }
    }

    #[test]
    fn fills_of_several_parts_skip_valid_blocks_across_part_boundaries() {
        let (_d, _spares, o) = object_1_2(1 << 20);
        let b = BLOCK as usize;
        // Block 2 was written by the user meanwhile: its bytes must stay.
        o.write_data(&vec![9u8; b], 2 * BLOCK).unwrap();
        o.state.lock().unwrap().valid.set_range(2, 3, true);
        let (p1, p2) = (vec![1u8; 3 * b - 100], vec![2u8; 2 * b + 100]);
        let fill = |o: &CachedObject, start: u64, parts: &[&[u8]]| {
            crate::fill::write_fill(o, start, parts, || true)
        };
        assert_eq!(fill(&o, 0, &[&p1, &p2]), (4, true));
        assert_eq!(o.state.lock().unwrap().valid.runs(), vec![(0, 5)]);
        let mut back = vec![0u8; 5 * b];
        o.read_data(&mut back, 0).unwrap();
        let mut want = [p1.as_slice(), p2.as_slice()].concat();
        want[2 * b..3 * b].fill(9);
        assert_eq!(back, want);
    }

    #[test]
    fn fills_write_their_parts_one_after_the_other() {
        let (_d, _spares, o) = object_1_2(4 << 20);
        // Two parts, each many write pieces long, the second ending inside a piece and a block.
        let data: Vec<u8> = (0..(1 << 20) + 100).map(|i| (i % 251) as u8).collect();
        let (p1, p2) = data.split_at((1 << 19) + WRITE_PIECE / 2);
        o.write_fill_data(&[p1, p2], 1 << 20).unwrap();
        let mut back = vec![0u8; data.len()];
        o.read_data(&mut back, 1 << 20).unwrap();
        assert_eq!(back, data);
        // Nothing before the offset was written.
        let mut before = vec![1u8; 4096];
        o.read_data(&mut before, (1 << 20) - 4096).unwrap();
        assert!(before.iter().all(|&b| b == 0));
    }

    proptest::proptest! {
        // `FUZZ_CASES` (as every fuzz target; `make fuzz`) sets the number of files tried.
        #![proptest_config(proptest::prelude::ProptestConfig {
            cases: std::env::var("FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(300),
            ..Default::default()
        })]

        /// Fuzzing the meta file (issue 25): whatever bytes it holds (a valid file with bytes
        /// changed or cut, or noise), loading returns an object or says why it is not trusted,
        /// never panics, and a loaded object's dirty blocks are valid blocks.
        #[test]
        fn any_meta_file_loads_or_is_refused(
            mode in 0u8..3,
            flips in proptest::collection::vec((0usize..200, proptest::prelude::any::<u8>()), 0..6),
            cut in 0usize..200,
            noise in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200),
        ) {
            let (d, _spares, o) = object_1_2(64 << 10);
            {
                let mut st = o.state.lock().unwrap();
                st.valid.set_range(1, 9, true);
                st.dirty.set_range(2, 5, true);
                o.save(&st).unwrap();
            }
            drop(o);
            let (_, mp) = paths(d.path(), (1, 2));
            let mut raw = fs::read(&mp).unwrap();
            match mode {
                0 => {
                    for (at, v) in flips {
                        if !raw.is_empty() {
                            let i = at % raw.len();
                            raw[i] = v;
                        }
                    }
                }
                1 => raw.truncate(cut % (raw.len() + 1)),
                _ => raw = noise,
            }
            fs::write(&mp, &raw).unwrap();
            if let Ok(o) = CachedObject::load(d.path(), (1, 2)) {
                let st = o.state.lock().unwrap();
                proptest::prop_assert!(st.dirty.minus(&st.valid).is_empty());
            }
        }
    }
}
