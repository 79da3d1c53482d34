//! `dog node stat`: one node's counters at a glance (the `NodeStat` operation).

use std::net::ToSocketAddrs;

use anyhow::Context;
use objstore_proto::api::{DiskHealth, HealthState, NodeStats, OpStats};
use objstore_proto::size::format_size;
use objstore_proto::table::{
    Align::{Left, Right},
    Table,
};

use crate::Ctx;

/// The health column of `dog node list`: `ok`, `degraded(N)` (errors within the window) or
/// `FENCED`.
pub fn health_word(h: &DiskHealth) -> String {
    match h.state {
        HealthState::Ok => "ok".into(),
        HealthState::Degraded => format!("degraded({})", h.recent),
        HealthState::Fenced => "FENCED".into(),
    }
}

pub async fn node_stat(ctx: &Ctx, addr: Option<&str>) -> anyhow::Result<()> {
    let addr = match addr {
        Some(a) => a
            .to_socket_addrs()
            .with_context(|| format!("bad address '{a}': expected HOST:PORT"))?
            .next()
            .with_context(|| format!("'{a}' resolves to no address"))?,
        None => ctx.client.bootstrap()[0],
    };
    let s = ctx
        .client
        .node_stats(addr)
        .await
        .with_context(|| format!("node {addr}"))?;
    ctx.print(&s, || human(&s));
    Ok(())
}

/// The time under which a fraction `q` of the requests finished, as a bucket bound.
fn quantile(x: &OpStats, q: f64) -> String {
    let want = (x.requests as f64 * q).ceil() as u64;
    let le = x
        .latency_buckets
        .iter()
        .find(|(_, n)| *n >= want.max(1))
        .map(|(le, _)| *le)
        .unwrap_or(u64::MAX);
    if le == u64::MAX {
        ">10s".into()
    } else {
        format!("≤{}", micros(le))
    }
}

fn micros(us: u64) -> String {
    if us >= 1_000_000 {
        format!("{:.1}s", us as f64 / 1e6)
    } else if us >= 1000 {
        format!("{:.1}ms", us as f64 / 1e3)
    } else {
        format!("{us}µs")
    }
}

fn human(s: &NodeStats) -> String {
    let st = &s.status;
    let h = &st.health;
    let mut o = format!(
        "Node {} (id {:016x}), epoch {}, up {}s\n",
        st.addr, st.id, st.epoch, s.uptime_secs
    );
    o += &format!(
        "Disk: {} total, {} free, {} objects\n",
        format_size(st.disk_total),
        format_size(st.disk_free),
        st.objects
    );
    o += &format!(
        "Health: {} ({} I/O error(s) within {}s, fenced at {}; since start: read {}, write {}, sync {}, remove {}; copies restored {})\n",
        health_word(h),
        h.recent,
        h.window_secs,
        if h.limit == 0 { "never".to_string() } else { h.limit.to_string() },
        h.io_errors.read,
        h.io_errors.write,
        h.io_errors.sync,
        h.io_errors.remove,
        h.restored
    );
    if let Some(e) = &h.last_error {
        o += &format!("  last error: {e}\n");
    }
    if let Some(why) = &h.fenced {
        o += &format!("  FENCED: {why}\n");
    }
    let rc = &st.recovery;
    o += &format!(
        "Recovery: epoch {} {}, {}/{} objects, {} failed, {} waiting\n",
        rc.epoch,
        format!("{:?}", rc.state).to_lowercase(),
        rc.done,
        rc.total,
        rc.failed,
        rc.incomplete
    );
    let mut t = Table::new(&[
        ("Operation", Left),
        ("Requests", Right),
        ("Errors", Right),
        ("In", Right),
        ("Out", Right),
        ("Avg", Right),
        ("p50", Right),
        ("p99", Right),
    ]);
    for x in &s.ops {
        let avg = x.latency_sum_us / x.requests.max(1);
        t.row([
            x.op.clone(),
            x.requests.to_string(),
            x.errors.to_string(),
            format_size(x.bytes_in),
            format_size(x.bytes_out),
            micros(avg),
            quantile(x, 0.5),
            quantile(x, 0.99),
        ]);
    }
    o += "\n";
    o += &t.render();
    if !s.errors.is_empty() {
        let e: Vec<String> = s.errors.iter().map(|(k, n)| format!("{k} {n}")).collect();
        o += &format!("\nError answers: {}\n", e.join(", "));
    }
    if !s.extra.is_empty() {
        o += "\n";
        for x in &s.extra {
            let labels: Vec<String> = x.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
            o += &format!("{} {} {}\n", x.name, labels.join(","), x.value);
        }
    }
    o
}
