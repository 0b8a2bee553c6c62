//! Task rows, with the latest-run projection computed at read time.

use keel_api_types::ErrorCode;
use std::collections::BTreeMap;

use keel_workers::{Execution, FileOperation};
use sqlx::PgConnection;
use sqlx::types::Json;

use crate::db::{Result, StoreError};
use crate::domain::{Actor, Role, Scope, new_id};
use crate::events::transitions;
use crate::events::transitions::Transition;
use crate::providers;
use crate::providers::chat::{CHAT_APIS, chat_api};
use crate::providers::{ProviderRecord, query_providers};
use crate::tasks::Hooks;
use crate::tasks::{AgentLoop, TaskExecution, WorkspaceMode};
use crate::tasks::{NewTask, TaskStatus};

use keel_api_types::ExecutionKind;
use keel_api_types::McpServers;
pub(crate) use keel_api_types::TaskRecord;

/// `query_as!` of [`TaskRecord`]s: `$before` (up to its `SELECT`), then the columns of task
/// `t` with the projection of its latest run `r` (`status` as a [`TaskStatus`]), then
/// `$after` (its `FROM tasks t LEFT JOIN runs r ON r.id = t.latest_run_id …`).
macro_rules! query_tasks {
    ($before:literal, $after:literal $(+ $more:literal)* $(, $arg:expr)* $(,)?) => {
        sqlx::query_as!(
            TaskRecord,
            $before
                + r#" t.id, t.title, t.execution_kind,
                      COALESCE(r.status, 'not_started') AS "status!: TaskStatus", t.prompt,
                      t.shell_command, t.git_command, t.file_path, t.file_content,
                      t.file_operation, t.working_directory, t.workspace_mode, t.repo,
                      t.base_branch, t.repo_credential, t.push_branch, t.sandbox_allowed_root, t.sandbox_network, t.sandbox_read_only,
                      t.timeout_ms, t.priority, t.budget_micros_usd, t.system_prompt,
                      t.requested_provider, t.requested_model, t.max_model_calls,
                      t.reasoning_effort, t.workspace_system_prompt_policy, t.tools,
                      t.mcp_servers AS "mcp_servers: McpServers", t.execution_profile,
                      t.run_count, t.latest_run_id,
                      (SELECT count(*) FROM steps s WHERE s.run_id = t.latest_run_id)
                          AS "latest_run_step_count!",
                      (SELECT count(*) FROM artifacts a WHERE a.run_id = t.latest_run_id)
                          AS "latest_run_artifact_count!",
                      t.created_at, t.updated_at "#
                + $after
                $(+ $more)*
            $(, $arg)*
        )
    };
}

/// What the runtime reads off a stored task (the wire type lives in `keel-api-types`,
/// which knows nothing of executors).
pub(crate) trait TaskRecordExt {
    /// What the task's runs may reach, in `workspace_id` (whose egress allowances apply).
    fn sandbox(&self, workspace_id: &str) -> keel_workers::SandboxPolicy;
    /// What a run of this task executes.
    fn execution(&self) -> std::result::Result<Execution, String>;
    /// Where runs of this task work, for people: `ephemeral` or `in_place: <dir>`.
    fn workspace_description(&self) -> String;
}

impl TaskRecordExt for TaskRecord {
    fn sandbox(&self, workspace_id: &str) -> keel_workers::SandboxPolicy {
        keel_workers::SandboxPolicy {
            network: self.sandbox_network,
            read_only: self.sandbox_read_only,
            workspace_id: Some(workspace_id.into()),
        }
    }

    fn execution(&self) -> std::result::Result<Execution, String> {
        let missing = || {
            format!(
                "task {} is missing its {} fields",
                self.id, self.execution_kind
            )
        };
        let kind = ExecutionKind::parse(&self.execution_kind)
            .ok_or_else(|| format!("unknown execution kind {}", self.execution_kind))?;
        match kind {
            ExecutionKind::Shell => Ok(Execution::Shell {
                command: self.shell_command.clone().ok_or_else(missing)?,
            }),
            ExecutionKind::Git => Ok(Execution::Git {
                command: self.git_command.clone().ok_or_else(missing)?,
            }),
            ExecutionKind::File => {
                let operation = match self.file_operation.as_deref() {
                    Some("write") => FileOperation::Write,
                    Some("append") => FileOperation::Append,
                    Some("delete") => FileOperation::Delete,
                    _ => return Err(missing()),
                };
                let path = self.file_path.clone().ok_or_else(missing)?;
                Ok(Execution::File {
                    path,
                    content: self.file_content.clone(),
                    operation,
                })
            }
            ExecutionKind::AgentLoop => {
                Err(format!("task {} is an agent loop, not a process", self.id))
            }
        }
    }

    fn workspace_description(&self) -> String {
        match &self.working_directory {
            Some(directory) if self.workspace_mode == "in_place" => {
                format!("in_place: {directory}")
            }
            _ if self.workspace_mode == "persistent" => {
                "persistent (the task's directory, kept across its runs)".to_string()
            }
            _ => "ephemeral (a fresh directory per run)".to_string(),
        }
    }
}

/// Stores a new task; one whose `in_place` directory nests with another task's is refused
/// ([`refuse_nesting`]).
pub async fn insert(
    conn: &mut PgConnection,
    scope: &Scope,
    task: &NewTask,
    actor: &Actor,
) -> Result<TaskRecord> {
    refuse_nesting(conn, task).await?;
    let id = new_id("task");
    let none = AgentLoop::default();
    let (process, agent) = match &task.execution {
        TaskExecution::Process(execution) => (execution_columns(execution), &none),
        TaskExecution::AgentLoop(agent) => (ProcessColumns::agent_loop(), agent),
    };
    let (mode, directory, allowed_root) = workspace_columns(&task.workspace);
    let repo = task.repo.as_ref();
    // One statement: the row, its audit record, and the row as the API shows it (a new
    // task has no run, so its projection is written out rather than read).
    let hooks = task
        .hooks
        .as_ref()
        .map(|hooks| serde_json::to_value(hooks).expect("hooks serialize"));
    let mcp_servers = agent
        .mcp_servers
        .as_ref()
        .map(|servers| serde_json::to_value(servers).expect("servers serialize"));
    let created = sqlx::query_as!(
        TaskRecord,
        r#"WITH created AS (
             INSERT INTO tasks (id, title, execution_kind, prompt, shell_command, git_command, file_path,
                                file_content, file_operation, working_directory, workspace_mode,
                                sandbox_allowed_root, sandbox_network, sandbox_read_only,
                                timeout_ms, priority, budget_micros_usd, workspace_id,
                                system_prompt, requested_provider, requested_model,
                                max_model_calls, tools, hooks, reasoning_effort,
                                workspace_system_prompt_policy, repo, base_branch,
                                mcp_servers, written_by_role, repo_credential,
                                execution_profile, push_branch)
             VALUES ($1, $34, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16,
                     $17, $19, $20, $21, $22, $23, $24, $25, $26, $27, $28, $29, $30, $31, $32,
                     $33)
             RETURNING *
         ), audit AS (
             INSERT INTO state_transitions (workspace_id, entity_type, entity_id, task_id,
                                            from_status, to_status, reason, actor)
             SELECT workspace_id, 'task', id, id, NULL, 'not_started', 'created', $18
             FROM created
         )
         SELECT id, title, execution_kind, 'not_started' AS "status!: TaskStatus", prompt,
                shell_command, git_command, file_path, file_content, file_operation,
                working_directory, workspace_mode, repo, base_branch, repo_credential,
                push_branch, sandbox_allowed_root,
                sandbox_network,
                sandbox_read_only, timeout_ms, priority, budget_micros_usd, system_prompt,
                requested_provider, requested_model, max_model_calls, reasoning_effort,
                workspace_system_prompt_policy, tools,
                mcp_servers AS "mcp_servers: McpServers", execution_profile, run_count,
                latest_run_id, 0::bigint AS "latest_run_step_count!",
                0::bigint AS "latest_run_artifact_count!", created_at, updated_at
         FROM created"#,
        id,
        process.kind,
        task.prompt,
        process.shell,
        process.git,
        process.path,
        process.content,
        process.operation,
        directory,
        mode,
        allowed_root,
        task.sandbox.network,
        task.sandbox.read_only,
        task.timeout_ms,
        task.priority,
        task.budget_micros_usd,
        scope.workspace(),
        actor.to_string(),
        agent.system_prompt,
        agent.requested_provider,
        agent.requested_model,
        agent.max_model_calls,
        agent.tools.as_deref(),
        hooks,
        agent.reasoning_effort,
        agent.workspace_system_prompt_policy,
        repo.map(|repo| repo.url.as_str()),
        repo.and_then(|repo| repo.base_branch.as_deref()),
        mcp_servers,
        task.written_by.as_str(),
        repo.and_then(|repo| repo.credential.as_ref())
            .map(ToString::to_string),
        agent.execution_profile,
        repo.and_then(|repo| repo.push_branch.as_deref()),
        task.title,
    )
    .fetch_one(conn)
    .await?;
    Ok(created)
}

/// A process execution's columns: its kind and the one command, or the file operation,
/// it names (an agent loop's row names none).
struct ProcessColumns<'a> {
    kind: &'static str,
    shell: Option<&'a String>,
    git: Option<&'a String>,
    path: Option<&'a String>,
    content: Option<&'a String>,
    operation: Option<&'static str>,
}

impl ProcessColumns<'_> {
    fn agent_loop() -> Self {
        ProcessColumns {
            kind: ExecutionKind::AgentLoop.as_str(),
            shell: None,
            git: None,
            path: None,
            content: None,
            operation: None,
        }
    }
}

fn execution_columns(execution: &Execution) -> ProcessColumns<'_> {
    let none = ProcessColumns::agent_loop();
    match execution {
        Execution::Shell { command } => ProcessColumns {
            kind: "shell",
            shell: Some(command),
            ..none
        },
        Execution::Git { command } => ProcessColumns {
            kind: "git",
            git: Some(command),
            ..none
        },
        Execution::File {
            path,
            content,
            operation,
        } => ProcessColumns {
            kind: "file",
            path: Some(path),
            content: content.as_ref(),
            operation: Some(match operation {
                FileOperation::Write => "write",
                FileOperation::Append => "append",
                FileOperation::Delete => "delete",
            }),
            ..none
        },
    }
}

/// The workspace mode's columns: the mode, and an `in_place` task's directory and root.
fn workspace_columns(
    workspace: &WorkspaceMode,
) -> (&'static str, Option<&String>, Option<&String>) {
    match workspace {
        WorkspaceMode::Ephemeral => ("ephemeral", None, None),
        WorkspaceMode::Persistent => ("persistent", None, None),
        WorkspaceMode::InPlace {
            directory,
            allowed_root,
        } => ("in_place", Some(directory), allowed_root.as_ref()),
    }
}

pub async fn get(conn: &mut PgConnection, scope: &Scope, id: &str) -> Result<TaskRecord> {
    query_tasks!(
        "SELECT",
        "FROM tasks t LEFT JOIN runs r ON r.id = t.latest_run_id
         WHERE t.workspace_id = $1 AND t.id = $2",
        scope.workspace(),
        id,
    )
    .fetch_optional(conn)
    .await?
    .ok_or(StoreError::NotFound("task"))
}

/// [`list`]'s statement for an active status (`queued`, `running`, `awaiting_approval`):
/// read from the active runs (`runs_workspace_active_task`), since a task's active run is
/// its latest and its only one, so the page costs the same however many finished tasks the
/// workspace holds. One statement per status, the status written in it: with the status a
/// parameter, PostgreSQL planned each execution anew on a large history (a custom plan
/// looked cheaper than the generic one), 0.35 ms a request for a 5 µs read.
macro_rules! list_active {
    ($conn:expr, $scope:expr, $status:literal, $before:expr, $limit:expr) => {
        query_tasks!(
            "SELECT",
            "FROM runs r JOIN tasks t ON t.id = r.task_id AND t.latest_run_id = r.id
             WHERE r.workspace_id = $1 AND r.status = '"
                + $status
                + "'
               AND ($2::text IS NULL OR r.task_id < $2)
             ORDER BY r.task_id DESC LIMIT $3",
            $scope.workspace(),
            $before,
            $limit,
        )
        .fetch_all($conn)
        .await?
    };
}

/// Newest first; `before` is the id of the last task of the previous page.
pub async fn list(
    conn: &mut PgConnection,
    scope: &Scope,
    status: Option<TaskStatus>,
    before: Option<&str>,
    limit: i64,
) -> Result<Vec<TaskRecord>> {
    let rows = match status {
        Some(TaskStatus::Queued) => list_active!(conn, scope, "queued", before, limit),
        Some(TaskStatus::Running) => list_active!(conn, scope, "running", before, limit),
        Some(TaskStatus::AwaitingApproval) => {
            list_active!(conn, scope, "awaiting_approval", before, limit)
        }
        _ => list_by_task(conn, scope, status, before, limit).await?,
    };
    Ok(rows)
}

/// The most rows [`list`] returns: the `LIMIT` written in [`walk_tasks`] (the API asks
/// for at most a page and one more).
pub const LIST_MAX_ROWS: i64 = 201;

/// [`list`]'s statement walking the workspace's tasks newest first, with `$filter` (its
/// arguments from `$3` on), so that one cached plan serves every page:
/// - One statement per combination of status and cursor rather than one with optional
///   ones: a generic plan of `($n IS NULL OR …)` can use neither as an index bound, so it
///   walked every newer task of the workspace to reach a cursor (31 ms a page at 200,000
///   tasks) and on a few thousand tasks joined and sorted them all (5 ms).
/// - The page's size is applied outside a written `LIMIT 201`: a generic plan prices a
///   `LIMIT $n` as a tenth of the rows, a parallel walk of a large workspace, so
///   PostgreSQL planned every page anew (0.3 ms each at 1,000,000 tasks). The executor
///   reads only what the outer limit takes.
macro_rules! walk_tasks {
    ($conn:expr, $scope:expr, $limit:expr, $filter:literal $(, $arg:expr)*) => {
        query_tasks!(
            "SELECT * FROM (SELECT",
            "FROM tasks t LEFT JOIN runs r ON r.id = t.latest_run_id
             WHERE t.workspace_id = $1 "
                + $filter
                + " ORDER BY t.id DESC LIMIT 201) page LIMIT $2",
            $scope.workspace(),
            $limit
            $(, $arg)*
        )
        .fetch_all($conn)
        .await?
    };
}

/// [`list`] walking the workspace's tasks: every task, or those whose latest run ended as
/// `status` (or that have none, `not_started`), filtered after the join.
async fn list_by_task(
    conn: &mut PgConnection,
    scope: &Scope,
    status: Option<TaskStatus>,
    before: Option<&str>,
    limit: i64,
) -> Result<Vec<TaskRecord>> {
    let rows = match (status.map(TaskStatus::as_str), before) {
        (None, None) => walk_tasks!(conn, scope, limit, ""),
        (None, Some(before)) => walk_tasks!(conn, scope, limit, "AND t.id < $3", before),
        (Some(status), None) => walk_tasks!(
            conn,
            scope,
            limit,
            "AND COALESCE(r.status, 'not_started') = $3",
            status
        ),
        (Some(status), Some(before)) => walk_tasks!(
            conn,
            scope,
            limit,
            "AND COALESCE(r.status, 'not_started') = $3 AND t.id < $4",
            status,
            before
        ),
    };
    Ok(rows)
}

/// Whether the canonical `directory` contains, or lies inside, the `in_place` directory of
/// a task other than `except`, in any workspace (an imported item's task works in the
/// item's directory). The same directory is not nesting: two tasks on one checkout are a
/// matter of locking, not of one run reaching beneath another's files.
pub(crate) async fn in_place_nesting(
    conn: &mut PgConnection,
    directory: &str,
    except: Option<&str>,
) -> Result<bool> {
    Ok(sqlx::query_scalar!(
        r#"SELECT EXISTS (
               SELECT 1 FROM tasks
                WHERE workspace_mode = 'in_place' AND id IS DISTINCT FROM $2
                  AND (starts_with(working_directory, rtrim($1, '/') || '/')
                       OR starts_with($1, rtrim(working_directory, '/') || '/'))
           ) AS "nested!""#,
        directory,
        except,
    )
    .fetch_one(conn)
    .await?)
}

/// Refuses a new task whose `in_place` directory nests with another task's
/// ([`in_place_nesting`]). The runs of a task check again before each attempt.
async fn refuse_nesting(conn: &mut PgConnection, task: &NewTask) -> Result<()> {
    match task.in_place_directory() {
        Some(directory) if in_place_nesting(conn, directory, None).await? => {
            Err(StoreError::Unprocessable {
                code: ErrorCode::InvalidRequest,
                message: format!("working_directory: {}", crate::tasks::NESTED_WORKSPACE),
            })
        }
        _ => Ok(()),
    }
}

/// Locks the task row: run admission and deletion both take this lock first, so they
/// serialize and a race between them has one durable winner.
pub(crate) async fn lock(conn: &mut PgConnection, scope: &Scope, id: &str) -> Result<()> {
    sqlx::query_scalar!(
        "SELECT id FROM tasks WHERE workspace_id = $1 AND id = $2 FOR UPDATE",
        scope.workspace(),
        id,
    )
    .fetch_optional(conn)
    .await?
    .map(|_| ())
    .ok_or(StoreError::NotFound("task"))
}

/// An imported task's workflow hooks (never part of its record): None for any other task.
pub(crate) async fn hooks(
    conn: &mut PgConnection,
    scope: &Scope,
    id: &str,
) -> Result<Option<Hooks>> {
    let hooks = sqlx::query_scalar!(
        r#"SELECT hooks AS "hooks: Json<Hooks>" FROM tasks WHERE workspace_id = $1 AND id = $2"#,
        scope.workspace(),
        id,
    )
    .fetch_optional(conn)
    .await?
    .flatten();
    Ok(hooks.map(|Json(hooks)| hooks))
}

/// Who wrote the task (its stored record does not say): what it may name is theirs to.
pub(crate) async fn written_by(conn: &mut PgConnection, scope: &Scope, id: &str) -> Result<Role> {
    let role = sqlx::query_scalar!(
        "SELECT written_by_role FROM tasks WHERE workspace_id = $1 AND id = $2",
        scope.workspace(),
        id,
    )
    .fetch_optional(conn)
    .await?
    .ok_or(StoreError::NotFound("task"))?;
    Ok(Role::stored(&role))
}

/// Reads the task and locks its row, as [`lock`] does.
pub(crate) async fn get_locked(
    conn: &mut PgConnection,
    scope: &Scope,
    id: &str,
) -> Result<TaskRecord> {
    query_tasks!(
        "SELECT",
        "FROM tasks t LEFT JOIN runs r ON r.id = t.latest_run_id
         WHERE t.workspace_id = $1 AND t.id = $2
         FOR UPDATE OF t",
        scope.workspace(),
        id,
    )
    .fetch_optional(conn)
    .await?
    .ok_or(StoreError::NotFound("task"))
}

/// Replaces a task's prompt: an external work item's retry renders it again with its
/// `attempt`.
pub(crate) async fn set_prompt(
    conn: &mut PgConnection,
    scope: &Scope,
    id: &str,
    prompt: &str,
) -> Result<()> {
    sqlx::query!(
        "UPDATE tasks SET prompt = $3, updated_at = now() WHERE workspace_id = $1 AND id = $2",
        scope.workspace(),
        id,
        prompt,
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Deletes a task with its runs, steps, artifacts and events; refuses while a run is active.
pub async fn delete(conn: &mut PgConnection, scope: &Scope, id: &str, actor: &Actor) -> Result<()> {
    let task = get(conn, scope, id).await?;
    lock(conn, scope, id).await?;
    let active = sqlx::query_scalar!(
        "SELECT id FROM runs WHERE workspace_id = $1 AND task_id = $2
           AND status IN ('queued', 'running', 'awaiting_approval') LIMIT 1",
        scope.workspace(),
        id,
    )
    .fetch_optional(&mut *conn)
    .await?;
    if let Some(run_id) = active {
        return Err(StoreError::ConflictNext {
            message: format!(
                "task {id} has an active run ({run_id}); cancel it before deleting the task"
            ),
            next: format!(
                "Cancel the run (keel runs cancel {run_id}), then delete the task again."
            ),
        });
    }
    sqlx::query!(
        "DELETE FROM run_events WHERE workspace_id = $1 AND task_id = $2",
        scope.workspace(),
        id,
    )
    .execute(&mut *conn)
    .await?;
    sqlx::query!(
        "DELETE FROM tasks WHERE workspace_id = $1 AND id = $2",
        scope.workspace(),
        id,
    )
    .execute(&mut *conn)
    .await?;
    // The audit trail outlives the task: it records the deletion too.
    let deleted = Transition {
        entity_type: "task",
        entity_id: id,
        task_id: Some(id),
        from: Some(task.status.as_str()),
        to: "deleted",
        reason: None,
    };
    transitions::record(conn, scope, deleted, actor).await
}

/// The provider presets and models an agent loop task's model calls go to, in order: the
/// first is the run's own, the others where a call fails over when a provider stays
/// unavailable. A task that names `requested_provider` or `requested_model` is pinned (as
/// seed 004 pins): one route, its preset (or the workspace's first enabled chat preset,
/// one whose api is a [`CHAT_APIS`] one) with its model (or the preset's). A
/// task that names neither has every enabled chat preset of the workspace that names a
/// model, oldest first. Refused with `provider_disabled` (422) when the named preset is
/// disabled, and `model_not_configured` (422) when it is not a chat preset of the
/// workspace or there is no preset with a model.
pub(crate) async fn chat_routes(
    conn: &mut PgConnection,
    scope: &Scope,
    task: &TaskRecord,
) -> Result<Vec<(ProviderRecord, String)>> {
    let refused = |message: String| StoreError::Unprocessable {
        code: ErrorCode::ModelNotConfigured,
        message,
    };
    let presets = match &task.requested_provider {
        Some(id) => vec![named_chat_preset(conn, scope, id).await?],
        None => {
            let enabled = query_providers!(
                "SELECT",
                "FROM providers WHERE workspace_id = $1 AND enabled ORDER BY created_at, id",
                scope.workspace(),
            )
            .fetch_all(&mut *conn)
            .await?;
            enabled
                .into_iter()
                .filter(|preset| chat_api(&preset.api).is_some())
                .collect()
        }
    };
    let Some(first) = presets.first().map(|preset| preset.id.clone()) else {
        return Err(refused(format!(
            "the workspace has no enabled chat provider preset (api {CHAT_APIS}); create one \
             or set requested_provider"
        )));
    };
    let pinned = task.requested_provider.is_some() || task.requested_model.is_some();
    let mut routes: Vec<(ProviderRecord, String)> = presets
        .into_iter()
        .filter_map(|preset| {
            let model = task.requested_model.as_ref().unwrap_or(&preset.model);
            let model = model.trim().to_string();
            (!model.is_empty()).then_some((preset, model))
        })
        .collect();
    if pinned {
        routes.truncate(1);
    }
    if routes.is_empty() {
        return Err(refused(format!(
            "provider preset {first} has no model and the task sets no requested_model"
        )));
    }
    Ok(routes)
}

/// The chat preset a task names, if it is an enabled chat preset of the workspace.
async fn named_chat_preset(
    conn: &mut PgConnection,
    scope: &Scope,
    id: &str,
) -> Result<ProviderRecord> {
    let preset = match providers::get(conn, scope, id).await {
        Ok(preset) => preset,
        Err(StoreError::NotFound(_)) => {
            return Err(StoreError::Unprocessable {
                code: ErrorCode::ModelNotConfigured,
                message: format!(
                    "requested_provider {id} is not a provider preset of this workspace"
                ),
            });
        }
        Err(error) => return Err(error),
    };
    if !preset.enabled {
        return Err(StoreError::Unprocessable {
            code: ErrorCode::ProviderDisabled,
            message: format!("requested_provider {id} is disabled"),
        });
    }
    if chat_api(&preset.api).is_none() {
        return Err(StoreError::Unprocessable {
            code: ErrorCode::ModelNotConfigured,
            message: format!(
                "provider preset {} speaks {}, not a chat api ({CHAT_APIS})",
                preset.id, preset.api
            ),
        });
    }
    Ok(preset)
}
