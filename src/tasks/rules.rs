//! Tasks: durable execution intent. A task is validated once, here, when it is created.

use std::path::{Component, Path, PathBuf};

use keel_api_types::{
    ExecutionProfile, MAX_TITLE_CHARS, REASONING_EFFORTS, WORKSPACE_SYSTEM_PROMPT_POLICIES,
    cut_chars,
};
pub use keel_api_types::{TaskDraft, TaskStatus};
use keel_workers::{Execution, FileOperation};

use crate::domain::{Invalid, Role, Scope};
use crate::providers::secrets::SecretRef;

const MAX_COMMAND_BYTES: usize = 64 * 1024;
const MAX_FILE_CONTENT_BYTES: usize = 1024 * 1024;
const MAX_PROMPT_BYTES: usize = 64 * 1024;

/// What a task runs: a process-like execution, or an agent loop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TaskExecution {
    Process(Execution),
    AgentLoop(AgentLoop),
}

/// An agent loop's settings (its prompt is the task's `prompt`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct AgentLoop {
    pub(crate) system_prompt: Option<String>,
    pub(crate) requested_provider: Option<String>,
    pub(crate) requested_model: Option<String>,
    pub(crate) max_model_calls: Option<i32>,
    pub(crate) reasoning_effort: Option<String>,
    pub(crate) workspace_system_prompt_policy: Option<String>,
    pub(crate) tools: Option<Vec<String>>,
    /// Normalized by [`super::mcp::parse_mcp_servers`].
    pub(crate) mcp_servers: Option<Vec<keel_api_types::McpServer>>,
    /// Checked by [`with_profile`], which wrote its defaults into the other fields.
    pub(crate) execution_profile: Option<String>,
}

/// Where a run works.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum WorkspaceMode {
    /// A fresh directory per run under the worker's data directory.
    Ephemeral,
    /// One directory of the task's under the worker's data directory, kept across its runs.
    Persistent,
    /// The given absolute directory, as it is, beneath the workspace roots (and beneath
    /// `allowed_root` when the task narrows them).
    InPlace {
        directory: String,
        allowed_root: Option<String>,
    },
}

/// Where `in_place` runs may work (`KEEL_WORKSPACE_ROOTS`). Paths are compared in their
/// canonical form, so a symbolic link inside a root that leads out of every root is refused;
/// the data directory (other runs' workspaces, the embedded cluster) is always refused. The
/// API checks at task creation and workers again before each run, since the directories
/// (and the roots) may have changed in between.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WorkspaceRoots {
    roots: Vec<PathBuf>,
    data_dir: Option<PathBuf>,
}

impl WorkspaceRoots {
    /// Fails on a root that does not exist.
    pub(crate) fn new(roots: &[PathBuf], data_dir: &Path) -> Result<WorkspaceRoots, String> {
        let roots = roots
            .iter()
            .filter(|root| !root.as_os_str().is_empty())
            .map(|root| {
                std::fs::canonicalize(root)
                    .map_err(|e| format!("KEEL_WORKSPACE_ROOTS: {}: {e}", root.display()))
            })
            .collect::<Result<_, _>>()?;
        let data_dir = std::path::absolute(data_dir)
            .map_err(|e| format!("KEEL_DATA_DIR: {}: {e}", data_dir.display()))?;
        Ok(WorkspaceRoots {
            roots,
            data_dir: Some(data_dir),
        })
    }

    /// The data directory the roots were configured with (it holds ephemeral workspaces).
    pub(crate) fn data_dir(&self) -> Option<&Path> {
        self.data_dir.as_deref()
    }

    /// The canonical directory an `in_place` workspace resolves to, if the roots allow it.
    pub(crate) fn confine(
        &self,
        directory: &str,
        allowed_root: Option<&str>,
    ) -> Result<PathBuf, Invalid> {
        if self.roots.is_empty() {
            return Err(Invalid::new(
                "working_directory",
                "workspace_mode in_place is refused: no workspace roots are configured \
                 (set KEEL_WORKSPACE_ROOTS to the directories runs may work in)",
            ));
        }
        let within = match allowed_root {
            Some(root) => vec![self.resolve("sandbox_allowed_root", root, &self.roots)?],
            None => self.roots.clone(),
        };
        self.resolve("working_directory", directory, &within)
    }

    /// Canonicalizes `path` and checks that it lies beneath one of `within` and outside the
    /// data directory.
    fn resolve(
        &self,
        field: &'static str,
        path: &str,
        within: &[PathBuf],
    ) -> Result<PathBuf, Invalid> {
        let real = std::fs::canonicalize(path)
            .map_err(|e| Invalid::new(field, format!("{path} cannot be resolved: {e}")))?;
        if !real.is_dir() {
            return Err(Invalid::new(field, format!("{path} is not a directory")));
        }
        // Resolved at each check: the API may start before a worker creates the directory.
        let data_dir = self
            .data_dir
            .as_ref()
            .map(|d| std::fs::canonicalize(d).unwrap_or_else(|_| d.clone()));
        if data_dir.is_some_and(|d| real.starts_with(d)) {
            return Err(Invalid::new(
                field,
                format!("{path} is inside Keel's data directory (KEEL_DATA_DIR)"),
            ));
        }
        if !within.iter().any(|root| real.starts_with(root)) {
            let roots: Vec<_> = within.iter().map(|r| r.display().to_string()).collect();
            return Err(Invalid::new(
                field,
                format!(
                    "{path} (resolved to {}) is not beneath {}",
                    real.display(),
                    roots.join(", ")
                ),
            ));
        }
        Ok(real)
    }

    /// The roots granted to `scope`'s remote callers: `<root>/<workspace directory name>`
    /// beneath each root where an operator (or Keel, for an item workspace) made that
    /// directory, a directory itself and no symbolic link.
    fn granted_to(&self, scope: &Scope) -> Vec<PathBuf> {
        self.roots
            .iter()
            .map(|root| root.join(scope.directory_name()))
            .filter(|tenant| std::fs::canonicalize(tenant).is_ok_and(|real| &real == tenant))
            .filter(|tenant| tenant.is_dir())
            .collect()
    }
}

/// How long runs may take (`KEEL_RUN_TIMEOUT_MS`, `KEEL_RUN_TIMEOUT_MAX_MS`): the API
/// refuses a task asking for more than the max and records the default on a task that
/// asks for nothing; workers apply both to tasks stored before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunTimeouts {
    default_ms: i64,
    max_ms: i64,
}

impl RunTimeouts {
    pub(crate) const DEFAULT_MS: u64 = 3600 * 1000;
    pub(crate) const DEFAULT_MAX_MS: u64 = 24 * 3600 * 1000;

    pub(crate) fn new(default_ms: u64, max_ms: u64) -> Result<RunTimeouts, String> {
        let max_ms = i64::try_from(max_ms)
            .ok()
            .filter(|ms| *ms >= 1)
            .ok_or("KEEL_RUN_TIMEOUT_MAX_MS must be at least 1 ms")?;
        let default_ms = i64::try_from(default_ms)
            .ok()
            .filter(|ms| (1..=max_ms).contains(ms))
            .ok_or_else(|| {
                format!(
                    "KEEL_RUN_TIMEOUT_MS must be between 1 and KEEL_RUN_TIMEOUT_MAX_MS ({max_ms})"
                )
            })?;
        Ok(RunTimeouts { default_ms, max_ms })
    }

    /// The timeout a run of a task gets: the task's own, or the default, never above the
    /// max.
    pub(crate) fn effective_ms(&self, task_ms: Option<i64>) -> i64 {
        task_ms.unwrap_or(self.default_ms).min(self.max_ms)
    }

    fn parse(&self, requested: Option<i64>) -> Result<i64, Invalid> {
        match requested {
            Some(ms) if !(1..=self.max_ms).contains(&ms) => Err(Invalid::new(
                "timeout_ms",
                format!(
                    "must be between 1 and {} (KEEL_RUN_TIMEOUT_MAX_MS)",
                    self.max_ms
                ),
            )),
            requested => Ok(self.effective_ms(requested)),
        }
    }
}

impl Default for RunTimeouts {
    fn default() -> Self {
        RunTimeouts::new(RunTimeouts::DEFAULT_MS, RunTimeouts::DEFAULT_MAX_MS)
            .expect("the defaults are consistent")
    }
}

/// A validated task, ready to store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewTask {
    /// As given, or derived from the prompt or command ([`derived_title`]).
    pub(crate) title: String,
    pub(crate) execution: TaskExecution,
    pub(crate) prompt: Option<String>,
    pub(crate) workspace: WorkspaceMode,
    pub(crate) sandbox: keel_workers::SandboxPolicy,
    /// The task's timeout, or the default when it asked for none.
    pub(crate) timeout_ms: i64,
    pub(crate) priority: i32,
    /// Cost ceiling in micro-USD for the task's runs; 0 disables it.
    pub(crate) budget_micros_usd: i64,
    /// External work: the workflow's hooks, run around each attempt (never from a request).
    pub(crate) hooks: Option<crate::tasks::Hooks>,
    /// The repository an ephemeral workspace starts as a clone of.
    pub(crate) repo: Option<RepoSource>,
    /// Who wrote the task, which decides the secrets it may name (a member's: only those
    /// granted to its workspace). A member unless the API says otherwise.
    pub(crate) written_by: Role,
}

/// A repository a run's workspace starts as a clone of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RepoSource {
    /// A URL without credentials, or an absolute path.
    pub(crate) url: String,
    /// The branch to check out; None: the repository's default.
    pub(crate) base_branch: Option<String>,
    /// The credential the clone (and the push) sends, by reference.
    pub(crate) credential: Option<SecretRef>,
    /// The branch a completed run's changes are committed and pushed to; None: not pushed.
    pub(crate) push_branch: Option<String>,
}

/// A coding agent's system prompt when its task sets none.
const CODING_AGENT_PROMPT: &str = "You are a careful software engineer working in a git \
repository. Read a file before you change it; prefer file_edit for a targeted change over \
rewriting a whole file; look at your changes with git_diff before you finish; keep changes \
small, and say in your final answer what you changed and why.";

/// A coding agent's timeout when its task sets none (within `KEEL_RUN_TIMEOUT_MAX_MS`).
const CODING_AGENT_TIMEOUT_MS: i64 = 300_000;

/// The draft with its `execution_profile`'s defaults in the fields it leaves unset.
fn with_profile(mut draft: TaskDraft, timeouts: &RunTimeouts) -> Result<TaskDraft, Invalid> {
    let Some(named) = draft.execution_profile.as_deref() else {
        return Ok(draft);
    };
    let profile = ExecutionProfile::parse(named).ok_or_else(|| {
        let expected = ExecutionProfile::names();
        Invalid::new("execution_profile", format!("must be one of {expected}"))
    })?;
    if draft.execution_kind.as_deref() != Some("agent_loop") {
        return Err(Invalid::new(
            "execution_profile",
            "is only for execution_kind agent_loop",
        ));
    }
    match profile {
        ExecutionProfile::CodingAgent => {
            if draft.repo.is_none() {
                return Err(Invalid::new(
                    "execution_profile",
                    "coding_agent needs a repo: the repository the agent works on",
                ));
            }
            draft
                .workspace_mode
                .get_or_insert_with(|| "persistent".into());
            draft
                .timeout_ms
                .get_or_insert(CODING_AGENT_TIMEOUT_MS.min(timeouts.max_ms));
            draft
                .system_prompt
                .get_or_insert_with(|| CODING_AGENT_PROMPT.into());
        }
    }
    Ok(draft)
}

impl NewTask {
    pub fn parse(draft: TaskDraft, timeouts: &RunTimeouts) -> Result<NewTask, Invalid> {
        let draft = with_profile(draft, timeouts)?;
        let kind = draft.execution_kind.as_deref().ok_or_else(|| {
            Invalid::new(
                "execution_kind",
                "is required (shell, git, file or agent_loop)",
            )
        })?;
        let process = TaskExecution::Process;
        let execution = match kind {
            "shell" => process(parse_shell(&draft)?),
            "git" => process(parse_git(&draft)?),
            "file" => process(parse_file(&draft)?),
            "agent_loop" => TaskExecution::AgentLoop(parse_agent_loop(&draft)?),
            other => {
                return Err(Invalid::new(
                    "execution_kind",
                    format!(
                        "unknown execution kind '{other}' (expected shell, git, file or agent_loop)"
                    ),
                ));
            }
        };
        let prompt = draft.prompt.clone();
        check_len("prompt", prompt.as_deref(), MAX_PROMPT_BYTES)?;
        let title = match parse_title(draft.title.as_deref())? {
            Some(title) => title,
            None => derived_title(&execution, prompt.as_deref()),
        };
        let timeout_ms = timeouts.parse(draft.timeout_ms)?;
        let sandbox = parse_sandbox(&draft, &execution)?;
        let workspace = parse_workspace(&draft)?;
        let repo = parse_repo(&draft, &workspace)?;
        Ok(NewTask {
            title,
            execution,
            prompt,
            workspace,
            sandbox,
            timeout_ms,
            priority: draft.priority.unwrap_or(0),
            budget_micros_usd: parse_budget(draft.budget_micros_usd)?,
            hooks: None,
            repo,
            written_by: Role::Member,
        })
    }

    /// Narrows a remote caller's `in_place` task to its workspace's granted roots
    /// ([`Scope::directory_name`] beneath a workspace root): the task's `allowed_root`
    /// becomes the granted root its directory lies beneath, or must itself lie beneath
    /// one. Stored with the task, it is checked again before each run.
    pub(crate) fn confine_to_tenant(
        &mut self,
        roots: &WorkspaceRoots,
        scope: &Scope,
    ) -> Result<(), Invalid> {
        let WorkspaceMode::InPlace {
            directory,
            allowed_root,
        } = &mut self.workspace
        else {
            return Ok(());
        };
        let granted = roots.granted_to(scope);
        let field = if allowed_root.is_some() {
            "sandbox_allowed_root"
        } else {
            "working_directory"
        };
        let wanted = allowed_root.as_deref().unwrap_or(directory);
        let real = std::fs::canonicalize(wanted)
            .map_err(|e| Invalid::new(field, format!("{wanted} cannot be resolved: {e}")))?;
        let within = granted.iter().find(|tenant| real.starts_with(tenant));
        match (within, allowed_root.is_some()) {
            (Some(_), true) => Ok(()),
            (Some(tenant), false) => {
                *allowed_root = Some(tenant.to_string_lossy().into_owned());
                Ok(())
            }
            (None, _) => Err(Invalid::new(
                field,
                format!(
                    "{wanted} is not beneath a root granted to workspace {} (an operator \
                     grants one by making <root>/{} beneath a KEEL_WORKSPACE_ROOTS root)",
                    scope.workspace(),
                    scope.directory_name()
                ),
            )),
        }
    }

    /// Works in an external work item's own directory (one Keel made under the workflow's
    /// `workspace.root`), as it is, around the workflow's `hooks` (none, maybe). Unlike a
    /// directory a task names, it may start as a clone of the task's `repo`: the run's
    /// preparation clones into it once, as Symphony's `after_create` hook clones into an
    /// issue's workspace, and later runs reuse it. The stored hooks mark the task an
    /// item's for the database's check.
    pub(crate) fn in_item_directory(&mut self, directory: &str, hooks: crate::tasks::Hooks) {
        self.workspace = WorkspaceMode::InPlace {
            directory: directory.to_string(),
            allowed_root: None,
        };
        self.hooks = Some(hooks);
    }

    /// Refuses an `in_place` directory the workspace roots do not allow (the field named),
    /// and keeps the one allowed in its canonical form: the form every other task's is
    /// compared in ([`super::in_place_nesting`]).
    pub(crate) fn check_workspace(&mut self, roots: &WorkspaceRoots) -> Result<(), Invalid> {
        match &mut self.workspace {
            WorkspaceMode::Ephemeral | WorkspaceMode::Persistent => Ok(()),
            WorkspaceMode::InPlace {
                directory,
                allowed_root,
            } => {
                let real = roots.confine(directory, allowed_root.as_deref())?;
                *directory = real.to_string_lossy().into_owned();
                Ok(())
            }
        }
    }

    /// The `in_place` directory, once [`Self::check_workspace`] made it canonical.
    pub(crate) fn in_place_directory(&self) -> Option<&str> {
        match &self.workspace {
            WorkspaceMode::InPlace { directory, .. } => Some(directory),
            WorkspaceMode::Ephemeral | WorkspaceMode::Persistent => None,
        }
    }
}

/// Why a directory that nests with another task's cannot be an `in_place` workspace.
pub(crate) const NESTED_WORKSPACE: &str = "contains, or lies inside, the in_place directory of \
    another task or an item: a run there could change or swap the other's files beneath it";

fn parse_shell(draft: &TaskDraft) -> Result<Execution, Invalid> {
    only_for("shell", draft)?;
    let command = required("shell_command", draft.shell_command.as_deref())?;
    check_len("shell_command", Some(command), MAX_COMMAND_BYTES)?;
    Ok(Execution::Shell {
        command: command.to_string(),
    })
}

fn parse_git(draft: &TaskDraft) -> Result<Execution, Invalid> {
    only_for("git", draft)?;
    let command = required("git_command", draft.git_command.as_deref())?;
    check_len("git_command", Some(command), MAX_COMMAND_BYTES)?;
    if shlex::split(command).is_none_or(|args| args.is_empty()) {
        return Err(Invalid::new(
            "git_command",
            "must be git arguments with balanced quotes",
        ));
    }
    Ok(Execution::Git {
        command: command.to_string(),
    })
}

fn parse_file(draft: &TaskDraft) -> Result<Execution, Invalid> {
    only_for("file", draft)?;
    let path = required("file_path", draft.file_path.as_deref())?;
    keel_workers::validate_relative_path(path).map_err(|e| Invalid::new("file_path", e))?;
    let operation = match required("file_operation", draft.file_operation.as_deref())? {
        "write" => FileOperation::Write,
        "append" => FileOperation::Append,
        "delete" => FileOperation::Delete,
        other => {
            return Err(Invalid::new(
                "file_operation",
                format!("unknown operation '{other}' (expected write, append or delete)"),
            ));
        }
    };
    let content = draft.file_content.clone();
    check_len("file_content", content.as_deref(), MAX_FILE_CONTENT_BYTES)?;
    match (operation, &content) {
        (FileOperation::Delete, Some(_)) => {
            return Err(Invalid::new(
                "file_content",
                "is not allowed with file_operation delete",
            ));
        }
        (FileOperation::Write | FileOperation::Append, None) => {
            return Err(Invalid::new(
                "file_content",
                "is required for write and append",
            ));
        }
        _ => {}
    }
    Ok(Execution::File {
        path: path.to_string(),
        content,
        operation,
    })
}

fn parse_agent_loop(draft: &TaskDraft) -> Result<AgentLoop, Invalid> {
    only_for("agent_loop", draft)?;
    required("prompt", draft.prompt.as_deref())?;
    check_len(
        "system_prompt",
        draft.system_prompt.as_deref(),
        MAX_PROMPT_BYTES,
    )?;
    let optional = |field, value: &Option<String>| match value {
        Some(v) if v.trim().is_empty() => Err(Invalid::new(field, "must not be empty")),
        _ => Ok(value.clone()),
    };
    if draft.max_model_calls.is_some_and(|n| n <= 0) {
        return Err(Invalid::new("max_model_calls", "must be greater than 0"));
    }
    one_of(
        "reasoning_effort",
        draft.reasoning_effort.as_deref(),
        &REASONING_EFFORTS,
    )?;
    one_of(
        "workspace_system_prompt_policy",
        draft.workspace_system_prompt_policy.as_deref(),
        &WORKSPACE_SYSTEM_PROMPT_POLICIES,
    )?;
    if let Some(tools) = &draft.tools {
        check_tools(tools)?;
    }
    Ok(AgentLoop {
        system_prompt: draft.system_prompt.clone(),
        requested_provider: optional("requested_provider", &draft.requested_provider)?,
        requested_model: optional("requested_model", &draft.requested_model)?,
        max_model_calls: draft.max_model_calls,
        reasoning_effort: draft.reasoning_effort.clone(),
        workspace_system_prompt_policy: draft.workspace_system_prompt_policy.clone(),
        tools: draft.tools.clone(),
        mcp_servers: match &draft.mcp_servers {
            Some(servers) => Some(super::mcp::parse_mcp_servers(servers)?),
            None => None,
        },
        execution_profile: draft.execution_profile.clone(),
    })
}

/// A field that, when set, must be one of `values`.
fn one_of(field: &'static str, value: Option<&str>, values: &[&str]) -> Result<(), Invalid> {
    match value {
        Some(value) if !values.contains(&value) => Err(Invalid::new(
            field,
            format!("must be one of {}", values.join(", ")),
        )),
        _ => Ok(()),
    }
}

/// Each tool is in the catalog, once.
fn check_tools(tools: &[String]) -> Result<(), Invalid> {
    for (i, name) in tools.iter().enumerate() {
        if !keel_workers::agent::tools::is_known(name) {
            let known = keel_workers::agent::tools::CATALOG.join(", ");
            return Err(Invalid::new(
                "tools",
                format!("unknown tool '{name}' (known: {known})"),
            ));
        }
        if tools[..i].contains(name) {
            return Err(Invalid::new("tools", format!("lists '{name}' twice")));
        }
    }
    Ok(())
}

/// Refuses fields that belong to another execution kind, so a typo cannot be ignored.
fn only_for(kind: &str, draft: &TaskDraft) -> Result<(), Invalid> {
    const AGENT: &str = "agent_loop";
    let fields: [(&'static str, bool, &str); 14] = [
        ("shell_command", draft.shell_command.is_some(), "shell"),
        ("git_command", draft.git_command.is_some(), "git"),
        ("file_path", draft.file_path.is_some(), "file"),
        ("file_content", draft.file_content.is_some(), "file"),
        ("file_operation", draft.file_operation.is_some(), "file"),
        ("system_prompt", draft.system_prompt.is_some(), AGENT),
        (
            "requested_provider",
            draft.requested_provider.is_some(),
            AGENT,
        ),
        ("requested_model", draft.requested_model.is_some(), AGENT),
        ("max_model_calls", draft.max_model_calls.is_some(), AGENT),
        ("reasoning_effort", draft.reasoning_effort.is_some(), AGENT),
        (
            "workspace_system_prompt_policy",
            draft.workspace_system_prompt_policy.is_some(),
            AGENT,
        ),
        ("tools", draft.tools.is_some(), AGENT),
        ("mcp_servers", draft.mcp_servers.is_some(), AGENT),
        (
            "execution_profile",
            draft.execution_profile.is_some(),
            AGENT,
        ),
    ];
    match fields
        .into_iter()
        .find(|(_, set, owner)| *set && *owner != kind)
    {
        Some((field, _, owner)) => Err(Invalid::new(
            field,
            format!("is only for execution_kind {owner}, not {kind}"),
        )),
        None => Ok(()),
    }
}

fn parse_workspace(draft: &TaskDraft) -> Result<WorkspaceMode, Invalid> {
    match draft.workspace_mode.as_deref().unwrap_or("ephemeral") {
        mode @ ("ephemeral" | "persistent") => {
            let stray = [
                ("working_directory", draft.working_directory.is_some()),
                ("sandbox_allowed_root", draft.sandbox_allowed_root.is_some()),
            ];
            match stray.into_iter().find(|(_, set)| *set) {
                Some((field, _)) => Err(Invalid::new(
                    field,
                    format!(
                        "is only for workspace_mode in_place; {mode} runs work in Keel's own directory"
                    ),
                )),
                None if mode == "persistent" => Ok(WorkspaceMode::Persistent),
                None => Ok(WorkspaceMode::Ephemeral),
            }
        }
        "in_place" => {
            let directory = required("working_directory", draft.working_directory.as_deref())?;
            absolute_path("working_directory", directory)?;
            let allowed_root = draft.sandbox_allowed_root.as_deref();
            if let Some(root) = allowed_root {
                absolute_path("sandbox_allowed_root", root)?;
            }
            Ok(WorkspaceMode::InPlace {
                directory: directory.to_string(),
                allowed_root: allowed_root.map(str::to_string),
            })
        }
        other => Err(Invalid::new(
            "workspace_mode",
            format!(
                "unknown workspace mode '{other}' (expected ephemeral, persistent or in_place)"
            ),
        )),
    }
}

/// `repo` and `base_branch`: a repository an ephemeral workspace can be cloned from, named
/// without credentials (they would be stored with the task and shown in its responses),
/// and a branch name git accepts. Neither may start with `-`, which git would read as an
/// option.
fn parse_repo(draft: &TaskDraft, workspace: &WorkspaceMode) -> Result<Option<RepoSource>, Invalid> {
    let Some(url) = draft.repo.as_deref() else {
        let needs_repo = [
            ("base_branch", draft.base_branch.is_some()),
            ("repo_credential", draft.repo_credential.is_some()),
            ("push_branch", draft.push_branch.is_some()),
        ];
        return match needs_repo.iter().find(|(_, given)| *given) {
            Some((field, _)) => Err(Invalid::new(field, "needs repo")),
            None => Ok(None),
        };
    };
    if matches!(workspace, WorkspaceMode::InPlace { .. }) {
        return Err(Invalid::new(
            "repo",
            "is only for workspace_mode ephemeral or persistent: an in_place directory is used \
             as it is",
        ));
    }
    check_len("repo", Some(url), keel_api_types::MAX_REPO_BYTES)?;
    check_repo_url(url).map_err(|why| Invalid::new("repo", why))?;
    if let Some(branch) = draft.base_branch.as_deref() {
        check_branch(branch).map_err(|why| Invalid::new("base_branch", why))?;
    }
    let credential = match draft.repo_credential.as_deref() {
        Some(reference) => Some(parse_credential(url, reference)?),
        None => None,
    };
    if let Some(branch) = draft.push_branch.as_deref() {
        check_push_branch(branch, draft.base_branch.as_deref())
            .map_err(|why| Invalid::new("push_branch", why))?;
    }
    Ok(Some(RepoSource {
        url: url.to_string(),
        base_branch: draft.base_branch.clone(),
        credential,
        push_branch: draft.push_branch.clone(),
    }))
}

/// A branch of its own for a run's result: a name git accepts, and not the branch the
/// workspace starts from, which a run's push would otherwise move under everyone else.
fn check_push_branch(branch: &str, base_branch: Option<&str>) -> Result<(), String> {
    check_branch(branch)?;
    if Some(branch) == base_branch {
        return Err(
            "must differ from base_branch: a run's result goes on a branch of its own".into(),
        );
    }
    Ok(())
}

/// A repository credential: a secret reference, for a repository reached over HTTP(S)
/// (an SSH or local one authenticates otherwise).
fn parse_credential(url: &str, reference: &str) -> Result<SecretRef, Invalid> {
    if !(url.starts_with("https://") || url.starts_with("http://")) {
        return Err(Invalid::new(
            "repo_credential",
            "is for an https:// or http:// repo (the clone sends it as HTTP basic \
             authentication)",
        ));
    }
    SecretRef::parse(reference).map_err(|why| Invalid::new("repo_credential", why))
}

fn check_repo_url(url: &str) -> Result<(), String> {
    if url.trim() != url || url.is_empty() || url.chars().any(char::is_control) {
        return Err("must be a URL or an absolute path, without spaces around it".into());
    }
    if url.starts_with('-') {
        return Err("must not start with '-'".into());
    }
    if url.starts_with('/') {
        return Ok(());
    }
    const SCHEMES: [&str; 5] = ["https://", "http://", "ssh://", "git://", "file://"];
    let Some(scheme) = SCHEMES.iter().find(|s| url.starts_with(*s)) else {
        // scp-like `user@host:path`: a host, a colon, no scheme. Not `<transport>::<address>`,
        // which would hand the address to a remote helper (`ext::` runs a command).
        let host_chars = |host: &str| {
            host.chars()
                .all(|c| c.is_ascii_alphanumeric() || "._-@".contains(c))
        };
        return match url.split_once(':') {
            Some((host, path))
                if !host.is_empty()
                    && host_chars(host)
                    && !path.is_empty()
                    && !path.starts_with(':') =>
            {
                no_option(host)
            }
            _ => Err(format!(
                "must be an absolute path, user@host:path or a URL ({})",
                SCHEMES.join(", ")
            )),
        };
    };
    let authority = url[scheme.len()..].split('/').next().unwrap_or_default();
    match authority.rsplit_once('@') {
        Some((userinfo, _)) if userinfo.contains(':') => Err(
            "must not carry credentials: they would be stored with the task and shown in its \
             responses"
                .into(),
        ),
        _ => no_option(authority),
    }
}

/// A user or host that starts with `-` would reach ssh as an option (`-oProxyCommand=…`
/// runs a command), whatever git does about it.
fn no_option(authority: &str) -> Result<(), String> {
    let (user, host) = authority.rsplit_once('@').unwrap_or(("", authority));
    match user.starts_with('-') || host.starts_with('-') {
        true => Err("its user and host must not start with '-'".into()),
        false => Ok(()),
    }
}

/// The branch names `git check-ref-format --branch` accepts, checked without git.
pub(crate) fn check_branch(branch: &str) -> Result<(), String> {
    let refused = branch.is_empty()
        || branch.starts_with(['-', '/', '.'])
        || branch.ends_with(['/', '.'])
        || branch.ends_with(".lock")
        || branch == "@"
        || branch.contains("..")
        || branch.contains("//")
        || branch.contains("@{")
        || branch.contains("/.")
        || branch
            .chars()
            .any(|c| c.is_control() || c.is_whitespace() || "~^:?*[\\".contains(c));
    match refused {
        true => Err(format!("'{branch}' is not a branch name git accepts")),
        false => Ok(()),
    }
}

/// A read-only workspace refuses file runs, at creation rather than at run time: every file
/// operation (write, append, delete) changes the workspace, and the file executor runs in
/// the worker, not in a sandboxed child.
fn parse_sandbox(
    draft: &TaskDraft,
    execution: &TaskExecution,
) -> Result<keel_workers::SandboxPolicy, Invalid> {
    let policy = keel_workers::SandboxPolicy {
        network: draft.sandbox_network.unwrap_or(true),
        read_only: draft.sandbox_read_only.unwrap_or(false),
        workspace_id: None,
    };
    if matches!(execution, TaskExecution::Process(Execution::File { .. })) && policy.read_only {
        return Err(Invalid::new(
            "sandbox_read_only",
            "refuses file runs: write, append and delete all change the read-only workspace",
        ));
    }
    Ok(policy)
}

fn absolute_path(field: &'static str, path: &str) -> Result<(), Invalid> {
    let path = Path::new(path);
    if !path.is_absolute() {
        return Err(Invalid::new(field, "must be an absolute path"));
    }
    if path.components().any(|c| matches!(c, Component::ParentDir)) {
        return Err(Invalid::new(field, "must not contain '..'"));
    }
    Ok(())
}

/// A budget is a non-negative amount of micro-USD; absent means 0 (no ceiling).
pub(crate) fn parse_budget(budget: Option<i64>) -> Result<i64, Invalid> {
    match budget {
        Some(b) if b < 0 => Err(Invalid::new("budget_micros_usd", "must not be negative")),
        other => Ok(other.unwrap_or(0)),
    }
}

fn required<'a>(field: &'static str, value: Option<&'a str>) -> Result<&'a str, Invalid> {
    match value {
        Some(v) if !v.trim().is_empty() => Ok(v),
        Some(_) => Err(Invalid::new(field, "must not be empty")),
        None => Err(Invalid::new(field, "is required")),
    }
}

/// Longest title a derived one is cut to (characters), before its `…`.
const DERIVED_TITLE_CHARS: usize = 80;

/// A given title, without the white space around it.
fn parse_title(title: Option<&str>) -> Result<Option<String>, Invalid> {
    let Some(title) = title.map(str::trim) else {
        return Ok(None);
    };
    if title.is_empty() {
        return Err(Invalid::new("title", "is blank"));
    }
    if title.chars().count() > MAX_TITLE_CHARS {
        let message = format!("is longer than {MAX_TITLE_CHARS} characters");
        return Err(Invalid::new("title", message));
    }
    if title.chars().any(char::is_control) {
        let message = "holds a control character (a newline or a tab): a title is one line";
        return Err(Invalid::new("title", message));
    }
    Ok(Some(title.to_string()))
}

/// A title from what the task runs: [`one_line_title`] of its prompt or command.
fn derived_title(execution: &TaskExecution, prompt: Option<&str>) -> String {
    let source = match execution {
        TaskExecution::AgentLoop(_) => prompt.unwrap_or("agent loop").to_string(),
        TaskExecution::Process(Execution::Shell { command }) => command.clone(),
        TaskExecution::Process(Execution::Git { command }) => format!("git {command}"),
        TaskExecution::Process(Execution::File {
            path, operation, ..
        }) => {
            let verb = match operation {
                FileOperation::Write => "write",
                FileOperation::Append => "append to",
                FileOperation::Delete => "delete",
            };
            format!("{verb} {path}")
        }
    };
    one_line_title(&source)
}

/// A title from any text: its first line, white space folded and control characters
/// dropped, cut at [`DERIVED_TITLE_CHARS`] characters (`untitled` when nothing is left).
pub(crate) fn one_line_title(source: &str) -> String {
    let line = source.trim().lines().next().unwrap_or_default();
    let folded = line.split_whitespace().collect::<Vec<_>>().join(" ");
    let folded: String = folded.chars().filter(|c| !c.is_control()).collect();
    match folded.is_empty() {
        true => "untitled".to_string(),
        false => cut_chars(&folded, DERIVED_TITLE_CHARS).0,
    }
}

fn check_len(field: &'static str, value: Option<&str>, max: usize) -> Result<(), Invalid> {
    match value {
        Some(v) if v.len() > max => Err(Invalid::new(field, format!("is longer than {max} bytes"))),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn draft(kind: &str) -> TaskDraft {
        TaskDraft {
            execution_kind: Some(kind.into()),
            ..TaskDraft::default()
        }
    }

    #[test]
    fn a_repository_s_user_or_host_never_reaches_ssh_as_an_option() {
        for url in [
            "ssh://-oProxyCommand=touch%20/tmp/x/r.git",
            "ssh://-oProxyCommand=x@host/r.git",
            "ssh://git@-oProxyCommand=x/r.git",
            "-oProxyCommand=x:r.git",
            "git@-oProxyCommand=x:r.git",
            "https://-host/r.git",
        ] {
            assert!(check_repo_url(url).is_err(), "{url} accepted");
        }
        for url in [
            "ssh://git@github.com/o/r.git",
            "git@github.com:o/r.git",
            "https://h/r-x.git",
        ] {
            assert_eq!(check_repo_url(url), Ok(()), "{url}");
        }
    }

    #[test]
    fn shell_task_defaults_to_an_ephemeral_workspace() {
        let task = NewTask::parse(
            TaskDraft {
                shell_command: Some("true".into()),
                ..draft("shell")
            },
            &RunTimeouts::default(),
        );
        let task = task.unwrap();
        assert_eq!(task.workspace, WorkspaceMode::Ephemeral);
        assert_eq!(task.priority, 0);
        assert_eq!(task.timeout_ms, RunTimeouts::DEFAULT_MS as i64);
    }

    #[test]
    fn timeouts_are_bounded_by_the_max() {
        let timeouts = RunTimeouts::new(1_000, 5_000).unwrap();
        let shell = |timeout_ms| TaskDraft {
            shell_command: Some("true".into()),
            timeout_ms,
            ..draft("shell")
        };
        let parse = |timeout_ms| NewTask::parse(shell(timeout_ms), &timeouts);
        assert_eq!(parse(None).unwrap().timeout_ms, 1_000);
        assert_eq!(parse(Some(5_000)).unwrap().timeout_ms, 5_000);
        assert_eq!(parse(Some(5_001)).unwrap_err().field, "timeout_ms");
        assert_eq!(timeouts.effective_ms(Some(9_000)), 5_000);
        assert!(RunTimeouts::new(6_000, 5_000).is_err());
        assert!(RunTimeouts::new(1, 0).is_err());
    }

    #[test]
    fn refusals_name_the_field() {
        let cases = [
            (TaskDraft::default(), "execution_kind"),
            (draft("agent_loop"), "prompt"),
            (draft("rocket"), "execution_kind"),
            (
                TaskDraft {
                    prompt: Some("hi".into()),
                    shell_command: Some("true".into()),
                    ..draft("agent_loop")
                },
                "shell_command",
            ),
            (
                TaskDraft {
                    shell_command: Some("true".into()),
                    tools: Some(vec!["read_file".into()]),
                    ..draft("shell")
                },
                "tools",
            ),
            (
                TaskDraft {
                    prompt: Some("hi".into()),
                    tools: Some(vec!["read_file".into(), "rm_rf".into()]),
                    ..draft("agent_loop")
                },
                "tools",
            ),
            (
                TaskDraft {
                    prompt: Some("hi".into()),
                    tools: Some(vec!["grep".into(), "grep".into()]),
                    ..draft("agent_loop")
                },
                "tools",
            ),
            (
                TaskDraft {
                    prompt: Some("hi".into()),
                    max_model_calls: Some(0),
                    ..draft("agent_loop")
                },
                "max_model_calls",
            ),
            (draft("shell"), "shell_command"),
            (
                TaskDraft {
                    shell_command: Some(" ".into()),
                    ..draft("shell")
                },
                "shell_command",
            ),
            (
                TaskDraft {
                    git_command: Some("x".into()),
                    ..draft("shell")
                },
                "git_command",
            ),
            (
                TaskDraft {
                    git_command: Some("log 'x".into()),
                    ..draft("git")
                },
                "git_command",
            ),
            (
                TaskDraft {
                    file_path: Some("../x".into()),
                    file_operation: Some("write".into()),
                    ..draft("file")
                },
                "file_path",
            ),
            (
                TaskDraft {
                    file_path: Some("x".into()),
                    file_operation: Some("write".into()),
                    ..draft("file")
                },
                "file_content",
            ),
            (
                TaskDraft {
                    shell_command: Some("true".into()),
                    workspace_mode: Some("in_place".into()),
                    working_directory: Some("relative/dir".into()),
                    ..draft("shell")
                },
                "working_directory",
            ),
            (
                TaskDraft {
                    shell_command: Some("true".into()),
                    timeout_ms: Some(0),
                    ..draft("shell")
                },
                "timeout_ms",
            ),
        ];
        for (draft, field) in cases {
            let error = NewTask::parse(draft.clone(), &RunTimeouts::default()).unwrap_err();
            assert_eq!(error.field, field, "{draft:?}: {error}");
        }
    }

    #[test]
    fn workspace_roots_resolve_links_and_keep_out_of_the_data_dir() {
        let dir = tempfile::tempdir().unwrap();
        let (root, outside) = (dir.path().join("root"), dir.path().join("outside"));
        let data = root.join("data");
        for path in [&root.join("a/b"), &outside, &data] {
            std::fs::create_dir_all(path).unwrap();
        }
        std::os::unix::fs::symlink(&outside, root.join("link")).unwrap();
        let roots = WorkspaceRoots::new(std::slice::from_ref(&root), &data).unwrap();
        let field = |directory: &Path, allowed: Option<&Path>| {
            let allowed = allowed.map(|a| a.to_str().unwrap());
            roots
                .confine(directory.to_str().unwrap(), allowed)
                .err()
                .map(|e| e.field)
        };
        assert_eq!(field(&root.join("a"), None), None);
        assert_eq!(field(&root.join("a/b"), Some(&root.join("a"))), None);
        for refused in [&outside, &root.join("link"), &data, &root.join("nope")] {
            assert_eq!(
                field(refused, None),
                Some("working_directory"),
                "{refused:?}"
            );
        }
        assert_eq!(
            field(&root, Some(&root.join("a"))),
            Some("working_directory")
        );
        assert_eq!(
            field(&root.join("a"), Some(&outside)),
            Some("sandbox_allowed_root")
        );
        let none = WorkspaceRoots::new(&[], &data).unwrap();
        let error = none.confine(root.to_str().unwrap(), None).unwrap_err();
        assert!(error.message.contains("KEEL_WORKSPACE_ROOTS"), "{error}");
    }

    #[test]
    fn read_only_refuses_every_file_operation() {
        let file = |operation: &str, content: Option<&str>| TaskDraft {
            file_path: Some("a.txt".into()),
            file_operation: Some(operation.into()),
            file_content: content.map(str::to_string),
            sandbox_read_only: Some(true),
            ..draft("file")
        };
        let parse = |draft| NewTask::parse(draft, &RunTimeouts::default());
        for refused in [
            file("write", Some("x")),
            file("append", Some("x")),
            file("delete", None),
        ] {
            assert_eq!(parse(refused).unwrap_err().field, "sandbox_read_only");
        }
        let shell = TaskDraft {
            shell_command: Some("true".into()),
            sandbox_read_only: Some(true),
            ..draft("shell")
        };
        let shell = parse(shell).unwrap();
        assert!(shell.sandbox.read_only && shell.sandbox.network);
    }
}
