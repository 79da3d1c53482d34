//! The in-memory driver: every node of one simulated cluster holds a [`MemDriver`] on one
//! shared [`MemMembership`] (epochs, heartbeats, the key-value store behind one mutex), so a
//! whole cluster runs in one process without a state directory.
//!
//! Liveness comes from tokio's clock ([`tokio::time::Instant`]): a node whose last tick is
//! older than [`super::DEAD_AFTER`] is dropped by the next tick of any node. Under a paused
//! clock (the fault simulator) this is deterministic: the same ticks at the same simulated
//! times give the same epochs. It keeps the contract of [`super::Driver`]; calls never block.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

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
}

impl Shared {
    fn latest(&self) -> View {
        self.views.last().cloned().unwrap_or_default()
    }

    /// Drops silent nodes, then makes one new epoch if the live set changed.
    fn refresh(&mut self) -> View {
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

    // Leases: being built (helper branch "leases"); refused until then.
    fn kv_cas_leased(
        &self,
        _k: &str,
        _e: Option<&[u8]>,
        _n: &[u8],
        _l: u64,
    ) -> Result<bool, DriverError> {
        Err(DriverError::UnknownDriver("leases (not built yet)".into()))
    }
    fn lease_grant(&self, _ttl: std::time::Duration) -> Result<u64, DriverError> {
        Err(DriverError::UnknownDriver("leases (not built yet)".into()))
    }
    fn lease_keepalive(&self, _lease: u64) -> Result<bool, DriverError> {
        Err(DriverError::UnknownDriver("leases (not built yet)".into()))
    }
    fn lease_revoke(&self, _lease: u64) -> Result<(), DriverError> {
        Err(DriverError::UnknownDriver("leases (not built yet)".into()))
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
        Ok(self.cluster.shared.lock().unwrap().kv.get(key).cloned())
    }

    fn kv_cas(
        &self,
        key: &str,
        expected: Option<&[u8]>,
        new: Option<&[u8]>,
    ) -> Result<bool, DriverError> {
        let mut st = self.cluster.shared.lock().unwrap();
        if st.kv.get(key).map(Vec::as_slice) != expected {
            return Ok(false);
        }
        match new {
            Some(v) => st.kv.insert(key.to_string(), v.to_vec()),
            None => st.kv.remove(key),
        };
        Ok(true)
    }

    fn kv_list(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, DriverError> {
        let st = self.cluster.shared.lock().unwrap();
        Ok(st
            .kv
            .range(prefix.to_string()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

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
}
