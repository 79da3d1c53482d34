//! `bench report`: markdown tables and charts (to be written).
use std::path::Path;

use anyhow::Result;

pub fn report(_json: &Path, _markdown: Option<&Path>, _charts: Option<&Path>) -> Result<()> {
    anyhow::bail!("bench report is not written yet")
}
