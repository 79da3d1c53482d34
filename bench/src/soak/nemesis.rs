//! The nemesis: every few seconds one random node is killed with SIGKILL and restarted, or
//! frozen with SIGSTOP and continued. One node at a time: the next event waits until the
//! cluster is whole again and every node has recovered, so every object keeps at least
//! `copies - 1` live owners (2 of 3).

use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use testkit::cluster::Cluster;

use super::{Faults, Log, Rng};

/// One fault and how it went.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Event {
    /// Seconds since the soak started, when the fault began.
    pub at_s: f64,
    pub node: usize,
    /// `kill9` or `stop`.
    pub kind: &'static str,
    /// How long the node was down or stopped.
    pub down_s: f64,
    /// From the node's return to every node recovered (all copies back).
    pub back_to_full_copies_s: Option<f64>,
}

pub struct Nemesis {
    rng: Rng,
    faults: Faults,
    pub events: Vec<Event>,
}

impl Nemesis {
    pub fn new(seed: u64, faults: Faults) -> Nemesis {
        Nemesis {
            rng: Rng::new(seed),
            faults,
            events: Vec::new(),
        }
    }

    /// A pause of `lo..hi` seconds, cut short (false) when `until` passes.
    fn pause(&mut self, lo: u64, hi: u64, until: Instant) -> bool {
        let d = Duration::from_millis(lo * 1000 + self.rng.below((hi - lo) * 1000 + 1));
        let end = Instant::now() + d;
        while Instant::now() < end.min(until) {
            if testkit::check_interrupt().is_err() {
                return false;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Instant::now() < until
    }

    /// One fault on a random node, then waits for the cluster to be whole and recovered.
    pub fn strike(&mut self, c: &mut Cluster, log: &Log, start: Instant) -> Result<()> {
        let n = c.nodes.len() as u64;
        let node = self.rng.below(n) as usize;
        let coin = self.rng.below(2) == 0;
        let stop = match self.faults {
            Faults::Kill | Faults::None => false,
            Faults::Stop => true,
            Faults::Both => coin,
        };
        let at = start.elapsed().as_secs_f64();
        let forever = Instant::now() + Duration::from_secs(3600);
        let t = Instant::now();
        let kind = if stop {
            log.set_state(format!("sheep{node} stopped (SIGSTOP) since {at:.1} s"));
            let paused = c.try_pause_node(node)?;
            self.pause(3, 10, forever);
            paused.resume()?;
            "stop"
        } else {
            log.set_state(format!("sheep{node} killed (SIGKILL) at {at:.1} s, down"));
            c.kill9(node);
            self.pause(2, 6, forever);
            c.try_start_node(node)
                .with_context(|| format!("restarting sheep{node}"))?;
            "kill9"
        };
        let down = t.elapsed();
        log.set_state(format!(
            "sheep{node} back at {:.1} s after {kind}, recovering",
            start.elapsed().as_secs_f64()
        ));
        let back = Instant::now();
        let recovered = c
            .try_wait_members(n as usize)
            .and_then(|()| c.try_wait_recovered());
        let full = match recovered {
            Ok(()) => Some(back.elapsed().as_secs_f64()),
            Err(e) => {
                log.anomaly(
                    "recovery",
                    format!("after {kind} of sheep{node}: {}", e.chain()),
                );
                None
            }
        };
        log.note(format!(
            "{kind} sheep{node} at {at:.1} s for {:.1} s; back to full copies {}",
            down.as_secs_f64(),
            full.map_or("never (see above)".into(), |s| format!("{s:.1} s later"))
        ));
        log.set_state(format!(
            "quiet since {:.1} s",
            start.elapsed().as_secs_f64()
        ));
        self.events.push(Event {
            at_s: at,
            node,
            kind,
            down_s: down.as_secs_f64(),
            back_to_full_copies_s: full,
        });
        Ok(())
    }

    /// Faults every 2-5 s of quiet until `until` (none with [`Faults::None`]).
    pub fn run(
        &mut self,
        c: &mut Cluster,
        log: &Log,
        start: Instant,
        until: Instant,
    ) -> Result<()> {
        if self.faults == Faults::None {
            while self.pause(1, 1, until) {}
            return Ok(());
        }
        while self.pause(2, 5, until) {
            self.strike(c, log, start)?;
        }
        Ok(())
    }
}
