//! Cluster-wide VDI attachment locks: at most one owner attaches a VDI read-write.
//!
//! Both records live in the cluster's key-value store:
//!
//! - `lock/<vdi>`: the holder, a [`LockInfo`] as JSON. Absent: nobody holds the VDI.
//! - `vdi-gen/<vdi>`: a decimal counter (absent = 0), bumped by every new attachment and by
//!   the first change of the data through a handle that does not hold the lock
//!   ([`note_unlocked_change`]). The lock carries the value it got, so a holder can tell
//!   whether anyone attached or wrote since (its cache is then stale). A re-attach by the same
//!   owner keeps the lock and its generation.
//!
//! Every change is a compare-and-swap; the client retries lost connections. The counter and
//! the lock are two keys: two hosts racing for a free VDI both bump the counter, one wins the
//! lock, so the counter may run ahead of the held lock's generation. Generations only grow,
//! and each attachment's is greater than every earlier attachment's.
//!
//! The lock is advisory: it binds the clients that take it (sheepfs with a cache). A host that
//! dies keeps its lock until an operator breaks it (`dog vdi lock break`).

use serde::{Deserialize, Serialize};
use thiserror::Error;

use objstore_proto::keys;
use objstore_proto::name::{validate_name, InvalidName};

use crate::client::{Client, ClientError};

/// Who holds a VDI and since when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockInfo {
    pub vdi: String,
    /// Identifies one attachment (e.g. a sheepfs cache); the same owner may re-attach.
    pub owner: String,
    /// The host the owner runs on, for people.
    pub host: String,
    /// Unix seconds.
    pub since: u64,
    /// The attachment generation (see the module documentation).
    pub gen: u64,
}

#[derive(Debug, Error)]
#[non_exhaustive]
pub enum LockError {
    #[error("VDI '{vdi}' is attached read-write by {host} (owner {owner}) since {since_human}; if that host is dead, free it with 'dog vdi lock break {vdi}'")]
    Held {
        vdi: String,
        owner: String,
        host: String,
        since: u64,
        since_human: String,
    },
    #[error(transparent)]
    InvalidName(#[from] InvalidName),
    #[error("no VDI named '{0}'")]
    NotFound(String),
    #[error("VDI '{name}' is damaged: {reason}")]
    Corrupt { name: String, reason: String },
    #[error(transparent)]
    Cluster(#[from] ClientError),
}

fn corrupt(vdi: &str, reason: String) -> LockError {
    LockError::Corrupt {
        name: vdi.to_string(),
        reason,
    }
}

fn decode(vdi: &str, raw: &str) -> Result<LockInfo, LockError> {
    serde_json::from_str(raw).map_err(|e| {
        corrupt(
            vdi,
            format!("bad lock record {raw:?}: {e} (free it with 'dog vdi lock break {vdi}')"),
        )
    })
}

fn encode(info: &LockInfo) -> String {
    serde_json::to_string(info).expect("serializable")
}

fn parse_gen(vdi: &str, raw: Option<&str>) -> Result<u64, LockError> {
    match raw {
        None => Ok(0),
        Some(s) => s
            .trim()
            .parse()
            .map_err(|_| corrupt(vdi, format!("bad generation counter {s:?}"))),
    }
}

fn held(info: LockInfo) -> LockError {
    LockError::Held {
        since_human: format_utc(info.since),
        vdi: info.vdi,
        owner: info.owner,
        host: info.host,
        since: info.since,
    }
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Unix seconds as `YYYY-MM-DD HH:MM:SS UTC`.
pub fn format_utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

/// Bumps `vdi-gen/<vdi>` and returns the new value.
async fn bump_gen(client: &Client, vdi: &str) -> Result<u64, LockError> {
    let key = keys::gen(vdi);
    loop {
        let cur = client.kv_get(&key).await?;
        let next = parse_gen(vdi, cur.as_deref())? + 1;
        if client
            .kv_cas(&key, cur.as_deref(), Some(&next.to_string()))
            .await?
        {
            return Ok(next);
        }
    }
}

/// Takes the lock of `vdi` for `owner` on `host`. A free VDI gets a new generation; a VDI
/// already held by `owner` is returned unchanged; one held by another owner is
/// [`LockError::Held`].
pub async fn acquire(
    client: &Client,
    vdi: &str,
    owner: &str,
    host: &str,
) -> Result<LockInfo, LockError> {
    validate_name(vdi)?;
    if client.kv_get(&keys::vdi(vdi)).await?.is_none() {
        return Err(LockError::NotFound(vdi.to_string()));
    }
    let key = keys::lock(vdi);
    loop {
        if let Some(raw) = client.kv_get(&key).await? {
            let info = decode(vdi, &raw)?;
            if info.owner == owner {
                return Ok(info);
            }
            return Err(held(info));
        }
        let gen = bump_gen(client, vdi).await?;
        let info = LockInfo {
            vdi: vdi.to_string(),
            owner: owner.to_string(),
            host: host.to_string(),
            since: now_secs(),
            gen,
        };
        if client.kv_cas(&key, None, Some(&encode(&info))).await? {
            return Ok(info);
        }
        // Someone else got there first (or our own earlier attempt did): decide again.
    }
}

/// Releases `owner`'s lock of `vdi`. A VDI that is not locked, or locked by another owner,
/// is left alone.
pub async fn release(client: &Client, vdi: &str, owner: &str) -> Result<(), LockError> {
    validate_name(vdi)?;
    let key = keys::lock(vdi);
    loop {
        let Some(raw) = client.kv_get(&key).await? else {
            return Ok(());
        };
        if decode(vdi, &raw)?.owner != owner {
            return Ok(());
        }
        if client.kv_cas(&key, Some(&raw), None).await? {
            return Ok(());
        }
    }
}

/// Who holds `vdi`'s lock, if anyone.
pub async fn holder(client: &Client, vdi: &str) -> Result<Option<LockInfo>, LockError> {
    validate_name(vdi)?;
    match client.kv_get(&keys::lock(vdi)).await? {
        Some(raw) => Ok(Some(decode(vdi, &raw)?)),
        None => Ok(None),
    }
}

/// Every lock, sorted by VDI name.
pub async fn list(client: &Client) -> Result<Vec<LockInfo>, LockError> {
    let mut out = Vec::new();
    for (key, raw) in client.kv_list(keys::LOCK_PREFIX).await? {
        let Some(vdi) = key.strip_prefix(keys::LOCK_PREFIX) else {
            continue;
        };
        let mut info = decode(vdi, &raw)?;
        info.vdi = vdi.to_string();
        out.push(info);
    }
    out.sort_by(|a, b| a.vdi.cmp(&b.vdi));
    Ok(out)
}

/// Removes the lock of `vdi` whoever holds it (for a dead host) and returns what it was.
/// A record that cannot be read is removed too and reported with owner and host `?`.
pub async fn break_lock(client: &Client, vdi: &str) -> Result<Option<LockInfo>, LockError> {
    validate_name(vdi)?;
    let key = keys::lock(vdi);
    loop {
        let Some(raw) = client.kv_get(&key).await? else {
            return Ok(None);
        };
        if client.kv_cas(&key, Some(&raw), None).await? {
            let info = decode(vdi, &raw).unwrap_or_else(|e| {
                tracing::warn!("{e}");
                LockInfo {
                    vdi: vdi.to_string(),
                    owner: "?".into(),
                    host: "?".into(),
                    since: 0,
                    gen: 0,
                }
            });
            return Ok(Some(info));
        }
    }
}

/// Notes a change of `vdi`'s data made without its lock (`dog vdi write`, sheepfs without a
/// cache or with the VDI in mode `off`): bumps its generation, so that a cache attaching it
/// afterwards finds a generation it does not expect and drops what it had cached. Returns
/// the new generation.
pub async fn note_unlocked_change(client: &Client, vdi: &str) -> Result<u64, LockError> {
    bump_gen(client, vdi).await
}

/// The current attachment generation of `vdi` (0 if it was never attached).
pub async fn generation(client: &Client, vdi: &str) -> Result<u64, LockError> {
    validate_name(vdi)?;
    let raw = client.kv_get(&keys::gen(vdi)).await?;
    parse_gen(vdi, raw.as_deref())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info() -> LockInfo {
        LockInfo {
            vdi: "disk0".into(),
            owner: "cache-1".into(),
            host: "hv1".into(),
            since: 1_700_000_000,
            gen: 3,
        }
    }

    #[test]
    fn utc_times() {
        assert_eq!(format_utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(format_utc(1_700_000_000), "2023-11-14 22:13:20 UTC");
        assert_eq!(format_utc(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(format_utc(4_102_444_799), "2099-12-31 23:59:59 UTC");
    }

    #[test]
    fn record_round_trip() {
        let i = info();
        let raw = encode(&i);
        assert_eq!(decode("disk0", &raw).unwrap(), i);
        let e = decode("disk0", "{not json").unwrap_err();
        assert!(matches!(e, LockError::Corrupt { .. }), "{e}");
        assert!(e.to_string().contains("dog vdi lock break disk0"), "{e}");
    }

    #[test]
    fn generations() {
        assert_eq!(parse_gen("v", None).unwrap(), 0);
        assert_eq!(parse_gen("v", Some("41")).unwrap(), 41);
        assert!(parse_gen("v", Some("x")).is_err());
    }

    #[test]
    fn held_message() {
        let e = held(info());
        assert_eq!(
            e.to_string(),
            "VDI 'disk0' is attached read-write by hv1 (owner cache-1) since \
             2023-11-14 22:13:20 UTC; if that host is dead, free it with \
             'dog vdi lock break disk0'"
        );
    }

    #[test]
    fn keys() {
        assert_eq!(keys::lock("a"), "lock/a");
        assert_eq!(keys::gen("a"), "vdi-gen/a");
    }
}
