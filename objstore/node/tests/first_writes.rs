//! Issue 41: once a write through a VDI handle is acknowledged, every later read returns it,
//! also right after first writes into new objects, with many requests in flight on one handle
//! and the handle refreshed meanwhile (sheepfs refreshes the shared handle at every further
//! open of the file: fio reopens it when each job ends its writes, while other jobs write).
//!
//! The shape of `fio --rw=randrw --numjobs=16 --iodepth=8 --verify=crc32c --verify_backlog`
//! on a fresh VDI, in process (`MemCluster`, no FUSE): writers each own a slice of a fresh
//! VDI, write every extent of it once (4 KiB to 256 KiB, crossing object boundaries) with
//! several writes in flight, and read each extent back as soon as its write is acknowledged;
//! beside them, an opener opens the VDI again and refreshes the shared handle, and a flusher
//! flushes. At the end every extent is read once more. Hundreds of rounds in seconds.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

use objstore_client::transport::Delay;
use objstore_client::vdi::{self, Vdi};
use objstore_client::{Client, ClientOptions};
use objstore_node::testing::MemCluster;

const MIB: u64 = 1 << 20;
const BLOCK: u64 = 4096;

/// The bytes extent (`round`, `offset`) holds: a tag per 8 bytes, never zeros.
fn pattern(round: u64, offset: u64, len: u64) -> Bytes {
    let mut out = Vec::with_capacity(len as usize);
    for at in (offset..offset + len).step_by(8) {
        let tag = (round << 40) ^ at ^ 0x5a5a_0000_0000_0001;
        out.extend_from_slice(&tag.to_le_bytes());
    }
    Bytes::from(out)
}

/// What a read of an extent found, for the failure message.
fn describe(got: &[u8], want: &[u8]) -> String {
    let first_bad = got
        .chunks(BLOCK as usize)
        .zip(want.chunks(BLOCK as usize))
        .position(|(g, w)| g != w)
        .unwrap_or(0);
    let block = &got[first_bad * BLOCK as usize..];
    let zeros = block.iter().take(BLOCK as usize).all(|&b| b == 0);
    format!(
        "block {first_bad} of the extent is {}",
        if zeros { "zeros" } else { "other bytes" }
    )
}

/// `count` extents of `[start, start + len)`, one in each of `count` equal cells, 4 KiB to
/// half a cell long at a random block of it; shuffled.
fn extents(rng: &mut StdRng, start: u64, len: u64, count: u64) -> Vec<(u64, u64)> {
    let cell = len / count;
    let mut out: Vec<(u64, u64)> = (0..count)
        .map(|c| {
            let n = rng.gen_range(1..=cell / 2 / BLOCK) * BLOCK;
            let at = rng.gen_range(0..=(cell - n) / BLOCK) * BLOCK;
            (start + c * cell + at, n)
        })
        .collect();
    out.shuffle(rng);
    out
}

struct Shape {
    writers: usize,
    /// Writes in flight per writer: its extents are dealt among this many streams.
    depth: usize,
    /// Bytes of the VDI each writer owns.
    slice: u64,
    /// Extents each writer writes in its slice.
    extents: u64,
    /// The VDI is written whole and snapshotted first: the writes are then first writes
    /// into objects shared with the snapshot (copy-on-writes), not into new objects.
    cow: bool,
}

/// One round on a fresh VDI; the first wrong read, if any.
async fn round(client: Arc<Client>, round: u64, shape: &Shape, seed: u64) -> Result<(), String> {
    let name = format!("fresh{round}");
    // Slices start off an object's start, so that some writes cross object boundaries.
    let skew = MIB / 2 + 64 * 1024;
    let size = shape.slice * shape.writers as u64 + MIB;
    vdi::create(&client, &name, size)
        .await
        .map_err(|e| e.to_string())?;
    if shape.cow {
        let base = Vdi::open(client.clone(), &name)
            .await
            .map_err(|e| e.to_string())?;
        for off in (0..size).step_by(MIB as usize) {
            base.write_at(off, pattern(!round, off, MIB))
                .await
                .map_err(|e| format!("base write {off}: {e}"))?;
        }
        base.flush().await.map_err(|e| e.to_string())?;
        vdi::snapshot(&client, &name, Some("base"), None)
            .await
            .map_err(|e| format!("snapshot: {e}"))?;
    }
    let v = Arc::new(
        Vdi::open(client.clone(), &name)
            .await
            .map_err(|e| e.to_string())?,
    );
    let mut rng = StdRng::seed_from_u64(seed);
    let writing = Arc::new(AtomicBool::new(true));
    let mut streams = Vec::new();
    let mut written = Vec::new();
    for w in 0..shape.writers {
        let start = skew + w as u64 * shape.slice;
        let mut mine = extents(&mut rng, start, shape.slice, shape.extents);
        written.extend_from_slice(&mine);
        // The writer's queue depth: its extents dealt among that many streams.
        let per = mine.len().div_ceil(shape.depth);
        while !mine.is_empty() {
            let take: Vec<(u64, u64)> = mine.drain(..per.min(mine.len())).collect();
            let v = v.clone();
            streams.push(tokio::spawn(async move {
                for (off, len) in take {
                    let data = pattern(round, off, len);
                    v.write_at(off, data.clone())
                        .await
                        .map_err(|e| format!("write {off}+{len}: {e}"))?;
                    let got = v
                        .read_at(off, len)
                        .await
                        .map_err(|e| format!("read {off}+{len}: {e}"))?;
                    if got != data {
                        return Err(format!(
                            "read right after the acknowledged write of {off}+{len}: {}",
                            describe(&got, &data)
                        ));
                    }
                }
                Ok::<_, String>(())
            }));
        }
    }
    // An open of the file beside the writers, as fio's reopen at the end of each job: a
    // fresh handle, then the shared one refreshed.
    let opener = {
        let (v, client, name, writing) = (v.clone(), client.clone(), name.clone(), writing.clone());
        tokio::spawn(async move {
            while writing.load(Ordering::Relaxed) {
                let _fresh = Vdi::open(client.clone(), &name)
                    .await
                    .map_err(|e| format!("open: {e}"))?;
                v.refresh().await.map_err(|e| format!("refresh: {e}"))?;
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            Ok::<_, String>(())
        })
    };
    let flusher = {
        let (v, writing) = (v.clone(), writing.clone());
        tokio::spawn(async move {
            while writing.load(Ordering::Relaxed) {
                v.flush().await.map_err(|e| format!("flush: {e}"))?;
                tokio::time::sleep(Duration::from_millis(3)).await;
            }
            Ok::<_, String>(())
        })
    };
    let mut first_err = None;
    for s in streams {
        if let Err(e) = s.await.expect("stream task") {
            first_err.get_or_insert(e);
        }
    }
    writing.store(false, Ordering::Relaxed);
    for t in [opener, flusher] {
        if let Err(e) = t.await.expect("task") {
            first_err.get_or_insert(e);
        }
    }
    if let Some(e) = first_err {
        return Err(e);
    }
    // Everything once more, through the handle and through a fresh one.
    let fresh = Vdi::open(client.clone(), &name)
        .await
        .map_err(|e| e.to_string())?;
    for (h, which) in [(&*v, "the writers' handle"), (&fresh, "a fresh handle")] {
        let reads = written.iter().map(|&(off, len)| async move {
            let got = h.read_at(off, len).await.map_err(|e| e.to_string())?;
            let want = pattern(round, off, len);
            if got != want {
                return Err(format!(
                    "final read through {which} of {off}+{len}: {}",
                    describe(&got, &want)
                ));
            }
            Ok(())
        });
        for r in futures::future::join_all(reads).await {
            r?;
        }
    }
    drop((v, fresh));
    vdi::delete(&client, &name)
        .await
        .map_err(|e| format!("delete: {e}"))?;
    if shape.cow {
        vdi::delete_snapshot(&client, &format!("{name}@base"))
            .await
            .map_err(|e| format!("delete the snapshot: {e}"))?;
    }
    Ok(())
}

/// `FIRST_WRITES_ROUNDS`, default 60 (before the fix, 25 of 100 rounds failed).
fn rounds() -> u64 {
    std::env::var("FIRST_WRITES_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60)
}

/// 3 nodes, 3 copies of 1 MiB objects, a network with `delay`, and a client on a runtime.
fn cluster(delay: Option<Delay>) -> (MemCluster, tokio::runtime::Runtime, Arc<Client>) {
    let c = MemCluster::start(3).expect("start");
    c.net.set_delay(delay);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap();
    let client = Arc::new(rt.block_on(c.client(ClientOptions::default())).unwrap());
    rt.block_on(client.format(3, None, MIB)).unwrap();
    (c, rt, client)
}

/// A little latency on every message (20 to 300 us), so that writes overlap.
fn latency() -> Option<Delay> {
    Some(Delay {
        min: Duration::from_micros(20),
        max: Duration::from_micros(300),
    })
}

fn run_rounds(rounds: u64, shape: Shape, delay: Option<Delay>) {
    let (_c, rt, client) = cluster(delay);
    let base: u64 = std::env::var("FIRST_WRITES_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(41);
    let mut failed = Vec::new();
    for r in 0..rounds {
        if let Err(e) = rt.block_on(round(client.clone(), r, &shape, base + r)) {
            failed.push(format!("round {r} (seed {}): {e}", base + r));
        }
    }
    assert!(
        failed.is_empty(),
        "{} of {rounds} rounds read wrong data:\n{}",
        failed.len(),
        failed.join("\n")
    );
}

/// 8 writers of 1 MiB each (1 MiB objects, every slice across two objects), 8 writes of 4
/// to 64 KiB in flight each, on a network with a little latency.
#[test]
fn acknowledged_first_writes_read_back_under_refreshes() {
    run_rounds(
        rounds(),
        Shape {
            writers: 8,
            depth: 8,
            slice: MIB,
            extents: 8,
            cow: false,
        },
        latency(),
    );
}

/// The same with every write a first write into an object shared with a snapshot: a
/// copy-on-write, recorded in the map as a first write into a new object is.
#[test]
fn acknowledged_copy_on_writes_read_back_under_refreshes() {
    run_rounds(
        rounds() / 4,
        Shape {
            writers: 8,
            depth: 8,
            slice: MIB,
            extents: 8,
            cow: true,
        },
        latency(),
    );
}

/// A second handle of the same client (sheepfs's cached handle taking over from a plain one
/// once the plain one's requests are done) refreshed after first writes through the first
/// handle were acknowledged: it reads every one of them, though their map entries may still
/// be on their way from the first handle's log.
#[test]
fn a_handle_refreshed_after_another_one_wrote_reads_its_first_writes() {
    let (_c, rt, client) = cluster(latency());
    let mut failed = Vec::new();
    for r in 0..rounds() / 2 {
        let name = format!("two{r}");
        let res: Result<(), String> = rt.block_on(async {
            vdi::create(&client, &name, 16 * MIB)
                .await
                .map_err(|e| e.to_string())?;
            let a = Arc::new(
                Vdi::open(client.clone(), &name)
                    .await
                    .map_err(|e| e.to_string())?,
            );
            let b = Vdi::open(client.clone(), &name)
                .await
                .map_err(|e| e.to_string())?;
            let writes = (0..16u64).map(|i| {
                let a = a.clone();
                async move {
                    let off = i * MIB + (i % 4) * BLOCK;
                    a.write_at(off, pattern(r, off, BLOCK))
                        .await
                        .map_err(|e| e.to_string())
                }
            });
            for w in futures::future::join_all(writes).await {
                w?;
            }
            b.refresh().await.map_err(|e| format!("refresh: {e}"))?;
            for i in 0..16u64 {
                let off = i * MIB + (i % 4) * BLOCK;
                let got = b.read_at(off, BLOCK).await.map_err(|e| e.to_string())?;
                let want = pattern(r, off, BLOCK);
                if got != want {
                    return Err(format!("object {i}: {}", describe(&got, &want)));
                }
            }
            drop((a, b));
            vdi::delete(&client, &name).await.map_err(|e| e.to_string())
        });
        if let Err(e) = res {
            failed.push(format!("round {r}: {e}"));
        }
    }
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}
