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
//!
//! An entry written is kept until a flush has made it durable, and every flush (and every
//! refresh) writes it again first: a crash of the inode's nodes may lose an entry already
//! written, while this handle's map still names the object and goes on writing into it; a
//! later flush that wrote only the queue would succeed with the inode lacking the entry, and
//! a fresh open would read those flushed writes as zeros (simulator seed 1122).

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
    /// Entries written to the inode that no flush has made durable yet: index → (vid,
    /// number). Written again before each flush and refresh (see the module documentation).
    unflushed: BTreeMap<u64, (Vid, u64)>,
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
    /// still be on its way, or fail and come back). Entries a failed batch put back are
    /// queued whatever their number (a failed rewrite's are older than `written_below`), so
    /// the queue is written whenever it is not empty.
    pub(super) async fn drain(&self) -> Result<(), ClientError> {
        {
            let q = self.queue.lock().unwrap();
            if q.written_below >= q.next && q.wanted.is_empty() {
                return Ok(());
            }
        }
        // Taken once the batch in flight, if any, is done (written, or back in the queue).
        let _writer = self.writer.lock().await;
        let batch = std::mem::take(&mut self.queue.lock().unwrap().wanted);
        self.write_batch(batch).await
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
        self.write_batch(batch).await
    }

    /// Writes every entry pushed so far that no flush has made durable: those queued, those
    /// a batch has on their way, and those written since the last flush that succeeded after
    /// writing them. Returns the mark to give [`EntryLog::flushed`] once the nodes are flushed.
    pub(super) async fn write_unflushed(&self) -> Result<u64, ClientError> {
        let _writer = self.writer.lock().await;
        let (batch, mark) = {
            let mut q = self.queue.lock().unwrap();
            let mut batch = std::mem::take(&mut q.wanted);
            for (&i, &w) in &q.unflushed {
                batch.entry(i).or_insert(w);
            }
            (batch, q.next)
        };
        self.write_batch(batch).await?;
        Ok(mark)
    }

    /// The entries this log set that no flush has made durable yet (queued, on their way, or
    /// written since the last flush), newest of each index: the map here must keep them
    /// whatever an inode read says (a crash may have lost them there, or the read may come
    /// from a replica left behind), until a flush has made them durable.
    pub(super) fn not_durable(&self) -> Vec<(u64, Vid)> {
        let q = self.queue.lock().unwrap();
        let mut all: BTreeMap<u64, (Vid, u64)> = q.unflushed.clone();
        for (&i, &w) in &q.wanted {
            let e = all.entry(i).or_insert(w);
            if e.1 < w.1 {
                *e = w;
            }
        }
        all.into_iter().map(|(i, (v, _))| (i, v)).collect()
    }

    /// The nodes were flushed after [`EntryLog::write_unflushed`] returned `mark`: entries
    /// numbered below it are durable and need not be written again.
    pub(super) fn flushed(&self, mark: u64) {
        self.queue
            .lock()
            .unwrap()
            .unflushed
            .retain(|_, &mut (_, t)| t >= mark);
    }

    /// Writes `batch` (taken from the queue by a caller holding the writer lock): on success
    /// its entries count as written and wait for a flush; on failure those not changed again
    /// meanwhile go back into the queue.
    async fn write_batch(&self, batch: BTreeMap<u64, (Vid, u64)>) -> Result<(), ClientError> {
        if batch.is_empty() {
            return Ok(());
        }
        let upto = batch.values().map(|&(_, t)| t + 1).max().unwrap_or(0);
        match self.write(&batch).await {
            Ok(()) => {
                let mut q = self.queue.lock().unwrap();
                q.written_below = q.written_below.max(upto);
                for (i, w) in batch {
                    // A newer change of i is still queued (pushed while this batch was on
                    // its way) or a newer entry was written: keep that one.
                    let e = q.unflushed.entry(i).or_insert(w);
                    if e.1 < w.1 {
                        *e = w;
                    }
                }
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
    fn write_pending(&self) -> BoxFuture<'_, Result<u64, ClientError>> {
        Box::pin(self.write_unflushed())
    }

    fn flushed(&self, mark: u64) {
        EntryLog::flushed(self, mark)
    }
}
