//! Text renderings of [`CacheStats`]: the human summary and table, and (in [`prometheus`]) the
//! Prometheus text exposition format.

use std::fmt::Write;

use cache_control::{CacheStats, VdiStats};
use objstore_proto::size::format_size;
use objstore_proto::table::{
    Align::{Left, Right},
    Table,
};

mod prometheus;
pub use prometheus::{escape_label, prometheus};

/// `hits / (hits + misses)` as a percentage, or `-` when there was nothing to count.
pub fn ratio(hits: u64, misses: u64) -> String {
    let all = hits as u128 + misses as u128;
    if all == 0 {
        "-".to_string()
    } else {
        format!("{:.1}%", hits as f64 * 100.0 / all as f64)
    }
}

/// The summary of the whole cache, then one line per VDI.
pub fn human(s: &CacheStats) -> String {
    let t = &s.total;
    let mut o = String::new();
    let mode = s
        .default_mode
        .map(|m| format!(" (default mode {m})"))
        .unwrap_or_default();
    let used_pct = if s.size > 0 {
        format!(" ({:.1}%)", s.used as f64 * 100.0 / s.size as f64)
    } else {
        String::new()
    };
    let _ = writeln!(o, "Cache:           {}{mode}", s.dir);
    let _ = writeln!(o, "Size:            {}", format_size(s.size));
    let _ = writeln!(o, "Used:            {}{used_pct}", format_size(s.used));
    let _ = writeln!(o, "Dirty:           {}", format_size(s.dirty));
    let _ = writeln!(o, "Flush backlog:   {}", format_size(s.flush_backlog));
    let _ = writeln!(
        o,
        "Max dirty:       {}, flushed after {}s",
        format_size(s.max_dirty),
        s.max_dirty_age_secs
    );
    let cutoff = match s.sequential_cutoff {
        0 => "none (streams are cached on their first pass)".to_string(),
        n => format!(
            "{} (longer streams are cached on their second pass)",
            format_size(n)
        ),
    };
    let _ = writeln!(o, "Stream cutoff:   {cutoff}");
    let _ = writeln!(
        o,
        "Hits:            {} requests, {}",
        t.hits,
        format_size(t.hit_bytes)
    );
    let _ = writeln!(
        o,
        "Misses:          {} requests, {}",
        t.misses,
        format_size(t.miss_bytes)
    );
    let _ = writeln!(
        o,
        "Hit ratio:       {} of requests, {} of bytes",
        ratio(t.hits, t.misses),
        ratio(t.hit_bytes, t.miss_bytes)
    );
    let _ = writeln!(
        o,
        "Fills:           {} ({})",
        t.fills,
        format_size(t.fill_bytes)
    );
    let _ = writeln!(
        o,
        "Evictions:       {} ({})",
        t.evictions,
        format_size(t.evicted_bytes)
    );
    let _ = writeln!(o, "Not cached:      {} fetched ranges", t.skipped_fills);
    let _ = writeln!(
        o,
        "CPUs busy:       {} small misses not cached{}",
        t.busy_skipped_fills,
        if s.fills_limited { " (busy now)" } else { "" }
    );
    let _ = writeln!(
        o,
        "Stream passes:   {} misses fetched past the cache (a stream's first pass)",
        t.stream_bypasses
    );
    let _ = writeln!(o, "Pushed:          {}", format_size(t.pushed_bytes));
    let _ = writeln!(o, "Push errors:     {}", s.push_errors);
    if let Some(e) = &s.last_push_error {
        let _ = writeln!(o, "Last push error: {}", one_line(e));
    }
    let _ = writeln!(o, "Push retries:    {}", s.push_retries);
    let _ = writeln!(o, "Oldest dirty:    {}", age(s.oldest_dirty_ms));
    let _ = writeln!(
        o,
        "Full cache:      {} writes straight to the cluster ({})",
        t.full_writethroughs,
        format_size(t.full_writethrough_bytes)
    );
    let _ = writeln!(
        o,
        "Corrupt blocks:  {} found after a restart (clean ones fetched again, dirty ones quarantined)",
        t.corrupt_blocks
    );
    let _ = writeln!(
        o,
        "Lock hand-overs: {} given to other mounts, {} taken from them",
        t.handovers_given, t.handovers_taken
    );
    o.push('\n');
    o.push_str(&table(&s.vdis));
    o
}

/// How long dirty data has waited, for people: `-` when nothing is dirty.
pub fn age(ms: u64) -> String {
    match ms {
        0 => "-".to_string(),
        ms if ms < 60_000 => format!("{:.1}s", ms as f64 / 1000.0),
        ms if ms < 3_600_000 => format!("{}m{:02}s", ms / 60_000, ms / 1000 % 60),
        ms => format!("{}h{:02}m", ms / 3_600_000, ms / 60_000 % 60),
    }
}

/// The per-VDI table.
pub fn table(vdis: &[VdiStats]) -> String {
    if vdis.is_empty() {
        return "no VDIs in the cache\n".to_string();
    }
    let mut t = Table::new(&[
        ("Name", Left),
        ("Mode", Left),
        ("Used", Right),
        ("Dirty", Right),
        ("Hits", Right),
        ("Misses", Right),
        ("Hit %", Right),
        ("Pushed", Right),
    ]);
    for v in vdis {
        let mode = v.mode.map(|m| m.to_string()).unwrap_or_else(|| "-".into());
        t.row([
            printable(&v.name),
            mode,
            format_size(v.used),
            format_size(v.dirty),
            v.hits.to_string(),
            v.misses.to_string(),
            ratio(v.hits, v.misses),
            format_size(v.pushed_bytes),
        ]);
    }
    t.render()
}

/// A name with its control characters escaped, so that it stays on its line.
fn printable(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            let e: Vec<char> = if c.is_control() {
                c.escape_default().collect()
            } else {
                vec![c]
            };
            e
        })
        .collect()
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use cache_control::CacheMode;

    fn stats() -> CacheStats {
        let disk0 = VdiStats {
            name: "disk0".into(),
            mode: Some(CacheMode::Writeback),
            used: 300 << 20,
            dirty: 48 << 20,
            hits: 300,
            hit_bytes: 150 << 20,
            misses: 100,
            miss_bytes: 50 << 20,
            pushed_bytes: 1 << 30,
            ..Default::default()
        };
        let odd = VdiStats {
            name: "we\"ird\\na\nme".into(),
            mode: None,
            used: 4096,
            ..Default::default()
        };
        CacheStats {
            dir: "/var/cache/sheepfs".into(),
            size: 1 << 30,
            used: (300 << 20) + 4096,
            dirty: 48 << 20,
            flush_backlog: 16 << 20,
            fill_backlog: 0,
            max_dirty: 256 << 20,
            max_dirty_age_secs: 30,
            sequential_cutoff: 16 << 20,
            default_mode: Some(CacheMode::Writeback),
            fills_limited: true,
            push_errors: 2,
            last_push_error: Some("connection refused\nby 127.0.0.1:7000".into()),
            push_retries: 5,
            oldest_dirty_ms: 83_456,
            total: VdiStats {
                name: String::new(),
                hits: 300,
                hit_bytes: 150 << 20,
                misses: 100,
                miss_bytes: 50 << 20,
                fills: 100,
                fill_bytes: 50 << 20,
                evictions: 3,
                evicted_bytes: 12 << 20,
                busy_skipped_fills: 40,
                pushed_bytes: 1 << 30,
                full_writethroughs: 7,
                full_writethrough_bytes: 28 << 10,
                ..Default::default()
            },
            vdis: vec![disk0, odd],
        }
    }

    #[test]
    fn ratios() {
        assert_eq!(ratio(0, 0), "-");
        assert_eq!(ratio(3, 1), "75.0%");
        assert_eq!(ratio(1, 0), "100.0%");
        assert_eq!(ratio(u64::MAX, u64::MAX), "50.0%");
    }

    #[test]
    fn ages() {
        assert_eq!(age(0), "-");
        assert_eq!(age(1500), "1.5s");
        assert_eq!(age(61_000), "1m01s");
        assert_eq!(age(7_260_000), "2h01m");
    }

    #[test]
    fn label_escaping() {
        assert_eq!(escape_label("plain"), "plain");
        assert_eq!(escape_label("a\"b"), "a\\\"b");
        assert_eq!(escape_label("a\\b"), "a\\\\b");
        assert_eq!(escape_label("a\nb"), "a\\nb");
        assert_eq!(escape_label("é x"), "é x");
    }

    #[test]
    fn prometheus_format() {
        let p = prometheus(&stats());
        assert!(p.ends_with('\n'));
        for want in [
            "# HELP sheepfs_cache_size_bytes Size bound of the cache.\n\
             # TYPE sheepfs_cache_size_bytes gauge\n\
             sheepfs_cache_size_bytes 1073741824\n",
            "\nsheepfs_cache_used_bytes 314576896\n",
            "\nsheepfs_cache_dirty_bytes 50331648\n",
            "\nsheepfs_cache_flush_backlog_bytes 16777216\n",
            "# TYPE sheepfs_cache_hits_total counter\nsheepfs_cache_hits_total 300\n",
            "\nsheepfs_cache_hit_bytes_total 157286400\n",
            "\nsheepfs_cache_misses_total 100\n",
            "\nsheepfs_cache_miss_bytes_total 52428800\n",
            "\nsheepfs_cache_fills_total 100\n",
            "\nsheepfs_cache_evictions_total 3\n",
            "\nsheepfs_cache_busy_skipped_fills_total 40\n",
            "# TYPE sheepfs_cache_fills_limited gauge\nsheepfs_cache_fills_limited 1\n",
            "\nsheepfs_cache_push_errors_total 2\n",
            "\nsheepfs_cache_push_retries_total 5\n",
            "\nsheepfs_cache_full_writethroughs_total 7\n",
            "\nsheepfs_cache_full_writethrough_bytes_total 28672\n",
            "# TYPE sheepfs_cache_oldest_dirty_seconds gauge\nsheepfs_cache_oldest_dirty_seconds 83.456\n",
            "\nsheepfs_cache_vdi_full_writethrough_bytes_total{vdi=\"disk0\"} 0\n",
            "# TYPE sheepfs_cache_vdi_used_bytes gauge\n\
             sheepfs_cache_vdi_used_bytes{vdi=\"disk0\"} 314572800\n\
             sheepfs_cache_vdi_used_bytes{vdi=\"we\\\"ird\\\\na\\nme\"} 4096\n",
            "\nsheepfs_cache_vdi_dirty_bytes{vdi=\"disk0\"} 50331648\n",
            "\nsheepfs_cache_vdi_hits_total{vdi=\"disk0\"} 300\n",
            "\nsheepfs_cache_vdi_misses_total{vdi=\"disk0\"} 100\n",
            "\nsheepfs_cache_vdi_mode{vdi=\"disk0\",mode=\"writeback\"} 1\n",
        ] {
            assert!(p.contains(want), "missing {want:?} in\n{p}");
        }
        // Well formed: every line is a comment or `name[{labels}] number`, every family has
        // exactly one HELP and one TYPE, and they come before its samples.
        let mut typed = std::collections::HashSet::new();
        for line in p.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let name = rest.split(' ').next().unwrap();
                assert!(typed.insert(name.to_string()), "TYPE twice for {name}");
                assert!(
                    rest.ends_with(" gauge") || rest.ends_with(" counter"),
                    "{line}"
                );
                if rest.ends_with(" counter") {
                    assert!(name.ends_with("_total"), "{line}");
                }
                continue;
            }
            if line.starts_with("# HELP ") {
                continue;
            }
            let (series, value) = line.rsplit_once(' ').unwrap();
            value.parse::<f64>().unwrap();
            let name = series.split('{').next().unwrap();
            assert!(typed.contains(name), "sample before TYPE: {line}");
            assert!(
                name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
                "{line}"
            );
            assert!(!line.contains('\n'));
        }
        assert_eq!(p.matches("# HELP ").count(), typed.len());
    }

    #[test]
    fn prometheus_without_vdis() {
        let p = prometheus(&CacheStats::default());
        assert!(p.contains("# TYPE sheepfs_cache_vdi_used_bytes gauge\n"));
        assert!(!p.contains("{vdi="));
        assert!(p.contains("\nsheepfs_cache_size_bytes 0\n"));
    }

    #[test]
    fn human_summary_and_table() {
        let h = human(&stats());
        let want = "\
Cache:           /var/cache/sheepfs (default mode writeback)
Size:            1.0 GiB
Used:            300.0 MiB (29.3%)
Dirty:           48.0 MiB
Flush backlog:   16.0 MiB
Max dirty:       256.0 MiB, flushed after 30s
Stream cutoff:   16.0 MiB (longer streams are cached on their second pass)
Hits:            300 requests, 150.0 MiB
Misses:          100 requests, 50.0 MiB
Hit ratio:       75.0% of requests, 75.0% of bytes
Fills:           100 (50.0 MiB)
Evictions:       3 (12.0 MiB)
Not cached:      0 fetched ranges
CPUs busy:       40 small misses not cached (busy now)
Stream passes:   0 misses fetched past the cache (a stream's first pass)
Pushed:          1.0 GiB
Push errors:     2
Last push error: connection refused by 127.0.0.1:7000
Push retries:    5
Oldest dirty:    1m23s
Full cache:      7 writes straight to the cluster (28.0 KiB)
Corrupt blocks:  0 found after a restart (clean ones fetched again, dirty ones quarantined)
Lock hand-overs: 0 given to other mounts, 0 taken from them

Name           Mode            Used     Dirty  Hits  Misses  Hit %   Pushed
disk0          writeback  300.0 MiB  48.0 MiB   300     100  75.0%  1.0 GiB
we\"ird\\na\\nme  -            4.0 KiB       0 B     0       0      -      0 B
";
        assert_eq!(h, want, "\n{h}");
    }

    #[test]
    fn table_columns_line_up() {
        let mut s = stats();
        s.vdis[1].name = "a-much-longer-name".into();
        let t = table(&s.vdis);
        let widths: Vec<_> = t.lines().map(|l| l.chars().count()).collect();
        assert!(widths.iter().all(|w| *w == widths[0]), "\n{t}");
        assert!(t.starts_with("Name                "));
        assert_eq!(table(&[]), "no VDIs in the cache\n");
    }

    #[test]
    fn long_counts_and_sizes_keep_the_columns_aligned() {
        let mut s = stats();
        s.vdis[0].hits = 12_345_678_901;
        s.vdis[0].used = u64::MAX;
        s.vdis[1].misses = 7;
        let t = table(&s.vdis);
        let lines: Vec<&str> = t.lines().collect();
        // Every right-aligned column ends where its header ends, on every line.
        for header in ["Used", "Hits", "Misses", "Pushed"] {
            let end = lines[0].find(header).unwrap() + header.len();
            for l in &lines[1..] {
                let before = &l[..end];
                assert!(
                    !before.ends_with(' '),
                    "{header} does not end at {end}:\n{t}"
                );
                assert!(
                    l.len() == end || l.as_bytes()[end] == b' ',
                    "{header} spills past {end}:\n{t}"
                );
            }
        }
        assert!(t.contains("12345678901"), "{t}");
        assert!(t.contains("16.0 EiB"), "{t}");
    }
}
