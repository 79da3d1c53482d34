//! `bench compare OLD NEW`: figures matched by id, the ratio new / old of each, and a
//! verdict against a noise band.
//!
//! The band of a figure is the widest of: the `--noise` given, and the relative spread
//! (max − min) / median of its runs in the old and in the new report. A ratio within
//! 1 ± band is "same"; beyond it, "better" or "WORSE" by the figure's direction
//! (`higher_is_better`, taken from the new report). Figures whose ratio cannot be computed
//! (old value 0, a changed unit) are "n/a" and count as neither.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Result;
use serde::Serialize;

use crate::figures::{Figure, Report};
use crate::report::query::{fmt_ratio, fmt_value};

/// What happened to one figure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Better,
    Same,
    Worse,
    #[serde(rename = "n/a")]
    NotComparable,
}

impl Verdict {
    fn label(self) -> &'static str {
        match self {
            Verdict::Better => "better",
            Verdict::Same => "same",
            Verdict::Worse => "WORSE",
            Verdict::NotComparable => "n/a",
        }
    }
}

/// One figure in both reports.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub id: String,
    pub unit: String,
    pub old: f64,
    pub new: f64,
    /// new / old (null when not comparable).
    pub ratio: Option<f64>,
    /// The relative change taken as noise for this figure.
    pub band: f64,
    pub higher_is_better: bool,
    pub verdict: Verdict,
}

/// The whole comparison, as `--json` prints it.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    pub old: String,
    pub new: String,
    pub noise: f64,
    pub figures: Vec<Row>,
    pub only_in_old: Vec<String>,
    pub only_in_new: Vec<String>,
    pub better: usize,
    pub same: usize,
    pub worse: usize,
    pub not_comparable: usize,
}

/// Compares the reports at `old` and `new`, prints a table (or JSON), and returns whether
/// any figure got worse beyond its noise band.
pub fn compare(old: &Path, new: &Path, noise: f64, json: bool) -> Result<bool> {
    anyhow::ensure!(
        noise.is_finite() && noise >= 0.0,
        "--noise must be a fraction ≥ 0 (0.15 for ±15 %), not {noise}"
    );
    let old_report = Report::load(old)?;
    let new_report = Report::load(new)?;
    let mut c = compare_reports(&old_report, &new_report, noise);
    c.old = old.display().to_string();
    c.new = new.display().to_string();
    if json {
        println!("{}", serde_json::to_string_pretty(&c)?);
    } else {
        print!("{}", render(&c));
    }
    Ok(c.worse > 0)
}

/// Matches the figures of two reports by id (in the new report's order) and judges each.
pub fn compare_reports(old: &Report, new: &Report, noise: f64) -> Comparison {
    let figures: Vec<Row> = new
        .figures
        .iter()
        .filter_map(|n| {
            old.figures
                .iter()
                .find(|o| o.id == n.id)
                .map(|o| judge(o, n, noise))
        })
        .collect();
    let missing_from = |from: &Report, other: &Report| -> Vec<String> {
        from.figures
            .iter()
            .filter(|f| !other.figures.iter().any(|g| g.id == f.id))
            .map(|f| f.id.clone())
            .collect()
    };
    let count = |v: Verdict| figures.iter().filter(|r| r.verdict == v).count();
    Comparison {
        old: String::new(),
        new: String::new(),
        noise,
        better: count(Verdict::Better),
        same: count(Verdict::Same),
        worse: count(Verdict::Worse),
        not_comparable: count(Verdict::NotComparable),
        only_in_old: missing_from(old, new),
        only_in_new: missing_from(new, old),
        figures,
    }
}

/// The relative spread of a figure's runs: (max − min) / median; 0 for a single run.
fn relative_spread(f: &Figure) -> f64 {
    if f.runs.len() < 2 || f.value == 0.0 || !f.value.is_finite() {
        return 0.0;
    }
    let (lo, hi) = f.spread();
    ((hi - lo) / f.value.abs()).max(0.0)
}

/// The verdict on one figure measured in both reports.
fn judge(old: &Figure, new: &Figure, noise: f64) -> Row {
    let band = noise.max(relative_spread(old)).max(relative_spread(new));
    let ratio = new.value / old.value;
    let comparable = old.unit == new.unit && old.value != 0.0 && ratio.is_finite();
    let verdict = if !comparable {
        Verdict::NotComparable
    } else if (ratio - 1.0).abs() <= band {
        Verdict::Same
    } else if (ratio > 1.0) == new.higher_is_better {
        Verdict::Better
    } else {
        Verdict::Worse
    };
    Row {
        id: new.id.clone(),
        unit: new.unit.clone(),
        old: old.value,
        new: new.value,
        ratio: comparable.then_some(ratio),
        band,
        higher_is_better: new.higher_is_better,
        verdict,
    }
}

/// The comparison as an aligned text table, the figures found on one side only, and a
/// summary line.
pub fn render(c: &Comparison) -> String {
    let mut rows = vec![[
        "figure".to_string(),
        "old".into(),
        "new".into(),
        "new/old".into(),
        "noise".into(),
        "verdict".into(),
    ]];
    for r in &c.figures {
        rows.push([
            r.id.clone(),
            fmt_value(r.old, &r.unit),
            fmt_value(r.new, &r.unit),
            r.ratio.map_or("n/a".into(), fmt_ratio),
            format!("±{:.0}%", r.band * 100.0),
            r.verdict.label().into(),
        ]);
    }
    let mut out = aligned(&rows);
    for (side, ids) in [("old", &c.only_in_old), ("new", &c.only_in_new)] {
        for id in ids {
            let _ = writeln!(out, "only in {side}: {id}");
        }
    }
    let _ = writeln!(
        out,
        "{} better, {} same, {} worse{} (noise ±{:.0}%; {} only in old, {} only in new)",
        c.better,
        c.same,
        c.worse,
        match c.not_comparable {
            0 => String::new(),
            n => format!(", {n} not comparable"),
        },
        c.noise * 100.0,
        c.only_in_old.len(),
        c.only_in_new.len(),
    );
    out
}

/// Rows of cells padded into columns: the first left-aligned, the others right-aligned.
fn aligned<const N: usize>(rows: &[[String; N]]) -> String {
    let widths: Vec<usize> = (0..N)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for r in rows {
        let cells: Vec<String> = (0..N)
            .map(|c| match c {
                0 => format!("{:<w$}", r[c], w = widths[c]),
                _ => format!("{:>w$}", r[c], w = widths[c]),
            })
            .collect();
        let _ = writeln!(out, "{}", cells.join("  ").trim_end());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::fixture;

    fn report(figs: Vec<Figure>) -> Report {
        Report {
            figures: figs,
            ..fixture::empty()
        }
    }

    fn one(unit: &str, runs: Vec<f64>) -> Figure {
        Figure::new("iops", "randread-4k-libaio-qd1", "warm", unit, runs)
    }

    fn verdict(old: Figure, new: Figure, noise: f64) -> Verdict {
        let c = compare_reports(&report(vec![old]), &report(vec![new]), noise);
        c.figures[0].verdict
    }

    #[test]
    fn verdicts_when_higher_is_better() {
        let v = |new: f64| verdict(one("IOPS", vec![100.0]), one("IOPS", vec![new]), 0.1);
        assert_eq!(v(120.0), Verdict::Better);
        assert_eq!(v(109.0), Verdict::Same);
        assert_eq!(v(91.0), Verdict::Same);
        assert_eq!(v(80.0), Verdict::Worse);
    }

    #[test]
    fn verdicts_when_lower_is_better() {
        let v = |new: f64| verdict(one("s", vec![10.0]), one("s", vec![new]), 0.1);
        assert_eq!(v(8.0), Verdict::Better);
        assert_eq!(v(10.5), Verdict::Same);
        assert_eq!(v(12.0), Verdict::Worse);
    }

    #[test]
    fn spread_widens_the_band() {
        // Old runs spread 80..120 around 100: (120 - 80) / 100 = 40 %.
        let old = one("IOPS", vec![80.0, 100.0, 120.0]);
        let c = compare_reports(
            &report(vec![old.clone()]),
            &report(vec![one("IOPS", vec![70.0])]),
            0.15,
        );
        assert!((c.figures[0].band - 0.4).abs() < 1e-9);
        assert_eq!(c.figures[0].verdict, Verdict::Same);
        assert_eq!(
            verdict(old.clone(), one("IOPS", vec![55.0]), 0.15),
            Verdict::Worse
        );
        // A noisy new report widens it as well.
        let noisy_new = one("IOPS", vec![40.0, 75.0, 80.0]);
        assert_eq!(
            verdict(one("IOPS", vec![100.0]), noisy_new, 0.15),
            Verdict::Same
        );
    }

    #[test]
    fn missing_figures_and_summary() {
        let a = one("IOPS", vec![100.0]);
        let gone = Figure::new("iops", "gone", "off", "IOPS", vec![1.0]);
        let added = Figure::new("iops", "added", "off", "IOPS", vec![1.0]);
        let worse = one("IOPS", vec![50.0]);
        let c = compare_reports(&report(vec![a, gone]), &report(vec![worse, added]), 0.15);
        assert_eq!(c.only_in_old, ["iops/gone/off"]);
        assert_eq!(c.only_in_new, ["iops/added/off"]);
        assert_eq!((c.better, c.same, c.worse), (0, 0, 1));
        let text = render(&c);
        assert!(text.contains("only in old: iops/gone/off"), "{text}");
        assert!(text.contains("only in new: iops/added/off"), "{text}");
        assert!(
            text.contains("0 better, 0 same, 1 worse (noise ±15%; 1 only in old, 1 only in new)")
        );
        let row = text.lines().nth(1).unwrap();
        assert!(row.starts_with("iops/randread-4k-libaio-qd1/warm"), "{row}");
        assert!(
            row.ends_with("100 IOPS  50 IOPS     0.50   ±15%    WORSE"),
            "{row}"
        );
    }

    #[test]
    fn zero_or_changed_unit_is_not_comparable() {
        assert_eq!(
            verdict(one("IOPS", vec![0.0]), one("IOPS", vec![5.0]), 0.1),
            Verdict::NotComparable
        );
        assert_eq!(
            verdict(one("IOPS", vec![5.0]), one("MiB/s", vec![5.0]), 0.1),
            Verdict::NotComparable
        );
    }

    #[test]
    fn files_json_and_errors() {
        let dir = tempfile::tempdir().unwrap();
        let (old, new) = (dir.path().join("old.json"), dir.path().join("new.json"));
        report(vec![one("IOPS", vec![100.0])]).save(&old).unwrap();
        report(vec![one("IOPS", vec![60.0])]).save(&new).unwrap();
        assert!(compare(&old, &new, 0.15, false).unwrap());
        assert!(!compare(&old, &old, 0.15, true).unwrap());
        let json = serde_json::to_value(compare_reports(
            &Report::load(&old).unwrap(),
            &Report::load(&new).unwrap(),
            0.15,
        ))
        .unwrap();
        assert_eq!(json["figures"][0]["verdict"], "worse");
        assert_eq!(json["worse"], 1);
        let missing = dir.path().join("missing.json");
        let e = compare(&old, &missing, 0.15, false).unwrap_err();
        assert!(format!("{e:#}").contains("missing.json"), "{e:#}");
        std::fs::write(&missing, "[]").unwrap();
        let e = compare(&missing, &new, 0.15, false).unwrap_err();
        assert!(
            format!("{e:#}").contains("missing.json is not a bench report"),
            "{e:#}"
        );
        assert!(compare(&old, &new, -1.0, false).is_err());
    }
}
