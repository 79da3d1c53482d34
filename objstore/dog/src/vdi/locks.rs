//! `dog vdi lock ...`: the attachment locks of VDIs, listed, broken, taken and released by
//! hand.

use clap::Subcommand;
use objstore_client::lock::{self, LockInfo};
use objstore_proto::table::{
    Align::{Left, Right},
    Table,
};

use crate::Ctx;

#[derive(Subcommand)]
pub enum LockCmd {
    /// List every attachment lock: who holds it, since when, and its lease.
    ///
    /// Shows each lock's holder, generation and lease, and the mount asking for it if a
    /// hand-over is pending (`requested_by` with --json).
    List,
    /// Free a VDI's lock, whoever holds it (for a holder that is dead or gone for good).
    ///
    /// Persistent or lease-bound (a lease-bound lock of a dead host frees itself within its
    /// TTL). A live holder that finds its lock broken takes
    /// it back if nobody attached meanwhile, and stops writing otherwise.
    Break { name: String },
    /// Take a VDI's lock for OWNER (for scripts and tests; sheepfs takes its own).
    ///
    /// Without --ttl the lock is persistent: it stays until released or broken.
    #[command(alias = "take")]
    Acquire {
        name: String,
        /// Who takes the lock; the same owner may take it again.
        #[arg(long)]
        owner: String,
        /// The host to record (default: this host's name).
        #[arg(long)]
        host: Option<String>,
        /// Bind the lock to a lease of this TTL (e.g. 15s): nothing renews it after dog
        /// exits, so it frees itself that long after.
        #[arg(long, value_parser = parse_ttl)]
        ttl: Option<std::time::Duration>,
    },
    /// Release OWNER's lock of a VDI; a lock held by another owner is left alone (for scripts
    /// and tests).
    Release {
        name: String,
        #[arg(long)]
        owner: String,
    },
}

/// A lease TTL: a human duration (e.g. 15s), 1 s to 1 day, rounded up to whole seconds.
fn parse_ttl(s: &str) -> Result<std::time::Duration, String> {
    let d = objstore_proto::duration::parse_duration(s).map_err(|e| e.to_string())?;
    if d.is_zero() || d > std::time::Duration::from_secs(86_400) {
        return Err(format!("'{s}': a lock TTL is from 1s to 1 day"));
    }
    Ok(d)
}

/// How a lock ends: `lease 15s` (frees itself that long after its holder stops renewing it)
/// or `persistent` (until released or broken).
fn lock_kind(l: &LockInfo) -> String {
    match (l.lease, l.ttl_secs) {
        (Some(_), Some(t)) => format!("lease {t}s"),
        (Some(_), None) => "lease".to_string(),
        (None, _) => "persistent".to_string(),
    }
}

fn lock_table(list: &[LockInfo], asked: &[lock::LockRequest]) -> String {
    let mut t = Table::new(&[
        ("VDI", Left),
        ("Host", Left),
        ("Owner", Left),
        ("Since", Left),
        ("Gen", Right),
        ("Kind", Left),
    ]);
    for l in list {
        t.row([
            l.vdi.clone(),
            l.host.clone(),
            l.owner.clone(),
            lock::format_utc(l.since),
            l.gen.to_string(),
            lock_kind(l),
        ]);
        if let Some(r) = asked.iter().find(|r| r.vdi == l.vdi && r.gen == l.gen) {
            t.note(
                1,
                format!(
                    "asked for by {} (owner {}) since {}: a hand-over is pending",
                    r.host,
                    r.owner,
                    lock::format_utc(r.since)
                ),
            );
        }
    }
    t.render()
}

/// A lock as `dog vdi lock list`, `acquire` and `break` show it with `--json`: the record, and
/// whether it is lease-bound.
#[derive(serde::Serialize)]
struct LockRow<'a> {
    #[serde(flatten)]
    info: &'a LockInfo,
    leased: bool,
    /// A mount asking the holder to hand the lock over (cooperative mode), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    requested_by: Option<&'a lock::LockRequest>,
}

/// This host's name, for the lock record.
fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates within it or
    // truncates, and we stop at the first NUL or the end.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    match std::str::from_utf8(&buf[..end]) {
        Ok(h) if rc == 0 && !h.is_empty() => h.to_string(),
        _ => "unknown-host".to_string(),
    }
}

pub(super) async fn lock_cmd(ctx: &Ctx, cmd: LockCmd) -> anyhow::Result<()> {
    let client = &ctx.client;
    match cmd {
        LockCmd::List => {
            let list = lock::list(client).await?;
            let asked = lock::handover::requests(client).await?;
            let rows: Vec<LockRow> = list
                .iter()
                .map(|info| LockRow {
                    info,
                    leased: info.leased(),
                    requested_by: asked
                        .iter()
                        .find(|r| r.vdi == info.vdi && r.gen == info.gen),
                })
                .collect();
            ctx.print(&rows, || lock_table(&list, &asked));
        }
        LockCmd::Break { name } => {
            let freed = lock::break_lock(client, &name).await?;
            let freed_row = freed.as_ref().map(|info| LockRow {
                info,
                leased: info.leased(),
                requested_by: None,
            });
            ctx.print(
                &serde_json::json!({"vdi": name, "freed": freed_row}),
                || match &freed {
                    Some(l) => format!(
                        "freed the lock of VDI '{name}' held by {} (owner {}) since {}, gen {}\n",
                        l.host,
                        l.owner,
                        lock::format_utc(l.since),
                        l.gen
                    ),
                    None => format!("VDI '{name}' had no lock\n"),
                },
            );
        }
        LockCmd::Acquire {
            name,
            owner,
            host,
            ttl,
        } => {
            let host = host.unwrap_or_else(hostname);
            let info = lock::acquire(client, &name, &owner, &host, ttl).await?;
            let row = LockRow {
                info: &info,
                leased: info.leased(),
                requested_by: None,
            };
            ctx.print(&row, || {
                format!(
                    "VDI '{name}' is locked by {} (owner {}) since {}, gen {} ({})\n",
                    info.host,
                    info.owner,
                    lock::format_utc(info.since),
                    info.gen,
                    lock_kind(&info)
                )
            });
        }
        LockCmd::Release { name, owner } => {
            // Only to say what happened: release itself never frees another owner's lock.
            let held = lock::list(client)
                .await?
                .into_iter()
                .any(|l| l.vdi == name && l.owner == owner);
            lock::release(client, &name, &owner).await?;
            ctx.print(
                &serde_json::json!({"vdi": name, "owner": owner, "released": held}),
                || {
                    if held {
                        format!("released the lock of VDI '{name}' (owner {owner})\n")
                    } else {
                        format!("VDI '{name}' was not locked by owner {owner}: nothing released\n")
                    }
                },
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lock(vdi: &str, owner: &str, gen: u64) -> LockInfo {
        LockInfo {
            vdi: vdi.into(),
            owner: owner.into(),
            host: "h".into(),
            since: 1_764_633_600,
            gen,
            lease: Some(7),
            ttl_secs: Some(15),
            control: None,
        }
    }

    #[test]
    fn lock_table_keeps_its_columns_for_long_and_short_values() {
        let long = lock(
            "a-vdi-name-longer-than-any-fixed-width",
            "host/mount:/mnt",
            1,
        );
        let short = lock(
            "x",
            "a-very-long-owner-name-of-forty-characters",
            4_294_967_296,
        );
        let asked = [lock::LockRequest {
            vdi: "x".into(),
            owner: "b/mount:/mnt".into(),
            host: "b".into(),
            since: 1_764_633_600,
            gen: 4_294_967_296,
            lease: None,
        }];
        let t = lock_table(&[long, short], &asked);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 4, "{t}");
        // Every column starts at the same place on the header and on both rows.
        for (header, values) in [
            ("Host", ["h", "h"]),
            ("Owner", ["host/mount", "a-very-long-owner"]),
            ("Since", ["2025-12-02", "2025-12-02"]),
            ("Kind", ["lease 15s", "lease 15s"]),
        ] {
            let at = lines[0].find(header).unwrap();
            for (line, v) in lines[1..3].iter().zip(values) {
                assert_eq!(&line[at..at + v.len()], v, "{header}:\n{t}");
            }
        }
        // Gen is right-aligned: the 10-digit generation and the 1 end where "Gen" ends.
        let end = lines[0].find("Gen").unwrap() + 3;
        assert!(lines[1][..end].ends_with(" 1"), "{t}");
        assert!(lines[2][..end].ends_with("4294967296"), "{t}");
        // The pending hand-over sits under the row it belongs to, from the second column.
        assert_eq!(
            lines[3].find("asked for by b"),
            lines[0].find("Host"),
            "{t}"
        );
    }
}
