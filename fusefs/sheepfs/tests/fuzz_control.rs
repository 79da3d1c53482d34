//! Fuzz target `control_lines`, live (issue 25): mutations of the control protocol corpus
//! (`tests/fuzz/corpus/control_lines`) sent to a running sheepfs's control socket. Every line
//! gets exactly one final answer, an over-long line is refused and its connection closed, the
//! mount keeps serving, and no written byte is lost. `FUZZ_CASES` sets the number of inputs
//! (default 100).

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

use common::{cachectl_ok, open_rw, rig_with_cache_and, stats};
use proptest::test_runner::{TestCaseError, TestRunner};
use sheepfs::socket::MAX_LINE;

/// Sends `input` and a newline on a fresh connection, closes the writing side, and returns
/// every answer line until the mount closes the connection.
fn exchange(sock: &Path, input: &[u8]) -> Vec<serde_json::Value> {
    let mut s = UnixStream::connect(sock).expect("connect to the control socket");
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    s.write_all(input).unwrap();
    s.write_all(b"\n").unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    BufReader::new(s)
        .lines()
        .map(|l| {
            let l = l.expect("an answer line (the mount answers every line before EOF)");
            serde_json::from_str(&l).unwrap_or_else(|e| panic!("answer {l:?} is not JSON: {e}"))
        })
        .collect()
}

#[test]
fn mutated_control_lines_are_each_answered_and_the_mount_keeps_its_data() {
    let (_tmp, mut rig, cache, _) = rig_with_cache_and(1, 1, "64M", &[]);
    rig.cluster.dog_ok(&["vdi", "create", "disk0", "8M"]);
    let data = testkit::pseudo_random(1 << 20, 25);
    {
        let mut f = open_rw(rig.path("disk0"));
        f.write_all(&data).unwrap();
        f.sync_all().unwrap();
    }
    let sock = cache.join(cache_control::SOCKET_NAME);

    let mut runner = TestRunner::new(fuzz_targets::config_or(100));
    let inputs = fuzz_targets::inputs("control_lines");
    let answered = std::cell::Cell::new(0usize);
    runner
        .run(&inputs, |input| {
            let lines = input.split(|&b| b == b'\n').count();
            let answers = exchange(&sock, &input);
            let finals = answers
                .iter()
                .filter(|a| a.get("ok").is_some() || a.get("error").is_some())
                .count();
            let others = answers.len() - finals;
            let progress = answers.iter().filter(|a| a.get("progress").is_some()).count();
            if finals != lines || others != progress {
                return Err(TestCaseError::fail(format!(
                    "{lines} line(s) got {finals} final answer(s) and {others} other line(s): {answers:?}"
                )));
            }
            answered.set(answered.get() + finals);
            Ok(())
        })
        .unwrap();
    assert!(answered.get() > 0);

    // A line longer than the limit, with no newline: refused, and the connection closed.
    let mut s = UnixStream::connect(&sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let long = vec![b'x'; MAX_LINE + 4096];
    let _ = s.write_all(&long);
    let mut back = String::new();
    s.read_to_string(&mut back).unwrap();
    assert!(
        back.contains("longer than"),
        "answer to an over-long line: {back:?}"
    );

    // The mount still answers and still holds every byte written.
    stats(&cache);
    cachectl_ok(&cache, &["flush"]);
    let mut f = std::fs::File::open(rig.path("disk0")).unwrap();
    let mut got = vec![0u8; data.len()];
    f.read_exact(&mut got).unwrap();
    assert!(got == data, "disk0 changed under the fuzzed control socket");
    rig.mount.check_alive().expect("the mount is alive");
}
