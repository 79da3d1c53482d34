//! Whether the host's CPUs are busy, for the fills of small misses (random reads).
//!
//! A fill of a 4 KiB miss is a buffered write into a sparse cache file: about 8 µs of CPU on
//! the machines we measure on (ext4 reserves the block, inserts the page, dirties the inode),
//! and the kernel writes the page back later. With CPUs to spare that work runs beside the
//! reads and costs them nothing. When every CPU is taken, it is taken from the guests' I/O:
//! 4k random reads at iodepth 16 on two cores, each miss filled, ran at two thirds of the
//! cache-off speed, and even fills held to 1/40 of the machine's CPU time (as measured while
//! they ran) cost those reads about 8 % against none while busy.
//!
//! So while the kernel's CPU pressure figure (`/proc/pressure/cpu`, "some": the share of time
//! in which runnable tasks waited for a CPU) is at least [`BUSY`] over the last [`SAMPLE`],
//! misses shorter than [`SMALL_FILL`] are fetched for their reader alone and not cached
//! (`busy_skipped_fills` in `cachectl stats`). The cache still fills in the moments the CPUs
//! are not busy, only slower; with CPU to spare, or where the kernel gives no pressure
//! figure, every miss is filled. Longer fills (a stream's second pass, read-ahead) cost far
//! less per byte and are not limited.

use std::fs;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Pressure at or above which the CPUs are busy: runnable tasks waited for a CPU at least
/// this share of the time. 4k random reads at iodepth 1 with no cache keep a two-core machine
/// near 25 %, at iodepth 4 near 70 %, at 16 near 85 %.
const BUSY: f64 = 0.5;
/// How often the pressure is read, and the span it is measured over.
const SAMPLE: Duration = Duration::from_millis(100);
/// Misses shorter than this are small (random reads): only their fills wait for quiet CPUs.
pub const SMALL_FILL: u64 = 64 << 10;

/// The kernel's CPU pressure file.
const PSI_CPU: &str = "/proc/pressure/cpu";

/// Asked on every small miss the cache would keep: between readings that is two atomic loads
/// and a clock read; one caller a [`SAMPLE`] takes the lock and reads the file.
pub(super) struct CpuPressure {
    /// Where the pressure is read (None: the kernel gives none, the CPUs are never busy).
    psi: Option<PathBuf>,
    /// What the last reading said.
    busy: AtomicBool,
    /// When the next reading is due, in ns since `start`.
    due: AtomicU64,
    start: Instant,
    last: Mutex<Reading>,
}

/// The last reading: when it was taken (or tried), and the total stall time it gave (µs).
struct Reading {
    at: Option<Instant>,
    total: Option<u64>,
}

impl CpuPressure {
    pub fn new() -> CpuPressure {
        let psi = PathBuf::from(PSI_CPU);
        let readable = fs::read_to_string(&psi).ok().and_then(|s| some_total(&s));
        CpuPressure::with_psi(readable.is_some().then_some(psi))
    }

    fn with_psi(psi: Option<PathBuf>) -> CpuPressure {
        CpuPressure {
            psi,
            busy: AtomicBool::new(false),
            due: AtomicU64::new(0),
            start: Instant::now(),
            last: Mutex::new(Reading {
                at: None,
                total: None,
            }),
        }
    }

    /// Whether a small miss about to be fetched may be filled: only while CPUs are to spare
    /// (the pressure read again when the last reading is [`SAMPLE`] old).
    pub fn allows_small_fill(&self) -> bool {
        self.allows_small_fill_at(Instant::now())
    }

    /// [`CpuPressure::allows_small_fill`] at time `now`, so tests choose the spans instead of
    /// sleeping through them.
    fn allows_small_fill_at(&self, now: Instant) -> bool {
        let Some(psi) = &self.psi else {
            return true;
        };
        let since_start = |t: Instant| t.duration_since(self.start).as_nanos() as u64;
        if since_start(now) >= self.due.load(Ordering::Acquire) {
            // One caller reads (a few µs, once per SAMPLE, a failed read too); the others go
            // by the reading before.
            if let Ok(mut last) = self.last.try_lock() {
                if since_start(now) >= self.due.load(Ordering::Acquire) {
                    let total = fs::read_to_string(psi).ok().and_then(|s| some_total(&s));
                    let busy_now = match (last.at, last.total, total) {
                        (Some(at), Some(before), Some(total)) => {
                            busy(total.saturating_sub(before), now - at)
                        }
                        _ => false,
                    };
                    *last = Reading {
                        at: Some(now),
                        total,
                    };
                    self.busy.store(busy_now, Ordering::Release);
                    self.due.store(since_start(now + SAMPLE), Ordering::Release);
                }
            }
        }
        !self.busy.load(Ordering::Acquire)
    }

    /// Whether the CPUs were busy when last measured (small misses are not filled now).
    pub fn busy(&self) -> bool {
        self.busy.load(Ordering::Acquire)
    }
}

/// Whether `stalled` µs of CPU pressure over `span` is [`BUSY`]. A span much longer than
/// [`SAMPLE`] (no small miss for a while) says nothing about now: not busy.
fn busy(stalled: u64, span: Duration) -> bool {
    if span > 10 * SAMPLE || span.is_zero() {
        return false;
    }
    stalled as f64 / span.as_micros() as f64 >= BUSY
}

/// The `total=` of the "some" line of a pressure file (µs of stall since boot).
fn some_total(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("some "))?;
    line.split_whitespace()
        .find_map(|f| f.strip_prefix("total="))?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_some_total() {
        let text = "some avg10=1.50 avg60=0.40 avg300=0.10 total=21512122049\n\
                    full avg10=0.00 avg60=0.00 avg300=0.00 total=7\n";
        assert_eq!(some_total(text), Some(21512122049));
        assert_eq!(some_total("full avg10=0.00 total=7\n"), None);
        assert_eq!(some_total("some avg10=0.00 total=x\n"), None);
        assert_eq!(some_total(""), None);
    }

    #[test]
    fn busy_is_half_the_time_stalled_over_a_recent_span() {
        let ms = Duration::from_millis;
        assert!(busy(60_000, ms(100)));
        assert!(busy(50_000, ms(100)));
        assert!(!busy(49_000, ms(100)));
        // A long quiet span says nothing about now.
        assert!(!busy(10_000_000, ms(5000)));
        assert!(!busy(1, Duration::ZERO));
    }

    #[test]
    fn without_a_pressure_file_every_fill_is_allowed() {
        let p = CpuPressure::with_psi(None);
        assert!(p.allows_small_fill());
        assert!(!p.busy());
    }

    #[test]
    fn busy_cpus_stop_small_fills_until_quiet_again() {
        let dir = tempfile::tempdir().unwrap();
        let psi = dir.path().join("cpu");
        let write = |total: u64| {
            let text = format!("some avg10=0.00 avg60=0.00 avg300=0.00 total={total}\n");
            fs::write(&psi, text).unwrap();
        };
        write(1_000);
        let p = CpuPressure::with_psi(Some(psi.clone()));
        let t0 = p.start;
        let ms = Duration::from_millis;
        // The first reading is only a baseline.
        assert!(p.allows_small_fill_at(t0));
        assert!(!p.busy());
        // Stalled for the whole of the next sample (100 ms, 200 ms of stall over two CPUs):
        // busy, no small fill.
        write(1_000 + 200_000);
        assert!(!p.allows_small_fill_at(t0 + SAMPLE));
        assert!(p.busy());
        // Within the same sample the reading stands, whatever the file says.
        write(1_000 + 200_000 + 1);
        assert!(!p.allows_small_fill_at(t0 + SAMPLE + ms(50)));
        // Quiet over the next sample: small fills allowed.
        assert!(p.allows_small_fill_at(t0 + 2 * SAMPLE));
        assert!(!p.busy());
        // Half the time stalled is busy again.
        write(1_000 + 200_000 + 1 + 50_000);
        assert!(!p.allows_small_fill_at(t0 + 3 * SAMPLE));
    }

    #[test]
    fn an_unreadable_pressure_file_is_not_busy() {
        let p = CpuPressure::with_psi(Some(PathBuf::from("/nonexistent/pressure")));
        assert!(p.allows_small_fill());
        assert!(p.allows_small_fill());
        assert!(!p.busy());
    }
}
