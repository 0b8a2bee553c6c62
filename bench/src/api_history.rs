//! The API-history figure: what the API's reads and its admission cost on a nearly empty
//! database (400 tasks: enough for full pages) and on one with a large history:
//! `--api-history-tasks` tasks in four workspaces, two finished runs each and ten events
//! per run (1M tasks, 2M runs, 20M events by default), generated in bulk by SQL. Each
//! latency's p50 and p99 on both, and their ratio (the target: at most 1.5). The two
//! databases sit beside the bench's, are dropped at the end, and each has a real `keel api`
//! (no worker: the admissions' runs stay queued, which the figure does not read); the
//! requests alternate between them, so both sides meet the machine's same moments.

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
/// The databases: the nearly empty one, then the one with the history.
const DATABASES: [&str; 2] = ["bench_api_history_empty", "bench_api_history"];
/// The "empty" database's tasks: a hundred in each workspace.
const EMPTY_TASKS: i64 = 400;

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
    /// `GET /v1/tasks?limit=50&cursor=` a random task with a full page after it: a page
    /// deep in the list.
    pub task_list_page: Latency,
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
    pub fn named(&self) -> [(&'static str, &Latency); 8] {
        [
            ("task list", &self.task_list),
            ("task list, after a random cursor", &self.task_list_page),
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
    let [empty, loaded] = DATABASES;
    let databases = [
        fresh_database(pool, url, empty).await?,
        fresh_database(pool, url, loaded).await?,
    ];
    let measured = children::in_data_dir("keel-bench", |data_dir| {
        measure_both(&databases, data_dir, args)
    })
    .await;
    for ((_, database), name) in databases.into_iter().zip(DATABASES) {
        database.close().await;
        drop_database(pool, name).await?;
    }
    measured
}

/// Seeds both databases, then times every request on both, alternately.
async fn measure_both(
    databases: &[(String, PgPool); 2],
    data_dir: std::path::PathBuf,
    args: &RunArgs,
) -> anyhow::Result<ApiHistoryFigures> {
    let [(empty_url, empty), (loaded_url, loaded)] = databases;
    // Enough rows for full pages (a hundred tasks in the measured workspace, two
    // thousand events), so that both measurements read and send the same amounts.
    seed(empty, 0, EMPTY_TASKS).await?;
    let started = Instant::now();
    seed(loaded, 0, args.api_history_tasks).await?;
    let seed_secs = started.elapsed().as_secs_f64();
    eprintln!("keel-bench: api history: seeded in {seed_secs:.0} s");
    let sides = [
        Side::start(empty, empty_url, &data_dir, args).await?,
        Side::start(loaded, loaded_url, &data_dir, args).await?,
    ];
    let measured = measure(&sides, args.api_history_samples).await;
    let [empty_side, loaded_side] = sides;
    empty_side.deployment.stop(empty).await?;
    loaded_side.deployment.stop(loaded).await?;
    let [empty_latencies, loaded_latencies] = measured?;
    let (tasks, runs, events): (i64, i64, i64) = sqlx::query_as(
        "SELECT (SELECT count(*) FROM tasks), (SELECT count(*) FROM runs),
                (SELECT count(*) FROM run_events)",
    )
    .fetch_one(loaded)
    .await?;
    Ok(ApiHistoryFigures {
        tasks,
        runs,
        events,
        seed_secs,
        empty: empty_latencies,
        loaded: loaded_latencies,
    })
}

/// A new database `name` beside the bench's, with Keel's schema; its URL and a pool.
async fn fresh_database(pool: &PgPool, url: &str, name: &str) -> anyhow::Result<(String, PgPool)> {
    drop_database(pool, name).await?;
    // `name` is one of [`DATABASES`].
    sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
        .execute(pool)
        .await?;
    let mut parsed = reqwest::Url::parse(url).context("the database URL")?;
    parsed.set_path(name);
    let database_url = parsed.to_string();
    let database = keel::db::connect(&database_url, 4, "bench").await?;
    keel::db::migrate(&database).await?;
    Ok((database_url, database))
}

async fn drop_database(pool: &PgPool, name: &str) -> anyhow::Result<()> {
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
    )))
    .execute(pool)
    .await?;
    Ok(())
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
    INSERT INTO tasks (id, workspace_id, execution_kind, title, shell_command, workspace_mode,
                       run_count, latest_run_id, created_at, updated_at)
    SELECT id, workspace_id, 'shell', 'echo history', 'echo history', 'ephemeral', 2,
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

/// One database the figure measures: its `keel api` and the rows its requests read.
struct Side {
    deployment: Deployment,
    probes: Probes,
}

impl Side {
    async fn start(
        pool: &PgPool,
        url: &str,
        data_dir: &std::path::Path,
        args: &RunArgs,
    ) -> anyhow::Result<Side> {
        let deployment = Deployment::start(pool, url, data_dir, 0, 1, &[]).await?;
        let probes = Probes::read(pool, args.api_history_samples).await?;
        Ok(Side { deployment, probes })
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.deployment.base)
    }

    async fn get(&self, path: &str) -> anyhow::Result<()> {
        let response = self.deployment.http.get(self.url(path)).send().await?;
        response.error_for_status()?.bytes().await?;
        Ok(())
    }

    async fn first_byte(&self, path: &str) -> anyhow::Result<()> {
        let response = self.deployment.http.get(self.url(path)).send().await?;
        let first = response.error_for_status()?.bytes_stream().next().await;
        first.context("the stream ended before its first byte")??;
        Ok(())
    }

    async fn admit(&self) -> anyhow::Result<()> {
        let task = json!({ "execution_kind": "shell", "shell_command": "true", "start": true });
        let response = self
            .deployment
            .http
            .post(self.url("/v1/tasks"))
            .json(&task)
            .send();
        let created: Value = response.await?.error_for_status()?.json().await?;
        anyhow::ensure!(created["data"]["latest_run_id"].is_string(), "{created}");
        Ok(())
    }
}

/// Every request of [`Latencies`], `samples` times each on each side.
async fn measure(sides: &[Side; 2], samples: usize) -> anyhow::Result<[Latencies; 2]> {
    let task_list = time(sides, samples, |s, _| s.get("/v1/tasks?limit=50")).await?;
    let task_list_page = time(sides, samples, |s, i| async move {
        s.get(&format!("/v1/tasks?limit=50&cursor={}", s.probes.pages[i]))
            .await
    })
    .await?;
    let task_get = time(sides, samples, |s, i| async move {
        s.get(&format!("/v1/tasks/{}", s.probes.runs[i].0)).await
    })
    .await?;
    let run_events = time(sides, samples, |s, i| async move {
        let (task, run) = &s.probes.runs[i];
        s.get(&format!("/v1/tasks/{task}/runs/{run}/events?limit=100"))
            .await
    })
    .await?;
    let feed_page = time(sides, samples, |s, i| async move {
        s.get(&format!(
            "/v1/events?limit=100&after={}",
            s.probes.cursors[i]
        ))
        .await
    })
    .await?;
    let sse_first_byte = time(sides, samples, |s, i| async move {
        s.first_byte(&format!("/v1/events/stream?after={}", s.probes.cursors[i]))
            .await
    })
    .await?;
    let admission = time(sides, samples, |s, _| s.admit()).await?;
    let running = "/v1/tasks?limit=50&status=running";
    let task_list_running = time(sides, samples, |s, _| s.get(running)).await?;
    Ok([0, 1].map(|side| Latencies {
        task_list: task_list[side].clone(),
        task_list_page: task_list_page[side].clone(),
        task_get: task_get[side].clone(),
        run_events: run_events[side].clone(),
        feed_page: feed_page[side].clone(),
        sse_first_byte: sse_first_byte[side].clone(),
        admission: admission[side].clone(),
        task_list_running: task_list_running[side].clone(),
    }))
}

/// `samples` requests to each side, one at a time (the i-th built by `request(side, i)`),
/// the sides taking turns to go first; each side's latencies.
async fn time<'a, F, Fut>(
    sides: &'a [Side; 2],
    samples: usize,
    request: F,
) -> anyhow::Result<[Latency; 2]>
where
    F: Fn(&'a Side, usize) -> Fut,
    Fut: Future<Output = anyhow::Result<()>>,
{
    let mut waits: [Vec<Duration>; 2] = Default::default();
    for i in 0..samples {
        for side in [i % 2, 1 - i % 2] {
            let sent = Instant::now();
            request(&sides[side], i).await?;
            waits[side].push(sent.elapsed());
        }
    }
    let [empty, loaded] = waits.map(|waits| Latency::of(&waits));
    Ok([empty.context("no samples")?, loaded.context("no samples")?])
}

/// What the requests read, drawn at random from the `default` workspace's history: each
/// row the first at or after a random key (else the first of all), rather than an
/// `ORDER BY random()` over millions.
struct Probes {
    /// (task, run) pairs.
    runs: Vec<(String, String)>,
    /// Task-list cursors: tasks with at least a full page of older tasks after them.
    pages: Vec<String>,
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
        let pages: Vec<String> = sqlx::query_scalar(
            "WITH floor AS (
                 SELECT id FROM tasks WHERE workspace_id = 'default'
                 ORDER BY id OFFSET 50 LIMIT 1
             )
             SELECT t.id FROM generate_series(1, $1) AS i
             CROSS JOIN LATERAL (
                 (SELECT id FROM tasks
                  WHERE workspace_id = 'default' AND i > 0 AND id > (SELECT id FROM floor)
                    AND id >= 'task_' || lpad(to_hex(
                        (random() * (SELECT count(*) FROM tasks))::bigint), 32, '0')
                  ORDER BY id LIMIT 1)
                 UNION ALL
                 (SELECT id FROM floor WHERE i > 0)
                 LIMIT 1
             ) AS t",
        )
        .bind(samples as i64)
        .fetch_all(pool)
        .await?;
        anyhow::ensure!(
            runs.len() == samples && cursors.len() == samples && pages.len() == samples,
            "the history has no run or event in the default workspace"
        );
        Ok(Probes {
            runs,
            pages,
            cursors,
        })
    }
}
