//! Library errors to errno, in one place.

use fuser::Errno;
use objstore_client::lock::LockError;
use objstore_client::{ClientError, VdiError};

/// The errno a FUSE caller sees for `e`.
pub fn from_vdi(e: &VdiError) -> Errno {
    match e {
        VdiError::NotFound(_) => Errno::ENOENT,
        VdiError::Exists(_) => Errno::EEXIST,
        VdiError::Attached { .. } => Errno::EBUSY,
        VdiError::InvalidName(n) if n.name.len() > 255 => Errno::ENAMETOOLONG,
        VdiError::InvalidName(_) => Errno::EINVAL,
        VdiError::InvalidSize { reason, .. } if reason.contains("over the limit") => Errno::EFBIG,
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
            from_vdi(&VdiError::Cluster(ClientError::Timeout {
                secs: 1.0,
                last: "x".into()
            })),
            Errno::EIO
        );
    }
}
