//! `fallocate` on a VDI's file: what each mode means for a VDI.

use objcache::CacheError;

use crate::handles::Disk;

const FALLOC_KEEP_SIZE: i32 = 0x01;
const FALLOC_PUNCH_HOLE: i32 = 0x02;
const FALLOC_ZERO_RANGE: i32 = 0x10;

/// Applies `fallocate(offset, length, mode)` to `disk`: a punch or zero range is a discard as
/// qemu sends it (`discard=unmap`: whole objects dropped, parts zeroed), clipped to the VDI; a
/// plain preallocation grows the VDI unless `KEEP_SIZE` (space is taken on write). None: a
/// mode that is not supported (`EOPNOTSUPP`).
pub(crate) async fn fallocate(
    disk: &Disk,
    offset: u64,
    length: u64,
    mode: i32,
) -> Option<Result<(), CacheError>> {
    let vdi = disk.vdi();
    let size = vdi.size();
    if mode & (FALLOC_PUNCH_HOLE | FALLOC_ZERO_RANGE) != 0 {
        let end = offset.saturating_add(length).min(size);
        if offset >= end {
            return Some(Ok(()));
        }
        return Some(disk.discard(offset, end - offset).await);
    }
    if mode & !FALLOC_KEEP_SIZE != 0 {
        return None;
    }
    let end = offset.saturating_add(length);
    if mode & FALLOC_KEEP_SIZE == 0 && end > size {
        return Some(vdi.grow(end).await.map_err(CacheError::from));
    }
    Some(Ok(()))
}
