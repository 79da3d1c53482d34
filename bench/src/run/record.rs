//! The recorder: progress on stderr, the CPU and memory accounting around each measured job,
//! and the figures with every run.

use std::collections::HashMap;

use anyhow::{bail, Result};

use super::proc::{check_interrupt, peak_rss_now, Usage, Watched};
use crate::figures::{median, Figure};

const GIB: f64 = (1u64 << 30) as f64;

/// What one measured run produced.
#[derive(Debug, Clone, Copy)]
pub struct Outcome {
    /// In the figure's unit.
    pub value: f64,
    /// Bytes moved (0 when not meaningful): CPU is accounted per GiB of these.
    pub bytes: u64,
}

/// Collects figures in the order they were planned.
#[derive(Default)]
pub struct Recorder {
    total: usize,
    done: usize,
    figures: Vec<Figure>,
    order: HashMap<String, usize>,
    /// Per figure id: CPU seconds per GiB of each run.
    cpu: HashMap<String, Vec<f64>>,
    /// Per pid: the highest VmHWM seen over the run.
    lifetime_rss: HashMap<u32, u64>,
}

impl Recorder {
    /// Announces `runs` more measurements; figures `ids` are listed in this order.
    pub fn plan<'a>(&mut self, ids: impl IntoIterator<Item = &'a str>, runs: usize) {
        self.total += runs;
        for id in ids {
            let next = self.order.len();
            self.order.entry(id.to_string()).or_insert(next);
        }
    }

    /// Prints `[i/n] group job on target ...` (the value follows once measured).
    pub fn announce(&mut self, fig: &Figure, note: &str) -> Result<()> {
        check_interrupt()?;
        self.done += 1;
        self.total = self.total.max(self.done);
        eprint!(
            "[{}/{}] {} {} on {}{note} ... ",
            self.done, self.total, fig.group, fig.job, fig.target
        );
        Ok(())
    }

    /// Runs `job` with the CPU and peak RSS of `procs` accounted, and records it as a run of
    /// the figure `template`.
    pub fn measure(
        &mut self,
        template: &Figure,
        procs: &[Watched],
        job: impl FnOnce() -> Result<Outcome>,
    ) -> Result<Outcome> {
        let (usage, before) = Usage::begin(procs)?;
        for (pid, kib) in before {
            self.note_rss(pid, kib);
        }
        let outcome = match job() {
            Ok(o) => o,
            Err(e) => {
                eprintln!("failed");
                return Err(e);
            }
        };
        check_interrupt()?;
        let used = usage.end()?;
        for p in procs {
            if let Some(&kib) = used.peak_rss_kib.get(&p.label) {
                self.note_rss(p.pid, kib);
            }
        }
        let cpu = (!procs.is_empty() && outcome.bytes > 0)
            .then(|| used.cpu_s / (outcome.bytes as f64 / GIB));
        self.add_run(template, outcome.value, cpu, used.peak_rss_kib)?;
        Ok(outcome)
    }

    /// Records one run measured without process accounting (timings of commands).
    pub fn record(&mut self, template: &Figure, value: f64) -> Result<()> {
        self.add_run(template, value, None, Default::default())
    }

    fn add_run(
        &mut self,
        template: &Figure,
        value: f64,
        cpu: Option<f64>,
        rss: std::collections::BTreeMap<String, u64>,
    ) -> Result<()> {
        if !value.is_finite() {
            bail!("{}: measured a non-finite value", template.id);
        }
        eprintln!("{} {}", display(value), template.unit);
        let i = match self.figures.iter().position(|f| f.id == template.id) {
            Some(i) => i,
            None => {
                self.figures.push(template.clone());
                self.figures.len() - 1
            }
        };
        let f = &mut self.figures[i];
        f.runs.push(value);
        f.value = median(&f.runs);
        for (k, v) in rss {
            let e = f.peak_rss_kib.entry(k).or_insert(0);
            *e = (*e).max(v);
        }
        if let Some(c) = cpu.filter(|c| c.is_finite()) {
            let runs = self.cpu.entry(f.id.clone()).or_default();
            runs.push(c);
            f.cpu_s_per_gib = Some(runs.iter().sum::<f64>() / runs.len() as f64);
        }
        Ok(())
    }

    /// Sets a parameter of a recorded figure.
    pub fn set_param(&mut self, id: &str, key: &str, value: serde_json::Value) {
        if let Some(f) = self.figures.iter_mut().find(|f| f.id == id) {
            f.params.insert(key.into(), value);
        }
    }

    /// Appends `value` to the array param `key` of figure `id` (one entry per run).
    pub fn push_param(&mut self, id: &str, key: &str, value: serde_json::Value) {
        if let Some(f) = self.figures.iter_mut().find(|f| f.id == id) {
            let e = f
                .params
                .entry(key.to_string())
                .or_insert_with(|| serde_json::Value::Array(Vec::new()));
            match e.as_array_mut() {
                Some(a) => a.push(value),
                None => *e = serde_json::Value::Array(vec![value]),
            }
        }
    }

    fn note_rss(&mut self, pid: u32, kib: u64) {
        let e = self.lifetime_rss.entry(pid).or_insert(0);
        *e = (*e).max(kib);
    }

    /// The highest VmHWM (KiB) of `p` over every job so far and now.
    pub fn lifetime_peak_rss(&mut self, p: &Watched) -> Result<u64> {
        let now = peak_rss_now(p.pid)?;
        self.note_rss(p.pid, now);
        Ok(self.lifetime_rss[&p.pid])
    }

    /// Every figure, in planned order.
    pub fn into_figures(self) -> Vec<Figure> {
        let mut figs = self.figures;
        let order = self.order;
        figs.sort_by_key(|f| order.get(&f.id).copied().unwrap_or(usize::MAX));
        figs
    }
}

/// A value for the progress line: integers above 100, else three significant digits.
fn display(v: f64) -> String {
    if v.abs() >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.3}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_accumulate_and_order_follows_the_plan() {
        let a = Figure::new("iops", "j", "warm", "IOPS", vec![]);
        let b = Figure::new("iops", "j", "off", "IOPS", vec![]);
        let mut r = Recorder::default();
        r.plan([a.id.as_str(), b.id.as_str()], 3);
        r.record(&b, 5.0).unwrap();
        r.record(&a, 1.0).unwrap();
        r.record(&a, 3.0).unwrap();
        assert!(r.record(&a, f64::NAN).is_err());
        let figs = r.into_figures();
        assert_eq!(figs[0].id, a.id);
        assert_eq!(figs[0].runs, vec![1.0, 3.0]);
        assert_eq!(figs[0].value, 2.0);
        assert_eq!(figs[1].value, 5.0);
    }
}
