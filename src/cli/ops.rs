//! The operator commands (`keel tasks|runs|approvals|schedules|media|providers|…`): the
//! API's address and credentials every one takes ([`Remote`]), the commands
//! ([`Operation`]) and running one. Each resource's arguments and calls are in the file
//! named as its routes' file in `api/` (`tasks`, `runs`, `patches`, `events`, `system`, …;
//! `external-work` in `external`). `tests/it/parity.rs` maps each API operation to the
//! command that performs it.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use keel_client::{Client, Credentials, Error};

use crate::cli::approvals;
use crate::cli::approvals::ApprovalCommand;
use crate::cli::console;
use crate::cli::events;
use crate::cli::events::EventCommand;
use crate::cli::external;
use crate::cli::external::ExternalCommand;
use crate::cli::local_token;
use crate::cli::media_jobs;
use crate::cli::media_jobs::MediaCommand;
use crate::cli::output;
use crate::cli::output::Format;
use crate::cli::providers;
use crate::cli::providers::{ProviderCommand, SecretCommand};
use crate::cli::runs;
use crate::cli::runs::RunCommand;
use crate::cli::runtime;
use crate::cli::schedules;
use crate::cli::schedules::ScheduleCommand;
use crate::cli::system;
use crate::cli::system::{LeaseCommand, TransitionCommand};
use crate::cli::tasks;
use crate::cli::tasks::TaskCommand;
use crate::cli::usage;
use crate::cli::usage::UsageCommand;
use crate::cli::watch::Outcome;
use crate::cli::workspaces;
use crate::cli::workspaces::WorkspaceCommand;

/// Where the API is and how to reach it: global options of every operator command.
#[derive(Debug, Args)]
pub(crate) struct Remote {
    /// The API's base URL.
    #[arg(long, env = "KEEL_URL", default_value = keel_client::DEFAULT_URL, global = true)]
    pub(crate) url: String,
    /// The runtime token (sent as `Authorization: Bearer`).
    #[arg(
        long,
        env = "KEEL_RUNTIME_TOKEN",
        hide_env_values = true,
        global = true
    )]
    pub(crate) token: Option<String>,
    /// A signed identity from the trusted proxy (sent as `X-Keel-Identity`); unused when a
    /// token is given (no conflict error: both may sit in the environment of a server).
    #[arg(long, env = "KEEL_IDENTITY", hide_env_values = true, global = true)]
    pub(crate) identity: Option<String>,
    /// The data directory of the local `keel serve`: with neither token nor identity, and
    /// a loopback URL, its `runtime-token` file is sent.
    // The id `data_dir` is the server roles' own setting: clap propagates this global
    // option to no subcommand that has it, so `keel serve --data-dir` stays the server's.
    #[arg(long, env = "KEEL_DATA_DIR", default_value = ".keel", global = true)]
    pub(crate) data_dir: std::path::PathBuf,
    /// `table` (fit to the terminal) or `json` (the API's JSON unchanged).
    #[arg(long, value_enum, default_value = "table", global = true)]
    pub(crate) output: Format,
    /// Show times in UTC rather than in this machine's zone.
    #[arg(long, env = "KEEL_UTC", global = true)]
    pub(crate) utc: bool,
    /// How long one request may take, in seconds.
    #[arg(long, default_value_t = 30, global = true)]
    pub(crate) timeout_secs: u64,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Operation {
    /// Tasks: create, list, show, start, delete.
    #[command(subcommand)]
    Tasks(TaskCommand),
    /// Runs: list, show, watch, logs, cancel, retry, resume, continue,
    /// retry-from-model-call, patches.
    #[command(subcommand)]
    Runs(RunCommand),
    /// Approvals: list, approve, reject.
    #[command(subcommand)]
    Approvals(ApprovalCommand),
    /// Schedules: list, and a task's show, set, delete, occurrences.
    #[command(subcommand)]
    Schedules(ScheduleCommand),
    /// Media jobs: create, list, show, watch, cancel.
    #[command(subcommand)]
    Media(MediaCommand),
    /// Provider presets: list, show, create, update, delete, check.
    #[command(subcommand)]
    Providers(ProviderCommand),
    /// External work: tracker sources, their items, imports and proposed tracker actions.
    #[command(subcommand)]
    ExternalWork(ExternalCommand),
    /// The workspace's queue (depth and age per kind), leases and live workers.
    Status,
    /// This runtime host and the caller: role, actor, workspace.
    Whoami,
    /// The workspace's feed of events (runs' and media jobs'), oldest first.
    #[command(subcommand)]
    Events(EventCommand),
    /// Model usage: totals and the model calls.
    #[command(subcommand)]
    Usage(UsageCommand),
    /// Whether a secret reference resolves (never its value).
    #[command(subcommand)]
    Secrets(SecretCommand),
    /// Ended queue attempts per job kind over the last minutes.
    Throughput {
        /// The window, 1 to 60 minutes back (default 15).
        #[arg(long)]
        minutes: Option<i64>,
    },
    /// Workspace settings: limits (show yours or a workspace's, set) and approval policy
    /// (show, set, reset).
    #[command(subcommand)]
    Workspace(WorkspaceCommand),
    /// Stops the API's host cleanly (a local-only action: a local-mode host, on loopback).
    Shutdown,
    /// Prints a link that signs a browser in to the console, once, within 5 minutes.
    Console,
    /// The audit trail: every state change, oldest first.
    #[command(subcommand)]
    Transitions(TransitionCommand),
    /// The workspace's queue leases.
    #[command(subcommand)]
    Leases(LeaseCommand),
}

/// Runs an operator command on its own runtime, without the server's telemetry: 0 or the
/// watched run's exit code, [`ERROR_EXIT`] when the command failed.
pub(crate) fn main(remote: Remote, operation: Operation) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("error: cannot start the async runtime: {error}");
            return ExitCode::from(ERROR_EXIT);
        }
    };
    output::show_times_in_utc(remote.utc);
    let result = runtime.block_on(async {
        let client = client(&remote)?;
        run(&client, remote.output, operation).await
    });
    match result {
        Ok(outcome) => ExitCode::from(outcome.code()),
        Err(error) => {
            output::print_error(&error);
            ExitCode::from(ERROR_EXIT)
        }
    }
}

/// The exit code of a command that failed (not of a run that failed, which is 1).
pub(crate) const ERROR_EXIT: u8 = 4;

pub(super) fn client(remote: &Remote) -> Result<Client, Error> {
    let credentials = match (&remote.token, &remote.identity) {
        (Some(token), _) => Credentials::RuntimeToken(token.clone()),
        (None, Some(identity)) => Credentials::Identity(identity.clone()),
        (None, None) => local_token::for_client(&remote.url, &remote.data_dir)
            .map_err(Error::Usage)?
            .map_or(Credentials::None, Credentials::RuntimeToken),
    };
    Client::new(
        &remote.url,
        credentials,
        Duration::from_secs(remote.timeout_secs.max(1)),
    )
}

async fn run(client: &Client, format: Format, operation: Operation) -> Result<Outcome, Error> {
    // Only a command that may watch a run or a job, or that checks something (a provider
    // preset), ends with an outcome of its own; the others are done once they answered.
    let answered = match operation {
        Operation::Tasks(command) => return tasks::run(client, format, command).await,
        Operation::Runs(command) => return runs::run(client, format, command).await,
        Operation::Media(command) => return media_jobs::run(client, format, command).await,
        Operation::Providers(command) => return providers::run(client, format, command).await,
        Operation::Approvals(command) => approvals::run(client, format, command).await,
        Operation::Schedules(command) => schedules::run(client, format, command).await,

        Operation::ExternalWork(command) => external::run(client, format, command).await,
        Operation::Status => system::status(client, format).await,
        Operation::Console => console::sign_in(client, format).await,
        Operation::Whoami => runtime::whoami(client, format).await,
        Operation::Events(command) => events::run(client, format, command).await,
        Operation::Usage(command) => usage::run(client, format, command).await,
        Operation::Secrets(command) => providers::secrets(client, format, command).await,
        Operation::Throughput { minutes } => system::throughput(client, format, minutes).await,
        Operation::Workspace(command) => workspaces::run(client, format, command).await,
        Operation::Shutdown => runtime::shutdown(client, format).await,
        Operation::Transitions(command) => system::transitions(client, format, command).await,
        Operation::Leases(command) => system::leases(client, format, command).await,
    };
    answered.map(|()| Outcome::Done)
}
