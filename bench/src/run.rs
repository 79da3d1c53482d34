//! `bench run`: owned by the runner work (to be written).
use anyhow::Result;

#[derive(clap::Args)]
pub struct RunArgs {}

pub fn run(_args: RunArgs) -> Result<()> {
    anyhow::bail!("bench run is not written yet")
}
