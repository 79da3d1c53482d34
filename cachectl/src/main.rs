//! `cachectl`: inspect, flush and evict the sheepfs object cache. See [`cachectl::cli`].

use std::process::ExitCode;

use clap::{CommandFactory, Parser};

fn main() -> ExitCode {
    clidoc::run_if_asked("cachectl", "1", cachectl::cli::Args::command);
    let args = cachectl::cli::Args::parse();
    match cachectl::cli::run(args, &mut std::io::stdout().lock()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cachectl: {e:#}");
            ExitCode::FAILURE
        }
    }
}
