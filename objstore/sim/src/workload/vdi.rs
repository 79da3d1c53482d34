//! The VDI clients (issue 41): each goes through one [`Vdi`] handle of a VDI of its own, as
//! sheepfs does with an open file, so the handle's allocation map, its first writes into new
//! objects and its grouped map entries (written to the inode by a background task, see
//! `objstore_client::vdi`) are under test, not only the objects.
//!
//! A VDI client has `vdi_depth` tasks sharing its handle (requests in flight, like fio's
//! iodepth), which run `vdi_ops` operations between them, each after a random pause (up to
//! twice the object clients' longest; none a quarter of the time, so requests also come back
//! to back):
//! - a write of 1 to 3 tagged 4 KiB blocks ([`crate::history::block_pattern`], one tag per
//!   block), contiguous, within a *window* ([`windows`]): the [`EDGE`] last blocks of object 0
//!   and the [`EDGE`] first of object 1, so that some writes span two new objects, or the
//!   first blocks of a further object; the first writes into a new object race each other and
//!   reads of it; a third of the writes are read back at once;
//! - with `Config::ec_vdis`, a burst: 2 to 4 such writes of adjacent runs, all in flight at
//!   once (a sequential writer with several requests in flight), which an erasure-coded VDI's
//!   client sends as one change;
//! - a read of a run of blocks of a window (across the boundary or not);
//! - a flush ([`Vdi::flush`]: writes the map entries held, then flushes every node);
//! - a discard of one whole object: it is unmapped (the map entry written at once) and
//!   removed, so its next write is a first write again (these found the leftover objects of
//!   failed changes that 9a5c040 fixed: see `tests/regressions.rs`).
//!
//! Beside them an *opener* opens the VDI again and refreshes the shared handle
//! ([`Vdi::refresh`]) every few milliseconds while the tasks run, at most `vdi_ops / 2` times
//! (tasks stuck behind faults would otherwise make refreshes most of a run's operations): what
//! sheepfs does at every further open of a file already open (fio reopens its file while other
//! jobs write). A refresh that read the inode before the entries of acknowledged first writes
//! were in it would make those blocks read as holes (zeros), which the checker sees as
//! [`Kind::Lost`] (the bug of issue 41, fixed in 4c84700: see `tests/regressions.rs`).
//!
//! Each block is a register: object number [`register_obj`]`(client, index)` (from
//! [`REGISTERS`] on), block number within the object. A write of `n` blocks is `n`
//! [`OpKind::Write`]s with the same times and outcome, a read one [`OpKind::Read`] per object
//! it touches, a discard an [`OpKind::Remove`] of the object's register object. A VDI write
//! is durable only once a flush *through its client* returned (the map entry is held in that
//! client until then), so the checker counts only those flushes for it.
//!
//! [`Kind::Lost`]: crate::Kind::Lost

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use objstore_client::vdi::{Vdi, VdiError};
use objstore_client::Client;
use objstore_proto::oid::Vid;

use super::{Shared, OBJECT_SIZE};
use crate::history::{block_pattern, decode_block, BlockValue, Op, OpKind, Outcome, BLOCK};
use crate::Config;

/// Register object numbers from here on are the VDI clients' (see the module documentation).
pub const REGISTERS: usize = 2000;
/// Most objects of one VDI client's VDI.
pub const MAX_OBJECTS: usize = 64;
/// The VDI id of VDI client 0's VDI; client `c`'s is this plus `c`. The run sets the VDI id
/// counter to it before making the VDIs: ids 1 and 2 are the object clients'.
pub const FIRST_VID: u32 = 16;
/// Blocks used on each side of the boundary between objects 0 and 1 (and twice as many at
/// the start of every further object).
pub const EDGE: usize = 4;
/// Blocks of one object.
pub const BLOCKS_PER_OBJECT: usize = OBJECT_SIZE / BLOCK;
/// Most blocks of one write.
const MAX_WRITE: usize = 3;

/// The name of VDI client `c`'s VDI.
pub fn name(c: usize) -> String {
    format!("sim-vdi{c}")
}

/// The VDI id of VDI client `c`'s VDI.
pub fn vid(c: usize) -> Vid {
    Vid(FIRST_VID + c as u32)
}

/// The size of each VDI client's VDI.
pub fn size(cfg: &Config) -> u64 {
    (cfg.vdi_objects * OBJECT_SIZE) as u64
}

/// The client number VDI client `c` has in the history (after the object clients).
pub fn history_client(cfg: &Config, c: usize) -> usize {
    cfg.clients + c
}

/// The register object of object `index` of VDI client `c`'s VDI.
pub fn register_obj(c: usize, index: usize) -> usize {
    assert!(index < MAX_OBJECTS, "VDI object {index} of {MAX_OBJECTS}");
    REGISTERS + c * MAX_OBJECTS + index
}

/// (VDI client, object index) of a VDI register object.
pub fn of(obj: usize) -> Option<(usize, usize)> {
    let r = obj.checked_sub(REGISTERS)?;
    Some((r / MAX_OBJECTS, r % MAX_OBJECTS))
}

/// The windows, as runs of the VDI's blocks: the [`EDGE`] blocks on each side of the
/// boundary between objects 0 and 1, then the first `2 * EDGE` blocks of every further object.
/// One boundary only: an object written near its end takes its whole size (1 MiB) in the
/// nodes' memory stores, and making, copying and checksumming those was most of what the VDI
/// clients cost in a debug build when every boundary had its window.
pub fn windows(cfg: &Config) -> Vec<Range<usize>> {
    let b = BLOCKS_PER_OBJECT;
    std::iter::once(b - EDGE..b + EDGE)
        .chain((2..cfg.vdi_objects).map(|k| k * b..k * b + 2 * EDGE))
        .collect()
}

/// The registers of VDI client `c`: every block of its windows.
pub fn registers(cfg: &Config, c: usize) -> Vec<(usize, usize)> {
    windows(cfg)
        .into_iter()
        .flatten()
        .map(|b| {
            (
                register_obj(c, b / BLOCKS_PER_OBJECT),
                b % BLOCKS_PER_OBJECT,
            )
        })
        .collect()
}

/// The reads of the history that blocks `first..first + values.len()` of VDI client `c`'s VDI
/// make: one per object, as (register object, first block in it, values).
pub fn split(
    c: usize,
    first: usize,
    values: &[BlockValue],
) -> Vec<(usize, usize, Vec<BlockValue>)> {
    let mut out: Vec<(usize, usize, Vec<BlockValue>)> = Vec::new();
    for (k, v) in values.iter().enumerate() {
        let b = first + k;
        let (obj, block) = (
            register_obj(c, b / BLOCKS_PER_OBJECT),
            b % BLOCKS_PER_OBJECT,
        );
        match out.last_mut() {
            Some((o, _, vs)) if *o == obj => vs.push(*v),
            _ => out.push((obj, block, vec![*v])),
        }
    }
    out
}

/// Reads `n` blocks of `v` from block `first`: their values.
pub async fn read_blocks(v: &Vdi, first: usize, n: usize) -> Result<Vec<BlockValue>, VdiError> {
    let b = v
        .read_at((first * BLOCK) as u64, (n * BLOCK) as u64)
        .await?;
    Ok(b.chunks(BLOCK).map(decode_block).collect())
}

fn outcome<T>(r: &Result<T, VdiError>) -> Outcome {
    match r {
        Ok(_) => Outcome::Ok,
        Err(e) => Outcome::Failed(e.to_string()),
    }
}

/// What one task of a VDI client works with.
#[derive(Clone)]
struct Io {
    /// The VDI client's number among VDI clients, and in the history.
    c: usize,
    client: usize,
    v: Arc<Vdi>,
    cfg: Config,
    shared: Arc<Shared>,
    windows: Vec<Range<usize>>,
}

impl Io {
    fn push(&self, kinds: Vec<OpKind>, invoke: u64, outcome: Outcome) {
        let end = self.shared.now();
        let mut h = self.shared.history.lock().unwrap();
        for kind in kinds {
            h.ops.push(Op {
                client: self.client,
                kind,
                invoke,
                end,
                outcome: outcome.clone(),
            });
        }
    }

    async fn read(&self, first: usize, n: usize) {
        let invoke = self.shared.now();
        let r = read_blocks(&self.v, first, n).await;
        let o = outcome(&r);
        let kinds = match r {
            Ok(values) => split(self.c, first, &values)
                .into_iter()
                .map(|(obj, first, values)| OpKind::Read { obj, first, values })
                .collect(),
            Err(_) => split(self.c, first, &vec![BlockValue::Zero; n])
                .into_iter()
                .map(|(obj, first, _)| OpKind::Read {
                    obj,
                    first,
                    values: Vec::new(),
                })
                .collect(),
        };
        self.push(kinds, invoke, o);
    }

    /// Writes `n` blocks from block `first`, each with a tag of its own; whether acknowledged.
    async fn write(&self, first: usize, n: usize) -> bool {
        let ids: Vec<u64> = (0..n).map(|_| self.shared.next_id()).collect();
        let data: Vec<u8> = ids.iter().flat_map(|&id| block_pattern(id)).collect();
        let invoke = self.shared.now();
        let r = self
            .v
            .write_at((first * BLOCK) as u64, Bytes::from(data))
            .await;
        let kinds = ids
            .iter()
            .enumerate()
            .map(|(k, &id)| OpKind::Write {
                obj: register_obj(self.c, (first + k) / BLOCKS_PER_OBJECT),
                block: (first + k) % BLOCKS_PER_OBJECT,
                id,
            })
            .collect();
        let ok = r.is_ok();
        self.push(kinds, invoke, outcome(&r));
        ok
    }

    /// A sequential writer's burst: 2 to 4 writes of adjacent runs of blocks in one window,
    /// all in flight at once (as fio with iodepth > 1 or a guest's block layer sends them), so
    /// they wait together for the object's turn in the client and go as one change when the
    /// object is erasure-coded (`objstore_client`'s write batches).
    async fn burst(&self, rng: &mut StdRng) {
        let w = &self.windows[rng.gen_range(0..self.windows.len())];
        let mut at = rng.gen_range(w.start..w.end);
        let mut writes = Vec::new();
        for _ in 0..rng.gen_range(2..=4) {
            if at >= w.end {
                break;
            }
            let n = rng.gen_range(1..=MAX_WRITE.min(w.end - at));
            writes.push((at, n));
            at += n;
        }
        futures::future::join_all(writes.into_iter().map(|(first, n)| self.write(first, n))).await;
    }

    /// A run of blocks within a random window: (first, count), at most `most` blocks.
    fn run(&self, rng: &mut StdRng, most: usize) -> (usize, usize) {
        let w = &self.windows[rng.gen_range(0..self.windows.len())];
        let n = rng.gen_range(1..=most.min(w.len()));
        (rng.gen_range(w.start..=w.end - n), n)
    }

    async fn run_ops(self, ops: usize, mut rng: StdRng) {
        for _ in 0..ops {
            if !rng.gen_ratio(1, 4) {
                let pause = rng.gen_range(0..=2 * self.cfg.think.as_micros() as u64);
                tokio::time::sleep(Duration::from_micros(pause)).await;
            }
            let roll = rng.gen_range(0..100);
            if roll < 12 && self.cfg.ec_vdis {
                self.burst(&mut rng).await;
            } else if roll < 50 {
                let (first, n) = self.run(&mut rng, MAX_WRITE);
                if self.write(first, n).await && rng.gen_ratio(1, 3) {
                    self.read(first, n).await;
                }
            } else if roll < 80 {
                let (first, n) = self.run(&mut rng, 2 * EDGE);
                self.read(first, n).await;
            } else if roll < 88 {
                let invoke = self.shared.now();
                let r = self.v.flush().await;
                self.push(vec![OpKind::Flush], invoke, outcome(&r));
            } else {
                let index = rng.gen_range(0..self.cfg.vdi_objects);
                let id = self.shared.next_id();
                let invoke = self.shared.now();
                let r = self
                    .v
                    .discard((index * OBJECT_SIZE) as u64, OBJECT_SIZE as u64)
                    .await;
                let kind = OpKind::Remove {
                    obj: register_obj(self.c, index),
                    id,
                };
                self.push(vec![kind], invoke, outcome(&r));
            }
        }
    }
}

/// Opens VDI client `c`'s VDI again and refreshes the shared handle, every few milliseconds,
/// until `done` or `vdi_ops / 2` times.
async fn opener(io: Io, client: Arc<Client>, done: Arc<AtomicBool>, mut rng: StdRng) {
    let most = io.cfg.think.as_micros() as u64 / 8;
    for _ in 0..io.cfg.vdi_ops / 2 {
        if done.load(Ordering::Relaxed) {
            return;
        }
        tokio::time::sleep(Duration::from_micros(rng.gen_range(0..=most))).await;
        let invoke = io.shared.now();
        let r = match Vdi::open(client.clone(), &name(io.c)).await {
            Ok(_fresh) => io.v.refresh().await,
            Err(e) => Err(e),
        };
        io.push(vec![OpKind::Refresh], invoke, outcome(&r));
    }
}

/// VDI client `c`'s run: `cfg.vdi_ops` operations from `cfg.vdi_depth` tasks on handle `v` of
/// its VDI (opened through `client`), and the opener beside them.
pub async fn run_client(
    c: usize,
    client: Arc<Client>,
    v: Arc<Vdi>,
    mut rng: StdRng,
    cfg: Config,
    shared: Arc<Shared>,
) {
    let io = Io {
        c,
        client: history_client(&cfg, c),
        v,
        cfg,
        shared,
        windows: windows(&cfg),
    };
    let depth = cfg.vdi_depth.max(1);
    let tasks: Vec<_> = (0..depth)
        .map(|t| {
            let ops = cfg.vdi_ops / depth + usize::from(t < cfg.vdi_ops % depth);
            let rng = StdRng::seed_from_u64(rng.gen());
            tokio::spawn(io.clone().run_ops(ops, rng))
        })
        .collect();
    let done = Arc::new(AtomicBool::new(false));
    let opener = tokio::spawn(opener(
        io,
        client,
        done.clone(),
        StdRng::seed_from_u64(rng.gen()),
    ));
    for t in tasks {
        // A task that panicked is a bug of the simulator: let the test fail loudly.
        if let Err(e) = t.await {
            std::panic::resume_unwind(e.into_panic());
        }
    }
    done.store(true, Ordering::Relaxed);
    if let Err(e) = opener.await {
        std::panic::resume_unwind(e.into_panic());
    }
}
