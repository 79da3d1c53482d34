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
//! The lock is advisory: it binds the clients that take it (sheepfs: with a cache, and
//! without one unless mounted with `--no-lock`).
//!
//! # Leases
//!
//! A lock taken with a TTL ([`acquire`] with `Some(ttl)`; sheepfs always, `--lock-ttl`,
//! default [`DEFAULT_TTL`]) is bound to a cluster-wide lease of its own: the holder renews it
//! ([`keepalive`], every TTL/3, through any node) and a host that dies loses its lock within
//! the TTL, with no operator. [`release`] and [`break_lock`] revoke the lease. A lock taken
//! without a TTL (`dog vdi lock take` without `--ttl`) is persistent: it stays until released
//! or broken (`dog vdi lock break`).
//!
//! A holder whose lease ended while it was alive (it could not reach the cluster for a TTL)
//! takes the lock again, with the same generation, if nobody attached since (the counter
//! still equals its generation and the lock is free): [`Renewal::Retaken`]. Otherwise
//! another attachment may have written the VDI: [`Renewal::Lost`], and the holder must stop
//! writing (sheepfs fails writes with EIO).

use std::time::Duration;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use objstore_proto::keys;
use objstore_proto::name::{validate_name, InvalidName};

use crate::client::{Client, ClientError};

pub mod handover;
pub use handover::{acquire_handed_over, LockRequest, Taken, REQUEST_POLL};

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
    /// The lease the lock is bound to; None: a persistent lock (see the module documentation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<u64>,
    /// The lease's TTL, seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_secs: Option<u64>,
    /// The holder's control socket on `host` (a sheepfs with a cache: its `DIR/control.sock`),
    /// where `dog vdi snapshot | rollback` ask it to do them. None: the holder takes no
    /// requests (records older than this field, a mount without a cache, `dog vdi lock`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control: Option<String>,
}

impl LockInfo {
    /// Whether the lock is bound to a lease (it ends with its holder).
    pub fn leased(&self) -> bool {
        self.lease.is_some()
    }
}

/// This host's name, as lock owners record it (`/proc/sys/kernel/hostname`; `localhost` if
/// it cannot be read).
pub fn local_host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}

/// sheepfs's `--lock-ttl` default: a host that died loses its locks within this.
pub const DEFAULT_TTL: Duration = Duration::from_secs(15);

/// What [`keepalive`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Renewal {
    /// The lease was renewed (or the lock has none).
    Alive,
    /// The lease had ended; the lock was free and nobody had attached since: it is held
    /// again, same generation, under a new lease (this record).
    Retaken(LockInfo),
    /// The lease had ended and the lock is no longer this holder's to take back: another
    /// attachment came (the holder is given if it still holds the lock).
    Lost(Option<LockInfo>),
}

impl Renewal {
    /// For a log line after [`Renewal::Lost`] with `holder`: who has the VDI now.
    pub fn lost_to(holder: Option<&LockInfo>) -> String {
        match holder {
            Some(h) => format!(
                "it is now attached by {} (owner {}, generation {})",
                h.host, h.owner, h.gen
            ),
            None => "it was attached or written elsewhere since".to_string(),
        }
    }
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
    #[error("VDI '{vdi}' is attached read-write by {host} (owner {owner}), which did not hand its lock over within {waited:?} (it neither answered nor lost its lease)")]
    HandOverTimedOut {
        vdi: String,
        owner: String,
        host: String,
        waited: Duration,
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

/// Takes the lock of `vdi` for `owner` on `host`; bound to a new lease of `ttl` if given
/// (renew it with [`keepalive`]), persistent otherwise. A free VDI gets a new generation; a
/// VDI already held by `owner` keeps its generation (its record is moved to the new lease,
/// or made persistent); one held by another owner is [`LockError::Held`].
pub async fn acquire(
    client: &Client,
    vdi: &str,
    owner: &str,
    host: &str,
    ttl: Option<Duration>,
) -> Result<LockInfo, LockError> {
    acquire_again(client, vdi, owner, host, ttl, None, None).await
}

/// [`acquire`] by an owner that held the lock before with generation `resume` (a sheepfs
/// killed, or cut off, for longer than its TTL): if the lock is free and nobody attached or
/// wrote without it since (the counter still equals `resume`), the owner gets the lock back
/// with that generation, so what it cached stays valid. `control`: the holder's control
/// socket, recorded in the lock ([`LockInfo::control`]).
pub async fn acquire_again(
    client: &Client,
    vdi: &str,
    owner: &str,
    host: &str,
    ttl: Option<Duration>,
    resume: Option<u64>,
    control: Option<&str>,
) -> Result<LockInfo, LockError> {
    validate_name(vdi)?;
    if client.kv_get(&keys::vdi(vdi)).await?.is_none() {
        return Err(LockError::NotFound(vdi.to_string()));
    }
    let mut lease = match ttl {
        Some(ttl) => Some((client.lease_grant(ttl).await?, ttl_secs(ttl))),
        None => None,
    };
    let res = take(client, vdi, owner, host, &mut lease, resume, control).await;
    if let (Err(_), Some((id, _))) = (&res, lease) {
        let _ = client.lease_revoke(id).await;
    }
    res
}

/// A TTL as the lease has it: whole seconds, at least one.
fn ttl_secs(ttl: Duration) -> u64 {
    (ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0)).max(1)
}

/// Writes `info` over `expected`, bound to `lease` if given.
async fn put(
    client: &Client,
    key: &str,
    expected: Option<&str>,
    info: &LockInfo,
) -> Result<bool, LockError> {
    Ok(match info.lease {
        Some(id) => {
            client
                .kv_cas_leased(key, expected, &encode(info), id)
                .await?
        }
        None => client.kv_cas(key, expected, Some(&encode(info))).await?,
    })
}

/// [`acquire`]'s loop; `lease` may be replaced by a new one if it ended meanwhile.
async fn take(
    client: &Client,
    vdi: &str,
    owner: &str,
    host: &str,
    lease: &mut Option<(u64, u64)>,
    resume: Option<u64>,
    control: Option<&str>,
) -> Result<LockInfo, LockError> {
    let key = keys::lock(vdi);
    loop {
        if let Some(raw) = client.kv_get(&key).await? {
            let cur = decode(vdi, &raw)?;
            if cur.owner != owner {
                return Err(held(cur));
            }
            if cur.lease.is_none() && lease.is_none() && cur.control.as_deref() == control {
                return Ok(cur);
            }
            // Ours: moved onto the new lease (or made persistent), its old lease revoked.
            let info = LockInfo {
                lease: lease.map(|l| l.0),
                ttl_secs: lease.map(|l| l.1),
                control: control.map(str::to_string),
                ..cur.clone()
            };
            if put(client, &key, Some(&raw), &info).await? {
                if let Some(old) = cur.lease.filter(|&old| Some(old) != info.lease) {
                    client.lease_revoke(old).await?;
                }
                return Ok(info);
            }
            renew_or_replace(client, lease).await?;
            continue;
        }
        let gen = match resume {
            Some(g) if g == generation(client, vdi).await? => g,
            _ => bump_gen(client, vdi).await?,
        };
        let info = LockInfo {
            vdi: vdi.to_string(),
            owner: owner.to_string(),
            host: host.to_string(),
            since: now_secs(),
            gen,
            lease: lease.map(|l| l.0),
            ttl_secs: lease.map(|l| l.1),
            control: control.map(str::to_string),
        };
        if put(client, &key, None, &info).await? {
            return Ok(info);
        }
        // Someone else got there first (or our own earlier attempt did, or our lease ended):
        // decide again.
        renew_or_replace(client, lease).await?;
    }
}

/// After a refused write: a lease that ended (a cluster out of reach for its TTL) is
/// replaced, so that the next attempt can succeed.
async fn renew_or_replace(
    client: &Client,
    lease: &mut Option<(u64, u64)>,
) -> Result<(), LockError> {
    if let Some((id, secs)) = *lease {
        if !client.lease_keepalive(id).await? {
            let new = client.lease_grant(Duration::from_secs(secs)).await?;
            *lease = Some((new, secs));
        }
    }
    Ok(())
}

/// Renews the lease of `held` (a lock [`acquire`] returned); see [`Renewal`]. Errors (no
/// node reachable) leave the lock as it was: try again before the TTL runs out.
pub async fn keepalive(client: &Client, held: &LockInfo) -> Result<Renewal, LockError> {
    let Some(lease) = held.lease else {
        return Ok(Renewal::Alive);
    };
    if client.lease_keepalive(lease).await? {
        return Ok(Renewal::Alive);
    }
    let vdi = held.vdi.as_str();
    let key = keys::lock(vdi);
    let secs = held.ttl_secs.unwrap_or(DEFAULT_TTL.as_secs());
    let mut new_lease: Option<u64> = None;
    let res = async {
        loop {
            let cur = match client.kv_get(&key).await? {
                Some(raw) => Some((decode(vdi, &raw)?, raw)),
                None => None,
            };
            match &cur {
                Some((info, _)) if info.owner != held.owner || info.gen != held.gen => {
                    return Ok(Renewal::Lost(Some(info.clone())));
                }
                // The same attachment under another lease (our own attempt below landed, or
                // the owner took it again) or made persistent: held.
                Some((info, _)) if info.lease != Some(lease) => {
                    return Ok(Renewal::Retaken(info.clone()));
                }
                _ => {}
            }
            let gen_now = parse_gen(vdi, client.kv_get(&keys::gen(vdi)).await?.as_deref())?;
            if gen_now != held.gen {
                return Ok(Renewal::Lost(cur.map(|c| c.0)));
            }
            let id = match new_lease {
                Some(id) => id,
                None => {
                    let id = client.lease_grant(Duration::from_secs(secs)).await?;
                    new_lease = Some(id);
                    id
                }
            };
            let info = LockInfo {
                lease: Some(id),
                ttl_secs: Some(secs),
                ..held.clone()
            };
            let expected = cur.as_ref().map(|c| c.1.as_str());
            if client
                .kv_cas_leased(&key, expected, &encode(&info), id)
                .await?
            {
                return Ok(Renewal::Retaken(info));
            }
            // The lock changed meanwhile (or our own attempt landed), or the new lease ended
            // already (then a new one): decide again.
            if !client.lease_keepalive(id).await? {
                new_lease = None;
            }
        }
    }
    .await;
    match (&res, new_lease) {
        (Ok(Renewal::Retaken(i)), Some(id)) if i.lease == Some(id) => {}
        (_, Some(id)) => {
            let _ = client.lease_revoke(id).await;
        }
        _ => {}
    }
    res
}

/// Releases `owner`'s lock of `vdi` (revoking its lease). A VDI that is not locked, or
/// locked by another owner, is left alone.
pub async fn release(client: &Client, vdi: &str, owner: &str) -> Result<(), LockError> {
    validate_name(vdi)?;
    let key = keys::lock(vdi);
    loop {
        let Some(raw) = client.kv_get(&key).await? else {
            return Ok(());
        };
        let info = decode(vdi, &raw)?;
        if info.owner != owner {
            return Ok(());
        }
        if client.kv_cas(&key, Some(&raw), None).await? {
            if let Some(lease) = info.lease {
                client.lease_revoke(lease).await?;
            }
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
            let info = decode(vdi, &raw);
            if let Ok(LockInfo {
                lease: Some(lease), ..
            }) = &info
            {
                // Its holder, if alive, finds its lease ended at its next renewal, and the lock
                // free: it takes it back unless someone attached meanwhile.
                client.lease_revoke(*lease).await?;
            }
            let info = info.unwrap_or_else(|e| {
                tracing::warn!("{e}");
                LockInfo {
                    vdi: vdi.to_string(),
                    owner: "?".into(),
                    host: "?".into(),
                    since: 0,
                    gen: 0,
                    lease: None,
                    ttl_secs: None,
                    control: None,
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
            lease: None,
            ttl_secs: None,
            control: None,
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
        assert!(
            !raw.contains("lease"),
            "a persistent lock's record is as before: {raw}"
        );
        let leased = LockInfo {
            lease: Some(u64::MAX - 1),
            ttl_secs: Some(15),
            ..info()
        };
        assert_eq!(decode("disk0", &encode(&leased)).unwrap(), leased);
        assert!(leased.leased() && !i.leased());
        assert!(!raw.contains("control"), "no socket, no field: {raw}");
        let mount = LockInfo {
            control: Some("/var/cache/sheepfs/control.sock".into()),
            ..info()
        };
        assert_eq!(decode("disk0", &encode(&mount)).unwrap(), mount);
        // A record written before the field existed still parses.
        let old = r#"{"vdi":"disk0","owner":"cache-1","host":"hv1","since":1700000000,"gen":3,"lease":7,"ttl_secs":15}"#;
        let parsed = decode("disk0", old).unwrap();
        assert_eq!(parsed.control, None);
        assert_eq!(parsed.lease, Some(7));
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
