//! The API-history figure: what the API's reads and its admission cost on a nearly empty
//! database (400 tasks: enough for full pages), then with a large history in it: `--api-history-tasks` tasks in four
//! workspaces, two finished runs each and ten events per run (1M tasks, 2M runs, 20M
//! events by default), generated in bulk by SQL. Each latency's p50 and p99 on both, and
//! their ratio (the target: at most 1.5). It runs on a database of its own beside the
//! bench's, dropped at the end, and talks HTTP to a real `keel api` (no worker: the
//! admissions' runs stay queued, which the figure does not read).

use std::time::{Duration, Instant};

use anyhow::Context;
use futures_util::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sqlx::PgPool;

use super::RunArgs;
use super::children;
use super::runs::Deployment;
use super::stats::Latency;

/// The workspaces the history is spread over; the measured requests read `default`.
const WORKSPACES: [&str; 4] = ["default", "history-b", "history-c", "history-d"];
/// Tasks generated per statement: each a transaction of its own, as a history's rows were.
const SEED_BATCH: i64 = 50_000;
const DATABASE: &str = "bench_api_history";
/// The "empty" database's tasks: a hundred in each workspace.
const EMPTY_TASKS: i64 = 400;
const DROP_DATABASE: &str = "DROP DATABASE IF EXISTS bench_api_history WITH (FORCE)";
const CREATE_DATABASE: &str = "CREATE DATABASE bench_api_history";

#[derive(Debug, Serialize, Deserialize)]
pub struct ApiHistoryFigures {
    pub tasks: i64,
    pub runs: i64,
    pub events: i64,
    /// How long generating the history took (with the VACUUM ANALYZE after it).
    pub seed_secs: f64,
    pub empty: Latencies,
    pub loaded: Latencies,
}

/// One latency per request the figure times.
#[derive(Debug, Serialize, Deserialize)]
pub struct Latencies {
    /// `GET /v1/tasks?limit=50`: the newest tasks.
    pub task_list: Latency,
    /// `GET /v1/tasks/{id}` of a random task.
    pub task_get: Latency,
    /// `GET …/runs/{id}/events?limit=100` of a random run.
    pub run_events: Latency,
    /// `GET /v1/events?limit=100&after=` a random event's cursor.
    pub feed_page: Latency,
    /// `GET /v1/events/stream?after=` a random event's cursor, to its first byte.
    pub sse_first_byte: Latency,
    /// `POST /v1/tasks` with `start: true`, to its 201.
    pub admission: Latency,
    /// `GET /v1/tasks?limit=50&status=running` with no task running (the figure runs no
    /// worker): a status no task has, timed after the admissions.
    pub task_list_running: Latency,
}

impl Latencies {
    /// Each latency's name with it, in the order the report prints them.
    pub fn named(&self) -> [(&'static str, &Latency); 7] {
        [
            ("task list", &self.task_list),
            ("task list, status=running (none)", &self.task_list_running),
            ("task get", &self.task_get),
            ("run events page", &self.run_events),
            ("feed page", &self.feed_page),
            ("SSE first byte", &self.sse_first_byte),
            ("admission", &self.admission),
        ]
    }
}

pub async fn figures(
    pool: &PgPool,
    url: &str,
    args: &RunArgs,
) -> anyhow::Result<ApiHistoryFigures> {
    let (history_url, history) = fresh_database(pool, url).await?;
    let measured = children::in_data_dir("keel-bench", |data_dir| {
        measure_both(&history, &history_url, data_dir, args)
    })
    .await;
    history.close().await;
    sqlx::query(DROP_DATABASE).execute(pool).await?;
    measured
}

/// The latencies on a database with a handful of rows, then with the whole history.
async fn measure_both(
    history: &PgPool,
    url: &str,
    data_dir: std::path::PathBuf,
    args: &RunArgs,
) -> anyhow::Result<ApiHistoryFigures> {
    // Enough rows for full pages (a hundred tasks in the measured workspace, two
    // thousand events), so that both measurements read and send the same amounts.
    seed(history, 0, EMPTY_TASKS).await?;
    let empty = measure(history, url, &data_dir, args).await?;
    let started = Instant::now();
    seed(history, EMPTY_TASKS, args.api_history_tasks).await?;
    let seed_secs = started.elapsed().as_secs_f64();
    eprintln!("keel-bench: api history: seeded in {seed_secs:.0} s");
    let loaded = measure(history, url, &data_dir, args).await?;
    let (tasks, runs, events): (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM tasks), (SELECT count(*) FROM runs),
                (SELECT count(*) FROM run_events)",
    )
    .fetch_one(history)
    .await?;
    Ok(ApiHistoryFigures {
        tasks,
        runs,
        events,
        seed_secs,
        empty,
        loaded,
    })
}

/// A new database beside the bench's, with Keel's schema; its URL and a pool.
async fn fresh_database(pool: &PgPool, url: &str) -> anyhow::Result<(String, PgPool)> {
    sqlx::query(DROP_DATABASE).execute(pool).await?;
    sqlx::query(CREATE_DATABASE).execute(pool).await?;
    let mut parsed = reqwest::Url::parse(url).context("the database URL")?;
    parsed.set_path(DATABASE);
    let history_url = parsed.to_string();
    let history = keel::db::connect(&history_url, 4, "bench").await?;
    keel::db::migrate(&history).await?;
    Ok((history_url, history))
}

/// Tasks `from..to`, as a history leaves them: each with two finished runs, each run with
/// ten events. Foreign keys are not checked while seeding (every reference is to a row
/// the same statement writes); every index is maintained.
async fn seed(pool: &PgPool, from: i64, to: i64) -> anyhow::Result<()> {
    let mut start = from;
    while start < to {
        let end = (start + SEED_BATCH).min(to);
        let mut tx = pool.begin().await?;
        sqlx::query("SET LOCAL session_replication_role = replica")
            .execute(&mut *tx)
            .await?;
        sqlx::query(SEED_SQL)
            .bind(start)
            .bind(end)
            .bind(&WORKSPACES[..])
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        start = end;
    }
    // As autovacuum would have left them: the planner's statistics describe the rows.
    sqlx::raw_sql("VACUUM ANALYZE tasks, runs, run_events")
        .execute(pool)
        .await?;
    Ok(())
}

/// `$1..$2` task numbers; `$3` the workspaces. Ids sort as the numbers do, as Keel's
/// time-ordered ids sort by creation; times go back an hour per thousand tasks.
const SEED_SQL: &str = "
WITH t AS (
    SELECT g, 'task_' || lpad(to_hex(g), 32, '0') AS id,
           ($3::text[])[g % array_length($3::text[], 1) + 1] AS workspace_id,
           now() - (($2 - g) / 1000.0)::float8 * interval '1 hour' AS at
    FROM generate_series($1, $2 - 1) AS g
), tasks_in AS (
    INSERT INTO tasks (id, workspace_id, execution_kind, shell_command, workspace_mode,
                       run_count, latest_run_id, created_at, updated_at)
    SELECT id, workspace_id, 'shell', 'echo history', 'ephemeral', 2,
           'run_' || lpad(to_hex(g * 2 + 1), 32, '0'), at, at
    FROM t
), r AS (
    SELECT t.g, t.id AS task_id, t.workspace_id, t.at, k,
           'run_' || lpad(to_hex(t.g * 2 + k), 32, '0') AS id
    FROM t CROSS JOIN generate_series(0, 1) AS k
), runs_in AS (
    INSERT INTO runs (id, task_id, number, status, attempt, worker_id, exit_code,
                      created_at, started_at, finished_at, updated_at, workspace_id)
    SELECT id, task_id, k + 1, 'completed', 1, 'wrk_history', 0,
           at, at, at, at, workspace_id
    FROM r
)
INSERT INTO run_events (event_id, task_id, run_id, sequence, feed_xid, type, data,
                        occurred_at, workspace_id)
SELECT 'evt_' || lpad(to_hex((r.g * 2 + r.k) * 10 + s), 32, '0'), r.task_id, r.id, s,
       pg_current_xact_id(),
       (ARRAY['run.created', 'run.queued', 'run.started', 'step.started',
              'artifact.created', 'artifact.created', 'step.finished', 'step.started',
              'step.finished', 'run.finished'])[s],
       jsonb_build_object('attempt', 1), r.at, r.workspace_id
FROM r CROSS JOIN generate_series(1, 10) AS s";

/// Every request of [`Latencies`], `--api-history-samples` times each, one at a time, on a
/// fresh `keel api`.
async fn measure(
    pool: &PgPool,
    url: &str,
    data_dir: &std::path::Path,
    args: &RunArgs,
) -> anyhow::Result<Latencies> {
    let deployment = Deployment::start(pool, url, data_dir, 0, 1, &[]).await?;
    let samples = args.api_history_samples;
    let probes = Probes::read(pool, samples).await?;
    let (http, base) = (&deployment.http, deployment.base.as_str());
    let get = |path: String| async move {
        let response = http.get(format!("{base}{path}")).send().await?;
        response.error_for_status()?.bytes().await?;
        anyhow::Ok(())
    };
    let task_list = time(samples, |_| get("/v1/tasks?limit=50".into())).await?;
    let task_get = time(samples, |i| get(format!("/v1/tasks/{}", probes.runs[i].0))).await?;
    let run_events = time(samples, |i| {
        let (task, run) = &probes.runs[i];
        get(format!("/v1/tasks/{task}/runs/{run}/events?limit=100"))
    })
    .await?;
    let feed_page = time(samples, |i| {
        get(format!("/v1/events?limit=100&after={}", probes.cursors[i]))
    })
    .await?;
    let sse_first_byte = time(samples, |i| {
        let url = format!("{base}/v1/events/stream?after={}", probes.cursors[i]);
        async move {
            let response = http.get(url).send().await?.error_for_status()?;
            let first = response.bytes_stream().next().await;
            first.context("the stream ended before its first byte")??;
            anyhow::Ok(())
        }
    })
    .await?;
    let admission = time(samples, |_| async move {
        let task = json!({ "execution_kind": "shell", "shell_command": "true", "start": true });
        let response = http.post(format!("{base}/v1/tasks")).json(&task).send();
        let created: Value = response.await?.error_for_status()?.json().await?;
        anyhow::ensure!(created["data"]["latest_run_id"].is_string(), "{created}");
        anyhow::Ok(())
    })
    .await?;
    let running = "/v1/tasks?limit=50&status=running";
    let task_list_running = time(samples, |_| get(running.into())).await?;
    deployment.stop(pool).await?;
    Ok(Latencies {
        task_list,
        task_get,
        run_events,
        feed_page,
        sse_first_byte,
        admission,
        task_list_running,
    })
}

/// `samples` requests, one at a time (the i-th built by `request(i)`); their latencies.
async fn time<F, Fut>(samples: usize, request: F) -> anyhow::Result<Latency>
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let mut waits: Vec<Duration> = Vec::with_capacity(samples);
    for i in 0..samples {
        let sent = Instant::now();
        request(i).await?;
        waits.push(sent.elapsed());
    }
    Latency::of(&waits).context("no samples")
}

/// What the requests read, drawn at random from the `default` workspace's history: each
/// row the first at or after a random key (else the first of all), rather than an
/// `ORDER BY random()` over millions.
struct Probes {
    /// (task, run) pairs.
    runs: Vec<(String, String)>,
    /// Feed cursors of events.
    cursors: Vec<String>,
}

impl Probes {
    async fn read(pool: &PgPool, samples: usize) -> anyhow::Result<Probes> {
        let runs: Vec<(String, String)> = sqlx::query_as(
            "SELECT r.task_id, r.id FROM generate_series(1, $1) AS i
             CROSS JOIN LATERAL (
                 (SELECT task_id, id FROM runs
                  WHERE workspace_id = 'default' AND i > 0 AND id >= 'run_' || lpad(to_hex(
                      (random() * (SELECT count(*) * 2 FROM tasks))::bigint), 32, '0')
                  ORDER BY id LIMIT 1)
                 UNION ALL
                 (SELECT task_id, id FROM runs WHERE workspace_id = 'default' AND i > 0
                  ORDER BY id LIMIT 1)
                 LIMIT 1
             ) AS r",
        )
        .bind(samples as i64)
        .fetch_all(pool)
        .await?;
        let cursors: Vec<String> = sqlx::query_scalar(
            "SELECT e.feed_xid::text || '-' || e.id FROM generate_series(1, $1) AS i
             CROSS JOIN LATERAL (
                 (SELECT feed_xid, id FROM run_events
                  WHERE workspace_id = 'default' AND i > 0
                    AND id >= (random() * (SELECT max(id) FROM run_events))::bigint
                  ORDER BY id LIMIT 1)
                 UNION ALL
                 (SELECT feed_xid, id FROM run_events WHERE workspace_id = 'default' AND i > 0
                  ORDER BY id LIMIT 1)
                 LIMIT 1
             ) AS e",
        )
        .bind(samples as i64)
        .fetch_all(pool)
        .await?;
        anyhow::ensure!(
            runs.len() == samples && cursors.len() == samples,
            "the history has no run or event in the default workspace"
        );
        Ok(Probes { runs, cursors })
    }
}
