//! The in-memory driver: every node of one simulated cluster holds a [`MemDriver`] on one
//! shared [`MemMembership`] (epochs, heartbeats, the key-value store behind one mutex), so a
//! whole cluster runs in one process without a state directory.
//!
//! Liveness comes from tokio's clock ([`tokio::time::Instant`]): a node whose last tick is
//! older than [`super::DEAD_AFTER`] is dropped by the next tick of any node. Under a paused
//! clock (the fault simulator) this is deterministic: the same ticks at the same simulated
//! times give the same epochs. It keeps the contract of [`super::Driver`]; calls never block.
//!
//! Leases run on the same clock: a lease past its deadline is ended, with the keys bound to
//! it, by the next call that touches the store. Lease ids count up from 1 (deterministic
//! under the simulator, unlike the local driver's random ids).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::{Driver, DriverError, DEAD_AFTER};
use objstore_proto::view::{NodeInfo, View};

#[derive(Default)]
struct Shared {
    /// Every epoch ever made; `views[i]` is epoch `i + 1`.
    views: Vec<View>,
    /// Registered nodes by id, with the time of their last tick.
    nodes: BTreeMap<u64, (NodeInfo, Instant)>,
    kv: BTreeMap<String, Vec<u8>>,
    /// Keys bound to a lease, with its id.
    bound: BTreeMap<String, u64>,
    /// Live leases: their TTL and deadline.
    leases: BTreeMap<u64, (Duration, Instant)>,
    last_lease: u64,
}

impl Shared {
    /// Ends every lease past its deadline, with its keys.
    fn expire(&mut self) {
        let now = Instant::now();
        let ended: Vec<u64> = self
            .leases
            .iter()
            .filter(|(_, (_, deadline))| *deadline <= now)
            .map(|(id, _)| *id)
            .collect();
        for id in ended {
            tracing::debug!("membership (memory): lease {id} expired");
            self.end_lease(id);
        }
    }

    fn end_lease(&mut self, id: u64) {
        self.leases.remove(&id);
        let keys: Vec<String> = self
            .bound
            .iter()
            .filter(|(_, l)| **l == id)
            .map(|(k, _)| k.clone())
            .collect();
        for k in keys {
            self.bound.remove(&k);
            self.kv.remove(&k);
        }
    }

    fn latest(&self) -> View {
        self.views.last().cloned().unwrap_or_default()
    }

    /// Drops silent nodes, then makes one new epoch if the live set changed.
    fn refresh(&mut self) -> View {
        self.expire();
        let now = Instant::now();
        self.nodes
            .retain(|_, (_, beat)| now.saturating_duration_since(*beat) < DEAD_AFTER);
        // BTreeMap order: the node list is sorted by id, as the contract wants.
        let live: Vec<NodeInfo> = self.nodes.values().map(|(n, _)| n.clone()).collect();
        let cur = self.latest();
        if cur.nodes == live {
            return cur;
        }
        let next = View {
            epoch: cur.epoch + 1,
            nodes: live,
        };
        tracing::debug!(
            "membership (memory): epoch {} with {} node(s)",
            next.epoch,
            next.nodes.len()
        );
        self.views.push(next.clone());
        next
    }
}

/// The state every node of one in-memory cluster shares; cheap to clone (an `Arc`).
#[derive(Clone)]
pub struct MemMembership {
    id: String,
    shared: Arc<Mutex<Shared>>,
}

impl MemMembership {
    /// A new, empty membership store of a cluster named `cluster_id`.
    pub fn new(cluster_id: &str) -> MemMembership {
        MemMembership {
            id: cluster_id.to_string(),
            shared: Arc::default(),
        }
    }

    /// A driver for one node of this cluster.
    pub fn driver(&self) -> MemDriver {
        MemDriver {
            cluster: self.clone(),
            me: Mutex::new(None),
        }
    }

    /// The newest epoch (0 before any node joined).
    pub fn latest(&self) -> View {
        self.shared.lock().unwrap().latest()
    }
}

/// One node's handle on a [`MemMembership`].
pub struct MemDriver {
    cluster: MemMembership,
    me: Mutex<Option<NodeInfo>>,
}

impl Driver for MemDriver {
    fn describe(&self) -> String {
        format!("memory:{}", self.cluster.id)
    }

    fn cluster_id(&self) -> Result<String, DriverError> {
        Ok(self.cluster.id.clone())
    }

    fn join(&self, me: &NodeInfo) -> Result<View, DriverError> {
        *self.me.lock().unwrap() = Some(me.clone());
        let mut st = self.cluster.shared.lock().unwrap();
        // A restart (new incarnation) replaces the old record: one change of the live set.
        st.nodes.insert(me.id, (me.clone(), Instant::now()));
        Ok(st.refresh())
    }

    fn tick(&self) -> Result<View, DriverError> {
        let me = self.me.lock().unwrap().clone();
        let mut st = self.cluster.shared.lock().unwrap();
        if let Some(me) = me {
            // The heartbeat re-registers a node dropped while it was silent (as the local
            // driver's record rewrite does), but an old incarnation that still ticks never
            // refreshes or replaces a newer one's record.
            match st.nodes.get_mut(&me.id) {
                Some((n, beat)) if n.incarnation == me.incarnation => *beat = Instant::now(),
                Some(_) => {}
                None => {
                    st.nodes.insert(me.id, (me, Instant::now()));
                }
            }
        }
        Ok(st.refresh())
    }

    fn leave(&self) -> Result<(), DriverError> {
        let me = self.me.lock().unwrap().take();
        if let Some(me) = me {
            let mut st = self.cluster.shared.lock().unwrap();
            if st
                .nodes
                .get(&me.id)
                .is_some_and(|(n, _)| n.incarnation == me.incarnation)
            {
                st.nodes.remove(&me.id);
            }
            st.refresh();
        }
        Ok(())
    }

    fn view_at(&self, epoch: u32) -> Result<Option<View>, DriverError> {
        if epoch == 0 {
            return Ok(Some(View::default()));
        }
        let st = self.cluster.shared.lock().unwrap();
        Ok(st.views.get(epoch as usize - 1).cloned())
    }

    fn kv_get(&self, key: &str) -> Result<Option<Vec<u8>>, DriverError> {
        let mut st = self.cluster.shared.lock().unwrap();
        st.expire();
        Ok(st.kv.get(key).cloned())
    }

    fn kv_cas(
        &self,
        key: &str,
        expected: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<bool, DriverError> {
        let mut st = self.cluster.shared.lock().unwrap();
        st.expire();
        if st.kv.get(key).map(Vec::as_slice) != expected {
            return Ok(false);
        }
        // A plain write unbinds the key from its lease.
        st.bound.remove(key);
        match new {
            Some(v) => st.kv.insert(key.to_string(), v.to_vec()),
            None => st.kv.remove(key),
        };
        Ok(true)
    }

    fn kv_list(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, DriverError> {
        let mut st = self.cluster.shared.lock().unwrap();
        st.expire();
        Ok(st
            .kv
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }

    fn kv_cas_leased(
        &self,
        key: &str,
        expected: Option<&[u8]>,
        new: &[u8],
        lease: u64,
    ) -> Result<bool, DriverError> {
        let mut st = self.cluster.shared.lock().unwrap();
        st.expire();
        if !st.leases.contains_key(&lease) || st.kv.get(key).map(Vec::as_slice) != expected {
            return Ok(false);
        }
        st.kv.insert(key.to_string(), new.to_vec());
        st.bound.insert(key.to_string(), lease);
        Ok(true)
    }

    fn lease_grant(&self, ttl: Duration) -> Result<u64, DriverError> {
        // Whole seconds, at least one, as the contract has it.
        let ttl = Duration::from_secs((ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0)).max(1));
        let mut st = self.cluster.shared.lock().unwrap();
        st.expire();
        st.last_lease += 1;
        let id = st.last_lease;
        st.leases.insert(id, (ttl, Instant::now() + ttl));
        Ok(id)
    }

    fn lease_keepalive(&self, lease: u64) -> Result<bool, DriverError> {
        let mut st = self.cluster.shared.lock().unwrap();
        st.expire();
        match st.leases.get_mut(&lease) {
            Some((ttl, deadline)) => {
                *deadline = Instant::now() + *ttl;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    fn lease_revoke(&self, lease: u64) -> Result<(), DriverError> {
        let mut st = self.cluster.shared.lock().unwrap();
        st.end_lease(lease);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(id: u64, incarnation: u64) -> NodeInfo {
        NodeInfo {
            id,
            addr: format!("127.0.0.1:{}", 7000 + id).parse().unwrap(),
            zone: id as u32,
            vnodes: 8,
            incarnation,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn one_epoch_per_change_and_silent_nodes_drop() {
        let m = MemMembership::new("c");
        let (a, b) = (m.driver(), m.driver());
        let v1 = a.join(&node(1, 1)).unwrap();
        assert_eq!((v1.epoch, v1.nodes.len()), (1, 1));
        let v2 = b.join(&node(2, 1)).unwrap();
        assert_eq!((v2.epoch, v2.nodes.len()), (2, 2));
        assert_eq!(a.tick().unwrap(), v2, "no change, no new epoch");
        // b goes silent; a keeps ticking.
        tokio::time::advance(DEAD_AFTER / 2).await;
        assert_eq!(a.tick().unwrap().epoch, 2);
        tokio::time::advance(DEAD_AFTER / 2 + Duration::from_millis(1)).await;
        let v3 = a.tick().unwrap();
        assert_eq!((v3.epoch, v3.nodes), (3, vec![node(1, 1)]));
        // A restart with a new incarnation is one change; the old incarnation cannot revive
        // or refresh the record.
        let v4 = b.join(&node(2, 2)).unwrap();
        assert_eq!(
            (v4.epoch, v4.nodes.clone()),
            (4, vec![node(1, 1), node(2, 2)])
        );
        let b_old = m.driver();
        *b_old.me.lock().unwrap() = Some(node(2, 1));
        assert_eq!(b_old.tick().unwrap(), v4);
        b_old.leave().unwrap();
        assert_eq!(
            a.tick().unwrap(),
            v4,
            "a stale incarnation's leave is ignored"
        );
        b.leave().unwrap();
        let v5 = a.tick().unwrap();
        assert_eq!((v5.epoch, v5.nodes.clone()), (5, vec![node(1, 1)]));
        assert_eq!(a.view_at(2).unwrap(), Some(v2));
        assert_eq!(a.view_at(6).unwrap(), None);
        assert_eq!(m.latest(), v5);
    }

    #[test]
    fn kv_cas_and_list() {
        let m = MemMembership::new("c");
        let a = m.driver();
        assert!(a.kv_cas("vdi/x", None, Some(b"1")).unwrap());
        assert!(!a.kv_cas("vdi/x", None, Some(b"2")).unwrap());
        assert!(a.kv_cas("vdi/x", Some(b"1"), Some(b"2")).unwrap());
        assert!(a.kv_cas("vdi/y", None, Some(b"3")).unwrap());
        assert!(a.kv_cas("w", None, Some(b"4")).unwrap());
        assert_eq!(
            m.driver().kv_list("vdi/").unwrap(),
            vec![
                ("vdi/x".into(), b"2".to_vec()),
                ("vdi/y".into(), b"3".to_vec())
            ]
        );
        assert!(a.kv_cas("vdi/x", Some(b"2"), None).unwrap());
        assert_eq!(a.kv_get("vdi/x").unwrap(), None);
        assert_eq!(a.cluster_id().unwrap(), "c");
    }

    #[tokio::test(start_paused = true)]
    async fn leases() {
        let m = MemMembership::new("c");
        let (a, b) = (m.driver(), m.driver());
        let sec = Duration::from_secs(1);
        let l = a.lease_grant(2 * sec).unwrap();
        assert_ne!(l, 0);
        assert!(a.kv_cas_leased("lock/x", None, b"1", l).unwrap());
        assert!(!a.kv_cas_leased("lock/x", None, b"2", l).unwrap(), "a cas");
        assert_eq!(b.kv_get("lock/x").unwrap(), Some(b"1".to_vec()));
        // Renewals (from another node) keep it alive past its first deadline.
        for _ in 0..4 {
            tokio::time::advance(sec).await;
            assert!(b.lease_keepalive(l).unwrap());
        }
        assert_eq!(a.kv_list("lock/").unwrap().len(), 1);
        // Left alone, it ends with its key.
        tokio::time::advance(2 * sec).await;
        assert_eq!(b.kv_list("lock/").unwrap(), vec![]);
        assert_eq!(a.kv_get("lock/x").unwrap(), None);
        assert!(!a.lease_keepalive(l).unwrap(), "an ended lease stays ended");
        assert!(!a.kv_cas_leased("lock/x", None, b"3", l).unwrap());
        assert_eq!(a.kv_get("lock/x").unwrap(), None);

        // Revoke removes its keys at once, and only its keys; a plain cas unbinds a key.
        let l2 = a.lease_grant(30 * sec).unwrap();
        assert_ne!(l2, l);
        assert!(a.kv_cas_leased("lock/y", None, b"y", l2).unwrap());
        assert!(a.kv_cas_leased("lock/z", None, b"z", l2).unwrap());
        assert!(a.kv_cas("lock/w", None, Some(b"w")).unwrap());
        assert!(a.kv_cas("lock/z", Some(b"z"), Some(b"z2")).unwrap());
        b.lease_revoke(l2).unwrap();
        b.lease_revoke(l2).unwrap(); // unknown: not an error
        assert!(!a.lease_keepalive(l2).unwrap());
        assert_eq!(
            a.kv_list("lock/").unwrap(),
            vec![
                ("lock/w".into(), b"w".to_vec()),
                ("lock/z".into(), b"z2".to_vec())
            ]
        );
        // A TTL under a second is a second.
        let l3 = a.lease_grant(Duration::from_millis(100)).unwrap();
        assert!(a.kv_cas_leased("lock/v", None, b"v", l3).unwrap());
        tokio::time::advance(Duration::from_millis(900)).await;
        assert!(a.kv_get("lock/v").unwrap().is_some());
        tokio::time::advance(Duration::from_millis(100)).await;
        assert!(a.tick().is_ok());
        assert!(a.kv_get("lock/v").unwrap().is_none());
    }
}
