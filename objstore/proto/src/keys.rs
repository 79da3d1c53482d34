//! Key names in the cluster's key-value store (the membership driver's store). Every part that
//! reads or writes a key builds it here, so the layout is written down once.
//!
//! | key | value |
//! |---|---|
//! | `cluster` | the cluster format ([`crate::view::ClusterConfig`], JSON) |
//! | `vdi-next-vid` | the next VDI id to hand out (decimal) |
//! | `vdi/<name>` | the VDI table: `{"vid": N}` |
//! | `vdi/<name>@<tag>` | a snapshot of VDI `<name>`: `{"vid": N}` (the frozen inode) |
//! | `vdi-hidden/<vid>` | a deleted snapshot or VDI whose inode stays while others still read its objects or name it as an ancestor: `{"name": "...", "tag": "..."}` |
//! | `lock/<name>` | who holds the VDI's read-write attachment (JSON) |
//! | `vdi-gen/<name>` | the VDI's attachment generation (decimal, absent = 0) |
//! | `lock-req/<name>` | a mount asking the holder of `lock/<name>` to hand it over (JSON, bound to a lease) |
//! | `recovered/<epoch>` | ids of the nodes that finished recovery of that epoch (JSON list) |
//! | `recovery-forced` | the epoch in which an operator accepted possible loss (`dog cluster recover --force`) |

/// The cluster format.
pub const CONFIG: &str = "cluster";
/// The VDI id counter.
pub const NEXT_VID: &str = "vdi-next-vid";
/// Prefix of the VDI table.
pub const VDI_PREFIX: &str = "vdi/";
/// Prefix of the deleted inodes kept for others (`vdi-hidden/<vid>`, vid in decimal).
pub const HIDDEN_PREFIX: &str = "vdi-hidden/";
/// Prefix of the attachment locks.
pub const LOCK_PREFIX: &str = "lock/";
/// Prefix of the attachment generations.
pub const GEN_PREFIX: &str = "vdi-gen/";
/// Prefix of the requests for a held lock (cooperative hand-over).
pub const LOCK_REQUEST_PREFIX: &str = "lock-req/";

/// Prefix of the recovery records.
pub const RECOVERED_PREFIX: &str = "recovered/";
/// `changed/<epoch>`: the ids of the nodes that took a change (a write, a copy-on-write, a
/// remove, as primary or replica) in that epoch, each recorded before its first (see the node's
/// `history`). Present, even empty, once any node of the epoch started: an absent record is an
/// epoch of which nothing is known.
pub const CHANGED_PREFIX: &str = "changed/";

pub fn changed(epoch: u32) -> String {
    format!("{CHANGED_PREFIX}{epoch:010}")
}

/// The epoch of the last `dog cluster recover --force`.
pub const FORCED: &str = "recovery-forced";

/// The record of which nodes finished recovering `epoch` (zero-padded, so keys sort by epoch).
pub fn recovered(epoch: u32) -> String {
    format!("{RECOVERED_PREFIX}{epoch:010}")
}

/// The VDI table entry of `name`.
pub fn vdi(name: &str) -> String {
    format!("{VDI_PREFIX}{name}")
}

/// The record of deleted inode `vid`, kept while others need it.
pub fn hidden(vid: u32) -> String {
    format!("{HIDDEN_PREFIX}{vid}")
}

/// The attachment lock of `name`.
pub fn lock(name: &str) -> String {
    format!("{LOCK_PREFIX}{name}")
}

/// The attachment generation of `name`.
pub fn gen(name: &str) -> String {
    format!("{GEN_PREFIX}{name}")
}

/// The pending request for the lock of `name`.
pub fn lock_request(name: &str) -> String {
    format!("{LOCK_REQUEST_PREFIX}{name}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_layout() {
        assert_eq!(vdi("a"), "vdi/a");
        assert_eq!(hidden(7), "vdi-hidden/7");
        assert_eq!(lock("a"), "lock/a");
        assert_eq!(gen("a"), "vdi-gen/a");
        assert_eq!(recovered(42), "recovered/0000000042");
    }
}
