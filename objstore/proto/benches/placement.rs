//! Placement figures: lookup speed, balance and movement on join/leave.
//!
//! `cargo bench -p objstore --bench placement`. Plain `main`, no harness; the numbers go
//! into `docs/placement.md`. Memberships are generated from fixed seeds, so every figure but
//! the timings is the same on every run.

use std::hint::black_box;
use std::net::SocketAddr;
use std::time::Instant;

use objstore_proto::placement::Ring;
use objstore_proto::view::NodeInfo;
use objstore_proto::{ObjIndex, ObjectId, Vid};

const VNODES: u32 = 128;
const COPIES: usize = 3;

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `n` nodes with random ids, `VNODES` points each, in `zones` zones (round robin).
fn cluster(seed: u64, n: usize, zones: usize) -> Vec<NodeInfo> {
    let mut s = seed;
    (0..n)
        .map(|i| NodeInfo {
            id: splitmix(&mut s),
            addr: SocketAddr::from(([127, 0, 0, 1], 7000 + i as u16)),
            zone: (i % zones) as u32,
            vnodes: VNODES,
            incarnation: 1,
        })
        .collect()
}

/// `n` data object ids, 10 000 per VDI.
fn objects(n: u32) -> impl Iterator<Item = ObjectId> {
    (0..n).map(|i| ObjectId::data(Vid(1 + i / 10_000), ObjIndex(i % 10_000)))
}

/// (max/mean, min/mean) of copies per node, and max/mean of primaries per node.
fn balance(nodes: &[NodeInfo], objs: u32) -> (f64, f64, f64) {
    let ring = Ring::new(nodes);
    let mut all = vec![0u64; nodes.len()];
    let mut primary = vec![0u64; nodes.len()];
    for o in objects(objs) {
        let r = ring.replica_indices(o, COPIES);
        primary[r[0]] += 1;
        for i in r {
            all[i] += 1;
        }
    }
    let mean = all.iter().sum::<u64>() as f64 / nodes.len() as f64;
    let pmean = objs as f64 / nodes.len() as f64;
    (
        *all.iter().max().unwrap() as f64 / mean,
        *all.iter().min().unwrap() as f64 / mean,
        *primary.iter().max().unwrap() as f64 / pmean,
    )
}

/// From membership `a` to `b`: fractions of objects whose primary changed, of objects whose
/// holder set gained a node, and of (object, copy) placements in `b` on a node that did not
/// hold the object in `a` (copies that must be moved).
fn movement(a: &[NodeInfo], b: &[NodeInfo], objs: u32) -> (f64, f64, f64) {
    let (ra, rb) = (Ring::new(a), Ring::new(b));
    let (mut primary, mut changed, mut moved, mut placed) = (0u64, 0u64, 0u64, 0u64);
    for o in objects(objs) {
        let x: Vec<u64> = ra.replicas(o, COPIES).iter().map(|n| n.id).collect();
        let y: Vec<u64> = rb.replicas(o, COPIES).iter().map(|n| n.id).collect();
        let m = y.iter().filter(|id| !x.contains(id)).count() as u64;
        primary += u64::from(x[0] != y[0]);
        changed += u64::from(m > 0);
        moved += m;
        placed += y.len() as u64;
    }
    (
        primary as f64 / objs as f64,
        changed as f64 / objs as f64,
        moved as f64 / placed as f64,
    )
}

fn lookups(n: usize) {
    const OIDS: u32 = 1_000_000;
    let nodes = cluster(1, n, n);
    let t = Instant::now();
    let ring = Ring::new(&nodes);
    let build = t.elapsed();
    let mut best = f64::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        let mut acc = 0usize;
        for o in objects(OIDS) {
            acc = acc.wrapping_add(black_box(ring.replica_indices(black_box(o), COPIES))[0]);
        }
        black_box(acc);
        best = best.min(t.elapsed().as_secs_f64());
    }
    println!(
        "| {n:>3} | {:>6} | {:>9.1} | {:>12.0} | {:>7.0} |",
        n * VNODES as usize,
        build.as_secs_f64() * 1e6,
        OIDS as f64 / best,
        best * 1e9 / OIDS as f64,
    );
}

fn main() {
    println!("## Lookups: 1M data object ids, {COPIES} copies, {VNODES} vnodes per node, one zone per node, best of 3");
    println!("| nodes | points | build µs | lookups/s | ns/lookup |");
    println!("|---|---|---|---|---|");
    for n in [3, 6, 64] {
        lookups(n);
    }

    const OBJS: u32 = 1_000_000;
    println!();
    println!("## Balance: {OBJS} data objects, {COPIES} copies, {VNODES} vnodes, one zone per node (seed 1)");
    println!("| nodes | copies max/mean | copies min/mean | primaries max/mean |");
    println!("|---|---|---|---|");
    for n in [3, 6, 8, 16] {
        let (max, min, pmax) = balance(&cluster(1, n, n), OBJS);
        println!("| {n} | {max:.3} | {min:.3} | {pmax:.3} |");
    }
    let (max, min, pmax) = balance(&cluster(1, 16, 4), OBJS);
    println!("| 16 in 4 zones | {max:.3} | {min:.3} | {pmax:.3} |");

    println!();
    println!("## Movement: {OBJS} data objects, {COPIES} copies, {VNODES} vnodes, one zone per node (seed 1)");
    println!("join: N nodes + 1; leave: N nodes - 1 (the 4th node, or the 2nd when N = 3)");
    println!("| change | primary moved | objects changed | copies moved | ideal (primary / objects / copies) |");
    println!("|---|---|---|---|---|");
    for n in [3usize, 6, 16] {
        let grown = cluster(1, n + 1, n + 1);
        let base = &grown[..n];
        let (p, c, m) = movement(base, &grown, OBJS);
        let held = COPIES.min(n + 1) as f64;
        let n1 = (n + 1) as f64;
        println!(
            "| join {n}→{} | {p:.4} | {c:.4} | {m:.4} | {:.4} / {:.4} / {:.4} |",
            n + 1,
            1.0 / n1,
            held / n1,
            1.0 / n1
        );
        let mut shrunk = base.to_vec();
        shrunk.remove(if n > 3 { 3 } else { 1 });
        let (p, c, m) = movement(base, &shrunk, OBJS);
        let nf = n as f64;
        let (ic, im) = if n > COPIES {
            (COPIES as f64 / nf, 1.0 / nf)
        } else {
            (0.0, 0.0)
        };
        println!(
            "| leave {n}→{} | {p:.4} | {c:.4} | {m:.4} | {:.4} / {ic:.4} / {im:.4} |",
            n - 1,
            1.0 / nf
        );
    }

    // Spread over many memberships, to justify the bounds in the unit tests (8 nodes, 100k
    // objects: the sizes used there).
    const SEEDS: u64 = 200;
    const TOBJS: u32 = 100_000;
    let mut worst = (0f64, f64::MAX);
    let mut sum = 0f64;
    for seed in 0..SEEDS {
        let (max, min, _) = balance(&cluster(seed, 8, 8), TOBJS);
        worst = (worst.0.max(max), worst.1.min(min));
        sum += max;
    }
    println!();
    println!("## Spread over {SEEDS} random memberships of 8 nodes, {TOBJS} objects (the unit-test sizes)");
    println!(
        "balance: copies max/mean mean {:.3}, worst {:.3}; min/mean worst {:.3}",
        sum / SEEDS as f64,
        worst.0,
        worst.1
    );
    let mut rng = [(f64::MAX, 0f64); 6];
    for seed in 0..SEEDS {
        let nine = cluster(seed, 9, 9);
        let (a, b, c) = movement(&nine[..8], &nine, TOBJS);
        let mut seven = nine[..8].to_vec();
        seven.remove(3);
        let (d, e, f) = movement(&nine[..8], &seven, TOBJS);
        for (r, v) in rng.iter_mut().zip([a, b, c, d, e, f]) {
            *r = (r.0.min(v), r.1.max(v));
        }
    }
    let names = [
        "join 8→9 primary",
        "join 8→9 objects changed",
        "join 8→9 copies moved",
        "leave 8→7 primary",
        "leave 8→7 objects changed",
        "leave 8→7 copies moved",
    ];
    let ideal = [
        1.0 / 9.0,
        3.0 / 9.0,
        1.0 / 9.0,
        1.0 / 8.0,
        3.0 / 8.0,
        1.0 / 8.0,
    ];
    for ((name, (lo, hi)), id) in names.iter().zip(rng).zip(ideal) {
        println!(
            "{name}: {lo:.4} .. {hi:.4} (ideal {id:.4}; {:.2}x .. {:.2}x)",
            lo / id,
            hi / id
        );
    }
}
