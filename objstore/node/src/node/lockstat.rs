//! Lock hand-overs in the node's metrics (issue 42): mounts ask each other for a VDI's lock
//! through the key-value store (`lock-req/<vdi>`, then `lock/<vdi>` taken by the asker), and
//! the node that served each change counts it. Summed over the nodes:
//! - `sheep_lock_handover_requests_total`: requests made (a mount asked the holder);
//! - `sheep_lock_handovers_total`: locks taken by a mount that had asked for them (a hand-over
//!   done; the holder gave it, or its lease ended).

use objstore_proto::keys;

use super::Node;

/// The owner named in a lock or lock request record (JSON), if it has one.
fn owner(record: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(record).ok()?;
    v.get("owner")?.as_str().map(str::to_string)
}

/// After a key-value change the node made (`key` from nothing, or from something, to
/// `new`): counts it if it is a lock request, or a lock taken by the mount that asked.
pub(super) async fn changed(node: &Node, key: &str, created: bool, new: Option<&[u8]>) {
    let (Some(new), true) = (new, created) else {
        return;
    };
    let registry = node.metrics().registry();
    if key.starts_with(keys::LOCK_REQUEST_PREFIX) {
        registry
            .counter(
                "sheep_lock_handover_requests_total",
                "Requests for a VDI's lock made to its holder through this node (cooperative lock mode).",
                &[],
            )
            .inc();
        return;
    }
    let Some(vdi) = key.strip_prefix(keys::LOCK_PREFIX) else {
        return;
    };
    // Taken from free: by the mount that asked for it, while its request stands?
    let (d, req_key) = (node.driver.clone(), keys::lock_request(vdi));
    let Ok(Ok(Some(req))) = node.blocking(move || d.kv_get(&req_key)).await else {
        return;
    };
    if owner(&req).is_some_and(|o| Some(o) == owner(new)) {
        registry
            .counter(
                "sheep_lock_handovers_total",
                "VDI locks taken through this node by the mount that had asked their holder for them (cooperative lock mode).",
                &[],
            )
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_of_records() {
        assert_eq!(
            owner(br#"{"vdi":"x","owner":"h/mount:/m","gen":3}"#).as_deref(),
            Some("h/mount:/m")
        );
        assert_eq!(owner(b"not json"), None);
        assert_eq!(owner(br#"{"vdi":"x"}"#), None);
    }
}
