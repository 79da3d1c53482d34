//! The issue targets each figure is checked against, and the ratios that check them.
//!
//! A goal compares a figure with its `reference` (usually bindfs), with the cache-off figure
//! of the same job (`params.reference_off`, its ratio in `params.ratio_off`), with another
//! named figure, or with a fixed bound. Goal figures and everything they are compared with are
//! the run's key figures.
//!
//! Key figures run once per round, the rounds one after another, so a goal's two figures
//! have a run each from every round, measured minutes apart at most. The ratio a goal checks
//! is the median of those per-round ratios (`params.goal_ratio_rounds`): a machine whose
//! speed drifts between rounds moves both runs of a round together, where the ratio of the
//! two medians (`ratio`, `params.ratio_off`) would pair a fast round's run with a slow one's.
//! A figure measured in several passes a round (`FioJob::passes`: the first read) has a run
//! per pass, and its goal pairs the two figures' runs pass for pass. With unequal run counts
//! (a run failed) the goal checks the ratio of the medians.

use std::collections::{HashMap, HashSet};

use serde_json::Value;

use super::plan::SWEEP_MODE_OFF;
use crate::figures::{median, Figure};

/// What a goal compares (each ratio taken per round when it can be, see the module doc).
#[derive(Debug, Clone, PartialEq)]
enum Check {
    /// value ÷ reference at least this.
    Reference(f64),
    /// value ÷ the cache-off figure (`params.reference_off`) at least this.
    Off(f64),
    /// value ÷ the named figure's value at least this.
    Figure(&'static str, f64),
    /// value below this (in the figure's unit).
    Below(f64),
    /// value within `lo ..= hi` (in the figure's unit).
    Between(f64, f64),
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
        "snapshot/snapshot-100g/dog" | "snapshot/clone-100g/dog" => goal("< 100 ms", Below(100.0)),
        "snapshot/write-4k-first-qd16/shared" => goal(
            "≥ 0.5× a write to an unshared object (snapshot/write-4k-first-qd16/unshared)",
            Reference(0.5),
        ),
        // Issue 42: the hand-over of a VDI with dirty cached data takes its push plus this.
        "handover/overhead-dirty/cache" => goal(
            "< 100 ms over the push of the dirty data (handover/push-dirty/cache)",
            Below(100.0),
        ),
        "snapshot/randread-4k-qd16/clone" => goal(
            "≥ 0.9× reads of the parent (snapshot/randread-4k-qd16/parent)",
            Reference(0.9),
        ),
        // Issue 44: 4:2 against 3 copies, same run, 4 MiB objects, 6 nodes.
        "raid/write-1m-obj4m/ec4-2" => goal(
            "≥ 0.9× 3 copies (raid/write-1m-obj4m/c3)",
            Figure("raid/write-1m-obj4m/c3", 0.9),
        ),
        "raid/read-1m-obj4m/ec4-2" => goal(
            "≥ 0.9× 3 copies (raid/read-1m-obj4m/c3)",
            Figure("raid/read-1m-obj4m/c3", 0.9),
        ),
        "raid/randwrite-4k-libaio-qd16-obj4m/ec4-2" => goal(
            "≥ 0.3× 3 copies (raid/randwrite-4k-libaio-qd16-obj4m/c3)",
            Figure("raid/randwrite-4k-libaio-qd16-obj4m/c3", 0.3),
        ),
        "raid/read-1m-down-obj4m/ec4-2" => goal("≥ 0.5× healthy", Reference(0.5)),
        "raid/raw-per-gib-obj4m/ec4-2" | "raid/raw-per-gib-obj4m/ec2-1" => {
            goal("1.5 ± 2 % ((x + y) / x)", Between(1.47, 1.53))
        }
        _ if id.starts_with("sweep/") && id.ends_with("/cache") && id != SWEEP_MODE_OFF => {
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
    // Each figure's value and runs, by id.
    let measured: HashMap<String, (f64, Vec<f64>)> = figs
        .iter()
        .map(|f| (f.id.clone(), (f.value, f.runs.clone())))
        .collect();
    let ratio = |v: f64, id: &str| {
        measured
            .get(id)
            .map(|(r, _)| *r)
            .filter(|r| *r > 0.0)
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
            let compared = compared_id(f, &g.check);
            let rounds = compared
                .as_deref()
                .and_then(|id| per_round(&f.runs, &measured.get(id)?.1));
            let checked = match &rounds {
                Some(r) => Some(median(r)),
                None => compared.and_then(|id| ratio(f.value, &id)),
            };
            match rounds {
                Some(r) => f.params.insert("goal_ratio_rounds".into(), Value::from(r)),
                None => f.params.remove("goal_ratio_rounds"),
            };
            f.goal_met = match g.check {
                Check::Reference(min) | Check::Off(min) | Check::Figure(_, min) => {
                    checked.map(|r| r >= min)
                }
                Check::Below(max) => Some(f.value < max),
                Check::Between(lo, hi) => Some((lo..=hi).contains(&f.value)),
            };
            f.goal_ratio = checked;
            f.goal = Some(g.text);
        }
    }
}

/// The id of the figure a goal compares `f` with (None for a fixed bound, or when the
/// reference was not measured).
fn compared_id(f: &Figure, check: &Check) -> Option<String> {
    match *check {
        Check::Reference(_) => f.reference.clone(),
        Check::Off(_) => Some(f.params.get("reference_off")?.as_str()?.to_string()),
        Check::Figure(id, _) => Some(id.to_string()),
        Check::Below(_) | Check::Between(..) => None,
    }
}

/// `a[i] / b[i]` for every round, when both figures ran the same number of rounds (more than
/// one) and every ratio is finite.
fn per_round(a: &[f64], b: &[f64]) -> Option<Vec<f64>> {
    if a.len() != b.len() || a.len() < 2 {
        return None;
    }
    let r: Vec<f64> = a.iter().zip(b).map(|(x, y)| x / y).collect();
    r.iter().all(|x| x.is_finite() && *x >= 0.0).then_some(r)
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
    fn goals_check_the_median_of_per_round_ratios() {
        let id = "iops/randread-4k-libaio-qd16";
        let mut cold = Figure::new("iops", "randread-4k-libaio-qd16", "cold", "IOPS", vec![]);
        cold.runs = vec![88.0, 78.0, 114.0];
        cold.value = median(&cold.runs);
        cold.params
            .insert("reference_off".into(), Value::from(format!("{id}/off")));
        let mut off = fig(&format!("{id}/off"), 0.0);
        // Round 2 was slow and round 3 fast for both figures.
        off.runs = vec![100.0, 80.0, 120.0];
        off.value = median(&off.runs);
        let mut figs = vec![cold, off];
        finish(&mut figs, 3);
        let c = &figs[0];
        // The medians (88 and 100) come from different rounds.
        assert_eq!(c.params["ratio_off"], 0.88);
        let rounds: Vec<f64> = serde_json::from_value(c.params["goal_ratio_rounds"].clone())
            .expect("per-round ratios");
        assert_eq!(rounds, vec![0.88, 78.0 / 80.0, 0.95]);
        assert_eq!(c.goal_ratio, Some(0.95));
        assert_eq!(c.goal_met, Some(true));

        // One run failed: the goal falls back to the ratio of the medians.
        figs[1].runs.pop();
        finish(&mut figs, 3);
        assert!(!figs[0].params.contains_key("goal_ratio_rounds"));
        assert_eq!(figs[0].goal_ratio, figs[0].params["ratio_off"].as_f64());
    }

    #[test]
    fn the_hand_over_goal_is_a_bound_on_the_median_overhead() {
        let mut f = Figure::new(
            "handover",
            "overhead-dirty",
            "cache",
            "ms",
            vec![60.0, 140.0, 90.0],
        );
        let mut figs = vec![f.clone()];
        finish(&mut figs, 3);
        assert_eq!(figs[0].goal_met, Some(true), "median 90 ms");
        assert_eq!(figs[0].goal_ratio, None);
        f.runs = vec![60.0, 140.0, 120.0];
        f.value = median(&f.runs);
        let mut figs = vec![f];
        finish(&mut figs, 1);
        assert_eq!(figs[0].goal_met, Some(false), "median 120 ms");
    }

    #[test]
    fn three_copy_goals_only_with_three_copies() {
        assert!(goal_of("dog/write/dog", 2).is_none());
        assert!(goal_of("dog/write/dog", 3).is_some());
        assert!(goal_of("sweep/randread-4k-hit25/cache", 1).is_some());
        assert!(goal_of("handover/overhead-dirty/cache", 1).is_some());
    }

    /// The raid goals: 4:2 against the 3-copy figure of the same run, raw bytes in a band.
    #[test]
    fn raid_goals() {
        let mut figs = vec![
            fig("raid/write-1m-obj4m/ec4-2", 95.0),
            fig("raid/write-1m-obj4m/c3", 100.0),
            fig("raid/raw-per-gib-obj4m/ec4-2", 1.502),
            fig("raid/raw-per-gib-obj4m/ec2-1", 1.6),
        ];
        finish(&mut figs, 3);
        assert_eq!(figs[0].goal_met, Some(true));
        assert_eq!(figs[0].goal_ratio, Some(0.95));
        assert_eq!(figs[2].goal_met, Some(true));
        assert_eq!(figs[3].goal_met, Some(false));
        assert!(goal_of("raid/write-1m-obj4m/c3", 3).is_none());
    }
}
