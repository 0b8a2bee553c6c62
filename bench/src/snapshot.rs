//! The held-snapshot figure: the queue runs at a fixed rate while another session holds
//! `BEGIN; SELECT txid_current();` open, then releases it. While the snapshot is held,
//! vacuum can reclaim no tuple that died after it, so every UPDATE or DELETE the queue
//! makes stays behind: this shows what that costs the claim path, and how long the dead
//! tuples take to go once it is released.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use sqlx::{Connection, PgConnection, PgPool};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::RunArgs;
use super::noop::{InProcess, Probe};
use super::queue::clear;
use super::stats::Latency;

/// How often the offered load is enqueued (rate · TICK jobs at a time).
const TICK: Duration = Duration::from_millis(10);
/// How often the dead tuples are sampled.
const SAMPLE: Duration = Duration::from_secs(5);
/// The width of one step of the pickup series.
const SERIES_STEP: Duration = Duration::from_secs(10);
/// The tables whose dead tuples are counted.
const QUEUE_TABLES: &str = "'queue_jobs', 'lease_history'";

#[derive(Debug, Serialize, Deserialize)]
pub struct SnapshotFigures {
    pub rate: f64,
    pub before: Phase,
    pub during: Phase,
    pub after: Phase,
    /// during / before jobs/s (the target is ≥ 0.75); None when the phase before acked
    /// nothing to compare with (a machine too busy to ack a job in that window).
    pub throughput_ratio: Option<f64>,
    /// during / before pickup p99 (the target is ≤ 2); None as above.
    pub p99_ratio: Option<f64>,
    pub dead_tuples: DeadTuples,
    /// Every 10 s from the start: (seconds since the start, jobs started, pickup p99 ms),
    /// to see when a backlog formed and when it went.
    #[serde(default)]
    pub pickup_series: Vec<(f64, usize, f64)>,
}

/// One phase: what was acked in it and how long its jobs waited to start.
#[derive(Debug, Serialize, Deserialize)]
pub struct Phase {
    pub seconds: f64,
    pub acked: u64,
    pub jobs_per_s: f64,
    pub pickup: Option<Latency>,
}

/// Dead tuples in the queue tables (`pg_stat_user_tables.n_dead_tup`).
#[derive(Debug, Serialize, Deserialize)]
pub struct DeadTuples {
    /// The most seen before the hold: the steady state between autovacuum rounds.
    pub baseline: i64,
    pub during_max: i64,
    pub at_release: i64,
    pub after_end: i64,
    /// Release → back to the baseline; None if it did not happen within the after phase.
    pub recovered_after_s: Option<f64>,
    /// Autovacuum rounds on the queue table between the release and that moment.
    pub autovacuum_rounds: Option<i64>,
    /// (seconds since the start, dead tuples, autovacuum rounds so far) every 5 s.
    pub samples: Vec<(f64, i64, i64)>,
}

pub async fn figures(
    pool: &PgPool,
    url: &str,
    args: &RunArgs,
    rate: f64,
) -> anyhow::Result<SnapshotFigures> {
    clear(pool).await?;
    let (probe, starts) = Probe::with_starts();
    let worker = InProcess::start(url, args.concurrency, args.prefetch, probe.clone()).await?;
    let enqueued = Enqueued::default();
    let stop = CancellationToken::new();
    let offered = tokio::spawn(offer(pool.clone(), rate, enqueued.clone(), stop.clone()));
    let pickups = tokio::spawn(collect(starts, enqueued));

    let begin = Instant::now();
    let mut dead = Sampler::new(pool, begin);
    dead.run_for(Duration::from_secs(args.snapshot_before_secs))
        .await?;
    let baseline = dead.max_since(Duration::ZERO);
    let (held_at, acked_before) = (Instant::now(), probe.acked());
    let mut holder = hold(url).await?;
    dead.run_for(Duration::from_secs(args.hold_secs)).await?;
    holder.commit_release().await?;
    let (released_at, acked_during) = (Instant::now(), probe.acked());
    let at_release = dead.sample().await?;
    let during_max = dead.max_since(held_at - begin).max(at_release);
    let rounds_at_release = dead.rounds();
    let recovered = dead
        .until_back_to(baseline, Duration::from_secs(args.snapshot_after_secs))
        .await?;
    let (ended_at, acked_after) = (Instant::now(), probe.acked());

    stop.cancel();
    offered.await??;
    worker.stop().await?;
    // The collector ends when the last sender of executor starts (the probe) is gone.
    drop(probe);
    let pickups = pickups.await?;
    clear(pool).await?;

    let phase = |from: Instant, to: Instant, acked: u64| Phase {
        seconds: (to - from).as_secs_f64(),
        acked,
        jobs_per_s: acked as f64 / (to - from).as_secs_f64(),
        pickup: Latency::of(
            &pickups
                .iter()
                .filter(|(at, _)| *at >= from && *at < to)
                .map(|(_, wait)| *wait)
                .collect::<Vec<_>>(),
        ),
    };
    let before = phase(begin, held_at, acked_before);
    let during = phase(held_at, released_at, acked_during - acked_before);
    let after = phase(released_at, ended_at, acked_after - acked_during);
    let p99 = |p: &Phase| p.pickup.as_ref().map_or(f64::NAN, |l| l.p99_ms);
    let pickup_series = series(&pickups, begin, ended_at);
    Ok(SnapshotFigures {
        pickup_series,
        rate,
        throughput_ratio: ratio(during.jobs_per_s, before.jobs_per_s),
        p99_ratio: ratio(p99(&during), p99(&before)),
        dead_tuples: DeadTuples {
            baseline,
            during_max,
            at_release,
            after_end: dead.last(),
            recovered_after_s: recovered.map(|(at, _)| (at - released_at).as_secs_f64()),
            autovacuum_rounds: recovered.map(|(_, rounds)| rounds - rounds_at_release),
            samples: dead.samples,
        },
        before,
        during,
        after,
    })
}

/// The pickups cut into [`SERIES_STEP`]s from `begin` to `end`, in one pass over them.
fn series(pickups: &[(Instant, Duration)], begin: Instant, end: Instant) -> Vec<(f64, usize, f64)> {
    let in_steps = |at: Instant| (at - begin).as_secs_f64() / SERIES_STEP.as_secs_f64();
    let mut steps: Vec<Vec<Duration>> = vec![Vec::new(); in_steps(end).ceil() as usize];
    for &(at, wait) in pickups.iter().filter(|(at, _)| *at >= begin) {
        if let Some(step) = steps.get_mut(in_steps(at) as usize) {
            step.push(wait);
        }
    }
    steps
        .iter()
        .enumerate()
        .filter_map(|(step, waits)| {
            let p99 = Latency::of(waits)?.p99_ms;
            Some(((SERIES_STEP * step as u32).as_secs_f64(), waits.len(), p99))
        })
        .collect()
}

/// When each offered job was enqueued, by ref_id.
type Enqueued = Arc<Mutex<HashMap<String, Instant>>>;

/// Enqueues `rate` jobs/s, in one transaction per tick, until `stop` fires.
async fn offer(
    pool: PgPool,
    rate: f64,
    enqueued: Enqueued,
    stop: CancellationToken,
) -> anyhow::Result<()> {
    let start = Instant::now();
    let mut tick = tokio::time::interval(TICK);
    let mut sent = 0u64;
    while !stop.is_cancelled() {
        tick.tick().await;
        let due = (start.elapsed().as_secs_f64() * rate) as u64;
        if due <= sent {
            continue;
        }
        let ids: Vec<String> = (sent..due).map(|i| format!("p-{i}")).collect();
        let at = Instant::now();
        enqueued
            .lock()
            .unwrap()
            .extend(ids.iter().map(|id| (id.clone(), at)));
        let mut tx = pool.begin().await?;
        crate::queue::insert_jobs(&mut tx, &ids).await?;
        tx.commit().await?;
        sent = due;
    }
    Ok(())
}

/// Pairs each executor start with its enqueue: (started at, enqueue → start).
async fn collect(
    mut starts: mpsc::UnboundedReceiver<(String, Instant)>,
    enqueued: Enqueued,
) -> Vec<(Instant, Duration)> {
    let mut pickups = Vec::new();
    while let Some((ref_id, started)) = starts.recv().await {
        if let Some(at) = enqueued.lock().unwrap().remove(&ref_id) {
            pickups.push((started, started - at));
        }
    }
    pickups
}

/// The session that holds the snapshot. Its own connection, without the pool's
/// idle-in-transaction timeout, which would end the hold after 5 s.
struct Holder(PgConnection);

async fn hold(url: &str) -> anyhow::Result<Holder> {
    let mut conn = PgConnection::connect(url).await?;
    sqlx::raw_sql("BEGIN; SELECT txid_current();")
        .execute(&mut conn)
        .await?;
    Ok(Holder(conn))
}

impl Holder {
    async fn commit_release(&mut self) -> anyhow::Result<()> {
        sqlx::raw_sql("COMMIT").execute(&mut self.0).await?;
        Ok(())
    }
}

/// Samples the queue tables' dead tuples and the queue table's autovacuum rounds.
struct Sampler<'a> {
    pool: &'a PgPool,
    begin: Instant,
    samples: Vec<(f64, i64, i64)>,
}

impl<'a> Sampler<'a> {
    fn new(pool: &'a PgPool, begin: Instant) -> Self {
        Sampler {
            pool,
            begin,
            samples: Vec::new(),
        }
    }

    async fn sample(&mut self) -> anyhow::Result<i64> {
        let (dead, rounds): (i64, i64) = sqlx::query_as(sqlx::AssertSqlSafe(format!(
            "SELECT COALESCE(sum(n_dead_tup), 0)::bigint,
                    COALESCE(sum(autovacuum_count) FILTER (WHERE relname = 'queue_jobs'), 0)::bigint
             FROM pg_stat_user_tables WHERE relname IN ({QUEUE_TABLES})"
        )))
        .fetch_one(self.pool)
        .await?;
        self.samples
            .push((self.begin.elapsed().as_secs_f64(), dead, rounds));
        Ok(dead)
    }

    /// Samples every [`SAMPLE`] for `length`.
    async fn run_for(&mut self, length: Duration) -> anyhow::Result<()> {
        let end = Instant::now() + length;
        self.sample().await?;
        while Instant::now() < end {
            tokio::time::sleep(SAMPLE.min(end - Instant::now())).await;
            self.sample().await?;
        }
        Ok(())
    }

    /// Samples until the dead tuples are at most `baseline` (returns when, and the
    /// autovacuum rounds so far), or until `limit` passes.
    async fn until_back_to(
        &mut self,
        baseline: i64,
        limit: Duration,
    ) -> anyhow::Result<Option<(Instant, i64)>> {
        let end = Instant::now() + limit;
        loop {
            if self.sample().await? <= baseline {
                return Ok(Some((Instant::now(), self.rounds())));
            }
            if Instant::now() >= end {
                return Ok(None);
            }
            tokio::time::sleep(SAMPLE.min(end - Instant::now())).await;
        }
    }

    /// The most dead tuples sampled since `offset` after the start.
    fn max_since(&self, offset: Duration) -> i64 {
        let from = offset.as_secs_f64();
        self.samples
            .iter()
            .filter(|(at, _, _)| *at >= from)
            .map(|(_, dead, _)| *dead)
            .max()
            .unwrap_or(0)
    }

    fn rounds(&self) -> i64 {
        self.samples.last().map_or(0, |(_, _, rounds)| *rounds)
    }

    fn last(&self) -> i64 {
        self.samples.last().map_or(0, |(_, dead, _)| *dead)
    }
}

/// `of / to`, when both were measured and `to` is not zero.
fn ratio(of: f64, to: f64) -> Option<f64> {
    Some(of / to).filter(|r| r.is_finite())
}
