//! Prometheus text exposition (format 0.0.4) of a node's [`NodeStats`]: every metric is
//! listed in docs/operations.md ("Metrics").

use std::fmt::Write;

use objstore_proto::api::{HealthState, NodeStats, OpStats, RecoveryState};

/// One metric family: `# HELP`, `# TYPE`, then its samples.
struct Out(String);

impl Out {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.0, "# HELP {name} {help}");
        let _ = writeln!(self.0, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        self.0.push_str(name);
        if !labels.is_empty() {
            self.0.push('{');
            for (i, (k, v)) in labels.iter().enumerate() {
                if i > 0 {
                    self.0.push(',');
                }
                let _ = write!(self.0, "{k}=\"{}\"", escape(v));
            }
            self.0.push('}');
        }
        let _ = writeln!(self.0, " {}", number(value));
    }

    fn one(&mut self, name: &str, kind: &str, help: &str, value: f64) {
        self.family(name, kind, help);
        self.sample(name, &[], value);
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn number(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

/// Renders `s` (see the module documentation).
pub fn render(s: &NodeStats) -> String {
    let mut o = Out(String::with_capacity(8192));
    let st = &s.status;
    o.one(
        "sheep_uptime_seconds",
        "gauge",
        "Seconds since the node started.",
        s.uptime_secs as f64,
    );
    o.one(
        "sheep_epoch",
        "gauge",
        "The node's membership epoch.",
        st.epoch as f64,
    );
    o.one(
        "sheep_objects",
        "gauge",
        "Objects held here (tombstones not counted).",
        st.objects as f64,
    );
    o.one(
        "sheep_disk_total_bytes",
        "gauge",
        "Size of the data directory's file system.",
        st.disk_total as f64,
    );
    o.one(
        "sheep_disk_free_bytes",
        "gauge",
        "Free bytes of the data directory's file system.",
        st.disk_free as f64,
    );

    type Get = fn(&OpStats) -> u64;
    let ops: [(&str, &str, Get); 4] = [
        ("sheep_requests_total", "Requests served, by opcode.", |x| {
            x.requests
        }),
        (
            "sheep_request_errors_total",
            "Requests answered with an error code, by opcode.",
            |x| x.errors,
        ),
        (
            "sheep_request_bytes_in_total",
            "Payload bytes received with requests, by opcode.",
            |x| x.bytes_in,
        ),
        (
            "sheep_request_bytes_out_total",
            "Payload bytes sent with answers, by opcode.",
            |x| x.bytes_out,
        ),
    ];
    for (name, help, get) in ops {
        o.family(name, "counter", help);
        for x in &s.ops {
            o.sample(name, &[("op", &x.op)], get(x) as f64);
        }
    }
    let h = "sheep_request_duration_seconds";
    o.family(
        h,
        "histogram",
        "Time from a decoded request to its answer, by opcode.",
    );
    for x in &s.ops {
        for &(le, n) in &x.latency_buckets {
            let le = if le == u64::MAX {
                "+Inf".to_string()
            } else {
                format!("{}", le as f64 / 1e6)
            };
            o.sample(
                &format!("{h}_bucket"),
                &[("op", &x.op), ("le", &le)],
                n as f64,
            );
        }
        o.sample(
            &format!("{h}_sum"),
            &[("op", &x.op)],
            x.latency_sum_us as f64 / 1e6,
        );
        o.sample(&format!("{h}_count"), &[("op", &x.op)], x.requests as f64);
    }
    o.family(
        "sheep_errors_total",
        "counter",
        "Error answers, by result code (every opcode).",
    );
    for (code, n) in &s.errors {
        o.sample("sheep_errors_total", &[("code", code)], *n as f64);
    }

    let hl = &st.health;
    o.family(
        "sheep_disk_io_errors_total",
        "counter",
        "I/O errors of the node's store, by operation (a failed flush counts once).",
    );
    for (kind, n) in [
        ("read", hl.io_errors.read),
        ("write", hl.io_errors.write),
        ("sync", hl.io_errors.sync),
        ("remove", hl.io_errors.remove),
    ] {
        o.sample("sheep_disk_io_errors_total", &[("kind", kind)], n as f64);
    }
    o.one(
        "sheep_disk_io_errors_recent",
        "gauge",
        "I/O errors within the fencing window.",
        hl.recent as f64,
    );
    o.one(
        "sheep_disk_io_error_limit",
        "gauge",
        "I/O errors within the window that fence the node (0: never).",
        hl.limit as f64,
    );
    o.one(
        "sheep_disk_restored_copies_total",
        "counter",
        "Copies found unreadable here and restored from another replica.",
        hl.restored as f64,
    );
    o.family(
        "sheep_disk_health",
        "gauge",
        "1 for the disk's health state (ok, degraded, fenced), 0 for the others.",
    );
    for (name, state) in [
        ("ok", HealthState::Ok),
        ("degraded", HealthState::Degraded),
        ("fenced", HealthState::Fenced),
    ] {
        o.sample(
            "sheep_disk_health",
            &[("state", name)],
            (hl.state == state) as u8 as f64,
        );
    }

    let rc = &st.recovery;
    o.one(
        "sheep_recovery_epoch",
        "gauge",
        "The epoch recovery works on.",
        rc.epoch as f64,
    );
    for (name, help, v) in [
        (
            "sheep_recovery_objects",
            "Objects this epoch's recovery must bring here.",
            rc.total,
        ),
        (
            "sheep_recovery_done_objects",
            "Objects recovered so far in this epoch.",
            rc.done,
        ),
        (
            "sheep_recovery_failed_objects",
            "Pulls that failed and wait for a retry.",
            rc.failed,
        ),
        (
            "sheep_recovery_removed_objects",
            "Copies dropped here after every owner held them.",
            rc.removed,
        ),
        (
            "sheep_recovery_incomplete_objects",
            "Objects whose I/O waits for nodes that are down.",
            rc.incomplete,
        ),
        (
            "sheep_recovery_plan_entries",
            "Listing entries (17 bytes each) the last plan of this epoch fetched from the other nodes.",
            rc.plan_entries,
        ),
        (
            "sheep_recovery_plan_digests",
            "Digests of ring arcs (24 bytes each) the last plan of this epoch fetched from the other nodes.",
            rc.plan_digests,
        ),
        (
            "sheep_recovery_plan_listed_entries",
            "Entries the other nodes' listings held for the last plan of this epoch: fetched, or found equal to this node's own by digest.",
            rc.plan_listed,
        ),
        (
            "sheep_recovery_plan_requests",
            "Listing requests (digests, arcs, pages) the last plan of this epoch sent.",
            rc.plan_requests,
        ),
        (
            "sheep_recovery_relayed_requests",
            "Requests of this epoch answered through a stand-in: an old holder of an object this node could not store.",
            rc.relayed,
        ),
        (
            "sheep_recovery_plan_milliseconds",
            "How long the last plan of this epoch took.",
            rc.plan_ms,
        ),
    ] {
        o.one(name, "gauge", help, v as f64);
    }
    o.one(
        "sheep_data_lost_objects_total",
        "counter",
        "Objects whose data a failed fdatasync lost while no other node held it.",
        rc.data_lost as f64,
    );
    o.family(
        "sheep_recovery_state",
        "gauge",
        "1 for the recovery state of the current epoch, 0 for the others.",
    );
    for (name, state) in [
        ("planning", RecoveryState::Planning),
        ("recovering", RecoveryState::Recovering),
        ("collecting", RecoveryState::Collecting),
        ("done", RecoveryState::Done),
        ("waiting", RecoveryState::Waiting),
    ] {
        o.sample(
            "sheep_recovery_state",
            &[("state", name)],
            (rc.state == state) as u8 as f64,
        );
    }

    let sc = &st.scrub;
    let last = sc.last.as_ref();
    for (name, kind, help, v) in [
        (
            "sheep_scrub_rate_bytes",
            "gauge",
            "The background scrub's bandwidth limit, bytes per second (0: off).",
            sc.rate,
        ),
        (
            "sheep_scrub_passes_total",
            "counter",
            "Scrub passes finished since the node started.",
            sc.passes,
        ),
        (
            "sheep_scrub_bad_copies_total",
            "counter",
            "Bad copies the scrub found since the node started.",
            sc.bad_total,
        ),
        (
            "sheep_scrub_repaired_copies_total",
            "counter",
            "Bad copies the scrub repaired since the node started.",
            sc.repaired_total,
        ),
        (
            "sheep_scrub_last_end_seconds",
            "gauge",
            "When the last scrub pass ended, Unix seconds (0: none yet).",
            last.and_then(|p| p.ended).unwrap_or(0),
        ),
        (
            "sheep_scrub_last_objects",
            "gauge",
            "Copies the last scrub pass verified.",
            last.map_or(0, |p| p.objects),
        ),
        (
            "sheep_scrub_last_unrecoverable_objects",
            "gauge",
            "Objects the last scrub pass found with no good copy.",
            last.map_or(0, |p| p.unrecoverable),
        ),
    ] {
        o.one(name, kind, help, v as f64);
    }

    let mut extra: Vec<_> = s.extra.iter().collect();
    extra.sort_by(|a, b| a.name.cmp(&b.name));
    let mut seen: Vec<&str> = Vec::new();
    for x in extra {
        if !seen.contains(&x.name.as_str()) {
            seen.push(&x.name);
            o.family(&x.name, &x.kind, &x.help);
        }
        let labels: Vec<(&str, &str)> = x
            .labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        o.sample(&x.name, &labels, x.value);
    }
    o.0
}
