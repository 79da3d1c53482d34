//! `bench report`: a report's figures as markdown (goals first, then a section per group) and,
//! with a charts directory, as charts linked from the markdown.
//!
//! ```text
//! # Benchmark report        machine, config, start/finish, command
//! ## Goals                  every figure with a goal: value, ratio (and per round), met / not met
//! ## Charts                 links to <charts dir>/<name>.svg, relative to the markdown file
//! ## iops: ...              a view made for the group, then every figure of it
//! ## sweep: ...
//! ```

#[cfg(test)]
pub(crate) mod fixture;
mod handover;
mod layouts;
pub(crate) mod query;
mod raid;
mod table;

use std::fmt::Write as _;
use std::path::{Component, Path, PathBuf};

use anyhow::{Context, Result};
use serde_json::Value;

use crate::charts::{self, Drawn};
use crate::figures::{Figure, Report};
use query::{distinct, fmt_value, natural_cmp, size_label, target_cmp};
use table::Table;

/// Groups in the order of their sections; groups not listed follow alphabetically.
const GROUP_ORDER: &[&str] = &[
    "iops",
    "sweep",
    "throughput",
    "objsize",
    "cache",
    "flush",
    "sheepfs",
    "dog",
    "scaling",
    "metadata",
    "snapshot",
    "handover",
    "raid",
];

/// Loads `json`, draws the charts into `charts` (created if missing) when given, and writes
/// the markdown to `markdown` or stdout. Chart links are relative to the markdown file's
/// directory (to the current directory for stdout), so `--markdown docs/benchmarks.md
/// --charts docs/bench` links `bench/<name>.svg`.
pub fn report(json: &Path, markdown: Option<&Path>, charts: Option<&Path>) -> Result<()> {
    let r = Report::load(json)?;
    let (drawn, prefix) = match charts {
        Some(dir) => (charts::draw_all(&r, dir)?, link_prefix(markdown, dir)?),
        None => (Vec::new(), String::new()),
    };
    let text = render(&r, &drawn, &prefix);
    match markdown {
        Some(path) => {
            std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
        }
        None => {
            print!("{text}");
            Ok(())
        }
    }
}

/// The whole markdown of a report; `charts` were drawn into the directory that `prefix`
/// (empty or ending with '/') leads to from the markdown.
pub fn render(r: &Report, charts: &[Drawn], prefix: &str) -> String {
    let mut out = header(r);
    out.push_str(&goals(&r.figures));
    if !charts.is_empty() {
        out.push_str("## Charts\n\n");
        for c in charts {
            let _ = writeln!(out, "![{}]({prefix}{}.svg)\n", c.title, c.stem);
        }
    }
    for group in group_order(&r.figures) {
        let mut figs: Vec<&Figure> = r.figures.iter().filter(|f| f.group == group).collect();
        figs.sort_by(|a, b| natural_cmp(&a.job, &b.job).then(target_cmp(&a.target, &b.target)));
        out.push_str(&layouts::section(group, &figs));
    }
    out
}

/// Title, machine, configuration, times and command.
fn header(r: &Report) -> String {
    let m = &r.machine;
    let c = &r.config;
    format!(
        "# Benchmark report\n\n\
         - Machine: {} CPUs ({}), {:.1} GiB memory, Linux {}, {} scratch disk, {}\n\
         - Config: {} nodes, {} copies, {} objects, {} MiB file, {} s per job, {} rounds, \
         profile {}\n\
         - Run: {} to {}\n\
         - Command: {}\n\n",
        m.cpus,
        m.cpu_model,
        m.mem_gib,
        m.kernel,
        m.fs,
        m.fio_version,
        c.nodes,
        c.copies,
        size_label(c.object_size as f64),
        c.file_mib,
        c.runtime_s,
        c.rounds,
        c.profile,
        r.started,
        r.finished,
        code_span(&r.command),
    )
}

/// Text as a markdown code span, fenced with more backticks than it holds in a row.
fn code_span(text: &str) -> String {
    let longest = text.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let fence = "`".repeat(longest + 1);
    let pad = if longest > 0 { " " } else { "" };
    format!("{fence}{pad}{text}{pad}{fence}")
}

/// The table of every figure with a goal.
fn goals(figures: &[Figure]) -> String {
    let mut t = Table::new(&["figure", "value", "checked ratio", "by round", "goal", ""]);
    for f in figures.iter().filter(|f| f.goal.is_some()) {
        let rounds = f.params.get("goal_ratio_rounds").and_then(Value::as_array);
        t.row(vec![
            format!("`{}`", f.id),
            fmt_value(f.value, &f.unit),
            f.goal_ratio
                .map(|r| format!("{}×", query::fmt_ratio(r)))
                .unwrap_or_default(),
            rounds.map_or(String::new(), |r| by_round(r)),
            f.goal.clone().unwrap_or_default(),
            layouts::met_cell(f),
        ]);
    }
    if t.is_empty() {
        return "## Goals\n\nNo figure in this report has a goal.\n\n".into();
    }
    let met = figures.iter().filter(|f| f.goal_met == Some(true)).count();
    let total = figures.iter().filter(|f| f.goal.is_some()).count();
    format!("## Goals\n\n{met} of {total} met.\n\n{}\n", t.render())
}

/// The per-round ratios of a goal, each (up to [`BY_ROUND_LISTED`] of them), else their range.
fn by_round(r: &[Value]) -> String {
    let r: Vec<Option<f64>> = r.iter().map(Value::as_f64).collect();
    let each = |x: &Option<f64>| x.map_or("?".into(), query::fmt_ratio);
    let known: Vec<f64> = r.iter().flatten().copied().collect();
    if r.len() <= BY_ROUND_LISTED || known.len() < r.len() {
        return r.iter().map(each).collect::<Vec<_>>().join(" / ");
    }
    let lo = known.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = known.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!(
        "{} pairs, {}–{}",
        r.len(),
        query::fmt_ratio(lo),
        query::fmt_ratio(hi)
    )
}

/// Most per-round ratios the goals table lists one by one (a figure measured in several
/// passes a round has one per pass).
const BY_ROUND_LISTED: usize = 8;

/// The groups present, in section order.
fn group_order(figures: &[Figure]) -> Vec<&str> {
    let mut groups = distinct(figures.iter().map(|f| f.group.as_str()));
    let rank = |g: &str| {
        GROUP_ORDER
            .iter()
            .position(|&k| k == g)
            .unwrap_or(GROUP_ORDER.len())
    };
    groups.sort_by(|a, b| rank(a).cmp(&rank(b)).then_with(|| a.cmp(b)));
    groups
}

/// The path from the markdown's directory (or the current one) to the charts directory, as
/// a link prefix: "" or ending with '/'. Computed on the paths as written (symlinks are not
/// followed).
fn link_prefix(markdown: Option<&Path>, charts: &Path) -> Result<String> {
    let base = match markdown.and_then(Path::parent) {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let base = normalize(&std::path::absolute(&base).context("current directory")?);
    let charts = normalize(&std::path::absolute(charts).context("current directory")?);
    let common = base
        .iter()
        .zip(charts.iter())
        .take_while(|(a, b)| a == b)
        .count();
    let ups = (common..base.iter().count()).map(|_| "..".to_string());
    let downs = charts
        .iter()
        .skip(common)
        .map(|c| c.to_string_lossy().into_owned());
    Ok(ups.chain(downs).map(|c| c + "/").collect())
}

/// An absolute path with "." and ".." resolved by its text.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::CurDir => {}
            Component::ParentDir => {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn full_markdown() -> String {
        let charts = [Drawn {
            stem: "ratio-to-bindfs".into(),
            title: "Ratio to bindfs".into(),
        }];
        render(&fixture::full(), &charts, "bench/")
    }

    #[test]
    fn header_goals_and_links() {
        let md = full_markdown();
        assert!(md.starts_with("# Benchmark report\n"));
        assert!(md.contains("3 nodes, 3 copies, 4M objects, 1024 MiB file, 10 s per job"));
        assert!(md.contains("- Command: `bench run --profile full`"));
        assert!(md.contains("![Ratio to bindfs](bench/ratio-to-bindfs.svg)"));
        let goals = &md[md.find("## Goals").unwrap()..md.find("## Charts").unwrap()];
        assert!(goals.contains("4 of 6 met."), "{goals}");
        assert!(goals.contains(
            "| `iops/randread-4k-libaio-qd1/off` | 7500 IOPS | 0.25× |  | ≥ 0.4× bindfs \
             | **not met** |"
        ));
        assert!(goals.contains(
            "| `iops/randread-4k-libaio-qd1/warm` | 36000 IOPS | 1.20× |  | ≥ 0.9× bindfs \
             | met |"
        ));
        assert!(goals.contains(
            "| `flush/flush-1g/cachectl` | 190 MiB/s | 1.30× | 1.25 / 1.30 / 1.50 | ≥ 0.8× off |"
        ));
    }

    #[test]
    fn long_lists_of_ratios_are_shown_as_their_range() {
        let few: Vec<Value> = [0.9, 1.1].iter().map(|&x| Value::from(x)).collect();
        assert_eq!(by_round(&few), "0.90 / 1.10");
        let many: Vec<Value> = (0..40)
            .map(|i| Value::from(0.8 + i as f64 / 100.0))
            .collect();
        assert_eq!(by_round(&many), "40 pairs, 0.80–1.19");
        let odd = vec![Value::from(1.0), Value::Null];
        assert_eq!(by_round(&odd), "1.00 / ?");
    }

    #[test]
    fn sections_in_group_order() {
        let md = full_markdown();
        let at = |h: &str| md.find(h).unwrap_or_else(|| panic!("no {h}"));
        assert!(at("## iops:") < at("## sweep:"));
        assert!(at("## sweep:") < at("## throughput:"));
        assert!(at("## objsize:") < at("## flush:"));
        assert!(at("## scaling:") < at("## metadata:"));
        assert!(at("## metadata:") < at("## handover:"));
    }

    #[test]
    fn iops_grids_by_iodepth_and_numjobs() {
        let md = full_markdown();
        assert!(md.contains("**randread-4k, libaio** (IOPS):"));
        assert!(md.contains("| iodepth | raw | bindfs | off | cold | warm |"));
        assert!(md.contains("| 1 | 17000 | 30000 | 7500 | 6800 | 36000 |"));
        assert!(md.contains("**mix-4k, psync** (IOPS):"));
        assert!(md.contains("| numjobs | raw | bindfs | off | cold | warm |"));
        let qd4 = md.find("| 4 | ").unwrap();
        let qd16 = md.find("| 16 | ").unwrap();
        assert!(qd4 < qd16, "iodepth rows in numeric order");
    }

    #[test]
    fn detail_rows_carry_spread_ratio_cpu_rss() {
        let md = full_markdown();
        assert!(md.contains(
            "| randread-4k-libaio-qd1 | warm | 36000 IOPS | 34200–37800 (3) | 1.20× bindfs \
             | 1.25 | 70 MiB | 62 MiB | ≥ 0.9× bindfs | met |"
        ));
        assert!(md.contains(
            "| randread-4k-libaio-qd1 | cold | 6800 IOPS | 6460–7140 (3) | 0.91× off | 1.25 \
             | 70 MiB | 62 MiB |"
        ));
    }

    #[test]
    fn sweep_rows_per_hit_pct() {
        let md = full_markdown();
        assert!(md.contains("Cache off: 38000 IOPS."));
        assert!(md.contains("| cache size (% of file) | measured hit ratio | value | ÷ off |"));
        assert!(md.contains("| 25% | 9% | 30000 IOPS | 0.79 |"));
        assert!(md.contains("| 100% | 99% | 183000 IOPS | 4.82 |"));
    }

    #[test]
    fn objsize_matrices_read_and_write() {
        let md = full_markdown();
        assert!(md.contains("**read** (off, MiB/s):"));
        assert!(md.contains("**write** (off, MiB/s):"));
        assert!(md.contains("| object size \\ block size | 64K | 1M | 4M |"));
        assert!(md.contains("| 4M | 220 | 505 | 766 |"), "{md}");
    }

    #[test]
    fn throughput_grid_and_params() {
        let md = full_markdown();
        assert!(md.contains("MiB/s by job and target:"));
        assert!(md.contains("| job | raw | bindfs | off | warm | writeback |"));
        assert!(md.contains("| read-16k | 600 | 900 | 250 | 1100 |  |"));
        assert!(md.contains("| write-1m-n6 | off | copies=3, nodes=6 | 480 MiB/s |"));
    }

    #[test]
    fn thin_groups_get_no_grid() {
        let md = full_markdown();
        let flush = &md[md.find("## flush").unwrap()..md.find("## scaling").unwrap()];
        assert!(!flush.contains("<details>"), "{flush}");
        assert!(flush.contains("| flush-1g | cachectl | 190 MiB/s |"));
    }

    #[test]
    fn empty_report_has_header_and_no_sections() {
        let md = render(&fixture::empty(), &[], "");
        assert!(md.contains("No figure in this report has a goal."));
        assert!(!md.contains("## iops"));
        assert!(!md.contains("## Charts"));
    }

    #[test]
    fn code_span_fences_backticks() {
        assert_eq!(code_span("a b"), "`a b`");
        assert_eq!(code_span("echo `x`"), "`` echo `x` ``");
    }

    #[test]
    fn link_prefix_is_relative_to_the_markdown() {
        let p = |md: Option<&str>, charts: &str| {
            link_prefix(md.map(Path::new), Path::new(charts)).unwrap()
        };
        assert_eq!(p(Some("docs/benchmarks.md"), "docs/bench"), "bench/");
        assert_eq!(p(Some("/a/docs/b.md"), "/a/charts"), "../charts/");
        assert_eq!(p(Some("b.md"), "./x/../charts"), "charts/");
        assert_eq!(p(None, "/tmp/c"), p(Some("./r.md"), "/tmp/c"));
        assert_eq!(p(Some("/a/b.md"), "/a"), "");
    }

    #[cfg(not(feature = "charts"))]
    #[test]
    fn report_without_the_charts_feature_refuses_charts_before_writing() {
        let dir = tempfile::tempdir().unwrap();
        let json = dir.path().join("r.json");
        fixture::full().save(&json).unwrap();
        let md = dir.path().join("r.md");
        let e = report(&json, Some(&md), Some(&dir.path().join("charts"))).unwrap_err();
        assert!(e.to_string().contains("--features charts"), "{e}");
        assert!(!md.exists());
        report(&json, Some(&md), None).unwrap();
        assert!(md.exists());
    }

    #[cfg(feature = "charts")]
    #[test]
    fn report_writes_markdown_and_charts() {
        let dir = tempfile::tempdir().unwrap();
        let json = dir.path().join("r.json");
        fixture::full().save(&json).unwrap();
        let md = dir.path().join("docs/benchmarks.md");
        std::fs::create_dir_all(md.parent().unwrap()).unwrap();
        report(&json, Some(&md), Some(&dir.path().join("docs/bench"))).unwrap();
        let text = std::fs::read_to_string(&md).unwrap();
        assert!(text
            .contains("![Sequential read: MiB/s by block size](bench/throughput-vs-bs-read.svg)"));
        assert!(dir
            .path()
            .join("docs/bench/throughput-vs-bs-read.png")
            .exists());
    }

    #[test]
    fn report_names_a_bad_file() {
        let dir = tempfile::tempdir().unwrap();
        let json = dir.path().join("bad.json");
        std::fs::write(&json, "{").unwrap();
        let e = report(&json, None, None).unwrap_err();
        assert!(format!("{e:#}").contains("bad.json"), "{e:#}");
        let e = report(&dir.path().join("none.json"), None, None).unwrap_err();
        assert!(format!("{e:#}").contains("none.json"), "{e:#}");
    }

    /// Not a check: writes the full synthetic report to `$BENCH_EXAMPLE` (default
    /// `<tmp>/bench-example.json`) to try `bench report` and `bench compare` by hand.
    #[test]
    #[ignore]
    fn write_example_report() {
        let path = std::env::var_os("BENCH_EXAMPLE").map_or_else(
            || std::env::temp_dir().join("bench-example.json"),
            PathBuf::from,
        );
        fixture::full().save(&path).unwrap();
        println!("wrote {}", path.display());
    }
}
