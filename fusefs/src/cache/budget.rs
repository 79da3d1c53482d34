//! How much CPU the fills of small misses (random reads) may take while the host's CPUs are
//! all busy.
//!
//! A fill of a 4 KiB miss is a buffered write into a sparse cache file: about 8 µs of CPU on
//! the machines we measure on (ext4 reserves the block, inserts the page, dirties the inode),
//! and the kernel writes the page back later. With CPUs to spare that work runs beside the
//! reads and costs them nothing. When every CPU is taken, it is taken from the guests' I/O:
//! 4k random reads at iodepth 16 on two cores, each miss filled, ran at two thirds of the
//! cache-off speed.
//!
//! So while the kernel's CPU pressure figure (`/proc/pressure/cpu`, "some": the share of time
//! in which runnable tasks waited for a CPU) is at least [`BUSY`] over the last [`SAMPLE`],
//! fills of misses shorter than [`SMALL_FILL`] share a budget of [`SHARE`] of the machine's
//! CPU time, measured as they run. A small miss that finds it spent is fetched for its reader
//! alone and not cached (`busy_skipped_fills` in `cachectl stats`). The cache still fills
//! then, only slower; with CPU to spare, or where the kernel gives no pressure figure, every
//! miss is filled as before. Longer fills (a stream's second pass, read-ahead) cost far less
//! per byte and are not limited.

use std::fs;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Pressure at or above which the budget applies: runnable tasks waited for a CPU at least
/// this share of the time. 4k random reads at iodepth 1 with no cache keep a two-core machine
/// near 25 %, at iodepth 4 near 70 %, at 16 near 85 %.
const BUSY: f64 = 0.5;
/// How often the pressure is read, and the span it is measured over.
const SAMPLE: Duration = Duration::from_millis(100);
/// The share of the machine's CPU time (all its CPUs) that small fills may use while the
/// CPUs are busy: on two cores, 5 % of one. On the profiling rig, 5 % of one CPU kept cold
/// 4k random reads at iodepth 16 at 0.87–1.03× cache off (10 %: 0.82–0.94×; every miss
/// filled: 0.67×).
const SHARE: f64 = 1.0 / 40.0;
/// Misses shorter than this are small (random reads): the budget is for their fills alone.
pub const SMALL_FILL: u64 = 64 << 10;
/// Fill time that may be spent at once after the budget went unused (and the most it may be
/// overdrawn by fills that ran without a budget).
const BURST: Duration = Duration::from_millis(20);

/// The kernel's CPU pressure file.
const PSI_CPU: &str = "/proc/pressure/cpu";

pub(super) struct FillBudget {
    /// Where the pressure is read (None: the kernel gives none, the budget never applies).
    psi: Option<PathBuf>,
    state: Mutex<State>,
}

struct State {
    /// When the pressure was last read (or tried), and the total stall time it gave (µs).
    read_at: Option<Instant>,
    total: Option<u64>,
    busy: bool,
    bucket: Bucket,
}

impl FillBudget {
    pub fn new() -> FillBudget {
        let psi = PathBuf::from(PSI_CPU);
        let readable = fs::read_to_string(&psi).ok().and_then(|s| some_total(&s));
        FillBudget::with_psi(readable.is_some().then_some(psi))
    }

    fn with_psi(psi: Option<PathBuf>) -> FillBudget {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let rate = SHARE * cpus as f64;
        FillBudget {
            psi,
            state: Mutex::new(State {
                read_at: None,
                total: None,
                busy: false,
                bucket: Bucket::new(Instant::now(), rate),
            }),
        }
    }

    /// Whether a small miss about to be fetched may be filled: always while CPUs are to
    /// spare, else while the budget is not spent.
    pub fn allows(&self) -> bool {
        let Some(psi) = &self.psi else {
            return true;
        };
        let now = Instant::now();
        let mut st = self.state.lock().unwrap();
        let due = st.read_at.is_none_or(|at| now - at >= SAMPLE);
        if due {
            // Read under the lock: once per SAMPLE (a failed read too), a few µs.
            let total = fs::read_to_string(psi).ok().and_then(|s| some_total(&s));
            st.busy = match (st.read_at, st.total, total) {
                (Some(at), Some(before), Some(total)) => {
                    busy(total.saturating_sub(before), now - at)
                }
                _ => false,
            };
            st.read_at = Some(now);
            st.total = total;
        }
        !st.busy || st.bucket.has(now)
    }

    /// Counts `spent` (the time a small fill took) against the budget.
    pub fn charge(&self, spent: Duration) {
        if self.psi.is_some() {
            self.state
                .lock()
                .unwrap()
                .bucket
                .take(Instant::now(), spent);
        }
    }

    /// Whether the budget applies now (the CPUs were busy when last measured).
    pub fn busy(&self) -> bool {
        self.state.lock().unwrap().busy
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

/// Fill time available (ns; negative: overdrawn), earned at `rate` ns per ns that passes, up
/// to [`BURST`].
struct Bucket {
    ns: i64,
    at: Instant,
    rate: f64,
}

impl Bucket {
    fn new(now: Instant, rate: f64) -> Bucket {
        Bucket {
            ns: BURST.as_nanos() as i64,
            at: now,
            rate,
        }
    }

    fn refill(&mut self, now: Instant) {
        let earned = (now.saturating_duration_since(self.at).as_nanos() as f64 * self.rate) as i64;
        self.ns = self.ns.saturating_add(earned).min(BURST.as_nanos() as i64);
        self.at = now;
    }

    fn has(&mut self, now: Instant) -> bool {
        self.refill(now);
        self.ns > 0
    }

    fn take(&mut self, now: Instant, spent: Duration) {
        self.refill(now);
        self.ns = (self.ns - spent.as_nanos() as i64).max(-(BURST.as_nanos() as i64));
    }
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
    fn the_bucket_earns_a_share_of_the_time_up_to_the_burst() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let rate = 0.05;
        let mut b = Bucket::new(t0, rate);
        assert!(b.has(t0));
        // The burst spent at once: nothing left until time earns more.
        b.take(t0, BURST);
        assert!(!b.has(t0));
        // 10 ms of time earns `rate` of it.
        assert!(b.has(t0 + ms(10)));
        b.take(t0 + ms(10), ms(2));
        assert!(!b.has(t0 + ms(10)));
        // A long idle stretch earns no more than the burst.
        b.refill(t0 + ms(100_000));
        assert_eq!(b.ns, BURST.as_nanos() as i64);
        // Overdrawn by fills made while not busy: at most one burst's worth.
        b.take(t0 + ms(100_000), ms(1000));
        assert_eq!(b.ns, -(BURST.as_nanos() as i64));
        let back = BURST.as_secs_f64() / rate;
        assert!(!b.has(t0 + ms(100_000) + Duration::from_secs_f64(back * 0.99)));
        assert!(b.has(t0 + ms(100_000) + Duration::from_secs_f64(back * 1.01)));
    }

    #[test]
    fn without_a_pressure_file_every_fill_is_allowed() {
        let b = FillBudget::with_psi(None);
        b.charge(Duration::from_secs(10));
        assert!(b.allows());
        assert!(!b.busy());
    }

    #[test]
    fn busy_cpus_limit_fills_to_the_budget() {
        let dir = tempfile::tempdir().unwrap();
        let psi = dir.path().join("cpu");
        let write = |total: u64| {
            let text = format!("some avg10=0.00 avg60=0.00 avg300=0.00 total={total}\n");
            fs::write(&psi, text).unwrap();
        };
        write(1_000);
        let b = FillBudget::with_psi(Some(psi.clone()));
        // The first reading is only a baseline.
        assert!(b.allows());
        assert!(!b.busy());
        // Stalled for the whole of the next sample: busy, and the budget applies.
        let t0 = Instant::now();
        std::thread::sleep(SAMPLE);
        write(1_000 + 2 * t0.elapsed().as_micros() as u64);
        assert!(b.allows(), "the burst is there to spend");
        assert!(b.busy());
        b.charge(2 * BURST);
        assert!(!b.allows(), "spent");
        // Quiet again: every fill allowed, spent budget or not.
        std::thread::sleep(SAMPLE);
        assert!(b.allows());
        assert!(!b.busy());
    }

    #[test]
    fn an_unreadable_pressure_file_is_not_busy() {
        let b = FillBudget::with_psi(Some(PathBuf::from("/nonexistent/pressure")));
        b.charge(Duration::from_secs(10));
        assert!(b.allows());
        assert!(b.allows());
        assert!(!b.busy());
    }
}
