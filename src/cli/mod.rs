//! The `keel` command line: one binary, a subcommand per role. This file owns the server
//! roles (serve, api, worker, migrate, openapi, workflow); the operator commands over the
//! API are in `ops` (their global options and dispatch), a file per resource named as in
//! `api/` (its arguments and calls: `tasks`, `runs`, `approvals`, …), `output` (tables,
//! JSON, errors) and `watch` (following a run or a media job live). The server settings ([`Common`]) belong to the
//! roles that read them, so an operator command's `--help` lists only its own options and
//! the API's address and credentials.

mod approvals;
mod artifacts;
mod console;
mod events;
mod external;
mod local_token;
mod media_jobs;
mod ops;
mod output;
mod patches;
mod providers;
mod runs;
mod runtime;
mod schedules;
mod system;
mod tasks;
mod transcript;
mod triage;
mod usage;
mod watch;
mod worker;
mod workspaces;

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

pub use worker::{run_worker, run_worker_with};

use crate::config::{ApiArgs, Common, LogArgs, WorkerArgs};
use crate::db::embedded::{Durability, EmbeddedPostgres};
use crate::telemetry::LogFormat;
use crate::{api, telemetry};

#[derive(Debug, Parser)]
#[command(
    name = "keel",
    version,
    about = "A durable runtime for long-running work on Postgres"
)]
pub(crate) struct Cli {
    #[command(flatten, next_help_heading = "Operator commands (a client of the API)")]
    pub(crate) remote: ops::Remote,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// API, workers and maintenance in one process; with no database URL, on a private
    /// PostgreSQL cluster under the data directory.
    Serve {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        api: ApiArgs,
        #[command(flatten)]
        worker: WorkerArgs,
    },
    /// The HTTP API only (stateless; run several behind a proxy).
    Api {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        api: ApiArgs,
    },
    /// A worker: claims and executes jobs, and runs the maintenance duties.
    Worker {
        #[command(flatten)]
        common: Common,
        #[command(flatten)]
        worker: WorkerArgs,
    },
    /// Applies database migrations and exits.
    Migrate(Common),
    /// Prints the HTTP API's OpenAPI 3.1 document (as served at /v1/openapi.json).
    Openapi,
    /// Checks or renders a WORKFLOW.md; fails with the error class when it cannot be used.
    #[command(subcommand)]
    Workflow(WorkflowCommand),
    /// The operator commands: a client of a running Keel's API (`--url`).
    #[command(flatten)]
    Ops(ops::Operation),
    /// NDJSON RPC for hosts that are not Rust programs, bridged to the API (`--url`).
    Rpc {
        // Beside the session's group, not in it: clap makes a group with a flattened
        // struct inside an empty `<>` that no arguments satisfy.
        #[command(flatten)]
        log: LogArgs,
        #[command(flatten)]
        session: RpcArgs,
    },
}

#[derive(Debug, clap::Args)]
#[group(required = true, multiple = false)]
pub(crate) struct RpcArgs {
    /// One session on stdin and stdout (stdout carries protocol lines only).
    #[arg(long)]
    stdio: bool,
    /// One session per connection on a Unix socket created mode 0600.
    #[arg(long, value_name = "PATH")]
    socket: Option<std::path::PathBuf>,
}

#[derive(Debug, Subcommand)]
pub(crate) enum WorkflowCommand {
    /// Parses the file and prints its settings, defaults applied.
    Check { file: std::path::PathBuf },
    /// Prints the prompt the file renders for an item (a normalized issue as JSON).
    Render {
        file: std::path::PathBuf,
        #[arg(long)]
        issue: std::path::PathBuf,
        /// The retry number; omitted on a first run.
        #[arg(long)]
        attempt: Option<u32>,
    },
}

impl Command {
    /// The process's role, as telemetry reports it.
    fn role(&self) -> &'static str {
        match self {
            Command::Serve { .. } => "serve",
            Command::Api { .. } => "api",
            Command::Worker { .. } => "worker",
            Command::Migrate(_) => "migrate",
            Command::Openapi => "openapi",
            Command::Workflow(_) => "workflow",
            Command::Ops(_) => "client",
            Command::Rpc { .. } => "rpc",
        }
    }

    /// How the process logs: openapi and workflow print their answer and log nothing.
    fn log_format(&self) -> LogFormat {
        match self {
            Command::Serve { common, .. }
            | Command::Api { common, .. }
            | Command::Worker { common, .. }
            | Command::Migrate(common) => common.log.log_format,
            Command::Rpc { log, .. } => log.log_format,
            Command::Openapi | Command::Workflow(_) | Command::Ops(_) => LogFormat::Text,
        }
    }
}

pub fn main() -> ExitCode {
    // Inside a run's sandbox, before anything of the CLI's: the shim starts with each of
    // the run's processes (keel_workers::shim).
    let mut args = std::env::args_os().skip(1);
    if args
        .next()
        .is_some_and(|arg| arg == keel_workers::shim::ARG)
    {
        return keel_workers::shim::main(args);
    }
    keel_workers::install_tls_provider();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // Help and version exit 0; a usage error exits like any failed command, never with
        // 2, which a watch reserves for a cancelled run.
        Err(error) => {
            let _ = error.print();
            return if error.use_stderr() {
                ExitCode::from(ops::ERROR_EXIT)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    // A client of the API: none of the server's runtime set-up or telemetry.
    let cli = match cli.command {
        Command::Ops(operation) => return ops::main(cli.remote, operation),
        command => Cli { command, ..cli },
    };
    // A server role keeps its secrets to itself: before the runtime starts its threads.
    let server = matches!(
        cli.command,
        Command::Serve { .. } | Command::Api { .. } | Command::Worker { .. }
    );
    if server && let Err(error) = keel_workers::seal::begin() {
        eprintln!("keel: {error}");
        return ExitCode::FAILURE;
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("keel: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    // Inside the runtime: the gRPC exporter needs it to connect.
    let telemetry = {
        let _runtime = runtime.enter();
        telemetry::init(cli.command.log_format(), cli.command.role())
    };
    let telemetry = match telemetry {
        Ok(telemetry) => telemetry,
        Err(error) => {
            eprintln!("keel: {error}");
            return ExitCode::FAILURE;
        }
    };
    if server {
        keel_workers::seal::finish();
    }
    let result = runtime.block_on(run(cli));
    // Flushes the last spans and metrics while the runtime still runs.
    drop(telemetry);
    // Not an unbounded wait for blocking threads: a read of stdin (`keel rpc --stdio` told
    // to stop) never ends by itself. Everything else has finished by now.
    runtime.shutdown_timeout(Duration::from_secs(1));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("keel: {}", error_chain(&error));
            ExitCode::FAILURE
        }
    }
}

/// An error and its causes, `: `-joined, each said once: a cause whose words its error
/// already carries (sqlx's database error repeats its server's message) is left out.
fn error_chain(error: &anyhow::Error) -> String {
    let mut said = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if said.contains(&text) {
            continue;
        }
        if !said.is_empty() {
            said.push_str(": ");
        }
        said.push_str(&text);
    }
    said
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let shutdown = shutdown_on_signal();
    let remote = cli.remote;
    match cli.command {
        Command::Openapi => {
            println!("{}", serde_json::to_string_pretty(&api::openapi())?);
            Ok(())
        }
        Command::Migrate(common) => {
            let pool = connect(&common, "migrate", &shutdown).await?;
            crate::db::migrate(&pool)
                .await
                .context("applying migrations")?;
            println!("migrations applied");
            Ok(())
        }
        Command::Api { common, api } => {
            // Before anything else: an unprotected listener must not start at all.
            let auth = api::Auth::from_args(&api.auth, api.listen)?;
            let listener = bind(&api).await?;
            let pool = connect(&common, "api", &shutdown).await?;
            migrated(&pool, &shutdown).await?;
            serve_api(pool, &common, &api, auth, listener, shutdown).await
        }
        Command::Worker { common, worker } => {
            // Before anything else: lease timings that let two workers run one job at once
            // (or stop healthy jobs) must not start a worker at all.
            worker.settings().map_err(anyhow::Error::msg)?;
            let pool = connect(&common, "worker", &shutdown).await?;
            worker::run_worker(pool, &common, &worker, shutdown).await
        }
        Command::Serve {
            common,
            api,
            worker,
        } => serve_all(&common, &api, &worker, shutdown).await,
        Command::Workflow(command) => workflow(command),
        Command::Rpc { session, .. } => rpc(&remote, session, shutdown).await,
        Command::Ops(_) => unreachable!("operator commands return before the server runtime"),
    }
}

/// `keel rpc --stdio|--socket PATH`.
async fn rpc(
    remote: &ops::Remote,
    args: RpcArgs,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let server = crate::rpc::Server::new(ops::client(remote)?);
    match args.socket {
        Some(path) => crate::rpc::serve_socket(server, &path, shutdown).await?,
        None if args.stdio => tokio::select! {
            served = crate::rpc::serve_stdio(server) => served?,
            () = shutdown.cancelled() => {}
        },
        None => anyhow::bail!("give --stdio or --socket PATH"),
    }
    Ok(())
}

/// `keel workflow check|render`: the error's class leads its message.
fn workflow(command: WorkflowCommand) -> anyhow::Result<()> {
    use crate::external::workflow::{Issue, Workflow};
    let failed = |e: crate::external::workflow::WorkflowError| anyhow::anyhow!("{}: {e}", e.code());
    match command {
        WorkflowCommand::Check { file } => {
            let workflow = Workflow::load(&file).map_err(failed)?;
            println!("{}", serde_json::to_string_pretty(&workflow.config)?);
        }
        WorkflowCommand::Render {
            file,
            issue,
            attempt,
        } => {
            let workflow = Workflow::load(&file).map_err(failed)?;
            let issue = std::fs::read_to_string(&issue)
                .with_context(|| format!("reading {}", issue.display()))?;
            let issue: Issue = serde_json::from_str(&issue).context("the issue JSON")?;
            println!("{}", workflow.render(&issue, attempt).map_err(failed)?);
        }
    }
    Ok(())
}

async fn serve_all(
    common: &Common,
    api: &ApiArgs,
    worker: &WorkerArgs,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    let auth = local_token::serve_auth(&api.auth, &common.data_dir)?;
    let auth = api::Auth::from_args(&auth, api.listen)?;
    worker.settings().map_err(anyhow::Error::msg)?;
    // The port before the database: one already taken fails before PostgreSQL starts.
    let listener = bind(api).await?;
    let (url, embedded) = match common.database_url() {
        Some(url) => (url, None),
        None => {
            let root = common.data_dir.join("postgres");
            eprintln!(
                "keel: starting the embedded PostgreSQL under {} …",
                root.display()
            );
            let cluster = tokio::task::spawn_blocking(move || {
                EmbeddedPostgres::start(&root, Durability::Durable)
            })
            .await?
            .context("starting the embedded PostgreSQL")?;
            create_database(&cluster.url("postgres"), "keel").await?;
            (cluster.url("keel"), Some(cluster))
        }
    };
    let pool = connect_patiently(&url, common, "serve", &shutdown).await?;
    crate::db::migrate(&pool)
        .await
        .context("applying migrations")?;
    let base = format!("http://{}", listener.local_addr()?);
    eprintln!("keel: ready: API {base}, console {base}/console");
    let result = tokio::try_join!(
        serve_api(pool.clone(), common, api, auth, listener, shutdown.clone()),
        worker::run_worker(pool.clone(), common, worker, shutdown.clone()),
    );
    pool.close().await;
    if let Some(cluster) = embedded {
        tokio::task::spawn_blocking(move || cluster.stop()).await?;
    }
    result.map(|_| ())
}

async fn create_database(admin_url: &str, name: &str) -> anyhow::Result<()> {
    let pool = crate::db::connect(admin_url, 1, "setup").await?;
    let exists = sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1) AS "exists!""#,
        name,
    )
    .fetch_one(&pool)
    .await?;
    if !exists {
        // An identifier cannot be a bound parameter, so this statement is built at run time
        // (no `query!`); quote it as PostgreSQL does.
        let quoted = format!("\"{}\"", name.replace('"', "\"\""));
        sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {quoted}")))
            .execute(&pool)
            .await?;
    }
    pool.close().await;
    Ok(())
}

pub async fn connect(
    common: &Common,
    role: &str,
    shutdown: &CancellationToken,
) -> anyhow::Result<PgPool> {
    let url = common.database_url().context(
        "no database URL: pass --database-url or set KEEL_DATABASE_URL (or DATABASE_URL); \
         only `keel serve` can start its own PostgreSQL",
    )?;
    connect_patiently(&url, common, role, shutdown).await
}

/// Opens the pool, its connections carrying the byte quotas, waiting while the database
/// cannot be reached yet (a stack whose PostgreSQL starts beside Keel, a failover under
/// way) for up to the startup patience.
async fn connect_patiently(
    url: &str,
    common: &Common,
    role: &str,
    shutdown: &CancellationToken,
) -> anyhow::Result<PgPool> {
    let settings = common.quotas.storage().session_settings();
    crate::queue::reach::retry_while_unreachable(
        "connecting to PostgreSQL",
        crate::queue::reach::STARTUP_PATIENCE,
        shutdown,
        crate::db::StoreError::is_unreachable,
        || crate::db::connect_with(url, common.db_max_connections, role, &settings),
    )
    .await
    .context("connecting to PostgreSQL")
}

/// Waits until the database has every migration this binary has, saying once what applies
/// them: `keel api` never migrates (several replicas would race a deploy's one `keel
/// migrate`), and before them it has no tables to serve from.
async fn migrated(pool: &PgPool, shutdown: &CancellationToken) -> anyhow::Result<()> {
    let mut told = false;
    while !crate::db::migrations_current(pool)
        .await
        .context("reading the applied migrations")?
    {
        if !told {
            tracing::warn!(
                "the database has pending migrations: run `keel migrate` against it (or start \
                 `keel serve`, which applies them); waiting for them"
            );
            told = true;
        }
        tokio::select! {
            _ = shutdown.cancelled() => anyhow::bail!("stopped while waiting for migrations"),
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    }
    Ok(())
}

pub(crate) async fn serve_api(
    pool: PgPool,
    common: &Common,
    args: &ApiArgs,
    auth: api::Auth,
    listener: tokio::net::TcpListener,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    // The API starts no process: hooks, like runs, run in the workers.
    let settings = api::ApiSettings {
        rules: common.admission_rules().map_err(anyhow::Error::msg)?,
        content: common.content.store()?,
        stream_poll: std::time::Duration::from_millis(args.stream_poll_ms.max(10)),
        secrets: common.secrets.policy().map_err(anyhow::Error::msg)?,
        provider_hosts: common.provider_hosts(),
        chat: common.chat.limits(),
        header_read_timeout: std::time::Duration::from_secs(args.header_read_timeout_secs),
        max_streams_per_identity: args.max_streams_per_identity,
        body_read_timeout: std::time::Duration::from_secs(args.body_read_timeout_secs),
    };
    api::serve_with_auth(pool, listener, settings, auth, shutdown)
        .await
        .context("serving HTTP")
}

/// The API's listener, bound before anything else starts.
async fn bind(args: &ApiArgs) -> anyhow::Result<tokio::net::TcpListener> {
    let listen = args.listen;
    tokio::net::TcpListener::bind(listen)
        .await
        .with_context(|| {
            format!(
                "listening on {listen}: is another Keel (or another program) on that port? \
             Stop it, or choose another address with --listen (KEEL_LISTEN)"
            )
        })
}

/// A token cancelled on SIGINT or SIGTERM.
pub fn shutdown_on_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(term) => term,
                Err(error) => {
                    tracing::error!(%error, "cannot listen for SIGTERM");
                    return;
                }
            };
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        tracing::info!("shutting down");
        cancel.cancel();
    });
    token
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_error_chain_says_each_cause_once() {
        #[derive(Debug, thiserror::Error)]
        #[error("database \"nosuch\" does not exist")]
        struct Server;
        #[derive(Debug, thiserror::Error)]
        #[error("error returned from database: {0}")]
        struct Client(#[source] Server);
        let error = anyhow::Error::new(Client(Server)).context("connecting to PostgreSQL");
        assert_eq!(
            super::error_chain(&error),
            "connecting to PostgreSQL: error returned from database: database \"nosuch\" does \
             not exist"
        );
        let plain = anyhow::anyhow!("no database URL").context("starting");
        assert_eq!(super::error_chain(&plain), "starting: no database URL");
    }

    #[test]
    fn cli_definition_is_consistent() {
        use clap::CommandFactory;
        super::Cli::command().debug_assert();
    }
}
