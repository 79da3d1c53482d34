//! Reading figures: workload parameters, the order of jobs and targets, and number formats.
//! Shared by the markdown tables, the charts and `bench compare`, so that a figure reads the
//! same everywhere. Nothing here fails: a missing or odd parameter is `None`.

use std::cmp::Ordering;

use crate::figures::Figure;

/// Targets in the order tables and legends show them: references first, then sheepfs
/// without and with the cache. Others follow alphabetically.
const TARGET_ORDER: &[&str] = &[
    "raw",
    "bindfs",
    "cp",
    "off",
    "cold",
    "warm",
    "cache",
    "writeback",
    "writethrough",
];

/// A numeric parameter: a JSON number, or a string holding one.
pub fn param_f64(f: &Figure, key: &str) -> Option<f64> {
    match f.params.get(key)? {
        serde_json::Value::Number(n) => n.as_f64(),
        serde_json::Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// A parameter as text: a JSON string as is, any other value in its JSON form.
pub fn param_str(f: &Figure, key: &str) -> Option<String> {
    match f.params.get(key)? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Null => None,
        v => Some(v.to_string()),
    }
}

/// Whether a figure reads or writes: from its `rw` parameter ("read", "randread", "write",
/// "randwrite"), else from its job name ("read-64k", "write-1m"). `None` for mixed jobs.
pub fn direction(f: &Figure) -> Option<&'static str> {
    let rw = param_str(f, "rw").unwrap_or_else(|| f.job.clone());
    let rw = rw.strip_prefix("rand").unwrap_or(&rw);
    if rw == "read" || rw.starts_with("read-") {
        Some("read")
    } else if rw == "write" || rw.starts_with("write-") {
        Some("write")
    } else {
        None
    }
}

/// The workload without its engine and queue shape: "randread-4k-libaio-qd16" and
/// "randread-4k-psync-nj4" are both "randread-4k".
pub fn job_kind(f: &Figure) -> String {
    let engine = param_str(f, "engine");
    f.job
        .split('-')
        .filter(|seg| Some(*seg) != engine.as_deref() && !is_shape_segment(seg))
        .collect::<Vec<_>>()
        .join("-")
}

/// "qd16" or "nj4": an iodepth or numjobs suffix.
fn is_shape_segment(seg: &str) -> bool {
    ["qd", "nj"].iter().any(|p| {
        seg.strip_prefix(p)
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    })
}

/// One piece of a job name for [`natural_cmp`].
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Piece {
    /// A number, times 1024 per size suffix (k, m, g): "4k" < "64k" < "1m".
    Num(u64),
    Text(String),
}

/// The pieces of a name: runs of digits (with an optional size suffix) and runs of the rest.
fn pieces(name: &str) -> Vec<Piece> {
    let mut out = Vec::new();
    let mut chars = name.chars().peekable();
    while let Some(&c) = chars.peek() {
        if c.is_ascii_digit() {
            let mut n: u64 = 0;
            while let Some(d) = chars.peek().and_then(|c| c.to_digit(10)) {
                n = n.saturating_mul(10).saturating_add(u64::from(d));
                chars.next();
            }
            let shift = match chars.peek().map(char::to_ascii_lowercase) {
                Some('k') => 10,
                Some('m') => 20,
                Some('g') => 30,
                _ => 0,
            };
            if shift > 0 {
                chars.next();
            }
            out.push(Piece::Num(n.saturating_mul(1 << shift)));
        } else {
            let mut s = String::new();
            while let Some(&c) = chars.peek().filter(|c| !c.is_ascii_digit()) {
                s.push(c);
                chars.next();
            }
            out.push(Piece::Text(s));
        }
    }
    out
}

/// Orders job names with their numbers read as numbers and sizes as sizes:
/// "randread-4k-libaio-qd4" before "...-qd16", "read-64k" before "read-1m".
pub fn natural_cmp(a: &str, b: &str) -> Ordering {
    pieces(a).cmp(&pieces(b))
}

/// Orders targets: the references, then sheepfs modes (see `TARGET_ORDER`), then the rest.
pub fn target_cmp(a: &str, b: &str) -> Ordering {
    let rank = |t: &str| {
        TARGET_ORDER
            .iter()
            .position(|&k| k == t)
            .unwrap_or(TARGET_ORDER.len())
    };
    rank(a).cmp(&rank(b)).then_with(|| a.cmp(b))
}

/// Distinct values in first-seen order.
pub fn distinct<T: PartialEq, I: IntoIterator<Item = T>>(items: I) -> Vec<T> {
    let mut out = Vec::new();
    for item in items {
        if !out.contains(&item) {
            out.push(item);
        }
    }
    out
}

/// The distinct targets of some figures, in [`target_cmp`] order.
pub fn targets<'a>(figures: impl IntoIterator<Item = &'a Figure>) -> Vec<&'a str> {
    let mut t = distinct(figures.into_iter().map(|f| f.target.as_str()));
    t.sort_by(|a, b| target_cmp(a, b));
    t
}

/// A size in bytes the way fio writes it: "512", "16K", "4M", "1G"; other sizes with
/// one decimal ("1.5M").
pub fn size_label(bytes: f64) -> String {
    const UNITS: [(f64, &str); 3] = [(1073741824.0, "G"), (1048576.0, "M"), (1024.0, "K")];
    for (scale, suffix) in UNITS {
        if bytes >= scale {
            let v = bytes / scale;
            return if v.fract() == 0.0 {
                format!("{v:.0}{suffix}")
            } else {
                format!("{v:.1}{suffix}")
            };
        }
    }
    format!("{bytes:.0}")
}

/// A value without its unit: IOPS as integers, MiB/s with one decimal below 100 and none
/// above, other units with about three significant digits.
pub fn fmt_number(v: f64, unit: &str) -> String {
    if !v.is_finite() {
        return "n/a".into();
    }
    let decimals = match unit {
        "IOPS" => 0,
        "MiB/s" if v.abs() >= 100.0 => 0,
        "MiB/s" => 1,
        _ if v.abs() >= 100.0 => 0,
        _ if v.abs() >= 10.0 => 1,
        _ => 2,
    };
    format!("{v:.decimals$}")
}

/// A value with its unit: "36908 IOPS", "2.5 s", "12 %".
pub fn fmt_value(v: f64, unit: &str) -> String {
    format!("{} {unit}", fmt_number(v, unit))
}

/// A ratio with two decimals.
pub fn fmt_ratio(r: f64) -> String {
    if r.is_finite() {
        format!("{r:.2}")
    } else {
        "n/a".into()
    }
}

/// The name of a figure's reference as seen from the figure: the target alone when the job
/// is the same ("bindfs"), else job and target, else the whole id.
pub fn reference_name(f: &Figure, reference: &str) -> String {
    let mut parts = reference.splitn(3, '/');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(group), Some(job), Some(target)) if group == f.group && job == f.job => {
            target.to_string()
        }
        (Some(group), Some(job), Some(target)) if group == f.group => format!("{job} {target}"),
        _ => reference.to_string(),
    }
}

/// The target of a reference id (its last part): "bindfs" for "iops/x/bindfs".
pub fn reference_target(reference: &str) -> &str {
    reference.rsplit('/').next().unwrap_or(reference)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fig(job: &str, params: serde_json::Value) -> Figure {
        let mut f = Figure::new("iops", job, "warm", "IOPS", vec![1.0]);
        if let serde_json::Value::Object(m) = params {
            f.params = m.into_iter().collect();
        }
        f
    }

    #[test]
    fn params_read_numbers_and_strings() {
        let f = fig(
            "x",
            serde_json::json!({"bs": 4096, "iodepth": "16", "rw": "randread", "n": null}),
        );
        assert_eq!(param_f64(&f, "bs"), Some(4096.0));
        assert_eq!(param_f64(&f, "iodepth"), Some(16.0));
        assert_eq!(param_f64(&f, "rw"), None);
        assert_eq!(param_f64(&f, "missing"), None);
        assert_eq!(param_str(&f, "bs").as_deref(), Some("4096"));
        assert_eq!(param_str(&f, "n"), None);
    }

    #[test]
    fn direction_from_rw_or_job() {
        let j = serde_json::json!({});
        assert_eq!(direction(&fig("read-64k", j.clone())), Some("read"));
        assert_eq!(direction(&fig("write-1m", j.clone())), Some("write"));
        assert_eq!(direction(&fig("mix-4k-psync-nj4", j)), None);
        let rw = serde_json::json!({"rw": "randwrite"});
        assert_eq!(direction(&fig("whatever", rw)), Some("write"));
        assert_eq!(
            direction(&fig("x", serde_json::json!({"rw": "randrw"}))),
            None
        );
    }

    #[test]
    fn job_kind_drops_engine_and_shape() {
        let libaio = serde_json::json!({"engine": "libaio"});
        assert_eq!(
            job_kind(&fig("randread-4k-libaio-qd16", libaio)),
            "randread-4k"
        );
        let psync = serde_json::json!({"engine": "psync"});
        assert_eq!(job_kind(&fig("mix-4k-psync-nj10", psync)), "mix-4k");
        assert_eq!(
            job_kind(&fig("read-qdx", serde_json::json!({}))),
            "read-qdx"
        );
    }

    #[test]
    fn natural_order_reads_numbers_and_sizes() {
        let mut jobs = vec![
            "randread-4k-libaio-qd64",
            "read-4m",
            "randread-4k-libaio-qd4",
            "read-16k",
            "randread-4k-libaio-qd16",
            "read-1m",
            "randread-4k-libaio-qd1",
        ];
        jobs.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(
            jobs,
            [
                "randread-4k-libaio-qd1",
                "randread-4k-libaio-qd4",
                "randread-4k-libaio-qd16",
                "randread-4k-libaio-qd64",
                "read-16k",
                "read-1m",
                "read-4m",
            ]
        );
    }

    #[test]
    fn targets_in_reference_first_order() {
        let mut t = vec!["warm", "zzz", "bindfs", "off", "aaa", "raw", "cold"];
        t.sort_by(|a, b| target_cmp(a, b));
        assert_eq!(t, ["raw", "bindfs", "off", "cold", "warm", "aaa", "zzz"]);
    }

    #[test]
    fn formats() {
        assert_eq!(size_label(16384.0), "16K");
        assert_eq!(size_label(4194304.0), "4M");
        assert_eq!(size_label(1572864.0), "1.5M");
        assert_eq!(size_label(512.0), "512");
        assert_eq!(fmt_number(36907.6, "IOPS"), "36908");
        assert_eq!(fmt_number(5726.4, "MiB/s"), "5726");
        assert_eq!(fmt_number(12.34, "MiB/s"), "12.3");
        assert_eq!(fmt_number(0.1234, "s"), "0.12");
        assert_eq!(fmt_number(f64::NAN, "s"), "n/a");
        assert_eq!(fmt_value(2.5, "s"), "2.50 s");
        assert_eq!(fmt_ratio(0.8666), "0.87");
    }

    #[test]
    fn reference_names() {
        let f = fig("randread-4k-libaio-qd1", serde_json::json!({}));
        assert_eq!(
            reference_name(&f, "iops/randread-4k-libaio-qd1/bindfs"),
            "bindfs"
        );
        assert_eq!(reference_name(&f, "iops/write-1m/off"), "write-1m off");
        assert_eq!(reference_name(&f, "flush/x/off"), "flush/x/off");
        assert_eq!(reference_target("iops/x/bindfs"), "bindfs");
    }
}
