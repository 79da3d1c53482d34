//! Which copies a node may trust after membership changes: the rule that keeps a node that was
//! away (or a cluster restarted in the wrong order) from serving what it missed.
//!
//! The newest version of an object is held by every owner of the last epoch in which it was
//! changed (a change succeeds only when every owner of its epoch applied it), and by every node
//! that recovered it since. An epoch is *clean* once every one of its members finished recovery
//! in it (each records that in the cluster store, `recovered/<epoch>`): then every owner of every
//! object held the newest version. So, for the current epoch `cur` and the newest clean epoch
//! `K`, the newest version of any object is on the owners of one of the epochs `K..cur-1` —
//! counting only those in which a change could have succeeded (at least `min-copies` owners)
//! and `K` itself. If, for each of those epochs, some owner of the object is up now and listed
//! its copies, the highest version listed is the newest: the object is *safe*. Otherwise its
//! newest version may be only on nodes that are down, and I/O on it waits for them (or for an
//! operator's `dog cluster recover --force`, recorded as the epoch from which to count instead
//! of `K`).
//!
//! An epoch in which fewer owners are missing than each object has cannot hide any object;
//! only the others ("uncovered") are checked object by object.
//!
//! A node that took no change in an epoch after the base one hides nothing of it: a change
//! succeeds only once every owner of its epoch applied it, so every object changed in that
//! epoch has that node among its owners only if it took the change. Each node records in the
//! cluster store that it takes changes in an epoch (`changed/<epoch>`, its id added) before it
//! applies the first ([`Node::note_change`]); each node that starts an epoch creates the record
//! empty. An absent node that is not in the record of an epoch is then not waited for in that
//! epoch (Ceph's "maybe went read-write" of past intervals). An epoch without a record (one from
//! before nodes recorded) is judged as before: every absent owner counts. The base epoch is
//! judged whole: its members hold what was recovered into them, changed or not.

use std::collections::{BTreeMap, HashSet};
use std::net::SocketAddr;

use crate::membership::{Driver, DriverError};
use objstore_proto::keys;
use objstore_proto::oid::ObjectId;
use objstore_proto::placement::Ring;
use objstore_proto::view::View;

/// What the cluster store says about past epochs.
pub(super) struct History {
    /// The newest clean epoch before the current one (0: none).
    pub clean: u32,
    /// The nodes that recorded taking changes, by epoch (epochs with a record only).
    pub changed: BTreeMap<u32, HashSet<u64>>,
    /// The epoch of the last forced recovery (0: none).
    pub forced: u32,
    /// The views of the epochs from `max(clean, forced)` (or the first) to `cur - 1`.
    pub views: Vec<View>,
}

/// Reads the history needed to judge epoch `cur` (blocking: driver calls).
pub(super) fn load(driver: &dyn Driver, cur: u32) -> Result<History, DriverError> {
    let forced = driver
        .kv_get(keys::FORCED)?
        .and_then(|v| std::str::from_utf8(&v).ok()?.trim().parse().ok())
        .unwrap_or(0);
    let records: BTreeMap<u32, HashSet<u64>> = (id_lists(driver, keys::RECOVERED_PREFIX)?)
        .into_iter()
        .map(|(e, ids)| (e, ids.unwrap_or_default()))
        .collect();
    // An unreadable record of changes is as good as none: every absent owner counts.
    let changed: BTreeMap<u32, HashSet<u64>> = (id_lists(driver, keys::CHANGED_PREFIX)?)
        .into_iter()
        .filter_map(|(e, ids)| Some((e, ids?)))
        .collect();
    let mut views = Vec::new();
    let mut clean = 0;
    let mut e = cur.saturating_sub(1);
    while e >= 1 {
        let Some(view) = driver.view_at(e)? else {
            break;
        };
        let done = records.get(&e);
        let is_clean = !view.nodes.is_empty()
            && done.is_some_and(|d| view.nodes.iter().all(|n| d.contains(&n.id)));
        views.push(view);
        if is_clean {
            clean = e;
            break;
        }
        if e <= forced {
            break;
        }
        e -= 1;
    }
    views.reverse();
    // Records older than the newest clean epoch are never read again.
    let old = (records.range(..clean).map(|(e, _)| keys::recovered(*e)))
        .chain(changed.range(..clean).map(|(e, _)| keys::changed(*e)));
    for key in old.collect::<Vec<_>>() {
        if let Some(raw) = driver.kv_get(&key)? {
            // Best effort: another node may be pruning it too.
            let _ = driver.kv_cas(&key, Some(&raw), None);
        }
    }
    Ok(History {
        clean,
        changed,
        forced,
        views,
    })
}

/// The lists of node ids under `prefix`, by the epoch ending their keys (None: unreadable).
fn id_lists(
    driver: &dyn Driver,
    prefix: &str,
) -> Result<BTreeMap<u32, Option<HashSet<u64>>>, DriverError> {
    let mut out = BTreeMap::new();
    for (k, v) in driver.kv_list(prefix)? {
        if let Some(e) = k.strip_prefix(prefix).and_then(|e| e.parse().ok()) {
            let ids = serde_json::from_slice::<Vec<u64>>(&v).ok();
            out.insert(e, ids.map(|ids| ids.into_iter().collect()));
        }
    }
    Ok(out)
}

/// Adds node `id` to the record of the nodes that take changes in `epoch` (blocking); with
/// `id` None, creates the record empty if there is none (a node starting the epoch).
pub(super) fn record_changed(
    driver: &dyn Driver,
    epoch: u32,
    id: Option<u64>,
) -> Result<(), DriverError> {
    add_id(driver, &keys::changed(epoch), id)
}

/// Adds `id` to the list of node ids at `key` (blocking); with `id` None, creates the list
/// empty if there is none.
fn add_id(driver: &dyn Driver, key: &str, id: Option<u64>) -> Result<(), DriverError> {
    loop {
        let cur = driver.kv_get(key)?;
        let mut ids: Vec<u64> = cur
            .as_deref()
            .and_then(|v| serde_json::from_slice(v).ok())
            .unwrap_or_default();
        match id {
            None if cur.is_some() => return Ok(()),
            Some(id) if ids.contains(&id) => return Ok(()),
            Some(id) => ids.push(id),
            None => {}
        }
        let new = serde_json::to_vec(&ids).expect("serializable");
        if driver.kv_cas(key, cur.as_deref(), Some(&new))? {
            return Ok(());
        }
    }
}

impl super::Node {
    /// Before this node applies a change checked against epoch `e`: records once per epoch, in
    /// the cluster store, that it takes changes in `e` (see the module documentation). A
    /// change is refused (`Busy`: the client retries) while that cannot be recorded.
    pub(super) async fn note_change(&self, e: u32) -> Result<(), super::server::Failure> {
        use std::sync::atomic::Ordering;
        if self.noted.load(Ordering::Acquire) >= e {
            return Ok(());
        }
        let _one = self.noting.lock().await;
        if self.noted.load(Ordering::Acquire) >= e {
            return Ok(());
        }
        let (d, id) = (self.driver.clone(), self.me.id);
        let busy = |why: String| {
            super::server::Failure::new(
                objstore_proto::frame::ResultCode::Busy,
                format!("recording that this node takes changes in epoch {e}: {why}"),
            )
        };
        match self
            .blocking(move || record_changed(&*d, e, Some(id)))
            .await
        {
            Ok(Ok(())) => {
                self.noted.fetch_max(e, Ordering::AcqRel);
                Ok(())
            }
            Ok(Err(err)) => Err(busy(err.to_string())),
            Err(err) => Err(busy(err.to_string())),
        }
    }
}

/// Records that node `id` finished recovering `epoch` (blocking).
pub(super) fn record_recovered(
    driver: &dyn Driver,
    epoch: u32,
    id: u64,
) -> Result<(), DriverError> {
    add_id(driver, &keys::recovered(epoch), Some(id))
}

/// An epoch in which some objects may have no owner up now.
struct Uncovered {
    epoch: u32,
    ring: Ring,
    /// Its nodes not listed now that may hold changes of it.
    absent: HashSet<u64>,
    /// Its nodes not listed now.
    unlisted: HashSet<u64>,
}

/// Which objects a node may serve in its current epoch (see the module documentation).
pub(super) struct Safety {
    /// The epoch judged (0 for [`Safety::all`] before any).
    epoch: u32,
    copies: usize,
    uncovered: Vec<Uncovered>,
    /// Every epoch since the base with a node absent: what a strip's key (one holder an
    /// epoch) is judged by ([`Safety::knows_strip`]).
    strips: Vec<Uncovered>,
}

impl Safety {
    /// Every object is safe.
    pub fn all() -> Safety {
        Safety {
            epoch: 0,
            copies: 0,
            uncovered: Vec::new(),
            strips: Vec::new(),
        }
    }

    /// Judges epoch `cur` from `history`, with `present` the nodes whose copies were listed.
    pub fn judge(
        history: &History,
        cur: u32,
        present: &HashSet<u64>,
        copies: usize,
        min_copies: usize,
    ) -> Safety {
        if history.forced >= cur {
            return Safety {
                epoch: cur,
                ..Safety::all()
            };
        }
        let base = history.clean.max(history.forced);
        let mut uncovered = Vec::new();
        let mut strips = Vec::new();
        for (i, view) in history.views.iter().enumerate() {
            let owners = copies.min(view.nodes.len());
            // The base epoch counts whatever its size; later ones only if a change could
            // have succeeded in them (for strips, whose scheme is not known here: any).
            let is_base = view.epoch == base || (base == 0 && i == 0);
            let copies_count = is_base || owners >= min_copies;
            // Past the base epoch, a node that took no change there hides nothing of it.
            let took = (!is_base)
                .then(|| history.changed.get(&view.epoch))
                .flatten();
            // Every node of the epoch not listed now, whatever it took: a strip's one holder
            // may hold it from a pull, which records no change.
            let unlisted: HashSet<u64> = (view.nodes.iter())
                .map(|n| n.id)
                .filter(|id| !present.contains(id))
                .collect();
            if unlisted.is_empty() {
                continue;
            }
            let absent: HashSet<u64> = (unlisted.iter().copied())
                .filter(|id| took.is_none_or(|t| t.contains(id)))
                .collect();
            let u = Uncovered {
                epoch: view.epoch,
                ring: Ring::new(&view.nodes),
                absent,
                unlisted,
            };
            if copies_count && !u.absent.is_empty() && u.absent.len() >= owners {
                uncovered.push(Uncovered {
                    epoch: u.epoch,
                    ring: u.ring.clone(),
                    absent: u.absent.clone(),
                    unlisted: u.unlisted.clone(),
                });
            }
            strips.push(u);
        }
        Safety {
            epoch: cur,
            copies,
            uncovered,
            strips,
        }
    }

    /// Whether this node, holding (or not) strip key `key`, knows its newest version: the
    /// holder of that strip in every epoch since the base is up and listed (whether or not
    /// it recorded taking changes there). A holder that has
    /// nothing of a strip says it was never made only then; otherwise the strip may be newer
    /// on a node that is down.
    pub fn knows_strip(&self, key: ObjectId) -> bool {
        // Not only the holders that took changes: one may hold the strip from a pull, and be
        // its only holder (seed 70588 with crashes and SIM_EC=2:1: a holder that answered
        // "never made" while the node it would pull from was not listed yet).
        self.strips.iter().all(|u| {
            u.ring
                .replicas(key, 1)
                .iter()
                .any(|n| !u.unlisted.contains(&n.id))
        })
    }

    /// Whether node `me`, holding a copy of strip key `key` known to hold every change of the
    /// strip made before epoch `current` ([`crate::node::ec::Note::current`]), may vouch
    /// that it is the newest: every epoch since the base in which the strip's holder is
    /// absent (not listed now, and took changes there, or the epoch is the base or has no
    /// record) is older than `current`, or had `me` for that holder (it took the epoch's
    /// changes). A holder listed now needs nothing: recovery pulls its copy if it is newer.
    ///
    /// Being a member of an epoch is not enough: a node keeps the copy of a strip it held
    /// before the strip moved on, and the strip's holder since may have taken changes and be
    /// down now (the stale-copy hole: seed 109 with `SIM_EC=2:2 SIM_EC_VDIS=1` at 82a7ae9
    /// took an acknowledged write back over such a copy, answered sure). Nor is a node back
    /// from a crash (seed 70393 with crashes and SIM_EC=2:1): it was no holder of the epochs
    /// it missed.
    pub fn knows_present_strip(&self, key: ObjectId, me: u64, current: u32) -> bool {
        // Only a holder that took changes there (or of the base epoch, or of an epoch without
        // a record) can hold a newer version than every node listed: a copy it pulled is as
        // old as its source's, which the epoch the source held it in answers for, and a
        // rebuild (`Put`) records no change, as it makes no version (else every node a
        // rebuild reached after a failure hid the strips it held, and a 4:2 stripe with two
        // nodes lost one after the other waited for them: ec_fio, cached).
        self.strips.iter().all(|u| {
            u.epoch < current
                || u.ring
                    .replicas(key, 1)
                    .iter()
                    .any(|n| n.id == me || !u.absent.contains(&n.id))
        })
    }

    /// The epoch a copy of strip key `key` that node `me` installs whole now, pulled with
    /// `current` from its source, holds every change before: the epoch judged if `me` may
    /// vouch for it ([`Safety::knows_present_strip`]; it is then the newest, and `me` its
    /// holder from now on), else what the source knew.
    pub fn installed_current(&self, key: ObjectId, me: u64, current: u32) -> u32 {
        if self.knows_present_strip(key, me, current) {
            current.max(self.epoch)
        } else {
            current
        }
    }

    /// Whether the strips of erasure-coded object `oid` (`width` strips, changes acknowledged
    /// with `min` of them) at hand show its newest version: in every epoch since the base, an
    /// acknowledged change reached `min` strips' holders, so fewer than `min` of them absent
    /// leaves one that holds it. Otherwise the nodes to wait for and the newest such epoch:
    /// resolving the stripe without them could take an older version for the newest and
    /// serve it over acknowledged writes.
    pub fn stripe_waiting_for(
        &self,
        oid: ObjectId,
        width: usize,
        min: usize,
    ) -> Option<(Vec<SocketAddr>, u32)> {
        let mut addrs = Vec::new();
        let mut epoch = 0;
        for u in &self.strips {
            let absent: Vec<SocketAddr> = (0..width)
                .filter_map(|k| u.ring.strip_holder(oid, k))
                .map(|i| &u.ring.nodes()[i])
                .filter(|n| u.absent.contains(&n.id))
                .map(|n| n.addr)
                .collect();
            if absent.len() >= min.max(1) {
                addrs.extend(absent);
                epoch = epoch.max(u.epoch);
            }
        }
        addrs.sort();
        addrs.dedup();
        (!addrs.is_empty()).then_some((addrs, epoch))
    }

    /// No object can have a newer version only on nodes that are down.
    pub fn is_complete(&self) -> bool {
        self.uncovered.is_empty()
    }

    /// Whether the copies listed now include the newest version of `oid`.
    pub fn safe(&self, oid: ObjectId) -> bool {
        // A strip's newest version is its stripe's, judged from every strip at hand by the
        // object's primary (docs/architecture.md, "Erasure-coded objects", rule 4): a strip
        // whose one holder is down is rebuilt from the others, not waited for.
        if oid.strip_index().is_some() {
            return true;
        }
        self.uncovered.iter().all(|u| {
            u.ring
                .replicas(oid, self.copies)
                .iter()
                .any(|n| !u.absent.contains(&n.id))
        })
    }

    /// The nodes to wait for (for `oid`, or for any object), and the newest epoch in which
    /// they could have taken writes.
    pub fn waiting_for(&self, oid: Option<ObjectId>) -> (Vec<SocketAddr>, u32) {
        let mut addrs = Vec::new();
        let mut epoch = 0;
        for u in &self.uncovered {
            let nodes: Vec<SocketAddr> = match oid {
                Some(oid) => {
                    let owners = u.ring.replicas(oid, self.copies);
                    if owners.iter().any(|n| !u.absent.contains(&n.id)) {
                        continue;
                    }
                    owners.iter().map(|n| n.addr).collect()
                }
                None => u
                    .ring
                    .nodes()
                    .iter()
                    .filter(|n| u.absent.contains(&n.id))
                    .map(|n| n.addr)
                    .collect(),
            };
            addrs.extend(nodes);
            epoch = epoch.max(u.epoch);
        }
        addrs.sort();
        addrs.dedup();
        (addrs, epoch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use objstore_proto::oid::{ObjIndex, Vid};
    use objstore_proto::view::NodeInfo;

    fn node(id: u64) -> NodeInfo {
        NodeInfo {
            id,
            addr: SocketAddr::from(([127, 0, 0, 1], 7000 + id as u16)),
            zone: id as u32,
            vnodes: 64,
            incarnation: 1,
        }
    }

    fn view(epoch: u32, ids: &[u64]) -> View {
        View {
            epoch,
            nodes: ids.iter().map(|&i| node(i)).collect(),
        }
    }

    fn present(ids: &[u64]) -> HashSet<u64> {
        ids.iter().copied().collect()
    }

    /// Issue 22, scenario 1: A down, a write at epoch 2 on B and C, then B and C down and A
    /// back alone. A must not serve its old copies; B or C back is enough.
    #[test]
    fn a_node_back_alone_waits_for_the_last_writers() {
        let h = History {
            clean: 2,
            changed: BTreeMap::new(),
            forced: 0,
            views: vec![view(2, &[2, 3]), view(3, &[1])],
        };
        let oid = ObjectId::data(Vid(1), ObjIndex(0));
        let s = Safety::judge(&h, 4, &present(&[1]), 3, 2);
        assert!(!s.is_complete());
        assert!(!s.safe(oid));
        let (addrs, epoch) = s.waiting_for(Some(oid));
        assert_eq!(addrs, vec![node(2).addr, node(3).addr]);
        assert_eq!(epoch, 2);
        // Epoch 3 had one owner, below min-copies: nothing was written there, so B is enough.
        let s = Safety::judge(&h, 4, &present(&[1, 2]), 3, 2);
        assert!(s.is_complete() && s.safe(oid));
    }

    #[test]
    fn a_rolling_restart_never_waits() {
        // Clean at 2 with B and C; A is back.
        let h = History {
            clean: 2,
            changed: BTreeMap::new(),
            forced: 0,
            views: vec![view(2, &[2, 3])],
        };
        let s = Safety::judge(&h, 3, &present(&[1, 2, 3]), 3, 2);
        assert!(s.is_complete());
        // One dead node out of four with three copies: every object keeps an owner.
        let h = History {
            clean: 1,
            changed: BTreeMap::new(),
            forced: 0,
            views: vec![view(1, &[1, 2, 3, 4])],
        };
        assert!(Safety::judge(&h, 2, &present(&[1, 2, 3]), 3, 2).is_complete());
    }

    #[test]
    fn one_copy_waits_per_object_and_force_accepts() {
        let h = History {
            clean: 1,
            changed: BTreeMap::new(),
            forced: 0,
            views: vec![view(1, &[1, 2])],
        };
        let s = Safety::judge(&h, 2, &present(&[1]), 1, 1);
        assert!(!s.is_complete());
        let objs: Vec<ObjectId> = (0..64)
            .map(|i| ObjectId::data(Vid(1), ObjIndex(i)))
            .collect();
        let safe = objs.iter().filter(|o| s.safe(**o)).count();
        assert!(safe > 0 && safe < objs.len(), "{safe}");
        let forced = History { forced: 2, ..h };
        assert!(Safety::judge(&forced, 2, &present(&[1]), 1, 1).is_complete());
    }

    /// Issue 43: a node joins (epoch 2), takes no change, and dies. Epoch 2 is not clean (it
    /// never recovered there), but it took nothing: nobody waits for it. Had it taken a change
    /// there, every object it owned in epoch 2 would wait for it, as before.
    #[test]
    fn a_node_that_took_no_change_is_not_waited_for() {
        let oid = |i| ObjectId::data(Vid(1), ObjIndex(i));
        let h = |took: &[u64]| History {
            clean: 1,
            changed: BTreeMap::from([(2, took.iter().copied().collect())]),
            forced: 0,
            views: vec![view(1, &[1]), view(2, &[1, 2])],
        };
        // One copy: node 2 owned some objects in epoch 2.
        let s = Safety::judge(&h(&[1]), 3, &present(&[1]), 1, 1);
        assert!(s.is_complete(), "node 2 took no change in epoch 2");
        let s = Safety::judge(&h(&[1, 2]), 3, &present(&[1]), 1, 1);
        assert!(!s.is_complete());
        let waiting = (0..64).filter(|&i| !s.safe(oid(i))).count();
        assert!(waiting > 0 && waiting < 64, "{waiting}");
        // No record of epoch 2 (nodes from before records): judged as before.
        let none = History {
            changed: BTreeMap::new(),
            ..h(&[1])
        };
        assert!(!Safety::judge(&none, 3, &present(&[1]), 1, 1).is_complete());
    }

    /// A strip's one holder may hold it from a pull, which records no change: a node that took
    /// no change in an epoch but is not listed now still leaves the holders of the strips it
    /// held there unsure that nothing is newer (seed 70588's shape, with SIM_EC=2:1).
    #[test]
    fn a_strip_holder_not_listed_is_waited_for_though_it_took_no_change() {
        let h = History {
            clean: 1,
            changed: BTreeMap::from([(2, HashSet::from([1]))]),
            forced: 0,
            views: vec![view(1, &[1]), view(2, &[1, 2])],
        };
        let s = Safety::judge(&h, 3, &present(&[1]), 1, 1);
        assert!(s.is_complete(), "no change of epoch 2 can be hidden");
        let keys: Vec<ObjectId> = (0..64)
            .map(|i| ObjectId::data(Vid(1), ObjIndex(i)).strip(0))
            .collect();
        let unsure = keys.iter().filter(|&&k| !s.knows_strip(k)).count();
        assert!(unsure > 0 && unsure < 64, "{unsure}");
        let s = Safety::judge(&h, 3, &present(&[1, 2]), 1, 1);
        assert!(keys.iter().all(|&k| s.knows_strip(k)));
    }

    /// The stale-copy hole: a member of an epoch keeps the copy of a strip it held before
    /// the strip moved to a node that joined; that node may have taken changes there and is
    /// down now, so the member's copy is sure only if it holds every change of that epoch
    /// (installed whole since) or the member held the strip there itself.
    #[test]
    fn a_copy_kept_by_a_member_that_did_not_hold_the_strip_is_unsure() {
        let h = History {
            clean: 1,
            changed: BTreeMap::from([(2, HashSet::from([1, 2, 3, 4]))]),
            forced: 0,
            views: vec![view(1, &[1, 2, 3]), view(2, &[1, 2, 3, 4])],
        };
        let s = Safety::judge(&h, 3, &present(&[1, 2, 3]), 1, 1);
        let e2 = Ring::new(&view(2, &[1, 2, 3, 4]).nodes);
        let keys: Vec<ObjectId> = (0..64)
            .map(|i| ObjectId::data(Vid(1), ObjIndex(i)).strip(0))
            .collect();
        let held_by = |k: ObjectId| e2.replicas(k, 1)[0].id;
        let (moved, stayed): (Vec<ObjectId>, Vec<ObjectId>) =
            keys.iter().partition(|&&k| held_by(k) == 4);
        assert!(!moved.is_empty() && !stayed.is_empty());
        for &k in &moved {
            // Every member but the holder that is down: its copy is from before epoch 2.
            for me in 1..=3 {
                assert!(!s.knows_present_strip(k, me, 0), "{k} on {me}");
                assert!(!s.knows_present_strip(k, me, 2), "{k} on {me}");
                assert!(s.knows_present_strip(k, me, 3), "installed in epoch 3");
                assert_eq!(s.installed_current(k, me, 2), 2, "not vouched for");
            }
        }
        for &k in &stayed {
            // The holder of epoch 2 is listed, or is this node.
            assert!((1..=3).all(|me| s.knows_present_strip(k, me, 0)), "{k}");
            assert_eq!(s.installed_current(k, held_by(k), 0), 3);
        }
        // Node 4 back: nothing is hidden.
        let s = Safety::judge(&h, 3, &present(&[1, 2, 3, 4]), 1, 1);
        assert!(keys.iter().all(|&k| s.knows_present_strip(k, 1, 0)));
        // Node 4 took no change in epoch 2 (pulls and rebuilds only): it holds no version
        // newer than the nodes listed, and hides nothing.
        let quiet = History {
            changed: BTreeMap::from([(2, HashSet::from([1, 2, 3]))]),
            ..h
        };
        let s = Safety::judge(&quiet, 3, &present(&[1, 2, 3]), 1, 1);
        assert!(moved.iter().all(|&k| s.knows_present_strip(k, 1, 0)));
    }
}
