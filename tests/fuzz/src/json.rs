//! What every JSON body must survive: any bytes either parse or are refused, and what parses
//! serializes to JSON that parses to the same value.

use proptest::prelude::*;
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Parses `bytes` as a `T`; when it parses, checks that it round-trips through its JSON.
pub fn round_trip<T: Serialize + DeserializeOwned>(
    bytes: &[u8],
) -> Result<Option<T>, TestCaseError> {
    let Ok(v) = serde_json::from_slice::<T>(bytes) else {
        return Ok(None);
    };
    let once = serde_json::to_value(&v).expect("a parsed value serializes");
    let again: T = serde_json::from_value(once.clone())
        .map_err(|e| TestCaseError::fail(format!("re-parsing {once} failed: {e}")))?;
    prop_assert_eq!(serde_json::to_value(&again).expect("serializes"), once);
    Ok(Some(v))
}
