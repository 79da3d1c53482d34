//! The issue targets each figure is checked against, and the ratios that check them.
//!
//! A goal compares a figure with its `reference` (usually bindfs), with the cache-off figure
//! of the same job (`params.reference_off`, its ratio in `params.ratio_off`), with another
//! named figure, or with a fixed bound. Goal figures and everything they are compared with are
//! the run's key figures.

use std::collections::{HashMap, HashSet};

use serde_json::Value;

use super::plan::SWEEP_MODE_OFF;
use crate::figures::Figure;

/// What a goal compares.
#[derive(Debug, Clone, PartialEq)]
enum Check {
    /// `ratio` (value ÷ reference) at least this.
    Reference(f64),
    /// `params.ratio_off` at least this.
    Off(f64),
    /// value ÷ the named figure's value at least this.
    Figure(&'static str, f64),
    /// value below this (in the figure's unit).
    Below(f64),
}

struct Goal {
    text: String,
    check: Check,
}

fn goal(text: &str, check: Check) -> Option<Goal> {
    Some(Goal {
        text: text.into(),
        check,
    })
}

/// The goal of figure `id`; goals stated for 3 copies apply only when the cluster has 3.
fn goal_of(id: &str, copies: usize) -> Option<Goal> {
    use Check::*;
    let three = copies == 3;
    match id {
        "iops/randread-4k-libaio-qd1/warm"
        | "iops/randread-4k-libaio-qd16/warm"
        | "throughput/read-1m/warm" => goal("≥ 0.9× bindfs", Reference(0.9)),
        "cache/randwrite-4k-libaio-qd1/writeback" | "cache/randwrite-4k-libaio-qd16/writeback" => {
            goal("≥ 0.8× bindfs", Reference(0.8))
        }
        "cache/first-read-1m/cold"
        | "iops/randread-4k-libaio-qd1/cold"
        | "iops/randread-4k-libaio-qd16/cold" => goal("≥ 0.9× cache off", Off(0.9)),
        "flush/cachectl-flush/cache" => goal(
            "≥ 0.8× the cluster's durable sequential write (flush/write-1m-durable/off)",
            Reference(0.8),
        ),
        "cache/sheepfs-rss/cache" | "cache/sheepfs-rss/off" => goal("< 200 MiB", Below(200.0)),
        "iops/randread-4k-libaio-qd1/off" => goal("≥ 0.4× bindfs", Reference(0.4)),
        "iops/randread-4k-libaio-qd16/off" => goal(
            "≥ 2× iodepth 1 (iops/randread-4k-libaio-qd1/off)",
            Figure("iops/randread-4k-libaio-qd1/off", 2.0),
        ),
        "throughput/read-1m/off" => goal("≥ 0.5× bindfs", Reference(0.5)),
        "throughput/write-1m/off" if three => goal("≥ 0.25× bindfs (3 copies)", Reference(0.25)),
        "dog/read/dog" => goal("≥ 0.9× cp", Reference(0.9)),
        "dog/write/dog" if three => goal("≥ 0.3× cp (3 copies)", Reference(0.3)),
        _ if id.starts_with("sweep/") && id != SWEEP_MODE_OFF => {
            goal("≥ 1.0× cache off (never below it)", Off(1.0))
        }
        _ => None,
    }
}

/// Ids of the key figures among `figs`: those with a goal and every figure they compare with.
pub fn key_ids<'a>(figs: impl Iterator<Item = &'a Figure>, copies: usize) -> HashSet<String> {
    let mut key = HashSet::new();
    for f in figs {
        let Some(g) = goal_of(&f.id, copies) else {
            continue;
        };
        key.insert(f.id.clone());
        key.extend(f.reference.clone());
        for (k, v) in &f.params {
            if let (true, Some(id)) = (k.starts_with("reference_"), v.as_str()) {
                key.insert(id.to_string());
            }
        }
        if let Check::Figure(id, _) = g.check {
            key.insert(id.to_string());
        }
    }
    key
}

/// Sets `ratio`, `params.ratio_*`, `goal` and `goal_met` on every figure; drops references to
/// figures that were not measured.
pub fn finish(figs: &mut [Figure], copies: usize) {
    let values: HashMap<String, f64> = figs.iter().map(|f| (f.id.clone(), f.value)).collect();
    let ratio = |v: f64, id: &str| {
        values
            .get(id)
            .filter(|r| **r > 0.0)
            .map(|r| v / r)
            .filter(|r| r.is_finite())
    };
    for f in figs.iter_mut() {
        f.ratio = f.reference.as_deref().and_then(|r| ratio(f.value, r));
        if f.ratio.is_none() {
            f.reference = None;
        }
        let refs: Vec<(String, String)> = f
            .params
            .iter()
            .filter_map(|(k, v)| {
                Some((
                    k.strip_prefix("reference_")?.to_string(),
                    v.as_str()?.to_string(),
                ))
            })
            .collect();
        for (what, id) in refs {
            match ratio(f.value, &id) {
                Some(r) => f.params.insert(format!("ratio_{what}"), Value::from(r)),
                None => f.params.remove(&format!("reference_{what}")),
            };
        }
        if let Some(g) = goal_of(&f.id, copies) {
            let checked = checked_ratio(f, &g.check, &ratio);
            f.goal_met = match g.check {
                Check::Reference(min) | Check::Off(min) | Check::Figure(_, min) => {
                    checked.map(|r| r >= min)
                }
                Check::Below(max) => Some(f.value < max),
            };
            f.goal_ratio = checked;
            f.goal = Some(g.text);
        }
    }
}

/// The ratio a goal checks (None for a fixed bound, or when its reference is missing).
fn checked_ratio(
    f: &Figure,
    check: &Check,
    ratio: &impl Fn(f64, &str) -> Option<f64>,
) -> Option<f64> {
    match *check {
        Check::Reference(_) => f.ratio,
        Check::Off(_) => f.params.get("ratio_off")?.as_f64(),
        Check::Figure(id, _) => ratio(f.value, id),
        Check::Below(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fig(id: &str, value: f64) -> Figure {
        let parts: Vec<&str> = id.split('/').collect();
        Figure::new(parts[0], parts[1], parts[2], "IOPS", vec![value])
    }

    #[test]
    fn ratios_and_goals() {
        let mut warm = fig("iops/randread-4k-libaio-qd1/warm", 90.0);
        warm.reference = Some("iops/randread-4k-libaio-qd1/bindfs".into());
        let mut cold = fig("iops/randread-4k-libaio-qd1/cold", 40.0);
        cold.reference = Some("iops/randread-4k-libaio-qd1/bindfs".into());
        cold.params.insert(
            "reference_off".into(),
            Value::from("iops/randread-4k-libaio-qd1/off"),
        );
        let mut gone = fig("dog/write/dog", 10.0);
        gone.reference = Some("dog/copy/cp".into());
        let mut figs = vec![
            warm,
            cold,
            gone,
            fig("iops/randread-4k-libaio-qd1/bindfs", 100.0),
            fig("iops/randread-4k-libaio-qd1/off", 50.0),
            fig("iops/randread-4k-libaio-qd16/off", 99.0),
        ];
        let keys = key_ids(figs.iter(), 3);
        assert!(keys.contains("iops/randread-4k-libaio-qd1/bindfs"));
        assert!(keys.contains("iops/randread-4k-libaio-qd1/off"));
        finish(&mut figs, 3);
        assert_eq!(figs[0].ratio, Some(0.9));
        assert_eq!(figs[0].goal_met, Some(true));
        assert_eq!(figs[1].params["ratio_off"], 0.8);
        assert_eq!(figs[1].goal_met, Some(false));
        assert_eq!(figs[2].reference, None);
        assert_eq!(figs[2].goal_met, None);
        assert_eq!(figs[5].goal_met, Some(false), "99 < 2 × 50");
        assert!(figs[3].goal.is_none());
    }

    #[test]
    fn three_copy_goals_only_with_three_copies() {
        assert!(goal_of("dog/write/dog", 2).is_none());
        assert!(goal_of("dog/write/dog", 3).is_some());
        assert!(goal_of("sweep/randread-4k-hit25/cache", 1).is_some());
    }
}
