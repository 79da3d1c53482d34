//! A node frozen with SIGSTOP (a hung node: its sockets stay open, nothing answers), resumed
//! with SIGCONT when the guard goes, pass or fail, so no test leaves a stopped `sheep` behind
//! (a stopped process also ignores SIGTERM until it is continued).

use crate::cluster::Cluster;
use crate::{Error, Result};

/// A stopped process; SIGCONT on drop (or at [`Paused::resume`]).
#[derive(Debug)]
pub struct Paused {
    pid: u32,
    resumed: bool,
}

impl Paused {
    /// SIGSTOP to `pid` (a child of this process that is not reaped yet).
    pub fn stop(pid: u32) -> Result<Paused> {
        if pid == 0 {
            return Err(Error::Unexpected {
                what: "SIGSTOP".into(),
                detail: "no process to stop (pid 0)".into(),
            });
        }
        signal(pid, libc::SIGSTOP)?;
        Ok(Paused {
            pid,
            resumed: false,
        })
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// SIGCONT now.
    pub fn resume(mut self) -> Result<()> {
        self.resumed = true;
        signal(self.pid, libc::SIGCONT)
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        if !self.resumed {
            let _ = signal(self.pid, libc::SIGCONT);
        }
    }
}

fn signal(pid: u32, sig: libc::c_int) -> Result<()> {
    // SAFETY: a signal to a child this process started and has not reaped (its pid cannot
    // have been reused).
    if unsafe { libc::kill(pid as libc::pid_t, sig) } != 0 {
        return Err(Error::io(
            format!("sending signal {sig} to pid {pid}"),
            std::io::Error::last_os_error(),
        ));
    }
    Ok(())
}

impl Cluster {
    /// SIGSTOP to node `i`; it is continued when the guard drops (the cluster's own drop then
    /// kills it as usual).
    pub fn try_pause_node(&self, i: usize) -> Result<Paused> {
        let pid = self.nodes[i].as_ref().map_or(0, |p| p.pid());
        Paused::stop(pid).map_err(|e| e.context(format!("pausing sheep{i}")))
    }

    /// Like [`Cluster::try_pause_node`]; panics if it cannot.
    #[track_caller]
    pub fn pause_node(&self, i: usize) -> Paused {
        crate::or_panic(self.try_pause_node(i))
    }
}
