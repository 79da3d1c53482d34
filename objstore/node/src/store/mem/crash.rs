//! What a crash and a kill leave of a [`MemStore`] (the states the file backend leaves).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;

use objstore_proto::oid::ObjectId;

use rand::Rng;

use super::{sums, Holds, MemStore, Obj, State, BLOCK};

impl State {
    /// The copies whose file the file backend has marked (`.w`): bytes written since their
    /// last sync (`moved` outlives an install by `put_if_newer`, which clears `dirty`), or
    /// lost by a failed one (on disk, its durable bytes under a marked name).
    fn marked(&self) -> BTreeSet<ObjectId> {
        let lost = (self.bad.iter())
            .filter(|(_, why)| why.is_none())
            .map(|(o, _)| o);
        (self.moved.iter())
            .filter(|o| self.dirty.contains(o))
            .chain(lost)
            .copied()
            .collect()
    }
}

impl MemStore {
    /// A store holding only what this one had made durable: the state after a crash.
    pub fn crashed(&self) -> MemStore {
        let st = self.state.lock().unwrap();
        self.restarted(st.durable.clone(), st.durable_notes.clone())
    }

    /// A store of this one's capacity whose disk holds `objects` and `notes`, all durable.
    fn restarted(
        &self,
        objects: BTreeMap<ObjectId, Obj>,
        notes: HashMap<ObjectId, Vec<u8>>,
    ) -> MemStore {
        MemStore {
            state: Mutex::new(State {
                durable: objects.clone(),
                live: objects,
                durable_notes: notes.clone(),
                notes,
                ..State::default()
            }),
            capacity: self.capacity,
            holds: Holds::default(),
        }
    }

    /// The store a killed process leaves (`kill -9`): the bytes survive in the kernel's page
    /// cache, but a copy whose bytes were written since its last flush comes back at its last
    /// flushed version, suspect, as the file backend's marked files do (one whose version alone
    /// changed comes back at its old version, not suspect: its file is never marked), and a
    /// data object created since then is gone (the file backend drops a file never synced).
    pub fn killed(&self) -> MemStore {
        let st = self.state.lock().unwrap();
        let mut live = st.live.clone();
        let marked = st.marked();
        for oid in st.dirty.iter().chain(&marked) {
            match st.durable.get(oid) {
                // Its version alone changed: its file, never marked, is its old version.
                Some(d) if !marked.contains(oid) => {
                    if let Some(o) = live.get_mut(oid) {
                        o.state.version = d.state.version;
                    }
                }
                Some(d) => {
                    if let Some(o) = live.get_mut(oid) {
                        o.state.version = d.state.version;
                        o.state.suspect = true;
                    }
                }
                // Created since the last flush: the file backend drops its unsynced file.
                None => {
                    live.remove(oid);
                }
            }
        }
        // Notes are in the page cache too.
        let notes = st.notes.clone();
        self.restarted(live, notes)
    }

    /// The store a power cut leaves when the disk wrote back some of what was not synced, in
    /// an order `rng` picks (the file backend's worst case; [`MemStore::crashed`] is its best).
    /// A copy whose bytes changed since its last sync comes back at its last synced version
    /// as it was, or marked (suspect) holding its synced bytes, its newest bytes, or any mix
    /// of the two by 4 KiB block (a file's marker rename is committed before its data is
    /// written back). A copy whose version alone changed comes back at its old version; a data
    /// object created since the last flush is gone (its file is dropped on reopening). A note
    /// set since its last sync comes back as it was, as set, or as none (torn: it fails its
    /// crc). What was durable stays as it was.
    pub fn power_cut(&self, rng: &mut impl Rng) -> MemStore {
        let st = self.state.lock().unwrap();
        let mut live = st.durable.clone();
        for oid in st.marked() {
            let (Some(d), Some(l)) = (st.durable.get(&oid), st.live.get(&oid)) else {
                continue;
            };
            if d.state.deleted || l.state.deleted {
                continue;
            }
            let data = match rng.gen_range(0..4) {
                0 => continue,
                1 => d.data.clone(),
                2 => l.data.clone(),
                _ => torn(&d.data, &l.data, rng),
            };
            let mut state = d.state;
            state.suspect = true;
            live.insert(
                oid,
                Obj {
                    sums: sums::sums_of(&data),
                    data,
                    state,
                },
            );
        }
        let mut notes = st.durable_notes.clone();
        let mut set: Vec<_> = st
            .notes
            .keys()
            .chain(st.durable_notes.keys())
            .filter(|o| st.notes.get(o) != st.durable_notes.get(o))
            .copied()
            .collect();
        set.sort_unstable();
        set.dedup();
        for oid in set {
            match (rng.gen_range(0..3), st.notes.get(&oid)) {
                (0, _) => {}
                (1, Some(n)) => {
                    notes.insert(oid, n.clone());
                }
                _ => {
                    notes.remove(&oid);
                }
            }
        }
        self.restarted(live, notes)
    }
}

/// `new`'s length, each 4 KiB block from `old` or `new` as `rng` picks (`old` zero-extended).
fn torn(old: &[u8], new: &[u8], rng: &mut impl Rng) -> Vec<u8> {
    let mut out = new.to_vec();
    for (b, chunk) in out.chunks_mut(BLOCK).enumerate() {
        if rng.gen_bool(0.5) {
            let at = b * BLOCK;
            for (i, byte) in chunk.iter_mut().enumerate() {
                *byte = old.get(at + i).copied().unwrap_or(0);
            }
        }
    }
    out
}
