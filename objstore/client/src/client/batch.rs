//! Writes of one erasure-coded object that wait for their turn go together.
//!
//! This client has one change of an object in flight at a time ([`Client::order_lock`]), and a
//! change of an erasure-coded object costs its primary much more than one of a replicated
//! object: a read of the old bytes the write covers, the parity recoded, and a sync on every
//! strip holder before it answers. So the writes that wait meanwhile (a sequential writer with
//! several requests in flight, as fio or a guest's block layer) do not each pay that cost: the
//! first of them to get the object's turn takes every write of the object then waiting, and
//! sends each run of them that joins up (adjacent or overlapping ranges) as one write. Where
//! waiting writes overlap, the later-queued one's bytes win, as if sent in queue order; none of
//! them was acknowledged yet, so any order is one the caller allowed.
//!
//! A write taken into a batch is acknowledged when the batch's write is. If the batch's write
//! fails, or the task sending it is dropped, each write it took is sent again on its own by
//! its own caller, which then gets its own answer: the bytes are the same, so a batch that did
//! land and is sent again piece by piece changes nothing.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use bytes::{Bytes, BytesMut};
use tokio::sync::oneshot;

use objstore_proto::oid::ObjectId;

/// A write waiting for its object's turn.
struct Waiting {
    seq: u64,
    offset: u64,
    data: Bytes,
    /// Told true once a batch wrote it; false (or dropped) when its caller must write it.
    done: oneshot::Sender<bool>,
}

/// The writes waiting, by object.
#[derive(Default)]
pub(super) struct Batches {
    next: AtomicU64,
    waiting: Mutex<HashMap<ObjectId, Vec<Waiting>>>,
}

/// A caller's place in the queue of its object.
pub(super) struct Ticket {
    seq: u64,
    pub(super) answer: oneshot::Receiver<bool>,
}

/// One write a batch sends: the writes it stands for, told how it went.
pub(super) struct Run {
    pub(super) offset: u64,
    pub(super) data: Bytes,
    /// Of the other callers' writes in the run.
    others: Vec<oneshot::Sender<bool>>,
    /// Whether the caller that took the batch has its own write in this run.
    pub(super) mine: bool,
}

impl Run {
    /// The writes the run stands for.
    pub(super) fn writes(&self) -> usize {
        self.others.len() + usize::from(self.mine)
    }

    /// Tells the other writes of the run whether it was written.
    pub(super) fn finish(self, written: bool) {
        for tx in self.others {
            let _ = tx.send(written);
        }
    }
}

impl Batches {
    /// Queues a write of `data` at `offset` of `oid`.
    pub(super) fn enqueue(&self, oid: ObjectId, offset: u64, data: Bytes) -> Ticket {
        let seq = self.next.fetch_add(1, Ordering::Relaxed);
        let (done, answer) = oneshot::channel();
        let w = Waiting {
            seq,
            offset,
            data,
            done,
        };
        self.waiting.lock().unwrap().entry(oid).or_default().push(w);
        Ticket { seq, answer }
    }

    /// Drops the write of `ticket` if no batch took it (its caller gave up waiting).
    pub(super) fn cancel(&self, oid: ObjectId, ticket: &Ticket) {
        let mut waiting = self.waiting.lock().unwrap();
        if let Some(queue) = waiting.get_mut(&oid) {
            queue.retain(|w| w.seq != ticket.seq);
            if queue.is_empty() {
                waiting.remove(&oid);
            }
        }
    }

    /// With `oid`'s turn: every write of it waiting, as runs to send, if the write of `ticket`
    /// is still among them; None when another caller's batch took it already.
    pub(super) fn take(&self, oid: ObjectId, ticket: &Ticket) -> Option<Vec<Run>> {
        let mut waiting = self.waiting.lock().unwrap();
        let queue = waiting.get(&oid)?;
        if !queue.iter().any(|w| w.seq == ticket.seq) {
            return None;
        }
        let taken = waiting.remove(&oid).unwrap_or_default();
        drop(waiting);
        Some(runs(taken, ticket.seq))
    }
}

/// `taken` cut into runs of joined ranges, each assembled in queue order.
fn runs(mut taken: Vec<Waiting>, mine: u64) -> Vec<Run> {
    taken.sort_by_key(|w| (w.offset, w.seq));
    let mut groups: Vec<Vec<Waiting>> = Vec::new();
    let mut end = 0u64;
    for w in taken {
        let w_end = w.offset + w.data.len() as u64;
        match groups.last_mut() {
            Some(g) if w.offset <= end => {
                g.push(w);
                end = end.max(w_end);
            }
            _ => {
                groups.push(vec![w]);
                end = w_end;
            }
        }
    }
    groups
        .into_iter()
        .map(|mut g| {
            if g.len() == 1 {
                let w = g.pop().expect("one write");
                let mine = w.seq == mine;
                let others = if mine { Vec::new() } else { vec![w.done] };
                return Run {
                    offset: w.offset,
                    data: w.data,
                    others,
                    mine,
                };
            }
            let start = g.iter().map(|w| w.offset).min().expect("a write");
            let stop = (g.iter())
                .map(|w| w.offset + w.data.len() as u64)
                .max()
                .expect("a write");
            let mut buf = BytesMut::zeroed((stop - start) as usize);
            g.sort_by_key(|w| w.seq);
            for w in &g {
                let at = (w.offset - start) as usize;
                buf[at..at + w.data.len()].copy_from_slice(&w.data);
            }
            let mut run = Run {
                offset: start,
                data: buf.freeze(),
                others: Vec::new(),
                mine: false,
            };
            for w in g {
                if w.seq == mine {
                    run.mine = true;
                } else {
                    run.others.push(w.done);
                }
            }
            run
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use objstore_proto::oid::{ObjIndex, Vid};

    fn oid() -> ObjectId {
        ObjectId::data(Vid(7), ObjIndex(3))
    }

    #[test]
    fn joined_writes_go_as_one_run_later_bytes_winning() {
        let b = Batches::default();
        let t1 = b.enqueue(oid(), 100, Bytes::from(vec![1u8; 50]));
        let mut t2 = b.enqueue(oid(), 150, Bytes::from(vec![2u8; 50]));
        let mut t3 = b.enqueue(oid(), 120, Bytes::from(vec![3u8; 10]));
        let mut t4 = b.enqueue(oid(), 500, Bytes::from(vec![4u8; 8]));
        let runs = b.take(oid(), &t1).expect("t1 waits");
        assert_eq!(runs.len(), 2);
        let (a, c) = (&runs[0], &runs[1]);
        assert_eq!((a.offset, a.data.len(), a.mine), (100, 100, true));
        assert_eq!(&a.data[..20], &[1u8; 20][..]);
        assert_eq!(&a.data[20..30], &[3u8; 10][..]);
        assert_eq!(&a.data[30..50], &[1u8; 20][..]);
        assert_eq!(&a.data[50..], &[2u8; 50][..]);
        assert_eq!((c.offset, &c.data[..], c.mine), (500, &[4u8; 8][..], false));
        // The others' turn is gone: their writes were taken.
        assert!(b.take(oid(), &t2).is_none());
        let mut runs = runs.into_iter();
        runs.next().unwrap().finish(true);
        runs.next().unwrap().finish(false);
        assert_eq!(t2.answer.try_recv(), Ok(true));
        assert_eq!(t3.answer.try_recv(), Ok(true));
        assert_eq!(t4.answer.try_recv(), Ok(false));
    }

    #[test]
    fn a_run_dropped_unsent_tells_its_writes_to_go_alone() {
        let b = Batches::default();
        let t1 = b.enqueue(oid(), 0, Bytes::from(vec![1u8; 4]));
        let mut t2 = b.enqueue(oid(), 4, Bytes::from(vec![2u8; 4]));
        drop(b.take(oid(), &t1).unwrap());
        assert!(t2.answer.try_recv().is_err());
    }

    #[test]
    fn another_objects_writes_stay() {
        let b = Batches::default();
        let other = ObjectId::data(Vid(7), ObjIndex(4));
        let t1 = b.enqueue(oid(), 0, Bytes::from(vec![1u8; 4]));
        let t2 = b.enqueue(other, 4, Bytes::from(vec![2u8; 4]));
        assert_eq!(b.take(oid(), &t1).unwrap().len(), 1);
        assert!(b.take(oid(), &t1).is_none());
        let runs = b.take(other, &t2).unwrap();
        assert_eq!((runs.len(), runs[0].mine), (1, true));
    }

    #[test]
    fn a_write_given_up_leaves_the_queue() {
        let b = Batches::default();
        let t1 = b.enqueue(oid(), 0, Bytes::from(vec![1u8; 4]));
        let t2 = b.enqueue(oid(), 4, Bytes::from(vec![2u8; 4]));
        b.cancel(oid(), &t1);
        let runs = b.take(oid(), &t2).unwrap();
        assert_eq!((runs.len(), runs[0].offset, runs[0].data.len()), (1, 4, 4));
        b.cancel(oid(), &t2);
        assert!(b.waiting.lock().unwrap().is_empty());
    }
}
