//! The cache's errors, one enum per job: [`CacheError`] for what the filesystem above asks
//! of the cache (it maps them to errno, in one place), [`PushError`] for pushing cached
//! writes to the cluster. Each names what failed and keeps its cause as the source, not in
//! its own text: [`chain`] writes the whole story on one line.

use std::path::PathBuf;
use std::sync::Arc;

use objstore_client::{lock::LockError, ClientError, VdiError};

use crate::object::Key;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CacheError {
    /// The cache directory could not be set up or read.
    #[error("cache directory {dir}: {what}")]
    Dir {
        dir: PathBuf,
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("cache directory {dir}: in use by another sheepfs")]
    InUse { dir: PathBuf },
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error(
        "cached unpushed writes to VDI '{name}' belong to an attachment that is no longer current (lock generation {ours} here, {theirs} in the cluster: the lock was broken or taken elsewhere since); drop them with 'cachectl evict {name} --discard-dirty --yes'"
    )]
    Conflict {
        name: String,
        ours: u64,
        theirs: u64,
    },
    /// This mount's lock of the VDI ended and another attachment came (see `attach`).
    #[error(
        "VDI '{name}': this mount lost its lock (its lease ended and the VDI was attached or written elsewhere since); it refuses I/O until the VDI is opened again"
    )]
    LockLost { name: String },
    #[error(transparent)]
    Vdi(#[from] VdiError),
    /// The cache's own files could not be read or written.
    #[error("{what} (cache object {:x}/{})", key.0, key.1)]
    Io {
        what: &'static str,
        key: Key,
        #[source]
        source: std::io::Error,
    },
    /// The unmount is done: the cache released its locks, and takes no more writes.
    #[error("sheepfs is unmounting: the cache takes no more writes")]
    Closed,
    /// A fetch from the cluster that this read started or joined failed.
    #[error("reading VDI '{name}' from the cluster")]
    Fetch {
        name: String,
        #[source]
        source: Arc<VdiError>,
    },
    /// fsync could not push the VDI's cached writes (they stay cached and are retried).
    #[error("VDI '{name}': pushing cached writes failed (they stay cached and are retried)")]
    Push {
        name: String,
        #[source]
        source: PushError,
    },
}

/// Why pushing cached writes to the cluster failed; the data stays dirty and is retried.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PushError {
    #[error("VDI id {vid:x} is not attached: cannot push its writes")]
    NotAttached { vid: u32 },
    #[error("reading cached object {key:?}")]
    ReadCache {
        key: Key,
        #[source]
        source: std::io::Error,
    },
    #[error("writing VDI '{name}'")]
    Write {
        name: String,
        #[source]
        source: VdiError,
    },
    #[error("flushing the cluster")]
    ClusterFlush(#[source] ClientError),
}

/// `e` and its sources on one line, `: ` between them; a source whose text its error
/// already shows (a transparent wrapper, or one that prints its cause) is not repeated.
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cur = s.source();
    }
    out
}

/// Why a cached object's files found at mount cannot be trusted (the object is dropped).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    #[error("reading {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("opening {}", path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The bitmaps file is not one this cache wrote whole.
    #[error("{} {why}", path.display())]
    Untrusted { path: PathBuf, why: &'static str },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_names_every_cause_once() {
        let e = PushError::ReadCache {
            key: (0x2a, 3),
            source: std::io::Error::other("disk gone"),
        };
        assert_eq!(chain(&e), "reading cached object (42, 3): disk gone");
        let e = CacheError::Push {
            name: "d".into(),
            source: e,
        };
        assert_eq!(
            chain(&e),
            "VDI 'd': pushing cached writes failed (they stay cached and are retried): reading cached object (42, 3): disk gone"
        );
        // A transparent wrapper's text is its source's: not repeated.
        let e = CacheError::Vdi(VdiError::NotFound("d".into()));
        assert_eq!(chain(&e), "no VDI named 'd'");
    }
}
