//! Shared file mappings for the exerciser: `mmap(MAP_SHARED)` of a page-aligned window,
//! `msync`, unmapped on drop.

use std::fs::File;
use std::io;
use std::os::unix::io::AsRawFd;

/// The system page size.
pub(super) fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as u64
    } else {
        4096
    }
}

/// A shared mapping of `[start, start + len)` of a file, `start` page-aligned.
pub(super) struct Mapping {
    ptr: *mut u8,
    len: usize,
    /// The file offset of the first mapped byte.
    start: u64,
}

impl Mapping {
    /// Maps the pages holding `[off, off + len)`: read-only, or read-write (the file must then
    /// be open read-write).
    pub(super) fn new(file: &File, off: u64, len: u64, write: bool) -> io::Result<Mapping> {
        let page = page_size();
        let start = off / page * page;
        let map_len = (off + len - start) as usize;
        let prot = if write {
            libc::PROT_READ | libc::PROT_WRITE
        } else {
            libc::PROT_READ
        };
        // SAFETY: a fresh mapping chosen by the kernel; the descriptor is valid for the call.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                prot,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                start as libc::off_t,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Mapping {
            ptr: ptr.cast(),
            len: map_len,
            start,
        })
    }

    fn index(&self, off: u64, len: usize) -> usize {
        let i = (off - self.start) as usize;
        assert!(i + len <= self.len, "range outside the mapping");
        i
    }

    /// Copies `buf.len()` bytes at file offset `off` out of the mapping (a fault reads them
    /// from the file system).
    pub(super) fn read(&self, off: u64, buf: &mut [u8]) {
        let i = self.index(off, buf.len());
        // SAFETY: in bounds of a live mapping; volatile-free copy is fine, the kernel owns
        // the pages and nobody else in this process writes them meanwhile.
        unsafe { std::ptr::copy_nonoverlapping(self.ptr.add(i), buf.as_mut_ptr(), buf.len()) };
    }

    /// Stores `data` at file offset `off` through the mapping (dirtying its pages).
    pub(super) fn write(&self, off: u64, data: &[u8]) {
        let i = self.index(off, data.len());
        // SAFETY: in bounds of a live, writable mapping.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.add(i), data.len()) };
    }

    /// `msync(MS_SYNC)` of the pages holding `[off, off + len)`: their dirty pages are
    /// written to the file system and fsynced.
    pub(super) fn sync(&self, off: u64, len: u64) -> io::Result<()> {
        let page = page_size();
        let first = off / page * page;
        let end = (off + len).div_ceil(page) * page;
        let i = self.index(first, 0);
        let n = ((end - first) as usize).min(self.len - i);
        // SAFETY: a page-aligned range inside the live mapping.
        if unsafe { libc::msync(self.ptr.add(i).cast(), n, libc::MS_SYNC) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: the mapping this value made, unmapped once.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}
