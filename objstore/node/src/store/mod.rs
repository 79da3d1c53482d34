//! The node's object store behind one trait, so that the node runs over real files or, in
//! tests and the fault simulator, over memory.
//!
//! - [`file`]: one file per object under `DIR/obj/`, named `<oid>.<stamp>` (production).
//! - [`mem`]: objects in memory, with a volatile and a durable state so a test can crash a
//!   node and keep only what was flushed, and with injectable I/O errors.
//!
//! The contract every backend keeps:
//! - `write` of a missing object creates it (bytes not written read as zeros) and sets its stamp
//!   to the epoch given when that is higher; `put_if_newer` installs a whole object only over an
//!   older stamp; `remove` of a missing object succeeds.
//! - A write is durable once a later `flush` returned Ok; a crash may lose writes not yet
//!   flushed, never a flushed one, and never leaves an object half-created.
//! - The backend is synchronous: the node calls it on tokio's blocking pool.

pub mod file;
pub mod mem;

use std::io;

use thiserror::Error;

use objstore_proto::oid::ObjectId;

pub use file::FileStore;
pub use mem::MemStore;

#[derive(Debug, Error)]
#[non_exhaustive]
pub enum StoreError {
    #[error("object {0} not found")]
    NotFound(ObjectId),
    #[error("no space left on the node's disk")]
    NoSpace,
    #[error("{op} of object {oid} failed")]
    Io {
        oid: ObjectId,
        op: &'static str,
        #[source]
        source: io::Error,
    },
}

impl StoreError {
    /// An I/O error of `op` on `oid`; ENOSPC becomes [`StoreError::NoSpace`].
    pub fn io(oid: ObjectId, op: &'static str, source: io::Error) -> StoreError {
        if source.raw_os_error() == Some(libc::ENOSPC) {
            StoreError::NoSpace
        } else {
            StoreError::Io { oid, op, source }
        }
    }
}

/// Per-object facts the store keeps in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ObjMeta {
    pub stamp: u32,
}

/// Where a node keeps its objects. See the module documentation for the contract.
pub trait ObjectBackend: Send + Sync + 'static {
    /// The object's metadata, if it is held here.
    fn meta(&self, oid: ObjectId) -> Option<ObjMeta>;
    /// Every object held here with its stamp, sorted by id.
    fn list(&self) -> Vec<(ObjectId, u32)>;
    /// How many objects are held here.
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Reads `len` bytes at `offset`; bytes past the object's end read as zeros.
    fn read(&self, oid: ObjectId, offset: u64, len: usize) -> Result<Vec<u8>, StoreError>;
    /// Reads a whole object and its stamp (for recovery).
    fn read_whole(&self, oid: ObjectId) -> Result<(Vec<u8>, u32), StoreError>;
    /// Writes `data` at `offset`, creating the object if needed, and stamps it with `epoch`.
    fn write(&self, oid: ObjectId, offset: u64, data: &[u8], epoch: u32) -> Result<(), StoreError>;
    /// Replaces the whole object with `data` at `stamp` unless the copy here is at least that
    /// new. Returns whether it installed.
    fn put_if_newer(&self, oid: ObjectId, data: &[u8], stamp: u32) -> Result<bool, StoreError>;
    /// Removes an object; removing a missing object is not an error.
    fn remove(&self, oid: ObjectId) -> Result<(), StoreError>;
    /// Makes every write before this call durable.
    fn flush(&self) -> Result<(), StoreError>;
    /// (total, free) bytes of the medium.
    fn capacity(&self) -> io::Result<(u64, u64)>;
}
