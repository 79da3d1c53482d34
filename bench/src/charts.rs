//! The charts of a report: which exist (a chart is drawn only when its figures are in the
//! report) and what they plot. [`plan`] picks the data, `draw` renders each chart twice with
//! plotters, as `<stem>.svg` and `<stem>.png`, in a build with the `charts` feature; without
//! it, [`draw_all`] fails saying how to get one (the plans are still made and tested).
//!
//! | stem | from group | x | y |
//! |---|---|---|---|
//! | `iops-vs-iodepth-<kind>` | iops, engine libaio | iodepth | IOPS, a line per target |
//! | `iops-vs-numjobs-<kind>` | iops, engine psync | numjobs | IOPS, a line per target |
//! | `throughput-vs-bs-<read\|write>` | throughput | block size | MiB/s, a line per target |
//! | `iops-vs-hit-ratio` | sweep | cache size, % of file | IOPS; cache off as a line |
//! | `ratio-to-bindfs` | any | ratio to the bindfs figure | a bar per figure |
//! | `objsize-<read\|write>[-<target>]` | objsize | object size | MiB/s, a bar per block size |
//! | `raid-<read\|write>` | raid | copies and object size | MiB/s, a bar per block size |
//! | `scale-vs-nodes` | scale | nodes | entries fetched per object owned (join, kill) |
//! | `scale-vs-objects` | scale | objects per node | a restarted node's plan, ms |

// Without the feature nothing reads the plotted data but the tests.
#![cfg_attr(not(feature = "charts"), allow(dead_code))]

#[cfg(feature = "charts")]
mod draw;
mod scale;

use std::path::Path;

use anyhow::{Context, Result};

use crate::figures::{Figure, Report};
use crate::report::query::{
    direction, distinct, job_kind, natural_cmp, param_f64, param_str, reference_target, size_label,
    target_cmp, targets,
};

/// A chart that was drawn: `<stem>.svg` and `<stem>.png` in the charts directory.
#[derive(Debug, Clone, PartialEq)]
pub struct Drawn {
    pub stem: String,
    pub title: String,
}

/// One chart, independent of the backend that draws it.
#[derive(Debug)]
pub struct Chart {
    pub stem: String,
    pub title: String,
    pub plot: Plot,
}

#[derive(Debug)]
pub enum Plot {
    /// Lines over categories (x = index into `categories`) or over numbers.
    Lines(Lines),
    /// Horizontal bars (a label and a value each) with vertical marks.
    Bars(Bars),
    /// Per category on the x axis, a bar per series.
    Grouped(Grouped),
}

#[derive(Debug)]
pub struct Lines {
    pub x_desc: String,
    pub y_desc: String,
    /// Labels of x = 0, 1, ...; empty for a numeric x axis.
    pub categories: Vec<String>,
    pub series: Vec<Series>,
    /// Horizontal reference lines: name and y.
    pub levels: Vec<(String, f64)>,
}

#[derive(Debug)]
pub struct Series {
    pub name: String,
    /// (x, y, label written next to the point, may be empty), sorted by x.
    pub points: Vec<(f64, f64, String)>,
}

#[derive(Debug)]
pub struct Bars {
    pub x_desc: String,
    pub bars: Vec<(String, f64)>,
    /// Values marked by a vertical line (1.0 and 0.9 for ratios).
    pub marks: Vec<f64>,
}

#[derive(Debug)]
pub struct Grouped {
    pub x_desc: String,
    pub y_desc: String,
    pub categories: Vec<String>,
    /// Name and one value per category.
    pub series: Vec<(String, Vec<Option<f64>>)>,
}

/// The charts a report has data for, and a note for each chart left out.
pub fn plan(r: &Report) -> (Vec<Chart>, Vec<String>) {
    let mut charts = Vec::new();
    let mut notes = Vec::new();
    let mut take = |(c, n): (Vec<Chart>, Vec<String>)| {
        charts.extend(c);
        notes.extend(n);
    };
    take(iops_vs(r, "iodepth", "libaio"));
    take(iops_vs(r, "numjobs", "psync"));
    for dir in ["read", "write"] {
        take(split(throughput_vs_bs(r, dir)));
    }
    take(split(hit_ratio(r)));
    take(split(ratio_to_bindfs(r)));
    for dir in ["read", "write"] {
        take(objsize(r, dir));
    }
    for dir in ["read", "write"] {
        take(split(raid(r, dir)));
    }
    take(split(scale::by_nodes(r)));
    take(split(scale::by_objects(r)));
    (charts, notes)
}

/// A chart or the note why not, as lists.
fn split(c: Result<Chart, String>) -> (Vec<Chart>, Vec<String>) {
    match c {
        Ok(c) => (vec![c], Vec::new()),
        Err(n) => (Vec::new(), vec![n]),
    }
}

/// Draws every chart of [`plan`] into `dir` (created if missing), prints the notes on
/// stderr, and returns what was drawn.
pub fn draw_all(r: &Report, dir: &Path) -> Result<Vec<Drawn>> {
    if !cfg!(feature = "charts") {
        anyhow::bail!("{NO_CHARTS}");
    }
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let (charts, notes) = plan(r);
    for n in &notes {
        eprintln!("bench report: chart skipped: {n}");
    }
    let mut drawn = Vec::new();
    for c in &charts {
        render(c, dir)?;
        drawn.push(Drawn {
            stem: c.stem.clone(),
            title: c.title.clone(),
        });
    }
    Ok(drawn)
}

/// What `--charts` says in a build without the `charts` feature.
pub const NO_CHARTS: &str = "this bench was built without charts: build it with \
     `cargo build --release -p bench --features charts` (make bench and make bench-quick do) \
     to draw them, or leave out --charts";

#[cfg(feature = "charts")]
use draw::render;

#[cfg(not(feature = "charts"))]
fn render(_: &Chart, _: &Path) -> Result<()> {
    anyhow::bail!("{NO_CHARTS}")
}

/// A line per target of `figs`: points at `x(f)`, labelled `label(f)`, sorted by x.
fn lines_by_target(
    figs: &[&Figure],
    x: impl Fn(&Figure) -> Option<f64>,
    label: impl Fn(&Figure) -> String,
) -> Vec<Series> {
    targets(figs.iter().copied())
        .into_iter()
        .map(|t| {
            let mut points: Vec<(f64, f64, String)> = figs
                .iter()
                .filter(|f| f.target == t)
                .filter_map(|f| Some((x(f)?, f.value, label(f))))
                .collect();
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            Series {
                name: t.to_string(),
                points,
            }
        })
        .collect()
}

/// The position of a figure's `key` parameter among `values`: its x on a categorical axis.
fn category_of(f: &Figure, key: &str, values: &[f64]) -> Option<f64> {
    let v = param_f64(f, key)?;
    values.iter().position(|&c| c == v).map(|i| i as f64)
}

/// Distinct values of a numeric parameter, ascending.
fn sorted_values(figs: &[&Figure], key: &str) -> Vec<f64> {
    let mut v = distinct(figs.iter().filter_map(|f| param_f64(f, key)));
    v.sort_by(f64::total_cmp);
    v
}

/// Group "iops", one engine: per job kind, IOPS against `shape` (iodepth or numjobs).
fn iops_vs(r: &Report, shape: &str, engine: &str) -> (Vec<Chart>, Vec<String>) {
    let figs: Vec<&Figure> = r
        .figures
        .iter()
        .filter(|f| f.group == "iops" && param_str(f, "engine").as_deref() == Some(engine))
        .filter(|f| param_f64(f, shape).is_some())
        .collect();
    if figs.is_empty() {
        let note = format!("iops-vs-{shape}: no {engine} figure with {shape} in group iops");
        return (Vec::new(), vec![note]);
    }
    let mut kinds = distinct(figs.iter().map(|f| job_kind(f)));
    kinds.sort_by(|a, b| natural_cmp(a, b));
    let mut charts = Vec::new();
    let mut notes = Vec::new();
    for kind in kinds {
        let stem = format!("iops-vs-{shape}-{kind}");
        let part: Vec<&Figure> = figs
            .iter()
            .copied()
            .filter(|f| job_kind(f) == kind)
            .collect();
        let xs = sorted_values(&part, shape);
        if xs.len() < 2 {
            notes.push(format!("{stem}: a single {shape}"));
            continue;
        }
        let series = lines_by_target(&part, |f| category_of(f, shape, &xs), |_| String::new());
        charts.push(Chart {
            title: format!("{kind}, {engine}: IOPS by {shape}"),
            stem,
            plot: Plot::Lines(Lines {
                x_desc: shape.into(),
                y_desc: "IOPS".into(),
                categories: xs.iter().map(|x| format!("{x}")).collect(),
                series,
                levels: Vec::new(),
            }),
        });
    }
    (charts, notes)
}

/// Group "throughput", one direction: MiB/s against the block size, a line per target.
fn throughput_vs_bs(r: &Report, dir: &str) -> Result<Chart, String> {
    let stem = format!("throughput-vs-bs-{dir}");
    let figs: Vec<&Figure> = r
        .figures
        .iter()
        .filter(|f| f.group == "throughput" && direction(f) == Some(dir))
        .filter(|f| param_f64(f, "bs").is_some())
        .collect();
    let sizes = sorted_values(&figs, "bs");
    if sizes.len() < 2 {
        return Err(format!("{stem}: fewer than two block sizes"));
    }
    let series = lines_by_target(&figs, |f| category_of(f, "bs", &sizes), |_| String::new());
    Ok(Chart {
        title: format!("Sequential {dir}: MiB/s by block size"),
        stem,
        plot: Plot::Lines(Lines {
            x_desc: "block size".into(),
            y_desc: figs[0].unit.clone(),
            categories: sizes.iter().map(|&b| size_label(b)).collect(),
            series,
            levels: Vec::new(),
        }),
    })
}

/// Group "sweep": the cache's IOPS against the cache size (% of the file), each point
/// labelled with the measured hit ratio; cache off as a level (or a line when measured at
/// every point).
fn hit_ratio(r: &Report) -> Result<Chart, String> {
    let figs: Vec<&Figure> = r.figures.iter().filter(|f| f.group == "sweep").collect();
    let (off, cache): (Vec<&Figure>, Vec<&Figure>) = figs.iter().partition(|f| f.target == "off");
    let cache: Vec<&Figure> = cache
        .into_iter()
        .filter(|f| param_f64(f, "hit_pct").is_some())
        .collect();
    if sorted_values(&cache, "hit_pct").len() < 2 {
        return Err("iops-vs-hit-ratio: fewer than two hit_pct points in group sweep".into());
    }
    let pct = |f: &Figure| param_f64(f, "hit_pct");
    let mut series = lines_by_target(&cache, pct, |f| {
        param_f64(f, "hit_ratio_measured")
            .map(|h| format!("{:.0}% hits", if h <= 1.0 { h * 100.0 } else { h }))
            .unwrap_or_default()
    });
    let mut levels = Vec::new();
    // Without an off figure in the group, the one the sweep points are compared with.
    let referenced = cache
        .iter()
        .find_map(|f| f.params.get("reference_off")?.as_str())
        .and_then(|id| r.figures.iter().find(|f| f.id == id));
    match off.as_slice() {
        [] => {
            if let Some(o) = referenced {
                levels.push(("off (no cache)".to_string(), o.value));
            }
        }
        [o] => levels.push(("off (no cache)".to_string(), o.value)),
        several => series.extend(lines_by_target(several, pct, |_| String::new())),
    }
    Ok(Chart {
        stem: "iops-vs-hit-ratio".into(),
        title: "Cache hit-ratio sweep: IOPS by cache size".into(),
        plot: Plot::Lines(Lines {
            x_desc: "cache size, % of the file (hit_pct)".into(),
            y_desc: cache[0].unit.clone(),
            categories: Vec::new(),
            series,
            levels,
        }),
    })
}

/// Every figure whose reference is a bindfs figure: its ratio, as a bar.
fn ratio_to_bindfs(r: &Report) -> Result<Chart, String> {
    let mut figs: Vec<&Figure> = r
        .figures
        .iter()
        .filter(|f| f.ratio.is_some_and(f64::is_finite))
        .filter(|f| f.reference.as_deref().map(reference_target) == Some("bindfs"))
        .collect();
    if figs.is_empty() {
        return Err("ratio-to-bindfs: no figure has a bindfs reference".into());
    }
    figs.sort_by(|a, b| {
        (a.group.cmp(&b.group))
            .then(natural_cmp(&a.job, &b.job))
            .then(target_cmp(&a.target, &b.target))
    });
    let bars = figs
        .iter()
        .map(|f| (format!("{} {}", f.job, f.target), f.ratio.unwrap_or(0.0)))
        .collect();
    Ok(Chart {
        stem: "ratio-to-bindfs".into(),
        title: "Ratio to bindfs --multithreaded (same job, same run)".into(),
        plot: Plot::Bars(Bars {
            x_desc: "figure ÷ bindfs".into(),
            bars,
            marks: vec![0.9, 1.0],
        }),
    })
}

/// Group "objsize", one direction: per target, bars per object size, one per block size.
fn objsize(r: &Report, dir: &str) -> (Vec<Chart>, Vec<String>) {
    let figs: Vec<&Figure> = r
        .figures
        .iter()
        .filter(|f| f.group == "objsize" && direction(f) == Some(dir))
        .filter(|f| param_f64(f, "object_size").is_some() && param_f64(f, "bs").is_some())
        .collect();
    if figs.is_empty() {
        let note = format!("objsize-{dir}: no {dir} figure with object_size and bs");
        return (Vec::new(), vec![note]);
    }
    let all_targets = targets(figs.iter().copied());
    let charts = all_targets
        .iter()
        .map(|t| {
            let part: Vec<&Figure> = figs.iter().copied().filter(|f| f.target == *t).collect();
            let objs = sorted_values(&part, "object_size");
            let series = sorted_values(&part, "bs")
                .into_iter()
                .map(|bs| {
                    let value = |o: &f64| {
                        part.iter()
                            .find(|f| {
                                param_f64(f, "bs") == Some(bs)
                                    && param_f64(f, "object_size") == Some(*o)
                            })
                            .map(|f| f.value)
                    };
                    (
                        format!("bs {}", size_label(bs)),
                        objs.iter().map(value).collect(),
                    )
                })
                .collect();
            let stem = match all_targets.len() {
                1 => format!("objsize-{dir}"),
                _ => format!("objsize-{dir}-{t}"),
            };
            Chart {
                title: format!("Sequential {dir} ({t}): MiB/s by object size and block size"),
                stem,
                plot: Plot::Grouped(Grouped {
                    x_desc: "object size".into(),
                    y_desc: part[0].unit.clone(),
                    categories: objs.iter().map(|&o| size_label(o)).collect(),
                    series,
                }),
            }
        })
        .collect();
    (charts, Vec::new())
}

/// Group "raid", one direction: bars per scheme and object size, one per block size.
fn raid(r: &Report, dir: &str) -> Result<Chart, String> {
    let figs: Vec<&Figure> = (r.figures.iter())
        .filter(|f| f.group == "raid" && !f.job.contains("-down"))
        .filter(|f| param_str(f, "rw").as_deref() == Some(dir))
        .filter(|f| param_f64(f, "object_size").is_some() && param_f64(f, "bs").is_some())
        .collect();
    if figs.is_empty() {
        return Err(format!(
            "raid-{dir}: no sequential {dir} figure of group raid"
        ));
    }
    let rows = distinct(
        figs.iter()
            .filter_map(|f| Some((param_str(f, "redundancy")?, param_f64(f, "object_size")?))),
    );
    let series = sorted_values(&figs, "bs")
        .into_iter()
        .map(|bs| {
            let value = |row: &(String, f64)| {
                figs.iter()
                    .find(|f| {
                        param_str(f, "redundancy").as_ref() == Some(&row.0)
                            && param_f64(f, "object_size") == Some(row.1)
                            && param_f64(f, "bs") == Some(bs)
                    })
                    .map(|f| f.value)
            };
            (
                format!("bs {}", size_label(bs)),
                rows.iter().map(value).collect(),
            )
        })
        .collect();
    Ok(Chart {
        title: format!("Sequential {dir}: MiB/s by copies, object size and block size"),
        stem: format!("raid-{dir}"),
        plot: Plot::Grouped(Grouped {
            x_desc: "copies, object size".into(),
            y_desc: figs[0].unit.clone(),
            categories: (rows.iter())
                .map(|(s, o)| format!("{s} {}", size_label(*o)))
                .collect(),
            series,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::fixture;

    fn stems(charts: &[Chart]) -> Vec<&str> {
        charts.iter().map(|c| c.stem.as_str()).collect()
    }

    #[test]
    fn full_report_plans_every_chart() {
        let (charts, notes) = plan(&fixture::full());
        assert_eq!(
            stems(&charts),
            [
                "iops-vs-iodepth-mix-4k",
                "iops-vs-iodepth-randread-4k",
                "iops-vs-numjobs-mix-4k",
                "iops-vs-numjobs-randread-4k",
                "throughput-vs-bs-read",
                "throughput-vs-bs-write",
                "iops-vs-hit-ratio",
                "ratio-to-bindfs",
                "objsize-read",
                "objsize-write",
                "raid-read",
                "raid-write",
                "scale-vs-nodes",
                "scale-vs-objects",
            ]
        );
        assert!(notes.is_empty(), "{notes:?}");
    }

    #[test]
    fn iodepth_lines_per_target_in_order() {
        let (charts, _) = plan(&fixture::full());
        let Plot::Lines(l) = &charts[1].plot else {
            panic!("not lines")
        };
        assert_eq!(l.categories, ["1", "4", "16", "64"]);
        let names: Vec<&str> = l.series.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["raw", "bindfs", "off", "cold", "warm"]);
        let warm: Vec<(f64, f64)> = l.series[4].points.iter().map(|p| (p.0, p.1)).collect();
        assert_eq!(warm[0], (0.0, 36000.0));
        assert_eq!(warm.len(), 4);
    }

    #[test]
    fn hit_ratio_has_off_level_and_hit_labels() {
        let (charts, _) = plan(&fixture::full());
        let c = charts
            .iter()
            .find(|c| c.stem == "iops-vs-hit-ratio")
            .unwrap();
        let Plot::Lines(l) = &c.plot else {
            panic!("not lines")
        };
        assert!(l.categories.is_empty());
        assert_eq!(l.levels, [("off (no cache)".to_string(), 38000.0)]);
        assert_eq!(l.series[0].points[1], (25.0, 30000.0, "9% hits".into()));
    }

    #[test]
    fn ratio_bars_only_for_bindfs_references() {
        let (charts, _) = plan(&fixture::full());
        let c = charts.iter().find(|c| c.stem == "ratio-to-bindfs").unwrap();
        let Plot::Bars(b) = &c.plot else {
            panic!("not bars")
        };
        assert!(b.bars.iter().all(|(name, _)| !name.ends_with(" cold")));
        assert!(b
            .bars
            .contains(&("randread-4k-libaio-qd1 warm".into(), 1.2)));
        assert_eq!(b.marks, [0.9, 1.0]);
    }

    #[test]
    fn objsize_bars_per_block_size() {
        let (charts, _) = plan(&fixture::full());
        let c = charts.iter().find(|c| c.stem == "objsize-write").unwrap();
        let Plot::Grouped(g) = &c.plot else {
            panic!("not grouped")
        };
        assert_eq!(g.categories, ["1M", "4M", "16M"]);
        let names: Vec<&str> = g.series.iter().map(|s| s.0.as_str()).collect();
        assert_eq!(names, ["bs 64K", "bs 1M", "bs 4M"]);
        assert!(g.series.iter().all(|s| s.1.iter().all(Option::is_some)));
    }

    #[cfg(feature = "charts")]
    #[test]
    fn draws_svg_and_png_for_a_full_report() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("charts");
        let drawn = draw_all(&fixture::full(), &out).unwrap();
        assert_eq!(drawn.len(), 10);
        for d in &drawn {
            for ext in ["svg", "png"] {
                let path = out.join(format!("{}.{ext}", d.stem));
                let len = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
                assert!(len > 1000, "{} is {len} bytes", path.display());
            }
        }
        let png = std::fs::read(out.join("ratio-to-bindfs.png")).unwrap();
        assert_eq!(&png[1..4], b"PNG");
    }

    #[test]
    fn empty_report_draws_nothing_and_says_why() {
        #[cfg(feature = "charts")]
        {
            let dir = tempfile::tempdir().unwrap();
            assert!(draw_all(&fixture::empty(), dir.path()).unwrap().is_empty());
        }
        let (_, notes) = plan(&fixture::empty());
        assert!(notes.iter().any(|n| n.starts_with("iops-vs-iodepth")));
        assert!(notes.iter().any(|n| n.starts_with("ratio-to-bindfs")));
        assert!(notes.iter().any(|n| n.starts_with("objsize-write")));
    }

    #[test]
    fn smoke_subsets_and_odd_params_do_not_panic() {
        let mut r = fixture::empty();
        // One iodepth only, a parameter of the wrong type, a figure with no params.
        let qd = serde_json::json!({"engine": "libaio", "iodepth": 1});
        r.figures.push(fixture::with_params(
            fixture::fig("iops", "randread-4k-libaio-qd1", "off", "IOPS", 10.0),
            qd,
        ));
        let bad = serde_json::json!({"bs": "huge", "rw": 7, "object_size": [1]});
        r.figures.push(fixture::with_params(
            fixture::fig("throughput", "read-1m", "off", "MiB/s", 1.0),
            bad.clone(),
        ));
        r.figures.push(fixture::with_params(
            fixture::fig("objsize", "read-1m", "off", "MiB/s", 1.0),
            bad,
        ));
        r.figures
            .push(fixture::fig("sweep", "x", "cache", "IOPS", 1.0));
        let (charts, notes) = plan(&r);
        assert!(charts.is_empty(), "{:?}", stems(&charts));
        assert!(
            notes.iter().any(|n| n.contains("a single iodepth")),
            "{notes:?}"
        );
        #[cfg(feature = "charts")]
        {
            let dir = tempfile::tempdir().unwrap();
            assert!(draw_all(&r, dir.path()).unwrap().is_empty());
        }
    }

    #[cfg(not(feature = "charts"))]
    #[test]
    fn without_the_feature_charts_fail_saying_how_to_get_them() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("charts");
        let e = draw_all(&fixture::full(), &out).unwrap_err().to_string();
        assert!(e.contains("--features charts"), "{e}");
        assert!(!out.exists(), "nothing is made before the error");
    }
}
