//! Seeds on which the simulator found a replication bug, kept by name. Each asserts that its
//! seed breaks no rule of the checker. Those that still fail are ignored, with the bug named,
//! until it is fixed. A seed replays exactly only on the code it was found on: once the node's
//! logic changes, the same seed explores a different schedule, so a passing seed here is a
//! "this schedule passes" check, not proof that its bug is gone.
//!
//! Replay one with its timeline: `SEED=N cargo test -p objstore-sim --test seeds seeds --
//! --nocapture` (with the `SIM_FAULTS` given below, if any). The seeds found before there were
//! VDI clients run without them ([`objects_only`], `SIM_VDI_CLIENTS=0`): so they replay the
//! schedule they were found on, as long as the nodes' and clients' code does not change it.

use objstore_sim::{run, Config, Faults};

/// The shape of the runs before the VDI clients (issue 41): object clients only. The same
/// seed gives the same run as then (the VDI clients draw nothing and send nothing).
fn objects_only() -> Config {
    Config {
        vdi_clients: 0,
        faults: before_full_restarts(),
        ..Config::default()
    }
}

/// The default run as it was before full restarts: object and VDI clients.
fn with_vdis() -> Config {
    Config {
        faults: before_full_restarts(),
        ..Config::default()
    }
}

/// Every fault but full restarts and power cuts, which came later (issue 43, issue 44): the
/// seeds found before replay the schedule they were found on.
fn before_full_restarts() -> Faults {
    Faults {
        full_restarts: false,
        power_cuts: false,
        ..Faults::ALL
    }
}

fn assert_clean(seed: u64) {
    assert_clean_with(seed, objects_only());
}

fn assert_clean_with(seed: u64, cfg: Config) {
    let r = run(seed, &cfg).unwrap();
    let found: Vec<String> = r.violations.iter().map(|v| v.to_string()).collect();
    assert!(found.is_empty(), "seed {seed}:\n{}", found.join("\n"));
}

fn network_only() -> Config {
    let faults: Faults = "partitions,hangs,delays,resets".parse().unwrap();
    Config {
        faults,
        ..objects_only()
    }
}

// Found on the code before the replication rewrite (epoch stamps, client fan-out, tombstones
// in memory; main at d0c2f62), passing since the rewrite (main at 1524fc4).

/// A crash lost an unflushed write on one replica only; its copy kept the same stamp as the
/// others, so recovery never repaired it and the owners kept different bytes. (Seed 0: write
/// 9 to object 2 block 7, node 4 crashed before any flush.)
#[test]
fn crash_leaves_one_replica_without_an_unflushed_write_forever() {
    assert_clean(0);
}

/// A remove acknowledged while some holders were down came back with them (tombstones in
/// memory). (Seed 97: object 4 read write 11 again after remove 20.)
#[test]
fn remove_while_a_holder_is_down_comes_back() {
    assert_clean(97);
}

/// The same root cause seen as a revert: a node down during two removes and a flushed write
/// returned with its old copy, and the object read its first write again. (Seed 589.)
#[test]
fn returning_node_reverts_a_flushed_write() {
    assert_clean(589);
}

/// Rolling crashes lost flushed writes; a later partial write (failed on one replica)
/// re-created the object as zeros plus its block. (Seed 30.)
#[test]
fn rolling_failure_loses_flushed_writes() {
    assert_clean(30);
}

/// Network faults alone: a write attempt its client had given up on (request timeout) reached
/// one replica after the client's next acknowledged write to the same block, and that replica
/// kept the older data. (Seed 185 with `SIM_FAULTS=partitions,hangs,delays,resets`.)
#[test]
fn stale_request_lands_after_a_newer_write() {
    assert_clean_with(185, network_only());
}

// Found on the rewritten replication path (main at 1524fc4), passing since the client's
// hung-node work (main at 982fa6c) changed their schedules.

/// A write failed on one owner (disk full) after the others applied it; the owners never
/// converged. (Seed 12: write 14 to object 5 block 5.)
#[test]
fn write_failed_on_one_owner_seed_12() {
    assert_clean(12);
}

/// Owners of objects 2 and 4 held different bytes after recovery. (Seed 62; before the
/// rewrite this seed showed a failed write surviving a remove.)
#[test]
fn failed_write_survives_a_later_remove() {
    assert_clean(62);
}

// Found on the rewritten replication path, still failing at main 982fa6c.

/// A write that fails on one owner (its disk is full) after the others applied it: the
/// owners never converge. (Seed 7: writes 16 to object 4 and 17, 18 to object 1 fail with
/// "out of disk space" at 10.99-11.07 s; after the faults stop and recovery ends, one owner
/// of each object has zeros where the others hold those writes. 101 of seeds 0..1000 end with
/// owners holding different bytes.)
#[test]
fn write_failed_on_one_owner_never_converges() {
    assert_clean(7);
}

/// A write that failed (one owner out of space) comes back after later removes of its
/// object were acknowledged and flushed. (Seed 161: write 9 to object 0 block 6 fails at
/// 4.125 s; removes 12, 13, 14 are acknowledged and flushed by 4.508 s; after the faults stop
/// the block reads write 9.)
#[test]
fn failed_write_comes_back_over_flushed_removes() {
    assert_clean(161);
}

/// No crash at all, only `fdatasync` failures: a replica whose flush failed (the store drops
/// the unsynced data, as after a failed fdatasync) serves the older copy. (Seed 546: writes
/// 13 and 19 to object 1 are acknowledged and later flushes succeed, yet reads return write 4
/// and zeros for them, and node 3 ends with the old bytes.)
#[test]
fn failed_fdatasync_serves_older_data() {
    assert_clean(546);
}

/// A remove acknowledged shortly after two owners restarted is undone: after the faults stop
/// one owner still holds the object's data and the final read returns it. (Seed 194: remove
/// 18 of object 2 acknowledged at 18.213 s, no crash after it; node 0 keeps writes 6 and 12.)
#[test]
fn remove_after_a_restart_is_undone() {
    assert_clean(194);
}

/// No crash: one node's disk fills and its `fdatasync` fails; its flush reports that object 5
/// "could not be made durable here and no replica could restore it". After the faults stop
/// (the disk has room again) that owner never gets object 5 back, although the two other
/// owners hold it, and other objects' owners differ too. Before the client's read fallback
/// (main 982fa6c) reads of object 5 failed with "out of disk space" from that node. (Seed
/// 1830, found by `make sim SEEDS=3000 SEED_BASE=1000`.)
#[test]
fn lost_copy_after_a_failed_fdatasync_is_never_restored() {
    assert_clean(1830);
}

// Found on the rewritten path by strict runs over seeds 0..1000 (main at d7a1c6b) and fixed.

/// A member of the epoch was cut off from the others (network), so their recovery plans never
/// saw its copy, the newest version of an object, and completed without it; nothing planned
/// again once the network healed, and the owners ended different. Now a plan that misses a
/// member's listing plans again until it comes. (Seed 59: object 1, node 0 at v17.1 with write
/// 14, nodes 3 and 4 at v16.1.)
#[test]
fn an_unreachable_member_holding_the_newest_copy_is_planned_again() {
    assert_clean(59);
}

/// An attempt the client had given up on (no answer within its request timeout) reached the
/// primary after a newer change and was applied over it: a remove acknowledged, then the old
/// write's data read back. Now a change carries the version the client last saw the object
/// at, and the primary refuses it at any other version. (Seed 842: remove 17 of object 2
/// acknowledged at 11.64 s, the read at 11.73 s returned write 4 and the failed write 9.)
#[test]
fn a_late_attempt_is_not_applied_over_a_newer_change() {
    assert_clean(842);
}

/// A write failed on the primary (disk full) but was applied by a replica; a remove of the
/// object, already a tombstone on the primary, returned at once as "already deleted", so the
/// replica kept the failed write's data at a newer version and served it. Now every remove
/// makes a new tombstone version. (Seed 180: write 9 of object 1 failed at 12.26 s, remove 10
/// acknowledged at 12.35 s, the read at 12.48 s returned write 9.)
#[test]
fn a_remove_is_not_skipped_while_a_replica_holds_a_newer_failed_write() {
    assert_clean(180);
}

/// A change failed in one epoch and again in the next: the repair of the first was still
/// waiting out its backoff, so the second was not scheduled, and the first gave up on the new
/// epoch. One owner kept the failed change's newer version for good. Now a repair belongs to
/// its epoch. (Seed 490: object 4, write 22 failed at 12.19 s, applied on node 0 only.)
#[test]
fn a_repair_is_scheduled_again_in_a_new_epoch() {
    assert_clean(490);
}

/// A copy lost with a failed fdatasync whose restore failed (no other owner reachable then)
/// was forgotten; in a later epoch the node, primary of the object and holding nothing, took
/// a write as if the object were new and made it anew around one block, over the flushed data
/// the other owners held. Now the copy stays (unreadable) and the object stays held, in every
/// plan, until a copy at least as new as the one lost is found (or every node that could hold
/// one has listed and none does). (Seed 797: writes 1 and 5 to object 5, flushed by 0.25 s;
/// write 10 at 13.14 s; the final read had only write 10.)
#[test]
fn flushed_writes_lost_after_failed_fdatasyncs_on_every_owner() {
    assert_clean(797);
}

// Found by `make sim SEEDS=10000` on main at 2415fde (11 of 10,000 seeds failing), fixed on
// main after 799f670: listings mark copies lost with a failed fdatasync (never a source, never a
// reason for another node to give up its copy), a copy lost outside a recovery round makes the
// round plan again, flushes fail while a lost copy is not restored, a copy no node can restore
// is kept as a suspect copy of what remains, and a first write whose client had seen no
// version is refused over an existing object. 10,000 seeds then pass every rule.

/// No crash: a write to a new object 2 (id 9) fails, node 3 (an owner) out of space; the next
/// (id 15, v5.2) is applied on the primary, node 4, only, and fails too; node 4's fdatasync
/// then fails, so its copy goes back to v5.1, unreadable, and the restore finds no owner at
/// v5.2: the flush fails, rightly. But nothing planned the object again (the epoch's round had
/// ended) nor retried, so owners 4 and 3 ended without the object while node 0 held write 9.
/// (Seed 6952.)
#[test]
fn a_lost_copy_with_no_newer_source_is_replaced_within_the_epoch() {
    assert_clean(6952);
}

/// The same with a source: node 4's fdatasync fails and its disk fills; the flush's restore of
/// object 5 (v5.3) finds nodes 3 and 2 at v5.3, but the pull fails (no space here), and only a
/// new epoch's round would have retried it: the copy stayed unreadable after the disk had
/// room. (Seed 1553; 1583, 7678, 7884 and 9408 were the same.)
#[test]
fn a_failed_restore_of_a_lost_copy_is_retried_within_the_epoch() {
    assert_clean(1553);
}

/// Every owner of object 1 lost its copy with a failed fdatasync. Planned again, each owner in
/// turn forgot its own copy for another's lost one (a listing showed a lost copy like a good
/// one), whose pull then failed, until no copy was left: acknowledged, flushed writes 5 and 7
/// gone. Now lost copies are marked in listings, and what remains of them is kept. (Seed 8554;
/// 3084 was the same at epoch 12.)
#[test]
fn owners_that_all_lost_their_copies_keep_the_flushed_data() {
    assert_clean(8554);
}

/// See [`owners_that_all_lost_their_copies_keep_the_flushed_data`], at a later epoch.
#[test]
fn owners_that_all_lost_their_copies_keep_the_flushed_data_seed_3084() {
    assert_clean(3084);
}

/// An acknowledged, flushed write lost: object 0 block 1, write 5 read as zeros at the end
/// while later blocks were there, after node 4 lost its copy at v5.6 with a failed fdatasync
/// and could not restore it, and 28 crashes. Passing since lost copies are marked and kept.
/// (Seed 5453.)
#[test]
fn an_acknowledged_flushed_write_lost_after_failed_fdatasyncs() {
    assert_clean(5453);
}

/// A remove acknowledged (remove 14 of object 1, 1.502-1.506 s), then a read returned the
/// write before it (write 3, acknowledged at 1.204 s). Traced with `SIM_LOG`: write 3 was the
/// client's first change of object 1, so it carried "no version seen"; its first attempt was
/// given up on (delays), the second applied; the first reached the primary after the remove,
/// and "no version seen" was accepted over anything: the object came back with write 3's
/// block. Now "no version seen" matches only an object the primary has no copy of. (Seed
/// 6314.)
#[test]
fn a_late_first_attempt_is_not_applied_over_a_remove() {
    assert_clean(6314);
}

/// Recovery never finished after the faults stopped: one node stayed Recovering with 1 object
/// pending (node 4 had lost object 0 at v47.1 with a failed fdatasync; the restore found only
/// node 0's v30.1). Seed 8990 also failed the final read of object 0. (Seed 7444.)
#[test]
fn recovery_settles_after_a_lost_copy_with_only_older_sources() {
    assert_clean(7444);
}

/// See [`recovery_settles_after_a_lost_copy_with_only_older_sources`]. Failed again once new
/// data objects were created without a sync (a different schedule): node 1 had finished its
/// round and was collecting (waiting for every owner to say it recovered the epoch) when a
/// flush lost its copy of object 5 at v18.1, which no owner held; its restore asked for the
/// epoch to be planned again, which happens only once the round ends, while node 4 waited for
/// node 1 to settle that copy. Now collecting ends the round when a copy here is lost.
#[test]
fn recovery_settles_after_a_lost_copy_with_only_older_sources_seed_8990() {
    assert_clean(8990);
}

/// An owner's copy unreadable at the end though each of its restores had succeeded (not traced
/// on the old code; passing since the fixes above). (Seed 8952.)
#[test]
fn no_copy_stays_unreadable_after_successful_restores() {
    assert_clean(8952);
}

// Found on 2026-12-02 by `make sim SEEDS=10000` on main at e0b94f9, and failing the same way on
// 59047e0 (issues 25 and 26); the 10,000 seeds were clean on the issue 22 code (stop 31).
// Fixed the next day (each cause also has a test of its own: the stores' lost-copy tests).

/// Owners diverged: object 5's write 16 failed (a replica out of space) after the primary
/// (node 0) and node 3 applied it; node 0's next flush failed and lost it (v5.5). Before the
/// node marked the copy lost, the client's retry was applied over it at v5.6 (on bytes the
/// memory store had put back at v5.4, which its `meta` showed too). The copy restoring v5.5
/// was then "not newer" and left uninstalled (`put_if_newer` Ok(false)), yet counted as a
/// restore, so the copy stayed lost for good and the owners never converged.
/// Now a lost copy keeps the version lost and takes no write (`StoreError::Lost`, `Busy`) until
/// a whole copy replaces it, every copy a flush lost is marked lost before the first restore
/// waits, and only an install counts as a restore. (Seed 8330.)
#[test]
fn owners_converge_after_a_write_failed_for_space_on_the_primary() {
    assert_clean(8330);
}

/// Recovery never finished: node 0 planned to pull a clone's object from node 4 alone, which
/// then lost its copy (a failed fdatasync, and no space to restore it) and dropped it; node 0
/// retried the same source for ever ("not found") while two other owners held the version.
/// Now a round tries failed pulls from the planned sources a few times, then plans again.
/// (Seed 6438.)
#[test]
fn recovery_settles_after_a_planned_source_drops_its_copy() {
    assert_clean(6438);
}

// Found by the VDI clients (issue 41; `objstore_sim::workload::vdi`) on main at 9a5c040 with
// the fix of 4c84700 undone (`EntryLog::drain` back to returning at once when its queue of map
// entries was empty, even while a task had taken a batch and was still writing it to the
// inode): 15 of seeds 0..1000 failed, all Lost (seed 466 also Resurrected: a discard took the
// object whose entry the handle had lost for a hole, and left it), and 6 of 2000 without
// faults; none with the fix.

/// Zeros read for acknowledged first writes after a refresh, before 4c84700. Writes 22 and 23
/// made object 1 of the VDI (its blocks 0 and 1), acknowledged at 0.236-0.240 s, and were read
/// back at 0.248 s; the refresh of 0.240-0.252 s found the queue of map entries empty while
/// their entry was still on its way to the inode, read the inode without it and replaced the
/// handle's map with it: the reads at 0.253 s and 0.271 s found a hole and returned zeros
/// (Lost). No node crashed. (Seed 9.)
#[test]
fn acknowledged_first_writes_read_as_zeros_after_a_refresh() {
    assert_clean_with(9, with_vdis());
}

/// The same without faults, before 4c84700: write 17 made object 1 (its block 3), acknowledged
/// at 0.154-0.158 s; the refresh of 0.160-0.173 s read the inode while its entry was on its
/// way (the flush of 0.170-0.172 s did not wait for it either), and at 0.207 s the block read
/// as zeros. (Seed 28 with `SIM_FAULTS=none`.)
#[test]
fn acknowledged_first_writes_read_as_zeros_after_a_refresh_without_faults() {
    assert_clean_with(
        28,
        Config {
            faults: Faults::NONE,
            ..Config::default()
        },
    );
}

// Found by the VDI clients' discards on main at 156222c (4 objects then, with blocks at every
// boundary between two, and 48 operations: seeds 104, 259, 476 and 815 of 0..1000 failed),
// fixed in 9a5c040 (`Vdi::doubtful`): the handle's map could say hole for an object still on
// the nodes (a first write that failed after some owner took it; a discard that unmapped it
// in the map here, then failed to write the unmap or remove the object). A discard of a hole
// returned at once and left the object there, and the next first write into it wrote into
// that object: its old blocks came back over the acknowledged discard. The VDI clients' shape
// has changed since, so these seeds run other schedules now.

/// A discard failed (a node out of space) after unmapping object 1 in the handle's map
/// (0.323-0.327 s); the next discard of it (acknowledged at 0.376 s at once, a hole here) did
/// nothing; a first write to its blocks 2 and 3 at 0.441 s wrote into the old object, and
/// blocks 254 and 255 read acknowledged writes 2 and 17 again (Resurrected). (Seed 104.)
#[test]
fn a_discard_after_a_failed_discard_leaves_the_old_blocks() {
    assert_clean_with(104, with_vdis());
}

/// First writes 26 to 28 to object 3 failed (a node out of space) and were never mapped, but
/// some replica kept them; a discard of object 3 at 18.767 s returned at once (a hole), and
/// first writes to its blocks 0 to 2 at 19.045 s mapped that object again, and the final
/// reads found write 28 in block 3 (LateFailedWrite). (Seed 259.)
#[test]
fn a_discard_leaves_a_failed_first_write_behind() {
    assert_clean_with(259, with_vdis());
}

/// Two discards of object 3: the first unmapped it here at 1.755 s and failed at 1.949 s; the
/// second, at 1.909 s, returned at once (a hole here). The next first write mapped the old
/// object again, and block 0 read write 19, acknowledged before the second discard
/// (Resurrected). (Seed 476.)
#[test]
fn a_discard_racing_a_failing_discard_returns_before_the_object_goes() {
    assert_clean_with(476, with_vdis());
}

// Found by `make sim SEEDS=10000` with the VDI clients on main at 9a5c040 (2 of 10,000 seeds;
// 0..1000 passed). Both start with a map entry that a crash lost: a first write's entry
// reaches the inode unflushed, and losing it with a crash is allowed (the first write was not
// flushed either); what follows is not. Fixed by writing every entry written since the last
// flush again before each flush and refresh (`EntryLog::write_unflushed`), and by making an
// index a refresh unmapped doubtful (`Vdi::refresh`).

/// Acknowledged, flushed writes read as zeros by a fresh open. Writes 42 and 43 made object 1
/// again at 10.565 s (after discard 35 had unmapped it); its entry went into the inode (v9.1),
/// which crashes lost before any flush (at 20.57 s the inode's primary was back at v7.3). The
/// handle still mapped object 1 and wrote writes 46 and 47 into it (acknowledged at 19.886 s),
/// and its flush of 20.053-20.540 s succeeded with no crash since; but the flush writes only
/// entries still queued, so object 1's entry was never written again: after the faults stop,
/// the handle reads 46 and 47 and a fresh handle reads zeros (Lost). (Seed 1122.)
#[test]
fn flushed_writes_into_an_object_whose_entry_a_crash_lost_read_as_zeros() {
    assert_clean_with(1122, with_vdis());
}

/// An acknowledged, flushed discard undone. Object 2's entry (first write 4 at 0.022 s) was
/// lost with crashes before any flush, and a refresh then found object 2 a hole, though its
/// object was still on the nodes with writes 4 to 17. Discard 46 (16.953 s) found the hole and
/// returned at once, leaving the object (no failed change had made it doubtful yet), and was
/// flushed by 16.994 s; first write 48 (acknowledged at 32.296 s) then wrote into that object,
/// and block 5 read write 16 again (Resurrected). (Seed 3489.)
#[test]
fn a_discard_leaves_an_object_whose_entry_a_crash_lost() {
    assert_clean_with(3489, with_vdis());
}

/// Acknowledged first writes read as zeros after a refresh read the inode from a replica
/// left behind. Write 22 made object 0 of the VDI at 21.619 s and writes 45 to 47 wrote into
/// it (acknowledged at 21.635 s, read back at 21.637 s and 21.738 s); no node crashed, but
/// failed fdatasyncs had left a replica of the inode diverged, and the refresh of
/// 21.651-21.751 s read the inode without object 0's entry and replaced the map with it: at
/// 21.782 s the blocks read as zeros (Lost). Found by `make sim SEEDS=10000` once seeds 1122
/// and 3489 were fixed; fixed by keeping, at a refresh, every entry the handle set that no
/// flush has made durable (`EntryLog::not_durable`). (Seed 3137.)
#[test]
fn a_refresh_from_a_replica_left_behind_drops_acknowledged_first_writes() {
    assert_clean_with(3137, with_vdis());
}

/// Two owners of a copy-on-write target each held a suspect copy at v5.1 (different bytes: one
/// lacked write 45), and each planned while the other's listing had not come; each took its
/// own copy for the reference (the lowest id of the holders it had seen) and settled it, and
/// the replicas stayed at one version with different bytes (Divergent, object 1001). Found by
/// `make sim SEEDS=10000` once listings came in 16 pages (issue 43), which makes a missing
/// listing likelier; fixed by settling a suspect copy only once every member listed (until
/// then the object waits and the round plans again). (Seeds 4249 and 5192.)
#[test]
fn suspect_copies_are_settled_only_once_every_member_listed() {
    assert_clean_with(4249, with_vdis());
    assert_clean_with(5192, with_vdis());
}

// Found once crashed nodes could restart with a full disk (`full_restarts`, issue 43).

/// Node 4 restarted with a full disk and was the primary of object 2, which it could not pull
/// again: write 53 went through the object's stand-in (its old holder) and failed on the
/// other owners, whose disks were full too. The primary's repair compared and sent its own,
/// pending, copy, which never had the change; once the disks had room it pulled the change
/// from the stand-in, and the owners kept different bytes (Divergent, block 2: node 4
/// Write(53), nodes 1 and 3 Zero). Fixed by repairing only from a recovered copy. (Seed
/// 20382 with `SIM_FAULTS=crashes,disk_full,full_restarts,resets`.)
#[test]
fn a_change_through_a_stand_in_failed_on_the_replicas_is_repaired() {
    assert_clean_with(
        20382,
        Config {
            faults: "crashes,disk_full,full_restarts,resets".parse().unwrap(),
            ..Config::default()
        },
    );
}

/// Node 0, an owner of VDI object 2 with a full disk, took writes 40 to 43 through the
/// object's stand-in while the recovery round's retry was pulling an older copy; the pull
/// installed it once the disk had room and the round took it for the end of the object's
/// recovery and recorded the epoch recovered, so nothing pulled the writes' version again and
/// node 0 kept the older bytes (Divergent, blocks 0 to 3). Fixed: a pull whose object took a
/// change through the stand-in meanwhile leaves it pending, and a change through a stand-in
/// first checks, under the object's replica lock, that no pull ended its recovery. (Seed
/// 25764 with `SIM_FAULTS=crashes,disk_full,full_restarts,resets`.)
#[test]
fn a_pull_overtaken_by_a_change_through_the_stand_in_does_not_end_recovery() {
    assert_clean_with(
        25764,
        Config {
            faults: "crashes,disk_full,full_restarts,resets".parse().unwrap(),
            ..Config::default()
        },
    );
}

/// Erasure-coded objects (issue 44): the primary of object 5 resolved its stripe while the
/// holder of strip 2 (parity) was unreachable, could not rebuild that strip, and still took
/// the stripe for whole for the rest of the epoch; the node came back without an epoch change
/// and the parity strip stayed one version behind to the end (Divergent). A stripe that could
/// not be rebuilt is resolved again at its next access.
#[test]
fn an_ec_strip_not_rebuilt_is_tried_again_at_the_next_access() {
    assert_clean_with(
        50380,
        Config {
            ec: Some("2:1".parse().unwrap()),
            faults: "partitions,hangs,delays,resets".parse().unwrap(),
            ..Config::default()
        },
    );
}

/// Erasure-coded objects (2:1) under crashes, hung and slow nodes, partitions and resets.
fn ec_with_crashes() -> Config {
    Config {
        ec: Some("2:1".parse().unwrap()),
        faults: "crashes,partitions,hangs,delays,resets".parse().unwrap(),
        ..Config::default()
    }
}

/// [`ec_with_crashes`] with the VDI clients' VDIs erasure-coded too, and their bursts of
/// adjacent writes (`SIM_EC_VDIS=1`).
fn ec_vdis_with_crashes() -> Config {
    Config {
        ec_vdis: true,
        ..ec_with_crashes()
    }
}

/// A write over a removed EC object forgot the strip's tombstone after setting its note, which
/// dropped the note with it: strip 0 at a version no note explained, which no resolution
/// could take back (Divergent, the object's reads waiting for good). The strip is written over
/// its tombstone, its note kept.
#[test]
fn an_ec_write_over_a_tombstone_keeps_its_note() {
    assert_clean_with(60017, ec_with_crashes());
}

/// A stripe going back whose missing strip could not be rebuilt stopped before moving its
/// strips to a new version: the undone change stayed the newest, and recovery brought it back
/// from a holder that had kept it. The strips move to the new version even then.
#[test]
fn an_ec_stripe_going_back_moves_on_though_a_strip_is_missing() {
    assert_clean_with(60031, ec_with_crashes());
}

/// Strips of an undone change came back from holders that were away when it went back, beside
/// a strip at the newer version made on the same base: a sibling, which counts at the base
/// once returned to it (`ec::resolve`), instead of leaving the stripe undecided for good.
#[test]
fn an_ec_sibling_change_returns_to_its_base() {
    assert_clean_with(60178, ec_with_crashes());
}

/// A strip read of an epoch the holder had just left was answered from the holder's new
/// epoch: a node that held strip 2 in the request's epoch (and never got it) said "nothing,
/// known", though in its new epoch another node held the strip, and the stripe went back
/// over an acknowledged write (Lost). A holder answers strip reads of its current epoch only.
#[test]
fn an_ec_strip_read_of_an_epoch_left_is_refused() {
    assert_clean_with(70588, ec_with_crashes());
}

/// An epoch was recorded clean (every member recovered it) while the holder of strip 2 of a
/// stripe lacked it: its holder of the epoch before had crashed, and a strip key is never
/// waited for. A later holder judged from that clean epoch, answered "nothing, known", and the
/// stripe went back over an acknowledged write (Lost). A node records an epoch recovered only
/// once every stripe it is the primary of is whole in it (`Node::ec_sweep`).
#[test]
fn an_epoch_with_a_strip_not_rebuilt_is_not_clean() {
    assert_clean_with(70627, ec_with_crashes());
}

/// A stripe went back (a new change) on strip 0 only: the holders of the other strips were
/// down. Recovery then moved strip 2 at the undone change to new holders without its undo,
/// over the one copy of the base; with strip 1 stale, no version had 2 strips and the stripe
/// waited for good (NotSettled, FinalReadFailed). A strip pulled keeps its holder's undo, so
/// it counts at the base (a sibling of the change that went back).
#[test]
fn a_strip_pulled_at_an_undone_change_keeps_its_undo() {
    assert_clean_with(70021, ec_with_crashes());
}

/// A node back from a crash, the primary of a stripe, answered its own strip at the base of an
/// acknowledged change it had missed (the change's holder of that strip not listed yet); with
/// the parity strip at the change, pulled with its undo, the stripe went back over the change
/// (Lost). A holder that cannot vouch for what it has of a strip (its holder of some epoch
/// since the clean one not listed) answers it unsure: missing, not at its version.
#[test]
fn a_strip_back_from_a_crash_is_not_taken_for_the_newest() {
    assert_clean_with(70393, ec_with_crashes());
}

/// A VDI's object was discarded (every strip a tombstone) while the holder of one strip was
/// down; that strip, back at its old version, was never made a tombstone: the sweep after
/// each epoch's recovery skipped stripes whose strip 0 is a tombstone, and nobody reads a
/// discarded object (Divergent at the end). The sweep resolves removed stripes too.
#[test]
fn a_strip_that_missed_a_remove_becomes_a_tombstone() {
    assert_clean_with(65, ec_vdis_with_crashes());
}

/// A stripe went back and took its new version on strip 0 only; strip 0's holder, unsure of
/// it later, answered it as missing, and the change undone came forward again from a holder
/// that had been away; strip 0 refused the older version and the next change diverged (the
/// object unreadable for good). A strip newer than the version the others decide on is
/// counted in (`with_newer_unsure`).
#[test]
fn an_unsure_strip_newer_than_the_decision_is_counted_in() {
    assert_clean_with(99, ec_vdis_with_crashes());
}

/// A stripe decided to go back (to v43.1) without the primary's own strip 0, unsure at
/// v43.3, newer than anything the other strips showed: strip 0's undo returns it to v43.2
/// only, going back rewrote strip 2's note before failing halfway, and the stripe was left
/// undecided for good (a node's recovery never finished, the final read failed; no read
/// wrong). With 2:2, which the default runs do not use. `with_newer_unsure` counts a newer
/// unsure strip into a decision to go back too.
#[test]
fn an_unsure_strip_newer_than_a_way_back_is_counted_in() {
    assert_clean_with(
        1491,
        Config {
            ec: Some("2:2".parse().unwrap()),
            ..ec_vdis_with_crashes()
        },
    );
}

/// Seed 228 with `SIM_EC=3:2 SIM_EC_VDIS=1`: the primary decided a stripe (strips 1 and 4
/// stale at v5.1, the others at v11.2) but the rebuild of strip 1 met a reset connection;
/// its sweep counted the stripe whole anyway, recorded the epoch recovered, and strip 1
/// stayed stale for good (Divergent). With 3:2, which the default runs do not use. The
/// sweep counts a stripe whole only once its rebuild succeeded.
#[test]
fn a_stripe_whose_rebuild_failed_is_swept_again() {
    assert_clean_with(
        228,
        Config {
            ec: Some("3:2".parse().unwrap()),
            ..ec_vdis_with_crashes()
        },
    );
}

/// Seed 1701 with `SIM_EC=2:2 SIM_EC_VDIS=1`: a primary decided to go back to v10.1 with
/// strips 0 and 2 missing, and its new version v21.1 reached strip 3 only; another primary,
/// without strip 3, took the stripe forward to v16.1 since. Strip 3 at v21.1, the newest,
/// that no other strip could join, left the stripe undecided for good (a node's recovery
/// never finished, the final read failed; no read wrong). Found once a rebuild no longer
/// counted as a change (a holder that took only rebuilds vouches for its copies), which
/// made strips 1 and 3 sure where they had been unsure. A newest version too few strips
/// show, with every other strip at hand, was never acknowledged: the others decide
/// (`resolve`).
#[test]
fn a_lone_newest_strip_gives_way_to_the_others() {
    assert_clean_with(
        1701,
        Config {
            ec: Some("2:2".parse().unwrap()),
            ..ec_vdis_with_crashes()
        },
    );
}

/// Seed 1064 with `SIM_EC=2:1 SIM_EC_VDIS=1`: a stripe at v5.6 lost the holders of strips 0
/// and 2 (down); in the next epoch its new primary held nothing of it and the one node
/// holding strip 1 was no primary, so no node's sweep knew the stripe, and the epoch, whose
/// stripe could not be decided, counted as clean. A later primary took "nothing" on the new
/// holders of strips 0 and 2 for "never made", and the stripe started again from zeros over
/// acknowledged writes (Lost). The holder of a strip other than 0 asks the primary to make
/// the stripe whole before its epoch counts as recovered.
#[test]
fn a_stripe_whose_primary_lacks_strip_0_is_swept_by_its_other_holders() {
    assert_clean_with(1064, ec_vdis_with_crashes());
}

// Found once a crash could be a power cut that wrote back part of what was not synced
// (`power_cuts`): copies come back marked with old, new or mixed bytes, or as they were.

/// Crashes, power cuts, partitions, hangs, delays and resets, object and VDI clients.
fn with_power_cuts() -> Config {
    Config {
        faults: "crashes,power_cuts,partitions,hangs,delays,resets"
            .parse()
            .unwrap(),
        ..Config::default()
    }
}

/// Seed 733 (and seed 17 before the next fix): the owners of a VDI object, durable at v5.7
/// with later writes unflushed, came back from power cuts at different times. One, without
/// the listing of the owner whose copy had come back as it was synced (not suspect), pulled
/// another's suspect copy (mixed bytes) and installed it as not suspect: two copies not
/// suspect at v5.7 with different bytes (Divergent). A suspect reference is pulled, as it is
/// settled, only once every node listed. (Fails without that rule, with the next one.)
#[test]
fn a_suspect_copy_is_pulled_only_once_every_node_listed() {
    assert_clean_with(733, with_power_cuts());
    assert_clean_with(17, with_power_cuts());
}

/// Seed 142: all three owners of an object, durable at v5.1 with write 52 unflushed, were
/// cut; the primary came back first with its copy marked (holding write 52) and, the only
/// holder listed, settled it as the reference; an owner whose copy came back as it was
/// (without write 52, not suspect) returned after, and both copies stood at v5.1, not
/// suspect, with different bytes (Divergent). A settled copy is installed again at a version
/// of the epoch that settled it, which every copy of the old version takes.
#[test]
fn a_settled_copy_takes_a_version_of_its_own() {
    assert_clean_with(142, with_power_cuts());
}
