//! Library errors to errno, in one place, by the kind of error (never by its text).

use fuser::Errno;
use objcache::CacheError;
use objstore_client::lock::LockError;
use objstore_client::{ClientError, VdiError};

/// The errno for a failed request through the cache.
pub fn from_cache(e: &CacheError) -> Errno {
    match e {
        CacheError::Vdi(v) => from_vdi(v),
        CacheError::Fetch { source, .. } => from_vdi(source),
        CacheError::Lock(l) => from_lock(l),
        // Another host's attachment owns the VDI now, or this one's unpushed writes do.
        CacheError::Conflict { .. } => Errno::EBUSY,
        // This mount's lock ended and another attachment came: no more I/O through it.
        CacheError::LockLost { .. } => Errno::EIO,
        // The cache disk, or pushes that fsync needed: the caller's data is not lost, but
        // the request failed.
        _ => Errno::EIO,
    }
}

/// The errno a FUSE caller sees for `e`.
pub fn from_vdi(e: &VdiError) -> Errno {
    match e {
        VdiError::NotFound(_) => Errno::ENOENT,
        VdiError::Exists(_) => Errno::EEXIST,
        VdiError::ReadOnly(_) => Errno::EROFS,
        VdiError::Attached { .. } => Errno::EBUSY,
        VdiError::InvalidName(n) if n.name.len() > 255 => Errno::ENAMETOOLONG,
        VdiError::InvalidName(_) => Errno::EINVAL,
        VdiError::TooLarge { .. } => Errno::EFBIG,
        VdiError::InvalidSize { .. } => Errno::EINVAL,
        VdiError::OutOfRange { .. } => Errno::ENOSPC,
        VdiError::NoVid => Errno::ENOSPC,
        VdiError::Cluster(c) => from_client(c),
        _ => Errno::EIO,
    }
}

/// The errno for a failed attachment-lock operation.
pub fn from_lock(e: &LockError) -> Errno {
    match e {
        LockError::Held { .. } => Errno::EBUSY,
        LockError::InvalidName(n) if n.name.len() > 255 => Errno::ENAMETOOLONG,
        LockError::InvalidName(_) => Errno::EINVAL,
        LockError::NotFound(_) => Errno::ENOENT,
        LockError::Cluster(c) => from_client(c),
        _ => Errno::EIO,
    }
}

pub fn from_client(e: &ClientError) -> Errno {
    match e {
        ClientError::NoSpace(_) => Errno::ENOSPC,
        _ => Errno::EIO,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mapping() {
        assert_eq!(from_vdi(&VdiError::NotFound("x".into())), Errno::ENOENT);
        assert_eq!(
            from_vdi(&VdiError::OutOfRange {
                name: "x".into(),
                offset: 1,
                len: 1,
                size: 1
            }),
            Errno::ENOSPC
        );
        assert_eq!(
            from_vdi(&VdiError::InvalidSize {
                name: "x".into(),
                reason: "shrinking from 2 to 1 is not supported".into()
            }),
            Errno::EINVAL
        );
        assert_eq!(
            from_vdi(&VdiError::TooLarge {
                name: "x".into(),
                size: 1 << 50,
                max: 1 << 46,
                object_size: 4 << 20,
            }),
            Errno::EFBIG
        );
        assert_eq!(
            from_cache(&CacheError::Conflict {
                name: "x".into(),
                ours: 1,
                theirs: 2
            }),
            Errno::EBUSY
        );
        assert_eq!(
            from_cache(&CacheError::Vdi(VdiError::NotFound("x".into()))),
            Errno::ENOENT
        );
        assert_eq!(
            from_vdi(&VdiError::Cluster(ClientError::Timeout {
                secs: 1.0,
                last: "x".into()
            })),
            Errno::EIO
        );
    }
}
