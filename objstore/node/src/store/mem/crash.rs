//! What a crash and a kill leave of a [`MemStore`] (the states the file backend leaves).

use std::sync::Mutex;

use super::{Holds, MemStore, State};

impl MemStore {
    /// A store holding only what this one had made durable: the state after a crash.
    pub fn crashed(&self) -> MemStore {
        let st = self.state.lock().unwrap();
        MemStore {
            state: Mutex::new(State {
                live: st.durable.clone(),
                durable: st.durable.clone(),
                notes: st.durable_notes.clone(),
                durable_notes: st.durable_notes.clone(),
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
        // A copy a failed flush lost is, on disk, its durable bytes under a marked name.
        let lost = st
            .bad
            .iter()
            .filter(|(_, why)| why.is_none())
            .map(|(o, _)| o);
        for oid in st.dirty.iter().chain(lost) {
            match st.durable.get(oid) {
                // Its version alone changed: its file, never marked, is its old version.
                Some(d) if !st.moved.contains(oid) && st.bad.get(oid) != Some(&None) => {
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
        MemStore {
            state: Mutex::new(State {
                durable: live.clone(),
                live,
                durable_notes: notes.clone(),
                notes,
                ..State::default()
            }),
            capacity: self.capacity,
            holds: Holds::default(),
        }
    }
}
