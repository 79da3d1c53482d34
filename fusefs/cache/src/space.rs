//! Space: the cached objects in LRU order, the bytes they hold against the size bound, and
//! their files. Making room evicts the least recently used object nobody has pinned and
//! that has no dirty blocks; when only dirty ones are left, it pushes the oldest first, and
//! when all are pinned or being pushed, it waits to be told ([`Room`]). The LRU
//! order survives a remount through the sled index (`DIR/index/`).

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use lru::LruCache;

use crate::dir::now_ms;
use crate::object::{self, CachedObject, Key};
use crate::stats::Counters;
use crate::{chain, spare, Backend, Inner};

/// The cached objects and the bytes they hold.
pub(crate) struct Space {
    /// The size bound in bytes (`cachectl resize` changes it).
    pub(crate) size: AtomicU64,
    pub(crate) obj_dir: PathBuf,
    pub(crate) objects: Mutex<LruCache<Key, Arc<CachedObject>>>,
    /// Bytes of valid blocks, and of dirty ones. `dirty` moves only under the state lock of
    /// the object whose dirty bits change, by the bits changed: it equals the dirty bits' bytes
    /// whenever no state lock is held ([`Space::undirty`]).
    pub(crate) used: AtomicU64,
    pub(crate) dirty: AtomicU64,
    /// When the index last recorded the objects' last uses ([`object::clock_ms`]).
    pub(crate) index_saved_at: AtomicU64,
    pub(crate) index: Option<sled::Tree>,
    /// Keys whose files are being created or retired: a key's files are made only once
    /// those of the object it had before are gone (retiring renames them by path, which would
    /// otherwise take the new object's files).
    pub(crate) creating: Mutex<HashSet<Key>>,
    /// Signalled when a key leaves `creating`: to threads ([`Inner::object_now`]) and to
    /// tasks ([`Inner::object`]), which never block on the condition variable.
    pub(crate) created: std::sync::Condvar,
    pub(crate) created_async: tokio::sync::Notify,
    /// Emptied files of evicted objects, reused for new ones.
    pub(crate) spares: spare::Spares,
    /// Told when room may have been made (an object released, pushed or forgotten).
    pub(crate) room: Arc<Room>,
}

impl Space {
    /// Makes the directory entries of the cached objects and the spares durable: the files
    /// created, and moved between `obj/` and `spare/`, since the mount. Called at unmount
    /// before the directory is marked clean: a clean mark makes the next mount trust the
    /// files even after the host went down, and a rename that did not reach the disk would
    /// then lose an object (its files back in `spare/`) or bring back an evicted one.
    pub(crate) fn sync_dirs(&self) -> std::io::Result<()> {
        let mut dirs = Vec::new();
        for e in std::fs::read_dir(&self.obj_dir)? {
            let e = e?;
            if e.file_type()?.is_dir() {
                dirs.push(e.path());
            }
        }
        // The VDIs' directories before the one that holds them.
        dirs.push(self.obj_dir.clone());
        dirs.push(self.spares.dir().to_path_buf());
        for d in dirs {
            std::fs::File::open(&d)?.sync_all()?;
        }
        Ok(())
    }

    /// Counts `bytes` of dirty blocks as no longer dirty. Callers count only the dirty bits
    /// they cleared themselves, under the object's state lock, and every count-up happens
    /// under that lock with the bits it sets: so the counter never goes below zero. Should it
    /// ever, it stops at zero and says so rather than wrapping (a wrapped counter would keep
    /// the flusher pushing forever and fail unmount); debug builds (the tests) panic, as a
    /// count stopped at 0 is off for good once the missing count-up comes.
    pub(crate) fn undirty(&self, bytes: u64) {
        let r = self
            .dirty
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |d| {
                Some(d.saturating_sub(bytes))
            });
        if let Ok(d) = r {
            if d < bytes {
                tracing::error!(
                    "cache dirty byte counter would go below zero ({d} - {bytes}): a bug, stopped at 0"
                );
                debug_assert!(d >= bytes, "dirty byte counter below zero: {d} - {bytes}");
            }
        }
    }
}

/// Wakes [`Inner::reserve`] when room may have been made, instead of its polling.
#[derive(Default)]
pub(crate) struct Room {
    /// Tasks waiting: with none, telling costs one atomic load.
    waiters: AtomicUsize,
    changed: tokio::sync::Notify,
}

/// One task counted as waiting in [`Room`] while it lives.
pub(crate) struct Waiting<'a>(&'a Room);

impl Room {
    /// Counts the caller as waiting until the guard goes; it registers with `changed` before
    /// each check.
    pub(crate) fn wait_here(&self) -> Waiting<'_> {
        self.waiters.fetch_add(1, Ordering::SeqCst);
        Waiting(self)
    }

    /// Room may have been made.
    pub(crate) fn tell(&self) {
        if self.waiters.load(Ordering::SeqCst) > 0 {
            self.changed.notify_waiters();
        }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiters.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A cached object in use. Eviction passes over an object while anyone holds a pin on it:
/// an explicit count, taken from the LRU under its lock (so eviction, which checks under the
/// same lock, never takes an object someone just looked up), not the reference count.
pub(crate) struct Pinned {
    o: Arc<CachedObject>,
    room: Arc<Room>,
}

impl Pinned {
    /// A weak reference, which does not pin it.
    pub(crate) fn downgrade(&self) -> std::sync::Weak<CachedObject> {
        Arc::downgrade(&self.o)
    }
}

impl Clone for Pinned {
    fn clone(&self) -> Pinned {
        self.o.pins.fetch_add(1, Ordering::SeqCst);
        Pinned {
            o: self.o.clone(),
            room: self.room.clone(),
        }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        if self.o.pins.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.room.tell();
        }
    }
}

impl std::ops::Deref for Pinned {
    type Target = CachedObject;
    fn deref(&self) -> &CachedObject {
        &self.o
    }
}

/// What [`Inner::claim`] found.
enum Claim {
    Found(Pinned),
    /// The caller makes the key's files.
    Mine,
    /// Another thread is making or retiring them.
    Busy,
}

impl Space {
    /// A key left `creating`: wakes whoever waits for it.
    pub(crate) fn key_done(&self) {
        self.created.notify_all();
        self.created_async.notify_waiters();
    }

    /// Empty, over the cache directory `dir`; [`Inner::load_objects`] fills it.
    pub(crate) fn new(dir: &Path, size: u64) -> Space {
        Space {
            size: AtomicU64::new(size),
            obj_dir: dir.join("obj"),
            objects: Mutex::new(LruCache::unbounded()),
            used: AtomicU64::new(0),
            dirty: AtomicU64::new(0),
            index_saved_at: AtomicU64::new(0),
            index: open_index(dir),
            creating: Mutex::default(),
            created: std::sync::Condvar::new(),
            created_async: tokio::sync::Notify::new(),
            spares: spare::Spares::open(dir.join("spare")),
            room: Arc::default(),
        }
    }

    /// Pins `o`, which the caller found in the LRU under its lock.
    pub(crate) fn pin(&self, o: &Arc<CachedObject>) -> Pinned {
        o.pins.fetch_add(1, Ordering::SeqCst);
        Pinned {
            o: o.clone(),
            room: self.room.clone(),
        }
    }
}

fn key_bytes(k: Key) -> [u8; 8] {
    let mut b = [0u8; 8];
    b[..4].copy_from_slice(&k.0.to_be_bytes());
    b[4..].copy_from_slice(&k.1.to_be_bytes());
    b
}

/// Opens the sled index, recreating it if it is missing or unreadable: it only holds what the
/// cache files can rebuild.
fn open_index(dir: &Path) -> Option<sled::Tree> {
    let path = dir.join("index");
    let open = || {
        sled::Config::new()
            .path(&path)
            .open()
            .and_then(|db| db.open_tree("atime"))
    };
    match open() {
        Ok(t) => Some(t),
        Err(e) => {
            tracing::warn!(
                "cache index {} is unreadable ({e}): rebuilding it",
                path.display()
            );
            let _ = std::fs::remove_dir_all(&path);
            match open() {
                Ok(t) => Some(t),
                Err(e) => {
                    tracing::warn!(
                        "cache index unavailable ({e}): LRU order starts from directory order"
                    );
                    None
                }
            }
        }
    }
}

impl<B: Backend> Inner<B> {
    pub(crate) fn load_objects(&self, keys: Vec<Key>) {
        let mut loaded: Vec<(u64, Arc<CachedObject>)> = Vec::new();
        for k in keys {
            match CachedObject::load(&self.space.obj_dir, k) {
                Ok(o) => {
                    let st = o.state.lock().unwrap();
                    self.space
                        .used
                        .fetch_add(o.bytes_of(st.valid.count()), Ordering::Relaxed);
                    self.space
                        .dirty
                        .fetch_add(o.bytes_of(st.dirty.count()), Ordering::Relaxed);
                    drop(st);
                    let atime = self
                        .space
                        .index
                        .as_ref()
                        .and_then(|t| t.get(key_bytes(k)).ok().flatten())
                        .and_then(|v| v.as_ref().try_into().ok().map(u64::from_be_bytes))
                        .unwrap_or(0);
                    loaded.push((atime, Arc::new(o)));
                }
                Err(why) => {
                    tracing::warn!("dropping cached object {k:?}: {}", chain(&why));
                    object::remove_key(&self.space.obj_dir, k);
                }
            }
        }
        loaded.sort_by_key(|(t, _)| *t);
        let mut objects = self.space.objects.lock().unwrap();
        for (_, o) in loaded {
            objects.put(o.key, o);
        }
    }

    /// Records in the index when each object used since the last save was last used (as wall
    /// time, for the LRU order of the next mount).
    pub(crate) fn save_index(&self) {
        let Some(t) = &self.space.index else { return };
        let now = object::clock_ms();
        let since = self.space.index_saved_at.swap(now, Ordering::Relaxed);
        let wall = now_ms();
        let used: Vec<(Key, u64)> = self
            .space
            .objects
            .lock()
            .unwrap()
            .iter()
            // 0: loaded at mount and unused since, its recorded time stands.
            .filter(|(_, o)| o.used_at() > 0 && o.used_at() >= since)
            // Used after `now` was read (on another thread): now.
            .map(|(k, o)| (*k, wall.saturating_sub(now.saturating_sub(o.used_at()))))
            .collect();
        for (k, at) in used {
            let _ = t.insert(key_bytes(k), &at.to_be_bytes());
        }
        let _ = t.flush();
    }

    /// How long the least recently used object has gone unused, in milliseconds (None: the
    /// cache holds none). What a displacing fill would evict first, unless it is dirty or
    /// being read.
    pub(crate) fn lru_idle_ms(&self) -> Option<u64> {
        let objects = self.space.objects.lock().unwrap();
        let (_, o) = objects.peek_lru()?;
        Some(object::clock_ms().saturating_sub(o.used_at()))
    }

    pub(crate) fn dirty_of(&self, vid: u32) -> u64 {
        self.space
            .objects
            .lock()
            .unwrap()
            .iter()
            .filter(|(k, _)| k.0 == vid)
            .map(|(_, o)| o.bytes_of(o.state.lock().unwrap().dirty.count()))
            .sum()
    }

    /// Removes cached objects of `vid` (dirty ones only if `discard_dirty`) and forgets
    /// which of its objects streams passed through (after an evict, a stream over the VDI is
    /// a first pass again); returns the bytes dropped.
    pub(crate) fn drop_vdi(&self, vid: u32, discard_dirty: bool) -> u64 {
        self.fills.admission.forget_streams(vid);
        let victims: Vec<Arc<CachedObject>> = {
            let mut objects = self.space.objects.lock().unwrap();
            let keys: Vec<Key> = objects
                .iter()
                .filter(|(k, o)| {
                    k.0 == vid
                        && !o.pinned()
                        && (discard_dirty || o.state.lock().unwrap().dirty.is_empty())
                })
                .map(|(k, _)| *k)
                .collect();
            keys.iter()
                .filter_map(|k| self.take_out(&mut objects, *k))
                .collect()
        };
        victims.iter().map(|o| self.forget(o)).sum()
    }

    /// Takes `key`'s object out of the LRU (whose lock the caller holds) for
    /// [`Inner::forget`]; until that is done, nobody creates the key's files again.
    pub(crate) fn take_out(
        &self,
        objects: &mut LruCache<Key, Arc<CachedObject>>,
        key: Key,
    ) -> Option<Arc<CachedObject>> {
        let o = objects.pop(&key)?;
        self.space.creating.lock().unwrap().insert(key);
        Some(o)
    }

    /// Accounting and files of an object [`Inner::take_out`] took out of the LRU; returns its
    /// bytes.
    pub(crate) fn forget(&self, o: &CachedObject) -> u64 {
        self.forget_keeping(o, None)
    }

    /// [`Inner::forget`], its files moved into `keep` as they are if given (else emptied
    /// and kept as spares, or removed).
    pub(crate) fn forget_keeping(&self, o: &CachedObject, keep: Option<&Path>) -> u64 {
        let mut st = o.state.lock().unwrap();
        let bytes = o.bytes_of(st.valid.count());
        let dirty = o.bytes_of(st.dirty.count());
        // Its blocks are counted down here, once: whoever still holds it (a push finishing)
        // finds none left.
        st.valid = object::State::empty_like(&st.valid);
        st.dirty = object::State::empty_like(&st.dirty);
        st.dirty_since = None;
        // With the bits, under the state lock (see `vdi::write::commit`).
        self.space.used.fetch_sub(bytes, Ordering::SeqCst);
        self.space.undirty(dirty);
        drop(st);
        match keep {
            None => o.retire(&self.space.spares),
            Some(dir) => {
                if let Err(e) = o.retire_into(dir) {
                    tracing::error!(
                        "moving cached object {:?} into {}: {e}",
                        o.key,
                        dir.display()
                    );
                }
            }
        }
        if let Some(t) = &self.space.index {
            let _ = t.remove(key_bytes(o.key));
        }
        self.space.creating.lock().unwrap().remove(&o.key);
        self.space.key_done();
        self.space.room.tell();
        bytes
    }

    /// Makes room for `bytes` more and counts them as used (the caller settles the difference
    /// with [`Inner::settle`] once it knows how many it really added): evicts least recently
    /// used objects without dirty blocks; when only dirty ones remain, pushes the oldest first.
    /// False if no room could be made within the client's timeout (nothing is counted then).
    pub(crate) async fn reserve(&self, bytes: u64) -> bool {
        let deadline = Instant::now() + self.client.timeout();
        let _waiting = self.space.room.wait_here();
        loop {
            let changed = self.space.room.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let size = self.space.size.load(Ordering::SeqCst);
            let fits = self
                .space
                .used
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |u| {
                    (u + bytes <= size).then_some(u + bytes)
                })
                .is_ok();
            if fits {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            if self.evict_one() {
                continue;
            }
            // Everything left is dirty or in use: push the least recently used dirty object,
            // or wait for an object to be released or pushed (registered before the checks
            // above: a change after them still wakes this). The push runs outside the push
            // lock (a write making room would otherwise wait for a whole fsync or flusher
            // round); fsyncs do not need it to: a push marks the cluster unflushed before
            // its blocks are seen clean ([`Inner::push_object`]).
            match self.oldest_dirty() {
                Some(o) => {
                    if let Err(e) = self.push_object(&o).await {
                        self.push_failed(chain(&e));
                        // Backoff: the cluster did not take it.
                        tokio::time::sleep(Duration::from_millis(200)).await;
                    }
                }
                None => {
                    let _ = tokio::time::timeout_at(deadline.into(), changed).await;
                }
            }
        }
    }

    /// The least recently used object with dirty blocks and no push under way, pinned.
    pub(crate) fn oldest_dirty(&self) -> Option<Pinned> {
        let objects = self.space.objects.lock().unwrap();
        let (_, o) = objects.iter().rev().find(|(_, o)| {
            let st = o.state.lock().unwrap();
            !st.dirty.is_empty() && st.rewritten.is_none()
        })?;
        Some(self.space.pin(o))
    }

    /// Makes room for `bytes` by evicting clean objects only (never waits on the network);
    /// false if that is not enough.
    pub(crate) fn reserve_now(&self, bytes: u64) -> bool {
        loop {
            if self.try_reserve(bytes) {
                return true;
            }
            if !self.evict_one() {
                return false;
            }
        }
    }

    /// Evicts the least recently used object that nobody has pinned and that has no dirty
    /// blocks; the check and the removal happen under the same lock as the lookups that pin.
    /// False if there is none.
    pub(crate) fn evict_one(&self) -> bool {
        let victim = {
            let mut objects = self.space.objects.lock().unwrap();
            let key = objects
                .iter()
                .rev()
                .find(|(_, o)| !o.pinned() && o.state.lock().unwrap().dirty.is_empty())
                .map(|(k, _)| *k);
            key.and_then(|k| self.take_out(&mut objects, k))
        };
        let Some(o) = victim else { return false };
        let freed = self.forget(&o);
        let c = self.counters(o.key.0);
        Counters::add(&c.evictions, 1);
        Counters::add(&c.evicted_bytes, freed);
        true
    }

    /// Reserves `bytes` only if they fit without evicting anything.
    pub(crate) fn try_reserve(&self, bytes: u64) -> bool {
        let size = self.space.size.load(Ordering::SeqCst);
        self.space
            .used
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |u| {
                (u + bytes <= size).then_some(u + bytes)
            })
            .is_ok()
    }

    /// After [`Inner::reserve`]d `reserved` bytes, `added` were really added.
    pub(crate) fn settle(&self, reserved: u64, added: u64) {
        if reserved > added {
            self.space
                .used
                .fetch_sub(reserved - added, Ordering::SeqCst);
            self.space.room.tell();
        } else {
            self.space
                .used
                .fetch_add(added - reserved, Ordering::SeqCst);
        }
    }

    /// The cached object for `key`, created if `create`. Waits (asynchronously) while
    /// another task or thread is making or retiring the key's files.
    pub(crate) async fn object(&self, key: Key, object_size: u64, create: bool) -> Option<Pinned> {
        if let Some(o) = self.lookup(key) {
            return Some(o);
        }
        if !create {
            return None;
        }
        loop {
            // Registered before the claim: a key leaving `creating` after it still wakes this.
            let done = self.space.created_async.notified();
            tokio::pin!(done);
            done.as_mut().enable();
            match self.claim(key) {
                Claim::Found(o) => return Some(o),
                Claim::Mine => break,
                Claim::Busy => done.await,
            }
        }
        self.create_claimed(key, object_size)
    }

    /// [`Inner::object`] for threads outside the runtime (the fill thread, the FUSE
    /// threads): the same, blocking while the key's files are made or retired elsewhere.
    pub(crate) fn object_now(&self, key: Key, object_size: u64, create: bool) -> Option<Pinned> {
        if let Some(o) = self.lookup(key) {
            return Some(o);
        }
        if !create {
            return None;
        }
        loop {
            match self.claim(key) {
                Claim::Found(o) => return Some(o),
                Claim::Mine => break,
                Claim::Busy => {
                    // Sleep until it is done (spinning took the CPU it needed to finish).
                    let mut creating = self.space.creating.lock().unwrap();
                    while creating.contains(&key) {
                        creating = self.space.created.wait(creating).unwrap();
                    }
                }
            }
        }
        self.create_claimed(key, object_size)
    }

    /// The cached object for `key`, now the most recently used.
    fn lookup(&self, key: Key) -> Option<Pinned> {
        let mut objects = self.space.objects.lock().unwrap();
        let o = objects.get(&key)?;
        o.touch();
        Some(self.space.pin(o))
    }

    /// One creator per key (two would share its files): the object if it is there, else
    /// the right to make its files (without holding the LRU's lock, which every read and
    /// write takes), unless another thread is making or retiring them.
    fn claim(&self, key: Key) -> Claim {
        let objects = self.space.objects.lock().unwrap();
        if let Some(existing) = objects.peek(&key) {
            return Claim::Found(self.space.pin(existing));
        }
        if self.space.creating.lock().unwrap().insert(key) {
            Claim::Mine
        } else {
            Claim::Busy
        }
    }

    /// Makes the files of `key`, which [`Inner::claim`] gave this caller, and puts the
    /// object in the LRU.
    fn create_claimed(&self, key: Key, object_size: u64) -> Option<Pinned> {
        let created =
            CachedObject::create(&self.space.obj_dir, key, object_size, &self.space.spares);
        let mut objects = self.space.objects.lock().unwrap();
        self.space.creating.lock().unwrap().remove(&key);
        self.space.key_done();
        let o = match created {
            Ok(o) => Arc::new(o),
            Err(e) => {
                // A full disk is logged once per episode by the write it sends to the cluster.
                if crate::full::disk_full(&e) {
                    tracing::debug!("creating cache object {key:?}: {e}");
                } else {
                    tracing::warn!("creating cache object {key:?}: {e}");
                }
                return None;
            }
        };
        let pinned = self.space.pin(&o);
        objects.put(key, o);
        Some(pinned)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn pins_count_and_the_last_one_tells_a_waiter() {
        let d = tempfile::tempdir().unwrap();
        let space = Space::new(d.path(), 16 << 20);
        let o =
            Arc::new(CachedObject::create(&space.obj_dir, (1, 2), 1 << 20, &space.spares).unwrap());
        let a = space.pin(&o);
        let b = a.clone();
        assert!(o.pinned());
        let room = space.room.clone();
        let waiting = room.wait_here();
        let changed = room.changed.notified();
        tokio::pin!(changed);
        changed.as_mut().enable();
        drop(a);
        assert!(o.pinned(), "one pin is left");
        drop(b);
        assert!(!o.pinned());
        tokio::time::timeout(Duration::from_secs(5), changed)
            .await
            .expect("told when the last pin went");
        drop(waiting);
    }

    #[test]
    fn sync_dirs_syncs_every_object_directory_and_the_spares() {
        let d = tempfile::tempdir().unwrap();
        let space = Space::new(d.path(), 16 << 20);
        let o = CachedObject::create(&space.obj_dir, (1, 2), 1 << 20, &space.spares).unwrap();
        CachedObject::create(&space.obj_dir, (3, 0), 1 << 20, &space.spares).unwrap();
        o.retire(&space.spares);
        // A stray file among the VDIs' directories is passed over.
        std::fs::write(space.obj_dir.join("stray"), b"x").unwrap();
        space.sync_dirs().unwrap();
        std::fs::remove_dir_all(space.spares.dir()).unwrap();
        assert!(
            space.sync_dirs().is_err(),
            "a missing directory is reported"
        );
    }
}
