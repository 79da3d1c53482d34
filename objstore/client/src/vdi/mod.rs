//! VDIs: virtual disks cut into objects.
//!
//! - `table`: the VDI table (`vdi/<name>` → vid) in the cluster's key-value store, and the
//!   operations on whole VDIs (create, list, delete, resize); vids come from a counter there
//!   and are never reused.
//! - [`inode`]: each VDI's inode object (`ObjectId::inode(vid)`): header and allocation map.
//! - `handle`: [`Vdi`], an open VDI: byte-addressed I/O over its objects.
//! - [`check`]: checking every copy of a VDI's objects and repairing the bad ones.
//! - [`snapshot`](mod@snapshot): snapshots (`NAME@TAG`, read-only), clones and rollback.
//! - [`space`]: which inodes read which objects: space accounting and freeing what nothing
//!   reads.
//!
//! Holes read as zeros and cost no object and no request. The first write to an index writes the
//! data object on every replica, then records it in the map.

pub mod check;
mod entries;
mod handle;
pub mod inode;
pub mod snapshot;
pub mod space;
mod table;

use thiserror::Error;

pub use objstore_proto::name::{split_snapshot, validate_name, InvalidName};
use objstore_proto::oid::{MAX_INDEXES, MAX_VID};
use objstore_proto::size::format_size;

use crate::client::ClientError;
use crate::lock;

pub use handle::Vdi;
pub use inode::InodeHeader;
pub use snapshot::{clone, clones_of, delete_snapshot, rollback, snapshot};
pub use space::{gc, tree, GcReport, TreeNode};
pub use table::{
    check_not_attached, create, create_with, delete, delete_held, list, list_names, resize, VdiInfo,
};

/// Most object requests one VDI operation keeps in flight.
pub const PARALLEL: usize = 16;

#[derive(Debug, Error)]
#[non_exhaustive]
pub enum VdiError {
    #[error(transparent)]
    InvalidName(#[from] InvalidName),
    #[error("VDI '{0}' already exists")]
    Exists(String),
    #[error("'{0}' is a snapshot: snapshots are read-only (clone it to write)")]
    ReadOnly(String),
    #[error("'{0}' is a VDI, not a snapshot: name one as NAME@TAG")]
    NotSnapshot(String),
    #[error("snapshot '{name}' has clones made from it: {}; delete them first", clones.join(", "))]
    HasClones { name: String, clones: Vec<String> },
    #[error("no VDI named '{0}'")]
    NotFound(String),
    #[error("invalid size for VDI '{name}': {reason}")]
    InvalidSize { name: String, reason: String },
    /// Larger than the cluster can address with the VDI's object size.
    #[error(
        "invalid size for VDI '{name}': {} is over the limit of {} with {} objects",
        format_size(*size),
        format_size(*max),
        format_size(*object_size as u64)
    )]
    TooLarge {
        name: String,
        size: u64,
        max: u64,
        object_size: u32,
    },
    #[error("range {offset}+{len} is past the end of VDI '{name}' ({size} bytes)")]
    OutOfRange {
        name: String,
        offset: u64,
        len: u64,
        size: u64,
    },
    #[error("VDI '{name}' is damaged: {reason}")]
    Corrupt { name: String, reason: String },
    #[error("no VDI id left (all {MAX_VID} are used)")]
    NoVid,
    #[error("redundancy of VDI '{name}': {reason}")]
    Redundancy { name: String, reason: String },
    /// A layer above the cluster (e.g. sheepfs's cache) could not do its part.
    #[error("VDI '{name}': {reason}")]
    Unavailable { name: String, reason: String },
    #[error("VDI '{name}' is attached read-write by {host}: detach it (unmount) or 'dog vdi lock break {name}' first")]
    Attached { name: String, host: String },
    #[error(transparent)]
    Cluster(#[from] ClientError),
}

impl From<lock::LockError> for VdiError {
    fn from(e: lock::LockError) -> Self {
        use lock::LockError as L;
        match e {
            L::Held { vdi, host, .. } => VdiError::Attached { name: vdi, host },
            L::HandOverTimedOut { ref vdi, .. } => VdiError::Unavailable {
                name: vdi.clone(),
                reason: e.to_string(),
            },
            L::InvalidName(e) => VdiError::InvalidName(e),
            L::NotFound(name) => VdiError::NotFound(name),
            L::Corrupt { name, reason } => VdiError::Corrupt { name, reason },
            L::Cluster(e) => VdiError::Cluster(e),
        }
    }
}

/// The largest VDI the cluster can hold with objects of `object_size` bytes.
pub fn max_size(object_size: u32) -> u64 {
    object_size as u64 * MAX_INDEXES
}

pub(crate) fn check_size(name: &str, size: u64, object_size: u32) -> Result<(), VdiError> {
    if size > max_size(object_size) {
        return Err(VdiError::TooLarge {
            name: name.to_string(),
            size,
            max: max_size(object_size),
            object_size,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn four_tib_fits() {
        assert!(check_size("x", 4 << 40, 4 << 20).is_ok());
        assert!(check_size("x", 64 << 40, 4 << 20).is_ok());
        let e = check_size("x", (64 << 40) + 1, 4 << 20).unwrap_err();
        assert!(matches!(e, VdiError::TooLarge { .. }));
        assert_eq!(
            e.to_string(),
            "invalid size for VDI 'x': 64.0 TiB is over the limit of 64.0 TiB with 4.0 MiB objects"
        );
    }
}
