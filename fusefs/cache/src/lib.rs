//! The object cache: a directory on fast local disk, bounded in bytes, LRU, between sheepfs
//! and the cluster.
//!
//! ```text
//! DIR/state.json            {cache_id, boot_id, clean, sums}: how the last mount ended
//! DIR/control.sock          cachectl's socket (0600), served by sheepfs (`cache_control`)
//! DIR/index/                sled: last access per object (rebuilt from files when lost)
//! DIR/vdis/<vid>.json       {name, vid, gen, mode, cluster}: the lock generation (and the
//!                           cluster) the cache matches
//! DIR/obj/<vid>/<idx>.data  cached bytes (sparse)
//! DIR/obj/<vid>/<idx>.meta  valid and dirty bitmaps, one bit per 4 KiB block
//! DIR/orphaned/             unpushed writes of another cluster's VDIs, set aside ([`orphan`])
//! ```
//! Invariants:
//! - A block is dirty only if it is valid; dirty blocks are never evicted or dropped except by
//!   an explicit `evict --discard-dirty`.
//! - The dirty byte counter (`Space::dirty`) moves only under the state lock of the object
//!   whose dirty bits change, by the bits changed: it equals the bytes of the dirty blocks
//!   whenever no state lock is held, and never goes below zero.
//! - A flush (fsync) pushes every block dirty when it started (what the dirty bits say, not
//!   the counter; quarantined blocks excepted, see [`sums`]) and returns after the cluster
//!   flushed it; a block written while its push is in flight stays dirty
//!   (`State::rewritten`) and goes out with the next push.
//! - After a kill -9 of sheepfs the files are trusted (the host's page cache holds them) and
//!   the dirty blocks are pushed at the next mount. After the host went down while mounted
//!   (another boot id, not marked clean) nothing is trusted: everything is dropped, losing
//!   only writes never fsynced, as on any disk.
//! - A VDI's cached data is used only while this cache holds its attachment lock and the lock's
//!   generation equals the one recorded when the data was cached: if another host attached the
//!   VDI since, the data is dropped on attach.
//! - An object is evicted only while nobody holds a pin on it ([`space::Pinned`], taken under
//!   the LRU's lock by every lookup that hands the object out); nothing waits by polling:
//!   making room waits for a pin released, a push done or space freed ([`space::Room`]).
//!
//! One module, and one part of [`Inner`], per job:
//! - [`lifecycle`]: open at mount, start the workers, shut down at unmount.
//! - [`dir`]: the directory's lock and state, and the VDI records ([`dir::CacheDir`]).
//! - [`space`]: the objects in LRU order, the bytes they hold, eviction ([`space::Space`]).
//! - [`attach`]: VDI locks, their generations and leases ([`attach::Attachments`]; the lease
//!   keeper in [`attach::lock_keeper`]).
//! - [`backend`]: what the cache needs of the cluster ([`Backend`]; the real one is the
//!   cluster's client).
//! - [`fill`]: fetched ranges written into the cache, admission ([`fill::Fills`]).
//! - [`push`]: pushes to the cluster and the background flusher ([`push::Pushes`]).
//! - [`full`]: what a write does when the cache cannot take it (its disk or size full).
//! - [`closing`]: writes while the unmount pushes the last dirty data, and after it.
//! - [`stats`]: counters and modes ([`stats::Stats`]).
//! - [`control`]: what `cachectl` asks of the cache, through sheepfs's control socket.
//! - [`handover`]: the lock of an attached VDI handed over to another mount that asked.
//! - [`switch`]: a snapshot or rollback taken by this mount moves an attached VDI to its new
//!   inode (id).
//! - [`vdi`]: a VDI seen through the cache ([`CachedVdi`]), the filesystem's handle.
//! - [`orphan`]: cached data of another cluster's VDI, set aside instead of pushed.
//! - [`object`], [`bitmap`], [`spare`]: one cached object's files; [`admit`], [`pressure`]:
//!   the admission and CPU-pressure policies; [`error`]: the error types.
//!
//! Lock order. A lock may be taken while holding only locks listed before it (`→`: "may
//! be held while taking"); the others are leaves, never held while taking any lock:
//! - `CachedVdi::inflight` → `Admission`'s stream LRU, and `CachedVdi::inflight` →
//!   `Space::objects` (deciding whether a miss is kept); the CPU pressure's lock is only ever
//!   tried.
//! - `Pushes::push_lock` (async, held across pushes) → `CachedObject::pushing` (async) →
//!   `CachedObject::writing` (a push reads the data under it) → `CachedObject::state`.
//!   Changes that reach the cluster around the cache (discards, mode-off writes,
//!   write-throughs of a full cache) hold `pushing` of several objects, taken in index order.
//! - `CachedObject::writing` → `CachedObject::state`.
//! - `Space::objects` → `CachedObject::state`, and `Space::objects` → `Space::creating`
//!   (taking an object out, or creating one: its files are made after both are released).
//! - `Stats::mode_cells` → `CacheDir::records` (read).
//! - Leaves: `CacheDir::records` otherwise, `Attachments::attached`, `Attachments::held`,
//!   `Attachments::lost`, `Stats::counters`,
//!   `Fills::unsaved`, `Pushes::last_push_error`, `CachedVdi::run`.

// These docs map the crate's insides for its maintainers (`cargo doc
// --document-private-items` renders every link); sheepfs is its only user.
#![allow(rustdoc::private_intra_doc_links)]

mod admit;
mod attach;
mod backend;
mod bitmap;
mod closing;
mod control;
mod dir;
mod error;
mod files;
mod fill;
mod full;
mod handover;
mod lifecycle;
mod object;
mod orphan;
mod pressure;
mod push;
mod space;
mod spare;
mod stats;
mod sums;
mod switch;
mod vdi;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use cache_control::CacheMode;
use objstore_client::Client;

pub use backend::{Backend, Pause};

pub use error::{chain, CacheError, PushError};
pub use handover::{Given, HeldLock, LockIdentity};
pub use switch::Switched;
pub use vdi::{CachedVdi, Missed};

#[derive(Debug, Clone)]
pub struct CacheConfig {
    pub dir: PathBuf,
    pub size: u64,
    pub mode: CacheMode,
    pub max_dirty: u64,
    pub max_dirty_age: Duration,
    /// Sequential runs longer than this are streams, cached on their second pass (0: on
    /// their first); see [`CachedVdi`]'s stream tracking.
    pub sequential_cutoff: u64,
    /// The TTL of the leases the VDI locks are bound to: a mount that dies (or is cut off from
    /// the cluster) loses its locks this long after its last renewal.
    pub lock_ttl: Duration,
}

/// The cache's state, one part per job (see the crate's doc).
pub(crate) struct Inner<B: Backend> {
    cfg: CacheConfig,
    /// The cluster.
    client: B,
    dir: dir::CacheDir,
    space: space::Space,
    attach: attach::Attachments<B::Volume>,
    fills: fill::Fills,
    pushes: push::Pushes,
    stats: stats::Stats,
    closing: closing::Closing,
    /// VDIs the mount is attaching again because the last mount left them dirty or attached
    /// ([`Cache::start`]): a push of one of them waits for it instead of failing.
    reattaching: tokio::sync::watch::Sender<usize>,
}

/// A handle on the cache, shared by the filesystem, the flusher and the control socket;
/// over the cluster's [`Client`] unless a test gives it another [`Backend`].
pub struct Cache<B: Backend = Arc<Client>> {
    inner: Arc<Inner<B>>,
}

impl<B: Backend> Clone for Cache<B> {
    fn clone(&self) -> Self {
        Cache {
            inner: self.inner.clone(),
        }
    }
}

impl<B: Backend> Cache<B> {
    pub fn dir(&self) -> &Path {
        &self.inner.cfg.dir
    }
}
