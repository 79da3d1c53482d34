//! `dog cluster key ...`: cluster key files, made without a running cluster; and the key file
//! `dog cluster format --key-file PATH` creates when it does not exist yet.

use std::path::{Path, PathBuf};

use clap::Subcommand;
use objstore_proto::auth::KeyFile;
use serde::Serialize;

#[derive(Subcommand)]
pub enum KeyCmd {
    /// Write a new random cluster key to PATH (mode 0600; an existing file is never
    /// overwritten). Give the same file to every sheep, dog and sheepfs of the cluster.
    New {
        /// Where to write the key.
        path: PathBuf,
    },
}

#[derive(Serialize)]
struct Created<'a> {
    created: &'a Path,
}

/// Runs a key command (no connection to the cluster needed).
pub fn key(cmd: KeyCmd, json: bool) -> anyhow::Result<()> {
    match cmd {
        KeyCmd::New { path } => {
            KeyFile::create(&path)?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&Created { created: &path })?
                );
            } else {
                println!("created cluster key {}", path.display());
            }
            Ok(())
        }
    }
}

/// Before `dog cluster format --key-file PATH`: a key in PATH when there is none yet, so the
/// nodes started with the same path (on this host, or a shared one) pick it up at their next
/// connection. Says so on stderr.
pub fn create_for_format(path: &Path) -> anyhow::Result<()> {
    if path.exists() {
        return Ok(());
    }
    KeyFile::create(path)?;
    eprintln!(
        "created cluster key {} (copy it to every host of the cluster before their nodes start)",
        path.display()
    );
    Ok(())
}
