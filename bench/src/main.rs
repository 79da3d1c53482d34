//! `bench`: the benchmark harness behind `make bench` (docs/benchmarks.md).
//!
//! `bench run` starts a local cluster, mounts sheepfs (with and without the object cache),
//! runs fio against it and against references on the same disk in the same run (the raw file
//! with O_DIRECT, `bindfs --multithreaded` over it), and writes every figure as JSON.
//! `bench report` turns that JSON into markdown tables and charts (SVG and PNG, plotters: only
//! in a build with the `charts` feature, as `make bench` makes);
//! `bench compare OLD NEW` prints the ratio per figure and flags regressions.
//! `bench soak` (`make soak`) runs fio verify and a random-write exerciser on the mount while
//! nodes are killed, restarted, stopped and continued, and counts what went wrong.

mod charts;
mod compare;
mod figures;
mod report;
mod run;
mod soak;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "bench",
    version,
    about = "bench: measure sheepfs and its object cache with fio against the raw disk and \
bindfs, and run the soak test",
    long_about = "bench: the benchmark harness behind make bench and make soak. 'bench run' \
starts a local cluster and sheepfs mounts (with and without the object cache), runs fio jobs on \
them and on reference paths on the same disk (the raw file with O_DIRECT, bindfs over it), and \
writes every figure as JSON; 'bench report' turns that JSON into tables and charts; 'bench \
compare' flags regressions between two runs; 'bench soak' checks data under node failures.",
    after_help = "Guide: docs/benchmarks.md"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Start a cluster, run every fio job and reference, write the JSON of every figure.
    Run(run::RunArgs),
    /// Markdown tables (stdout or --markdown FILE) and charts (SVG + PNG) from a report.
    Report {
        /// The JSON written by `bench run`.
        json: PathBuf,
        /// Write the markdown here instead of stdout.
        #[arg(long)]
        markdown: Option<PathBuf>,
        /// Directory for the charts (created if missing); no charts without it. Needs a bench
        /// built with `--features charts` (make bench builds it so).
        #[arg(long)]
        charts: Option<PathBuf>,
    },
    /// Minutes of fio verify and a random-write exerciser on the mount while one node at a
    /// time is killed and restarted, or stopped and continued; exit status 1 if any verify
    /// error, EIO, stale read or replica difference was seen.
    Soak(soak::SoakArgs),
    /// Ratio NEW / OLD per figure; flags changes for the worse beyond the noise band.
    Compare {
        old: PathBuf,
        new: PathBuf,
        /// Relative change treated as noise, e.g. 0.15 for ±15 %. A figure whose runs spread
        /// wider than this uses its own spread.
        #[arg(long, default_value_t = 0.15)]
        noise: f64,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
        /// Exit with status 1 when any figure regressed.
        #[arg(long)]
        fail_on_regression: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.cmd {
        Cmd::Run(args) => run::run(args).map(|()| ExitCode::SUCCESS),
        Cmd::Soak(args) => soak::soak(args).map(|ok| {
            if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }),
        Cmd::Report {
            json,
            markdown,
            charts,
        } => report::report(&json, markdown.as_deref(), charts.as_deref())
            .map(|()| ExitCode::SUCCESS),
        Cmd::Compare {
            old,
            new,
            noise,
            json,
            fail_on_regression,
        } => compare::compare(&old, &new, noise, json).map(|regressed| {
            if regressed && fail_on_regression {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            }
        }),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("bench: {e:#}");
            ExitCode::from(2)
        }
    }
}
