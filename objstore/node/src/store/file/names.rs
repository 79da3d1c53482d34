//! The names of a store's files: an object's file is named after its id, its version and its
//! state, so that a directory listing is the store's index.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io;
use std::path::Path;

use objstore_proto::oid::ObjectId;

use super::{layout, Entry};
use crate::store::{ObjState, Version};

const TOMBSTONE: &str = "del";
const WRITTEN: &str = "w";
/// `<oid>.0.n`: a data object created since the last flush, never synced (`Entry::disk` 0).
pub(super) const CREATED: &str = "n";

/// `<oid>.<version>[.del|.w]`; a `.w` file was being written when the store stopped (its state
/// is suspect). Versions written by older releases (decimal epoch stamps) read as hex, which
/// keeps their order and sorts them below every version made now.
pub(super) fn parse_name(name: &str) -> Option<(ObjectId, ObjState)> {
    let mut parts = name.split('.');
    let oid = parts.next()?;
    let version = parts.next()?;
    let (deleted, suspect) = match parts.next() {
        None => (false, false),
        Some(TOMBSTONE) => (true, false),
        Some(WRITTEN) => (false, true),
        Some(_) => return None,
    };
    if oid.len() != 16 || parts.next().is_some() {
        return None;
    }
    Some((
        ObjectId(u64::from_str_radix(oid, 16).ok()?),
        ObjState {
            version: Version(u64::from_str_radix(version, 16).ok()?),
            deleted,
            suspect,
            lost: false,
        },
    ))
}

/// The name of an object's file at `version` (a tombstone, marked as being written, or plain;
/// at version 0, created and never synced).
pub(super) fn file_name(oid: ObjectId, version: Version, deleted: bool, marked: bool) -> String {
    if !deleted && version == Version::NONE {
        format!("{oid}.0.{CREATED}")
    } else if deleted {
        format!("{oid}.{:x}.{TOMBSTONE}", version.0)
    } else if marked {
        format!("{oid}.{:x}.{WRITTEN}", version.0)
    } else {
        format!("{oid}.{:x}", version.0)
    }
}

pub(super) fn fsync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// The store's index, read from the names of the files in `dir`; drops (unlinks) what a crash
/// left behind: files created and never synced, and the older of two names of one object.
pub(super) fn read_index(dir: &Path) -> io::Result<HashMap<ObjectId, Entry>> {
    let mut index: HashMap<ObjectId, Entry> = HashMap::new();
    for e in fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        if name == ".tmp" || name == super::notes::DIR || name == layout::FORMAT_FILE {
            continue;
        }
        if name.ends_with(&format!(".0.{CREATED}")) {
            // Created and never synced before the store stopped: it was never durable,
            // and nothing older hides under it. Dropped, as a crash may have.
            let _ = fs::remove_file(e.path());
            continue;
        }
        let Some((oid, state)) = parse_name(name) else {
            tracing::warn!("ignoring unexpected file {:?} in object store", e.path());
            continue;
        };
        // A crash between installing a new copy and unlinking the old leaves two names:
        // the newer wins (a tombstone over data of the same version).
        let entry = Entry {
            state,
            disk: state.version,
            marked: state.suspect,
            len: None,
        };
        match index.get(&oid) {
            Some(m) if (m.state.version, m.state.deleted) >= (state.version, state.deleted) => {
                let _ = fs::remove_file(e.path());
            }
            Some(m) => {
                let _ =
                    fs::remove_file(dir.join(file_name(oid, m.disk, m.state.deleted, m.marked)));
                index.insert(oid, entry);
            }
            None => {
                index.insert(oid, entry);
            }
        }
    }
    Ok(index)
}
