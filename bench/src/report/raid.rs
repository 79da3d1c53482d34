//! The view of group "raid" (the Linux RAID HOWTO's table for our redundancy schemes): per
//! direction, sequential MiB/s by scheme and object size (rows) × block size (columns); then
//! per cluster its random IOPS, raw bytes per GiB written and reads with a node down; the
//! coding cost; and, as the HOWTO did, where object size and block size matter and where not.

use std::fmt::Write as _;

use super::query::{distinct, fmt_number, fmt_ratio, param_f64, param_str, size_label};
use super::table::Table;
use crate::figures::Figure;

/// A cluster of the table: scheme (as `--copies` spells it) and object size.
type Row = (String, f64);

fn scheme(f: &Figure) -> Option<String> {
    param_str(f, "redundancy")
}

/// Whether `f` is a sequential fio job of the table (rw "read" or "write", not degraded).
fn sequential(f: &Figure, dir: &str) -> bool {
    param_str(f, "rw").as_deref() == Some(dir) && !f.job.contains("-down")
}

/// Copies before erasure codes, each by its numbers, then by object size.
fn row_key(r: &Row) -> (bool, u32, u32, u64) {
    let nums: Vec<u32> = r.0.split(':').filter_map(|n| n.parse().ok()).collect();
    let (a, b) = (
        nums.first().copied().unwrap_or(0),
        nums.get(1).copied().unwrap_or(0),
    );
    (nums.len() > 1, a, b, r.1 as u64)
}

fn rows(figs: &[&Figure]) -> Vec<Row> {
    let mut rows =
        distinct((figs.iter()).filter_map(|f| Some((scheme(f)?, param_f64(f, "object_size")?))));
    rows.sort_by_key(row_key);
    rows
}

fn find<'a>(figs: &[&'a Figure], row: &Row, job_starts: &str) -> Option<&'a Figure> {
    figs.iter().copied().find(|f| {
        scheme(f).as_ref() == Some(&row.0)
            && param_f64(f, "object_size") == Some(row.1)
            && f.job.starts_with(job_starts)
            && f.job[job_starts.len()..].starts_with("-obj")
    })
}

pub fn view(figs: &[&Figure]) -> String {
    let rows = rows(figs);
    if rows.is_empty() {
        return String::new();
    }
    let mut out = String::new();
    for dir in ["write", "read"] {
        let seq: Vec<&Figure> = figs
            .iter()
            .copied()
            .filter(|f| sequential(f, dir))
            .collect();
        let mut bss = distinct(seq.iter().filter_map(|f| param_f64(f, "bs")));
        bss.sort_by(f64::total_cmp);
        if bss.is_empty() {
            continue;
        }
        let mut headers = vec!["copies".to_string(), "object".to_string()];
        headers.extend(bss.iter().map(|&b| format!("{} MiB/s", size_label(b))));
        let mut t = Table::new(&headers);
        for row in &rows {
            let mut cells = vec![row.0.clone(), size_label(row.1)];
            for &bs in &bss {
                let f = seq.iter().find(|f| {
                    scheme(f).as_ref() == Some(&row.0)
                        && param_f64(f, "object_size") == Some(row.1)
                        && param_f64(f, "bs") == Some(bs)
                });
                cells.push(f.map_or(String::new(), |f| fmt_number(f.value, &f.unit)));
            }
            t.row(cells);
        }
        let nodes = (seq.iter().find_map(|f| param_f64(f, "nodes")))
            .map_or(String::new(), |n| format!("{n} nodes, "));
        let _ = write!(
            out,
            "**Sequential {dir}** ({nodes}sheepfs without cache):\n\n{}\n",
            t.render()
        );
        for line in what_matters(&seq, &rows, &bss) {
            let _ = writeln!(out, "- {line}");
        }
        out.push('\n');
    }
    let mut t = Table::new(&[
        "copies",
        "object",
        "4k randwrite qd16 IOPS",
        "4k randread qd16 IOPS",
        "raw GiB per GiB",
        "1M read, a node down (÷ healthy)",
        "CPU s/GiB, 1M writes",
    ]);
    for row in &rows {
        let cell = |job: &str| {
            find(figs, row, job).map_or(String::new(), |f| fmt_number(f.value, &f.unit))
        };
        let down = find(figs, row, "read-1m-down").map_or(String::new(), |f| {
            let ratio = f
                .ratio
                .map_or(String::new(), |r| format!(" ({})", fmt_ratio(r)));
            format!("{}{ratio}", fmt_number(f.value, &f.unit))
        });
        let cpu = find(figs, row, "write-1m")
            .and_then(|f| f.cpu_s_per_gib)
            .map_or(String::new(), |c| format!("{c:.2}"));
        t.row(vec![
            row.0.clone(),
            size_label(row.1),
            cell("randwrite-4k-libaio-qd16"),
            cell("randread-4k-libaio-qd16"),
            find(figs, row, "raw-per-gib").map_or(String::new(), |f| format!("{:.3}", f.value)),
            down,
            cpu,
        ]);
    }
    let _ = write!(out, "**Per cluster**:\n\n{}\n", t.render());
    let coding: Vec<&Figure> = (figs.iter().copied())
        .filter(|f| f.unit == "CPU s/GiB")
        .collect();
    if !coding.is_empty() {
        let mut t = Table::new(&["copies", "work", "CPU s per GiB of objects"]);
        for f in coding {
            let work = if f.job.starts_with("decode") {
                "decode, y data strips lost"
            } else {
                "encode a whole stripe"
            };
            t.row(vec![
                scheme(f).unwrap_or_default(),
                work.to_string(),
                format!("{:.3}", f.value),
            ]);
        }
        let _ = write!(
            out,
            "**Coding** (one core, in process):\n\n{}\n",
            t.render()
        );
    }
    out
}

/// max ÷ min of the values present (None with fewer than two).
fn spread(values: impl IntoIterator<Item = f64>) -> Option<f64> {
    let v: Vec<f64> = values.into_iter().filter(|v| *v > 0.0).collect();
    if v.len() < 2 {
        return None;
    }
    let max = v.iter().copied().fold(f64::MIN, f64::max);
    let min = v.iter().copied().fold(f64::MAX, f64::min);
    Some(max / min)
}

/// Per scheme, how much object size moves a figure at a fixed block size, and block size at
/// a fixed object size (the largest spread of each), said in words: "matters" at 1.25× and
/// over, "hardly" below.
fn what_matters(seq: &[&Figure], rows: &[Row], bss: &[f64]) -> Vec<String> {
    let value = |s: &str, obj: f64, bs: f64| {
        seq.iter()
            .find(|f| {
                scheme(f).as_deref() == Some(s)
                    && param_f64(f, "object_size") == Some(obj)
                    && param_f64(f, "bs") == Some(bs)
            })
            .map(|f| f.value)
    };
    let words = |x: f64| {
        if x >= 1.25 {
            "matters"
        } else {
            "hardly matters"
        }
    };
    let mut out = Vec::new();
    for s in distinct(rows.iter().map(|r| r.0.clone())) {
        let objs: Vec<f64> = (rows.iter()).filter(|r| r.0 == s).map(|r| r.1).collect();
        let by_obj = (bss.iter())
            .filter_map(|&bs| Some((spread(objs.iter().filter_map(|&o| value(&s, o, bs)))?, bs)))
            .max_by(|a, b| a.0.total_cmp(&b.0));
        let by_bs = (objs.iter())
            .filter_map(|&o| Some((spread(bss.iter().filter_map(|&b| value(&s, o, b)))?, o)))
            .max_by(|a, b| a.0.total_cmp(&b.0));
        let mut parts = Vec::new();
        if let Some((x, bs)) = by_obj {
            let at = size_label(bs);
            parts.push(format!(
                "object size {} (up to {x:.2}× at {at} blocks)",
                words(x)
            ));
        }
        if let Some((x, o)) = by_bs {
            let at = size_label(o);
            parts.push(format!(
                "block size {} (up to {x:.2}× with {at} objects)",
                words(x)
            ));
        }
        if !parts.is_empty() {
            out.push(format!("copies {s}: {}", parts.join("; ")));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::fixture::{fig, with_params};

    fn seq(scheme: &str, obj: u64, rw: &str, bs: u64, v: f64) -> Figure {
        let label = |b: u64| super::size_label(b as f64).to_lowercase();
        let job = format!("{rw}-{}-obj{}", label(bs), label(obj));
        let target = if scheme.contains(':') {
            format!("ec{}", scheme.replace(':', "-"))
        } else {
            format!("c{scheme}")
        };
        let p = serde_json::json!({
            "redundancy": scheme,
            "object_size": obj,
            "rw": rw,
            "bs": bs,
        });
        with_params(fig("raid", &job, &target, "MiB/s", v), p)
    }

    #[test]
    fn table_and_what_matters() {
        const M: u64 = 1 << 20;
        let figs = [
            seq("3", M, "write", 4096, 10.0),
            seq("3", M, "write", M, 100.0),
            seq("3", 4 * M, "write", 4096, 10.5),
            seq("3", 4 * M, "write", M, 104.0),
            seq("4:2", M, "write", 4096, 2.0),
            seq("4:2", M, "write", M, 60.0),
            seq("4:2", 4 * M, "write", 4096, 4.0),
            seq("4:2", 4 * M, "write", M, 120.0),
        ];
        let refs: Vec<&Figure> = figs.iter().collect();
        let v = view(&refs);
        assert!(v.contains("**Sequential write**"), "{v}");
        assert!(!v.contains("**Sequential read**"), "{v}");
        assert!(
            v.contains("copies 3: object size hardly matters (up to 1.05× at 4K blocks)"),
            "{v}"
        );
        assert!(
            v.contains("copies 4:2: object size matters (up to 2.00× at 1M blocks)"),
            "{v}"
        );
        assert!(
            v.contains("block size matters (up to 30.00× with 4M objects)"),
            "{v}"
        );
    }

    #[test]
    fn empty_without_raid_figures() {
        let f = fig("raid", "write-1m", "c3", "MiB/s", 1.0);
        assert_eq!(view(&[&f]), "");
    }
}
