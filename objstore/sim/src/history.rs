//! What happened, as the checker sees it: client operations with their invocation and
//! completion times (simulated microseconds since the start), node crashes, and every fault.

use std::hash::{DefaultHasher, Hash, Hasher};

/// Simulated time in microseconds since the run started.
pub type Micros = u64;

/// The unique tag of a write: every byte of a block it writes comes from it (see
/// [`block_pattern`]). 0 is never used: zeros are the value of holes and removed objects.
pub type WriteId = u64;

/// What a 4 KiB block read back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BlockValue {
    Zero,
    Write(WriteId),
    /// Neither zeros nor one write's pattern: torn, mixed or foreign bytes.
    Garbage,
}

pub const BLOCK: usize = 4096;

/// The bytes write `id` puts in a block: its id, little endian, repeated.
pub fn block_pattern(id: WriteId) -> Vec<u8> {
    id.to_le_bytes().repeat(BLOCK / 8)
}

/// What a block's bytes say.
pub fn decode_block(b: &[u8]) -> BlockValue {
    if b.iter().all(|&x| x == 0) {
        return BlockValue::Zero;
    }
    let id = u64::from_le_bytes(b[..8].try_into().expect("8 bytes"));
    if id != 0 && b.len() == BLOCK && b.chunks_exact(8).all(|c| c == &b[..8]) {
        BlockValue::Write(id)
    } else {
        BlockValue::Garbage
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum OpKind {
    /// One block of one object.
    Write {
        obj: usize,
        block: usize,
        id: WriteId,
    },
    /// Every block of one object becomes zeros; `id` tags the removal.
    Remove {
        obj: usize,
        id: WriteId,
    },
    /// A copy-on-write: COW target `obj` is made from object `source` (its bytes at the
    /// time) with block `block` written with tag `id`; on a target that exists, a plain write
    /// of that block.
    Cow {
        obj: usize,
        source: usize,
        block: usize,
        id: WriteId,
    },
    /// `values[k]` is block `first + k` of `obj` (empty until the read returns).
    Read {
        obj: usize,
        first: usize,
        values: Vec<BlockValue>,
    },
    Flush,
    /// A VDI client opened its VDI again and refreshed its handle (see
    /// [`crate::workload::vdi`]): in the trace, nothing for the checker.
    Refresh,
}

/// How an operation ended.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Outcome {
    Ok,
    /// The client returned an error (its text).
    Failed(String),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Op {
    pub client: usize,
    pub kind: OpKind,
    pub invoke: Micros,
    pub end: Micros,
    pub outcome: Outcome,
}

/// A fault or repair the nemesis applied (also the quiesce at the end), for the trace.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Event {
    pub at: Micros,
    pub what: String,
}

#[derive(Debug, Default, Clone)]
pub struct History {
    pub ops: Vec<Op>,
    /// Times of node crashes.
    pub crashes: Vec<Micros>,
    pub events: Vec<Event>,
}

impl History {
    /// A hash of everything that happened, to check that a seed replays exactly.
    pub fn trace_hash(&self) -> u64 {
        let mut h = DefaultHasher::new();
        self.ops.hash(&mut h);
        self.crashes.hash(&mut h);
        self.events.hash(&mut h);
        h.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_decode_as_zero_one_write_or_garbage() {
        assert_eq!(decode_block(&[0; BLOCK]), BlockValue::Zero);
        assert_eq!(decode_block(&block_pattern(42)), BlockValue::Write(42));
        let mut mixed = block_pattern(42);
        mixed[BLOCK - 8..].copy_from_slice(&block_pattern(43)[..8]);
        assert_eq!(decode_block(&mixed), BlockValue::Garbage);
        let mut half = block_pattern(7);
        half[..BLOCK / 2].fill(0);
        assert_eq!(decode_block(&half), BlockValue::Garbage);
    }
}
