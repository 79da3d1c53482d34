//! `dog vdi backup [NAME@FROM] NAME@TO > delta` and `dog vdi restore NAME < delta`: the
//! plumbing around `objstore_client::backup` (stdout/stdin on their own threads, progress on
//! stderr, the summary). The format is in docs/backup.md.

use std::io::{BufReader, BufWriter, IsTerminal};

use anyhow::{anyhow, bail};
use futures::stream::{FuturesUnordered, StreamExt};
use objstore_client::backup::{
    BackupError, DeltaError, DeltaReader, DeltaWriter, Header, Record, Source, Summary, Target,
};
use objstore_client::vdi::PARALLEL;
use objstore_proto::size::format_size;
use serde::Serialize;

use crate::Ctx;

/// What `dog vdi backup` reports on stderr (JSON with `--json`: stdout is the delta).
#[derive(Serialize)]
struct BackupOut {
    from: Option<String>,
    to: String,
    size: u64,
    /// Objects whose map entry differs (all allocated ones in a full backup).
    changed_objects: u64,
    objects: u64,
    #[serde(flatten)]
    summary: Summary,
}

enum Msg {
    Records(Vec<Record>),
    End,
}

/// Merges zero records of neighbouring indexes into one.
#[derive(Default)]
struct MergeZeros {
    zero: Option<(u64, u64)>,
}

impl MergeZeros {
    /// The records to write now that `r` comes (none while zeros run on).
    fn push(&mut self, r: Record) -> Vec<Record> {
        if let (Record::Zero { offset, len }, Some((o, l))) = (&r, &mut self.zero) {
            if *o + *l == *offset {
                *l += len;
                return Vec::new();
            }
        }
        let mut out: Vec<Record> = self.finish().into_iter().collect();
        match r {
            Record::Zero { offset, len } => self.zero = Some((offset, len)),
            data => out.push(data),
        }
        out
    }

    /// The zeros still held.
    fn finish(&mut self) -> Option<Record> {
        self.zero
            .take()
            .map(|(offset, len)| Record::Zero { offset, len })
    }
}

/// Writes the delta on stdout from `rx`; the trailer only after [`Msg::End`], so a backup that
/// failed leaves a stream every restore refuses.
fn writer(header: Header, mut rx: tokio::sync::mpsc::Receiver<Msg>) -> std::io::Result<Summary> {
    let out = BufWriter::with_capacity(1 << 20, std::io::stdout().lock());
    let mut w = DeltaWriter::new(out, &header)?;
    let mut merge = MergeZeros::default();
    while let Some(msg) = rx.blocking_recv() {
        let Msg::Records(recs) = msg else {
            if let Some(r) = merge.finish() {
                w.record(&r)?;
            }
            return w.finish();
        };
        for r in recs.into_iter().flat_map(|r| merge.push(r)) {
            w.record(&r)?;
        }
    }
    Err(std::io::Error::other("the backup stopped before its end"))
}

pub async fn backup(ctx: &Ctx, first: &str, second: Option<&str>) -> anyhow::Result<()> {
    let (from, to) = match second {
        Some(to) => (Some(first), to),
        None => (None, first),
    };
    if std::io::stdout().is_terminal() {
        bail!("refusing to write a binary delta to a terminal: redirect it ('dog vdi backup ... > FILE' or into a pipe)");
    }
    let src = Source::open(&ctx.client, from, to).await?;
    let changes = src.changes();
    let total: u64 = changes.iter().map(|c| src.object_len(c.index)).sum();
    let pb = crate::vdi::progress(total, "backing up");
    let (tx, rx) = tokio::sync::mpsc::channel::<Msg>(4);
    let header = src.header().clone();
    let thread = std::thread::spawn(move || writer(header, rx));
    let mut stream = futures::stream::iter(changes.iter().copied())
        .map(|c| {
            let src = &src;
            async move { src.records(c).await.map(|r| (r, src.object_len(c.index))) }
        })
        .buffered(PARALLEL);
    let mut failed = None;
    while let Some(r) = stream.next().await {
        match r {
            Ok((recs, n)) => {
                if tx.send(Msg::Records(recs)).await.is_err() {
                    break; // the writer failed: its error is reported below
                }
                pb.inc(n);
            }
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
    }
    drop(stream);
    if failed.is_none() {
        let _ = tx.send(Msg::End).await;
    }
    drop(tx);
    let written = thread.join().expect("delta writer");
    pb.finish_and_clear();
    if let Some(e) = failed {
        bail!("{e}; the delta written so far has no trailer, and no restore accepts it");
    }
    let summary = written.map_err(|e| anyhow!("writing the delta to stdout: {e}"))?;
    let h = src.header();
    let out = BackupOut {
        from: from.map(str::to_string),
        to: to.to_string(),
        size: h.size,
        changed_objects: changes.len() as u64,
        objects: h.size.div_ceil(h.object_size as u64),
        summary,
    };
    if ctx.json {
        eprintln!(
            "{}",
            serde_json::to_string_pretty(&out).expect("serializable")
        );
    } else {
        let what = match from {
            Some(f) => format!("changes from '{f}' to '{to}'"),
            None => format!("'{to}'"),
        };
        eprintln!(
            "backed up {what}: {} of {} objects changed; {} records, {} of data, {} of zeros; delta {}",
            out.changed_objects,
            out.objects,
            summary.records,
            format_size(summary.data_bytes),
            format_size(summary.zero_bytes),
            format_size(summary.stream_bytes)
        );
    }
    Ok(())
}

enum Item {
    Header(Header),
    Record(Record),
    End(Summary),
}

/// Decodes stdin into `tx`: the header, each record, the end; the first error ends it.
fn reader(tx: tokio::sync::mpsc::Sender<Result<Item, DeltaError>>) {
    let input = BufReader::with_capacity(1 << 20, std::io::stdin().lock());
    let mut d = match DeltaReader::new(input) {
        Ok(d) => d,
        Err(e) => {
            let _ = tx.blocking_send(Err(e));
            return;
        }
    };
    if tx
        .blocking_send(Ok(Item::Header(d.header().clone())))
        .is_err()
    {
        return;
    }
    loop {
        let item = match d.next() {
            Ok(Some(r)) => Ok(Item::Record(r)),
            Ok(None) => Ok(Item::End(d.summary())),
            Err(e) => Err(e),
        };
        let last = !matches!(item, Ok(Item::Record(_)));
        if tx.blocking_send(item).is_err() || last {
            return;
        }
    }
}

/// What `dog vdi restore` prints.
#[derive(Serialize)]
struct RestoreOut {
    vdi: String,
    snapshot: String,
    from: Option<String>,
    created: bool,
    size: u64,
    #[serde(flatten)]
    summary: Summary,
}

pub async fn restore(ctx: &Ctx, name: &str, force: bool) -> anyhow::Result<()> {
    if std::io::stdin().is_terminal() {
        bail!("refusing to read a delta from a terminal: 'dog vdi restore {name} < FILE'");
    }
    let (tx, mut rx) = tokio::sync::mpsc::channel(4);
    std::thread::spawn(move || reader(tx));
    let header = match rx.recv().await {
        Some(Ok(Item::Header(h))) => h,
        Some(Err(e)) => bail!("{e}; nothing was changed"),
        _ => bail!("the delta reader stopped before the header; nothing was changed"),
    };
    let target = Target::prepare(&ctx.client, name, &header, force).await?;
    let vdi = target.vdi();
    let pb = crate::vdi::progress(header.size, "restoring");
    let mut inflight = FuturesUnordered::new();
    let mut failed: Option<anyhow::Error> = None;
    let mut summary = None;
    while failed.is_none() && summary.is_none() {
        match rx.recv().await {
            Some(Ok(Item::Record(r))) => {
                let (vdi, end) = (vdi.clone(), r.end());
                inflight.push(async move { Target::apply(&vdi, r).await.map(|()| end) });
                while inflight.len() >= PARALLEL {
                    match inflight.next().await.expect("non-empty") {
                        Ok(end) => pb.set_position(end.max(pb.position())),
                        Err(e) => failed = Some(applying(e)),
                    }
                }
            }
            Some(Ok(Item::End(s))) => summary = Some(s),
            Some(Ok(Item::Header(_))) => failed = Some(anyhow!("a second header in the delta")),
            Some(Err(e)) => failed = Some(e.into()),
            None => failed = Some(anyhow!("the delta reader stopped before the end")),
        }
    }
    while let Some(r) = inflight.next().await {
        if let Err(e) = r {
            failed.get_or_insert(applying(e));
        }
    }
    pb.finish_and_clear();
    if let Some(e) = failed {
        bail!("{e:#}; {}", target.left());
    }
    let summary = summary.expect("the end was reached");
    let snap = target
        .finish()
        .await
        .map_err(|e| anyhow!("{e}; every record was applied to '{name}'"))?;
    let out = RestoreOut {
        vdi: name.to_string(),
        snapshot: snap.full_name(),
        from: header.from_tag.as_deref().map(|t| format!("{name}@{t}")),
        created: target.created,
        size: header.size,
        summary,
    };
    ctx.print(&out, || {
        format!(
            "restored {} records ({} of data, {} of zeros) into VDI '{name}'{}; took snapshot '{}'\n",
            summary.records,
            format_size(summary.data_bytes),
            format_size(summary.zero_bytes),
            if out.created { " (created)" } else { "" },
            out.snapshot
        )
    });
    Ok(())
}

fn applying(e: BackupError) -> anyhow::Error {
    anyhow!("applying the delta: {e}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn neighbouring_zero_records_merge() {
        let mut m = MergeZeros::default();
        let mut out = Vec::new();
        for r in [
            Record::Zero { offset: 0, len: 10 },
            Record::Zero { offset: 10, len: 5 },
            Record::Zero { offset: 16, len: 4 },
            Record::Data {
                offset: 20,
                data: Bytes::from_static(b"x"),
            },
            Record::Zero { offset: 30, len: 1 },
        ] {
            out.extend(m.push(r));
        }
        out.extend(m.finish());
        assert_eq!(
            out,
            vec![
                Record::Zero { offset: 0, len: 15 },
                Record::Zero { offset: 16, len: 4 },
                Record::Data {
                    offset: 20,
                    data: Bytes::from_static(b"x")
                },
                Record::Zero { offset: 30, len: 1 },
            ]
        );
    }
}
