//! A VDI handle's allocation-map entries on their way to the inode.
//!
//! Every change of the inode is ordered behind the one before it (one object), so one write
//! per entry would make concurrent first writes into new objects wait on each other. Entries
//! are queued and written together (group commit): the call that gets to write takes every
//! entry waiting then and writes each run of adjacent indexes as one write.
//!
//! A first write (into a new object, or a copy-on-write) does not wait for its entry
//! ([`EntryLog::push`], then [`EntryLog::schedule`]): a task writes it at once, and every
//! [`Client::flush`] writes what is still queued before it flushes the nodes (the log is
//! registered with the client), so an entry is durable with the data it maps. Until then a
//! crash may lose it, as it may lose the unflushed write itself: the index then reads as
//! before (the ancestor's object, or a hole). A map entry that a crash kept while the object
//! it names was lost reads as what that object was copied from (see `Vdi::read_mapped`).
//! An unmap (a discard) waits for its entry ([`EntryLog::write_upto`]) before the object goes.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures::future::BoxFuture;

use objstore_proto::oid::{ObjectId, Vid, INODE_HEADER_LEN};

use crate::client::{BeforeFlush, Client, ClientError};

/// Entries changed and not yet written, numbered in the order they came.
#[derive(Default)]
struct Unwritten {
    /// index → (vid, number of the latest change of that index).
    wanted: BTreeMap<u64, (Vid, u64)>,
    /// The number the next change gets.
    next: u64,
    /// Every change numbered below this one is written (or was superseded by one that is).
    written_below: u64,
}

/// See the module documentation.
pub(super) struct EntryLog {
    client: Arc<Client>,
    inode: ObjectId,
    /// The inode's entries carry check bytes.
    checked: bool,
    queue: Mutex<Unwritten>,
    /// Held by the call writing a batch.
    writer: tokio::sync::Mutex<()>,
    /// A task is on its way to write what is queued.
    scheduled: AtomicBool,
}

impl EntryLog {
    /// The log of inode `inode`, registered with `client` so that its flushes write it first.
    pub(super) fn new(client: Arc<Client>, inode: ObjectId, checked: bool) -> Arc<EntryLog> {
        let log = Arc::new(EntryLog {
            client: client.clone(),
            inode,
            checked,
            queue: Mutex::default(),
            writer: tokio::sync::Mutex::new(()),
            scheduled: AtomicBool::new(false),
        });
        let weak: std::sync::Weak<dyn BeforeFlush> = Arc::downgrade(&log) as _;
        client.before_flush(weak);
        log
    }

    /// Queues `index → vid`; returns its number (for [`EntryLog::write_upto`]).
    pub(super) fn push(&self, index: u64, vid: Vid) -> u64 {
        let mut q = self.queue.lock().unwrap();
        let t = q.next;
        q.next += 1;
        q.wanted.insert(index, (vid, t));
        t
    }

    /// Has a task write what is queued, unless one is on its way. Outside a tokio runtime
    /// nothing is spawned: the next flush or wait writes it.
    pub(super) fn schedule(self: &Arc<Self>) {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.scheduled.swap(true, Ordering::SeqCst) {
            return;
        }
        let log = self.clone();
        rt.spawn(async move {
            loop {
                let r = log.drain().await;
                log.scheduled.store(false, Ordering::SeqCst);
                if let Err(e) = r {
                    tracing::warn!(
                        "writing map entries of {}: {e} (written again at the next flush)",
                        log.inode
                    );
                    return;
                }
                let more = !log.queue.lock().unwrap().wanted.is_empty();
                if !more || log.scheduled.swap(true, Ordering::SeqCst) {
                    return;
                }
            }
        });
    }

    /// Returns once every entry pushed so far is in the inode: those still queued, and those
    /// a batch in flight took from the queue (an empty queue is not enough: the batch may
    /// still be on its way, or fail and come back).
    pub(super) async fn drain(&self) -> Result<(), ClientError> {
        let last = {
            let q = self.queue.lock().unwrap();
            if q.written_below >= q.next {
                return Ok(());
            }
            q.next - 1
        };
        self.write_upto(last).await
    }

    /// Returns once change `ticket` is written (by this call or another).
    pub(super) async fn write_upto(&self, ticket: u64) -> Result<(), ClientError> {
        let _writer = self.writer.lock().await;
        let batch = {
            let mut q = self.queue.lock().unwrap();
            if q.written_below > ticket {
                return Ok(());
            }
            std::mem::take(&mut q.wanted)
        };
        let upto = batch.values().map(|&(_, t)| t + 1).max().unwrap_or(0);
        match self.write(&batch).await {
            Ok(()) => {
                let mut q = self.queue.lock().unwrap();
                q.written_below = q.written_below.max(upto);
                Ok(())
            }
            Err(e) => {
                // Back in the queue unless changed again meanwhile.
                let mut q = self.queue.lock().unwrap();
                for (i, w) in batch {
                    q.wanted.entry(i).or_insert(w);
                }
                Err(e)
            }
        }
    }

    /// Writes `batch`'s entries to the inode: one write for each run of adjacent indexes, each
    /// entry with its check byte (4 bytes).
    async fn write(&self, batch: &BTreeMap<u64, (Vid, u64)>) -> Result<(), ClientError> {
        let mut runs: Vec<(u64, Vec<u8>)> = Vec::new();
        for (&i, &(v, _)) in batch {
            let raw = super::inode::entry(self.checked, i, v).to_be_bytes();
            match runs.last_mut() {
                Some((first, bytes)) if *first + (bytes.len() / 4) as u64 == i => {
                    bytes.extend_from_slice(&raw)
                }
                _ => runs.push((i, raw.to_vec())),
            }
        }
        for (first, bytes) in runs {
            let at = INODE_HEADER_LEN as u64 + 4 * first;
            self.client
                .write_obj(self.inode, at, Bytes::from(bytes))
                .await?;
        }
        Ok(())
    }
}

impl BeforeFlush for EntryLog {
    fn write_pending(&self) -> BoxFuture<'_, Result<(), ClientError>> {
        Box::pin(self.drain())
    }
}
