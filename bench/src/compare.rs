//! `bench compare` (to be written).
use std::path::Path;

use anyhow::Result;

/// Returns whether any figure regressed.
pub fn compare(_old: &Path, _new: &Path, _noise: f64, _json: bool) -> Result<bool> {
    anyhow::bail!("bench compare is not written yet")
}
