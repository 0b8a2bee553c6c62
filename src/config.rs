//! Configuration: every setting is a flag with a `KEEL_*` environment variable, documented
//! by its doc comment (which is also its `--help` text). See docs/configuration.md.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use clap::builder::BoolishValueParser;
use keel_workers::agent::provider::ChatLimits;
use keel_workers::media::MediaLimits;
use keel_workers::{EgressRules, RunLimits, SandboxMode, SandboxSettings};
use object_store::aws::AmazonS3Builder;

use crate::approvals::{ApprovalPolicy, DEFAULT_POLICIES};
use crate::artifacts::content::{ContentStore, S3Settings};
use crate::providers::ProviderHosts;
use crate::providers::secrets::{DEFAULT_ENV_ALLOW, DEFAULT_FILE_ROOTS, SecretPolicy};
use crate::queue::worker::{LeaseTiming, WorkerSettings};
use crate::quotas::{
    REMOTE_RUN_MAX_STORED_BYTES, REMOTE_WORKSPACE_MAX_STORED_BYTES, StorageQuotas,
};
use crate::runs::AdmissionRules;
use crate::runs::client::REMOTE_CLIENT_LEASE_MAX_MS;
use crate::tasks::{RunTimeouts, StdioCommands, WorkspaceRoots};
use crate::telemetry::LogFormat;

/// The settings of the server roles (`keel serve|api|worker|migrate`, `keel-bench`), not of
/// the operator commands, which only talk to an API. `global` serves `keel-bench`, which
/// takes them before or after its subcommand.
#[derive(Debug, Clone, Args)]
pub struct Common {
    /// PostgreSQL URL (also read from DATABASE_URL). `keel serve` without one starts a
    /// private cluster under the data directory.
    #[arg(long, env = "KEEL_DATABASE_URL", global = true, hide_env_values = true)]
    pub database_url: Option<String>,

    /// Directory for Keel's local state: ephemeral run workspaces and the embedded cluster.
    #[arg(long, env = "KEEL_DATA_DIR", default_value = ".keel", global = true)]
    pub data_dir: PathBuf,

    #[command(flatten)]
    pub log: LogArgs,

    /// Most database connections this process opens.
    #[arg(
        long,
        env = "KEEL_DB_MAX_CONNECTIONS",
        default_value_t = 16,
        global = true
    )]
    pub db_max_connections: u32,

    /// Runs that wait for an operator's approval before they are queued: a comma list of
    /// shell_exec, git_exec, file_write, network_egress, all_tools; empty or `none` gates
    /// nothing.
    #[arg(long, env = "KEEL_APPROVAL_POLICIES", default_value = DEFAULT_POLICIES, global = true)]
    pub approval_policies: ApprovalPolicy,

    /// Agent loop model prices: a JSON object from model name (as the provider reports it)
    /// to `{"input_usd_per_mtok", "output_usd_per_mtok", "cached_input_usd_per_mtok"?}`.
    /// Empty: no prices (calls record tokens, their cost stays null). Invalid JSON stops
    /// start-up.
    #[arg(
        long,
        env = "KEEL_MODEL_PRICES",
        default_value = "",
        global = true,
        hide_env_values = true
    )]
    pub model_prices: crate::agent::prices::PriceTable,

    /// Agent loops: the operator's system prompt, the first of the three layers (this, the
    /// workspace's AGENTS.md and CLAUDE.md, the task's system_prompt). Empty: none.
    #[arg(
        long,
        env = "KEEL_AGENT_SYSTEM_PROMPT",
        default_value = "",
        global = true
    )]
    pub agent_system_prompt: String,

    /// How long one call of an MCP server's tool may take (ms) before the model reads a
    /// timeout as its result; never longer than the run's own timeout.
    #[arg(long, env = "KEEL_MCP_CALL_TIMEOUT_MS", default_value_t = 60_000, global = true,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub mcp_call_timeout_ms: u64,

    /// How long an attempt's MCP servers have, all of them together (they start at once),
    /// to start and list their tools (ms); a server not up by then is left out.
    #[arg(long, env = "KEEL_MCP_CONNECT_TIMEOUT_MS", default_value_t = 30_000, global = true,
          value_parser = clap::value_parser!(u64).range(1..))]
    pub mcp_connect_timeout_ms: u64,

    /// The programs (a comma list, each exactly as a task's `command` names it) a member's
    /// task may start as stdio MCP servers; an operator's task may name any. Unset: only an
    /// operator's task names a stdio server. A member chooses the arguments: list no shell
    /// or interpreter.
    #[arg(
        long,
        env = "KEEL_MCP_STDIO_COMMANDS",
        value_delimiter = ',',
        global = true
    )]
    pub mcp_stdio_commands: Vec<String>,

    /// How long an approval stays actionable (ms); 0 keeps it until it is resolved.
    #[arg(long, env = "KEEL_APPROVAL_TTL_MS", default_value_t = 0, global = true)]
    pub approval_ttl_ms: u64,

    /// Directories (a comma list) `in_place` tasks may work beneath, compared after
    /// resolving symbolic links; the data directory is always refused. Unset: `in_place`
    /// is refused.
    #[arg(
        long,
        env = "KEEL_WORKSPACE_ROOTS",
        value_delimiter = ',',
        global = true
    )]
    pub workspace_roots: Vec<PathBuf>,

    /// How long an ephemeral workspace is kept after its run ends (ms), so the run can be
    /// resumed; then each worker's maintenance removes it from its own data directory.
    #[arg(long, env = "KEEL_WORKSPACE_RETENTION_MS", default_value_t = 24 * 3600 * 1000,
          global = true)]
    pub workspace_retention_ms: u64,

    #[command(flatten)]
    pub content: ContentArgs,

    #[command(flatten)]
    pub timeouts: TimeoutArgs,

    #[command(flatten)]
    pub secrets: SecretArgs,

    #[command(flatten)]
    pub chat: ChatArgs,

    #[command(flatten)]
    pub sandbox: SandboxArgs,

    #[command(flatten)]
    pub quotas: QuotaArgs,

    /// Hosts a media preset's `base_url` may name beside the vendor's documented ones
    /// (api.openai.com; ark.ap-southeast.bytepluses.com, ark.cn-beijing.volces.com), and
    /// the only hosts besides the chat APIs' (api.openai.com, api.anthropic.com) a tenant's
    /// chat preset or MCP server may aim at: a comma list of host names or IP addresses,
    /// with an optional port, checked when a preset or task is written and before each use.
    #[arg(
        long,
        env = "KEEL_PROVIDER_HOSTS",
        value_delimiter = ',',
        global = true
    )]
    pub provider_hosts: Vec<String>,
}

/// How runs, hooks and agent tool processes are confined (docs/operations.md, "The run
/// sandbox").
#[derive(Debug, Clone, Args)]
pub struct SandboxArgs {
    /// `auto` (`isolated` when the process runs as root, else `namespaces`), `isolated`
    /// (each attempt a uid of its own, in bubblewrap's user, PID, mount, IPC, UTS and
    /// cgroup namespaces), `namespaces` (the namespaces, the worker's uid outside them) or
    /// `off` (no namespaces; refused in remote mode).
    #[arg(long, env = "KEEL_SANDBOX", default_value = "auto", value_parser = SandboxMode::parse,
          global = true)]
    pub sandbox: SandboxMode,

    /// The bubblewrap binary.
    #[arg(
        long,
        env = "KEEL_SANDBOX_BWRAP",
        default_value = "bwrap",
        global = true
    )]
    pub sandbox_bwrap: PathBuf,

    /// The uids `isolated` attempts run as, `FIRST-LAST`: one attempt holds one at a time,
    /// across every Keel process of the host. None of them may be a user's.
    #[arg(long, env = "KEEL_SANDBOX_UIDS", default_value = "1900000000-1900009999",
          value_parser = parse_uid_range, global = true)]
    pub sandbox_uids: std::ops::RangeInclusive<u32>,

    /// The directory that holds a lock per sandbox uid in use, which only the worker's uid
    /// may enter: workers that share a host (and `KEEL_SANDBOX_UIDS`) must share it.
    #[arg(long, env = "KEEL_SANDBOX_UID_LOCKS", default_value = keel_workers::DEFAULT_SANDBOX_UID_LOCKS,
          global = true)]
    pub sandbox_uid_locks: PathBuf,

    /// Directories (a comma list) attempts see read-only beside the system's (`/usr`,
    /// `/etc`, `/opt`): toolchains installed elsewhere, for example.
    #[arg(
        long,
        env = "KEEL_SANDBOX_READ_ONLY_PATHS",
        value_delimiter = ',',
        global = true
    )]
    pub sandbox_read_only_paths: Vec<PathBuf>,

    /// Hosts (a comma list of `host` or `host:port`, a name or an IP literal) runs may
    /// reach through the egress proxy although they are not public: an internal mirror,
    /// say. `WORKSPACE=host[:port]` lets only that workspace's runs reach it. Every other
    /// destination must resolve to public addresses.
    #[arg(
        long,
        env = "KEEL_SANDBOX_EGRESS_ALLOW",
        value_delimiter = ',',
        global = true
    )]
    pub sandbox_egress_allow: Vec<String>,

    /// The binary a run's processes with network start behind, inside the sandbox (the
    /// shim that carries their connections to the egress proxy): `keel-sandbox-shim`, or
    /// `keel` itself. Unset: the `keel-sandbox-shim` beside this process's binary, else this
    /// process's own binary. The sandbox's uids must be able to read it.
    #[arg(long, env = "KEEL_SANDBOX_SHIM", global = true)]
    pub sandbox_shim: Option<PathBuf>,

    /// Processes and threads each attempt may have at once (cgroup `pids.max`).
    #[arg(long, env = "KEEL_SANDBOX_PIDS", default_value_t = keel_workers::DEFAULT_RUN_LIMITS.pids,
          value_parser = clap::value_parser!(u64).range(keel_workers::MIN_PIDS..),
          global = true)]
    pub sandbox_pids: u64,

    /// Memory each attempt may use, without swap: bytes, or `512M`, `2G` (cgroup
    /// `memory.max`); over it, the kernel's OOM killer ends its processes.
    #[arg(long, env = "KEEL_SANDBOX_MEMORY", default_value_t = keel_workers::DEFAULT_RUN_LIMITS.memory,
          value_parser = keel_workers::parse_memory, global = true)]
    pub sandbox_memory: u64,

    /// Open files each process of an attempt may have (`RLIMIT_NOFILE`).
    #[arg(long, env = "KEEL_SANDBOX_NOFILE", default_value_t = keel_workers::DEFAULT_RUN_LIMITS.nofile,
          value_parser = clap::value_parser!(u64).range(keel_workers::MIN_NOFILE..),
          global = true)]
    pub sandbox_nofile: u64,
}

impl SandboxArgs {
    /// The sandbox's settings; `off` is refused when the deployment is remote (tenants share
    /// its workers), whichever role this process has, and a remote worker must hold runs
    /// to their limits.
    pub fn settings(&self) -> Result<SandboxSettings, String> {
        let remote = remote_deployment();
        if self.sandbox == SandboxMode::Off && remote {
            return Err(
                "KEEL_SANDBOX=off is refused in remote mode: tenants share the workers, \
                        and without the sandbox a run reads the worker's secrets and other \
                        tenants' files"
                    .into(),
            );
        }
        Ok(SandboxSettings {
            mode: self.sandbox,
            bwrap: self.sandbox_bwrap.clone(),
            uids: self.sandbox_uids.clone(),
            uid_locks: self.sandbox_uid_locks.clone(),
            read_only_paths: self.sandbox_read_only_paths.clone(),
            shim: self.sandbox_shim.clone().or_else(default_shim),
            egress: EgressRules::parse(&self.sandbox_egress_allow)?,
            limits: RunLimits {
                pids: self.sandbox_pids,
                memory: self.sandbox_memory,
                nofile: self.sandbox_nofile,
            },
            require_limits: remote,
        })
    }
}

/// Whether the deployment is remote (`KEEL_REMOTE_MODE`), whichever role this process has:
/// read as clap's boolish parser reads it for the API, since a worker has no such flag.
fn remote_deployment() -> bool {
    keel_workers::seal::var("KEEL_REMOTE_MODE").is_some_and(|value| {
        ["y", "yes", "t", "true", "on", "1"].contains(&value.to_ascii_lowercase().as_str())
    })
}

/// What one run and one workspace may store, and how long a client may hold its run
/// (docs/configuration.md#quotas-serve-api-worker). The API (client appends) and the workers (outputs,
/// steps, files, media) read the same settings. Unset: the remote default in remote mode,
/// none in local mode; 0: none.
#[derive(Debug, Clone, Default, Args)]
pub struct QuotaArgs {
    /// Most bytes one run may store: its artifacts, its steps' input and output, its
    /// client's events. Past it, a worker's run fails (`storage_quota_exceeded`) and a
    /// client's append is refused (413). Unset: 1 GiB in remote mode, none in local mode;
    /// 0: none.
    #[arg(long, env = "KEEL_RUN_MAX_STORED_BYTES", global = true)]
    pub run_max_stored_bytes: Option<u64>,

    /// Most bytes one workspace may store, over all its runs and media jobs. Past it, new
    /// writes are refused as a run's are. Unset: 100 GiB in remote mode, none in local
    /// mode; 0: none.
    #[arg(long, env = "KEEL_WORKSPACE_MAX_STORED_BYTES", global = true)]
    pub workspace_max_stored_bytes: Option<u64>,

    /// Longest a client may hold a client-orchestrated run (ms from its start): appends
    /// renew its lease up to this and no further, then the run fails
    /// (`client_lease_max_reached`). Unset: 24 hours in remote mode, none in local mode; 0:
    /// none.
    #[arg(long, env = "KEEL_CLIENT_LEASE_MAX_MS", global = true)]
    pub client_lease_max_ms: Option<u64>,
}

impl QuotaArgs {
    pub fn storage(&self) -> StorageQuotas {
        StorageQuotas {
            run: quota(self.run_max_stored_bytes, REMOTE_RUN_MAX_STORED_BYTES),
            workspace: quota(
                self.workspace_max_stored_bytes,
                REMOTE_WORKSPACE_MAX_STORED_BYTES,
            ),
        }
    }

    pub fn client_lease_max(&self) -> Option<Duration> {
        quota(self.client_lease_max_ms, REMOTE_CLIENT_LEASE_MAX_MS).map(Duration::from_millis)
    }
}

/// A quota as set (0: none), or when unset its remote default in remote mode.
fn quota(set: Option<u64>, remote_default: u64) -> Option<u64> {
    match set {
        Some(0) => None,
        Some(limit) => Some(limit),
        None => remote_deployment().then_some(remote_default),
    }
}

fn parse_uid_range(value: &str) -> Result<std::ops::RangeInclusive<u32>, String> {
    let (first, last) = value
        .split_once('-')
        .ok_or_else(|| format!("{value:?} is not FIRST-LAST"))?;
    let number = |n: &str| {
        n.trim()
            .parse::<u32>()
            .map_err(|e| format!("{n:?} in {value:?}: {e}"))
    };
    let (first, last) = (number(first)?, number(last)?);
    if first == 0 || first > last {
        return Err(format!(
            "{value:?} must be FIRST-LAST with 0 < FIRST <= LAST"
        ));
    }
    Ok(first..=last)
}

/// How a process logs: part of [`Common`], and of `keel rpc`, a client that logs too.
#[derive(Debug, Clone, Args)]
pub struct LogArgs {
    /// Log format.
    #[arg(
        long,
        env = "KEEL_LOG_FORMAT",
        value_enum,
        default_value = "text",
        global = true
    )]
    pub log_format: LogFormat,
}

impl Common {
    pub fn provider_hosts(&self) -> ProviderHosts {
        ProviderHosts::new(self.provider_hosts.iter().cloned())
    }

    /// The rules every run-creating path applies (start, retry, resume, schedules), and
    /// task creation the ones of a task's writer.
    /// Fails on inconsistent run timeouts or a workspace root that does not exist.
    pub fn admission_rules(&self) -> Result<AdmissionRules, String> {
        Ok(AdmissionRules {
            approvals: self.approval_policies.clone(),
            policies: Default::default(),
            approval_ttl: (self.approval_ttl_ms > 0)
                .then(|| Duration::from_millis(self.approval_ttl_ms)),
            timeouts: self.timeouts.timeouts()?,
            workspace_roots: WorkspaceRoots::new(&self.workspace_roots, &self.data_dir)?,
            mcp_stdio_commands: StdioCommands::new(&self.mcp_stdio_commands),
            client_lease_max: self.quotas.client_lease_max(),
        })
    }

    /// The database URL from the flag, KEEL_DATABASE_URL or DATABASE_URL, in that order.
    pub fn database_url(&self) -> Option<String> {
        self.database_url
            .clone()
            .or_else(|| keel_workers::seal::var("DATABASE_URL"))
            .filter(|u| !u.is_empty())
    }
}

/// How long runs may take. The API (which refuses a longer timeout) and the workers (which
/// apply both to every run) read the same settings.
#[derive(Debug, Clone, Args)]
pub struct TimeoutArgs {
    /// Timeout of a run whose task sets none (ms); recorded on the task at creation.
    #[arg(long, env = "KEEL_RUN_TIMEOUT_MS", default_value_t = RunTimeouts::DEFAULT_MS, global = true)]
    pub run_timeout_ms: u64,

    /// Longest timeout a task may ask for (ms); a task asking for more is refused (422).
    #[arg(long, env = "KEEL_RUN_TIMEOUT_MAX_MS", default_value_t = RunTimeouts::DEFAULT_MAX_MS,
          global = true)]
    pub run_timeout_max_ms: u64,
}

impl Default for TimeoutArgs {
    fn default() -> Self {
        TimeoutArgs {
            run_timeout_ms: RunTimeouts::DEFAULT_MS,
            run_timeout_max_ms: RunTimeouts::DEFAULT_MAX_MS,
        }
    }
}

impl TimeoutArgs {
    pub fn timeouts(&self) -> Result<RunTimeouts, String> {
        RunTimeouts::new(self.run_timeout_ms, self.run_timeout_max_ms)
    }
}

/// Where artifact bytes are kept. Every process that writes or reads artifacts (workers and
/// APIs) needs the same settings; the S3 credentials come from the standard
/// `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY` (/ `AWS_SESSION_TOKEN`) environment, never
/// from a flag, so they cannot show up in a process list or in this struct's Debug output.
#[derive(Debug, Clone, Default, Args)]
pub struct ContentArgs {
    /// Where new artifact bytes go: `postgres` (chunks in the database) or `s3` (objects in
    /// an S3-compatible bucket, KEEL_S3_*). Existing artifacts stay readable from where
    /// they were written.
    #[arg(
        long,
        env = "KEEL_CONTENT_STORE",
        value_enum,
        default_value = "postgres",
        global = true
    )]
    pub content_store: ContentStoreKind,

    /// Bucket of the S3 content store (required with `--content-store s3`).
    #[arg(long, env = "KEEL_S3_BUCKET", global = true)]
    pub s3_bucket: Option<String>,

    /// Key prefix inside the bucket; objects go under `<prefix>/artifacts/`.
    #[arg(long, env = "KEEL_S3_PREFIX", global = true)]
    pub s3_prefix: Option<String>,

    /// Endpoint URL of an S3-compatible service (MinIO, R2, …); AWS when unset. Requests
    /// are path-style (`<endpoint>/<bucket>/<key>`).
    #[arg(long, env = "KEEL_S3_ENDPOINT", global = true)]
    pub s3_endpoint: Option<String>,

    /// Region of the bucket (AWS_REGION, then us-east-1, when unset).
    #[arg(long, env = "KEEL_S3_REGION", global = true)]
    pub s3_region: Option<String>,

    /// Allows a plain-HTTP endpoint (local MinIO, tests).
    #[arg(long, env = "KEEL_S3_ALLOW_HTTP", global = true, action = clap::ArgAction::SetTrue,
          value_parser = BoolishValueParser::new())]
    pub s3_allow_http: bool,
}

/// How chat providers are called: by workers for agent runs, by the API for live checks
/// (docs/configuration.md#chat-providers).
#[derive(Debug, Clone, Args)]
pub struct ChatArgs {
    /// Timeout of each model call, connecting, headers and the whole stream (ms).
    #[arg(
        long,
        env = "KEEL_CHAT_REQUEST_TIMEOUT_MS",
        default_value_t = 600_000,
        global = true
    )]
    pub chat_request_timeout_ms: u64,

    /// Let model calls reach loopback, private, link-local, unique-local, CGNAT, 6to4 and
    /// Teredo addresses (a model served on this host or in this network). Off by default: a
    /// preset must not make a worker or the API call into its own network.
    #[arg(long, env = "KEEL_CHAT_ALLOW_PRIVATE_ADDRESSES", global = true,
          action = clap::ArgAction::SetTrue, value_parser = BoolishValueParser::new())]
    pub chat_allow_private_addresses: bool,
}

impl Default for ChatArgs {
    fn default() -> Self {
        let limits = ChatLimits::default();
        ChatArgs {
            chat_request_timeout_ms: limits.request_timeout.as_millis() as u64,
            chat_allow_private_addresses: limits.allow_private_addresses,
        }
    }
}

impl ChatArgs {
    pub fn limits(&self) -> ChatLimits {
        ChatLimits {
            request_timeout: Duration::from_millis(self.chat_request_timeout_ms.max(100)),
            allow_private_addresses: self.chat_allow_private_addresses,
        }
    }
}

/// Which secret references presets may name (docs/configuration.md#secret-references). The
/// API checks them when a preset is written and a status is asked for; workers check them
/// again when they resolve one, so a preset stored under a wider policy cannot leak.
#[derive(Debug, Clone, Args)]
pub struct SecretArgs {
    /// Environment variables a reference (`env:NAME`) may name: a comma list of patterns,
    /// `*` matching any run of characters. Keel's own settings (KEEL_* other than
    /// KEEL_SECRET_*, DATABASE_URL, PG*, AWS_*, OTEL_*) are never allowed.
    #[arg(long, env = "KEEL_SECRET_ENV_ALLOW", default_value = DEFAULT_ENV_ALLOW,
          value_delimiter = ',', global = true)]
    pub secret_env_allow: Vec<String>,

    /// Directories (a comma list) a file reference (`file:/path`) must lie beneath; a
    /// symbolic link that leads out of them is refused when the file is read.
    #[arg(long, env = "KEEL_SECRET_FILE_ROOTS", default_value = DEFAULT_FILE_ROOTS,
          value_delimiter = ',', global = true)]
    pub secret_file_roots: Vec<PathBuf>,

    /// What each workspace's tenants (its members and its operators) may name in a preset,
    /// a source's tracker key, an MCP server or a repository credential: a comma list of
    /// `WORKSPACE=REFERENCE` (`org_a=env:OPENAI_API_KEY`, `org_a=env:ORG_A_*`). Every other
    /// reference the policy allows is the deployment's: only the runtime operator writes a
    /// preset, a source or a task that names it. Unset: tenants name no secret.
    #[arg(long, env = "KEEL_SECRET_GRANTS", value_delimiter = ',', global = true)]
    pub secret_grants: Vec<String>,
}

impl Default for SecretArgs {
    fn default() -> Self {
        SecretArgs {
            secret_env_allow: vec![DEFAULT_ENV_ALLOW.into()],
            secret_file_roots: vec![DEFAULT_FILE_ROOTS.into()],
            secret_grants: Vec::new(),
        }
    }
}

impl SecretArgs {
    /// Fails on a grant that is not `WORKSPACE=REFERENCE`.
    pub fn policy(&self) -> Result<SecretPolicy, String> {
        SecretPolicy::new(
            self.secret_env_allow.clone(),
            self.secret_file_roots.clone(),
        )
        .with_grants(&self.secret_grants)
    }
}

impl ContentArgs {
    /// The content store these settings select. The S3 store takes its credentials (and
    /// any other `AWS_*` setting the KEEL_S3_* ones do not override) from the environment.
    pub fn store(&self) -> anyhow::Result<ContentStore> {
        match self.content_store {
            ContentStoreKind::Postgres => Ok(ContentStore::Postgres),
            ContentStoreKind::S3 => Ok(ContentStore::s3(&self.s3_settings(), aws_from_env())?),
        }
    }

    pub fn s3_settings(&self) -> S3Settings {
        S3Settings {
            bucket: self.s3_bucket.clone(),
            prefix: self.s3_prefix.clone(),
            endpoint: self.s3_endpoint.clone(),
            region: self.s3_region.clone(),
            allow_http: self.s3_allow_http,
        }
    }
}

/// `AmazonS3Builder::from_env`, from the environment the process started with (a sealed
/// server process keeps it out of its live environment).
fn aws_from_env() -> AmazonS3Builder {
    keel_workers::seal::vars_with_prefix("AWS_")
        .into_iter()
        .fold(AmazonS3Builder::new(), |builder, (name, value)| match name
            .to_ascii_lowercase()
            .parse()
        {
            Ok(key) => builder.with_config(key, value),
            Err(_) => builder,
        })
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ContentStoreKind {
    #[default]
    Postgres,
    S3,
}

#[derive(Debug, Clone, Args)]
pub struct ApiArgs {
    /// Address the HTTP API listens on.
    #[arg(long, env = "KEEL_LISTEN", default_value = "127.0.0.1:8420")]
    pub listen: SocketAddr,

    /// How often an SSE stream re-reads the database when no notification arrives (ms).
    #[arg(long, env = "KEEL_STREAM_POLL_MS", default_value_t = 1000)]
    pub stream_poll_ms: u64,

    /// How long a client may take to send a request's line and headers before its
    /// connection is closed (seconds, 1 to 3600).
    #[arg(long, env = "KEEL_HEADER_READ_TIMEOUT_SECS", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub header_read_timeout_secs: u64,

    /// How long an identified request's body may take to arrive whole once its headers
    /// are in (seconds, 1 to 3600); a body still arriving then is refused with 408.
    #[arg(long, env = "KEEL_BODY_READ_TIMEOUT_SECS",
          default_value_t = DEFAULT_BODY_READ_TIMEOUT_SECS,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub body_read_timeout_secs: u64,

    /// Event streams (`…/stream`) one identity (workspace and actor) may hold open at once
    /// on this process; one more is refused with 429.
    #[arg(long, env = "KEEL_MAX_STREAMS_PER_IDENTITY",
          default_value_t = DEFAULT_MAX_STREAMS_PER_IDENTITY,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub max_streams_per_identity: usize,

    #[command(flatten)]
    pub auth: AuthArgs,
}

/// The body read timeout when the configuration says nothing: a 2 MiB body at 70 KB/s.
pub(crate) const DEFAULT_BODY_READ_TIMEOUT_SECS: u64 = 30;

/// How many event streams one identity may hold open on an API process when the
/// configuration says nothing: a person's console tabs and CLI watches, with room to
/// spare, while a member opening hundreds cannot slow everyone's requests.
pub const DEFAULT_MAX_STREAMS_PER_IDENTITY: usize = 16;

/// The longest console sign-in (30 days).
pub const MAX_CONSOLE_SESSION_SECS: u64 = 30 * 24 * 3600;

/// Who may call the API (docs/configuration.md#authentication).
#[derive(Debug, Clone, Default, Args)]
pub struct AuthArgs {
    /// Shared token every `/v1` request must carry (`Authorization: Bearer <token>` or
    /// `X-Keel-Runtime-Token`), at least 16 characters. Required to listen on a
    /// non-loopback address in local mode.
    #[arg(long, env = "KEEL_RUNTIME_TOKEN", hide_env_values = true)]
    pub runtime_token: Option<Redacted>,

    /// Host names (a comma list, ports ignored) requests may address; `*` allows any.
    /// Default: localhost, 127.0.0.1, [::1] and the listen address.
    #[arg(long, env = "KEEL_ALLOWED_HOSTS", value_delimiter = ',')]
    pub allowed_hosts: Vec<String>,

    /// Origins (a comma list) that browsers may call the API from; no CORS headers when
    /// unset.
    #[arg(long, env = "KEEL_CORS_ORIGINS", value_delimiter = ',')]
    pub cors_origins: Vec<String>,

    /// Remote runtime: every request carries an identity vouched for by a trusted proxy
    /// (a signed JWT in `X-Keel-Identity`, or the `X-Keel-Remote-Secret` header form).
    #[arg(long, env = "KEEL_REMOTE_MODE", action = clap::ArgAction::SetTrue,
          value_parser = BoolishValueParser::new())]
    pub remote_mode: bool,

    /// This runtime's id: the audience a JWT must name, and the `X-Keel-Runtime-Id` the
    /// header form must send. Required in remote mode.
    #[arg(long, env = "KEEL_RUNTIME_ID")]
    pub runtime_id: Option<String>,

    /// HS256 secret that signs identity JWTs (at least 32 bytes).
    #[arg(long, env = "KEEL_REMOTE_JWT_SECRET", hide_env_values = true)]
    pub remote_jwt_secret: Option<Redacted>,

    /// PEM file of the Ed25519 (EdDSA) or RSA (RS256) public key that signs identity JWTs.
    #[arg(long, env = "KEEL_REMOTE_JWT_PUBLIC_KEY")]
    pub remote_jwt_public_key: Option<PathBuf>,

    /// JWKS file of the public keys that sign identity JWTs, chosen by the token's `kid`.
    #[arg(long, env = "KEEL_REMOTE_JWKS_FILE")]
    pub remote_jwks_file: Option<PathBuf>,

    /// Clock skew allowed on a JWT's `exp`, `nbf` and `iat` (seconds, at most 30).
    #[arg(long, env = "KEEL_REMOTE_JWT_LEEWAY_SECS", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(0..=30))]
    pub remote_jwt_leeway_secs: u64,

    /// Secret of the header form (`X-Keel-Remote-Secret`), at least 16 characters.
    #[arg(long, env = "KEEL_REMOTE_SHARED_SECRET", hide_env_values = true)]
    pub remote_shared_secret: Option<Redacted>,

    /// The header form's `X-Keel-Role` (`member`, `operator` or `runtime_operator`)
    /// counts: set it only when the proxy sets that header itself and drops the clients'.
    /// Off: every caller of the header form is a member.
    #[arg(long, env = "KEEL_REMOTE_ROLE_HEADER", action = clap::ArgAction::SetTrue,
          value_parser = BoolishValueParser::new())]
    pub remote_role_header: bool,

    /// In remote mode, an operator may resolve an approval of a run (or an action) they
    /// requested themselves. Off: 403, someone else must decide.
    #[arg(long, env = "KEEL_ALLOW_SELF_APPROVAL", action = clap::ArgAction::SetTrue,
          value_parser = BoolishValueParser::new())]
    pub allow_self_approval: bool,

    /// How long a console sign-in lasts (seconds, 60 to 30 days): the browser's session
    /// cookie carries its signed expiry and is refused after it.
    #[arg(long, env = "KEEL_CONSOLE_SESSION_TTL_SECS", default_value_t = 12 * 3600,
          value_parser = clap::value_parser!(u64).range(60..=MAX_CONSOLE_SESSION_SECS))]
    pub console_session_ttl_secs: u64,

    /// This runtime's label in `GET /v1/whoami` (default: the host name).
    #[arg(long, env = "KEEL_RUNTIME_LABEL")]
    pub runtime_label: Option<String>,

    /// Requests per identity: `<n>/s`, `<n>/m` or `<n>/h`, optionally `,burst=<b>`
    /// (default burst: n), or `off`. Unset: `50/s,burst=100` in remote mode, off in local
    /// mode.
    #[arg(long, env = "KEEL_RATE_LIMIT")]
    pub rate_limit: Option<RateLimitSetting>,
}

impl AuthArgs {
    /// The rate limit in effect: the setting's, else [`REMOTE_RATE_LIMIT`] in remote mode,
    /// where tenants share the API and one identity's flood must not starve the others.
    pub fn rate_limit_in_effect(&self) -> Option<RateLimit> {
        match self.rate_limit {
            Some(RateLimitSetting::Off) => None,
            Some(RateLimitSetting::Limit(rate)) => Some(rate),
            None => self.remote_mode.then_some(REMOTE_RATE_LIMIT),
        }
    }
}

/// Remote mode's rate limit when `KEEL_RATE_LIMIT` is unset: 50 requests a second per
/// identity, 100 at once. Far above what a person in the console or a CLI following runs
/// sends (a stream is one request however long it lasts).
pub const REMOTE_RATE_LIMIT: RateLimit = RateLimit {
    requests: std::num::NonZeroU32::new(50).unwrap(),
    period: Duration::from_secs(1),
    burst: std::num::NonZeroU32::new(100).unwrap(),
};

/// A secret setting: its Debug output is `***`, so it cannot reach a log through the
/// settings' Debug output.
#[derive(Clone)]
pub struct Redacted(String);

impl Redacted {
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Redacted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("***")
    }
}

impl std::str::FromStr for Redacted {
    type Err = std::convert::Infallible;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        Ok(Redacted(value.to_string()))
    }
}

/// `KEEL_RATE_LIMIT`: a rate, or `off` (no limit, in remote mode too).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateLimitSetting {
    Off,
    Limit(RateLimit),
}

impl std::str::FromStr for RateLimitSetting {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value.trim() {
            "off" => Ok(RateLimitSetting::Off),
            rate => rate.parse().map(RateLimitSetting::Limit),
        }
    }
}

/// A rate: `requests` replenish over `period`, up to `burst` at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    pub requests: std::num::NonZeroU32,
    pub period: Duration,
    pub burst: std::num::NonZeroU32,
}

impl std::str::FromStr for RateLimit {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        let invalid = || {
            format!(
                "'{value}' is not a rate: expected <n>/s, <n>/m or <n>/h, optionally followed by ,burst=<b>, or off"
            )
        };
        let (rate, burst) = match value.split_once(',') {
            Some((rate, burst)) => (rate, Some(burst.trim())),
            None => (value, None),
        };
        let (requests, unit) = rate.trim().split_once('/').ok_or_else(invalid)?;
        let requests: std::num::NonZeroU32 = requests.trim().parse().map_err(|_| invalid())?;
        let period = match unit.trim() {
            "s" => Duration::from_secs(1),
            "m" => Duration::from_secs(60),
            "h" => Duration::from_secs(3600),
            _ => return Err(invalid()),
        };
        let burst = match burst {
            None => requests,
            Some(burst) => burst
                .strip_prefix("burst=")
                .and_then(|b| b.trim().parse().ok())
                .ok_or_else(invalid)?,
        };
        Ok(RateLimit {
            requests,
            period,
            burst,
        })
    }
}

#[derive(Debug, Clone, Args)]
pub struct WorkerArgs {
    /// Jobs this worker runs at once.
    #[arg(long, env = "KEEL_WORKER_CONCURRENCY", default_value_t = 8)]
    pub concurrency: usize,

    /// Jobs claimed ahead of a free slot, leased (and heartbeated) while they wait. Saves
    /// claim round trips for many short jobs; keep 0 for long runs, which a prefetching
    /// worker would hold back from idle workers.
    #[arg(long, env = "KEEL_WORKER_PREFETCH", default_value_t = 0)]
    pub prefetch: usize,

    /// Lease length (ms): a job whose worker stops heartbeating for this long is taken over.
    #[arg(long, env = "KEEL_LEASE_MS", default_value_t = 30_000)]
    pub lease_ms: u64,

    /// Taken off the lease for the worker's own deadline on each job (ms): a job whose
    /// lease was not renewed for lease − margin is stopped, its processes killed, before
    /// another worker can take it over. Default: a tenth of the lease.
    #[arg(long, env = "KEEL_LEASE_MARGIN_MS")]
    pub lease_margin_ms: Option<u64>,

    /// Longest a lease heartbeat may take before it is abandoned and the next one opens a
    /// new connection (ms); the lease must be at least three of them. Default: a fifth of
    /// the lease.
    #[arg(long, env = "KEEL_HEARTBEAT_TIMEOUT_MS")]
    pub heartbeat_timeout_ms: Option<u64>,

    /// Fallback poll interval when no notification arrives (ms).
    #[arg(long, env = "KEEL_POLL_INTERVAL_MS", default_value_t = 1000)]
    pub poll_interval_ms: u64,

    /// On shutdown, how long running jobs may take to finish before they are handed back (ms).
    #[arg(long, env = "KEEL_DRAIN_TIMEOUT_MS", default_value_t = 30_000)]
    pub drain_timeout_ms: u64,

    /// How often the reconciler requeues jobs whose lease expired and due schedules are
    /// dispatched (ms).
    #[arg(long, env = "KEEL_RECONCILE_INTERVAL_MS", default_value_t = 5_000)]
    pub reconcile_interval_ms: u64,

    /// How long run and media job events and state transitions are kept (days): older
    /// ones are deleted by every worker's maintenance, but for each run's and media job's
    /// last event, which its numbering goes on from. 0 (the default): kept for ever.
    #[arg(long, env = "KEEL_HISTORY_RETENTION_DAYS", default_value_t = 0)]
    pub history_retention_days: u32,

    /// Largest stdout/stderr artifact kept per run (bytes); the rest is dropped and the
    /// artifact marked truncated.
    #[arg(long, env = "KEEL_ARTIFACT_MAX_BYTES", default_value_t = 16 * 1024 * 1024)]
    pub artifact_max_bytes: i64,

    /// Most jobs one workspace runs at once, across every worker (an operator may set a
    /// workspace's own limit through the API). Set, claims are fair across workspaces: a
    /// workspace's backlog never delays another's first job by more than one claim. Unset:
    /// in remote mode (`KEEL_REMOTE_MODE`), half this worker's concurrency, rounded up; in
    /// local mode, claims take due jobs in priority order, whatever their workspace.
    #[arg(long, env = "KEEL_MAX_CONCURRENT_PER_WORKSPACE")]
    pub max_concurrent_per_workspace: Option<u32>,

    /// Worker environment variables a run's processes also get (a comma list of exact
    /// names; unset ones are skipped). Keel's own settings (`KEEL_*`), its database
    /// (`DATABASE_URL`, `PG*`), S3 (`AWS_*`) and telemetry (`OTEL_*`) variables are refused.
    #[arg(long, env = "KEEL_RUN_ENV_PASSTHROUGH", value_delimiter = ',',
          value_parser = passthrough_name)]
    pub run_env_passthrough: Vec<String>,

    #[command(flatten)]
    pub media: MediaArgs,
}

/// A passthrough name: a plain environment variable name that is none of Keel's own.
fn passthrough_name(name: &str) -> Result<String, String> {
    let name = name.trim();
    let plain = !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    if !plain {
        return Err(format!("'{name}' is not an environment variable name"));
    }
    let keel_own = name == "DATABASE_URL"
        || ["KEEL_", "PG", "AWS_", "OTEL_"]
            .iter()
            .any(|prefix| name.starts_with(prefix));
    if keel_own {
        return Err(format!(
            "{name} is one of Keel's own settings (KEEL_*, DATABASE_URL, PG*, AWS_*, OTEL_*) \
             and never reaches a run"
        ));
    }
    Ok(name.to_string())
}

/// How workers talk to media vendors.
#[derive(Debug, Clone, Args)]
pub struct MediaArgs {
    /// Timeout of each vendor API call (submit, poll, generate) (ms).
    #[arg(long, env = "KEEL_MEDIA_REQUEST_TIMEOUT_MS", default_value_t = 120_000)]
    pub media_request_timeout_ms: u64,

    /// Timeout of each media download, headers and body together (ms).
    #[arg(
        long,
        env = "KEEL_MEDIA_DOWNLOAD_TIMEOUT_MS",
        default_value_t = 300_000
    )]
    pub media_download_timeout_ms: u64,

    /// Largest image or video downloaded (bytes); a larger one fails the job with
    /// `download_too_large`.
    #[arg(long, env = "KEEL_MEDIA_DOWNLOAD_MAX_BYTES", default_value_t = 512 * 1024 * 1024)]
    pub media_download_max_bytes: u64,

    /// How often a video task is polled at the vendor (ms).
    #[arg(long, env = "KEEL_MEDIA_POLL_INTERVAL_MS", default_value_t = 5_000)]
    pub media_poll_interval_ms: u64,

    /// How long one attempt polls a video task before it fails with `timeout` (ms).
    #[arg(long, env = "KEEL_MEDIA_POLL_TIMEOUT_MS", default_value_t = 1_800_000)]
    pub media_poll_timeout_ms: u64,

    /// Let vendor calls and media downloads reach private, loopback, link-local, CGNAT,
    /// 6to4 and Teredo addresses. Off by default: a preset or a vendor response must not
    /// make a worker call into its own network.
    #[arg(long, env = "KEEL_MEDIA_ALLOW_PRIVATE_ADDRESSES", action = clap::ArgAction::SetTrue,
          value_parser = BoolishValueParser::new())]
    pub media_allow_private_addresses: bool,

    /// Largest vendor API response body read (bytes); a larger one fails the job with
    /// `response_too_large`.
    #[arg(long, env = "KEEL_MEDIA_RESPONSE_MAX_BYTES", default_value_t = 16 * 1024 * 1024)]
    pub media_response_max_bytes: u64,

    /// Most results one media job keeps; more fail the job with `too_many_outputs`.
    #[arg(long, env = "KEEL_MEDIA_MAX_OUTPUTS", default_value_t = 16)]
    pub media_max_outputs: usize,

    /// Most bytes one media job's results add up to; more fail the job with
    /// `outputs_too_large`.
    #[arg(long, env = "KEEL_MEDIA_OUTPUTS_MAX_BYTES", default_value_t = 2 * 1024 * 1024 * 1024)]
    pub media_outputs_max_bytes: u64,
}

impl Default for MediaArgs {
    fn default() -> Self {
        let limits = MediaLimits::default();
        let ms = |d: Duration| d.as_millis() as u64;
        MediaArgs {
            media_request_timeout_ms: ms(limits.request_timeout),
            media_download_timeout_ms: ms(limits.download_timeout),
            media_download_max_bytes: limits.download_max_bytes,
            media_poll_interval_ms: ms(limits.poll_interval),
            media_poll_timeout_ms: ms(limits.poll_timeout),
            media_allow_private_addresses: limits.allow_private_addresses,
            media_response_max_bytes: limits.response_max_bytes,
            media_max_outputs: limits.max_outputs,
            media_outputs_max_bytes: limits.outputs_max_bytes,
        }
    }
}

impl MediaArgs {
    pub fn limits(&self) -> MediaLimits {
        let ms = |v: u64, floor: u64| Duration::from_millis(v.max(floor));
        MediaLimits {
            request_timeout: ms(self.media_request_timeout_ms, 100),
            download_timeout: ms(self.media_download_timeout_ms, 100),
            download_max_bytes: self.media_download_max_bytes.max(1),
            poll_interval: ms(self.media_poll_interval_ms, 10),
            poll_timeout: ms(self.media_poll_timeout_ms, 100),
            allow_private_addresses: self.media_allow_private_addresses,
            response_max_bytes: self.media_response_max_bytes.max(1),
            max_outputs: self.media_max_outputs.max(1),
            outputs_max_bytes: self.media_outputs_max_bytes.max(1),
        }
    }
}

impl WorkerArgs {
    /// The passthrough variables this worker has, with their values.
    pub fn passthrough_env(&self) -> Vec<(String, String)> {
        self.run_env_passthrough
            .iter()
            .filter_map(|name| Some((name.clone(), keel_workers::seal::var(name)?)))
            .collect()
    }

    /// The worker's settings; refuses lease timings under which jobs could overlap or
    /// stop between healthy heartbeats ([`LeaseTiming::new`]).
    pub fn settings(&self) -> Result<WorkerSettings, String> {
        Ok(WorkerSettings {
            concurrency: self.concurrency.max(1),
            prefetch: self.prefetch,
            timing: self.lease_timing()?,
            poll_interval: Duration::from_millis(self.poll_interval_ms.max(10)),
            drain_timeout: Duration::from_millis(self.drain_timeout_ms),
            max_per_workspace: self.max_per_workspace(remote_deployment()),
        })
    }

    /// The setting, else in remote mode a fair share of this worker's slots: half, rounded
    /// up, so one tenant's backlog never holds every slot while another's jobs wait (but
    /// for a worker of one slot), and a tenant alone still uses half of them.
    fn max_per_workspace(&self, remote: bool) -> Option<u32> {
        let half = self.concurrency.max(1).div_ceil(2);
        let fair_share = u32::try_from(half).unwrap_or(u32::MAX);
        self.max_concurrent_per_workspace
            .or(remote.then_some(fair_share))
    }

    fn lease_timing(&self) -> Result<LeaseTiming, String> {
        let lease = Duration::from_millis(self.lease_ms.max(300));
        let defaults = LeaseTiming::for_lease(lease);
        let ms =
            |value: Option<u64>, default: Duration| value.map_or(default, Duration::from_millis);
        LeaseTiming::new(
            lease,
            ms(self.lease_margin_ms, defaults.margin),
            ms(self.heartbeat_timeout_ms, defaults.heartbeat_timeout),
        )
    }

    pub fn reconcile_interval(&self) -> Duration {
        Duration::from_millis(self.reconcile_interval_ms.max(100))
    }
}

/// `keel-sandbox-shim` beside this process's binary (cargo and the image put it there) when
/// it was built from the same source, else this binary, whose `sandbox-shim` subcommand is
/// the same shim at a higher cost per start.
fn default_shim() -> Option<PathBuf> {
    Some(keel_workers::shim::beside(&std::env::current_exe().ok()?))
}
