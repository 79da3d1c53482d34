//! `dog vdi check NAME`, `dog cluster check` and `dog node scrub`: the copies of objects
//! compared and repaired ([`objstore_client::vdi::check`]), and each node's background scrub.

use anyhow::bail;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use objstore_client::lock::format_utc;
use objstore_client::vdi::check::{self, CheckOptions, Summary, Target};
use objstore_proto::api::{ScrubPass, ScrubStatus};
use objstore_proto::size::format_size;
use objstore_proto::table::{
    Align::{Left, Right},
    Table,
};

use crate::Ctx;

/// Options shared by `dog vdi check` and `dog cluster check`.
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct CheckArgs {
    /// Report bad copies without repairing them.
    #[arg(long)]
    pub dry_run: bool,
    /// Compare versions and presence only (quick: no copy is read, so a flipped byte is not
    /// found).
    #[arg(short, long)]
    pub exist: bool,
}

fn bar(total: u64) -> ProgressBar {
    let pb = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    pb.set_style(
        ProgressStyle::with_template("checking [{bar:30}] {pos}/{len} objects {per_sec} eta {eta}")
            .unwrap()
            .progress_chars("=> "),
    );
    pb
}

/// Checks `targets`, prints what was found and done, and fails when something is left wrong
/// (an unrecoverable object, a repair that failed).
pub async fn run(ctx: &Ctx, targets: Vec<Target>, args: CheckArgs) -> anyhow::Result<()> {
    let pb = bar(targets.len() as u64);
    let opts = CheckOptions {
        dry_run: args.dry_run,
        state_only: args.exist,
    };
    let summary = check::check(&ctx.client, targets, opts, |_| pb.inc(1)).await;
    pb.finish_and_clear();
    ctx.print(&summary, || text(&summary, args.dry_run));
    if summary.failed() {
        let names: Vec<String> = summary
            .unrecoverable()
            .map(|p| format!("{} ({})", p.what(), p.oid))
            .collect();
        if names.is_empty() {
            bail!(
                "{} repair(s) failed: run the check again",
                summary.failed_repairs
            );
        }
        bail!(
            "{} object(s) unrecoverable: {}",
            summary.unrecoverable_objects,
            names.join(", ")
        );
    }
    Ok(())
}

fn text(s: &Summary, dry_run: bool) -> String {
    let mut out = String::new();
    for p in &s.problems {
        out += &format!("object {} ({}):\n", p.oid, p.what());
        for b in &p.bad {
            let what = match (&b.repair_error, b.repaired, b.source) {
                (Some(e), _, _) => format!("repair failed: {e}"),
                (None, true, Some(src)) => format!("repaired from {src}"),
                (None, _, Some(src)) if dry_run => format!("would be repaired from {src}"),
                _ => "not repaired".to_string(),
            };
            out += &format!("  {}  {}: {what}\n", b.addr, b.problem);
        }
        for k in &p.skipped {
            out += &format!("  {}  not checked: {}\n", k.addr, k.why);
        }
        if let Some(why) = &p.unrecoverable {
            out += &format!("  unrecoverable: {why}\n");
        }
    }
    let vdis = match s.vdis.as_slice() {
        [one] => format!("VDI '{one}'"),
        many => format!("{} VDI(s)", many.len()),
    };
    out += &format!(
        "checked {} object(s) of {vdis}: {} cop(ies), {} read\n",
        s.objects,
        s.copies,
        format_size(s.bytes)
    );
    out += &format!(
        "bad copies: {}, repaired: {} (in {} object(s)), repairs failed: {}, unrecoverable objects: {}, copies not checked: {}\n",
        s.bad_copies,
        s.repaired_copies,
        s.repaired_objects,
        s.failed_repairs,
        s.unrecoverable_objects,
        s.skipped_copies
    );
    for p in s.unrecoverable() {
        out += &format!("unrecoverable: {} ({})\n", p.what(), p.oid);
    }
    out
}

/// A node's last scrub for `dog node list`: when it ended, `never`, or `off`.
pub fn last_scrub(s: &ScrubStatus) -> String {
    match (&s.last, s.rate) {
        (Some(p), _) => p.ended.map(format_utc).unwrap_or_else(|| "never".into()),
        (None, 0) => "off".into(),
        (None, _) => "never".into(),
    }
}

fn pass_line(label: &str, p: &ScrubPass) -> String {
    format!(
        "{label}: started {}, {}{} cop(ies), {} read, {} bad, {} repaired, {} unrecoverable",
        format_utc(p.started),
        match p.ended {
            Some(e) => format!(
                "ended {} ({} s), ",
                format_utc(e),
                e.saturating_sub(p.started)
            ),
            None => String::new(),
        },
        p.objects,
        format_size(p.bytes),
        p.bad,
        p.repaired,
        p.unrecoverable
    )
}

/// The table of `dog node scrub`, without rows.
pub fn scrub_table() -> Table {
    Table::new(&[
        ("Address", Left),
        ("Rate", Right),
        ("State", Left),
        ("Passes", Right),
        ("Last scrub", Left),
    ])
}

/// `dog node scrub`'s row for one node, and a line each for its current and last pass.
pub fn scrub_rows(t: &mut Table, addr: std::net::SocketAddr, s: &ScrubStatus) {
    let rate = if s.rate == 0 {
        "off".to_string()
    } else {
        format!("{}/s", format_size(s.rate))
    };
    let state = if s.current.is_some() {
        "running"
    } else {
        "idle"
    };
    t.row([
        addr.to_string(),
        rate,
        state.to_string(),
        s.passes.to_string(),
        last_scrub(s),
    ]);
    if let Some(p) = &s.current {
        t.note(1, pass_line("this pass", p));
    }
    if let Some(p) = &s.last {
        t.note(1, pass_line("last pass", p));
    }
}
