//! Polling with a deadline, never a fixed sleep, and an interrupt flag every wait checks.
//!
//! A runner that must stop its processes in order on Ctrl-C (`bench run`) calls
//! [`install_interrupt_handlers`]: SIGINT and SIGTERM then only set a flag, and the next
//! [`try_wait_until`] or [`check_interrupt`] returns [`Error::Interrupted`]. Tests never
//! install them, so for them the flag stays down.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::error::{or_panic, Error, Result};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Makes SIGINT and SIGTERM set the flag [`check_interrupt`] reports, instead of killing the
/// process before it could stop what it started.
pub fn install_interrupt_handlers() {
    let handler: extern "C" fn(libc::c_int) = on_signal;
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe { libc::signal(sig, handler as libc::sighandler_t) };
    }
}

/// [`Error::Interrupted`] once SIGINT or SIGTERM arrived (after
/// [`install_interrupt_handlers`]).
pub fn check_interrupt() -> Result<()> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        return Err(Error::Interrupted);
    }
    Ok(())
}

/// Polls `cond` (every 2 ms at first, backing off to 50 ms, so readiness is timed closely)
/// until it holds; [`Error::Timeout`] naming `what` after `timeout`, or at once when
/// interrupted or when `cond` fails.
pub fn try_wait_until(
    what: &str,
    timeout: Duration,
    mut cond: impl FnMut() -> Result<bool>,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    let mut pause = Duration::from_millis(2);
    loop {
        check_interrupt()?;
        if cond()? {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(Error::Timeout {
                what: what.into(),
                after: timeout,
            });
        }
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(50));
    }
}

/// Polls `cond` until it holds; panics naming `what` after `timeout`.
#[track_caller]
pub fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    or_panic(try_wait_until(what, timeout, || Ok(cond())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_out_with_its_reason_and_stops_on_a_failing_condition() {
        let e = try_wait_until("nothing", Duration::from_millis(10), || Ok(false)).unwrap_err();
        assert!(e.to_string().contains("waiting for nothing"), "{e}");
        let e = try_wait_until("x", Duration::from_secs(5), || {
            Err(Error::Binaries("boom".into()))
        })
        .unwrap_err();
        assert_eq!(e.to_string(), "boom");
        let mut n = 0;
        try_wait_until("third poll", Duration::from_secs(5), || {
            n += 1;
            Ok(n == 3)
        })
        .unwrap();
    }
}
