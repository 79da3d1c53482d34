//! The unmount seen by writes: no acknowledged write may stay only in the cache when sheepfs
//! exits, even with files still open and written (a signal detaches the mount, and its open
//! files keep working until the process exits).
//!
//! ```text
//! open ──shutdown starts──▶ closing ──locks released──▶ closed
//!  writeback writes          writes go straight to        writes fail (EIO)
//!  kept dirty                the cluster (as writethrough)
//! ```
//! [`Cache::shutdown`](crate::Cache::shutdown) moves to *closing*, then waits for the
//! writeback writes already under way ([`Inner::writeback_write`]) to end before its final
//! push: after that no write adds dirty data, so the push leaves nothing behind. A write
//! sent to the cluster holds the pushing lock of its cached object, so no push of older
//! bytes of it overlaps, and then puts its bytes into the cached blocks.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

use tokio::sync::Notify;

use crate::{Backend, Inner};

const OPEN: u8 = 0;
const CLOSING: u8 = 1;
const CLOSED: u8 = 2;

/// Where the unmount is, and the writeback writes under way.
#[derive(Default)]
pub(crate) struct Closing {
    state: AtomicU8,
    writes: AtomicU64,
    writes_done: Notify,
}

/// What a write may do now.
pub(crate) enum Admit<'a> {
    /// Keep it in the cache (writeback); the guard counts it as under way.
    Cache(WritebackWrite<'a>),
    /// Send it to the cluster: the unmount is pushing the cache's last dirty data.
    Cluster,
    /// Refuse it: the unmount is done (locks released).
    Refuse,
}

/// A writeback write under way, counted until dropped.
pub(crate) struct WritebackWrite<'a>(&'a Closing);

impl Drop for WritebackWrite<'_> {
    fn drop(&mut self) {
        if self.0.writes.fetch_sub(1, Ordering::SeqCst) == 1
            && self.0.state.load(Ordering::SeqCst) != OPEN
        {
            self.0.writes_done.notify_waiters();
        }
    }
}

impl Closing {
    /// Whether a writeback write may be kept in the cache (see [`Admit`]).
    pub(crate) fn admit(&self) -> Admit<'_> {
        self.writes.fetch_add(1, Ordering::SeqCst);
        // Counted before the check: the unmount, which sets the state before it reads the
        // count, either sees this write or this write sees the state.
        match self.state.load(Ordering::SeqCst) {
            OPEN => Admit::Cache(WritebackWrite(self)),
            s => {
                drop(WritebackWrite(self));
                if s == CLOSING {
                    Admit::Cluster
                } else {
                    Admit::Refuse
                }
            }
        }
    }

    /// Whether writes are refused (the unmount released the locks).
    pub(crate) fn closed(&self) -> bool {
        self.state.load(Ordering::SeqCst) == CLOSED
    }
}

impl<B: Backend> Inner<B> {
    /// See [`Closing::admit`].
    pub(crate) fn writeback_write(&self) -> Admit<'_> {
        self.closing.admit()
    }

    /// The unmount starts: from now on writes go to the cluster; returns once the writeback
    /// writes under way have ended.
    pub(crate) async fn start_closing(&self) {
        let c = &self.closing;
        c.state.store(CLOSING, Ordering::SeqCst);
        loop {
            let done = c.writes_done.notified();
            tokio::pin!(done);
            done.as_mut().enable();
            if c.writes.load(Ordering::SeqCst) == 0 {
                return;
            }
            done.await;
        }
    }

    /// The unmount released the locks: writes are refused from now on.
    pub(crate) fn refuse_writes(&self) {
        self.closing.state.store(CLOSED, Ordering::SeqCst);
    }
}
