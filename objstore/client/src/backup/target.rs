//! The restore side: checks the target VDI against the delta's header, applies records, and
//! takes snapshot `NAME@TO` once the whole stream checked out.
//!
//! A full delta restores into a new VDI (created with TO's size) or an empty one; with
//! `force`, into any VDI not attached, which is discarded whole first. An incremental delta
//! applies onto `NAME` only while `NAME@FROM` exists and `NAME` has not changed since it
//! (same size, same map): otherwise the result would not be TO. `force` skips that check.
//! Either way `NAME@TO` must not exist yet, `NAME` is never shrunk, and it is grown to TO's
//! size before the first record.

use std::sync::Arc;

use objstore_proto::keys;
use objstore_proto::name::{snapshot_name, validate_name};
use objstore_proto::oid::Vid;

use super::format::{Header, Record};
use super::BackupError;
use crate::client::Client;
use crate::vdi::{self, Vdi, VdiError, VdiInfo};

/// A VDI made ready for a delta.
pub struct Target {
    client: Arc<Client>,
    vdi: Arc<Vdi>,
    name: String,
    to_tag: String,
    from: Option<String>,
    /// Created for this restore.
    pub created: bool,
}

/// A map without its trailing holes (maps of equal content may differ in length).
fn trimmed(mut m: Vec<Vid>) -> Vec<Vid> {
    while m.last() == Some(&Vid::NONE) {
        m.pop();
    }
    m
}

impl Target {
    /// Checks VDI `name` against delta header `h` and makes it ready: created (full delta),
    /// grown to TO's size, discarded whole (full delta with `force` onto a VDI with data).
    /// Nothing is changed when a check fails.
    pub async fn prepare(
        client: &Arc<Client>,
        name: &str,
        h: &Header,
        force: bool,
    ) -> Result<Target, BackupError> {
        validate_name(name).map_err(VdiError::from)?;
        let to_full = snapshot_name(name, &h.to_tag);
        if client.kv_get(&keys::vdi(&to_full)).await?.is_some() {
            return Err(BackupError::Refused(format!(
                "snapshot '{to_full}' already exists: this delta was restored here already (delete that snapshot to restore it again)"
            )));
        }
        let existing = match Vdi::open(client.clone(), name).await {
            Ok(v) => Some(v),
            Err(VdiError::NotFound(_)) => None,
            Err(e) => return Err(e.into()),
        };
        if existing.is_some() {
            vdi::check_not_attached(client, name).await?;
        }
        let from_full = h.from_tag.as_deref().map(|t| snapshot_name(name, t));
        let mut wipe = false;
        match (&existing, &from_full) {
            (None, Some(f)) => {
                return Err(BackupError::Refused(format!(
                    "VDI '{name}' does not exist: this incremental delta holds the changes from '{}@{}' to '@{}', and applies onto '{f}' (restore the full delta first)",
                    h.name,
                    h.from_tag.as_deref().unwrap_or_default(),
                    h.to_tag
                )))
            }
            (Some(v), None) => {
                let has_data = v.map().iter().any(|e| *e != Vid::NONE);
                if has_data && !force {
                    return Err(BackupError::Refused(format!(
                        "VDI '{name}' exists and holds data: a full delta restores into a new or empty VDI (--force overwrites all of '{name}')"
                    )));
                }
                wipe = has_data;
            }
            (Some(v), Some(f)) if !force => check_base(client, v, f, h).await?,
            _ => {}
        }
        if let Some(v) = &existing {
            if v.size() > h.size {
                return Err(BackupError::Refused(format!(
                    "VDI '{name}' is {} bytes, larger than the delta's VDI ({} bytes): VDIs are not shrunk",
                    v.size(),
                    h.size
                )));
            }
        }
        let created = existing.is_none();
        let v = match existing {
            Some(v) => v,
            None => {
                vdi::create(client, name, h.size).await?;
                Vdi::open(client.clone(), name).await?
            }
        };
        v.grow(h.size).await?;
        if wipe {
            v.discard(0, h.size).await?;
        }
        Ok(Target {
            client: client.clone(),
            vdi: Arc::new(v),
            name: name.to_string(),
            to_tag: h.to_tag.clone(),
            from: from_full,
            created,
        })
    }

    /// The VDI records are applied to.
    pub fn vdi(&self) -> Arc<Vdi> {
        self.vdi.clone()
    }

    /// Applies one record (records do not overlap, so any number may run at once).
    pub async fn apply(vdi: &Vdi, r: Record) -> Result<(), BackupError> {
        match r {
            Record::Data { offset, data } => vdi.write_at(offset, data).await?,
            Record::Zero { offset, len } => vdi.discard(offset, len).await?,
        }
        Ok(())
    }

    /// After the last record and a checked trailer: makes every write durable and takes
    /// snapshot `NAME@TO`.
    pub async fn finish(&self) -> Result<VdiInfo, BackupError> {
        self.vdi.flush().await?;
        Ok(vdi::snapshot(&self.client, &self.name, Some(&self.to_tag), None).await?)
    }

    /// What a failed restore left, for its error message.
    pub fn left(&self) -> String {
        let to = snapshot_name(&self.name, &self.to_tag);
        match &self.from {
            Some(f) => format!(
                "'{to}' was not taken; '{}' may be partly changed ('dog vdi rollback {f} --yes' brings it back)",
                self.name
            ),
            None if self.created => format!(
                "'{to}' was not taken; VDI '{}' holds part of the delta (delete it and restore again)",
                self.name
            ),
            None => format!(
                "'{to}' was not taken; VDI '{}' holds part of the delta",
                self.name
            ),
        }
    }
}

/// Refuses unless `NAME@FROM` exists and VDI `v` still equals it (same size, same map), and
/// its size is what the delta says FROM's was.
async fn check_base(
    client: &Arc<Client>,
    v: &Vdi,
    from_full: &str,
    h: &Header,
) -> Result<(), BackupError> {
    let name = v.header().name;
    let base = match Vdi::open(client.clone(), from_full).await {
        Ok(b) => b,
        Err(VdiError::NotFound(_)) => {
            return Err(BackupError::Refused(format!(
                "snapshot '{from_full}' does not exist: this incremental delta applies onto the state of '{}@{}' (restore up to it first, or --force to apply onto '{name}' as it is)",
                h.name,
                h.from_tag.as_deref().unwrap_or_default()
            )))
        }
        Err(e) => return Err(e.into()),
    };
    if base.size() != h.from_size {
        return Err(BackupError::Refused(format!(
            "snapshot '{from_full}' is {} bytes but the delta's FROM was {} bytes: not the same disk (--force applies anyway)",
            base.size(),
            h.from_size
        )));
    }
    if v.size() != base.size() || trimmed(v.map()) != trimmed(base.map()) {
        return Err(BackupError::Refused(format!(
            "VDI '{name}' was changed since '{from_full}' (written, discarded or resized): 'dog vdi rollback {from_full} --yes' first, or --force to apply onto it as it is"
        )));
    }
    Ok(())
}
