//! Page-aligned receive buffers for large frame payloads.
//!
//! The client receives object data (what its cache fetches and fills) into these. They are
//! page-aligned, so such data could go to a file opened with O_DIRECT as it is; the cache
//! writes its fills through the page cache now, and what counts is the pool below.
//!
//! Requests of 32 KiB to 4 MiB get a pooled buffer, sized to the next power of two from
//! 64 KiB (at most half of it unused): a freed one is kept (up to `POOL_BYTES` in all) and
//! handed out again, most recently freed first. Memory returned to the allocator and
//! taken back is faulted in anew, page by page, inside the receive copy; a reused buffer is
//! mapped already, and likely still in the CPU's caches.

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use bytes::buf::UninitSlice;
use bytes::{BufMut, Bytes};

/// Alignment of every [`PageBuf`]: one page, what O_DIRECT asks of memory on the
/// filesystems we run on.
pub const PAGE: usize = 4096;

/// Smallest pooled capacity; requests under half of it come and go through the allocator.
const POOL_MIN: usize = 64 << 10;
/// Pooled capacities, powers of two from [`POOL_MIN`]: 64 KiB … 4 MiB.
const POOL_CLASSES: usize = 7;
/// Bytes of free buffers kept, at most.
const POOL_BYTES: usize = 32 << 20;

/// Free buffers per capacity class (their addresses), and the bytes they hold together.
static POOL: [Mutex<Vec<usize>>; POOL_CLASSES] = [const { Mutex::new(Vec::new()) }; POOL_CLASSES];
static POOLED: AtomicUsize = AtomicUsize::new(0);

/// The pool class for a buffer of `cap` bytes (None: not pooled), and its capacity.
fn class_of(cap: usize) -> Option<(usize, usize)> {
    let size = cap.max(POOL_MIN).checked_next_power_of_two()?;
    let class = (size / POOL_MIN).trailing_zeros() as usize;
    (class < POOL_CLASSES && cap >= POOL_MIN / 2).then_some((class, size))
}

/// A fixed-capacity byte buffer whose start is [`PAGE`]-aligned, filled through
/// [`BufMut`] without zeroing first and frozen into [`Bytes`] without a copy.
pub struct PageBuf {
    ptr: NonNull<u8>,
    cap: usize,
    len: usize,
}

// SAFETY: PageBuf uniquely owns its allocation; shared access after `freeze` is read-only.
unsafe impl Send for PageBuf {}
// SAFETY: as above: `&PageBuf` only reads initialised bytes.
unsafe impl Sync for PageBuf {}

impl PageBuf {
    /// An empty buffer with room for at least `cap` bytes (not zeroed: filled through
    /// [`BufMut`]); pooled sizes are rounded up to their class (a power of two).
    pub fn with_capacity(cap: usize) -> PageBuf {
        if let Some((class, size)) = class_of(cap) {
            if let Some(addr) = POOL[class].lock().unwrap().pop() {
                POOLED.fetch_sub(size, Ordering::Relaxed);
                let ptr = NonNull::new(addr as *mut u8).expect("pooled buffers are non-null");
                return PageBuf {
                    ptr,
                    cap: size,
                    len: 0,
                };
            }
            return Self::alloc(size, false);
        }
        Self::alloc(cap, false)
    }

    /// A buffer holding `len` zero bytes (a staging area to fill through [`AsMut`]); pooled
    /// sizes come from the pool as [`PageBuf::with_capacity`] does.
    pub fn zeroed(len: usize) -> PageBuf {
        if class_of(len).is_none() {
            return Self::alloc(len, true);
        }
        let mut b = Self::with_capacity(len);
        // SAFETY: `len` fits the capacity; write_bytes initialises those bytes.
        unsafe { std::ptr::write_bytes(b.ptr.as_ptr(), 0, len) };
        b.len = len;
        b
    }

    /// Keeps only the first `len` bytes (no-op if it holds fewer).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// `cap` bytes of page-aligned memory; with `zeroed`, all of them initialised (`len` =
    /// `cap`), else none (`len` = 0).
    fn alloc(cap: usize, zeroed: bool) -> PageBuf {
        let layout = Self::layout(cap);
        // SAFETY: the layout has a non-zero size (at least one byte).
        let raw = unsafe {
            if zeroed {
                std::alloc::alloc_zeroed(layout)
            } else {
                std::alloc::alloc(layout)
            }
        };
        let ptr = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        let len = if zeroed { cap } else { 0 };
        PageBuf { ptr, cap, len }
    }

    pub fn capacity(&self) -> usize {
        self.cap
    }

    fn layout(cap: usize) -> Layout {
        Layout::from_size_align(cap.max(1), PAGE).expect("a payload-sized layout is valid")
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes written so far, as [`Bytes`] that keep the alignment (no copy).
    pub fn freeze(self) -> Bytes {
        Bytes::from_owner(self)
    }
}

impl AsRef<[u8]> for PageBuf {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the first `len` bytes are initialised: zeroed, or written through `BufMut`
        // (see advance_mut).
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl AsMut<[u8]> for PageBuf {
    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_ref`, and `&mut self` makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for PageBuf {
    fn drop(&mut self) {
        if let Some((class, size)) = class_of(self.cap).filter(|&(_, size)| size == self.cap) {
            let kept = POOLED
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |p| {
                    (p + size <= POOL_BYTES).then_some(p + size)
                })
                .is_ok();
            if kept {
                POOL[class].lock().unwrap().push(self.ptr.as_ptr() as usize);
                return;
            }
        }
        // SAFETY: allocated in `alloc` with this very layout (pooled buffers too: a pooled
        // capacity is the one it was allocated with).
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), Self::layout(self.cap)) }
    }
}

// SAFETY: `chunk_mut` hands out exactly the unwritten tail of the allocation, and
// `advance_mut` never moves `len` past `cap`.
unsafe impl BufMut for PageBuf {
    fn remaining_mut(&self) -> usize {
        self.cap - self.len
    }

    unsafe fn advance_mut(&mut self, cnt: usize) {
        assert!(
            cnt <= self.cap - self.len,
            "advance_mut past the end of a PageBuf"
        );
        self.len += cnt;
    }

    fn chunk_mut(&mut self) -> &mut UninitSlice {
        // SAFETY: `len <= cap`, so the range lies inside the allocation, and `&mut self`
        // makes it exclusive.
        unsafe {
            UninitSlice::from_raw_parts_mut(self.ptr.as_ptr().add(self.len), self.cap - self.len)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frozen_bytes_are_page_aligned_and_hold_what_was_put() {
        for cap in [1, 100, PAGE, 3 * PAGE + 5, 1 << 20] {
            let mut b = PageBuf::with_capacity(cap);
            assert_eq!(b.remaining_mut(), cap);
            let data: Vec<u8> = (0..cap).map(|i| (i * 7 % 251) as u8).collect();
            // In two parts, as a socket would deliver it.
            b.put_slice(&data[..cap / 2]);
            b.put_slice(&data[cap / 2..]);
            assert_eq!(b.remaining_mut(), 0);
            let bytes = b.freeze();
            assert_eq!(bytes.as_ptr() as usize % PAGE, 0, "capacity {cap}");
            assert_eq!(&bytes[..], &data[..]);
            // Slices at page offsets stay aligned.
            if cap > PAGE {
                assert_eq!(bytes.slice(PAGE..).as_ptr() as usize % PAGE, 0);
            }
        }
    }

    #[test]
    fn pooled_zeroed_buffers_are_zeros_again_and_truncate() {
        for _ in 0..3 {
            let mut b = PageBuf::zeroed(3 << 20);
            assert_eq!(b.len(), 3 << 20);
            assert!(b.as_ref().iter().all(|&x| x == 0));
            b.as_mut().fill(0xAB);
            b.truncate(5);
            b.truncate(9);
            assert_eq!(&b.freeze()[..], &[0xAB; 5]);
        }
    }

    #[test]
    fn zeroed_buffers_are_aligned_zeros_and_writable() {
        let mut b = PageBuf::zeroed(3 * PAGE);
        assert_eq!(
            (b.len(), b.capacity(), b.remaining_mut()),
            (3 * PAGE, 3 * PAGE, 0)
        );
        assert_eq!(b.as_ref().as_ptr() as usize % PAGE, 0);
        assert!(b.as_ref().iter().all(|&x| x == 0));
        b.as_mut()[PAGE] = 7;
        assert_eq!(b.freeze()[PAGE], 7);
    }

    #[test]
    fn pooled_buffers_come_back_empty_with_their_class_capacity() {
        assert_eq!(class_of(1 << 20), Some((4, 1 << 20)));
        assert_eq!(class_of((1 << 20) + 1), Some((5, 2 << 20)));
        assert_eq!(class_of(4 << 20), Some((6, 4 << 20)));
        assert_eq!(class_of((4 << 20) + 1), None);
        assert_eq!(class_of(PAGE), None);
        for round in 0..3u8 {
            let bufs: Vec<PageBuf> = (0..8).map(|_| PageBuf::with_capacity(300 << 10)).collect();
            for mut b in bufs {
                assert_eq!((b.len(), b.capacity()), (0, 512 << 10));
                b.put_bytes(round, 300 << 10);
                let bytes = b.freeze();
                assert_eq!(bytes.as_ptr() as usize % PAGE, 0);
                assert!(bytes.iter().all(|&x| x == round));
            }
        }
        // Far more freed than the pool keeps: the rest goes back to the allocator.
        let many: Vec<PageBuf> = (0..40).map(|_| PageBuf::with_capacity(4 << 20)).collect();
        drop(many);
        assert!(POOLED.load(Ordering::Relaxed) <= POOL_BYTES);
    }

    #[test]
    #[should_panic(expected = "past the end")]
    fn advancing_past_the_capacity_is_refused() {
        let mut b = PageBuf::with_capacity(8);
        // SAFETY: the assertion fires before anything is read.
        unsafe { b.advance_mut(9) };
    }
}
