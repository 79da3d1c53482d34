//! Incremental backup and restore of VDIs (`dog vdi backup | restore`).
//!
//! - [`format`](mod@format): the delta stream (header, records, trailer; every part checksummed).
//! - [`source`]: what changed between two snapshots of one VDI, as records.
//! - [`target`]: applying a delta to a VDI, then taking its snapshot `NAME@TO`.
//!
//! Between two snapshots of one VDI, an index whose map entry names the same vid in both is
//! unchanged: snapshots are frozen and a write always lands in the writer's own object. Only
//! the other indexes are read; within them, 4 KiB blocks equal to FROM's are left out
//! ([`BLOCK`]), so a 4 KiB write costs a 4 KiB record, not an object.

pub mod format;
pub mod source;
pub mod target;

use thiserror::Error;

use crate::vdi::VdiError;
pub use format::{DeltaError, DeltaReader, DeltaWriter, Header, Record, Summary};
pub use source::Source;
pub use target::Target;

/// The granularity of a changed object's records: blocks equal in FROM and TO are left out.
pub const BLOCK: usize = 4096;

#[derive(Debug, Error)]
#[non_exhaustive]
pub enum BackupError {
    /// The request does not make sense (names, order of snapshots, the target's state).
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    Delta(#[from] DeltaError),
    #[error(transparent)]
    Vdi(#[from] VdiError),
}

impl From<crate::client::ClientError> for BackupError {
    fn from(e: crate::client::ClientError) -> Self {
        BackupError::Vdi(e.into())
    }
}
