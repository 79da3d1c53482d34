//! The stale-copy hole of erasure-coded objects, in one process (memory stores, an in-memory
//! network): a node keeps the copy of a strip it held before the strip moved to a node that
//! joined; that node takes an acknowledged write of the strip and goes down before any epoch
//! is clean, and the strip comes back to the node with the old copy. That copy must not be
//! vouched for: counted at the old version, with one untouched strip at the new one it would
//! take the stripe back over the acknowledged write (docs/architecture.md, "Erasure-coded
//! objects", "Recovery").

use std::time::Duration;

use bytes::Bytes;
use objstore_client::ClientError;
use objstore_node::store::mem::{Fault, Op};
use objstore_proto::ec::Codec;
use objstore_proto::redundancy::Redundancy;

const EC22: Redundancy = Redundancy::Ec { data: 2, parity: 2 };

mod ec_common;
use ec_common::{cluster, counted, holders, oid, wait_consistent, MIB};

/// Epoch A (4 nodes, walk a0 a1 a2 a3): the object written whole (v1). Epoch B: node J joins
/// second in the object's walk (a0 J a1 a2): J pulls strip 1 from a1, which keeps its copy
/// (J's recovery of other objects is kept from finishing, so B is never clean and nothing is
/// collected), and a write of strip 1's bytes only (touching strips 1, 2, 3) is acknowledged
/// by all four holders (v2). Epoch C: J crashes; the walk is A's again, so a1 holds strip 1
/// (its copy at v1, nobody up to pull from) and a2, a3 hold strips 2, 3 (kept from pulling
/// v2 from a1, a2). Strip 0, at v2 and untouched by it, is valid at v1 and v2: a1 answering
/// its copy as sure would make two strips valid at v1 and one at v2, and the stripe would go
/// back. It must wait for J instead, and once J is back read the write.
#[test]
fn a_copy_kept_from_before_its_strip_moved_never_takes_a_write_back() {
    let (mut c, rt, cl) = cluster(4);
    c.wait_recovered();
    let l = Codec::new(EC22, MIB).unwrap().strip_len();
    let old = vec![0x11u8; MIB as usize];
    let new = vec![0x22u8; 4096];
    let (candidates, blockers) = (0..32u32, 32..48u32);
    for i in candidates.clone() {
        rt.block_on(cl.ec_write_obj(oid(i), EC22, 0, Bytes::from(old.clone())))
            .unwrap();
    }
    for i in blockers.clone() {
        rt.block_on(cl.ec_write_obj(oid(i), EC22, 0, Bytes::from(vec![0x33u8; 4096])))
            .unwrap();
    }
    rt.block_on(cl.flush()).unwrap();
    let before: Vec<Vec<usize>> = (0..48).map(|i| holders(&c, 0, oid(i), 4)).collect();

    // Epoch B: J joins, every pull of a blocker's strip failing on it.
    let j = c.add_node();
    for i in blockers.clone() {
        for k in 0..4 {
            c.store(j)
                .fail_object(Op::Write, oid(i).strip(k), Fault::Io);
        }
    }
    c.start_node(j).unwrap();
    c.wait_members(5);
    let after: Vec<Vec<usize>> = (0..48).map(|i| holders(&c, 0, oid(i), 4)).collect();
    assert!(
        blockers.clone().any(|i| after[i as usize].contains(&j)),
        "J holds no strip of a blocker: epoch B could become clean"
    );
    let i = candidates
        .clone()
        .find(|&i| after[i as usize][1] == j)
        .expect("an object with J second in its walk") as usize;
    let o = oid(i as u32);
    let a = &before[i];
    assert_eq!(after[i], vec![a[0], j, a[1], a[2]], "{o}: J not inserted");
    println!("{o}: epoch A holders {a:?}, epoch B {:?}", after[i]);

    // The acknowledged write (v2), of strip 1's bytes only.
    rt.block_on(cl.ec_write_obj(o, EC22, l as u64, Bytes::from(new.clone())))
        .unwrap();
    rt.block_on(cl.flush()).unwrap();

    // Epoch C: J down, a2 and a3 kept from pulling strips 2 and 3.
    c.store(a[2]).fail_object(Op::Write, o.strip(2), Fault::Io);
    c.store(a[3]).fail_object(Op::Write, o.strip(3), Fault::Io);
    c.crash(j);
    c.wait_members(4);
    assert_eq!(
        holders(&c, a[0], o, 4),
        *a,
        "{o}: epoch C's walk is not A's"
    );
    let short = c.client_on(&rt, Duration::from_secs(3));
    let t = std::time::Instant::now();
    let got = rt.block_on(short.ec_read_obj(o, EC22, l as u64, 4096));
    let back = || counted(&c, a[0], "sheep_ec_resolved_total", &[("way", "back")]);
    match &got {
        Ok(b) => {
            println!("read with J down ({:?}): {} bytes", t.elapsed(), b.len());
            assert!(
                b[..] != old[..4096],
                "{o}: the old bytes were read (stripes gone back on its primary: {}): the stale copy of strip 1 took the acknowledged write back",
                back()
            );
            assert!(b[..] == new[..], "{o}: neither the old bytes nor the new");
        }
        // Waiting for J is a clear error, never "not found" (the stripe taken for never made).
        Err(e) => {
            println!("read with J down ({:?}): {e}", t.elapsed());
            assert!(!matches!(e, ClientError::NotFound(_)), "{o}: {e}");
        }
    }
    assert_eq!(
        back(),
        0,
        "{o}: the stripe went back over the acknowledged write"
    );

    // Every node back: the write reads back, the stripe one version with matching parity.
    c.store(a[2]).clear_faults();
    c.store(a[3]).clear_faults();
    c.start_node(j).unwrap();
    c.wait_members(5);
    let fresh = c.client_on(&rt, Duration::from_secs(20));
    let got = rt
        .block_on(fresh.ec_read_obj(o, EC22, 0, MIB as u32))
        .unwrap();
    let mut want = old.clone();
    want[l..l + 4096].copy_from_slice(&new);
    assert!(
        got[..] == want[..],
        "{o}: the acknowledged write was lost (first difference at byte {:?})",
        got.iter().zip(&want).position(|(x, y)| x != y)
    );
    wait_consistent(&c, j, o, EC22);
}
