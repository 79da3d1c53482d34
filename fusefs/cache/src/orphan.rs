//! Cached data of another cluster: a VDI record names the cluster its data was cached from
//! ([`crate::Backend::cluster_id`]). When the cluster the mount talks to is another one (the
//! cluster was created anew, and a VDI of the same name got the same id), nothing cached of
//! the old VDI is pushed into the new one: its clean data is dropped, and objects holding
//! unpushed writes are set aside, as they are, for people to recover:
//!
//! ```text
//! DIR/orphaned/<vid>-<when>/record.json          the old VDI's record (name, id, cluster)
//! DIR/orphaned/<vid>-<when>/<idx>.data, .meta    its objects with unpushed writes
//! ```
//! (`.data`: the object's bytes at their offsets; `.meta`: the valid and dirty bitmaps, see
//! [`crate::object`]). Nothing removes them but people.

use std::sync::Arc;

use crate::dir::{now_ms, write_json_atomic, VdiRecord};
use crate::object::{CachedObject, Key};
use crate::{Backend, CacheError, Inner};

impl<B: Backend> Inner<B> {
    /// Whether `r` holds data cached from another cluster than the one this mount talks to
    /// (`now`: its [`crate::Backend::cluster_id`]; records that do not say are taken as
    /// this cluster's).
    pub(crate) fn foreign(r: &VdiRecord, now: &str) -> bool {
        !now.is_empty() && r.cluster.as_deref().is_some_and(|c| c != now)
    }

    /// Drops what is cached of the VDI of record `r`, which belongs to another cluster, and
    /// forgets the record; objects with unpushed writes are moved under `DIR/orphaned/`
    /// first. Returns (objects set aside, their dirty bytes); an error (everything left in
    /// place) if they could not be.
    pub(crate) fn set_aside(&self, r: &VdiRecord, now: &str) -> Result<(usize, u64), CacheError> {
        let vid = r.vid;
        self.fills.admission.forget_streams(vid);
        let taken: Vec<Arc<CachedObject>> = {
            let mut objects = self.space.objects.lock().unwrap();
            let keys: Vec<Key> = (objects.iter())
                .filter(|(k, _)| k.0 == vid)
                .map(|(k, _)| *k)
                .collect();
            keys.iter()
                .filter_map(|k| self.take_out(&mut objects, *k))
                .collect()
        };
        let dirty_of = |o: &CachedObject| o.bytes_of(o.state.lock().unwrap().dirty.count());
        let dest = (self.cfg.dir.join("orphaned")).join(format!("{vid:06x}-{}", now_ms()));
        if taken.iter().any(|o| dirty_of(o) > 0) {
            let made = std::fs::create_dir_all(&dest)
                .and_then(|_| write_json_atomic(&dest.join("record.json"), r));
            if let Err(source) = made {
                // Put back: the next attach meets them again (and the same check).
                let mut objects = self.space.objects.lock().unwrap();
                for o in taken {
                    self.space.creating.lock().unwrap().remove(&o.key);
                    objects.put(o.key, o);
                }
                drop(objects);
                self.space.key_done();
                return Err(CacheError::Dir {
                    dir: dest,
                    what: "setting aside unpushed writes of another cluster's VDI",
                    source,
                });
            }
        }
        let (mut kept, mut dirty, mut dropped) = (0, 0, 0);
        for o in taken {
            let d = dirty_of(&o);
            if d == 0 {
                dropped += self.forget(&o);
                continue;
            }
            // The bitmaps as they are (fills may have left the valid ones unsaved).
            if let Err(e) = o.save(&o.state.lock().unwrap()) {
                tracing::warn!("saving cache metadata of {:?}: {e}", o.key);
            }
            self.forget_keeping(&o, Some(&dest));
            kept += 1;
            dirty += d;
        }
        tracing::error!(
            "VDI '{}' (id {vid:x}) was cached from another cluster ({}; this one is {now}): nothing of it is pushed into this cluster's VDI; {} of unpushed writes in {kept} object(s) set aside in {}, {} of clean data dropped",
            r.name,
            r.cluster.as_deref().unwrap_or("?"),
            objstore_proto::size::format_size(dirty),
            if kept > 0 { dest.display().to_string() } else { "(none)".into() },
            objstore_proto::size::format_size(dropped),
        );
        self.forget_record(vid);
        Ok((kept, dirty))
    }
}
