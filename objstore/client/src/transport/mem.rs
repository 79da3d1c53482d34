//! The in-memory network: listeners by address, connections as in-memory pipes, and the fault
//! hooks the fault simulator drives.
//!
//! ```text
//!  connector ══ pipe ══ relay (two pump tasks: link state, delay) ══ pipe ══ listener
//! ```
//! Every connection runs through a relay, one task per direction, that forwards chunks in
//! order and consults the network on each one:
//! - **Links** ([`MemNetwork::set_link`], between two addresses, both ways): `Down` refuses new
//!   connections and resets the open ones at once; `Hang` makes connects and bytes wait until
//!   the link heals (the caller's own timeouts decide, as with a silent peer over TCP).
//! - **Delay** ([`MemNetwork::set_delay`], every link; [`MemNetwork::set_link_delay`], one):
//!   each chunk waits a time drawn from a seeded generator. Bytes of one connection stay in
//!   order; bytes of different connections may overtake each other, so a request on a
//!   connection its sender gave up on can land after a newer one sent on a new connection.
//! - **Resets** ([`MemNetwork::reset_connection`], [`MemNetwork::reset_between`]): both
//!   directions end at once, bytes in flight are lost.
//! - **Dead nodes** ([`MemNetwork::kill`] until [`MemNetwork::revive`]): the address stops
//!   listening, all its connections (both ways) reset, and it can neither connect nor be
//!   connected to.
//!
//! A connection's ends are known when it is opened through an endpoint
//! ([`MemNetwork::endpoint`]); a plain handle connects from a fresh anonymous address.
//! Draws of the delay generator happen in the order the relays run, so under a current-thread
//! runtime with a paused clock the same seed gives the same delays. Waiters are woken through
//! `Notify` (fixed order), never a tokio `watch` (random order).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream, ReadHalf, WriteHalf};
use tokio::sync::{mpsc, Notify};
use tokio::time::Instant;

use super::{Listener, Reader, Transport, Writer, IO_BUFFER};

/// Bytes an in-memory pipe buffers in each direction.
const PIPE_BUFFER: usize = 1 << 20;
/// The largest chunk a relay forwards at once.
const CHUNK: usize = 16 << 10;

type Incoming = mpsc::UnboundedSender<(DuplexStream, SocketAddr)>;

/// The state of the link between two addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    Up,
    /// Connects are refused and open connections reset.
    Down,
    /// Connects and bytes wait until the link is up again (or down: then they fail).
    Hang,
}

/// A delay drawn uniformly from `min..=max` for each chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delay {
    pub min: Duration,
    pub max: Duration,
}

/// One open connection, as [`MemNetwork::connections`] lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnInfo {
    pub id: u64,
    pub from: SocketAddr,
    pub to: SocketAddr,
}

/// An in-process network: see the module documentation.
#[derive(Clone)]
pub struct MemNetwork {
    inner: Arc<Inner>,
    /// The address connections made through this handle come from; None: anonymous.
    from: Option<SocketAddr>,
}

impl Default for MemNetwork {
    fn default() -> Self {
        MemNetwork {
            inner: Arc::new(Inner {
                state: Mutex::default(),
                changed: Notify::new(),
                io_buffer: AtomicUsize::new(IO_BUFFER),
            }),
            from: None,
        }
    }
}

struct Inner {
    state: Mutex<NetState>,
    /// Fired at every change of links or dead addresses: hung relays and connects re-check.
    changed: Notify,
    /// [`Transport::io_buffer`] of every handle of this network.
    io_buffer: AtomicUsize,
}

struct ConnCtl {
    info: ConnInfo,
    reset: AtomicBool,
    /// Fired when `reset` is set.
    reset_set: Notify,
}

impl ConnCtl {
    fn reset(&self) {
        self.reset.store(true, Ordering::SeqCst);
        self.reset_set.notify_waiters();
    }

    /// Returns once the connection is reset.
    async fn fired(&self) {
        loop {
            let set = self.reset_set.notified();
            tokio::pin!(set);
            set.as_mut().enable();
            if self.reset.load(Ordering::SeqCst) {
                return;
            }
            set.await;
        }
    }
}

#[derive(Default)]
struct NetState {
    listeners: HashMap<SocketAddr, Incoming>,
    next_client_port: u16,
    links: BTreeMap<(SocketAddr, SocketAddr), Link>,
    link_delays: BTreeMap<(SocketAddr, SocketAddr), Delay>,
    delay: Option<Delay>,
    dead: BTreeSet<SocketAddr>,
    conns: BTreeMap<u64, Weak<ConnCtl>>,
    next_conn: u64,
    /// splitmix64 state of the delay generator.
    rng: u64,
}

/// The accepting end of an in-memory address.
pub struct MemListener {
    pub(super) addr: SocketAddr,
    pub(super) rx: mpsc::UnboundedReceiver<(DuplexStream, SocketAddr)>,
}

fn pair(a: SocketAddr, b: SocketAddr) -> (SocketAddr, SocketAddr) {
    if a <= b {
        (a, b)
    } else {
        (b, a)
    }
}

impl NetState {
    fn link(&self, a: SocketAddr, b: SocketAddr) -> Link {
        if self.dead.contains(&a) || self.dead.contains(&b) {
            return Link::Down;
        }
        self.links.get(&pair(a, b)).copied().unwrap_or(Link::Up)
    }

    fn next_delay(&mut self, a: SocketAddr, b: SocketAddr) -> Option<Duration> {
        let d = self
            .link_delays
            .get(&pair(a, b))
            .or(self.delay.as_ref())
            .copied()?;
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        let span = d.max.saturating_sub(d.min).as_micros() as u64;
        Some(d.min + Duration::from_micros(if span == 0 { 0 } else { z % (span + 1) }))
    }

    /// Resets every open connection `pick` chooses.
    fn reset_where(&mut self, pick: impl Fn(&ConnInfo) -> bool) {
        self.conns.retain(|_, c| match c.upgrade() {
            Some(c) if pick(&c.info) => {
                c.reset();
                false
            }
            Some(_) => true,
            None => false,
        });
    }
}

impl MemNetwork {
    pub fn new() -> MemNetwork {
        MemNetwork::default()
    }

    /// Connections opened from now on get read and write buffers of `bytes` at each end
    /// (default [`IO_BUFFER`]), and their relays move at most that much at once: with
    /// hundreds of nodes in one process, every node connected to every other, 256 KiB
    /// buffers at four places a connection add up to gigabytes.
    pub fn set_io_buffer(&self, bytes: usize) {
        self.inner.io_buffer.store(bytes.max(1), Ordering::Relaxed);
    }

    /// A network whose delays are drawn from `seed` (see [`MemNetwork::set_delay`]).
    pub fn seeded(seed: u64) -> MemNetwork {
        let net = MemNetwork::default();
        net.inner.state.lock().unwrap().rng = seed;
        net
    }

    /// A handle on the same network whose connections come from `from`: link faults between
    /// `from` and a peer, and [`MemNetwork::kill`] of `from`, apply to them.
    pub fn endpoint(&self, from: SocketAddr) -> MemNetwork {
        MemNetwork {
            inner: self.inner.clone(),
            from: Some(from),
        }
    }

    /// Starts accepting on `addr`; fails with `AddrInUse` while another listener holds it.
    pub fn listen(&self, addr: SocketAddr) -> io::Result<Listener> {
        let mut st = self.inner.state.lock().unwrap();
        if st.listeners.get(&addr).is_some_and(|tx| !tx.is_closed()) {
            return Err(io::Error::new(
                io::ErrorKind::AddrInUse,
                format!("{addr} is in use"),
            ));
        }
        let (tx, rx) = mpsc::unbounded_channel();
        st.listeners.insert(addr, tx);
        Ok(Listener::Mem(MemListener { addr, rx }))
    }

    /// Stops accepting on `addr` (a crashed node): later connects are refused. Connections
    /// already open break when the node's tasks that hold them end.
    pub fn close(&self, addr: SocketAddr) {
        self.inner.state.lock().unwrap().listeners.remove(&addr);
    }

    fn changed(&self) {
        self.inner.changed.notify_waiters();
    }

    /// Sets the link between `a` and `b` (both directions).
    pub fn set_link(&self, a: SocketAddr, b: SocketAddr, link: Link) {
        {
            let mut st = self.inner.state.lock().unwrap();
            match link {
                Link::Up => st.links.remove(&pair(a, b)),
                l => st.links.insert(pair(a, b), l),
            };
            if link == Link::Down {
                st.reset_where(|c| pair(c.from, c.to) == pair(a, b));
            }
        }
        self.changed();
    }

    /// Delays every chunk on every link without a delay of its own; None: no delay.
    pub fn set_delay(&self, delay: Option<Delay>) {
        self.inner.state.lock().unwrap().delay = delay;
    }

    /// Delays every chunk between `a` and `b`; None: the network-wide delay.
    pub fn set_link_delay(&self, a: SocketAddr, b: SocketAddr, delay: Option<Delay>) {
        let mut st = self.inner.state.lock().unwrap();
        match delay {
            Some(d) => st.link_delays.insert(pair(a, b), d),
            None => st.link_delays.remove(&pair(a, b)),
        };
    }

    /// Every link up, no delays (dead addresses stay dead).
    pub fn heal(&self) {
        {
            let mut st = self.inner.state.lock().unwrap();
            st.links.clear();
            st.link_delays.clear();
            st.delay = None;
        }
        self.changed();
    }

    /// `addr` dies: it stops listening, its connections reset, nothing connects to or from it
    /// until [`MemNetwork::revive`].
    pub fn kill(&self, addr: SocketAddr) {
        {
            let mut st = self.inner.state.lock().unwrap();
            st.dead.insert(addr);
            st.listeners.remove(&addr);
            st.reset_where(|c| c.from == addr || c.to == addr);
        }
        self.changed();
    }

    /// `addr` may connect and listen again.
    pub fn revive(&self, addr: SocketAddr) {
        self.inner.state.lock().unwrap().dead.remove(&addr);
        self.changed();
    }

    /// Open connections, by id (the order they were opened in).
    pub fn connections(&self) -> Vec<ConnInfo> {
        let st = self.inner.state.lock().unwrap();
        st.conns
            .values()
            .filter_map(|c| c.upgrade().map(|c| c.info))
            .collect()
    }

    /// Resets one connection; false if it is no longer open.
    pub fn reset_connection(&self, id: u64) -> bool {
        let mut st = self.inner.state.lock().unwrap();
        let open = st.conns.get(&id).is_some_and(|c| c.strong_count() > 0);
        st.reset_where(|c| c.id == id);
        open
    }

    /// Resets every connection between `a` and `b`.
    pub fn reset_between(&self, a: SocketAddr, b: SocketAddr) {
        let mut st = self.inner.state.lock().unwrap();
        st.reset_where(|c| pair(c.from, c.to) == pair(a, b));
    }

    /// Waits while the link between `a` and `b` hangs; false if it is down (or the connection
    /// `ctl` was reset meanwhile).
    async fn passable(&self, a: SocketAddr, b: SocketAddr, ctl: Option<&ConnCtl>) -> bool {
        loop {
            let changed = self.inner.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let link = self.inner.state.lock().unwrap().link(a, b);
            match link {
                Link::Up => return true,
                Link::Down => return false,
                Link::Hang => {}
            }
            match ctl {
                Some(c) => {
                    tokio::select! {
                        biased;
                        _ = c.fired() => return false,
                        _ = changed => {}
                    }
                }
                None => changed.await,
            }
        }
    }

    async fn open(&self, to: SocketAddr) -> io::Result<(Reader, Writer)> {
        let from = match self.from {
            Some(a) => a,
            None => {
                let mut st = self.inner.state.lock().unwrap();
                st.next_client_port = st.next_client_port.wrapping_add(1).max(1);
                SocketAddr::from(([127, 0, 0, 2], st.next_client_port))
            }
        };
        if !self.passable(from, to, None).await {
            return Err(refused(to));
        }
        let (ours, relay_ours) = tokio::io::duplex(PIPE_BUFFER);
        let (relay_theirs, theirs) = tokio::io::duplex(PIPE_BUFFER);
        let ctl = {
            let mut st = self.inner.state.lock().unwrap();
            if st.link(from, to) != Link::Up {
                return Err(refused(to));
            }
            let tx = st.listeners.get(&to).ok_or_else(|| refused(to))?;
            tx.send((theirs, from)).map_err(|_| refused(to))?;
            st.next_conn += 1;
            let ctl = Arc::new(ConnCtl {
                info: ConnInfo {
                    id: st.next_conn,
                    from,
                    to,
                },
                reset: AtomicBool::new(false),
                reset_set: Notify::new(),
            });
            st.conns.insert(ctl.info.id, Arc::downgrade(&ctl));
            ctl
        };
        let (ro, wo) = tokio::io::split(relay_ours);
        let (rt, wt) = tokio::io::split(relay_theirs);
        tokio::spawn(pump(self.clone(), ctl.clone(), ro, wt));
        tokio::spawn(pump(self.clone(), ctl, rt, wo));
        let (rd, wr) = tokio::io::split(ours);
        Ok((Box::new(rd) as Reader, Box::new(wr) as Writer))
    }
}

/// One direction of a relayed connection (see the module documentation).
async fn pump(
    net: MemNetwork,
    ctl: Arc<ConnCtl>,
    mut src: ReadHalf<DuplexStream>,
    mut dst: WriteHalf<DuplexStream>,
) {
    let (a, b) = (ctl.info.from, ctl.info.to);
    let mut buf = vec![0u8; CHUNK.min(net.io_buffer())];
    let mut due = Instant::now();
    loop {
        let n = tokio::select! {
            biased;
            _ = ctl.fired() => return,
            r = src.read(&mut buf) => match r {
                Ok(0) | Err(_) => {
                    // The sender closed its side: pass the end on, after the bytes before it.
                    let _ = dst.shutdown().await;
                    return;
                }
                Ok(n) => n,
            },
        };
        if !net.passable(a, b, Some(&ctl)).await {
            return;
        }
        // No delay set on the link: no timer either (a timer per chunk costs a tick of the
        // timer wheel, a millisecond, which made a 5 MB answer take a third of a second).
        let delay = net.inner.state.lock().unwrap().next_delay(a, b);
        if let Some(delay) = delay {
            due = due.max(Instant::now() + delay);
            tokio::select! {
                biased;
                _ = ctl.fired() => return,
                _ = tokio::time::sleep_until(due) => {}
            }
        }
        tokio::select! {
            biased;
            _ = ctl.fired() => return,
            r = dst.write_all(&buf[..n]) => if r.is_err() { return },
        }
    }
}

impl Transport for MemNetwork {
    fn connect(&self, addr: SocketAddr) -> BoxFuture<'static, io::Result<(Reader, Writer)>> {
        let net = self.clone();
        Box::pin(async move { net.open(addr).await })
    }

    fn io_buffer(&self) -> usize {
        self.inner.io_buffer.load(Ordering::Relaxed)
    }
}

fn refused(addr: SocketAddr) -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionRefused,
        format!("nothing listens on {addr} (in-memory network)"),
    )
}

#[cfg(test)]
mod tests;
