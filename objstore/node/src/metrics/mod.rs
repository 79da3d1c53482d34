//! The node's counters: requests, bytes and latency per opcode, error answers per result
//! code, and a [`Registry`] where other parts of the node (scrub, ...) register counters and
//! gauges of their own. [`text`] renders them, with the node's status, as Prometheus text;
//! [`http`] serves that on `sheep --metrics ADDR`; the `NodeStat` opcode answers the same as
//! JSON ([`objstore_proto::api::NodeStats`]).
//!
//! Counting costs a few relaxed atomic additions per request; nothing is locked on the data
//! path (the registry's lock is taken only to register and to render).

pub mod http;
pub mod text;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use objstore_proto::api::{OpStats, Sample};
use objstore_proto::frame::{Opcode, ResultCode};

/// Upper bounds of the latency histogram, in microseconds (the last: everything).
pub const LATENCY_BOUNDS_US: [u64; 17] = [
    100,
    250,
    500,
    1_000,
    2_500,
    5_000,
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    u64::MAX,
];

#[derive(Default)]
struct OpCounters {
    requests: AtomicU64,
    errors: AtomicU64,
    bytes_in: AtomicU64,
    bytes_out: AtomicU64,
    latency_sum_us: AtomicU64,
    /// Requests per bucket (not cumulative).
    buckets: [AtomicU64; LATENCY_BOUNDS_US.len()],
}

/// Result codes counted (every code below this).
const CODES: usize = 32;

/// See the module documentation.
pub struct Metrics {
    ops: Vec<OpCounters>,
    codes: Vec<AtomicU64>,
    registry: Registry,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            ops: (0..256).map(|_| OpCounters::default()).collect(),
            codes: (0..CODES).map(|_| AtomicU64::new(0)).collect(),
            registry: Registry::default(),
        }
    }
}

impl Metrics {
    /// Counts one request of `op` that came with `bytes_in` payload bytes and was answered
    /// with `code` and `bytes_out` payload bytes after `took`.
    pub fn request(
        &self,
        op: Opcode,
        bytes_in: usize,
        bytes_out: usize,
        code: ResultCode,
        took: Duration,
    ) {
        let c = &self.ops[op as u8 as usize];
        c.requests.fetch_add(1, Ordering::Relaxed);
        c.bytes_in.fetch_add(bytes_in as u64, Ordering::Relaxed);
        c.bytes_out.fetch_add(bytes_out as u64, Ordering::Relaxed);
        let us = took.as_micros().min(u64::MAX as u128) as u64;
        c.latency_sum_us.fetch_add(us, Ordering::Relaxed);
        let b = LATENCY_BOUNDS_US
            .iter()
            .position(|&le| us <= le)
            .unwrap_or(LATENCY_BOUNDS_US.len() - 1);
        c.buckets[b].fetch_add(1, Ordering::Relaxed);
        if code != ResultCode::Ok {
            c.errors.fetch_add(1, Ordering::Relaxed);
            if let Some(n) = self.codes.get(code as u16 as usize) {
                n.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Every opcode that served at least one request.
    pub fn ops(&self) -> Vec<OpStats> {
        let mut out = Vec::new();
        for (i, c) in self.ops.iter().enumerate() {
            let requests = c.requests.load(Ordering::Relaxed);
            let Some(op) = Opcode::from_u8(i as u8).filter(|_| requests > 0) else {
                continue;
            };
            let mut cum = 0;
            let latency_buckets = LATENCY_BOUNDS_US
                .iter()
                .zip(&c.buckets)
                .map(|(&le, n)| {
                    cum += n.load(Ordering::Relaxed);
                    (le, cum)
                })
                .collect();
            out.push(OpStats {
                op: format!("{op:?}"),
                requests,
                errors: c.errors.load(Ordering::Relaxed),
                bytes_in: c.bytes_in.load(Ordering::Relaxed),
                bytes_out: c.bytes_out.load(Ordering::Relaxed),
                latency_sum_us: c.latency_sum_us.load(Ordering::Relaxed),
                latency_buckets,
            });
        }
        out
    }

    /// Error answers by result code name.
    pub fn errors(&self) -> std::collections::BTreeMap<String, u64> {
        self.codes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| {
                let n = n.load(Ordering::Relaxed);
                let code = ResultCode::from_u16(i as u16)?;
                (n > 0).then(|| (format!("{code:?}"), n))
            })
            .collect()
    }

    /// Where other parts of the node register their counters and gauges.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }
}

/// A counter registered in a [`Registry`]: only goes up.
#[derive(Clone)]
pub struct Counter(Arc<AtomicU64>);

impl Counter {
    pub fn inc(&self) {
        self.add(1);
    }
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A gauge registered in a [`Registry`]: any value, set as it changes.
#[derive(Clone)]
pub struct Gauge(Arc<AtomicU64>);

impl Gauge {
    pub fn set(&self, v: f64) {
        self.0.store(v.to_bits(), Ordering::Relaxed);
    }
    pub fn get(&self) -> f64 {
        f64::from_bits(self.0.load(Ordering::Relaxed))
    }
}

struct Entry {
    name: String,
    help: String,
    gauge: bool,
    labels: Vec<(String, String)>,
    value: Arc<AtomicU64>,
}

/// Metrics other parts of the node add (the scrub's, say): register once, keep the handle,
/// update it lock-free. A name must start with `sheep_` and be a Prometheus metric name; one
/// name is one kind and one help text (the first registration's), label sets may differ.
/// Registering a name and label set again returns the same metric.
#[derive(Default)]
pub struct Registry {
    entries: Mutex<Vec<Entry>>,
}

impl Registry {
    /// The counter `name` with `labels`, registered now or earlier.
    pub fn counter(&self, name: &str, help: &str, labels: &[(&str, &str)]) -> Counter {
        Counter(self.register(name, help, false, labels))
    }

    /// The gauge `name` with `labels`, registered now or earlier (0 until set).
    pub fn gauge(&self, name: &str, help: &str, labels: &[(&str, &str)]) -> Gauge {
        Gauge(self.register(name, help, true, labels))
    }

    fn register(
        &self,
        name: &str,
        help: &str,
        gauge: bool,
        labels: &[(&str, &str)],
    ) -> Arc<AtomicU64> {
        assert!(
            name.starts_with("sheep_")
                && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_'),
            "metric name {name:?}: expected sheep_ and [a-zA-Z0-9_]"
        );
        let labels: Vec<(String, String)> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let mut entries = self.entries.lock().unwrap();
        if let Some(e) = entries
            .iter()
            .find(|e| e.name == name && e.labels == labels)
        {
            return e.value.clone();
        }
        let value = Arc::new(AtomicU64::new(if gauge { 0f64.to_bits() } else { 0 }));
        entries.push(Entry {
            name: name.to_string(),
            help: help.to_string(),
            gauge,
            labels,
            value: value.clone(),
        });
        value
    }

    /// Every registered metric's current value.
    pub fn samples(&self) -> Vec<Sample> {
        let entries = self.entries.lock().unwrap();
        entries
            .iter()
            .map(|e| {
                let raw = e.value.load(Ordering::Relaxed);
                let help = entries
                    .iter()
                    .find(|f| f.name == e.name)
                    .map(|f| f.help.clone())
                    .unwrap_or_default();
                Sample {
                    name: e.name.clone(),
                    help,
                    kind: if e.gauge { "gauge" } else { "counter" }.into(),
                    labels: e.labels.clone(),
                    value: if e.gauge {
                        f64::from_bits(raw)
                    } else {
                        raw as f64
                    },
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_land_in_their_opcode_and_bucket() {
        let m = Metrics::default();
        m.request(
            Opcode::ReadObj,
            0,
            4096,
            ResultCode::Ok,
            Duration::from_micros(300),
        );
        m.request(
            Opcode::ReadObj,
            0,
            10,
            ResultCode::Io,
            Duration::from_secs(60),
        );
        m.request(
            Opcode::WriteObj,
            4104,
            0,
            ResultCode::Ok,
            Duration::from_micros(50),
        );
        let ops = m.ops();
        assert_eq!(ops.len(), 2);
        let r = &ops[0];
        assert_eq!(
            (r.op.as_str(), r.requests, r.errors, r.bytes_out),
            ("ReadObj", 2, 1, 4106)
        );
        // 300 us is in the 500 us bucket, not the 250 us one; 60 s only in the last.
        let at = |le: u64| r.latency_buckets.iter().find(|b| b.0 == le).unwrap().1;
        assert_eq!(
            (at(250), at(500), at(10_000_000), at(u64::MAX)),
            (0, 1, 1, 2)
        );
        assert_eq!(ops[1].bytes_in, 4104);
        assert_eq!(m.errors().get("Io"), Some(&1));
    }

    #[test]
    fn a_registered_metric_is_found_again_and_sampled() {
        let m = Metrics::default();
        let a = m
            .registry()
            .counter("sheep_scrub_objects_total", "Objects scrubbed", &[]);
        a.add(3);
        m.registry()
            .counter("sheep_scrub_objects_total", "other help", &[])
            .inc();
        m.registry()
            .gauge("sheep_scrub_last_seconds", "When", &[("node", "a")])
            .set(1.5);
        let s = m.registry().samples();
        assert_eq!(s.len(), 2);
        assert_eq!((s[0].value, s[0].help.as_str()), (4.0, "Objects scrubbed"));
        assert_eq!((s[1].kind.as_str(), s[1].value), ("gauge", 1.5));
    }
}
