//! The runs figure: the full product path. Real `keel api` and `keel worker` processes;
//! N shell tasks of `true` created and started over HTTP (`POST /v1/tasks`, then
//! `POST …/start`), their `run.started` and `run.finished` read from the public event
//! stream (`GET /v1/events/stream`), all on the bench's clock. Measured once per worker
//! count (`--run-workers 1,2,4`), each on fresh processes, with what the database did per
//! run (statements from `pg_stat_statements`, commits from `pg_stat_database`), the share
//! of its sessions that waited on a lock, and, on fresh processes again, a lone run's
//! latency.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use futures_util::{StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sqlx::PgPool;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::children::{self, Process};
use super::cpu::{CpuGroup, CpuPerRun, CpuSample};
use super::stats::Latency;
use super::{POLL, RunArgs};

/// Lone runs per worker count (at most `--runs`): started one at a time, each after the
/// previous ended.
const LONE_SAMPLES: usize = 50;
/// Bare spawns of `sh -c true` the floor is measured over.
const SPAWNS: usize = 500;
/// How often `pg_stat_activity` is sampled for lock waits.
const ACTIVITY_SAMPLE: Duration = Duration::from_millis(50);

#[derive(Debug, Serialize, Deserialize)]
pub struct RunsFigures {
    pub runs: usize,
    pub concurrency: usize,
    /// CPU ms of a bare fork and exec of `sh -c true` (the bench's and the child's), the
    /// floor under a run of `true`: measured before the points, on the same machine.
    #[serde(default)]
    pub spawn_floor_ms: f64,
    /// The same in a bare bubblewrap sandbox ([`super::cpu::BARE_SANDBOX_SPAWN`]): the
    /// floor under a run that starts in namespaces of its own. None where bubblewrap is
    /// missing or cannot make namespaces.
    #[serde(default)]
    pub sandbox_floor_ms: Option<f64>,
    /// The same with a network namespace of its own
    /// ([`super::cpu::NETWORK_SANDBOX_SPAWN`]), and that behind Keel's shim with an egress
    /// proxy's socket bound in ([`super::cpu::shimmed_sandbox_spawn`]): what a jail's network
    /// adds to a start. None as above.
    #[serde(default)]
    pub network_floor_ms: Option<f64>,
    #[serde(default)]
    pub shim_floor_ms: Option<f64>,
    /// One per worker count, in the order asked for.
    pub points: Vec<RunsPoint>,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct RunsPoint {
    pub workers: usize,
    pub seconds: f64,
    pub runs_per_s: f64,
    /// Runs that ended other than `completed` (expected: none).
    pub failed: usize,
    /// Start request sent → `run.started` received.
    pub started: Latency,
    /// Start request sent → `run.finished` received.
    pub finished: Latency,
    /// Statements the database executed per run (every Keel process, `BEGIN`/`COMMIT`
    /// included; not the bench's own reads of the statistics views); None when
    /// `pg_stat_statements` is not loaded (`keel-bench postgres` loads it).
    pub statements_per_run: Option<f64>,
    /// Transactions committed per run (`pg_stat_database.xact_commit`: read-only ones too).
    pub transactions_per_run: f64,
    /// Transactions per run that were given a transaction id: those that wrote, each a
    /// durable commit (WAL flushed) unless it rolled back.
    #[serde(default)]
    pub writing_transactions_per_run: f64,
    /// WAL the cluster wrote per run: bytes (full-page images after a checkpoint
    /// included, so they vary) and records (`pg_walinspect`: one per row version, index
    /// entry, lock and commit), the work a run's rows cost, which the CPU figures follow
    /// with noise and the record count does not. None without `pg_walinspect`.
    #[serde(default)]
    pub wal_bytes_per_run: f64,
    #[serde(default)]
    pub wal_records_per_run: Option<f64>,
    /// Sampled sessions of the database waiting on a lock, over the active ones.
    pub lock_wait_share: f64,
    /// Lone runs, each started once the one before ended: start → `run.finished`.
    pub lone: Latency,
    /// CPU per run of the throughput phase, by process.
    pub cpu: CpuPerRun,
}

/// What the event stream delivered, per task: (event type, arrival).
pub(crate) type Arrivals = Arc<Mutex<HashMap<String, Vec<(String, Instant)>>>>;

pub async fn figures(pool: &PgPool, url: &str, args: &RunArgs) -> anyhow::Result<RunsFigures> {
    children::in_data_dir("keel-bench", |data_dir| async move {
        measure(pool, url, args, &data_dir).await
    })
    .await
}

async fn measure(
    pool: &PgPool,
    url: &str,
    args: &RunArgs,
    data_dir: &std::path::Path,
) -> anyhow::Result<RunsFigures> {
    let statements = sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        .execute(pool)
        .await
        .is_ok()
        && sqlx::query("SELECT pg_stat_statements_reset()")
            .execute(pool)
            .await
            .is_ok();
    let floors = tokio::task::spawn_blocking(floors).await??;
    let mut points = Vec::new();
    for &workers in &args.run_workers {
        points.push(point(pool, url, args, data_dir, workers, statements).await?);
    }
    Ok(RunsFigures {
        runs: args.runs,
        concurrency: args.concurrency,
        spawn_floor_ms: floors.bare,
        sandbox_floor_ms: floors.sandbox,
        network_floor_ms: floors.network,
        shim_floor_ms: floors.shim,
        points,
    })
}

/// CPU ms of one start of `sh -c true`, bare and in the sandboxes below Keel's jail.
struct Floors {
    bare: f64,
    sandbox: Option<f64>,
    network: Option<f64>,
    shim: Option<f64>,
}

/// The cost of starting `sh -c true` bare, in a bare sandbox, with a network namespace, and
/// behind Keel's shim, printed on stderr.
fn floors() -> anyhow::Result<Floors> {
    use super::cpu::{BARE_SANDBOX_SPAWN, BARE_SPAWN, NETWORK_SANDBOX_SPAWN, spawn_cost_ms};
    let bare = spawn_cost_ms(BARE_SPAWN, SPAWNS)?;
    eprintln!("keel-bench: runs: a bare fork and exec of `sh -c true` costs {bare:.2} CPU ms");
    let measured = |what: &str, argv: &[&str]| {
        spawn_cost_ms(argv, SPAWNS)
            .inspect(|ms| eprintln!("keel-bench: runs: {what}, {ms:.2} CPU ms"))
            .inspect_err(|error| eprintln!("keel-bench: runs: no figure {what} ({error})"))
            .ok()
    };
    let sandbox = measured("in a bare bubblewrap sandbox", BARE_SANDBOX_SPAWN);
    let network = measured("with a network namespace of its own", NETWORK_SANDBOX_SPAWN);
    let shim = shimmed().and_then(|(argv, _socket)| {
        let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
        measured("behind Keel's shim and its proxy's socket", &argv)
    });
    Ok(Floors {
        bare,
        sandbox,
        network,
        shim,
    })
}

/// The argv of a start behind Keel's shim (`keel-sandbox-shim` beside the `keel` binary,
/// as a worker finds it, else `keel` itself), and the proxy's socket it binds in (a
/// listener nobody connects to, in a temporary directory removed with it).
fn shimmed() -> Option<(Vec<String>, ProxySocket)> {
    let shim = keel_workers::shim::beside(&super::children::keel_binary().ok()?);
    let dir = std::env::temp_dir().join(format!("keel-bench-shim-{}", std::process::id()));
    std::fs::create_dir_all(&dir).ok()?;
    let path = dir.join("egress.sock");
    let listener = std::os::unix::net::UnixListener::bind(&path).ok()?;
    let socket = ProxySocket {
        dir,
        _listener: listener,
    };
    let argv = super::cpu::shimmed_sandbox_spawn(&shim, &path).ok()?;
    Some((argv, socket))
}

/// A listening socket in a directory of its own, removed when dropped.
struct ProxySocket {
    dir: std::path::PathBuf,
    _listener: std::os::unix::net::UnixListener,
}

impl Drop for ProxySocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One worker count: the throughput phase on fresh processes, measured whole once they
/// are gone (a backend reports its commits when it exits), then the lone runs.
async fn point(
    pool: &PgPool,
    url: &str,
    args: &RunArgs,
    data_dir: &std::path::Path,
    workers: usize,
    statements: bool,
) -> anyhow::Result<RunsPoint> {
    let deployment = Deployment::start(pool, url, data_dir, workers, args.concurrency, &[]).await?;
    let before = DatabaseCounters::read(pool, statements).await?;
    let cpu_before = deployment.cpu(pool).await?;
    let sampling = CancellationToken::new();
    let sampler = tokio::spawn(sample_lock_waits(pool.clone(), sampling.clone()));
    let first = Instant::now();
    let requested = deployment
        .run_all(args.runs, "true", args.concurrency)
        .await?;
    sampling.cancel();
    let lock_wait_share = sampler.await??;
    let cpu = deployment.cpu(pool).await?.per_run(&cpu_before, args.runs);
    eprintln!(
        "keel-bench: runs, {workers} workers: CPU ms/run postgres {:.2}, api {:.2}, workers+runs {:.2}, bench {:.2}, total {:.2}; ceiling on 2 cores {:.0} runs/s",
        cpu.postgres_ms,
        cpu.api_ms,
        cpu.workers_ms,
        cpu.bench_ms,
        cpu.total_ms(),
        cpu.ceiling(2.0)
    );
    let arrivals = deployment.arrivals.clone();
    deployment.stop(pool).await?;
    let after = DatabaseCounters::read(pool, statements).await?;
    let (seconds, failed, started, finished) =
        summarize(first, &requested, &arrivals.lock().unwrap())?;
    let per_run = |n: i64| n as f64 / args.runs as f64;
    let statements_per_run = match (before.statements, after.statements) {
        (Some(b), Some(a)) => Some(per_run(a - b)),
        _ => None,
    };
    if statements {
        print_top_statements(pool).await?;
    }
    let wal_records = wal_records(pool, before.wal_bytes, after.wal_bytes, args.runs).await;
    Ok(RunsPoint {
        workers,
        seconds,
        runs_per_s: args.runs as f64 / seconds,
        failed,
        started,
        finished,
        statements_per_run,
        transactions_per_run: per_run(after.commits - before.commits),
        writing_transactions_per_run: per_run(after.next_xid - before.next_xid),
        wal_bytes_per_run: per_run(after.wal_bytes - before.wal_bytes),
        wal_records_per_run: wal_records.map(per_run),
        lock_wait_share,
        lone: lone_runs(pool, url, args, data_dir, workers).await?,
        cpu,
    })
}

/// Start → `run.finished` of runs started one at a time on an otherwise idle deployment.
async fn lone_runs(
    pool: &PgPool,
    url: &str,
    args: &RunArgs,
    data_dir: &std::path::Path,
    workers: usize,
) -> anyhow::Result<Latency> {
    let deployment = Deployment::start(pool, url, data_dir, workers, args.concurrency, &[]).await?;
    let mut ended = deployment.ended.clone();
    let mut requested = HashMap::new();
    for i in 0..LONE_SAMPLES.min(args.runs) {
        let (task_id, sent) = start_run(&deployment.http, &deployment.base, "true").await?;
        requested.insert(task_id, sent);
        ended.wait_for(|n| *n > i).await?;
    }
    let arrivals = deployment.arrivals.clone();
    deployment.stop(pool).await?;
    let (_, _, _, finished) = summarize(Instant::now(), &requested, &arrivals.lock().unwrap())?;
    Ok(finished)
}

/// A `keel api` and `workers` `keel worker` processes, and a reader of the event stream.
pub(crate) struct Deployment {
    processes: Vec<Process>,
    /// Where the workers run, when the bench could make one; after the processes, so it
    /// is removed once they are gone.
    group: Option<CpuGroup>,
    pub(crate) base: String,
    pub(crate) http: reqwest::Client,
    pub(crate) arrivals: Arrivals,
    /// Terminal run events read so far.
    pub(crate) ended: watch::Receiver<usize>,
    reader: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Deployment {
    /// Every process gets `env` besides the bench's own settings.
    /// `workers` processes of `concurrency` slots each.
    pub(crate) async fn start(
        pool: &PgPool,
        url: &str,
        data_dir: &std::path::Path,
        workers: usize,
        concurrency: usize,
        env: &[(&str, &str)],
    ) -> anyhow::Result<Deployment> {
        let base = format!("http://127.0.0.1:{}", free_port()?);
        let no_approvals = ("KEEL_APPROVAL_POLICIES", "none");
        let listen = base.trim_start_matches("http://").to_string();
        let api_env: Vec<(&str, &str)> = std::iter::once(no_approvals)
            .chain(env.iter().copied())
            .collect();
        let mut processes = vec![Process::keel(
            url,
            &["api".into(), "--listen".into(), listen],
            &api_env,
        )?];
        let group = CpuGroup::create("workers");
        let dir = data_dir.to_string_lossy();
        let worker_env: Vec<(&str, &str)> = api_env
            .iter()
            .copied()
            .chain([("KEEL_DATA_DIR", dir.as_ref())])
            .collect();
        for _ in 0..workers {
            let flags = ["worker".into(), format!("--concurrency={concurrency}")];
            processes.push(Process::keel_in(group.as_ref(), url, &flags, &worker_env)?);
        }
        let pids: Vec<i32> = processes[1..].iter().map(Process::pid).collect();
        children::wait_registered(pool, &pids).await?;
        let http = reqwest::Client::new();
        wait_healthy(&http, &base).await?;
        let arrivals = Arrivals::default();
        let (ended_tx, ended) = watch::channel(0usize);
        // The feed from its newest event on (nothing else writes while the figure is set up).
        let after: String = sqlx::query_scalar(
            "SELECT COALESCE((SELECT feed_xid::text || '-' || id FROM run_events
                              ORDER BY feed_xid DESC, id DESC LIMIT 1), '0-0')",
        )
        .fetch_one(pool)
        .await?;
        let reader = tokio::spawn(read_stream(
            http.clone(),
            format!(
                "{base}/v1/events/stream?event_type=run.started,run.finished,run.failed&after={after}"
            ),
            arrivals.clone(),
            ended_tx,
        ));
        Ok(Deployment {
            processes,
            group,
            base,
            http,
            arrivals,
            ended,
            reader,
        })
    }

    /// Starts `runs` shell runs of `command`, `concurrency` requests at a time, and waits
    /// until the feed showed every one's end; returns each task's start request time.
    pub(crate) async fn run_all(
        &self,
        runs: usize,
        command: &str,
        concurrency: usize,
    ) -> anyhow::Result<HashMap<String, Instant>> {
        let requested: HashMap<String, Instant> = futures_util::stream::iter(0..runs)
            .map(|_| start_run(&self.http, &self.base, command))
            .buffer_unordered(concurrency.max(1))
            .try_collect()
            .await?;
        let mut ended = self.ended.clone();
        ended.wait_for(|n| *n >= runs).await?;
        Ok(requested)
    }

    /// CPU so far of the processes (the api is the first) and of the cluster.
    async fn cpu(&self, pool: &PgPool) -> anyhow::Result<CpuSample> {
        let workers: Vec<i32> = self.processes[1..].iter().map(Process::pid).collect();
        CpuSample::read(pool, self.processes[0].pid(), &workers, self.group.as_ref()).await
    }

    /// Stops the processes and waits until their database sessions are gone.
    pub(crate) async fn stop(self, pool: &PgPool) -> anyhow::Result<()> {
        self.reader.abort();
        drop(self.processes);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let sessions: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = current_database() AND backend_type = 'client backend'
                   AND application_name <> 'keel-bench'",
            )
            .fetch_one(pool)
            .await?;
            if sessions == 0 {
                return Ok(());
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "the keel processes' sessions outlived them by 30 s"
            );
            tokio::time::sleep(POLL * 10).await;
        }
    }
}

/// The bench's own statements, left out of the per-run count: every one reads a
/// statistics view (this file's counters and lock sampler, the wait for sessions to end).
const BENCH_OWN: &str = "%pg\\_stat\\_%";

/// The database's running totals the per-run figures are deltas of.
struct DatabaseCounters {
    statements: Option<i64>,
    commits: i64,
    /// The next transaction id to be assigned: the writing transactions so far.
    next_xid: i64,
    /// The WAL flushed so far, as its position in bytes.
    wal_bytes: i64,
}

impl DatabaseCounters {
    async fn read(pool: &PgPool, statements: bool) -> anyhow::Result<DatabaseCounters> {
        let (commits, next_xid, wal_bytes) = sqlx::query_as(
            "SELECT xact_commit, pg_snapshot_xmax(pg_current_snapshot())::text::bigint,
                    pg_wal_lsn_diff(pg_current_wal_flush_lsn(), '0/0')::bigint
             FROM pg_stat_database WHERE datname = current_database()",
        )
        .fetch_one(pool)
        .await?;
        let statements = if statements {
            let calls: i64 = sqlx::query_scalar(
                "SELECT COALESCE(sum(calls), 0)::bigint FROM pg_stat_statements
                 WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
                   AND query NOT LIKE $1",
            )
            .bind(BENCH_OWN)
            .fetch_one(pool)
            .await?;
            Some(calls)
        } else {
            None
        };
        Ok(DatabaseCounters {
            statements,
            commits,
            next_xid,
            wal_bytes,
        })
    }
}

/// The WAL records between two positions (in bytes), and on stderr the relations of this
/// database they wrote most, per run: where a run's rows and index entries go. None (and a
/// note) when `pg_walinspect` cannot be created.
async fn wal_records(pool: &PgPool, from: i64, to: i64, runs: usize) -> Option<i64> {
    if let Err(error) = sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
        .execute(pool)
        .await
    {
        eprintln!("keel-bench: no WAL record counts ({error})");
        return None;
    }
    let by_relation: Vec<(String, i64)> = sqlx::query_as(
        "WITH records AS (
             SELECT (regexp_match(block_ref, 'rel \\d+/(\\d+)/(\\d+)')) AS rel
             FROM pg_get_wal_records_info('0/0'::pg_lsn + $1::numeric,
                                          '0/0'::pg_lsn + $2::numeric)
         )
         SELECT COALESCE(c.relname::text, '(other)'), count(*)
         FROM records r
         LEFT JOIN pg_class c
           ON r.rel[1]::oid = (SELECT oid FROM pg_database WHERE datname = current_database())
          AND pg_relation_filenode(c.oid) = r.rel[2]::oid
         GROUP BY 1 ORDER BY 2 DESC",
    )
    .bind(from)
    .bind(to)
    .fetch_all(pool)
    .await
    .inspect_err(|error| eprintln!("keel-bench: no WAL record counts ({error})"))
    .ok()?;
    for (relation, records) in by_relation.iter().take(30) {
        let per_run = *records as f64 / runs as f64;
        eprintln!("keel-bench: WAL records per run {per_run:>6.2}  {relation}");
    }
    Some(by_relation.iter().map(|(_, records)| records).sum())
}

/// The most frequent statements so far, on stderr: where the per-run figure comes from.
async fn print_top_statements(pool: &PgPool) -> anyhow::Result<()> {
    let top: Vec<(i64, i64, f64, f64, String)> = sqlx::query_as(
        "SELECT calls, plans, mean_exec_time, mean_plan_time,
                left(regexp_replace(query, '\\s+', ' ', 'g'), 110) FROM pg_stat_statements
         WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
           AND query NOT LIKE $1
         ORDER BY calls DESC LIMIT 25",
    )
    .bind(BENCH_OWN)
    .fetch_all(pool)
    .await?;
    // Plans and their time are 0 unless `pg_stat_statements.track_planning` is on.
    for (calls, plans, exec_ms, plan_ms, query) in top {
        eprintln!(
            "keel-bench: {calls:>8} exec {exec_ms:.3} ms, {plans:>6} plans {plan_ms:.3} ms  {query}"
        );
    }
    sqlx::query("SELECT pg_stat_statements_reset()")
        .execute(pool)
        .await?;
    Ok(())
}

/// Samples the database's sessions every [`ACTIVITY_SAMPLE`] until `stop`; returns the
/// share of active ones that were waiting on a lock (advisory locks included).
async fn sample_lock_waits(pool: PgPool, stop: CancellationToken) -> anyhow::Result<f64> {
    let (mut waiting, mut active) = (0i64, 0i64);
    while !stop.is_cancelled() {
        let (w, a): (i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE wait_event_type = 'Lock'),
                    count(*) FILTER (WHERE state = 'active')
             FROM pg_stat_activity
             WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        .fetch_one(&pool)
        .await?;
        waiting += w;
        active += a;
        tokio::select! {
            _ = tokio::time::sleep(ACTIVITY_SAMPLE) => {}
            _ = stop.cancelled() => {}
        }
    }
    Ok(if active == 0 {
        0.0
    } else {
        waiting as f64 / active as f64
    })
}

/// Seconds from `first` to the last run event, runs that failed, and the latencies.
pub(crate) fn summarize(
    first: Instant,
    requested: &HashMap<String, Instant>,
    arrivals: &HashMap<String, Vec<(String, Instant)>>,
) -> anyhow::Result<(f64, usize, Latency, Latency)> {
    let mut started = Vec::new();
    let mut finished = Vec::new();
    let mut failed = 0;
    let mut last = first;
    for (task_id, sent) in requested {
        for (event, at) in arrivals.get(task_id).into_iter().flatten() {
            match event.as_str() {
                "run.started" => started.push(*at - *sent),
                "run.finished" => finished.push(*at - *sent),
                _ => failed += 1,
            }
            last = last.max(*at);
        }
    }
    let seconds = last.saturating_duration_since(first).as_secs_f64();
    let none = || anyhow::anyhow!("the event stream delivered no run event");
    Ok((
        seconds,
        failed,
        Latency::of(&started).ok_or_else(none)?,
        Latency::of(&finished).ok_or_else(none)?,
    ))
}

/// Whether the Keel measured predates `start: true` on task creation (it refused the
/// field once): its runs are then created and started by two requests, as its clients did.
static SEPARATE_START: AtomicBool = AtomicBool::new(false);

/// Creates a shell task of `command` and starts it, in one request (`start: true`): one
/// commit for both, as a client that wants both pays; returns its id and when the request
/// was sent. A Keel from before `start: true` gets `POST …/start` after the creation.
async fn start_run(
    http: &reqwest::Client,
    base: &str,
    command: &str,
) -> anyhow::Result<(String, Instant)> {
    let sent = Instant::now();
    let separate = SEPARATE_START.load(Ordering::Relaxed);
    let mut body = json!({ "execution_kind": "shell", "shell_command": command });
    if !separate {
        body["start"] = json!(true);
    }
    let response = http
        .post(format!("{base}/v1/tasks"))
        .json(&body)
        .send()
        .await?;
    if !separate && response.status() == reqwest::StatusCode::UNPROCESSABLE_ENTITY {
        SEPARATE_START.store(true, Ordering::Relaxed);
        return Box::pin(start_run(http, base, command)).await;
    }
    let task: Value = response.error_for_status()?.json().await?;
    let task_id = task["data"]["id"]
        .as_str()
        .context("task response without an id")?
        .to_string();
    if separate {
        http.post(format!("{base}/v1/tasks/{task_id}/start"))
            .send()
            .await?
            .error_for_status()?;
    }
    Ok((task_id, sent))
}

/// Reads the feed's SSE frames, recording each run event's arrival; counts terminal ones.
async fn read_stream(
    http: reqwest::Client,
    url: String,
    arrivals: Arrivals,
    ended: watch::Sender<usize>,
) -> anyhow::Result<()> {
    let mut body = http
        .get(url)
        .send()
        .await?
        .error_for_status()?
        .bytes_stream();
    let mut buffer = String::new();
    while let Some(chunk) = body.next().await {
        buffer.push_str(&String::from_utf8_lossy(&chunk?));
        while let Some(end) = buffer.find("\n\n") {
            let frame: String = buffer.drain(..end + 2).collect();
            let Some(event) = frame_data(&frame) else {
                continue;
            };
            let (Some(task_id), Some(kind)) = (event["task_id"].as_str(), event["type"].as_str())
            else {
                continue;
            };
            let at = Instant::now();
            let mut arrivals = arrivals.lock().unwrap();
            arrivals
                .entry(task_id.to_string())
                .or_default()
                .push((kind.to_string(), at));
            if kind != "run.started" {
                ended.send_modify(|n| *n += 1);
            }
        }
    }
    Ok(())
}

/// The JSON of an SSE frame's `data:` lines.
fn frame_data(frame: &str) -> Option<Value> {
    let data: String = frame
        .lines()
        .filter_map(|line| line.strip_prefix("data:"))
        .map(str::trim_start)
        .collect();
    serde_json::from_str(&data).ok()
}

async fn wait_healthy(http: &reqwest::Client, base: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !http
        .get(format!("{base}/healthz"))
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
    {
        anyhow::ensure!(
            Instant::now() < deadline,
            "keel api did not answer within 30 s"
        );
        tokio::time::sleep(POLL * 10).await;
    }
    Ok(())
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

#[cfg(test)]
mod tests {
    #[test]
    fn frame_data_joins_data_lines() {
        let frame = "id: 3\nevent: run.started\ndata: {\"task_id\":\"t\",\ndata: \"type\":\"run.started\"}\n\n";
        let data = super::frame_data(frame).unwrap();
        assert_eq!(data["task_id"], "t");
        assert_eq!(data["type"], "run.started");
    }
}
