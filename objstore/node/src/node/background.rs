//! Bulk work a node does for its peers (building their listings), at the lowest CPU priority
//! so that it never slows the node's clients: [`Node::background`].

use super::Node;

impl Node {
    /// [`in_background`]: bulk work for peers, at the lowest CPU priority (inline when the
    /// node runs inline: see [`NodeParts::inline`]).
    pub(crate) async fn background<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> std::io::Result<T> {
        self.at_nice_19(Some(&self.background), f).await
    }

    /// Bulk work of this node's own recovery plan (its copies by arc, to compare with its
    /// peers'): at the lowest priority too, so that it does not starve the listings it waits
    /// for from its peers (built at that priority, also by this node for them), nor its
    /// clients; but outside [`Node::background`]'s slots, which its peers' requests need
    /// meanwhile. One plan runs at a time.
    pub(crate) async fn low_priority<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> std::io::Result<T> {
        self.at_nice_19(None, f).await
    }

    /// [`in_background`], or `f` at once when the node runs inline.
    async fn at_nice_19<T: Send + 'static>(
        &self,
        slots: Option<&tokio::sync::Semaphore>,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> std::io::Result<T> {
        if self.inline {
            return Ok(f());
        }
        in_background(slots, f).await
    }
}

/// Runs `f` on a thread of its own at the lowest CPU priority (nice 19), once one of
/// `slots` (if any) is free: work a node does for its peers in bulk (building their listings) that
/// must not slow its clients' requests. On a busy node it takes the CPU the requests leave;
/// on an idle one, what the slots allow. The error: no thread could be started, or `f`
/// panicked.
async fn in_background<T: Send + 'static>(
    slots: Option<&tokio::sync::Semaphore>,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::io::Result<T> {
    let _slot = match slots {
        Some(s) => Some(s.acquire().await.map_err(std::io::Error::other)?),
        None => None,
    };
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("background".into())
        .spawn(move || {
            // This thread only (Linux sets the nice value of the calling thread); failing
            // leaves it at the node's priority, which is only slower for the requests.
            // SAFETY: setpriority takes no pointer.
            unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 19) };
            let _ = tx.send(f());
        })?;
    rx.await
        .map_err(|_| std::io::Error::other("the background thread panicked"))
}

/// How many [`Node::background`] calls run at once: half the CPUs (at least one). Ten peers
/// listing a node on two cores at once, even at the lowest priority, took the 99th
/// percentile of its 4 KiB reads from 0.13 ms to 7.4 ms (a low-priority thread preempted
/// while it holds what a read needs: an index shard's lock, the allocator's); one at a
/// time, 0.12 ms (bench `scale/read-4k-p99`).
pub(super) fn slots() -> usize {
    std::thread::available_parallelism().map_or(1, |n| (n.get() / 2).max(1))
}
