//! `keel tasks …`: tasks created, listed, shown, started and deleted, and the artifacts of
//! all a task's runs (`api/tasks.rs`).

use clap::{Args, Subcommand};
use keel_client::{
    Client, Error, McpServer, ObjectEnvelope, REASONING_EFFORTS, StartRequest, TaskDraft,
    TaskRecord,
};

use crate::cli::artifacts;
use crate::cli::output;
use crate::cli::output::{Format, PageArgs, Table, or_dash, time};
use crate::cli::runs;
use crate::cli::runs::AdmitArgs;
use crate::cli::watch::Outcome;

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
    /// A file task: the path to write (with `--content`), append to, or delete.
    #[arg(long, group = "execution")]
    file: Option<String>,
    /// The file task's content (to write or append).
    #[arg(long, requires = "file")]
    content: Option<String>,
    /// The file task's operation: write (the default), append or delete.
    #[arg(long, requires = "file", value_parser = ["write", "append", "delete"])]
    file_operation: Option<String>,
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
    /// What lists show for the task (default: its prompt's or command's first line).
    #[arg(long)]
    title: Option<String>,
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
            title: self.title.clone(),
            prompt: self.prompt.clone(),
            shell_command: self.shell.clone(),
            git_command: self.git.clone(),
            file_path: self.file.clone(),
            file_content: self.content.clone(),
            file_operation: self.file.as_ref().map(|_| {
                let operation = self.file_operation.as_deref();
                operation.unwrap_or("write").to_string()
            }),
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

pub(super) async fn run(
    client: &Client,
    format: Format,
    command: TaskCommand,
) -> Result<Outcome, Error> {
    match command {
        TaskCommand::Create(create) => {
            let call = client.create_task(&create.draft());
            let id = |t: &ObjectEnvelope<TaskRecord>| t.data.id.clone();
            output::show_or_id(format, create.quiet, call, id, |t| task_fields(&t.data)).await?;
        }
        TaskCommand::List { status, page } => {
            let headers = ["ID", "KIND", "STATUS", "RUNS", "CREATED", "TITLE"];
            let call = client.list_tasks(status.as_deref());
            output::list(format, &page, call, &headers, |t: &TaskRecord| {
                vec![
                    t.id.clone(),
                    t.execution_kind.clone(),
                    t.status.to_string(),
                    t.run_count.to_string(),
                    time(&t.created_at),
                    t.title.clone(),
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
            let call = client.start_task(&task_id, &request);
            return runs::admitted(client, format, call, watch).await;
        }
        TaskCommand::Artifacts { task_id, page } => {
            artifacts::list(format, &page, client.list_task_artifacts(&task_id)).await?;
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

fn task_fields(t: &TaskRecord) -> Table {
    Table::fields(&[
        ("id", t.id.clone()),
        ("title", t.title.clone()),
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
