//! Tasks: the body that creates one, the task as the API shows it, and its status.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa::openapi::{RefOr, schema::Schema};

use utoipa::openapi::schema::{ObjectBuilder, Type};

use crate::schema::{
    ABSOLUTE_PATH, Field, NO_NUL, NOT_BLANK, Variant, boolean, integer, one_of_strings, rule,
    string, tagged_union, when_absent_or, when_given, when_null,
};
use crate::{MAX_MCP_SERVERS, McpServer, McpServers, RunStatus};

/// The body of `POST /v1/tasks`, as the client sent it.
///
/// Every field is optional here so the server can name the one at fault; the document
/// states the contract instead, as a union with one variant per `execution_kind` (see
/// [`TaskDraft::schema`](utoipa::PartialSchema::schema)).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskDraft {
    pub execution_kind: Option<String>,
    /// What lists show for the task (at most 200 characters, no control characters);
    /// absent: derived from its prompt or command.
    pub title: Option<String>,
    pub prompt: Option<String>,
    pub shell_command: Option<String>,
    pub git_command: Option<String>,
    pub file_path: Option<String>,
    pub file_content: Option<String>,
    pub file_operation: Option<String>,
    pub working_directory: Option<String>,
    pub workspace_mode: Option<String>,
    /// For `ephemeral`: the repository the run's workspace starts as a clone of (a URL
    /// without credentials, or an absolute path).
    pub repo: Option<String>,
    /// With `repo`: the branch to check out (absent: the repository's default).
    pub base_branch: Option<String>,
    /// With an `https://` or `http://` `repo`: a secret reference to the credential the
    /// clone sends.
    pub repo_credential: Option<String>,
    /// With `repo`: the branch a completed run's changes are committed and pushed to.
    pub push_branch: Option<String>,
    /// For `in_place`: a directory beneath `KEEL_WORKSPACE_ROOTS` that the working
    /// directory must lie beneath, narrowing the operator's roots for this task.
    pub sandbox_allowed_root: Option<String>,
    /// Whether shell and git children may use the network (default true); false runs them
    /// in a network namespace with only loopback.
    pub sandbox_network: Option<bool>,
    /// Whether the workspace is read-only for the run (default false): shell and git children
    /// see it mounted read-only, and file writes are refused.
    pub sandbox_read_only: Option<bool>,
    pub timeout_ms: Option<i64>,
    pub priority: Option<i32>,
    pub budget_micros_usd: Option<i64>,
    /// For `agent_loop`: the system prompt the conversation starts with.
    pub system_prompt: Option<String>,
    /// For `agent_loop`: a provider preset id; absent: the workspace's first enabled chat
    /// preset.
    pub requested_provider: Option<String>,
    /// For `agent_loop`: the model to ask for, instead of the preset's.
    pub requested_model: Option<String>,
    /// For `agent_loop`: the most model calls across the run's resume chain (> 0).
    pub max_model_calls: Option<i32>,
    /// For `agent_loop`: how hard a reasoning model thinks (one of [`REASONING_EFFORTS`]);
    /// absent: the provider's default.
    pub reasoning_effort: Option<String>,
    /// For `agent_loop`: `include` (the default) or `exclude` the workspace's instruction
    /// files (`AGENTS.md`, `CLAUDE.md`) from the system prompt.
    pub workspace_system_prompt_policy: Option<String>,
    /// For `agent_loop`: the tools the model may call (a subset of the catalog); absent:
    /// the whole catalog the sandbox allows.
    pub tools: Option<Vec<String>>,
    /// For `agent_loop`: MCP servers whose tools join the catalog as
    /// `mcp__<server>__<tool>`.
    pub mcp_servers: Option<Vec<McpServer>>,
    /// For `agent_loop`: defaults for a kind of work (one of [`ExecutionProfile`]).
    pub execution_profile: Option<String>,
    /// Starts the task in the same request and transaction, as `POST
    /// /v1/tasks/{task_id}/start` with no body would (default false).
    pub start: Option<bool>,
}

/// A `repo` as the server's `check_repo_url` takes one: no surrounding white space or
/// control characters, no leading `-`; an absolute path, an `https`, `http`, `ssh`, `git`
/// or `file` URL without a password in its authority, or scp-like `user@host:path`.
pub const REPO: &str = r#"^(?!-)(?!\s)(?![\s\S]*\s$)(/[^\u0000-\u001f\u007f-\u009f]*|(https?|ssh|git|file)://([^/:\u0000-\u001f\u007f-\u009f]*@)?[^/@\u0000-\u001f\u007f-\u009f]*(/[^\u0000-\u001f\u007f-\u009f]*)?|(?!(https?|ssh|git|file)://)[A-Za-z0-9._@-]+:[^:\u0000-\u001f\u007f-\u009f][^\u0000-\u001f\u007f-\u009f]*)$"#;

/// A `base_branch` as the server's `check_branch` takes one (the names `git
/// check-ref-format --branch` accepts): not starting with `-`, `/` or `.`, not ending with
/// `/`, `.` or `.lock`, not `@`, without `..`, `//`, `@{` or `/.`, white space, control
/// characters or any of `~^:?*[\`.
pub const BRANCH: &str = r#"^(?![-/.])(?!.*(\.\.|//|@\{|/\.))(?!.*(/|\.|\.lock)$)(?!@$)[^\s\u0000-\u001f\u007f-\u009f~^:?*\[\\]+$"#;

/// A task's `title`: something besides white space, and no control character.
pub const TITLE: &str = r#"^(?![\s\S]*[\u0000-\u001f\u007f-\u009f])[\s\S]*\S[\s\S]*$"#;

/// Longest `title` (characters).
pub const MAX_TITLE_CHARS: usize = 200;

/// Longest `repo` (bytes).
pub const MAX_REPO_BYTES: usize = 2048;

/// The values of an agent loop task's `reasoning_effort`.
pub const REASONING_EFFORTS: [&str; 4] = ["minimal", "low", "medium", "high"];

/// The values of an agent loop task's `workspace_system_prompt_policy`.
pub const WORKSPACE_SYSTEM_PROMPT_POLICIES: [&str; 2] = ["include", "exclude"];

/// Git arguments as the server splits them (the `shlex` crate, POSIX rules): at least one
/// word, words apart by space, tab or newline, a `#` at a word's start commenting out the
/// line, and every quote closed: `'…'` literal, `"…"` with `\` escapes, `\` escaping
/// the next character outside them. No NUL.
pub const GIT_ARGUMENTS: &str = r#"^(?:[ \t\n]|#[^\n\u0000]*(?:\n|$))*(?:[^ \t\n'"\\#\u0000]|\\[^\u0000]|'[^'\u0000]*'|"(?:[^"\\\u0000]|\\[^\u0000])*")(?:[^ \t\n'"\\\u0000]|\\[^\u0000]|'[^'\u0000]*'|"(?:[^"\\\u0000]|\\[^\u0000])*")*(?:[ \t\n](?:[ \t\n]|#[^\n\u0000]*(?:\n|$))*(?:[^ \t\n'"\\#\u0000]|\\[^\u0000]|'[^'\u0000]*'|"(?:[^"\\\u0000]|\\[^\u0000])*")(?:[^ \t\n'"\\\u0000]|\\[^\u0000]|'[^'\u0000]*'|"(?:[^"\\\u0000]|\\[^\u0000])*")*)*(?:[ \t\n](?:[ \t\n]|#[^\n\u0000]*(?:\n|$))*)?$"#;

/// The built-in tools an agent loop task may allow, in catalog order (the workers'
/// `agent::tools::CATALOG` is this list).
pub const AGENT_TOOLS: [&str; 11] = [
    "read_file",
    "list_dir",
    "grep",
    "glob",
    "file_write",
    "file_edit",
    "apply_patch",
    "shell_exec",
    "git_status",
    "git_diff",
    "http_request",
];

/// Longest command of a shell or git task, and longest prompt or system prompt (bytes).
const MAX_COMMAND_BYTES: usize = 64 * 1024;
/// Longest content of a file task (bytes).
const MAX_FILE_CONTENT_BYTES: usize = 1024 * 1024;
/// The server's default `KEEL_RUN_TIMEOUT_MAX_MS` (24 h).
const DEFAULT_MAX_TIMEOUT_MS: i64 = 24 * 3600 * 1000;

hand_written_schema!(TaskDraft, task_draft_union);

/// The draft as a union on `execution_kind`. Rules JSON Schema cannot state are in the
/// descriptions, and the server answers 422 naming the field.
fn task_draft_union(schemas: &mut Vec<(String, RefOr<Schema>)>) -> RefOr<Schema> {
    let command = |description: &'static str| -> RefOr<Schema> {
        string(false, NOT_BLANK, Some(MAX_COMMAND_BYTES))
            .description(Some(description))
            .into()
    };
    let not_blank = |description: &'static str| -> RefOr<Schema> {
        string(true, NOT_BLANK, None)
            .description(Some(description))
            .into()
    };
    let shell = vec![(
        "shell_command",
        true,
        command("Run with `sh -c` (at most 64 KiB of UTF-8)."),
    )];
    let git = vec![(
        "git_command",
        true,
        string(false, GIT_ARGUMENTS, Some(MAX_COMMAND_BYTES))
            .description(Some(
                "The arguments of `git`, split like a POSIX shell would: at least one word, \
                 the quotes balanced (the pattern states it; 422 otherwise). At most 64 KiB \
                 of UTF-8.",
            ))
            .into(),
    )];
    let file = vec![
        (
            "file_path",
            true,
            string(false, NOT_BLANK, None)
                .description(Some(
                    "A path relative to the workspace naming a file in it: not absolute, no \
                     `..` component (422 otherwise).",
                ))
                .into(),
        ),
        (
            "file_operation",
            true,
            one_of_strings(false, &FileOperation::ALL.map(FileOperation::as_str)).into(),
        ),
        (
            "file_content",
            false,
            string(true, NO_NUL, Some(MAX_FILE_CONTENT_BYTES))
                .description(Some(
                    "Required for `write` and `append`, refused for `delete` (stated; 422 \
                     too). At most 1 MiB of UTF-8.",
                ))
                .into(),
        ),
    ];
    let agent_loop = vec![
        (
            "prompt",
            true,
            string(false, NOT_BLANK, Some(MAX_COMMAND_BYTES))
                .description(Some(
                    "The user message the loop starts with (at most 64 KiB).",
                ))
                .into(),
        ),
        (
            "system_prompt",
            false,
            string(true, NO_NUL, Some(MAX_COMMAND_BYTES))
                .description(Some("The system prompt the conversation starts with."))
                .into(),
        ),
        (
            "requested_provider",
            false,
            not_blank(
                "A chat provider preset's id, which pins the runs to it (422 at start when it \
                 is disabled or is no chat preset of the workspace); absent, with no \
                 `requested_model` either: the workspace's enabled chat presets, oldest \
                 first, the later ones where a call fails over when a provider is down.",
            ),
        ),
        (
            "requested_model",
            false,
            not_blank("The model to ask for, instead of the preset's; it pins the runs too."),
        ),
        (
            "max_model_calls",
            false,
            integer(true, 1, i32::MAX.into())
                .description(Some("The most model calls across the run's resume chain."))
                .into(),
        ),
        (
            "reasoning_effort",
            false,
            one_of_strings(true, &REASONING_EFFORTS)
                .description(Some(
                    "How hard a reasoning model thinks: OpenAI chat completions' \
                     `reasoning_effort`, the Responses API's `reasoning.effort`, Anthropic's \
                     extended thinking with a budget of 1024, 2048, 8192 or 24576 tokens. \
                     Absent: the provider's default.",
                ))
                .into(),
        ),
        (
            "workspace_system_prompt_policy",
            false,
            one_of_strings(true, &WORKSPACE_SYSTEM_PROMPT_POLICIES)
                .description(Some(
                    "`include` (absent: the same) adds the workspace's `AGENTS.md` and \
                     `CLAUDE.md` (each cut at 32 KiB) to the system prompt, between the \
                     operator's (`KEEL_AGENT_SYSTEM_PROMPT`) and the task's; `exclude` \
                     leaves them out.",
                ))
                .into(),
        ),
        (
            "tools",
            false,
            utoipa::openapi::schema::ArrayBuilder::new()
                .schema_type(utoipa::openapi::schema::SchemaType::from_iter([
                    Type::Array,
                    Type::Null,
                ]))
                .items(one_of_strings(false, &AGENT_TOOLS))
                .unique_items(true)
                .description(Some(
                    "The tools the model may call, each once, from the catalog; absent: the \
                     whole catalog the sandbox allows.",
                ))
                .into(),
        ),
        ("mcp_servers", false, mcp_servers(schemas)),
        (
            "execution_profile",
            false,
            one_of_strings(true, &ExecutionProfile::ALL.map(ExecutionProfile::as_str))
                .description(Some(
                    "Defaults for a kind of work. `coding_agent`: needs a `repo`; \
                     `workspace_mode` `persistent`, `timeout_ms` 300000 and a system prompt \
                     for careful code changes unless the task sets them; every call of a \
                     tool that changes the workspace or runs a command (`file_write`, \
                     `file_edit`, `apply_patch`, `shell_exec`) waits for an approval, \
                     whatever the approval policies; the git tools stay on.",
                ))
                .into(),
        ),
    ];
    let variant = |tag, name, description, fields: Vec<Field>| Variant {
        tag,
        name,
        description,
        fields: fields.into_iter().chain(common_fields(tag)).collect(),
        rules: workspace_rules()
            .into_iter()
            .chain((tag == "file").then(file_content_rule))
            .collect(),
    };
    tagged_union(
        "execution_kind",
        "A task to create, by `execution_kind`.",
        vec![
            variant("shell", "ShellTaskDraft", "A shell command.", shell),
            variant("git", "GitTaskDraft", "A git command.", git),
            variant(
                "file",
                "FileTaskDraft",
                "A file write, append or delete.",
                file,
            ),
            variant(
                "agent_loop",
                "AgentLoopTaskDraft",
                "A model loop calling tools in the workspace.",
                agent_loop,
            ),
        ],
        schemas,
    )
}

/// The rules across the workspace fields, as the server's `parse_workspace` and
/// `parse_repo` apply them: `working_directory` (required) and `sandbox_allowed_root` are
/// for `in_place` only, `repo` for `ephemeral` only, and `base_branch` needs `repo`.
fn workspace_rules() -> Vec<RefOr<Schema>> {
    let null = || ObjectBuilder::new().schema_type(Type::Null);
    let ephemeral = when_absent_or(
        "workspace_mode",
        &[None, Some(WorkspaceMode::Ephemeral.as_str())],
    )
    .property("working_directory", null())
    .property("sandbox_allowed_root", null());
    let in_place = when_given("working_directory", Type::String)
        .property(
            "workspace_mode",
            ObjectBuilder::new().enum_values(Some([WorkspaceMode::InPlace.as_str()])),
        )
        .required("workspace_mode")
        .property("repo", null());
    vec![
        rule(
            "`ephemeral` (or no `workspace_mode`): no `working_directory` or \
             `sandbox_allowed_root`; `in_place`: a `working_directory`, and no `repo`.",
            vec![ephemeral, in_place],
        ),
        rule(
            "`base_branch` and `push_branch` need `repo`.",
            vec![
                when_null(&["base_branch", "push_branch"]),
                when_given("repo", Type::String),
            ],
        ),
    ]
}

/// A file task's `file_content`: required (a string) for `write` and `append`, refused
/// for `delete`, as the server's `parse_file` has it.
fn file_content_rule() -> RefOr<Schema> {
    let operation = |ops: &[FileOperation]| {
        let names = ops.iter().map(|op| op.as_str());
        ObjectBuilder::new().enum_values(Some(names))
    };
    let delete = when_null(&["file_content"])
        .property("file_operation", operation(&[FileOperation::Delete]));
    let write = when_given("file_content", Type::String).property(
        "file_operation",
        operation(&[FileOperation::Write, FileOperation::Append]),
    );
    rule(
        "`file_content` is required for `write` and `append`, refused for `delete`.",
        vec![delete, write],
    )
}

/// `mcp_servers`: up to [`MAX_MCP_SERVERS`] of [`McpServer`], registered as a component.
fn mcp_servers(schemas: &mut Vec<(String, RefOr<Schema>)>) -> RefOr<Schema> {
    use utoipa::{PartialSchema, ToSchema};
    schemas.push((McpServer::name().into_owned(), McpServer::schema()));
    let mut nested = Vec::new();
    McpServer::schemas(&mut nested);
    schemas.extend(nested);
    utoipa::openapi::schema::ArrayBuilder::new()
        .schema_type(utoipa::openapi::schema::SchemaType::from_iter([
            utoipa::openapi::Type::Array,
            utoipa::openapi::Type::Null,
        ]))
        .items(utoipa::openapi::Ref::from_schema_name(McpServer::name()))
        .max_items(Some(MAX_MCP_SERVERS))
        .description(Some(
            "MCP servers whose tools join the catalog as `mcp__<server>__<tool>` (at most 8, \
             names unique). Each is a process started in the run's sandbox (`command`) or a \
             streamable-HTTP endpoint (`url`), with secret references for its environment \
             or headers, an `approval_policy` and an optional tool allowlist.",
        ))
        .into()
}

/// The fields every kind takes (`prompt` where the kind does not state its own). A file
/// task changes its workspace, so it has no `sandbox_read_only`.
fn common_fields(kind: &str) -> Vec<Field> {
    let mut fields: Vec<Field> = vec![
        (
            "title",
            false,
            string(true, TITLE, Some(MAX_TITLE_CHARS))
                .description(Some(
                    "What lists show for the task: at most 200 characters, something besides \
                     white space, no control characters (a newline, a tab). Absent: the \
                     first line of its prompt or command, cut at 80 characters.",
                ))
                .into(),
        ),
        (
            "workspace_mode",
            false,
            one_of_strings(true, &WorkspaceMode::ALL.map(WorkspaceMode::as_str))
                .description(Some(
                    "`ephemeral` (default): a fresh directory per run. `persistent`: one \
                     directory of the task's, kept across its runs (one at a time, as a \
                     task has at most one active run), prepared (its `repo` cloned) by the \
                     first. `in_place`: `working_directory` as it is, only where the \
                     operator configured workspace roots (KEEL_WORKSPACE_ROOTS; 422 \
                     otherwise).",
                ))
                .into(),
        ),
        (
            "repo",
            false,
            string(true, REPO, Some(MAX_REPO_BYTES))
                .description(Some(
                    "`ephemeral` or `persistent`: the repository the workspace starts as a \
                     clone of (each run's, or the persistent one's first), before anything \
                     else runs there: an `https://`, `http://`, \
                     `ssh://`, `git://` or `file://` URL, `user@host:path`, or an absolute \
                     path. No credentials in it (422): the clone runs in the run's sandbox, \
                     with its network setting. A clone that fails fails the run with git's \
                     message.",
                ))
                .into(),
        ),
        (
            "base_branch",
            false,
            string(true, BRANCH, Some(255))
                .description(Some(
                    "With `repo`: the branch to check out, as a local branch of that name \
                     (absent: the repository's default branch, detached).",
                ))
                .into(),
        ),
        (
            "repo_credential",
            false,
            string(true, NO_NUL, Some(4096))
                .description(Some(
                    "With an `https://` or `http://` `repo`: a secret reference (`env:NAME`, \
                     `file:/path`) to the credential the clone sends as HTTP basic \
                     authentication: `user:password`, or a token alone (sent as \
                     `x-access-token:<token>`, GitHub's convention). The secret policy must \
                     allow it, and a member's task may name only secrets granted to its \
                     workspace (422). Resolved by the worker for the clone alone: the run's \
                     processes and the workspace's git configuration never see it.",
                ))
                .into(),
        ),
        (
            "push_branch",
            false,
            string(true, BRANCH, Some(255))
                .description(Some(
                    "With `repo`: once a run completes, its workspace's changes are \
                     committed (as Keel, dated at the run's creation) and pushed to this \
                     branch of `repo`, with `repo_credential`, as a `workspace_push` step. \
                     Not `base_branch` (422). The push reaches a remote: a task with one \
                     needs the `git_exec` approval (and `network_egress`) at admission where \
                     the policies gate them. A push git refuses (the branch moved elsewhere) \
                     fails the run with `push_failed:` and git's message.",
                ))
                .into(),
        ),
        (
            "working_directory",
            false,
            string(true, ABSOLUTE_PATH, None)
                .description(Some(
                    "`in_place` only (required there, refused otherwise; stated): an \
                     absolute directory without `..`, beneath a workspace root and outside \
                     Keel's data directory once links are resolved (422 otherwise).",
                ))
                .into(),
        ),
        (
            "sandbox_allowed_root",
            false,
            string(true, ABSOLUTE_PATH, None)
                .description(Some(
                    "`in_place` only: an absolute directory beneath a workspace root that \
                     `working_directory` must lie beneath, narrowing the roots for this \
                     task.",
                ))
                .into(),
        ),
        (
            "sandbox_network",
            false,
            boolean(true)
                .description(Some(
                    "Whether shell and git children may use the network (default true); \
                     false runs them with only loopback.",
                ))
                .into(),
        ),
        (
            "timeout_ms",
            false,
            integer(true, 1, DEFAULT_MAX_TIMEOUT_MS)
                .description(Some(
                    "At most KEEL_RUN_TIMEOUT_MAX_MS (24 h unless the operator changed it); \
                     absent: KEEL_RUN_TIMEOUT_MS.",
                ))
                .into(),
        ),
        (
            "priority",
            false,
            integer(true, i32::MIN.into(), i32::MAX.into())
                .description(Some("Higher runs first (default 0)."))
                .into(),
        ),
        (
            "budget_micros_usd",
            false,
            integer(true, 0, i64::MAX)
                .description(Some(
                    "Cost ceiling of the task's runs in micro-USD; 0 or absent: none.",
                ))
                .into(),
        ),
        (
            "start",
            false,
            boolean(true)
                .description(Some(
                    "True: the task is started in the same request and transaction, as \
                     `POST /v1/tasks/{task_id}/start` with no body would; the response's \
                     task then has `latest_run_id` and its run's status (default false).",
                ))
                .into(),
        ),
    ];
    if kind != "agent_loop" {
        fields.push((
            "prompt",
            false,
            string(true, NO_NUL, Some(MAX_COMMAND_BYTES))
                .description(Some("Kept with the task, for people (at most 64 KiB)."))
                .into(),
        ));
    }
    if kind != "file" {
        fields.push((
            "sandbox_read_only",
            false,
            boolean(true)
                .description(Some(
                    "Whether the workspace is read-only for the run (default false).",
                ))
                .into(),
        ));
    }
    fields
}

/// A task as the API shows it, with its latest run's projection.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "sqlx", derive(sqlx::FromRow))]
#[schema(example = json!({
    "id": "task_01a22b05c3e1734c9d7a0f2b6e41d890", "title": "echo hello from keel",
    "execution_kind": "shell", "status": "completed", "prompt": null, "shell_command": "echo hello from keel", "git_command": null,
    "file_path": null, "file_content": null, "file_operation": null,
    "working_directory": null, "workspace_mode": "ephemeral", "repo": null, "base_branch": null, "repo_credential": null, "push_branch": null, "sandbox_allowed_root": null, "sandbox_network": true, "sandbox_read_only": false, "timeout_ms": 60000, "priority": 5, "budget_micros_usd": 2000000,
    "system_prompt": null, "requested_provider": null, "requested_model": null,
    "max_model_calls": null, "reasoning_effort": null, "workspace_system_prompt_policy": null, "tools": null, "mcp_servers": null, "execution_profile": null, "run_count": 1,
    "latest_run_id": "run_01a22b05d1f27a6b8c9e0d1f2a3b4c5d", "latest_run_step_count": 1,
    "latest_run_artifact_count": 2, "created_at": "2026-11-30T09:00:00Z",
    "updated_at": "2026-11-30T09:01:12Z"
}))]
pub struct TaskRecord {
    pub id: String,
    /// What lists show: as given at creation, or derived from the prompt or command.
    pub title: String,
    #[schema(value_type = ExecutionKind)]
    pub execution_kind: String,
    pub status: TaskStatus,
    pub prompt: Option<String>,
    pub shell_command: Option<String>,
    pub git_command: Option<String>,
    pub file_path: Option<String>,
    pub file_content: Option<String>,
    #[schema(value_type = Option<FileOperation>)]
    pub file_operation: Option<String>,
    pub working_directory: Option<String>,
    #[schema(value_type = WorkspaceMode)]
    pub workspace_mode: String,
    /// The repository an ephemeral workspace starts as a clone of (null: none).
    pub repo: Option<String>,
    /// The branch the clone checks out (null: the repository's default).
    pub base_branch: Option<String>,
    /// The secret reference of the credential the clone sends (null: none); never its value.
    pub repo_credential: Option<String>,
    /// The branch a completed run's changes are pushed to (null: none).
    pub push_branch: Option<String>,
    /// For `in_place`: the directory the task narrows the workspace roots to.
    pub sandbox_allowed_root: Option<String>,
    /// False: shell and git children run with only loopback, and need no `network_egress`.
    pub sandbox_network: bool,
    /// True: the workspace is read-only for shell and git children; file writes are refused.
    pub sandbox_read_only: bool,
    pub timeout_ms: Option<i64>,
    pub priority: i32,
    pub budget_micros_usd: i64,
    /// `agent_loop` only (null otherwise): the system prompt.
    pub system_prompt: Option<String>,
    /// `agent_loop` only: the provider preset id asked for (null: the workspace's first
    /// enabled chat preset).
    pub requested_provider: Option<String>,
    /// `agent_loop` only: the model asked for (null: the preset's).
    pub requested_model: Option<String>,
    /// `agent_loop` only: the most model calls across the resume chain.
    pub max_model_calls: Option<i32>,
    /// `agent_loop` only: the reasoning effort asked of the model (null: the provider's
    /// default).
    pub reasoning_effort: Option<String>,
    /// `agent_loop` only: whether its runs read the workspace's instruction files (null:
    /// `include`).
    pub workspace_system_prompt_policy: Option<String>,
    /// `agent_loop` only: the tools the model may call (null: the whole catalog the sandbox
    /// allows).
    pub tools: Option<Vec<String>>,
    /// `agent_loop` only: the MCP servers its runs reach (null: none), secret references
    /// as written.
    #[schema(value_type = Option<Vec<McpServer>>)]
    pub mcp_servers: Option<McpServers>,
    /// `agent_loop` only: the profile whose defaults the task was created with (null: none).
    #[schema(value_type = Option<ExecutionProfile>)]
    pub execution_profile: Option<String>,
    pub run_count: i32,
    pub latest_run_id: Option<String>,
    pub latest_run_step_count: i64,
    pub latest_run_artifact_count: i64,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl TaskRecord {
    /// Whether the task is an agent loop; every other kind runs a process.
    pub fn is_agent_loop(&self) -> bool {
        self.execution_kind == ExecutionKind::AgentLoop.as_str()
    }
}

closed_set! {
    /// Defaults an agent loop task can be created with, for a kind of work.
    ExecutionProfile {
        CodingAgent = "coding_agent",
    }
}

closed_set! {
    /// What a `file` task does to its path.
    FileOperation {
        Write = "write",
        Append = "append",
        Delete = "delete",
    }
}

closed_set! {
    /// Where a task's runs work: a fresh directory of their own (`ephemeral`), one
    /// directory of the task's kept across its runs (`persistent`), or an existing one
    /// beneath the workspace roots (`in_place`).
    WorkspaceMode {
        Ephemeral = "ephemeral",
        Persistent = "persistent",
        InPlace = "in_place",
    }
}

closed_set! {
    /// What a task runs: a shell command, git arguments, a file operation, or an agent loop.
    ExecutionKind {
        Shell = "shell",
        Git = "git",
        File = "file",
        AgentLoop = "agent_loop",
    }
}

/// Optional body of start, retry and resume.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({ "reason": "nightly check", "budget_micros_usd": 5000000 }))]
pub struct StartRequest {
    /// Why, for the run's `run.created` event.
    pub reason: Option<String>,
    /// Raises the task's budget (never lowers it); micro-USD, not negative.
    #[schema(minimum = 0)]
    pub budget_micros_usd: Option<i64>,
}

/// A task's status: `not_started` until its first run, then its latest run's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "sqlx", derive(sqlx::Type))]
#[cfg_attr(feature = "sqlx", sqlx(type_name = "text", rename_all = "snake_case"))]
pub enum TaskStatus {
    NotStarted,
    Queued,
    Running,
    AwaitingApproval,
    Completed,
    Failed,
    Cancelled,
}

impl TaskStatus {
    /// Whether the task's latest run is still going (or waiting for an approval).
    pub fn is_active(self) -> bool {
        matches!(
            self,
            TaskStatus::Queued | TaskStatus::Running | TaskStatus::AwaitingApproval
        )
    }

    pub fn parse(value: &str) -> Option<TaskStatus> {
        match value {
            "not_started" => Some(TaskStatus::NotStarted),
            other => RunStatus::parse(other).map(TaskStatus::from),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            TaskStatus::NotStarted => "not_started",
            TaskStatus::Queued => "queued",
            TaskStatus::Running => "running",
            TaskStatus::AwaitingApproval => "awaiting_approval",
            TaskStatus::Completed => "completed",
            TaskStatus::Failed => "failed",
            TaskStatus::Cancelled => "cancelled",
        }
    }
}

impl std::fmt::Display for TaskStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A started task's status is its latest run's.
impl From<RunStatus> for TaskStatus {
    fn from(status: RunStatus) -> Self {
        match status {
            RunStatus::Queued => TaskStatus::Queued,
            RunStatus::Running => TaskStatus::Running,
            RunStatus::AwaitingApproval => TaskStatus::AwaitingApproval,
            RunStatus::Completed => TaskStatus::Completed,
            RunStatus::Failed => TaskStatus::Failed,
            RunStatus::Cancelled => TaskStatus::Cancelled,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn task_status_names_round_trip() {
        assert_eq!(
            TaskStatus::parse("not_started"),
            Some(TaskStatus::NotStarted)
        );
        assert_eq!(TaskStatus::parse("running"), Some(TaskStatus::Running));
        assert_eq!(TaskStatus::parse("bogus"), None);
        for status in RunStatus::ALL {
            assert_eq!(TaskStatus::from(status).as_str(), status.as_str());
        }
    }
}
