//! The comparison table: one row per figure with Keel's value, the peer's where it
//! measures the same thing, their ratio (Keel / peer, or the figure's own reference for
//! Keel-only rows) and the target. With several runs each cell is the median across them.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use serde::Deserialize;

use super::stats::{Latency, Throughput, median};
use super::{Report, ReportArgs};

/// graphile-worker's bench.mjs output (the fields the table uses).
#[derive(Debug, Deserialize)]
pub struct PeerReport {
    pub peer: String,
    pub version: String,
    pub mode: String,
    pub throughput: Throughput,
    pub latency: Latency,
}

/// Which quantile of a latency a row shows.
#[derive(Clone, Copy)]
enum Quantile {
    P50,
    P99,
}

impl Quantile {
    fn of(self, latency: &Latency) -> f64 {
        match self {
            Quantile::P50 => latency.p50_ms,
            Quantile::P99 => latency.p99_ms,
        }
    }
}

/// One figure of one run.
struct Row {
    figure: String,
    keel: f64,
    peer: Option<f64>,
    ratio: Option<f64>,
    target: &'static str,
}

impl Row {
    fn keel(figure: impl Into<String>, keel: f64) -> Row {
        Row {
            figure: figure.into(),
            keel,
            peer: None,
            ratio: None,
            target: "",
        }
    }

    fn against(mut self, peer: Option<f64>) -> Row {
        self.ratio = peer.map(|p| self.keel / p);
        self.peer = peer;
        self
    }

    /// The figure's ratio to its reference, when there is one to show (a ratio that is
    /// not finite, or none measured, shows none).
    fn ratio(mut self, ratio: impl Into<Option<f64>>, target: &'static str) -> Row {
        self.ratio = ratio.into().filter(|r| r.is_finite());
        self.target = target;
        self
    }

    fn target(mut self, target: &'static str) -> Row {
        self.target = target;
        self
    }
}

pub fn print(args: &ReportArgs) -> anyhow::Result<()> {
    let keel: Vec<Report> = args
        .keel
        .iter()
        .map(|p| read(p))
        .collect::<Result<_, _>>()?;
    let peers: Vec<PeerReport> = args
        .peer
        .iter()
        .map(|p| read(p))
        .collect::<Result<_, _>>()?;
    let runs: Vec<Vec<Row>> = keel
        .iter()
        .enumerate()
        .map(|(i, report)| rows(report, peers.get(i)))
        .collect();
    let peer_name = peers
        .first()
        .map(|p| format!("{} {} ({})", p.peer, p.version, p.mode))
        .unwrap_or_else(|| "peer".into());
    println!("{}", table(&runs, &peer_name));
    Ok(())
}

fn read<T: serde::de::DeserializeOwned>(path: &Path) -> anyhow::Result<T> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    serde_json::from_str(text.trim()).with_context(|| format!("parsing {}", path.display()))
}

fn rows(report: &Report, peer: Option<&PeerReport>) -> Vec<Row> {
    let mut rows = Vec::new();
    if let Some(q) = &report.queue {
        // Through the delaying proxy, the same figures are the remote-database rows.
        let name = |figure: &str| match report.db_delay_ms {
            Some(delay) => format!("remote database {delay} ms: {figure}"),
            None => format!("queue {figure}"),
        };
        let (t, l) = (&q.throughput, &q.latency);
        let p = |f: fn(&PeerReport) -> f64| peer.map(f);
        rows.push(
            Row::keel(name("throughput (jobs/s)"), t.jobs_per_s)
                .against(p(|p| p.throughput.jobs_per_s))
                .target("≥ 1.0"),
        );
        rows.push(
            Row::keel(name("latency p50 (ms)"), l.p50_ms)
                .against(p(|p| p.latency.p50_ms))
                .target("≤ 1.0"),
        );
        rows.push(Row::keel(name("latency p99 (ms)"), l.p99_ms).against(p(|p| p.latency.p99_ms)));
        rows.push(Row::keel(name("latency max (ms)"), l.max_ms).against(p(|p| p.latency.max_ms)));
    }
    if let Some(runs) = &report.runs {
        rows.push(Row::keel(
            "runs: floor, a bare fork and exec of `sh -c true` (CPU ms)".to_string(),
            runs.spawn_floor_ms,
        ));
        let sandboxed = [
            ("in a bare bubblewrap sandbox", runs.sandbox_floor_ms),
            ("with a network namespace of its own", runs.network_floor_ms),
            (
                "behind Keel's shim and its proxy's socket",
                runs.shim_floor_ms,
            ),
        ];
        for (what, floor) in sandboxed {
            if let Some(floor) = floor {
                rows.push(Row::keel(format!("runs: floor {what} (CPU ms)"), floor));
            }
        }
    }
    for r in report.runs.iter().flat_map(|r| &r.points) {
        let w = r.workers;
        let row =
            |figure: &str, value: f64| Row::keel(format!("runs: {figure} ({w} workers)"), value);
        rows.push(row("runs/s", r.runs_per_s).target(if w == 2 { "≥ 350" } else { "" }));
        rows.push(row("start → run.started p50 (ms)", r.started.p50_ms));
        rows.push(row("start → run.finished p50 (ms)", r.finished.p50_ms));
        rows.push(row("start → run.finished p99 (ms)", r.finished.p99_ms));
        rows.push(row("lone run start → run.finished p50 (ms)", r.lone.p50_ms).target("≤ 25"));
        rows.push(row("lone run start → run.finished p99 (ms)", r.lone.p99_ms));
        rows.push(
            row(
                "statements per run",
                r.statements_per_run.unwrap_or(f64::NAN),
            )
            .target("≤ 14"),
        );
        rows.push(row("transactions per run", r.transactions_per_run));
        rows.push(
            row(
                "writing transactions per run",
                r.writing_transactions_per_run,
            )
            .target("≤ 4"),
        );
        rows.push(row("WAL bytes per run", r.wal_bytes_per_run));
        rows.push(row(
            "WAL records per run",
            r.wal_records_per_run.unwrap_or(f64::NAN),
        ));
        rows.push(row("sessions waiting on a lock (share)", r.lock_wait_share));
        let cpu = &r.cpu;
        rows.push(row("CPU ms per run: postgres", cpu.postgres_ms));
        rows.push(row("CPU ms per run: api", cpu.api_ms));
        rows.push(row("CPU ms per run: workers + runs", cpu.workers_ms));
        rows.push(row("CPU ms per run: bench", cpu.bench_ms));
        rows.push(row("CPU ms per run: total", cpu.total_ms()));
        rows.push(row("ceiling on 2 cores (runs/s)", cpu.ceiling(2.0)));
    }
    if let Some(waiting) = &report.waiting {
        for p in &waiting.points {
            let w = p.workers;
            let row = |figure: &str, value: f64| {
                Row::keel(format!("waiting runs: {figure} ({w} workers)"), value)
            };
            rows.push(row("runs/s", p.runs_per_s));
            rows.push(row("runs/s the slots allow", p.slots_runs_per_s));
            rows.push(row(
                "steady runs/s (middle 80 % of ends)",
                p.steady_runs_per_s,
            ));
            rows.push(row(
                "steady scaling efficiency",
                p.steady_scaling_efficiency,
            ));
            rows.push(
                row("scaling efficiency", p.scaling_efficiency).target(if w == 4 {
                    "≥ 0.9"
                } else {
                    ""
                }),
            );
        }
    }
    if let Some(a) = &report.agent {
        let row = |figure: &str, value: f64| Row::keel(format!("agent: {figure}"), value);
        rows.push(row(
            "loop overhead per model call p50 (ms)",
            a.overhead.p50_ms,
        ));
        rows.push(row(
            "loop overhead per model call p99 (ms)",
            a.overhead.p99_ms,
        ));
        rows.push(row("model calls/s", a.calls_per_s));
    }
    for s in report.scaling.iter().flatten() {
        let figure = format!(
            "scaling: {} proc × C={} (jobs/s)",
            s.processes, s.concurrency
        );
        rows.push(Row::keel(figure, s.throughput.jobs_per_s));
    }
    if let Some(r) = &report.recovery {
        let figure = format!(
            "recovery: K={} after kill -9 (s; ratio to lease + 2 s)",
            r.jobs
        );
        rows.push(Row::keel(figure, r.seconds).ratio(r.seconds / r.budget_s, "≤ 1.0"));
    }
    if let Some(h) = &report.history {
        rows.push(Row::keel("history: empty (jobs/s)", h.empty.jobs_per_s));
        let figure = format!(
            "history: {} finished (jobs/s; ratio to empty)",
            h.history_rows
        );
        rows.push(Row::keel(figure, h.full.jobs_per_s).ratio(h.ratio, "≥ 0.9"));
    }
    if let Some(h) = &report.api_history {
        let loaded = h.loaded.named();
        for ((name, empty), (_, full)) in h.empty.named().into_iter().zip(loaded) {
            for (quantile, of) in [("p50", Quantile::P50), ("p99", Quantile::P99)] {
                let figure = format!("api history: {name} {quantile} (ms; ratio to empty)");
                let (full, empty) = (of.of(full), of.of(empty));
                rows.push(Row::keel(figure, full).ratio(full / empty, "≤ 1.5"));
            }
        }
    }
    if let Some(s) = &report.snapshot {
        let p99 = |p: &super::snapshot::Phase| p.pickup.as_ref().map_or(f64::NAN, |l| l.p99_ms);
        rows.push(Row::keel("snapshot: before (jobs/s)", s.before.jobs_per_s));
        rows.push(
            Row::keel(
                "snapshot: held (jobs/s; ratio to before)",
                s.during.jobs_per_s,
            )
            .ratio(s.throughput_ratio, "≥ 0.75"),
        );
        rows.push(Row::keel(
            "snapshot: pickup p99 before (ms)",
            p99(&s.before),
        ));
        rows.push(
            Row::keel(
                "snapshot: pickup p99 held (ms; ratio to before)",
                p99(&s.during),
            )
            .ratio(s.p99_ratio, "≤ 2.0"),
        );
        let d = &s.dead_tuples;
        rows.push(Row::keel(
            "snapshot: dead tuples, baseline",
            d.baseline as f64,
        ));
        rows.push(Row::keel(
            "snapshot: dead tuples, most while held",
            d.during_max as f64,
        ));
        rows.push(Row::keel(
            "snapshot: dead tuples, at the end",
            d.after_end as f64,
        ));
        let rounds = d.autovacuum_rounds.map_or(f64::NAN, |r| r as f64);
        rows.push(Row::keel("snapshot: autovacuum rounds to the baseline", rounds).target("≤ 2"));
        let recovered = d.recovered_after_s.unwrap_or(f64::NAN);
        rows.push(Row::keel("snapshot: release → baseline (s)", recovered));
    }
    rows
}

/// One figure's values across runs: Keel's, the peer's and the ratios.
type Cells = (Vec<f64>, Vec<f64>, Vec<f64>);

/// A Markdown table of the per-figure medians, each figure where it first appears (a
/// remote-database report only has rows of its own).
fn table(runs: &[Vec<Row>], peer: &str) -> String {
    let mut cells: BTreeMap<&str, Cells> = BTreeMap::new();
    let mut order: Vec<&Row> = Vec::new();
    for row in runs.iter().flatten() {
        let cell = cells.entry(&row.figure).or_insert_with(|| {
            order.push(row);
            Cells::default()
        });
        cell.0.push(row.keel);
        cell.1.extend(row.peer);
        cell.2.extend(row.ratio);
    }
    let mut out = format!(
        "medians of {} report(s)\n\n| figure | Keel | {peer} | ratio | target |\n|---|---:|---:|---:|---|\n",
        runs.len()
    );
    for row in order {
        let (keel, peer, ratio) = cells
            .get_mut(row.figure.as_str())
            .expect("every row has cells");
        let number = |v: Option<f64>| v.map_or("—".to_string(), format_number);
        let ratio = median(ratio).map_or("—".to_string(), |r| format!("{r:.2}×"));
        out.push_str(&format!(
            "| {} | {} | {} | {ratio} | {} |\n",
            row.figure,
            number(median(keel)),
            number(median(peer)),
            row.target
        ));
    }
    out
}

fn format_number(value: f64) -> String {
    match value.abs() {
        v if v.is_nan() => "—".into(),
        v if v >= 100.0 => format!("{value:.0}"),
        v if v >= 10.0 => format!("{value:.1}"),
        _ => format!("{value:.2}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_takes_the_median_of_each_figure() {
        let run = |keel, peer| vec![Row::keel("x", keel).against(Some(peer))];
        let table = table(&[run(1.0, 2.0), run(3.0, 2.0), run(2.0, 4.0)], "peer");
        // The ratio is the median of each run's own ratio (0.5, 1.5, 0.5), not 2 / 2.
        assert!(table.contains("| x | 2.00 | 2.00 | 0.50× |"), "{table}");
    }
}
