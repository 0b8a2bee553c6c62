//! `keel-bench`: Keel's performance figures against a database URL, and the pieces
//! `bench/compare.sh` needs around them (docs/benchmarks.md).
//!
//! The measured queue path is the production one: [`keel::queue::worker::Worker`],
//! started by [`keel::cli::run_worker_with`] exactly as `keel worker` starts it, with a
//! no-op handler of its own kind ([`noop::BenchJobs`], kind `bench`). Multi-process
//! figures re-execute this binary as `keel-bench worker`; the runs figure starts real
//! `keel api` and `keel worker` processes and talks HTTP to them.
//!
//! Benchmarks are not tests: nothing here asserts a timing. The bench owns the database
//! it is given (it clears the `bench` kind's rows and the lease history): use a throwaway.

mod agent;
mod api_history;
mod children;
mod cpu;
mod history;
mod noop;
mod queue;
mod recovery;
mod report;
mod runs;
mod snapshot;
mod stats;
mod waiting;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use keel::config::{Common, WorkerArgs};
use keel::db;
use keel::db::embedded::{Durability, EmbeddedPostgres};

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Measures the figures and prints them as one JSON object.
    Run(RunArgs),
    /// Prints the comparison table (figure, Keel, peer, ratio) from saved JSON reports;
    /// with several runs, each figure is the median across them.
    Report(ReportArgs),
    /// Starts a throwaway PostgreSQL cluster with default durability under ROOT, creates
    /// the database `bench`, prints its URL and keeps the cluster up until stopped.
    #[command(hide = true)]
    Postgres { root: PathBuf },
    /// A worker process that runs only the bench's no-op kind (multi-process figures).
    #[command(hide = true)]
    Worker(WorkerArgs),
}

/// Which figures `keel-bench run` measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Figure {
    Queue,
    Runs,
    Scaling,
    Recovery,
    History,
    Snapshot,
    Agent,
    Waiting,
    ApiHistory,
}

#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Figures to measure, comma-separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "queue,runs,scaling,recovery,history,snapshot,agent,waiting,api-history"
    )]
    pub figures: Vec<Figure>,
    /// Jobs per queue throughput measurement (N).
    #[arg(long, default_value_t = 20_000)]
    pub jobs: usize,
    /// Concurrent jobs per worker process (C).
    #[arg(long, default_value_t = 16)]
    pub concurrency: usize,
    /// Jobs each bench worker claims ahead of a free slot (`keel worker --prefetch`); the
    /// peer's tuned mode keeps a local queue of 500 the same way.
    #[arg(long, default_value_t = 500)]
    pub prefetch: usize,
    /// Latency samples: jobs enqueued one at a time to an idle worker.
    #[arg(long, default_value_t = 300)]
    pub samples: usize,
    /// Agent runs for the agent figure.
    #[arg(long, default_value_t = 200)]
    pub agent_runs: usize,
    /// Model calls each agent run makes (all but the last ask for one tool call).
    #[arg(long, default_value_t = 5)]
    pub agent_calls: usize,
    /// Shell runs of `true` for the runs figure.
    #[arg(long, default_value_t = 1_000)]
    pub runs: usize,
    /// `keel worker` processes draining the runs figure, comma-separated: one
    /// measurement per count.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    pub run_workers: Vec<usize>,
    /// Runs of `sleep --waiting-secs` for the waiting figure (at each `--run-workers` count).
    #[arg(long, default_value_t = 400)]
    pub waiting_runs: usize,
    /// Seconds each of the waiting figure's runs sleeps.
    #[arg(long, default_value_t = 0.5)]
    pub waiting_secs: f64,
    /// Slots (`keel worker --concurrency`) of each of the waiting figure's workers.
    #[arg(long, default_value_t = 8)]
    pub waiting_slots: usize,
    /// Worker processes for the scaling figure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    pub scaling_processes: Vec<usize>,
    /// Concurrent jobs per process for the scaling figure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "16,256")]
    pub scaling_concurrency: Vec<usize>,
    /// Leased jobs (K) held by the worker that the recovery figure kills.
    #[arg(long, default_value_t = 16)]
    pub recovery_jobs: usize,
    /// Lease length of the recovery figure's workers (ms).
    #[arg(long, default_value_t = 5_000)]
    pub recovery_lease_ms: u64,
    /// Finished jobs put in the history before the history figure's second measurement.
    #[arg(long, default_value_t = 1_000_000)]
    pub history_rows: i64,
    /// Tasks in the api-history figure's history (two runs and twenty events each).
    #[arg(long, default_value_t = 1_000_000)]
    pub api_history_tasks: i64,
    /// Requests of each kind the api-history figure times, on each database (a p99 of
    /// 500 is their fifth slowest: one stall of the machine's moves it).
    #[arg(long, default_value_t = 2_000)]
    pub api_history_samples: usize,
    /// Jobs/s offered during the held-snapshot figure; default half the queue throughput
    /// measured in this run (or 1000 without it).
    #[arg(long)]
    pub snapshot_rate: Option<f64>,
    /// Seconds the queue runs at that rate before the snapshot is taken.
    #[arg(long, default_value_t = 60)]
    pub snapshot_before_secs: u64,
    /// Seconds the snapshot (`BEGIN; SELECT txid_current();`) is held open.
    #[arg(long, default_value_t = 240)]
    pub hold_secs: u64,
    /// Most seconds the queue keeps running after the release while the dead tuples
    /// return to their baseline: room for two autovacuum rounds (a naptime of 60 s each,
    /// and the first round over the heap the hold bloated took 80–130 s).
    #[arg(long, default_value_t = 300)]
    pub snapshot_after_secs: u64,
    /// The delay each way between this process and the database, when `bench/compare.sh`
    /// put a delaying proxy between them: recorded in the report, whose queue figures then
    /// print as the remote-database rows.
    #[arg(long)]
    pub db_delay_ms: Option<f64>,
    /// Also write the JSON report to this file.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

#[derive(Debug, Clone, Args)]
pub struct ReportArgs {
    /// Keel reports (`keel-bench run` output), one per run.
    #[arg(long, num_args = 1.., required = true)]
    pub keel: Vec<PathBuf>,
    /// Peer reports (graphile-worker's bench.mjs output), one per run.
    #[arg(long, num_args = 1..)]
    pub peer: Vec<PathBuf>,
}

/// Everything one `keel-bench run` measured.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Report {
    pub keel: String,
    pub jobs: usize,
    pub concurrency: usize,
    pub prefetch: usize,
    /// Set when the database was reached through a delaying proxy (ms each way).
    #[serde(default)]
    pub db_delay_ms: Option<f64>,
    pub queue: Option<queue::QueueFigures>,
    pub runs: Option<runs::RunsFigures>,
    pub scaling: Option<Vec<queue::ScalingPoint>>,
    pub recovery: Option<recovery::RecoveryFigures>,
    pub history: Option<history::HistoryFigures>,
    pub snapshot: Option<snapshot::SnapshotFigures>,
    #[serde(default)]
    pub agent: Option<agent::AgentFigures>,
    #[serde(default)]
    pub waiting: Option<waiting::WaitingFigures>,
    #[serde(default)]
    pub api_history: Option<api_history::ApiHistoryFigures>,
}

pub async fn main(
    common: &Common,
    command: BenchCommand,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    match command {
        BenchCommand::Run(args) => run(common, &args).await,
        BenchCommand::Report(args) => report::print(&args),
        BenchCommand::Postgres { root } => postgres(root, shutdown).await,
        BenchCommand::Worker(args) => {
            let pool = keel::cli::connect(common, "bench-worker", &shutdown).await?;
            noop::run_worker(pool, &args, noop::Probe::default(), shutdown).await
        }
    }
}

async fn run(common: &Common, args: &RunArgs) -> anyhow::Result<()> {
    let url = common.database_url().context(
        "no database URL: pass --database-url or set KEEL_DATABASE_URL (or DATABASE_URL)",
    )?;
    let pool = db::connect(&url, 4, "bench").await?;
    db::migrate(&pool).await.context("applying migrations")?;
    let mut report = Report {
        keel: env!("CARGO_PKG_VERSION").to_string(),
        jobs: args.jobs,
        concurrency: args.concurrency,
        prefetch: args.prefetch,
        db_delay_ms: args.db_delay_ms,
        ..Report::default()
    };
    for figure in &args.figures {
        eprintln!("keel-bench: measuring {figure:?} …");
        match figure {
            Figure::Queue => report.queue = Some(queue::figures(&pool, &url, args).await?),
            Figure::Runs => report.runs = Some(runs::figures(&pool, &url, args).await?),
            Figure::Scaling => report.scaling = Some(queue::scaling(&pool, &url, args).await?),
            Figure::Recovery => report.recovery = Some(recovery::figures(&pool, &url, args).await?),
            Figure::History => report.history = Some(history::figures(&pool, &url, args).await?),
            Figure::Agent => report.agent = Some(agent::figures(&pool, &url, args).await?),
            Figure::Waiting => report.waiting = Some(waiting::figures(&pool, &url, args).await?),
            Figure::ApiHistory => {
                report.api_history = Some(api_history::figures(&pool, &url, args).await?);
            }
            Figure::Snapshot => {
                let peak = report.queue.as_ref().map(|q| q.throughput.jobs_per_s);
                let rate = args
                    .snapshot_rate
                    .or(peak.map(|p| p / 2.0))
                    .unwrap_or(1000.0);
                report.snapshot = Some(snapshot::figures(&pool, &url, args, rate).await?);
            }
        }
    }
    let json = serde_json::to_string(&report)?;
    if let Some(path) = &args.out {
        std::fs::write(path, &json).with_context(|| format!("writing {}", path.display()))?;
    }
    println!("{json}");
    Ok(())
}

/// Runs a throwaway cluster for `bench/compare.sh` until this process is told to stop;
/// the cluster's watchdog stops it too if this process is killed.
async fn postgres(root: PathBuf, shutdown: CancellationToken) -> anyhow::Result<()> {
    let cluster =
        tokio::task::spawn_blocking(move || EmbeddedPostgres::start(&root, Durability::Durable))
            .await?
            .context("starting PostgreSQL")?;
    let admin = db::connect(&cluster.url("postgres"), 1, "bench").await?;
    sqlx::query("CREATE DATABASE bench").execute(&admin).await?;
    // The runs figure counts statements per run with pg_stat_statements, which only a
    // restart loads.
    sqlx::query("ALTER SYSTEM SET shared_preload_libraries = 'pg_stat_statements'")
        .execute(&admin)
        .await?;
    admin.close().await;
    let cluster = tokio::task::spawn_blocking(move || cluster.restart().map(|()| cluster))
        .await?
        .context("restarting PostgreSQL")?;
    println!("{}", cluster.url("bench"));
    shutdown.cancelled().await;
    tokio::task::spawn_blocking(move || cluster.stop()).await?;
    Ok(())
}

/// Connections a worker process of `concurrency` jobs gets besides its queue connections
/// ([`keel::queue::QueuePool`]s: the worker's claims and heartbeats, the bench kind's
/// batched acks): one per running job's fenced writes plus the reconciler's, capped so four
/// processes with their queue connections and listeners fit PostgreSQL's default
/// `max_connections` (100) with the bench's own.
fn worker_pool_size(concurrency: usize) -> u32 {
    (concurrency + 1).min(16) as u32
}

/// The interval at which the bench polls the database while it waits for a condition.
const POLL: Duration = Duration::from_millis(5);
