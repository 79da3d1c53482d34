//! The Prometheus text exposition format (version 0.0.4) of [`CacheStats`].

use std::fmt::Write;

use cache_control::{CacheStats, VdiStats};

/// Escapes a label value: backslash, double quote and line feed.
pub fn escape_label(v: &str) -> String {
    let mut o = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => o.push_str("\\\\"),
            '"' => o.push_str("\\\""),
            '\n' => o.push_str("\\n"),
            c => o.push(c),
        }
    }
    o
}

/// One metric family: `# HELP`, `# TYPE`, then its samples (`labels` already rendered).
fn family(o: &mut String, name: &str, kind: &str, help: &str, samples: &[(String, u64)]) {
    let _ = writeln!(o, "# HELP {name} {help}");
    let _ = writeln!(o, "# TYPE {name} {kind}");
    for (labels, v) in samples {
        if labels.is_empty() {
            let _ = writeln!(o, "{name} {v}");
        } else {
            let _ = writeln!(o, "{name}{{{labels}}} {v}");
        }
    }
}

/// A per-VDI family: name, type, help and how to get its value.
type PerVdi = (
    &'static str,
    &'static str,
    &'static str,
    fn(&VdiStats) -> u64,
);

/// The stats as Prometheus text exposition. Whole-cache series carry no labels; per-VDI series
/// are separate `sheepfs_cache_vdi_*` families labelled `vdi="name"`, so summing them never
/// counts the totals twice.
pub fn prometheus(s: &CacheStats) -> String {
    let t = &s.total;
    let mut o = String::new();
    let one = |v: u64| vec![(String::new(), v)];
    let cache: [(&str, &str, &str, u64); 27] = [
        (
            "sheepfs_cache_size_bytes",
            "gauge",
            "Size bound of the cache.",
            s.size,
        ),
        (
            "sheepfs_cache_used_bytes",
            "gauge",
            "Bytes of cached blocks, clean and dirty.",
            s.used,
        ),
        (
            "sheepfs_cache_dirty_bytes",
            "gauge",
            "Bytes written to the cache and not yet pushed to the cluster.",
            s.dirty,
        ),
        (
            "sheepfs_cache_flush_backlog_bytes",
            "gauge",
            "Dirty bytes waiting for the background flusher.",
            s.flush_backlog,
        ),
        (
            "sheepfs_cache_max_dirty_bytes",
            "gauge",
            "Dirty bytes above which the background flusher pushes (down to half of it).",
            s.max_dirty,
        ),
        (
            "sheepfs_cache_max_dirty_age_seconds",
            "gauge",
            "Age after which dirty data is flushed.",
            s.max_dirty_age_secs,
        ),
        (
            "sheepfs_cache_sequential_cutoff_bytes",
            "gauge",
            "Sequential runs longer than this are cached on their second pass (0: first).",
            s.sequential_cutoff,
        ),
        (
            "sheepfs_cache_hits_total",
            "counter",
            "Read requests served wholly from the cache.",
            t.hits,
        ),
        (
            "sheepfs_cache_hit_bytes_total",
            "counter",
            "Bytes of read requests served wholly from the cache.",
            t.hit_bytes,
        ),
        (
            "sheepfs_cache_misses_total",
            "counter",
            "Read requests that went to the cluster.",
            t.misses,
        ),
        (
            "sheepfs_cache_miss_bytes_total",
            "counter",
            "Bytes fetched from the cluster by read requests.",
            t.miss_bytes,
        ),
        (
            "sheepfs_cache_fills_total",
            "counter",
            "Fills of the cache, from the cluster and by writes.",
            t.fills,
        ),
        (
            "sheepfs_cache_fill_bytes_total",
            "counter",
            "Bytes written into the cache, from the cluster and by writes.",
            t.fill_bytes,
        ),
        (
            "sheepfs_cache_evictions_total",
            "counter",
            "Evictions from the cache.",
            t.evictions,
        ),
        (
            "sheepfs_cache_evicted_bytes_total",
            "counter",
            "Bytes evicted from the cache.",
            t.evicted_bytes,
        ),
        (
            "sheepfs_cache_skipped_fills_total",
            "counter",
            "Fetched ranges not written into the cache (full and first miss, or fills behind).",
            t.skipped_fills,
        ),
        (
            "sheepfs_cache_busy_skipped_fills_total",
            "counter",
            "Small misses not written into the cache because the CPUs were busy.",
            t.busy_skipped_fills,
        ),
        (
            "sheepfs_cache_fills_limited",
            "gauge",
            "1 while the CPUs are busy and small misses are not cached.",
            s.fills_limited as u64,
        ),
        (
            "sheepfs_cache_stream_bypasses_total",
            "counter",
            "Misses of long sequential streams fetched past the cache (their first pass).",
            t.stream_bypasses,
        ),
        (
            "sheepfs_cache_pushed_bytes_total",
            "counter",
            "Bytes pushed to the cluster by flushes.",
            t.pushed_bytes,
        ),
        (
            "sheepfs_cache_push_errors_total",
            "counter",
            "Failed pushes to the cluster (the data stays dirty and is retried).",
            s.push_errors,
        ),
        (
            "sheepfs_cache_push_retries_total",
            "counter",
            "Pushes started again after a failed push.",
            s.push_retries,
        ),
        (
            "sheepfs_cache_full_writethroughs_total",
            "counter",
            "Writeback writes sent straight to the cluster because the cache was full.",
            t.full_writethroughs,
        ),
        (
            "sheepfs_cache_full_writethrough_bytes_total",
            "counter",
            "Bytes of writeback writes sent straight to the cluster because the cache was full.",
            t.full_writethrough_bytes,
        ),
        (
            "sheepfs_cache_corrupt_blocks_total",
            "counter",
            "Cached blocks found corrupt when first read after a restart.",
            t.corrupt_blocks,
        ),
        (
            "sheepfs_cache_handovers_given_total",
            "counter",
            "VDI locks handed over to another mount that asked for them (cooperative lock mode).",
            t.handovers_given,
        ),
        (
            "sheepfs_cache_handovers_taken_total",
            "counter",
            "VDI locks taken over from another mount for a write (cooperative lock mode).",
            t.handovers_taken,
        ),
    ];
    for (name, kind, help, v) in cache {
        family(&mut o, name, kind, help, &one(v));
    }
    let name = "sheepfs_cache_oldest_dirty_seconds";
    let _ = writeln!(
        o,
        "# HELP {name} How long the oldest dirty data has waited to be pushed (0: none)."
    );
    let _ = writeln!(o, "# TYPE {name} gauge");
    let _ = writeln!(o, "{name} {:.3}", s.oldest_dirty_ms as f64 / 1000.0);

    let per_vdi: [PerVdi; 8] = [
        (
            "sheepfs_cache_vdi_used_bytes",
            "gauge",
            "Bytes of cached blocks of a VDI.",
            |v| v.used,
        ),
        (
            "sheepfs_cache_vdi_dirty_bytes",
            "gauge",
            "Dirty bytes of a VDI.",
            |v| v.dirty,
        ),
        (
            "sheepfs_cache_vdi_hits_total",
            "counter",
            "Read requests of a VDI served wholly from the cache.",
            |v| v.hits,
        ),
        (
            "sheepfs_cache_vdi_hit_bytes_total",
            "counter",
            "Bytes of read requests of a VDI served wholly from the cache.",
            |v| v.hit_bytes,
        ),
        (
            "sheepfs_cache_vdi_misses_total",
            "counter",
            "Read requests of a VDI that went to the cluster.",
            |v| v.misses,
        ),
        (
            "sheepfs_cache_vdi_miss_bytes_total",
            "counter",
            "Bytes fetched from the cluster by read requests of a VDI.",
            |v| v.miss_bytes,
        ),
        (
            "sheepfs_cache_vdi_pushed_bytes_total",
            "counter",
            "Bytes of a VDI pushed to the cluster by flushes.",
            |v| v.pushed_bytes,
        ),
        (
            "sheepfs_cache_vdi_full_writethrough_bytes_total",
            "counter",
            "Bytes of a VDI's writeback writes sent straight to the cluster (cache full).",
            |v| v.full_writethrough_bytes,
        ),
    ];
    for (name, kind, help, get) in per_vdi {
        let samples: Vec<_> = s
            .vdis
            .iter()
            .map(|v| (format!("vdi=\"{}\"", escape_label(&v.name)), get(v)))
            .collect();
        family(&mut o, name, kind, help, &samples);
    }
    let modes: Vec<_> = s
        .vdis
        .iter()
        .filter_map(|v| {
            v.mode
                .map(|m| (format!("vdi=\"{}\",mode=\"{m}\"", escape_label(&v.name)), 1))
        })
        .collect();
    family(
        &mut o,
        "sheepfs_cache_vdi_mode",
        "gauge",
        "Cache mode of a VDI (always 1; the mode is the label).",
        &modes,
    );
    o
}
