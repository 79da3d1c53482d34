//! The checker: every 4 KiB block is a register, written by block writes (its tag) and by
//! removes of its object (zeros), and read by reads.
//!
//! # What a read may return
//! A write `W` (a block write or a remove, acknowledged or failed) or the initial zeros may be
//! returned by a read `R` (invoked at `t0`, returned at `t1`) exactly when
//! 1. `W` was invoked before `t1` (it had begun), or at `t1`: the simulated clock stands still
//!    between timers, so two events at one instant are in no known order (a VDI client's read
//!    of a hole in its map returns at the instant it began, as a discard that made the hole
//!    began), and
//! 2. `W` is not *superseded*: there is no acknowledged write `W2` to the same block, invoked
//!    after `W` returned and acknowledged before `t0`, that is *safe* until `t1`.
//!
//! `W2` is **safe** until `t1` when no node crashed between `W2`'s invocation and the earlier
//! of `t1` and the return of the first acknowledged flush invoked after `W2` was acknowledged.
//! (`t1`, not `t0`: the read may take effect at any moment until it returns, also after a
//! crash during the read that lost `W2`.)
//! Removes count as writes here too: like a discard on a disk, a remove is durable only once a
//! flush covered it (the stores happen to make it durable at once; the contract does not).
//! For a VDI client's write or discard ([`crate::workload::vdi`]) only a flush by that client
//! counts: its map entry is held in that client until one (any flush makes every node sync
//! the objects, so a flush by anyone covers the object clients' writes).
//! So:
//! - an acknowledged write hides everything that returned before it began, until a crash
//!   while it was not yet covered by a flush (then older values may come back, and the
//!   unflushed write may be lost: the block-device contract allows losing unflushed writes
//!   on a crash; any node's crash counts, since placement moves objects between nodes);
//! - a write that overlapped others in time may be returned in any order with them;
//! - a failed write (an error or timeout returned to the client) may or may not have taken
//!   effect, but never after a later safe acknowledged write to its block: data of a failed
//!   write that shows up over a newer acknowledged one is a violation (a late message);
//! - a removed object reads as zeros, and its older data never comes back once the remove is
//!   safe.
//!
//! A block that is neither zeros nor exactly one write's pattern is [`Kind::Garbage`] (torn or
//! mixed data); a pattern of a write that never targeted this block is [`Kind::Foreign`].
//! Errors returned to clients are not violations; they are counted by the run.
//!
//! # Copy-on-write
//! A COW of target `T` from source `S` is a write to `T` of its own block, and of every other
//! block `b` a *copy*: a value that a read of block `b` of `S` could have returned while the
//! COW ran (until it returned; with no end for a COW that failed, which may land late). So a
//! COW target reads as the source at COW time plus the writes acknowledged on it; a value of
//! the source's register that `S` could not have held then is [`Kind::BadCopy`]. A copy never
//! supersedes the data of an earlier COW to the same target: a COW that failed but landed
//! makes the target, and the next COW is then a plain write of its block. A source is never
//! changed by a COW: the source's register has no COW entries, so a COW's tag read from the
//! source is [`Kind::Foreign`].

use std::collections::BTreeMap;
use std::fmt;

use crate::history::{BlockValue, History, Micros, OpKind, Outcome, WriteId};

/// What rule a violation broke.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// A block that is neither zeros nor one write's pattern.
    Garbage,
    /// The pattern of a write to another block or object.
    Foreign,
    /// An older acknowledged value came back over a safe acknowledged write.
    Reverted,
    /// A safe acknowledged write read as zeros (its object or block was lost).
    Lost,
    /// Data removed by a safe acknowledged remove came back.
    Resurrected,
    /// A COW target's block holds a value its source could not have had during the COW.
    BadCopy,
    /// A failed write's data showed up over a later safe acknowledged write.
    LateFailedWrite,
    /// After the faults stopped, the owners of an object hold different bytes.
    Divergent,
    /// After the faults stopped and every node restarted, recovery did not finish in time.
    NotSettled,
    /// After the faults stopped and recovery finished, a read failed.
    FinalReadFailed,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub kind: Kind,
    pub at: Micros,
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} at {:.3} s: {}",
            self.kind,
            self.at as f64 / 1e6,
            self.detail
        )
    }
}

/// One write to one block as the register sees it.
#[derive(Debug, Clone, Copy)]
struct Entry {
    /// 0: the initial zeros.
    id: WriteId,
    zero: bool,
    acked: bool,
    invoke: Micros,
    end: Micros,
    remove: bool,
    /// A COW's copy of this block of the object given (see the module documentation): its
    /// value is the source's, not `id`'s.
    copy: Option<usize>,
    /// Made by a COW (its block, or a copy).
    cow: bool,
    /// Made durable only by flushes of this client (a VDI client's write); None: by any.
    flushed_by: Option<usize>,
}

/// The registers built from a history, to judge reads against.
pub struct Model {
    /// (object, block) -> writes to it, in invocation order.
    regs: BTreeMap<(usize, usize), Vec<Entry>>,
    crashes: Vec<Micros>,
    /// Acknowledged flushes (invoke, end, client).
    flushes: Vec<(Micros, Micros, usize)>,
}

impl Model {
    /// The registers of every block of `objects` objects and of their COW targets
    /// ([`crate::workload::all_objects`]).
    pub fn new(h: &History, objects: usize, blocks: usize) -> Model {
        let regs = crate::workload::all_objects(objects)
            .into_iter()
            .flat_map(|o| (0..blocks).map(move |b| (o, b)));
        Model::with_registers(h, regs)
    }

    /// The registers given, as (object, block): a run's are [`crate::workload::registers`].
    /// Writes and reads of other blocks are not judged.
    pub fn with_registers(
        h: &History,
        registers: impl IntoIterator<Item = (usize, usize)>,
    ) -> Model {
        let initial = Entry {
            id: 0,
            zero: true,
            acked: true,
            invoke: 0,
            end: 0,
            remove: false,
            copy: None,
            cow: false,
            flushed_by: None,
        };
        let mut regs: BTreeMap<(usize, usize), Vec<Entry>> =
            registers.into_iter().map(|r| (r, vec![initial])).collect();
        let mut flushes = Vec::new();
        for op in &h.ops {
            let acked = op.outcome == Outcome::Ok;
            let entry = |obj: usize, id, zero, remove| Entry {
                id,
                zero,
                acked,
                invoke: op.invoke,
                end: op.end,
                remove,
                copy: None,
                cow: false,
                flushed_by: crate::workload::vdi::of(obj).map(|_| op.client),
            };
            match op.kind {
                OpKind::Write { obj, block, id } => {
                    if let Some(r) = regs.get_mut(&(obj, block)) {
                        r.push(entry(obj, id, false, false));
                    }
                }
                OpKind::Remove { obj, id } => {
                    for (_, r) in regs.range_mut((obj, 0)..(obj + 1, 0)) {
                        r.push(entry(obj, id, true, true));
                    }
                }
                OpKind::Cow {
                    obj,
                    source,
                    block,
                    id,
                } => {
                    for (&(_, b), r) in regs.range_mut((obj, 0)..(obj + 1, 0)) {
                        let mut e = entry(obj, id, false, false);
                        e.cow = true;
                        if b != block {
                            e.copy = Some(source);
                        }
                        r.push(e);
                    }
                }
                OpKind::Flush if acked => flushes.push((op.invoke, op.end, op.client)),
                _ => {}
            }
        }
        Model {
            regs,
            crashes: h.crashes.clone(),
            flushes,
        }
    }

    /// Whether acknowledged `w2` is safe until `t1` (see the module documentation): no crash
    /// from its invocation until `t1` or the end of the first flush that covers it.
    fn safe(&self, w2: &Entry, t1: Micros) -> bool {
        let flushed = self
            .flushes
            .iter()
            .filter(|(inv, _, by)| *inv >= w2.end && w2.flushed_by.is_none_or(|c| c == *by))
            .map(|(_, end, _)| *end)
            .min()
            .unwrap_or(Micros::MAX);
        let horizon = flushed.min(t1);
        !self.crashes.iter().any(|&c| c >= w2.invoke && c < horizon)
    }

    /// The newest acknowledged write, acknowledged before `t0` and safe until `t1`, that
    /// supersedes `w`, if any.
    fn superseded_by(&self, reg: &[Entry], w: &Entry, t0: Micros, t1: Micros) -> Option<Entry> {
        reg.iter()
            .filter(|w2| w2.acked && w2.invoke > w.end && w2.end < t0 && self.safe(w2, t1))
            // A COW onto a target an earlier COW made is a plain write: its copies leave
            // that COW's data be.
            .filter(|w2| !(w2.copy.is_some() && w.cow))
            .max_by_key(|w2| w2.end)
            .copied()
    }

    /// Whether `e` is a COW's copy of `block` and the source could have held `got` while
    /// that COW ran (a failed COW: at any time after it began).
    fn copied(&self, e: &Entry, block: usize, got: BlockValue) -> bool {
        let Some(source) = e.copy else {
            return false;
        };
        let until = if e.acked { e.end } else { Micros::MAX };
        self.check(source, block, got, e.invoke, until).is_none()
    }

    /// Judges one block value read by a read invoked at `t0` that returned at `t1`.
    pub fn check(
        &self,
        obj: usize,
        block: usize,
        got: BlockValue,
        t0: Micros,
        t1: Micros,
    ) -> Option<Violation> {
        let at = t1;
        let reg = self.regs.get(&(obj, block))?;
        let where_ = format!("object {obj} block {block}");
        let candidates: Vec<&Entry> = match got {
            BlockValue::Garbage => {
                return Some(Violation {
                    kind: Kind::Garbage,
                    at,
                    detail: format!("{where_}: neither zeros nor one write's data"),
                })
            }
            BlockValue::Zero => reg
                .iter()
                .filter(|e| e.zero || self.copied(e, block, got))
                .collect(),
            BlockValue::Write(id) => {
                let c: Vec<&Entry> = reg
                    .iter()
                    .filter(|e| {
                        (!e.zero && e.copy.is_none() && e.id == id) || self.copied(e, block, got)
                    })
                    .collect();
                if c.is_empty() {
                    if let Some(cow) = reg.iter().find(|e| e.copy.is_some()) {
                        return Some(Violation {
                            kind: Kind::BadCopy,
                            at,
                            detail: format!(
                                "{where_}: holds write {id}, which object {} could not hold during COW {} ({:.3}-{:.3} s) and which never targeted this block",
                                cow.copy.unwrap_or_default(),
                                cow.id,
                                cow.invoke as f64 / 1e6,
                                cow.end as f64 / 1e6
                            ),
                        });
                    }
                    return Some(Violation {
                        kind: Kind::Foreign,
                        at,
                        detail: format!("{where_}: holds write {id}, which never targeted it"),
                    });
                }
                c
            }
        };
        let begun: Vec<&Entry> = candidates.into_iter().filter(|w| w.invoke <= t1).collect();
        if begun.is_empty() {
            return Some(Violation {
                kind: Kind::Foreign,
                at,
                detail: format!("{where_}: read {got:?} before that write began"),
            });
        }
        let mut newest: Option<(Entry, Entry)> = None;
        for w in begun {
            match self.superseded_by(reg, w, t0, t1) {
                None => return None,
                Some(w2) => {
                    let newer = match newest {
                        Some((_, n)) => w2.end > n.end,
                        None => true,
                    };
                    if newer {
                        newest = Some((*w, w2));
                    }
                }
            }
        }
        let (w, w2) = newest?;
        let kind = if !w.acked {
            Kind::LateFailedWrite
        } else if w2.remove && !w.zero {
            Kind::Resurrected
        } else if w.zero && !w2.zero {
            Kind::Lost
        } else {
            Kind::Reverted
        };
        let what = |e: &Entry| {
            if e.id == 0 {
                "the initial zeros".to_string()
            } else if let Some(source) = e.copy {
                format!("COW {}'s copy of object {source}", e.id)
            } else if e.remove {
                format!("remove {}", e.id)
            } else {
                format!("write {}", e.id)
            }
        };
        Some(Violation {
            kind,
            at,
            detail: format!(
                "{where_}: read (invoked {:.3} s) returned {} ({}, {:.3}-{:.3} s) though {} (acknowledged {:.3}-{:.3} s) superseded it",
                t0 as f64 / 1e6,
                what(&w),
                if w.acked { "acknowledged" } else { "failed" },
                w.invoke as f64 / 1e6,
                w.end as f64 / 1e6,
                what(&w2),
                w2.invoke as f64 / 1e6,
                w2.end as f64 / 1e6,
            ),
        })
    }

    /// Judges every acknowledged read of the history.
    pub fn check_reads(&self, h: &History) -> Vec<Violation> {
        let mut out = Vec::new();
        for op in &h.ops {
            if let (OpKind::Read { obj, first, values }, Outcome::Ok) = (&op.kind, &op.outcome) {
                for (k, v) in values.iter().enumerate() {
                    out.extend(self.check(*obj, first + k, *v, op.invoke, op.end));
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::history::Op;

    fn op(kind: OpKind, invoke: Micros, end: Micros, ok: bool) -> Op {
        Op {
            client: 0,
            kind,
            invoke,
            end,
            outcome: if ok {
                Outcome::Ok
            } else {
                Outcome::Failed("timeout".into())
            },
        }
    }

    fn write(id: u64, invoke: Micros, end: Micros, ok: bool) -> Op {
        op(
            OpKind::Write {
                obj: 0,
                block: 0,
                id,
            },
            invoke,
            end,
            ok,
        )
    }

    fn kind(m: &Model, got: BlockValue, t0: Micros, t1: Micros) -> Option<Kind> {
        m.check(0, 0, got, t0, t1).map(|v| v.kind)
    }

    #[test]
    fn a_read_returns_the_last_acknowledged_write_or_a_concurrent_one() {
        let h = History {
            ops: vec![
                write(1, 10, 20, true),
                write(2, 30, 40, true),
                write(3, 35, 60, true),
            ],
            ..Default::default()
        };
        let m = Model::new(&h, 1, 1);
        assert_eq!(
            kind(&m, BlockValue::Zero, 5, 25),
            None,
            "concurrent with write 1"
        );
        assert_eq!(kind(&m, BlockValue::Zero, 25, 26), Some(Kind::Lost));
        assert_eq!(kind(&m, BlockValue::Write(1), 25, 26), None);
        assert_eq!(kind(&m, BlockValue::Write(1), 45, 50), Some(Kind::Reverted));
        // 2 and 3 overlap: either may be last.
        assert_eq!(kind(&m, BlockValue::Write(2), 70, 71), None);
        assert_eq!(kind(&m, BlockValue::Write(3), 70, 71), None);
        assert_eq!(
            kind(&m, BlockValue::Write(3), 20, 25),
            Some(Kind::Foreign),
            "not begun"
        );
        assert_eq!(kind(&m, BlockValue::Write(9), 70, 71), Some(Kind::Foreign));
        assert_eq!(kind(&m, BlockValue::Garbage, 70, 71), Some(Kind::Garbage));
    }

    #[test]
    fn a_crash_lets_unflushed_writes_go_but_not_flushed_ones() {
        let flush = |i, e| op(OpKind::Flush, i, e, true);
        let h = History {
            ops: vec![
                write(1, 10, 20, true),
                flush(25, 30),
                write(2, 40, 50, true),
            ],
            crashes: vec![60],
            ..Default::default()
        };
        let m = Model::new(&h, 1, 1);
        assert_eq!(kind(&m, BlockValue::Write(1), 55, 56), Some(Kind::Reverted));
        assert_eq!(
            kind(&m, BlockValue::Write(1), 70, 71),
            None,
            "2 was never flushed"
        );
        assert_eq!(
            kind(&m, BlockValue::Zero, 70, 71),
            Some(Kind::Lost),
            "1 was flushed"
        );
        let h2 = History {
            ops: vec![
                write(1, 10, 20, true),
                write(2, 40, 50, true),
                flush(52, 55),
            ],
            crashes: vec![60],
            ..Default::default()
        };
        // A crash while the read is in flight may lose the unflushed write 2 before the read
        // takes effect.
        assert_eq!(kind(&m, BlockValue::Write(1), 55, 65), None);
        let m2 = Model::new(&h2, 1, 1);
        assert_eq!(
            kind(&m2, BlockValue::Write(1), 70, 71),
            Some(Kind::Reverted)
        );
    }

    #[test]
    fn a_cow_target_reads_as_its_source_then_with_its_own_writes() {
        let t = crate::workload::target(0);
        let cow = |id, block, invoke, end, ok| {
            op(
                OpKind::Cow {
                    obj: t,
                    source: 0,
                    block,
                    id,
                },
                invoke,
                end,
                ok,
            )
        };
        let twrite =
            |id, block, invoke, end| op(OpKind::Write { obj: t, block, id }, invoke, end, true);
        let h = History {
            ops: vec![
                write(1, 10, 20, true),
                cow(2, 1, 30, 40, true),
                twrite(3, 0, 50, 60),
            ],
            ..Default::default()
        };
        let m = Model::new(&h, 1, 2);
        let k = |block, got, t0, t1| m.check(t, block, got, t0, t1).map(|v| v.kind);
        // Block 0 of the target: the source's write 1 once the COW is acknowledged, then 3.
        assert_eq!(k(0, BlockValue::Write(1), 45, 46), None);
        assert_eq!(k(0, BlockValue::Zero, 45, 46), Some(Kind::Lost));
        assert_eq!(
            k(0, BlockValue::Zero, 25, 35),
            None,
            "the COW had not returned"
        );
        assert_eq!(k(0, BlockValue::Write(3), 70, 71), None);
        assert_eq!(k(0, BlockValue::Write(1), 70, 71), Some(Kind::Reverted));
        // Block 1: the COW's own write.
        assert_eq!(k(1, BlockValue::Write(2), 45, 46), None);
        assert_eq!(k(1, BlockValue::Zero, 45, 46), Some(Kind::Lost));
        // A value the source never held at COW time.
        let h2 = History {
            ops: vec![
                write(1, 10, 20, true),
                write(4, 22, 28, true),
                cow(2, 1, 30, 40, true),
                write(5, 50, 60, false),
            ],
            ..Default::default()
        };
        let m2 = Model::new(&h2, 1, 2);
        assert_eq!(
            m2.check(t, 0, BlockValue::Write(1), 45, 46).map(|v| v.kind),
            Some(Kind::BadCopy),
            "write 4 superseded 1 before the COW"
        );
        assert_eq!(
            m2.check(t, 0, BlockValue::Write(5), 70, 71).map(|v| v.kind),
            Some(Kind::BadCopy),
            "write 5 began after the COW returned"
        );
        // The source is never changed by a COW.
        assert_eq!(
            m2.check(0, 1, BlockValue::Write(2), 45, 46).map(|v| v.kind),
            Some(Kind::Foreign)
        );
        // A COW that failed but landed made the target: the next COW is a plain write of its
        // block and leaves the first one's data be.
        let h3 = History {
            ops: vec![
                write(1, 10, 20, true),
                cow(2, 1, 30, 40, false),
                cow(6, 0, 50, 60, true),
            ],
            ..Default::default()
        };
        let m3 = Model::new(&h3, 1, 2);
        assert_eq!(m3.check(t, 1, BlockValue::Write(2), 70, 71), None);
        assert_eq!(m3.check(t, 0, BlockValue::Write(6), 70, 71), None);
    }

    #[test]
    fn failed_writes_and_removes() {
        let h = History {
            ops: vec![
                write(1, 10, 20, false),
                write(2, 30, 40, true),
                op(OpKind::Remove { obj: 0, id: 3 }, 50, 60, true),
            ],
            ..Default::default()
        };
        let m = Model::new(&h, 1, 1);
        assert_eq!(
            kind(&m, BlockValue::Write(1), 25, 26),
            None,
            "may have taken effect"
        );
        assert_eq!(kind(&m, BlockValue::Zero, 25, 26), None, "or not");
        assert_eq!(
            kind(&m, BlockValue::Write(1), 45, 46),
            Some(Kind::LateFailedWrite)
        );
        assert_eq!(
            kind(&m, BlockValue::Write(2), 70, 71),
            Some(Kind::Resurrected)
        );
        assert_eq!(kind(&m, BlockValue::Zero, 70, 71), None);
    }

    #[test]
    fn a_vdi_write_is_durable_only_by_a_flush_of_its_client() {
        let obj = crate::workload::vdi::register_obj(0, 1);
        let vdi_op = |client, kind, invoke, end| Op {
            client,
            kind,
            invoke,
            end,
            outcome: Outcome::Ok,
        };
        let w = |id, invoke, end| vdi_op(3, OpKind::Write { obj, block: 0, id }, invoke, end);
        let h = History {
            ops: vec![
                w(1, 10, 20),
                // Another client's flush: it syncs the nodes, not the map entry client 3 holds.
                vdi_op(0, OpKind::Flush, 25, 30),
                w(2, 40, 50),
                vdi_op(3, OpKind::Flush, 55, 60),
            ],
            crashes: vec![35, 65],
            ..Default::default()
        };
        let m = Model::with_registers(&h, [(obj, 0)]);
        let k = |got, t0, t1| m.check(obj, 0, got, t0, t1).map(|v| v.kind);
        assert_eq!(k(BlockValue::Zero, 36, 37), None, "write 1 was not flushed");
        assert_eq!(k(BlockValue::Zero, 70, 71), Some(Kind::Lost), "write 2 was");
        assert_eq!(k(BlockValue::Write(1), 70, 71), Some(Kind::Reverted));
        // A read of a hole returns at the instant it began, as the discard that made it.
        let h2 = History {
            ops: vec![
                w(1, 10, 20),
                vdi_op(3, OpKind::Remove { obj, id: 2 }, 30, 40),
            ],
            ..Default::default()
        };
        let m2 = Model::with_registers(&h2, [(obj, 0)]);
        assert_eq!(m2.check(obj, 0, BlockValue::Zero, 30, 30), None);
        assert_eq!(
            m2.check(obj, 0, BlockValue::Zero, 29, 29).map(|v| v.kind),
            Some(Kind::Lost)
        );
    }
}
