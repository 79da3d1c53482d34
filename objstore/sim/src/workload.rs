//! The clients: each runs a seeded sequence of operations on a few objects, one at a time with
//! random pauses, and records each one's invocation, completion and result.
//!
//! Operations: a write of one tagged 4 KiB block (see [`crate::history::block_pattern`]) at a
//! block-aligned offset, a read of a run of blocks, a remove of a whole object, a flush, and a
//! copy-on-write.
//!
//! Copy-on-write (issue 26): object `o` (VDI 1) has a COW target [`target`]`(o)` (the same
//! index in VDI 2). A client first *freezes* one of its objects that it last wrote (never
//! writes or removes it again, as a snapshot's objects are never written again; it keeps at
//! least one object to write), then makes the target with `cow_write_obj` (the source's bytes
//! with one tagged block written). Once a COW is acknowledged the client writes the target
//! with plain writes, as a VDI does once its map names its own object; until then it retries
//! COWs. Targets are never removed. Without `shared_objects` only (with two writers a source
//! would not stay frozen).
//!
//! Beside these clients, [`vdi`] clients go through a VDI handle, as sheepfs and `dog vdi`
//! do: many requests in flight on one handle, writes of several blocks across object
//! boundaries, first writes into new objects racing each other and reads, refreshes of the
//! handle, whole-object discards. Their blocks are registers of their own (object numbers
//! from [`vdi::REGISTERS`] on), checked by the same rules.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::Rng;
use tokio::time::Instant;

use objstore_client::{Client, ClientError};
use objstore_proto::oid::{ObjIndex, ObjectId, Vid};
use objstore_proto::redundancy::Redundancy;

use crate::history::{
    block_pattern, decode_block, BlockValue, History, Micros, Op, OpKind, Outcome, BLOCK,
};
use crate::Config;

pub mod vdi;

/// The cluster's object size (`dog cluster format`): 1 MiB.
pub const OBJECT_SIZE: usize = 1 << 20;

/// Object numbers from here on are COW targets: `TARGETS + o` is the target of object `o`.
pub const TARGETS: usize = 1000;

/// The COW target of object `obj` (see the module documentation).
pub fn target(obj: usize) -> usize {
    TARGETS + obj
}

/// The object a COW target `obj` is copied from, if `obj` is a target.
pub fn source_of(obj: usize) -> Option<usize> {
    obj.checked_sub(TARGETS)
}

/// Every object a run with `objects` objects may touch: the objects, then their targets.
pub fn all_objects(objects: usize) -> Vec<usize> {
    (0..objects).chain((0..objects).map(target)).collect()
}

/// The data object the simulator calls `obj`: object `o` of VDI 1, or for a COW target, the
/// same index in VDI 2; for a VDI client's register object ([`vdi::of`]), that index of its
/// VDI. (VDI ids 1 and 2 are never made VDIs: the VDI clients' come from
/// [`vdi::FIRST_VID`] on.)
pub fn oid(obj: usize) -> ObjectId {
    if let Some((c, index)) = vdi::of(obj) {
        return ObjectId::data(vdi::vid(c), ObjIndex(index as u32));
    }
    match source_of(obj) {
        Some(o) => ObjectId::data(Vid(2), ObjIndex(o as u32)),
        None => ObjectId::data(Vid(1), ObjIndex(obj as u32)),
    }
}

/// The erasure code object `obj` is kept with: the run's, for the object clients' own objects
/// (not COW targets, not the VDI clients' registers).
pub fn ec_of(ec: Option<Redundancy>, obj: usize) -> Option<Redundancy> {
    ec.filter(|_| obj < TARGETS && vdi::of(obj).is_none())
}

/// Every register (object, block) of a run: the blocks the object clients use of every
/// object and COW target, then the VDI clients' ([`vdi::registers`]).
pub fn registers(cfg: &Config) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = all_objects(cfg.objects)
        .into_iter()
        .flat_map(|o| (0..cfg.blocks).map(move |b| (o, b)))
        .collect();
    for c in 0..cfg.vdi_clients {
        out.extend(vdi::registers(cfg, c));
    }
    out
}

/// What the clients, the nemesis and the final check share.
pub struct Shared {
    pub start: Instant,
    pub history: Mutex<History>,
    next_id: AtomicU64,
}

impl Shared {
    pub fn new() -> Shared {
        Shared {
            start: Instant::now(),
            history: Mutex::default(),
            next_id: AtomicU64::new(1),
        }
    }

    pub fn now(&self) -> Micros {
        self.start.elapsed().as_micros() as Micros
    }

    /// A new, unique write tag.
    pub fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    pub fn event(&self, what: String) {
        let at = self.now();
        self.history
            .lock()
            .unwrap()
            .events
            .push(crate::history::Event { at, what });
    }
}

impl Default for Shared {
    fn default() -> Self {
        Shared::new()
    }
}

fn outcome<T>(r: &Result<T, ClientError>) -> Outcome {
    match r {
        Ok(_) => Outcome::Ok,
        Err(e) => Outcome::Failed(e.to_string()),
    }
}

/// Reads `n` blocks of `obj` from `first`: their values, or the client's error. An object no
/// replica holds reads as zeros.
pub async fn read_blocks(
    client: &Client,
    ec: Option<Redundancy>,
    obj: usize,
    first: usize,
    n: usize,
) -> Result<Vec<BlockValue>, ClientError> {
    let (at, len) = ((first * BLOCK) as u64, (n * BLOCK) as u32);
    let read = match ec_of(ec, obj) {
        Some(r) => client.ec_read_obj(oid(obj), r, at, len).await,
        None => client.read_obj(oid(obj), at, len).await,
    };
    match read {
        Ok(b) => Ok(b.chunks(BLOCK).map(decode_block).collect()),
        Err(ClientError::NotFound(_)) => Ok(vec![BlockValue::Zero; n]),
        Err(e) => Err(e),
    }
}

/// One client's run of `cfg.ops_per_client` operations.
pub async fn run_client(
    idx: usize,
    client: Arc<Client>,
    mut rng: StdRng,
    cfg: Config,
    shared: Arc<Shared>,
) {
    let mine: Vec<usize> = (0..cfg.objects)
        .filter(|o| cfg.shared_objects || o % cfg.clients == idx)
        .collect();
    // Copy-on-write state (see the module documentation): objects whose last change this
    // client saw acknowledged was a write, objects frozen as COW sources, and sources whose
    // target a COW made.
    let mut written = BTreeSet::new();
    let mut frozen = BTreeSet::new();
    let mut created = BTreeSet::new();
    let all = all_objects(cfg.objects);
    for _ in 0..cfg.ops_per_client {
        let pause = rng.gen_range(0..=cfg.think.as_micros() as u64);
        tokio::time::sleep(Duration::from_micros(pause)).await;
        let roll = rng.gen_range(0..100);
        let invoke = shared.now();
        let unfrozen: Vec<usize> = mine
            .iter()
            .copied()
            .filter(|o| !frozen.contains(o))
            .collect();
        // Sources a COW may copy: frozen ones not copied yet, or one more written object.
        let cow_sources: Vec<usize> = mine
            .iter()
            .copied()
            .filter(|o| {
                !created.contains(o)
                    && (frozen.contains(o) || (written.contains(o) && unfrozen.len() > 1))
            })
            .collect();
        let cow = (82..90).contains(&roll)
            && !cfg.shared_objects
            && cfg.ec.is_none()
            && !cow_sources.is_empty();
        let (kind, result) = if roll < 42 {
            let writable: Vec<usize> = unfrozen
                .iter()
                .copied()
                .chain(created.iter().map(|&o| target(o)))
                .collect();
            let obj = writable[rng.gen_range(0..writable.len())];
            let block = rng.gen_range(0..cfg.blocks);
            let id = shared.next_id();
            let data = Bytes::from(block_pattern(id));
            let r = client
                .write_data(oid(obj), ec_of(cfg.ec, obj), (block * BLOCK) as u64, data)
                .await;
            if r.is_ok() && obj < TARGETS {
                written.insert(obj);
            }
            (OpKind::Write { obj, block, id }, outcome(&r))
        } else if roll < 77 {
            let obj = all[rng.gen_range(0..all.len())];
            let first = rng.gen_range(0..cfg.blocks);
            let n = rng.gen_range(1..=cfg.blocks - first);
            let r = read_blocks(&client, cfg.ec, obj, first, n).await;
            let o = outcome(&r);
            let values = r.unwrap_or_default();
            (OpKind::Read { obj, first, values }, o)
        } else if roll < 82 {
            let obj = unfrozen[rng.gen_range(0..unfrozen.len())];
            let id = shared.next_id();
            written.remove(&obj);
            let r = client.remove_data(oid(obj), ec_of(cfg.ec, obj)).await;
            (OpKind::Remove { obj, id }, outcome(&r))
        } else if cow {
            let source = cow_sources[rng.gen_range(0..cow_sources.len())];
            frozen.insert(source);
            let obj = target(source);
            let block = rng.gen_range(0..cfg.blocks);
            let id = shared.next_id();
            let r = client
                .cow_write_obj(
                    oid(obj),
                    oid(source),
                    (block * BLOCK) as u64,
                    Bytes::from(block_pattern(id)),
                )
                .await;
            if r.is_ok() {
                created.insert(source);
            }
            (
                OpKind::Cow {
                    obj,
                    source,
                    block,
                    id,
                },
                outcome(&r),
            )
        } else {
            let r = client.flush().await;
            (OpKind::Flush, outcome(&r))
        };
        let end = shared.now();
        shared.history.lock().unwrap().ops.push(Op {
            client: idx,
            kind,
            invoke,
            end,
            outcome: result,
        });
    }
}
