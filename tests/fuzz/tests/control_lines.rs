//! Fuzz target `control_lines`: lines of the cache's control socket protocol, each read as
//! sheepfs reads a request and as cachectl reads an answer. See the crate documentation;
//! `fusefs/sheepfs/tests/fuzz_control.rs` sends such lines to a running mount.

use cache_control::{Request, Response};
use fuzz_targets::json::round_trip;
use fuzz_targets::{config, inputs};
use proptest::prelude::*;

const TARGET: &str = "control_lines";

fn check_line(b: &[u8]) -> Result<(), TestCaseError> {
    round_trip::<Request>(b)?;
    round_trip::<Response>(b)?;
    Ok(())
}

fn seeds() -> Vec<(String, Vec<u8>)> {
    let list: [(&str, &str); 11] = [
        ("stats", r#"{"cmd":"stats","vdi":null}"#),
        ("stats-vdi", r#"{"cmd":"stats","vdi":"disk0"}"#),
        ("flush", r#"{"cmd":"flush","vdi":"disk0"}"#),
        (
            "evict",
            r#"{"cmd":"evict","vdi":null,"discard_dirty":true}"#,
        ),
        ("resize", r#"{"cmd":"resize","size":1073741824}"#),
        (
            "mode",
            r#"{"cmd":"mode","vdi":"disk0","mode":"writethrough"}"#,
        ),
        (
            "progress",
            r#"{"progress":{"pushed":1048576,"total":4194304}}"#,
        ),
        ("flushed", r#"{"ok":{"flushed":{"bytes":4194304}}}"#),
        ("mode-reply", r#"{"ok":{"mode":{"vdi":"a","mode":"off"}}}"#),
        ("error", r#"{"error":"no VDI named 'x' in the cache"}"#),
        (
            "stats-reply",
            concat!(
                r#"{"ok":{"stats":{"dir":"/c","size":0,"used":0,"dirty":0,"flush_backlog":0,"fill_backlog":0,"max_dirty":0,"max_dirty_age_secs":0,"sequential_cutoff":0,"fills_limited":false,"default_mode":"writeback","push_errors":0,"last_push_error":null,"push_retries":0,"oldest_dirty_ms":0,"#,
                r#""total":{"name":"total","mode":null,"used":0,"dirty":0,"hits":0,"hit_bytes":0,"misses":0,"miss_bytes":0,"fills":0,"fill_bytes":0,"evictions":0,"evicted_bytes":0,"skipped_fills":0,"busy_skipped_fills":0,"stream_bypasses":0,"pushed_bytes":0,"full_writethroughs":0,"full_writethrough_bytes":0},"vdis":[]}}}"#
            ),
        ),
    ];
    fuzz_targets::named("json", list.map(|(n, b)| (n, b.as_bytes().to_vec())))
}

#[test]
fn seeds_are_in_the_corpus() {
    fuzz_targets::check_seeds_pass(TARGET, &seeds(), |b| {
        let req = serde_json::from_slice::<Request>(b).is_ok();
        let resp = serde_json::from_slice::<Response>(b).is_ok();
        prop_assert!(req || resp, "a seed parses as a request or an answer");
        check_line(b)
    });
}

proptest! {
    #![proptest_config(config())]
    #[test]
    fn control_lines(bytes in inputs(TARGET)) {
        check_line(&bytes)?;
    }
}
