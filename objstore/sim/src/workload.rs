//! The clients: each runs a seeded sequence of operations on a few objects, one at a time with
//! random pauses, and records each one's invocation, completion and result.
//!
//! Operations: a write of one tagged 4 KiB block (see [`crate::history::block_pattern`]) at a
//! block-aligned offset, a read of a run of blocks, a remove of a whole object, a flush.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::Rng;
use tokio::time::Instant;

use objstore_client::{Client, ClientError};
use objstore_proto::oid::{ObjIndex, ObjectId, Vid};

use crate::history::{
    block_pattern, decode_block, BlockValue, History, Micros, Op, OpKind, Outcome, BLOCK,
};
use crate::Config;

/// The data object the simulator calls `obj`.
pub fn oid(obj: usize) -> ObjectId {
    ObjectId::data(Vid(1), ObjIndex(obj as u32))
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
    obj: usize,
    first: usize,
    n: usize,
) -> Result<Vec<BlockValue>, ClientError> {
    match client
        .read_obj(oid(obj), (first * BLOCK) as u64, (n * BLOCK) as u32)
        .await
    {
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
    for _ in 0..cfg.ops_per_client {
        let pause = rng.gen_range(0..=cfg.think.as_micros() as u64);
        tokio::time::sleep(Duration::from_micros(pause)).await;
        let roll = rng.gen_range(0..100);
        let invoke = shared.now();
        let (kind, result) = if roll < 45 {
            let obj = mine[rng.gen_range(0..mine.len())];
            let block = rng.gen_range(0..cfg.blocks);
            let id = shared.next_id();
            let r = client
                .write_obj(
                    oid(obj),
                    (block * BLOCK) as u64,
                    Bytes::from(block_pattern(id)),
                )
                .await;
            (OpKind::Write { obj, block, id }, outcome(&r))
        } else if roll < 80 {
            let obj = rng.gen_range(0..cfg.objects);
            let first = rng.gen_range(0..cfg.blocks);
            let n = rng.gen_range(1..=cfg.blocks - first);
            let r = read_blocks(&client, obj, first, n).await;
            let o = outcome(&r);
            let values = r.unwrap_or_default();
            (OpKind::Read { obj, first, values }, o)
        } else if roll < 85 {
            let obj = mine[rng.gen_range(0..mine.len())];
            let id = shared.next_id();
            let r = client.remove_obj(oid(obj)).await;
            (OpKind::Remove { obj, id }, outcome(&r))
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
