//! Pushes: dirty blocks written to the cluster (one object at a time per object, several
//! objects at once), the cluster flushed after them, and the background flusher that keeps
//! dirty data under `max_dirty` and younger than `max_dirty_age`, with backoff after failures.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::object::{self, CachedObject, BLOCK};
use crate::space::Pinned;
use crate::stats::Counters;
use objstore_client::Volume;

use crate::{chain, Backend, Inner, Pause, PushError};

/// Pushes in progress, and how the last ones went.
#[derive(Default)]
pub(crate) struct Pushes {
    /// One flush (or flusher round) at a time.
    pub(crate) push_lock: tokio::sync::Mutex<()>,
    /// Pushes since the cluster was last flushed.
    pub(crate) unflushed: AtomicBool,
    pub(crate) wake_flusher: Notify,
    pub(crate) push_errors: AtomicU64,
    pub(crate) last_push_error: Mutex<Option<String>>,
    /// The last push failed (cleared by the next that succeeds); pushes started meanwhile
    /// are retries, counted in `push_retries`.
    pub(crate) failing: AtomicBool,
    pub(crate) push_retries: AtomicU64,
}

impl<B: Backend> Inner<B> {
    pub(crate) fn push_failed(&self, why: String) {
        tracing::warn!("cache push failed: {why} (the data stays dirty and is retried)");
        self.pushes.push_errors.fetch_add(1, Ordering::Relaxed);
        self.pushes.failing.store(true, Ordering::Relaxed);
        *self.pushes.last_push_error.lock().unwrap() = Some(why);
    }

    /// Pushes one object's dirty blocks to the cluster (not flushed there). Blocks written
    /// again while the push is in flight stay dirty.
    pub(crate) async fn push_object(&self, o: &CachedObject) -> Result<u64, PushError> {
        if self.pushes.failing.load(Ordering::Relaxed) {
            self.pushes.push_retries.fetch_add(1, Ordering::Relaxed);
        }
        let attached = || self.attach.attached.lock().unwrap().get(&o.key.0).cloned();
        let vdi = match attached() {
            Some(v) => v,
            None => {
                // Right after mount, the VDIs the last mount left are being attached again.
                let mut rx = self.reattaching.subscribe();
                let _ = rx.wait_for(|n| *n == 0).await;
                attached().ok_or(PushError::NotAttached { vid: o.key.0 })?
            }
        };
        let _one = o.pushing.lock().await;
        // Dirty blocks not checked since a restart are checked first, and quarantined ones
        // never pushed: garbage must not overwrite the cluster's good data ([`crate::sums`]).
        let blocks = o.state.lock().unwrap().dirty.bits();
        if o.state.lock().unwrap().needs_check(0, blocks) {
            let v = o.verify(0, blocks);
            self.corrupt_found(&self.counters(o.key.0), &v);
        }
        let snapshot = {
            let mut st = o.state.lock().unwrap();
            let dirty = match &st.quarantined {
                Some(q) => st.dirty.minus(q),
                None => st.dirty.clone(),
            };
            if dirty.is_empty() {
                return Ok(0);
            }
            st.rewritten = Some(object::State::empty_like(&st.dirty));
            dirty
        };
        let base = o.key.1 as u64 * o.object_size;
        let mut pushed = 0u64;
        let mut result = Ok(());
        for (s, e) in snapshot.runs() {
            let off = s as u64 * BLOCK;
            let len = ((e - s) as u64 * BLOCK).min(o.object_size - off);
            // Pooled: a push of 4 MiB runs would otherwise fault in fresh memory each time.
            let mut buf = objstore_proto::pagebuf::PageBuf::zeroed(len as usize);
            // Under the writers' lock: a write in progress (its data goes to the file in
            // several system calls, and even one is not atomic against a read) would
            // otherwise hand the cluster a block half old and half new. Blocks written after
            // this read stay dirty (`rewritten`) and go out with the next push.
            let read = {
                let _writing = o.writing.lock().unwrap();
                o.read_data(buf.as_mut(), off)
            };
            if let Err(source) = read {
                result = Err(PushError::ReadCache { key: o.key, source });
                break;
            }
            // Never past the end of the VDI (its last object may be partial).
            let end = (base + off + len).min(vdi.size());
            if end <= base + off {
                continue;
            }
            buf.truncate((end - base - off) as usize);
            if let Err(source) = vdi.write_at(base + off, buf.freeze()).await {
                result = Err(PushError::Write {
                    name: vdi.name(),
                    source,
                });
                break;
            }
            pushed += end - base - off;
        }
        {
            let mut st = o.state.lock().unwrap();
            let rewritten = st.rewritten.take().expect("push in flight");
            if let Err(e) = result {
                drop(st);
                // Its push is over: it may be picked again.
                self.space.room.tell();
                return Err(e);
            }
            // The cluster needs a flush before anyone can see these blocks clean: an fsync
            // that finds them clean (this push runs outside the push lock when it makes
            // room) then still flushes the cluster, or waits for a flush that does.
            if pushed > 0 {
                self.pushes.unflushed.store(true, Ordering::SeqCst);
            }
            let clean = snapshot.minus(&rewritten);
            // Counted from the bits this clears: blocks of the snapshot dropped meanwhile (by
            // an invalidation, or the object forgotten) were counted down by whoever dropped
            // them. Counted here, under the state lock: the write that set them counted them
            // up under it (see `vdi::write::commit`), so never after this.
            let before = st.dirty.count();
            st.dirty = st.dirty.minus(&clean);
            self.space.undirty(o.bytes_of(before - st.dirty.count()));
            if st.dirty.is_empty() {
                st.dirty_since = None;
            }
            if !st.retired {
                if let Err(e) = o.save(&st) {
                    tracing::warn!("saving cache metadata of {:?}: {e}", o.key);
                }
            }
        }
        self.client.pause(Pause::PushCleaned).await;
        Counters::add(&self.counters(o.key.0).pushed_bytes, pushed);
        self.pushes.failing.store(false, Ordering::Relaxed);
        self.space.room.tell();
        Ok(pushed)
    }

    /// Pushes every dirty object of `vid` (or all), then flushes the cluster.
    pub(crate) async fn flush(
        &self,
        vid: Option<u32>,
        progress: impl Fn(u64, u64),
    ) -> Result<u64, PushError> {
        let _one = self.pushes.push_lock.lock().await;
        let dirty: Vec<Pinned> = self
            .space
            .objects
            .lock()
            .unwrap()
            .iter()
            .filter(|(k, o)| {
                vid.is_none_or(|v| k.0 == v) && !o.state.lock().unwrap().dirty.is_empty()
            })
            .map(|(_, o)| self.space.pin(o))
            .collect();
        let total: u64 = dirty
            .iter()
            .map(|o| o.bytes_of(o.state.lock().unwrap().dirty.count()))
            .sum();
        let mut done = 0u64;
        progress(0, total);
        use futures::StreamExt;
        // After a failure no new push starts (the ones under way finish): with the cluster
        // gone, each would wait out the client's timeout in turn.
        let failed = std::sync::atomic::AtomicBool::new(false);
        let mut pushes = futures::stream::iter(dirty)
            .map(|o| {
                let failed = &failed;
                async move {
                    if failed.load(Ordering::SeqCst) {
                        return Ok(0);
                    }
                    self.push_object(&o).await
                }
            })
            .buffer_unordered(4);
        let mut first_err = None;
        while let Some(r) = pushes.next().await {
            match r {
                Ok(n) => {
                    done += n;
                    progress(done.min(total), total);
                }
                Err(e) => {
                    failed.store(true, Ordering::SeqCst);
                    self.push_failed(chain(&e));
                    first_err.get_or_insert(e);
                }
            }
        }
        drop(pushes);
        if let Some(e) = first_err {
            return Err(e);
        }
        // Nothing pushed since the last cluster flush: nothing to make durable.
        if !self.pushes.unflushed.swap(false, Ordering::SeqCst) {
            return Ok(done);
        }
        self.client.flush().await.map_err(|e| {
            self.pushes.unflushed.store(true, Ordering::SeqCst);
            let e = PushError::ClusterFlush(e);
            self.push_failed(chain(&e));
            e
        })?;
        Ok(done)
    }
}

/// The background flusher: keeps dirty bytes under `max_dirty` and pushes data dirty for
/// longer than `max_dirty_age`, with backoff after failures. Also saves the LRU index.
pub(crate) async fn flusher<B: Backend>(inner: Arc<Inner<B>>) {
    let mut backoff = Duration::from_secs(1);
    loop {
        tokio::select! {
            _ = inner.pushes.wake_flusher.notified() => {}
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
        inner.save_index();
        inner.save_unsaved();
        let now = Instant::now();
        let over = inner.space.dirty.load(Ordering::SeqCst) > inner.cfg.max_dirty;
        let mut due: Vec<(Instant, Pinned)> = inner
            .space
            .objects
            .lock()
            .unwrap()
            .iter()
            .filter_map(|(_, o)| {
                let st = o.state.lock().unwrap();
                let since = st.dirty_since?;
                (over || now.duration_since(since) >= inner.cfg.max_dirty_age)
                    .then(|| (since, inner.space.pin(o)))
            })
            .collect();
        if due.is_empty() {
            continue;
        }
        due.sort_by_key(|(t, _)| *t);
        let one = inner.pushes.push_lock.lock().await;
        let mut failed = false;
        for (_, o) in due {
            if let Err(e) = inner.push_object(&o).await {
                inner.push_failed(chain(&e));
                failed = true;
                break;
            }
            if over && inner.space.dirty.load(Ordering::SeqCst) <= inner.cfg.max_dirty / 2 {
                break;
            }
        }
        drop(one);
        if failed {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_secs(30));
        } else {
            backoff = Duration::from_secs(1);
        }
    }
}
