//! The operator commands (`keel tasks|runs|approvals|schedules|media|providers|
//! transitions|leases|whoami|status`; `external-work` is in `external`): their arguments,
//! and each one as calls of the typed client. `tests/it/parity.rs` maps each API operation
//! to the command that performs it.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use keel_client::{
    ApprovalPolicyRecord, ApprovalPolicyRequest, ApprovalRecord, ArtifactRecord, Call, Client,
    ClientArtifact, ClientEvent, ClientFinish, ClientOutcome, ClientRunRequest, ClientStep,
    ContinueRequest, Credentials, Error, EventRecord, GateDecision, Grouping, LeaseRecord,
    LimitsRequest, McpServer, MediaJobDraft, MediaJobRecord, ObjectEnvelope, OccurrenceRecord,
    PatchDetail, PatchSummary, ProviderDraft, ProviderPatch, ProviderTemplate, ProviderView,
    REASONING_EFFORTS, ResolveRequest, RetryFromModelCallRequest, RunEventsRequest, RunRecord,
    ScheduleDraft, ScheduleRecord, StartRequest, StepRecord, TaskDraft, TaskRecord,
    TransitionRecord, UsageEvent, WorkspaceLimits,
};

use crate::cli::external;
use crate::cli::external::ExternalCommand;
use crate::cli::local_token;
use crate::cli::output;
use crate::cli::output::{Format, PageArgs, Table, or_dash, time};
use crate::cli::watch;
use crate::cli::watch::Outcome;

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
    /// How long one request may take, in seconds.
    #[arg(long, default_value_t = 30, global = true)]
    pub(crate) timeout_secs: u64,
}

#[derive(Debug, Subcommand)]
pub enum Operation {
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

#[derive(Debug, Subcommand)]
pub(crate) enum EventCommand {
    /// Lists the feed's events after `--cursor` (an event's `cursor`).
    List {
        /// Comma-separated event types (`run.finished,run.failed`).
        #[arg(long = "type")]
        event_type: Option<String>,
        #[arg(long)]
        task: Option<String>,
        #[arg(long)]
        media_job: Option<String>,
        #[command(flatten)]
        page: PageArgs,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum UsageCommand {
    /// Totals, and per provider preset or workspace with `--scope`.
    Summary {
        /// `global` (the default), `provider` or `workspace`.
        #[arg(long)]
        scope: Option<String>,
    },
    /// The model calls, newest first.
    Events {
        #[arg(long)]
        task: Option<String>,
        #[arg(long)]
        run: Option<String>,
        #[command(flatten)]
        page: PageArgs,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum SecretCommand {
    /// `env:NAME`, `file:/absolute/path` or `keychain:NAME`, as the secret policy allows.
    Status {
        reference: String,
        /// What it is for (`provider_api_key`, `github_token`, …).
        #[arg(long)]
        purpose: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum WorkspaceCommand {
    /// The limits of your workspace, or of WORKSPACE_ID (an operator's read).
    Show { workspace_id: Option<String> },
    /// Sets a workspace's limits (an operator's write).
    SetLimits {
        workspace_id: String,
        /// Most jobs it runs at once (0 pauses it).
        #[arg(long, required_unless_present = "default")]
        max_concurrent: Option<u32>,
        /// Back to the workers' `KEEL_MAX_CONCURRENT_PER_WORKSPACE`.
        #[arg(long, conflicts_with = "max_concurrent")]
        default: bool,
    },
    /// A workspace's approval policy: its own, or the process setting (an operator's read).
    Policy { workspace_id: String },
    /// Changes a workspace's approval policy (an operator's write): what is not named keeps
    /// its value in the policy in force.
    SetPolicy {
        workspace_id: String,
        /// GATE=DECISION, repeatable: shell_exec, git_exec, file_write, network_egress,
        /// read_file or all_tools = allow, ask or deny.
        #[arg(long = "gate", value_name = "GATE=DECISION")]
        gates: Vec<String>,
        /// SERVER=DECISION for an MCP server's tools, repeatable.
        #[arg(long = "mcp", value_name = "SERVER=DECISION")]
        mcp_servers: Vec<String>,
        /// Where file writers may write (workspace-relative), repeatable; replaces the list.
        #[arg(long = "write-path", value_name = "PATH")]
        write_paths: Vec<String>,
        /// File writers may write anywhere in the workspace again.
        #[arg(long, conflicts_with = "write_paths")]
        write_anywhere: bool,
    },
    /// Removes a workspace's own approval policy: the process setting applies again.
    ResetPolicy { workspace_id: String },
}

#[derive(Debug, Subcommand)]
pub(crate) enum TransitionCommand {
    /// Lists state changes, oldest first: every entity's, or one's.
    List {
        /// `task`, `run`, `step`, `approval`, `media_job`, …
        #[arg(long)]
        entity_type: Option<String>,
        #[arg(long)]
        entity_id: Option<String>,
        #[command(flatten)]
        page: PageArgs,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum LeaseCommand {
    /// Lists queue leases: `active` (the default), `expired` or `released`.
    List {
        #[arg(long)]
        status: Option<String>,
        #[command(flatten)]
        page: PageArgs,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum TaskCommand {
    /// Creates a task (nothing runs until it is started).
    Create(Box<CreateTask>),
    /// Lists tasks, newest first.
    List {
        /// `not_started` or a run status (`running`, `failed`, …).
        #[arg(long)]
        status: Option<String>,
        #[command(flatten)]
        page: PageArgs,
    },
    Show {
        task_id: String,
    },
    /// Starts the task's next run.
    Start {
        task_id: String,
        #[command(flatten)]
        watch: AdmitArgs,
        /// Why, for the run's `run.created` event.
        #[arg(long)]
        reason: Option<String>,
    },
    /// Deletes the task with its runs (refused while a run is active).
    Delete {
        task_id: String,
    },
    /// The artifacts of all the task's runs, oldest first.
    Artifacts {
        task_id: String,
        #[command(flatten)]
        page: PageArgs,
    },
}

#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("execution").required(true))]
pub(crate) struct CreateTask {
    /// A shell task: the command (run with `sh -c`).
    #[arg(long, group = "execution")]
    shell: Option<String>,
    /// A git task: the git arguments (`status --short`).
    #[arg(long, group = "execution")]
    git: Option<String>,
    /// A file task: the path to write, with `--content`.
    #[arg(long, group = "execution", requires = "content")]
    file: Option<String>,
    /// The file task's content.
    #[arg(long, requires = "file")]
    content: Option<String>,
    /// An agent loop task: the prompt.
    #[arg(long, group = "execution")]
    prompt: Option<String>,
    /// Agent loops: the provider preset id, which pins the task to it (default: the
    /// workspace's enabled chat presets, failing over from the first to the next).
    #[arg(long, requires = "prompt")]
    provider: Option<String>,
    /// Agent loops: how hard a reasoning model thinks.
    #[arg(long, requires = "prompt", value_parser = REASONING_EFFORTS)]
    reasoning_effort: Option<String>,
    /// Agent loops: a tool the model may call (repeat for several).
    #[arg(long = "tool", requires = "prompt")]
    tools: Vec<String>,
    /// Agent loops: an MCP server whose tools the model may call, as JSON (repeat for
    /// several): '{"name": "time", "command": "mcp-server-time"}'.
    #[arg(long = "mcp", requires = "prompt", value_parser = mcp_server)]
    mcp_servers: Vec<McpServer>,
    /// Agent loops: the defaults of a kind of work (coding_agent: needs --repo).
    #[arg(long, requires = "prompt", value_parser = ["coding_agent"])]
    execution_profile: Option<String>,
    /// Where runs work: ephemeral (a fresh directory each; the default), persistent (the
    /// task's directory, kept across its runs) or in_place (--working-directory, which
    /// implies it).
    #[arg(long, value_parser = ["ephemeral", "persistent", "in_place"])]
    workspace_mode: Option<String>,
    #[arg(long)]
    working_directory: Option<String>,
    /// The repository each run's workspace starts as a clone of (a URL without
    /// credentials, or an absolute path).
    #[arg(long)]
    repo: Option<String>,
    /// With --repo: the branch to check out.
    #[arg(long, requires = "repo")]
    base_branch: Option<String>,
    /// With an https:// --repo: a secret reference (env:NAME, file:/path) to the
    /// credential the clone sends.
    #[arg(long, requires = "repo")]
    repo_credential: Option<String>,
    /// With --repo: the branch a completed run's changes are committed and pushed to.
    #[arg(long, requires = "repo")]
    push_branch: Option<String>,
    #[arg(long)]
    timeout_ms: Option<i64>,
    /// Start the task in the same request and transaction (`start: true`): the task shown
    /// has its first run's status and id (`latest_run_id`).
    #[arg(long)]
    start: bool,
    /// Print only the new task's id.
    #[arg(long, short)]
    quiet: bool,
}

impl CreateTask {
    fn draft(&self) -> TaskDraft {
        let kind = if self.shell.is_some() {
            "shell"
        } else if self.git.is_some() {
            "git"
        } else if self.file.is_some() {
            "file"
        } else {
            "agent_loop"
        };
        TaskDraft {
            execution_kind: Some(kind.into()),
            prompt: self.prompt.clone(),
            shell_command: self.shell.clone(),
            git_command: self.git.clone(),
            file_path: self.file.clone(),
            file_content: self.content.clone(),
            working_directory: self.working_directory.clone(),
            workspace_mode: self.workspace_mode.clone().or_else(|| {
                self.working_directory
                    .as_ref()
                    .map(|_| "in_place".to_string())
            }),
            repo: self.repo.clone(),
            base_branch: self.base_branch.clone(),
            repo_credential: self.repo_credential.clone(),
            push_branch: self.push_branch.clone(),
            timeout_ms: self.timeout_ms,
            requested_provider: self.provider.clone(),
            reasoning_effort: self.reasoning_effort.clone(),
            tools: (!self.tools.is_empty()).then(|| self.tools.clone()),
            mcp_servers: (!self.mcp_servers.is_empty()).then(|| self.mcp_servers.clone()),
            execution_profile: self.execution_profile.clone(),
            start: self.start.then_some(true),
            ..TaskDraft::default()
        }
    }
}

/// One `--mcp` value: a server as the API takes it, in JSON.
fn mcp_server(value: &str) -> Result<McpServer, String> {
    serde_json::from_str(value).map_err(|e| format!("not an MCP server's JSON: {e}"))
}

/// What to do with a new run (start, retry, resume).
#[derive(Debug, Clone, Copy, Args)]
pub(crate) struct AdmitArgs {
    /// Stream the run live until it ends; the exit code is the run's.
    #[arg(long)]
    pub(crate) watch: bool,
    /// With --watch: exit with 3 as soon as the run waits for an approval.
    #[arg(long, requires = "watch")]
    pub(crate) no_wait: bool,
    /// Print only the new run's id.
    #[arg(long, short, conflicts_with = "watch")]
    pub(crate) quiet: bool,
}

#[derive(Debug, Subcommand)]
pub(crate) enum RunCommand {
    /// Lists runs, oldest first: a task's, or with no task every task's in the workspace.
    List {
        task_id: Option<String>,
        /// Only runs in this status (`running`, `failed`, …).
        #[arg(long)]
        status: Option<String>,
        #[command(flatten)]
        page: PageArgs,
    },
    Show {
        run_id: String,
    },
    /// Streams the run live: a line per step, approval prompts, its output lines. Exit
    /// code: 0 completed, 1 failed, 2 cancelled, 3 awaiting approval (with --no-wait).
    Watch {
        run_id: String,
        /// Exit with 3 as soon as the run waits for an approval.
        #[arg(long)]
        no_wait: bool,
    },
    /// Prints the run's output so far (stdout, and stderr on stderr).
    Logs {
        run_id: String,
    },
    /// The run's steps, in order.
    Steps {
        run_id: String,
        #[command(flatten)]
        page: PageArgs,
    },
    /// One step of the run, with its input and output (`--output json`).
    Step {
        run_id: String,
        step_id: String,
    },
    /// The run's event log, in order, after `--cursor` (a sequence).
    Events {
        run_id: String,
        #[command(flatten)]
        page: PageArgs,
    },
    /// One artifact of the run: its kind, type, size and status.
    Artifact {
        run_id: String,
        artifact_id: String,
    },
    /// The run's artifacts (its output, patches, answers), oldest first.
    Artifacts {
        run_id: String,
        #[command(flatten)]
        page: PageArgs,
    },
    /// Cancels the run (a finished run is left as it is).
    Cancel {
        run_id: String,
    },
    /// A new run of the task in a fresh workspace.
    Retry {
        run_id: String,
        #[command(flatten)]
        watch: AdmitArgs,
    },
    /// A new run in the finished run's workspace, from its checkpoint.
    Resume {
        run_id: String,
        #[command(flatten)]
        watch: AdmitArgs,
    },
    /// An agent loop's next turn: a new run carrying the finished run's conversation on
    /// with `--prompt`.
    Continue {
        run_id: String,
        /// The next user turn.
        #[arg(long)]
        prompt: String,
        #[command(flatten)]
        watch: AdmitArgs,
    },
    /// A new run of an agent loop that re-issues the finished run's model call N and goes
    /// on from there.
    RetryFromModelCall {
        run_id: String,
        /// The model call to re-issue, 1-based.
        #[arg(long)]
        model_call: i64,
        /// Why, for the run's `run.created` event.
        #[arg(long)]
        reason: Option<String>,
        #[command(flatten)]
        watch: AdmitArgs,
    },
    /// An agent run's file changes: list, show, revert, apply or discard a proposal.
    #[command(subcommand)]
    Patches(PatchCommand),
    /// Starts a run you carry out yourself (an editor, a script): it prints the lease
    /// token every `runs append` needs.
    ClientStart {
        task_id: String,
        /// How long the lease lasts without an append, 1000 to 600000 (default 60000).
        #[arg(long)]
        lease_ms: Option<u32>,
        #[arg(long)]
        reason: Option<String>,
    },
    /// Records your client-orchestrated run's events, steps and end; renews its lease.
    Append {
        run_id: String,
        /// The lease token `runs client-start` printed.
        #[arg(long, env = "KEEL_LEASE_TOKEN", hide_env_values = true)]
        token: String,
        /// KIND or KIND=JSON-object, repeatable: a `client.event`.
        #[arg(long = "event", value_name = "KIND[=JSON]")]
        events: Vec<String>,
        /// NAME or NAME=JSON-object (its output), repeatable: a completed step.
        #[arg(long = "step", value_name = "NAME[=JSON]")]
        steps: Vec<String>,
        /// NAME=PATH, repeatable: a text artifact with the file's content.
        #[arg(long = "artifact", value_name = "NAME=PATH")]
        artifacts: Vec<String>,
        /// Ends the run: `completed` or `failed`.
        #[arg(long)]
        finish: Option<String>,
        /// Why it failed (with `--finish failed`).
        #[arg(long, requires = "finish")]
        error: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum PatchCommand {
    /// Lists the run's patches, oldest first.
    List {
        run_id: String,
        #[command(flatten)]
        page: PageArgs,
    },
    /// Shows a patch (`--output json`: with the file's content before and after).
    Show { run_id: String, patch_id: String },
    /// Puts the file back as it was before the patch.
    Revert { run_id: String, patch_id: String },
    /// Writes a proposed patch into its file (if the file is still as it was proposed over).
    Apply { run_id: String, patch_id: String },
    /// Drops a proposed patch; its file is never touched.
    Discard { run_id: String, patch_id: String },
}

#[derive(Debug, Subcommand)]
pub(crate) enum ApprovalCommand {
    /// Shows an approval: its kind, status and what it would allow.
    Show { approval_id: String },
    /// Lists approvals (across tasks, or one task's), oldest first.
    List {
        /// `pending`, `approved`, `rejected`, `cancelled` or `expired`.
        #[arg(long)]
        status: Option<String>,
        /// Only this task's.
        #[arg(long)]
        task: Option<String>,
        /// Only this run's.
        #[arg(long, conflicts_with = "task")]
        run: Option<String>,
        #[command(flatten)]
        page: PageArgs,
    },
    /// Approves: the last gate approved queues the run.
    Approve {
        approval_id: String,
        #[arg(long)]
        note: Option<String>,
    },
    /// Rejects: the run is cancelled.
    Reject {
        approval_id: String,
        #[arg(long)]
        note: Option<String>,
        /// A tool-call approval only: the model reads a refusal and the run goes on.
        #[arg(long = "continue")]
        continue_run: bool,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum ScheduleCommand {
    /// Lists the workspace's schedules.
    List {
        /// Only this task's.
        #[arg(long)]
        task: Option<String>,
        /// Only enabled (`true`) or paused (`false`) ones.
        #[arg(long)]
        enabled: Option<bool>,
        #[command(flatten)]
        page: PageArgs,
    },
    /// The times the task's schedule fired, and what each did.
    Occurrences {
        task_id: String,
        #[command(flatten)]
        page: PageArgs,
    },
    Show {
        task_id: String,
    },
    /// Creates or replaces the task's schedule: `--cron` or `--at`.
    Set {
        task_id: String,
        /// A five-field cron expression, read on `--timezone`'s wall clock.
        #[arg(long, conflicts_with = "at", required_unless_present = "at")]
        cron: Option<String>,
        /// Once, at this RFC 3339 time.
        #[arg(long)]
        at: Option<String>,
        /// The IANA zone the schedule is read in.
        #[arg(long, default_value = "UTC")]
        timezone: String,
        /// Saved paused.
        #[arg(long)]
        disabled: bool,
        /// The revision you read: the edit fails if the schedule changed since.
        #[arg(long)]
        revision: Option<i64>,
    },
    Delete {
        task_id: String,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum MediaCommand {
    /// Creates a media job and runs it (sends it to a worker).
    Create {
        /// The provider preset (`api: media-job`).
        #[arg(long)]
        provider: String,
        /// `image_generate`, `image_edit` or `video_generate`.
        #[arg(long, default_value = "image_generate")]
        operation: String,
        #[arg(long)]
        prompt: String,
        /// Vendor options as a JSON object (`{"size":"1024x1024"}`).
        #[arg(long, default_value = "{}")]
        input: String,
        /// Print only the new job's id.
        #[arg(long, short)]
        quiet: bool,
        /// Only create the job; `POST /v1/media-jobs/{id}/run` starts it later.
        #[arg(long, conflicts_with = "watch")]
        no_run: bool,
        /// Follow the job until it ends; the exit code is its outcome.
        #[arg(long)]
        watch: bool,
    },
    /// Lists the workspace's media jobs.
    List {
        /// `queued`, `running`, `succeeded`, `failed` or `cancelled`.
        #[arg(long)]
        status: Option<String>,
        /// Only this provider preset's.
        #[arg(long)]
        provider: Option<String>,
        #[command(flatten)]
        page: PageArgs,
    },
    Show {
        media_job_id: String,
    },
    /// Follows the job until it ends: 0 succeeded, 1 failed, 2 cancelled.
    Watch {
        media_job_id: String,
    },
    /// The job's artifacts (the images or videos it made).
    Artifacts {
        media_job_id: String,
        #[command(flatten)]
        page: PageArgs,
    },
    /// Writes an artifact's bytes to stdout (`> out.png`).
    Content {
        media_job_id: String,
        artifact_id: String,
    },
    /// Cancels the job (an ended job is left as it is).
    Cancel {
        media_job_id: String,
    },
}

#[derive(Debug, Subcommand)]
pub(crate) enum ProviderCommand {
    List {
        #[command(flatten)]
        page: PageArgs,
    },
    Show {
        id: String,
    },
    /// Creates a preset. Secrets are named by reference (`--api-key-ref env:NAME`), never
    /// given.
    Create(CreateProvider),
    /// Request bodies for `providers create`, one per supported vendor.
    Templates {
        #[command(flatten)]
        page: PageArgs,
    },
    /// Changes the given fields of a preset; the others stay.
    Update(UpdateProvider),
    /// Deletes a preset that no media job names.
    Delete {
        id: String,
    },
    /// Checks the preset can be used; `--live` also makes one tiny billed call.
    Check {
        id: String,
        #[arg(long)]
        live: bool,
    },
}

#[derive(Debug, Args)]
pub(crate) struct UpdateProvider {
    id: String,
    #[arg(long)]
    model: Option<String>,
    #[arg(long)]
    base_url: Option<String>,
    #[arg(long)]
    display_name: Option<String>,
    /// `env:NAME`, `file:/absolute/path` or `keychain:NAME`.
    #[arg(long)]
    api_key_ref: Option<String>,
    /// Removes the preset's secret reference.
    #[arg(long, conflicts_with = "api_key_ref")]
    no_api_key_ref: bool,
    /// A capability; repeat for several (replaces the preset's list).
    #[arg(long = "capability")]
    capabilities: Vec<String>,
    /// `true` or `false`.
    #[arg(long)]
    enabled: Option<bool>,
}

impl UpdateProvider {
    fn patch(&self) -> ProviderPatch {
        let api_key_ref = if self.no_api_key_ref {
            Some(None)
        } else {
            self.api_key_ref.clone().map(Some)
        };
        ProviderPatch {
            model: self.model.clone(),
            base_url: self.base_url.clone(),
            display_name: self.display_name.clone(),
            api_key_ref,
            capabilities: (!self.capabilities.is_empty()).then(|| self.capabilities.clone()),
            enabled: self.enabled,
            ..ProviderPatch::default()
        }
    }
}

#[derive(Debug, Args)]
pub(crate) struct CreateProvider {
    /// `openai-images`, `seedream` or `seedance` for media presets; any slug for chat ones.
    #[arg(long)]
    kind: String,
    #[arg(long)]
    model: String,
    /// `media-job`, `openai-completions`, `openai-responses` or `anthropic-messages`.
    #[arg(long)]
    api: String,
    #[arg(long)]
    base_url: String,
    /// `env:NAME`, `file:/absolute/path` or `keychain:NAME`.
    #[arg(long)]
    api_key_ref: Option<String>,
    /// A slug; default: the kind.
    #[arg(long)]
    provider_id: Option<String>,
    #[arg(long)]
    display_name: Option<String>,
    /// A capability (`chat`, `tool_call`, `image_generate`, …); repeat for several.
    #[arg(long = "capability")]
    capabilities: Vec<String>,
    /// An input kind (`text`, `image`); repeat for several.
    #[arg(long = "input")]
    input: Vec<String>,
    /// Create it enabled (presets are created disabled otherwise).
    #[arg(long)]
    enabled: bool,
    /// Print only the new preset's id.
    #[arg(long, short)]
    quiet: bool,
}

impl CreateProvider {
    fn draft(self) -> ProviderDraft {
        ProviderDraft {
            kind: self.kind,
            display_name: self.display_name,
            provider_id: self.provider_id,
            model: self.model,
            api: self.api,
            base_url: self.base_url,
            api_key_ref: self.api_key_ref,
            headers: Default::default(),
            secret_header_refs: Default::default(),
            capabilities: self.capabilities,
            input: self.input,
            compat: Default::default(),
            enabled: self.enabled,
        }
    }
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
    match operation {
        Operation::Tasks(command) => tasks(client, format, command).await,
        Operation::Runs(command) => runs(client, format, command).await,
        Operation::Approvals(command) => approvals(client, format, command)
            .await
            .map(|_| Outcome::Done),
        Operation::Schedules(command) => schedules(client, format, command)
            .await
            .map(|_| Outcome::Done),
        Operation::Media(command) => media(client, format, command).await,
        Operation::Providers(command) => providers(client, format, command)
            .await
            .map(|_| Outcome::Done),
        Operation::ExternalWork(command) => external::run(client, format, command)
            .await
            .map(|_| Outcome::Done),
        Operation::Status => status(client, format).await.map(|_| Outcome::Done),
        Operation::Console => console(client, format).await.map(|_| Outcome::Done),
        Operation::Whoami => output::show(format, client.whoami(), |s| {
            let s = &s.data;
            Table::fields(&[
                ("role", s.role.clone()),
                ("actor", s.actor_id.clone()),
                ("workspace", s.workspace.clone()),
                ("may approve own", s.may_approve_own.to_string()),
                ("runtime host", s.runtime_host.label.clone()),
                ("operator access", s.runtime_host.operator_access.clone()),
            ])
        })
        .await
        .map(|_| Outcome::Done),
        Operation::Events(EventCommand::List {
            event_type,
            task,
            media_job,
            page,
        }) => {
            let (after, page) = cursor_given(page);
            let call = client
                .list_feed(after.as_deref())
                .query("event_type", event_type)
                .query("task_id", task)
                .query("media_job_id", media_job);
            events(format, &page, call).await.map(|_| Outcome::Done)
        }
        Operation::Usage(command) => usage(client, format, command).await.map(|_| Outcome::Done),
        Operation::Secrets(SecretCommand::Status { reference, purpose }) => {
            let call = client.secret_status(&reference, purpose.as_deref());
            output::show(format, call, |s| {
                let s = &s.data;
                Table::fields(&[
                    ("ref", s.r#ref.clone()),
                    ("kind", s.kind.clone()),
                    ("configured", s.configured.to_string()),
                    ("error", or_dash(s.error_code.as_ref())),
                    ("message", or_dash(s.message.as_ref())),
                ])
            })
            .await
            .map(|_| Outcome::Done)
        }
        Operation::Throughput { minutes } => {
            output::show(format, client.system_throughput(minutes), |t| {
                let mut table = Table::new(&["KIND", "COMPLETED", "FAILED"]);
                for kind in &t.data.kinds {
                    let figures = [kind.completed, kind.failed].map(|n| n.to_string());
                    table.row([vec![kind.kind.clone()], figures.to_vec()].concat());
                }
                table
            })
            .await
            .map(|_| Outcome::Done)
        }
        Operation::Workspace(command) => workspace(client, format, command).await,
        Operation::Shutdown => output::show(format, client.shutdown(), |s| {
            Table::fields(&[("status", s.data.status.clone())])
        })
        .await
        .map(|_| Outcome::Done),
        Operation::Transitions(TransitionCommand::List {
            entity_type,
            entity_id,
            page,
        }) => {
            let headers = [
                "ID", "TYPE", "ENTITY", "FROM", "TO", "ACTOR", "AT", "REASON",
            ];
            let call = client.state_transitions(entity_type.as_deref(), entity_id.as_deref());
            output::list(format, &page, call, &headers, |t: &TransitionRecord| {
                vec![
                    t.id.to_string(),
                    t.entity_type.clone(),
                    t.entity_id.clone(),
                    or_dash(t.from_status.as_ref()),
                    t.to_status.clone(),
                    t.actor.clone(),
                    time(&t.occurred_at),
                    or_dash(t.reason.as_ref()),
                ]
            })
            .await
            .map(|_| Outcome::Done)
        }
        Operation::Leases(LeaseCommand::List { status, page }) => {
            let headers = [
                "JOB", "KIND", "REF", "STATUS", "OWNER", "CLAIMED", "OUTCOME",
            ];
            let call = client.runtime_leases(status.as_deref());
            output::list(format, &page, call, &headers, |l: &LeaseRecord| {
                vec![
                    l.job_id.to_string(),
                    l.kind.clone(),
                    l.ref_id.clone(),
                    l.status.clone(),
                    l.owner.clone(),
                    time(&l.claimed_at),
                    or_dash(l.outcome.as_ref()),
                ]
            })
            .await
            .map(|_| Outcome::Done)
        }
    }
}

async fn tasks(client: &Client, format: Format, command: TaskCommand) -> Result<Outcome, Error> {
    match command {
        TaskCommand::Create(create) => {
            let call = client.create_task(&create.draft());
            let id = |t: &ObjectEnvelope<TaskRecord>| t.data.id.clone();
            output::show_or_id(format, create.quiet, call, id, |t| task_fields(&t.data)).await?;
        }
        TaskCommand::List { status, page } => {
            let headers = ["ID", "KIND", "STATUS", "RUNS", "CREATED", "WHAT"];
            let call = client.list_tasks(status.as_deref());
            output::list(format, &page, call, &headers, |t: &TaskRecord| {
                let what = [&t.shell_command, &t.git_command, &t.file_path, &t.prompt]
                    .into_iter()
                    .find_map(|w| w.clone());
                vec![
                    t.id.clone(),
                    t.execution_kind.clone(),
                    t.status.to_string(),
                    t.run_count.to_string(),
                    time(&t.created_at),
                    or_dash(what),
                ]
            })
            .await?;
        }
        TaskCommand::Show { task_id } => {
            output::show(format, client.get_task(&task_id), |t| task_fields(&t.data)).await?;
        }
        TaskCommand::Start {
            task_id,
            watch,
            reason,
        } => {
            let request = StartRequest {
                reason,
                budget_micros_usd: None,
            };
            return admitted(client, format, client.start_task(&task_id, &request), watch).await;
        }
        TaskCommand::Artifacts { task_id, page } => {
            artifacts(format, &page, client.list_task_artifacts(&task_id)).await?;
        }
        TaskCommand::Delete { task_id } => {
            output::show(format, client.delete_task(&task_id), |d| {
                Table::fields(&[("id", d.id.clone()), ("deleted", d.deleted.to_string())])
            })
            .await?;
        }
    }
    Ok(Outcome::Done)
}

/// A new run (start, retry, resume): shown, its id alone, or streamed to its end.
async fn admitted(
    client: &Client,
    format: Format,
    call: Call<'_, ObjectEnvelope<RunRecord>>,
    args: AdmitArgs,
) -> Result<Outcome, Error> {
    if args.watch {
        let run = call.await?.data;
        return watch::run(client, format, &run, args.no_wait).await;
    }
    let id = |r: &ObjectEnvelope<RunRecord>| r.data.id.clone();
    output::show_or_id(format, args.quiet, call, id, |r| run_fields(&r.data)).await?;
    Ok(Outcome::Done)
}

async fn runs(client: &Client, format: Format, command: RunCommand) -> Result<Outcome, Error> {
    match command {
        RunCommand::List {
            task_id,
            status,
            page,
        } => {
            // A task alone: its own list, which says when the task does not exist.
            let call = match (&task_id, &status) {
                (Some(task_id), None) => client.list_runs(task_id),
                _ => client.list_workspace_runs(status.as_deref(), task_id.as_deref()),
            };
            let headers = [
                "ID", "TASK", "NUMBER", "STATUS", "EXIT", "CREATED", "FINISHED",
            ];
            output::list(format, &page, call, &headers, |r: &RunRecord| {
                vec![
                    r.id.clone(),
                    r.task_id.clone(),
                    r.number.to_string(),
                    r.status.to_string(),
                    or_dash(r.exit_code),
                    time(&r.created_at),
                    or_dash(r.finished_at.as_ref().map(time)),
                ]
            })
            .await?;
        }
        RunCommand::Show { run_id } => {
            let run = client.find_run(&run_id).await?.data;
            output::show(format, client.get_run(&run.task_id, &run_id), |r| {
                run_fields(&r.data)
            })
            .await?;
        }
        RunCommand::Watch { run_id, no_wait } => {
            let run = client.find_run(&run_id).await?.data;
            return watch::run(client, format, &run, no_wait).await;
        }
        RunCommand::Logs { run_id } => {
            let run = client.find_run(&run_id).await?.data;
            watch::print_logs(client, &run).await?;
        }
        RunCommand::Steps { run_id, page } => {
            let task_id = client.task_of("run", &run_id).await?;
            let headers = [
                "ID", "INDEX", "NAME", "STATUS", "STARTED", "FINISHED", "ERROR",
            ];
            let call = client.list_steps(&task_id, &run_id);
            output::list(format, &page, call, &headers, |s: &StepRecord| {
                vec![
                    s.id.clone(),
                    s.index.to_string(),
                    s.name.clone(),
                    s.status.to_string(),
                    time(&s.started_at),
                    or_dash(s.finished_at.as_ref().map(time)),
                    or_dash(s.error.as_ref()),
                ]
            })
            .await?;
        }
        RunCommand::Step { run_id, step_id } => {
            let task_id = client.task_of("run", &run_id).await?;
            output::show(format, client.get_step(&task_id, &run_id, &step_id), |s| {
                let s = &s.data;
                Table::fields(&[
                    ("id", s.id.clone()),
                    ("index", s.index.to_string()),
                    ("name", s.name.clone()),
                    ("status", s.status.to_string()),
                    ("input", s.input.to_string()),
                    ("output", or_dash(s.output.as_ref())),
                    ("error", or_dash(s.error.as_ref())),
                    ("started", time(&s.started_at)),
                    ("finished", or_dash(s.finished_at.as_ref().map(time))),
                ])
            })
            .await?;
        }
        RunCommand::Events { run_id, page } => {
            let task_id = client.task_of("run", &run_id).await?;
            let (after, page) = cursor_given(page);
            let after = after
                .map(|a| a.parse::<i64>())
                .transpose()
                .map_err(|_| Error::Usage("--cursor must be an event's sequence".into()))?;
            events(
                format,
                &page,
                client.list_run_events(&task_id, &run_id, after),
            )
            .await?;
        }
        RunCommand::Artifact {
            run_id,
            artifact_id,
        } => {
            let task_id = client.task_of("run", &run_id).await?;
            let call = client.get_artifact(&task_id, &run_id, &artifact_id);
            output::show(format, call, |a| {
                let a = &a.data;
                Table::fields(&[
                    ("id", a.id.clone()),
                    ("name", a.name.clone()),
                    ("kind", a.kind.to_string()),
                    ("type", a.content_type.clone()),
                    ("bytes", a.size_bytes.to_string()),
                    ("truncated", a.truncated.to_string()),
                    ("status", a.status.to_string()),
                    ("created", time(&a.created_at)),
                ])
            })
            .await?;
        }
        RunCommand::Artifacts { run_id, page } => {
            let task_id = client.task_of("run", &run_id).await?;
            artifacts(format, &page, client.list_artifacts(&task_id, &run_id)).await?;
        }
        RunCommand::Cancel { run_id } => {
            let run = client.find_run(&run_id).await?.data;
            output::show(format, client.cancel_run(&run.task_id, &run_id), |r| {
                run_fields(&r.data)
            })
            .await?;
        }
        RunCommand::Retry { run_id, watch } => {
            let run = client.find_run(&run_id).await?.data;
            let call = client.retry_run(&run.task_id, &run_id, &StartRequest::default());
            return admitted(client, format, call, watch).await;
        }
        RunCommand::Resume { run_id, watch } => {
            let run = client.find_run(&run_id).await?.data;
            let call = client.resume_run(&run.task_id, &run_id, &StartRequest::default());
            return admitted(client, format, call, watch).await;
        }
        RunCommand::Continue {
            run_id,
            prompt,
            watch,
        } => {
            let task_id = client.task_of("run", &run_id).await?;
            let request = ContinueRequest { prompt };
            let call = client.continue_run(&task_id, &run_id, &request);
            return admitted(client, format, call, watch).await;
        }
        RunCommand::RetryFromModelCall {
            run_id,
            model_call,
            reason,
            watch,
        } => {
            let task_id = client.task_of("run", &run_id).await?;
            let request = RetryFromModelCallRequest {
                model_call_index: model_call,
                reason,
            };
            let call = client.retry_from_model_call(&task_id, &run_id, &request);
            return admitted(client, format, call, watch).await;
        }
        RunCommand::Patches(command) => patches(client, format, command).await?,
        RunCommand::ClientStart {
            task_id,
            lease_ms,
            reason,
        } => {
            let request = ClientRunRequest { lease_ms, reason };
            output::show(format, client.start_client_run(&task_id, &request), |c| {
                Table::fields(&[
                    ("run", c.data.run.id.clone()),
                    ("status", c.data.run.status.to_string()),
                    ("lease token", c.data.lease_token.clone()),
                    ("lease expires", time(&c.data.lease_expires_at)),
                ])
            })
            .await?;
        }
        RunCommand::Append {
            run_id,
            token,
            events,
            steps,
            artifacts,
            finish,
            error,
        } => {
            let run = client.find_run(&run_id).await?.data;
            let mut request = append_request(token, &events, &steps, finish.as_deref(), error)?;
            request.artifacts = artifacts
                .iter()
                .map(|a| text_artifact(a))
                .collect::<Result<_, _>>()?;
            let call = client.append_run_events(&run.task_id, &run_id, &request);
            output::show(format, call, |a| {
                Table::fields(&[
                    ("run", a.data.run.id.clone()),
                    ("status", a.data.run.status.to_string()),
                    ("appended", a.data.appended.to_string()),
                    (
                        "lease expires",
                        or_dash(a.data.lease_expires_at.as_ref().map(time)),
                    ),
                ])
            })
            .await?;
        }
    }
    Ok(Outcome::Done)
}

async fn patches(client: &Client, format: Format, command: PatchCommand) -> Result<(), Error> {
    let fields = |p: &ObjectEnvelope<PatchDetail>| patch_fields(&p.data.summary);
    match command {
        PatchCommand::List { run_id, page } => {
            let task_id = client.task_of("run", &run_id).await?;
            let headers = ["ID", "STATUS", "BEFORE", "AFTER", "CREATED", "PATH"];
            let call = client.list_patches(&task_id, &run_id);
            output::list(format, &page, call, &headers, |p: &PatchSummary| {
                vec![
                    p.id.clone(),
                    p.status.clone(),
                    or_dash(p.before_bytes),
                    or_dash(p.after_bytes),
                    time(&p.created_at),
                    p.path.clone(),
                ]
            })
            .await
        }
        PatchCommand::Show { run_id, patch_id } => {
            let task_id = client.task_of("run", &run_id).await?;
            let call = client.get_patch(&task_id, &run_id, &patch_id);
            output::show(format, call, fields).await.map(drop)
        }
        PatchCommand::Revert { run_id, patch_id } => {
            change_patch(client, format, (run_id, patch_id), Client::revert_patch).await
        }
        PatchCommand::Apply { run_id, patch_id } => {
            change_patch(client, format, (run_id, patch_id), Client::apply_patch).await
        }
        PatchCommand::Discard { run_id, patch_id } => {
            change_patch(client, format, (run_id, patch_id), Client::discard_patch).await
        }
    }
}

/// Reverts, applies or discards a patch (`operation`, one of the client's).
async fn change_patch(
    client: &Client,
    format: Format,
    (run_id, patch_id): (String, String),
    operation: for<'a> fn(&'a Client, &str, &str, &str) -> Call<'a, ObjectEnvelope<PatchDetail>>,
) -> Result<(), Error> {
    let task_id = client.task_of("run", &run_id).await?;
    let call = operation(client, &task_id, &run_id, &patch_id);
    let fields = |p: &ObjectEnvelope<PatchDetail>| patch_fields(&p.data.summary);
    output::show(format, call, fields).await.map(drop)
}

fn patch_fields(p: &PatchSummary) -> Table {
    Table::fields(&[
        ("id", p.id.clone()),
        ("name", p.name.clone()),
        ("path", p.path.clone()),
        ("status", p.status.clone()),
        ("bytes before", or_dash(p.before_bytes)),
        ("bytes after", or_dash(p.after_bytes)),
        ("created", time(&p.created_at)),
    ])
}

/// A list whose cursor goes back in a parameter of its own (`after_sequence`, `after`):
/// `--cursor` is taken out of the page, for the caller to give the call.
fn cursor_given(mut page: PageArgs) -> (Option<String>, PageArgs) {
    (page.cursor.take(), page)
}

/// A list of events: a run's log or the workspace's feed.
async fn events(
    format: Format,
    page: &PageArgs,
    call: Call<'_, keel_client::ListEnvelope<EventRecord>>,
) -> Result<(), Error> {
    let headers = [
        "SEQUENCE",
        "TYPE",
        "AT",
        "RUN",
        "MEDIA JOB",
        "CURSOR",
        "DATA",
    ];
    output::list(format, page, call, &headers, |e: &EventRecord| {
        vec![
            e.sequence.to_string(),
            e.event_type.to_string(),
            time(&e.occurred_at),
            or_dash(e.run_id.as_ref()),
            or_dash(e.media_job_id.as_ref()),
            e.cursor.clone(),
            e.data.to_string(),
        ]
    })
    .await
}

async fn usage(client: &Client, format: Format, command: UsageCommand) -> Result<(), Error> {
    match command {
        UsageCommand::Summary { scope } => {
            let scope = scope
                .map(|s| {
                    Grouping::parse(&s).ok_or_else(|| {
                        Error::Usage(format!("--scope is {}, not '{s}'", Grouping::names()))
                    })
                })
                .transpose()?;
            output::show(format, client.usage_summary(scope), |u| {
                let mut table = Table::new(&["KEY", "CALLS", "PROMPT", "COMPLETION", "COST µUSD"]);
                let rows = u.data.rows.iter().map(|r| (r.key.as_str(), &r.totals));
                for (key, t) in std::iter::once(("total", &u.data.totals)).chain(rows) {
                    table.row(vec![
                        key.to_string(),
                        t.calls.to_string(),
                        t.prompt_tokens.to_string(),
                        t.completion_tokens.to_string(),
                        t.cost_micros_usd.to_string(),
                    ]);
                }
                table
            })
            .await
            .map(drop)
        }
        UsageCommand::Events { task, run, page } => {
            let headers = [
                "ID",
                "RUN",
                "PROVIDER",
                "MODEL",
                "PROMPT",
                "COMPLETION",
                "AT",
            ];
            let call = client
                .usage_events()
                .query("task_id", task)
                .query("run_id", run);
            output::list(format, &page, call, &headers, |e: &UsageEvent| {
                vec![
                    e.id.clone(),
                    e.run_id.clone(),
                    e.provider.clone(),
                    e.model.clone(),
                    e.prompt_tokens.to_string(),
                    e.completion_tokens.to_string(),
                    time(&e.created_at),
                ]
            })
            .await
        }
    }
}

/// A list of artifacts: a run's, a task's or a media job's.
async fn artifacts(
    format: Format,
    page: &PageArgs,
    call: Call<'_, keel_client::ListEnvelope<ArtifactRecord>>,
) -> Result<(), Error> {
    let headers = ["ID", "NAME", "KIND", "TYPE", "BYTES", "STATUS", "RUN"];
    output::list(format, page, call, &headers, |a: &ArtifactRecord| {
        vec![
            a.id.clone(),
            a.name.clone(),
            a.kind.to_string(),
            a.content_type.clone(),
            a.size_bytes.to_string(),
            a.status.to_string(),
            or_dash(a.run_id.as_ref()),
        ]
    })
    .await
}

async fn approvals(client: &Client, format: Format, command: ApprovalCommand) -> Result<(), Error> {
    let (approval_id, decision, note, continue_run) = match command {
        ApprovalCommand::List {
            status,
            task,
            run,
            page,
        } => {
            let headers = ["ID", "TASK", "RUN", "KIND", "STATUS", "ACTION"];
            let status = status.as_deref();
            let call = match (&task, &run) {
                (Some(task), _) => client.list_task_approvals(task, status),
                (None, Some(run)) => client.list_run_approvals(run, status),
                (None, None) => client.list_approvals(status),
            };
            return output::list(format, &page, call, &headers, |a: &ApprovalRecord| {
                vec![
                    a.id.clone(),
                    a.task_id.clone(),
                    a.run_id.clone(),
                    a.kind.clone(),
                    a.status.to_string(),
                    a.action_summary.join("; "),
                ]
            })
            .await;
        }
        ApprovalCommand::Show { approval_id } => {
            let task_id = client.task_of("approval", &approval_id).await?;
            let call = client.get_approval(&task_id, &approval_id);
            return output::show(format, call, |a| {
                let a = &a.data;
                Table::fields(&[
                    ("id", a.id.clone()),
                    ("task", a.task_id.clone()),
                    ("run", a.run_id.clone()),
                    ("kind", a.kind.clone()),
                    ("status", a.status.to_string()),
                    ("action", a.action_summary.join("; ")),
                ])
            })
            .await
            .map(drop);
        }
        ApprovalCommand::Approve { approval_id, note } => (approval_id, "approve", note, false),
        ApprovalCommand::Reject {
            approval_id,
            note,
            continue_run,
        } => (approval_id, "reject", note, continue_run),
    };
    let task_id = client.task_of("approval", &approval_id).await?;
    let request = ResolveRequest {
        decision: Some(decision.into()),
        note,
        continue_on_reject: continue_run.then_some(true),
    };
    output::show(
        format,
        client.resolve_approval(&task_id, &approval_id, &request),
        |r| {
            let (approval, run) = (&r.data.approval, &r.data.run);
            Table::fields(&[
                ("approval", approval.id.clone()),
                ("status", approval.status.to_string()),
                ("run", run.id.clone()),
                ("run status", run.status.to_string()),
            ])
        },
    )
    .await?;
    Ok(())
}

async fn schedules(client: &Client, format: Format, command: ScheduleCommand) -> Result<(), Error> {
    let fields = |s: &ObjectEnvelope<ScheduleRecord>| {
        let s = &s.data;
        Table::fields(&[
            ("id", s.id.clone()),
            ("task", s.task_id.clone()),
            ("kind", s.kind.clone()),
            ("cron", or_dash(s.cron_expression.as_ref())),
            ("run at", or_dash(s.run_at.as_ref().map(time))),
            ("timezone", s.timezone.clone()),
            ("enabled", s.enabled.to_string()),
            ("next run", or_dash(s.next_run_at.as_ref().map(time))),
            ("revision", s.revision.to_string()),
        ])
    };
    match command {
        ScheduleCommand::List {
            task,
            enabled,
            page,
        } => {
            let headers = ["ID", "TASK", "KIND", "ENABLED", "NEXT RUN", "WHEN"];
            let call = client.list_schedules(task.as_deref(), enabled);
            output::list(format, &page, call, &headers, |s: &ScheduleRecord| {
                let when = s.cron_expression.clone();
                vec![
                    s.id.clone(),
                    s.task_id.clone(),
                    s.kind.clone(),
                    s.enabled.to_string(),
                    or_dash(s.next_run_at.as_ref().map(time)),
                    or_dash(when.or_else(|| s.run_at.as_ref().map(time))),
                ]
            })
            .await?;
        }
        ScheduleCommand::Occurrences { task_id, page } => {
            let headers = ["ID", "SCHEDULED FOR", "STATUS", "RUN", "ERROR"];
            let call = client.list_occurrences(&task_id);
            output::list(format, &page, call, &headers, |o: &OccurrenceRecord| {
                vec![
                    o.id.clone(),
                    time(&o.scheduled_for),
                    o.status.to_string(),
                    or_dash(o.run_id.as_ref()),
                    or_dash(o.error.as_ref()),
                ]
            })
            .await?;
        }
        ScheduleCommand::Show { task_id } => {
            output::show(format, client.get_schedule(&task_id), fields).await?;
        }
        ScheduleCommand::Set {
            task_id,
            cron,
            at,
            timezone,
            disabled,
            revision,
        } => {
            let draft = ScheduleDraft {
                kind: Some(if cron.is_some() { "cron" } else { "once" }.into()),
                timezone: Some(timezone),
                enabled: Some(!disabled),
                run_at: at,
                cron_expression: cron,
                revision,
            };
            output::show(format, client.put_schedule(&task_id, &draft), fields).await?;
        }
        ScheduleCommand::Delete { task_id } => {
            client.delete_schedule(&task_id).await?;
            if format == Format::Table {
                println!("deleted the schedule of {task_id}");
            }
        }
    }
    Ok(())
}

async fn media(client: &Client, format: Format, command: MediaCommand) -> Result<Outcome, Error> {
    let fields = |j: &ObjectEnvelope<MediaJobRecord>| media_fields(&j.data);
    match command {
        MediaCommand::Create {
            provider,
            operation,
            prompt,
            input,
            quiet,
            no_run,
            watch,
        } => {
            let input = serde_json::from_str(&input)
                .map_err(|e| Error::Usage(format!("--input must be a JSON object: {e}")))?;
            let draft = MediaJobDraft {
                provider_id: provider,
                operation,
                prompt,
                input,
            };
            // What is printed is the last answer: the job as created, or as queued to run.
            let create = client.create_media_job(&draft);
            let job = if no_run {
                print_job(format, quiet, create).await?
            } else {
                let id = create.await?.data.id;
                print_job(format, quiet, client.run_media_job(&id)).await?
            };
            if watch {
                return watch::media(client, format, &job.id, quiet).await;
            }
        }
        MediaCommand::Show { media_job_id } => {
            output::show(format, client.get_media_job(&media_job_id), fields).await?;
        }
        MediaCommand::Watch { media_job_id } => {
            return watch::media(client, format, &media_job_id, false).await;
        }
        MediaCommand::Content {
            media_job_id,
            artifact_id,
        } => {
            use futures_util::TryStreamExt;
            use std::io::Write;
            let call = client.media_artifact_content(&media_job_id, &artifact_id);
            let mut chunks = std::pin::pin!(call.bytes_stream().await?);
            let mut stdout = std::io::stdout().lock();
            while let Some(chunk) = chunks.try_next().await? {
                stdout
                    .write_all(&chunk)
                    .map_err(|e| Error::Usage(format!("writing stdout: {e}")))?;
            }
            stdout
                .flush()
                .map_err(|e| Error::Usage(format!("writing stdout: {e}")))?;
        }
        MediaCommand::Artifacts { media_job_id, page } => {
            artifacts(format, &page, client.list_media_artifacts(&media_job_id)).await?;
        }
        MediaCommand::List {
            status,
            provider,
            page,
        } => {
            let headers = ["ID", "PROVIDER", "OPERATION", "STATUS", "CREATED"];
            let call = client.list_media_jobs(status.as_deref(), provider.as_deref());
            output::list(format, &page, call, &headers, |j: &MediaJobRecord| {
                vec![
                    j.id.clone(),
                    j.provider_id.clone(),
                    j.operation.clone(),
                    j.status.to_string(),
                    time(&j.created_at),
                ]
            })
            .await?;
        }
        MediaCommand::Cancel { media_job_id } => {
            output::show(format, client.cancel_media_job(&media_job_id), fields).await?;
        }
    }
    Ok(Outcome::Done)
}

/// A media job answer: its id alone with `quiet`, else shown.
async fn print_job(
    format: Format,
    quiet: bool,
    call: Call<'_, ObjectEnvelope<MediaJobRecord>>,
) -> Result<MediaJobRecord, Error> {
    let id = |j: &ObjectEnvelope<MediaJobRecord>| j.data.id.clone();
    let job = output::show_or_id(format, quiet, call, id, |j| media_fields(&j.data)).await?;
    Ok(job.data)
}

async fn providers(client: &Client, format: Format, command: ProviderCommand) -> Result<(), Error> {
    match command {
        ProviderCommand::List { page } => {
            let headers = ["ID", "KIND", "API", "MODEL", "ENABLED", "KEY", "NAME"];
            output::list(
                format,
                &page,
                client.list_providers(),
                &headers,
                |p: &ProviderView| {
                    let cells = [&p.id, &p.kind, &p.api, &p.model];
                    let mut row: Vec<String> = cells.into_iter().cloned().collect();
                    let key = if p.api_key_configured {
                        "configured"
                    } else {
                        "missing"
                    };
                    row.extend([p.enabled.to_string(), key.into(), p.display_name.clone()]);
                    row
                },
            )
            .await
        }
        ProviderCommand::Show { id } => output::show(format, client.get_provider(&id), |p| {
            provider_fields(&p.data)
        })
        .await
        .map(drop),
        ProviderCommand::Create(args) => {
            let quiet = args.quiet;
            let draft = args.draft();
            let call = client.create_provider(&draft);
            output::show_or_id(
                format,
                quiet,
                call,
                |p| p.data.id.clone(),
                |p| provider_fields(&p.data),
            )
            .await
            .map(drop)
        }
        ProviderCommand::Templates { page } => {
            let headers = ["TEMPLATE", "KIND", "API", "MODEL", "NAME"];
            output::list(
                format,
                &page,
                client.list_templates(),
                &headers,
                |t: &ProviderTemplate| {
                    let cells = [&t.template_id, &t.kind, &t.api, &t.model, &t.display_name];
                    cells.into_iter().map(|c| c.to_string()).collect()
                },
            )
            .await
        }
        ProviderCommand::Update(args) => {
            let call = client.patch_provider(&args.id, &args.patch());
            output::show(format, call, |p| provider_fields(&p.data))
                .await
                .map(drop)
        }
        ProviderCommand::Delete { id } => {
            client.delete_provider(&id).await?;
            if format == Format::Table {
                println!("deleted the provider preset {id}");
            }
            Ok(())
        }
        ProviderCommand::Check { id, live } => {
            output::show(format, client.check_provider(&id, live), |c| {
                let c = &c.data;
                Table::fields(&[
                    ("ok", c.ok.to_string()),
                    ("code", c.code.clone()),
                    ("message", c.message.clone()),
                    ("live", c.live.to_string()),
                    ("checked at", time(&c.checked_at)),
                ])
            })
            .await
            .map(drop)
        }
    }
}

/// `keel console`: the console's sign-in link on stdout (for `xdg-open "$(keel console)"`),
/// or with `--output json` the API's answer, its code, as sent.
async fn console(client: &Client, format: Format) -> Result<(), Error> {
    let (answer, raw) = client.console_sign_in_code().fetch().await?;
    if format == Format::Json {
        output::print_raw(&raw);
        return Ok(());
    }
    println!("{}/console#sign-in={}", client.base_url(), answer.data.code);
    eprintln!(
        "Open it in a browser before {} UTC: it signs in once.",
        time(&answer.data.expires_at)
    );
    Ok(())
}

async fn status(client: &Client, format: Format) -> Result<(), Error> {
    output::show(format, client.system_stats(), |stats| {
        let stats = &stats.data;
        let mut fields = vec![
            ("version".to_string(), stats.version.clone()),
            ("live workers".into(), stats.workers.live.to_string()),
            ("active leases".into(), stats.active_leases.to_string()),
        ];
        for kind in &stats.queue {
            let oldest = kind
                .oldest_age_ms
                .map(|ms| format!("{:.1}s", ms as f64 / 1000.0));
            let figures = format!(
                "depth {}, ready {}, leased {}, oldest ready {}",
                kind.depth,
                kind.ready,
                kind.leased,
                or_dash(oldest)
            );
            fields.push((format!("queue {}", kind.kind), figures));
        }
        Table::fields(&fields)
    })
    .await
    .map(drop)
}

fn task_fields(t: &TaskRecord) -> Table {
    Table::fields(&[
        ("id", t.id.clone()),
        ("kind", t.execution_kind.clone()),
        ("status", t.status.to_string()),
        ("shell", or_dash(t.shell_command.as_ref())),
        ("git", or_dash(t.git_command.as_ref())),
        ("file", or_dash(t.file_path.as_ref())),
        ("prompt", or_dash(t.prompt.as_ref())),
        ("runs", t.run_count.to_string()),
        ("latest run", or_dash(t.latest_run_id.as_ref())),
        ("created", time(&t.created_at)),
    ])
}

fn run_fields(r: &RunRecord) -> Table {
    Table::fields(&[
        ("id", r.id.clone()),
        ("task", r.task_id.clone()),
        ("number", r.number.to_string()),
        ("status", r.status.to_string()),
        ("attempt", r.attempt.to_string()),
        ("exit code", or_dash(r.exit_code)),
        ("error", or_dash(r.last_error.as_ref())),
        ("created", time(&r.created_at)),
        ("started", or_dash(r.started_at.as_ref().map(time))),
        ("finished", or_dash(r.finished_at.as_ref().map(time))),
    ])
}

fn media_fields(j: &MediaJobRecord) -> Table {
    Table::fields(&[
        ("id", j.id.clone()),
        ("provider", j.provider_id.clone()),
        ("operation", j.operation.clone()),
        ("status", j.status.to_string()),
        ("attempt", j.attempt.to_string()),
        ("error", or_dash(j.last_error.as_ref())),
        ("artifacts", j.artifact_ids.join(", ")),
        ("created", time(&j.created_at)),
    ])
}

/// A preset's fields: its secret by reference and whether it resolves, never a value.
fn provider_fields(p: &ProviderView) -> Table {
    Table::fields(&[
        ("id", p.id.clone()),
        ("name", p.display_name.clone()),
        ("kind", p.kind.clone()),
        ("api", p.api.clone()),
        ("base url", p.base_url.clone()),
        ("model", p.model.clone()),
        ("capabilities", p.capabilities.join(", ")),
        ("enabled", p.enabled.to_string()),
        ("key ref", or_dash(p.api_key_ref.as_ref())),
        ("key configured", p.api_key_configured.to_string()),
    ])
}

async fn workspace(
    client: &Client,
    format: Format,
    command: WorkspaceCommand,
) -> Result<Outcome, Error> {
    let limits = |l: &ObjectEnvelope<WorkspaceLimits>| {
        let l = &l.data;
        Table::fields(&[
            ("workspace", l.workspace_id.clone()),
            ("max concurrent", or_dash(l.max_concurrent)),
            ("updated", or_dash(l.updated_at.as_ref().map(time))),
            ("updated by", or_dash(l.updated_by.as_ref())),
        ])
    };
    let call = match command {
        WorkspaceCommand::Show { workspace_id: None } => client.own_limits(),
        WorkspaceCommand::Show {
            workspace_id: Some(id),
        } => client.get_limits(&id),
        WorkspaceCommand::SetLimits {
            workspace_id,
            max_concurrent,
            default: _,
        } => client.put_limits(&workspace_id, &LimitsRequest { max_concurrent }),
        WorkspaceCommand::Policy { workspace_id } => {
            return show_policy(format, client.get_policy(&workspace_id)).await;
        }
        WorkspaceCommand::SetPolicy {
            workspace_id,
            gates,
            mcp_servers,
            write_paths,
            write_anywhere,
        } => {
            let current = client.get_policy(&workspace_id).send().await?.data;
            let request =
                policy_change(current, &gates, &mcp_servers, write_paths, write_anywhere)?;
            return show_policy(format, client.put_policy(&workspace_id, &request)).await;
        }
        WorkspaceCommand::ResetPolicy { workspace_id } => {
            return show_policy(format, client.delete_policy(&workspace_id)).await;
        }
    };
    output::show(format, call, limits)
        .await
        .map(|_| Outcome::Done)
}

async fn show_policy(
    format: Format,
    call: Call<'_, ObjectEnvelope<ApprovalPolicyRecord>>,
) -> Result<Outcome, Error> {
    output::show(format, call, |p| {
        let p = &p.data;
        let g = &p.gates;
        let servers: Vec<String> = p
            .mcp_servers
            .iter()
            .map(|(s, d)| format!("{s}={d}"))
            .collect();
        Table::fields(&[
            ("workspace", p.workspace_id.clone()),
            ("source", p.source.to_string()),
            ("shell_exec", g.shell_exec.to_string()),
            ("git_exec", g.git_exec.to_string()),
            ("file_write", g.file_write.to_string()),
            ("network_egress", g.network_egress.to_string()),
            ("read_file", g.read_file.to_string()),
            ("all_tools", g.all_tools.to_string()),
            (
                "mcp servers",
                or_dash((!servers.is_empty()).then(|| servers.join(", "))),
            ),
            (
                "write paths",
                or_dash(p.allowed_write_paths.as_ref().map(|w| w.join(", "))),
            ),
            ("updated", or_dash(p.updated_at.as_ref().map(time))),
            ("updated by", or_dash(p.updated_by.as_ref())),
        ])
    })
    .await
    .map(|_| Outcome::Done)
}

/// The policy in force with the command's changes: `--gate` and `--mcp` pairs, and the
/// write paths replaced or lifted.
fn policy_change(
    current: ApprovalPolicyRecord,
    gates: &[String],
    mcp_servers: &[String],
    write_paths: Vec<String>,
    write_anywhere: bool,
) -> Result<ApprovalPolicyRequest, Error> {
    let mut request = ApprovalPolicyRequest {
        gates: current.gates,
        mcp_servers: current.mcp_servers,
        allowed_write_paths: current.allowed_write_paths,
    };
    for pair in gates {
        let (gate, decision) = decision_pair("--gate", pair)?;
        let g = &mut request.gates;
        let slot = match gate {
            "shell_exec" => &mut g.shell_exec,
            "git_exec" => &mut g.git_exec,
            "file_write" => &mut g.file_write,
            "network_egress" => &mut g.network_egress,
            "read_file" => &mut g.read_file,
            "all_tools" => &mut g.all_tools,
            other => {
                return Err(Error::Usage(format!(
                    "--gate {other}: the gates are shell_exec, git_exec, file_write, \
                     network_egress, read_file and all_tools"
                )));
            }
        };
        *slot = decision;
    }
    for pair in mcp_servers {
        let (server, decision) = decision_pair("--mcp", pair)?;
        request.mcp_servers.insert(server.to_string(), decision);
    }
    if write_anywhere {
        request.allowed_write_paths = None;
    } else if !write_paths.is_empty() {
        request.allowed_write_paths = Some(write_paths);
    }
    Ok(request)
}

/// `NAME=DECISION`, read.
fn decision_pair<'a>(option: &str, pair: &'a str) -> Result<(&'a str, GateDecision), Error> {
    let usage = |what: String| Error::Usage(format!("{option} {pair}: {what}"));
    let (name, decision) = pair
        .split_once('=')
        .ok_or_else(|| usage("expected NAME=DECISION".into()))?;
    let decision = GateDecision::parse(decision)
        .ok_or_else(|| usage(format!("the decision is {}", GateDecision::names())))?;
    Ok((name, decision))
}

/// An append's body from the command's options: `NAME[=JSON]` pairs become events and
/// completed steps.
fn append_request(
    lease_token: String,
    events: &[String],
    steps: &[String],
    finish: Option<&str>,
    error: Option<String>,
) -> Result<RunEventsRequest, Error> {
    let named = |option: &str, pair: &str| -> Result<(String, serde_json::Value), Error> {
        let (name, json) = pair.split_once('=').unwrap_or((pair, "{}"));
        let value = serde_json::from_str(json)
            .map_err(|e| Error::Usage(format!("{option} {pair}: not JSON: {e}")))?;
        Ok((name.to_string(), value))
    };
    let events = events
        .iter()
        .map(|pair| named("--event", pair).map(|(kind, data)| ClientEvent { kind, data }))
        .collect::<Result<_, _>>()?;
    let steps = steps
        .iter()
        .map(|pair| {
            named("--step", pair).map(|(name, output)| ClientStep {
                name,
                status: ClientOutcome::Completed,
                input: serde_json::json!({}),
                output: Some(output),
                error: None,
            })
        })
        .collect::<Result<_, _>>()?;
    let finish = match finish {
        None => None,
        Some("completed") => Some(ClientOutcome::Completed),
        Some("failed") => Some(ClientOutcome::Failed),
        Some(other) => {
            return Err(Error::Usage(format!(
                "--finish {other}: completed or failed"
            )));
        }
    };
    Ok(RunEventsRequest {
        lease_token,
        events,
        steps,
        artifacts: Vec::new(),
        finish: finish.map(|status| ClientFinish { status, error }),
    })
}

/// `NAME=PATH`: a text artifact with the file's content.
fn text_artifact(pair: &str) -> Result<ClientArtifact, Error> {
    let usage = |what: String| Error::Usage(format!("--artifact {pair}: {what}"));
    let (name, path) = pair
        .split_once('=')
        .ok_or_else(|| usage("expected NAME=PATH".into()))?;
    let text = std::fs::read_to_string(path).map_err(|e| usage(format!("cannot read it: {e}")))?;
    Ok(ClientArtifact {
        name: name.to_string(),
        content_type: None,
        text,
    })
}
