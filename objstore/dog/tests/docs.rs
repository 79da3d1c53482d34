//! The guide stays true to the code: docs/reference is what the binaries' `--help` says now
//! (`scripts/gen-reference.sh --check`), and every relative link under docs/ and in README.md
//! resolves (`scripts/check-links.sh`). `make check` runs both scripts on their own; these
//! tests run them in `make test`, with the binaries of the test's own profile.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The workspace's top directory.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The directory of this test's profile (`target/debug`), with every binary the reference
/// documents built in it (a no-op when they are up to date).
fn binaries() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps/<test>")
        .to_path_buf();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--quiet", "--bins"])
        .arg("--manifest-path")
        .arg(root().join("Cargo.toml"));
    for p in [
        "objstore-node",
        "objstore-dog",
        "sheepfs",
        "cachectl",
        "bench",
    ] {
        cmd.args(["-p", p]);
    }
    match dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") | None => {}
        Some("release") => {
            cmd.arg("--release");
        }
        Some(other) => {
            cmd.args(["--profile", other]);
        }
    }
    if let Some(target) = dir.parent() {
        cmd.env("CARGO_TARGET_DIR", target);
    }
    let out = cmd.output().expect("running cargo build");
    assert!(
        out.status.success(),
        "{cmd:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    dir
}

fn run(script: &str, args: &[&str], bin_dir: Option<&Path>) -> (bool, String) {
    let mut cmd = Command::new(root().join("scripts").join(script));
    cmd.args(args);
    if let Some(d) = bin_dir {
        cmd.env("BIN_DIR", d);
    }
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("running {script}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn reference_pages_match_the_binaries_help() {
    let bins = binaries();
    let (ok, out) = run("gen-reference.sh", &["--check"], Some(&bins));
    assert!(
        ok,
        "docs/reference is stale: run scripts/gen-reference.sh after a build and commit\n{out}"
    );
    // The pages hold what the binaries say, a section per subcommand.
    let dog = std::fs::read_to_string(root().join("docs/reference/dog.md")).unwrap();
    for section in [
        "## `dog`",
        "### `dog cluster`",
        "#### `dog cluster format`",
        "#### `dog node list`",
        "#### `dog vdi snapshot`",
        "##### `dog vdi lock break`",
    ] {
        assert!(
            dog.contains(section),
            "no {section:?} in docs/reference/dog.md"
        );
    }
    let sheep = std::fs::read_to_string(root().join("docs/reference/sheep.md")).unwrap();
    assert!(
        sheep.contains("sheep: a storage node of the cluster"),
        "{sheep}"
    );
    assert!(sheep.contains("--key-file"), "{sheep}");
}

#[test]
fn every_relative_link_in_the_docs_resolves() {
    let (ok, out) = run("check-links.sh", &[], None);
    assert!(ok, "{out}");
    assert!(out.contains("none broken"), "{out}");
}

#[test]
fn the_link_check_finds_a_broken_link() {
    // A page with one good and two broken links, checked from a copy of the tree's layout.
    let tmp = tempfile::tempdir().unwrap();
    let scripts = tmp.path().join("scripts");
    std::fs::create_dir_all(&scripts).unwrap();
    std::fs::copy(
        root().join("scripts/check-links.sh"),
        scripts.join("check-links.sh"),
    )
    .unwrap();
    std::fs::create_dir_all(tmp.path().join("docs")).unwrap();
    std::fs::write(
        tmp.path().join("README.md"),
        "[guide](docs/a.md)\n\n```sh\n[not a link](nowhere.md)\n```\n",
    )
    .unwrap();
    std::fs::write(
        tmp.path().join("docs/a.md"),
        "# A page\n\n## Some `code` here\n\n[ok](#some-code-here) [gone](b.md) \
         [bad anchor](a.md#nothing) [web](https://example.com/x.md)\n",
    )
    .unwrap();
    let out = Command::new(scripts.join("check-links.sh"))
        .output()
        .expect("running check-links.sh");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains("docs/a.md:5: b.md (no such file"), "{text}");
    assert!(
        text.contains("docs/a.md:5: a.md#nothing (no heading"),
        "{text}"
    );
    assert_eq!(text.lines().count(), 2, "{text}");
}
