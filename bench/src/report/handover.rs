//! Group "handover" (issue 42): the hand-over with dirty data round by round (push, hand-over,
//! overhead, and what the holder's and the asker's logs said), then the bare hand-overs
//! against the same write on the mount that holds the lock, with what each figure means.

use std::fmt::Write as _;

use super::layouts::met_cell;
use super::query::{fmt_value, param_f64, size_label};
use super::table::Table;
use crate::figures::{median, Figure};

const UNIT: &str = "ms";

/// The view; empty when the group has none of its figures.
pub fn view(figs: &[&Figure]) -> String {
    let find = |id: &str| figs.iter().copied().find(|f| f.id == id);
    let mut out = String::new();
    if let (Some(push), Some(hand)) = (
        find("handover/push-dirty/cache"),
        find("handover/handover-dirty/cache"),
    ) {
        out.push_str(&dirty(push, hand, find("handover/overhead-dirty/cache")));
    }
    let bare: Vec<(&str, &Figure, Option<&Figure>)> = ["cache", "off"]
        .into_iter()
        .filter_map(|t| {
            let hand = find(&format!("handover/handover-bare/{t}"))?;
            Some((t, hand, find(&format!("handover/write-holder/{t}"))))
        })
        .collect();
    if !bare.is_empty() {
        out.push_str(&bare_table(&bare));
    }
    out
}

/// Round by round: push, hand-over, overhead, the holder's and the asker's own times.
fn dirty(push: &Figure, hand: &Figure, overhead: Option<&Figure>) -> String {
    let size = param_f64(hand, "dirty_bytes").map_or("the".into(), size_label);
    let mut out = format!(
        "**With {size} of dirty data** in the holder's cache: *push* is the holder's `fsync` of it \
         (the push and the cluster's flush, no hand-over); *hand-over* is a 4 KiB write and \
         `fsync` on the other mount after the holder wrote the same bytes dirty again: the \
         asker asks, the holder (polling every 50 ms) pushes, flushes, drops its cached blocks \
         and releases, the asker (polling every 20 ms) takes the lock and its write goes on; \
         *overhead* is the hand-over minus the push of the same round. The holder's part and \
         the asker's wait are their own times from their logs (`handed the lock ... (T)`, \
         `took the lock over ... in T`); *after the take* is what the asker's 4 KiB write \
         took once it had the lock (its write time minus its wait).\n\n"
    );
    let holder = param_list(hand, "holder_ms");
    let asker = param_list(hand, "asker_ms");
    let after = after_take(hand);
    let mut t = Table::new(&[
        "round",
        "push",
        "hand-over",
        "overhead",
        "holder's part (log)",
        "asker's wait (log)",
        "after the take",
    ]);
    let cell = |v: Option<f64>| v.map_or(String::new(), |v| fmt_value(v, UNIT));
    let rounds = push.runs.len().max(hand.runs.len());
    for i in 0..rounds {
        let (p, h) = (push.runs.get(i).copied(), hand.runs.get(i).copied());
        let over = overhead
            .and_then(|o| o.runs.get(i).copied())
            .or(p.zip(h).map(|(p, h)| h - p));
        t.row(vec![
            (i + 1).to_string(),
            cell(p),
            cell(h),
            cell(over),
            cell(holder.get(i).copied().flatten()),
            cell(asker.get(i).copied().flatten()),
            cell(after.get(i).copied().flatten()),
        ]);
    }
    if rounds > 1 {
        t.row(vec![
            "median".into(),
            cell(Some(push.value)),
            cell(Some(hand.value)),
            cell(overhead.map(|o| o.value)),
            cell(known_median(&holder)),
            cell(known_median(&asker)),
            cell(known_median(&after)),
        ]);
    }
    out.push_str(&t.render());
    if let Some(o) = overhead.filter(|o| o.goal.is_some()) {
        let _ = writeln!(
            out,
            "\nOverhead {}: goal {}, {}.",
            fmt_value(o.value, UNIT),
            o.goal.as_deref().unwrap_or_default(),
            met_cell(o)
        );
    }
    out.push('\n');
    out
}

/// Per kind of mount: the holder's own write, the hand-over, their difference.
fn bare_table(rows: &[(&str, &Figure, Option<&Figure>)]) -> String {
    let mut out = String::from(
        "**With nothing dirty**, the fixed cost: a 4 KiB write and `fsync` on the mount \
         holding the lock, then the same on the other mount, which takes the lock (the \
         *hand-over*; the two alternate, each hand-over in the other direction); medians, \
         with the number of hand-overs.\n\n",
    );
    let mut t = Table::new(&[
        "mounts",
        "write on the holder",
        "hand-over",
        "difference",
        "holder's part (log)",
        "asker's wait (log)",
        "after the take",
    ]);
    for (target, hand, own) in rows {
        let cell = |v: Option<f64>| v.map_or(String::new(), |v| fmt_value(v, UNIT));
        t.row(vec![
            match *target {
                "off" => "without a cache (off)".into(),
                t => t.to_string(),
            },
            cell(own.map(|f| f.value)),
            format!("{} ({})", fmt_value(hand.value, UNIT), hand.runs.len()),
            cell(own.map(|f| hand.value - f.value)),
            cell(known_median(&param_list(hand, "holder_ms"))),
            cell(known_median(&param_list(hand, "asker_ms"))),
            cell(known_median(&after_take(hand))),
        ]);
    }
    out.push_str(&t.render());
    out.push('\n');
    out
}

/// Per hand-over, the asker's write time after its wait for the lock (`write_ms` minus
/// `asker_ms`).
fn after_take(f: &Figure) -> Vec<Option<f64>> {
    let asker = param_list(f, "asker_ms");
    param_list(f, "write_ms")
        .into_iter()
        .zip(asker)
        .map(|(w, a)| Some(w? - a?))
        .collect()
}

/// An array parameter's numbers (None for a null or a missing entry).
fn param_list(f: &Figure, key: &str) -> Vec<Option<f64>> {
    f.params
        .get(key)
        .and_then(|v| v.as_array())
        .map_or(Vec::new(), |a| a.iter().map(|v| v.as_f64()).collect())
}

fn known_median(v: &[Option<f64>]) -> Option<f64> {
    let known: Vec<f64> = v.iter().flatten().copied().collect();
    (!known.is_empty()).then(|| median(&known))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::fixture;

    fn handover_figs() -> Vec<Figure> {
        fixture::full()
            .figures
            .into_iter()
            .filter(|f| f.group == "handover")
            .collect()
    }

    #[test]
    fn rounds_medians_and_the_goal() {
        let figs = handover_figs();
        let refs: Vec<&Figure> = figs.iter().collect();
        let v = view(&refs);
        assert!(v.contains("**With 256M of dirty data**"), "{v}");
        assert!(
            v.contains("| 1 | 800 ms | 870 ms | 70.0 ms | 790 ms | 850 ms | 18.0 ms |"),
            "{v}"
        );
        assert!(
            v.contains("| 3 | 760 ms | 840 ms | 80.0 ms |  |  |  |"),
            "{v}"
        );
        assert!(
            v.contains("| median | 800 ms | 870 ms | 80.0 ms | 790 ms | 850 ms | 19.0 ms |"),
            "{v}"
        );
        assert!(v.contains("Overhead 80.0 ms: goal < 100 ms"), "{v}");
        assert!(v.contains(", met."), "{v}");
        assert!(
            v.contains("| cache | 4.00 ms | 60.0 ms (3) | 56.0 ms | 30.0 ms | 45.0 ms | 10.0 ms |"),
            "{v}"
        );
        assert!(v.contains("| without a cache (off) | 3.00 ms | 40.0 ms (3) | 37.0 ms |"));
    }

    #[test]
    fn nothing_to_show_without_its_figures() {
        assert_eq!(view(&[]), "");
    }
}
