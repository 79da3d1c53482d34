//! The markdown of one group of figures: a view made for the group (IOPS by iodepth per job
//! kind, the hit-ratio sweep, the object size × block size matrix, a job × target grid for
//! the rest) followed by the table of every figure with its spread, ratio, CPU, RSS and goal.

use std::fmt::Write as _;

use super::query::{
    direction, distinct, fmt_number, fmt_ratio, fmt_value, job_kind, param_f64, param_str,
    reference_name, size_label, targets,
};
use super::table::Table;
use crate::figures::Figure;

/// Parameters the job name already tells (so the detail table leaves them out).
const PARAMS_IN_JOB_NAME: &[&str] = &["rw", "bs", "iodepth", "numjobs", "engine"];

/// The heading words of the groups the runner writes.
fn group_title(group: &str) -> &str {
    match group {
        "iops" => "random I/O, IOPS by iodepth and numjobs",
        "sweep" => "cache hit-ratio sweep",
        "throughput" => "sequential throughput by block size",
        "objsize" => "object size × block size",
        "cache" => "the object cache",
        "flush" => "flushing the cache",
        "sheepfs" => "sheepfs",
        "dog" => "dog against cp",
        "scaling" => "nodes and copies",
        "metadata" => "metadata operations (lower is better)",
        "handover" => "lock hand-over between two mounts (lower is better)",
        "raid" => "redundancy × object size × block size (the RAID HOWTO's table)",
        _ => "",
    }
}

/// The section of a group: heading, its own view, then every figure. `figs` is non-empty
/// and sorted by job, then target.
pub fn section(group: &str, figs: &[&Figure]) -> String {
    let mut out = match group_title(group) {
        "" => format!("## {group}\n\n"),
        title => format!("## {group}: {title}\n\n"),
    };
    let view = match group {
        "iops" => iops_view(figs),
        "sweep" => sweep_view(figs),
        "objsize" => objsize_view(figs),
        "handover" => super::handover::view(figs),
        "raid" => super::raid::view(figs),
        _ => job_grid(figs),
    };
    let details = detail_table(figs).render();
    if view.is_empty() {
        out.push_str(&details);
    } else {
        // The view tells the story; every figure stays one click away.
        let n = figs.len();
        let summary = format!("<summary>Every figure of {group} ({n})</summary>");
        let _ = write!(
            out,
            "{}\n\n<details>{summary}\n\n{details}\n</details>\n",
            view.trim_end()
        );
    }
    out.push('\n');
    out
}

/// Other groups: a row per job, a column per target, when that makes a grid.
fn job_grid(figs: &[&Figure]) -> String {
    let table = grid(figs, "job", |f| f.job.clone());
    match distinct(figs.iter().map(|f| f.unit.as_str())).as_slice() {
        _ if table.is_empty() => String::new(),
        [unit] => format!("{unit} by job and target:\n\n{}", table.render()),
        _ => table.render(),
    }
}

/// A table with a row per key (first-seen order) and a column per target, cells the value.
/// Empty unless it is a grid (two keys, two targets, and some key with two targets): for
/// anything thinner the detail table says it all.
fn grid(figs: &[&Figure], key_name: &str, key: impl Fn(&Figure) -> String) -> Table {
    let cols = targets(figs.iter().copied());
    let keys = distinct(figs.iter().map(|f| key(f)));
    let mixed_units = distinct(figs.iter().map(|f| f.unit.as_str())).len() > 1;
    let mut headers = vec![key_name.to_string()];
    headers.extend(cols.iter().map(|t| t.to_string()));
    let mut table = Table::new(&headers);
    if keys.len() < 2 || cols.len() < 2 || figs.len() <= keys.len() {
        return table;
    }
    for k in keys {
        let mut cells = vec![k.clone()];
        for t in &cols {
            let cell = figs.iter().find(|f| f.target == *t && key(f) == k);
            cells.push(cell.map_or(String::new(), |f| match mixed_units {
                true => fmt_value(f.value, &f.unit),
                false => fmt_number(f.value, &f.unit),
            }));
        }
        table.row(cells);
    }
    table
}

/// Group "iops": per job kind and engine, a grid with a row per iodepth (or numjobs, when
/// that is what varies) and a column per target.
fn iops_view(figs: &[&Figure]) -> String {
    let parts = distinct(figs.iter().map(|f| (job_kind(f), param_str(f, "engine"))));
    let mut out = String::new();
    for (kind, engine) in parts {
        let part: Vec<&Figure> = figs
            .iter()
            .copied()
            .filter(|f| job_kind(f) == kind && param_str(f, "engine") == engine)
            .collect();
        let varies = |p: &&str| {
            part.iter().all(|f| param_f64(f, p).is_some())
                && distinct(part.iter().filter_map(|f| param_f64(f, p))).len() > 1
        };
        let shape = ["iodepth", "numjobs"].into_iter().find(varies);
        let table = match shape {
            Some(p) => grid(&part, p, |f| format!("{}", param_f64(f, p).unwrap_or(0.0))),
            None => grid(&part, "job", |f| f.job.clone()),
        };
        if table.is_empty() {
            continue;
        }
        let unit = &part[0].unit;
        let engine = engine.map_or(String::new(), |e| format!(", {e}"));
        let _ = write!(out, "**{kind}{engine}** ({unit}):\n\n{}\n", table.render());
    }
    out
}

/// Group "sweep": a row per cache size (hit_pct) with the measured hit ratio, the value and
/// the ratio to the cache-off figure (the one its goal checks, else the ratio of the values).
fn sweep_view(figs: &[&Figure]) -> String {
    let (off, mut cache): (Vec<&Figure>, Vec<&Figure>) =
        figs.iter().copied().partition(|f| f.target == "off");
    cache.retain(|f| param_f64(f, "hit_pct").is_some());
    if cache.is_empty() {
        return String::new();
    }
    cache.sort_by(|a, b| {
        let pct = |f: &Figure| param_f64(f, "hit_pct").unwrap_or(0.0);
        pct(a)
            .total_cmp(&pct(b))
            .then_with(|| a.target.cmp(&b.target))
    });
    let several = distinct(cache.iter().map(|f| f.target.as_str())).len() > 1;
    let mut t = Table::new(&[
        "cache size (% of file)",
        "target",
        "measured hit ratio",
        "value",
        "÷ off",
    ]);
    for f in &cache {
        let pct = param_f64(f, "hit_pct").unwrap_or(0.0);
        let off_value = off
            .iter()
            .find(|o| param_f64(o, "hit_pct") == Some(pct))
            .or(off.first())
            .map(|o| o.value);
        // The ratio the goal checks (the median of per-round ratios) when there is one.
        let ratio = f
            .goal_ratio
            .or(param_f64(f, "ratio_off"))
            .or(off_value.map(|v| f.value / v));
        t.row(vec![
            format!("{pct:.0}%"),
            if several {
                f.target.clone()
            } else {
                String::new()
            },
            param_f64(f, "hit_ratio_measured").map_or(String::new(), hit_ratio),
            fmt_value(f.value, &f.unit),
            ratio.map_or(String::new(), fmt_ratio),
        ]);
    }
    let mut out = String::new();
    if let [o] = off.as_slice() {
        let _ = writeln!(out, "Cache off: {}.\n", fmt_value(o.value, &o.unit));
    }
    out.push_str(&t.render());
    out
}

/// A measured hit ratio: a fraction (0..=1) or already a percentage.
fn hit_ratio(v: f64) -> String {
    let pct = if v <= 1.0 { v * 100.0 } else { v };
    format!("{pct:.0}%")
}

/// Group "objsize": per direction and target, a matrix of object size (rows) × block size
/// (columns), cells the value (MiB/s).
fn objsize_view(figs: &[&Figure]) -> String {
    let sized: Vec<&Figure> = figs
        .iter()
        .copied()
        .filter(|f| param_f64(f, "object_size").is_some() && param_f64(f, "bs").is_some())
        .collect();
    let parts = distinct(sized.iter().map(|f| (direction(f), &f.target)));
    let mut out = String::new();
    for (dir, target) in parts {
        let part: Vec<&Figure> = sized
            .iter()
            .copied()
            .filter(|f| direction(f) == dir && &f.target == target)
            .collect();
        let dir = dir.unwrap_or("mixed");
        let _ = write!(
            out,
            "**{dir}** ({target}, {}):\n\n{}\n",
            part[0].unit,
            matrix(&part).render()
        );
    }
    out
}

/// Object size × block size; every figure has both parameters.
fn matrix(figs: &[&Figure]) -> Table {
    let sorted = |key: &str| {
        let mut v = distinct(figs.iter().filter_map(|f| param_f64(f, key)));
        v.sort_by(f64::total_cmp);
        v
    };
    let (objs, bss) = (sorted("object_size"), sorted("bs"));
    let mut headers = vec!["object size \\ block size".to_string()];
    headers.extend(bss.iter().map(|&b| size_label(b)));
    let mut table = Table::new(&headers);
    for o in objs {
        let mut cells = vec![size_label(o)];
        for &b in &bss {
            let f = figs
                .iter()
                .find(|f| param_f64(f, "object_size") == Some(o) && param_f64(f, "bs") == Some(b));
            cells.push(f.map_or(String::new(), |f| fmt_number(f.value, &f.unit)));
        }
        table.row(cells);
    }
    table
}

/// Every figure with everything measured about it.
fn detail_table(figs: &[&Figure]) -> Table {
    let mut t = Table::new(&[
        "job",
        "target",
        "params",
        "value",
        "spread (runs)",
        "ratio",
        "CPU s/GiB",
        "RSS sheepfs",
        "RSS largest sheep",
        "goal",
        "met",
    ]);
    for f in figs {
        t.row(vec![
            f.job.clone(),
            f.target.clone(),
            other_params(f),
            fmt_value(f.value, &f.unit),
            spread_cell(f),
            ratio_cell(f),
            f.cpu_s_per_gib.map_or(String::new(), |c| format!("{c:.2}")),
            f.peak_rss_kib
                .get("sheepfs")
                .map_or(String::new(), |&k| mib(k)),
            largest_sheep_rss(f).map_or(String::new(), mib),
            f.goal.clone().unwrap_or_default(),
            met_cell(f),
        ]);
    }
    t
}

/// The parameters the job name does not tell: "object_size=4M, hit_pct=50". Lists and maps
/// (such as `cache_rounds`, the cache's counters per run) stay in the JSON only.
fn other_params(f: &Figure) -> String {
    f.params
        .iter()
        .filter(|(_, v)| !v.is_array() && !v.is_object())
        .map(|(k, _)| k)
        .filter(|k| !PARAMS_IN_JOB_NAME.contains(&k.as_str()))
        .filter_map(|k| {
            let v = match k.as_str() {
                "object_size" => param_f64(f, k).map(size_label),
                _ => param_str(f, k),
            }?;
            Some(format!("{k}={v}"))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// "min–max (n)" for a figure measured more than once.
fn spread_cell(f: &Figure) -> String {
    if f.runs.len() < 2 {
        return String::new();
    }
    let (lo, hi) = f.spread();
    format!(
        "{}–{} ({})",
        fmt_number(lo, &f.unit),
        fmt_number(hi, &f.unit),
        f.runs.len()
    )
}

/// "0.87× bindfs".
pub fn ratio_cell(f: &Figure) -> String {
    match (f.ratio, &f.reference) {
        (Some(r), Some(reference)) => format!("{}× {}", fmt_ratio(r), reference_name(f, reference)),
        (Some(r), None) => format!("{}×", fmt_ratio(r)),
        _ => String::new(),
    }
}

/// "met", "**not met**", or "?" for a goal not checked.
pub fn met_cell(f: &Figure) -> String {
    match (f.goal_met, &f.goal) {
        (Some(true), _) => "met".into(),
        (Some(false), _) => "**not met**".into(),
        (None, Some(_)) => "?".into(),
        (None, None) => String::new(),
    }
}

/// The peak RSS of the largest node ("sheep0", "sheep1", ...; not "sheepfs").
fn largest_sheep_rss(f: &Figure) -> Option<u64> {
    f.peak_rss_kib
        .iter()
        .filter(|(name, _)| name.starts_with("sheep") && name.as_str() != "sheepfs")
        .map(|(_, &kib)| kib)
        .max()
}

/// KiB as whole MiB.
fn mib(kib: u64) -> String {
    format!("{:.0} MiB", kib as f64 / 1024.0)
}
