//! Byte ranges of a VDI cut at object boundaries: the one splitting every layer uses.

/// The part of a VDI range that falls in one object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    /// The object index.
    pub index: u64,
    /// Offset inside the object.
    pub offset: u64,
    /// Length in bytes (never 0).
    pub len: u64,
    /// Offset of this piece inside the caller's buffer (from the start of the range).
    pub at: usize,
}

/// Splits `[offset, offset+len)` into per-object extents, in order. `object_size` must not be 0.
pub fn extents(offset: u64, len: u64, object_size: u64) -> impl Iterator<Item = Extent> {
    debug_assert!(object_size > 0);
    let end = offset.saturating_add(len);
    let mut pos = offset;
    std::iter::from_fn(move || {
        if pos >= end {
            return None;
        }
        let index = pos / object_size;
        let in_obj = pos % object_size;
        let n = (object_size - in_obj).min(end - pos);
        let e = Extent {
            index,
            offset: in_obj,
            len: n,
            at: (pos - offset) as usize,
        };
        pos += n;
        Some(e)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn splits_at_object_boundaries() {
        let v: Vec<_> = extents(3, 10, 4).collect();
        assert_eq!(
            v,
            vec![
                Extent {
                    index: 0,
                    offset: 3,
                    len: 1,
                    at: 0
                },
                Extent {
                    index: 1,
                    offset: 0,
                    len: 4,
                    at: 1
                },
                Extent {
                    index: 2,
                    offset: 0,
                    len: 4,
                    at: 5
                },
                Extent {
                    index: 3,
                    offset: 0,
                    len: 1,
                    at: 9
                },
            ]
        );
        assert_eq!(extents(8, 0, 4).count(), 0);
    }

    proptest! {
        /// The extents tile the range exactly, each inside one object.
        #[test]
        fn tiles_the_range(offset in 0u64..1 << 40, len in 0u64..1 << 24, shift in 0u32..27) {
            let os = 1u64 << shift;
            let mut next = offset;
            let mut at = 0usize;
            for e in extents(offset, len, os) {
                prop_assert!(e.len > 0 && e.offset + e.len <= os);
                prop_assert_eq!(e.index * os + e.offset, next);
                prop_assert_eq!(e.at, at);
                next += e.len;
                at += e.len as usize;
            }
            prop_assert_eq!(next, offset + len);
        }
    }
}
