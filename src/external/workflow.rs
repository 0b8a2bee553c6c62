//! WORKFLOW.md, after OpenAI Symphony's SPEC.md: optional YAML front matter between `---`
//! lines (the source's settings) and a Markdown body, the prompt template each external work
//! item is rendered with under strict Liquid semantics (an unknown variable or filter fails).
//! Seed 000's `source` {kind, repository, projectSlug, secretRef, events} form is read as the
//! same `tracker` model. Unknown keys are ignored, for forward compatibility.
//!
//! Parsing asks each kind of tracker for its name, its defaults and its checks, so the one
//! dispatch from a kind to its implementation ([`TrackerKind::api`]) is here, above the
//! trackers; so is a source's workflow read now ([`load_workflow`], [`tracker`]), with why
//! an import or a poll cannot use it ([`ExternalError`]).

use keel_api_types::ErrorCode;
use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::db::StoreError;
use crate::domain::Scope;
use crate::external::SourceRecord;
use crate::external::github::GitHub;
use crate::external::linear::Linear;
use crate::external::tracker::{
    Poller, Target, Tracker, TrackerApi, TrackerKind, normalized, token,
};
use crate::providers::secrets::SecretRef;
use crate::tasks::{Hooks, MAX_HOOK_TIMEOUT_MS, TaskDraft, one_line_title};

/// Why a workflow file cannot be used; `code` is the error's stable `type`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum WorkflowError {
    #[error("the workflow file cannot be read: {0}")]
    MissingFile(String),
    #[error("the workflow front matter is not valid: {0}")]
    Parse(String),
    #[error("the workflow front matter must be a YAML map")]
    FrontMatterNotAMap,
    #[error("the prompt template does not parse: {0}")]
    TemplateParse(String),
    #[error("the prompt template does not render: {0}")]
    TemplateRender(String),
}

impl WorkflowError {
    pub(crate) fn code(&self) -> ErrorCode {
        match self {
            WorkflowError::MissingFile(_) => ErrorCode::MissingWorkflowFile,
            WorkflowError::Parse(_) => ErrorCode::WorkflowParseError,
            WorkflowError::FrontMatterNotAMap => ErrorCode::WorkflowFrontMatterNotAMap,
            WorkflowError::TemplateParse(_) => ErrorCode::TemplateParseError,
            WorkflowError::TemplateRender(_) => ErrorCode::TemplateRenderError,
        }
    }
}

type Result<T, E = WorkflowError> = std::result::Result<T, E>;

// The dispatch on the kind stands here, not beside the types in `tracker`: the trackers
// it names implement that module's contract, and parsing a workflow is its first user
// (the kinds' names, their defaults and checks).
impl TrackerKind {
    /// Every kind, in the order a message names them; a kind left out could not be parsed.
    const ALL: [TrackerKind; 2] = [TrackerKind::Github, TrackerKind::Linear];

    /// Its tracker's implementation: the one dispatch on the kind.
    pub(crate) fn api(self) -> &'static dyn TrackerApi {
        match self {
            TrackerKind::Github => &GitHub,
            TrackerKind::Linear => &Linear,
        }
    }

    fn named(name: &str) -> Option<TrackerKind> {
        TrackerKind::ALL
            .into_iter()
            .find(|kind| kind.api().name() == name)
    }

    /// The kinds' names, for a message: `a or b`, `a, b or c`.
    fn names() -> String {
        let names: Vec<&str> = TrackerKind::ALL.iter().map(|k| k.api().name()).collect();
        match names.split_last().expect("there are trackers") {
            (last, []) => last.to_string(),
            (last, rest) => format!("{} or {last}", rest.join(", ")),
        }
    }
}

impl Tracker {
    pub(crate) fn api(&self) -> &'static dyn TrackerApi {
        self.kind.api()
    }

    /// What the tracker polls, the same string for the same target: a source's identity.
    pub(crate) fn target(&self) -> String {
        let api = self.api();
        format!(
            "{}:{}:{}",
            api.name(),
            self.endpoint.trim_end_matches('/'),
            api.subject(self).unwrap_or_default()
        )
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub(crate) struct AgentLimits {
    pub(crate) max_concurrent_agents: u64,
    pub(crate) max_turns: Option<u64>,
    pub(crate) max_retry_backoff_ms: u64,
    /// Keyed by state, trimmed and lowercased; entries that are not positive are dropped.
    pub(crate) max_concurrent_agents_by_state: BTreeMap<String, u64>,
}

/// The typed front matter, defaults applied.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
pub(crate) struct WorkflowConfig {
    /// None when the file has no tracker (a prompt-only workflow can still be rendered).
    pub(crate) tracker: Option<Tracker>,
    pub(crate) polling_interval_ms: u64,
    pub(crate) workspace_root: Option<String>,
    pub(crate) hooks: Hooks,
    pub(crate) agent: AgentLimits,
    /// What each item becomes: the fields of `POST /v1/tasks`.
    #[schema(value_type = Option<Object>)]
    pub(crate) task: Option<serde_json::Value>,
    /// `actions.execute_on_approval`: an approved action is sent at once, without its
    /// execute (false by default, as seed 000 keeps approval and execution apart).
    pub(crate) execute_on_approval: bool,
}

/// The events `tracker.events` may name (seed 000's): which versions of an item start its
/// work (see `import`).
const EVENTS: [&str; 5] = [
    "issue.opened",
    "issue.edited",
    "pull_request.opened",
    "pull_request.synchronize",
    "pull_request.edited",
];

const DEFAULT_POLLING_INTERVAL_MS: u64 = 30_000;
const DEFAULT_HOOK_TIMEOUT_MS: u64 = 60_000;
const DEFAULT_MAX_CONCURRENT_AGENTS: u64 = 10;
const DEFAULT_MAX_RETRY_BACKOFF_MS: u64 = 300_000;

/// A parsed WORKFLOW.md: its settings and its prompt template, which parsed.
#[derive(Debug, Clone)]
pub(crate) struct Workflow {
    pub(crate) config: WorkflowConfig,
    /// The body, trimmed.
    pub(crate) prompt_template: String,
}

pub(crate) use keel_api_types::Issue;

impl Workflow {
    /// Reads and parses a workflow file.
    /// Its `workspace.root` may be relative to the file's directory, or name `$VAR` or `~`.
    pub(crate) fn load(path: &Path) -> Result<Workflow> {
        Workflow::read(path).map(|(_, workflow)| workflow)
    }

    /// [`Workflow::load`], with the text that parsed.
    pub(crate) fn read(path: &Path) -> Result<(String, Workflow)> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| WorkflowError::MissingFile(format!("{}: {e}", path.display())))?;
        let workflow = Workflow::parse_in(&text, path.parent())?;
        Ok((text, workflow))
    }

    /// A text of the file at `path` read before, parsed as that file's.
    pub(crate) fn parse_as_of(text: &str, path: &Path) -> Result<Workflow> {
        Workflow::parse_in(text, path.parent())
    }

    /// Parses a workflow's text: the front matter into settings, and the template, so a
    /// workflow that cannot render anything is refused up front. Its `workspace.root` must
    /// be absolute: only a file on the host ([`Workflow::load`]) has a directory to be
    /// relative to, and an environment of its deployment's to name.
    pub(crate) fn parse(text: &str) -> Result<Workflow> {
        Workflow::parse_in(text, None)
    }

    /// [`Workflow::parse`], for a file in `directory` when there is one.
    fn parse_in(text: &str, directory: Option<&Path>) -> Result<Workflow> {
        let (front, body) = split_front_matter(text)?;
        let config = match front {
            None => WorkflowConfig::from_raw(RawConfig::default(), directory)?,
            Some(yaml) => parse_front_matter(yaml, directory)?,
        };
        let prompt_template = body.trim().to_string();
        compile(&prompt_template)?;
        Ok(Workflow {
            config,
            prompt_template,
        })
    }

    /// The prompt for `issue`; `attempt` is None on a first run, the retry number after.
    pub(crate) fn render(&self, issue: &Issue, attempt: Option<u32>) -> Result<String> {
        render(&self.prompt_template, issue, attempt)
    }

    /// The task `issue` becomes, as `POST /v1/tasks` would read it, with the prompt. Its
    /// `push_branch` is a template of the issue as the prompt is (`keel/{{ issue.identifier
    /// }}`): each item's runs push to a branch of their own, the branch its pull request
    /// is opened from.
    pub(crate) fn task_draft(&self, prompt: String, issue: &Issue) -> Result<TaskDraft> {
        let mut draft = task_draft(self.config.task.as_ref())?;
        draft.prompt = Some(prompt);
        // The item as people know it, unless the workflow names the task itself.
        let title = format!("{}: {}", issue.identifier, issue.title);
        draft.title = draft.title.or(Some(one_line_title(&title)));
        if let Some(branch) = draft.push_branch.take() {
            draft.push_branch = Some(render(&branch, issue, None)?);
        }
        Ok(draft)
    }
}

/// A template rendered for `issue` (and `attempt`), under the strict semantics.
fn render(template: &str, issue: &Issue, attempt: Option<u32>) -> Result<String> {
    let template = compile(template)?;
    let render_error = |e: liquid::Error| WorkflowError::TemplateRender(e.to_string());
    let mut globals = liquid::Object::new();
    let issue = liquid::model::to_value(issue).map_err(render_error)?;
    globals.insert("issue".into(), issue);
    let attempt = attempt.map_or(liquid::model::Value::Nil, |n| {
        liquid::model::Value::scalar(i64::from(n))
    });
    globals.insert("attempt".into(), attempt);
    template.render(&globals).map_err(render_error)
}

fn task_draft(task: Option<&serde_json::Value>) -> Result<TaskDraft> {
    let Some(task) = task else {
        return Ok(TaskDraft::default());
    };
    serde_json::from_value(task.clone()).map_err(|e| WorkflowError::Parse(format!("task: {e}")))
}

/// Front matter (None without one) and body. Front matter is there when the first line is
/// `---`, and runs to the next `---` line.
fn split_front_matter(text: &str) -> Result<(Option<&str>, &str)> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let Some(rest) = strip_delimiter_line(text) else {
        return Ok((None, text));
    };
    let mut offset = 0;
    for line in rest.split_inclusive('\n') {
        if line.trim_end() == "---" {
            return Ok((Some(&rest[..offset]), &rest[offset + line.len()..]));
        }
        offset += line.len();
    }
    Err(WorkflowError::Parse(
        "the front matter opened with --- is never closed by a --- line".into(),
    ))
}

fn strip_delimiter_line(text: &str) -> Option<&str> {
    let (first, rest) = text.split_once('\n').unwrap_or((text, ""));
    (first.trim_end() == "---").then_some(rest)
}

fn parse_front_matter(yaml: &str, directory: Option<&Path>) -> Result<WorkflowConfig> {
    let value: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(yaml).map_err(|e| WorkflowError::Parse(e.to_string()))?;
    let value = match value {
        // An empty front matter is an empty map.
        serde_yaml_ng::Value::Null => serde_yaml_ng::Value::Mapping(Default::default()),
        map @ serde_yaml_ng::Value::Mapping(_) => map,
        _ => return Err(WorkflowError::FrontMatterNotAMap),
    };
    let raw: RawConfig =
        serde_yaml_ng::from_value(value).map_err(|e| WorkflowError::Parse(e.to_string()))?;
    WorkflowConfig::from_raw(raw, directory)
}

/// The Liquid template, parsed with the standard filters only: a filter outside them fails.
fn compile(template: &str) -> Result<liquid::Template> {
    let parser = liquid::ParserBuilder::with_stdlib()
        .build()
        .map_err(|e| WorkflowError::TemplateParse(e.to_string()))?;
    parser.parse(template).map_err(|e| {
        let message = e.to_string();
        // The parser finds unknown filters; Symphony counts them as render errors.
        if message.contains("Unknown filter") {
            WorkflowError::TemplateRender(message)
        } else {
            WorkflowError::TemplateParse(message)
        }
    })
}

/// The front matter as written: every field optional, unknown keys ignored.
#[derive(Debug, Default, Deserialize)]
struct RawConfig {
    tracker: Option<RawTracker>,
    /// Seed 000's form of `tracker`.
    source: Option<RawSource>,
    #[serde(default)]
    polling: RawPolling,
    #[serde(default)]
    workspace: RawWorkspace,
    #[serde(default)]
    hooks: RawHooks,
    #[serde(default)]
    agent: RawAgent,
    task: Option<serde_json::Value>,
    #[serde(default)]
    actions: RawActions,
}

/// Keel's `actions` block: how approved tracker actions are sent.
#[derive(Debug, Default, Deserialize)]
struct RawActions {
    #[serde(default)]
    execute_on_approval: bool,
}

#[derive(Debug, Deserialize)]
struct RawTracker {
    kind: Option<String>,
    endpoint: Option<String>,
    api_key: Option<String>,
    repository: Option<String>,
    project_slug: Option<String>,
    active_states: Option<States>,
    terminal_states: Option<States>,
    /// Symphony's `tracker.provider`: the adapter's own settings, which win over the same
    /// ones given beside `kind`.
    #[serde(default)]
    provider: RawProvider,
    /// Symphony's label filter.
    #[serde(default)]
    required_labels: Vec<String>,
    /// Seed 000's event filter.
    #[serde(default)]
    events: Vec<String>,
    /// Symphony's assignee routing (Linear).
    assignee: Option<String>,
}

/// Symphony's `tracker.provider` block, in the names of its adapters (GitHub's `repo`,
/// `token` and `api_url`; Linear's `project_slug`, `api_key` and `endpoint`).
#[derive(Debug, Default, Deserialize)]
struct RawProvider {
    endpoint: Option<String>,
    api_url: Option<String>,
    api_key: Option<String>,
    token: Option<String>,
    project_slug: Option<String>,
    repo: Option<String>,
    repository: Option<String>,
    assignee: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct RawSource {
    kind: Option<String>,
    repository: Option<String>,
    project_slug: Option<String>,
    secret_ref: Option<String>,
    #[serde(default)]
    events: Vec<String>,
}

/// A list of states, or one comma-separated string.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum States {
    List(Vec<String>),
    Joined(String),
}

impl States {
    fn into_vec(self) -> Vec<String> {
        match self {
            States::List(states) => states,
            States::Joined(joined) => joined
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect(),
        }
    }
}

/// An integer, or a string holding one (Symphony accepts both).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum Number {
    Int(i64),
    Text(String),
}

impl Number {
    fn value(&self, field: &str) -> Result<i64> {
        match self {
            Number::Int(n) => Ok(*n),
            Number::Text(text) => text
                .trim()
                .parse()
                .map_err(|_| WorkflowError::Parse(format!("{field} must be an integer"))),
        }
    }

    /// A positive value, or the default when absent.
    fn positive(field: &str, value: Option<&Number>, default: u64) -> Result<u64> {
        match value.map(|n| n.value(field)).transpose()? {
            None => Ok(default),
            Some(n) if n > 0 => Ok(n as u64),
            Some(_) => Err(WorkflowError::Parse(format!("{field} must be positive"))),
        }
    }
}

#[derive(Debug, Default, Deserialize)]
struct RawPolling {
    interval_ms: Option<Number>,
}

#[derive(Debug, Default, Deserialize)]
struct RawWorkspace {
    root: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct RawHooks {
    after_create: Option<String>,
    before_run: Option<String>,
    after_run: Option<String>,
    before_remove: Option<String>,
    timeout_ms: Option<Number>,
}

#[derive(Debug, Default, Deserialize)]
struct RawAgent {
    max_concurrent_agents: Option<Number>,
    max_turns: Option<Number>,
    max_retry_backoff_ms: Option<Number>,
    #[serde(default)]
    max_concurrent_agents_by_state: BTreeMap<String, serde_yaml_ng::Value>,
}

impl WorkflowConfig {
    fn from_raw(raw: RawConfig, directory: Option<&Path>) -> Result<WorkflowConfig> {
        let tracker = match (raw.tracker, raw.source) {
            (Some(_), Some(_)) => {
                return Err(WorkflowError::Parse(
                    "give either tracker or source, not both".into(),
                ));
            }
            (Some(tracker), None) => Some(tracker),
            (None, Some(source)) => Some(source.into_tracker()),
            (None, None) => None,
        };
        let tracker = tracker.map(RawTracker::resolve).transpose()?;
        // Refused here, not when the first item arrives.
        if let Some(branch) = task_draft(raw.task.as_ref())?.push_branch {
            compile(&branch)?;
        }
        let hooks = raw.hooks;
        let timeout_ms = Number::positive(
            "hooks.timeout_ms",
            hooks.timeout_ms.as_ref(),
            DEFAULT_HOOK_TIMEOUT_MS,
        )?;
        if timeout_ms > MAX_HOOK_TIMEOUT_MS {
            return Err(WorkflowError::Parse(format!(
                "hooks.timeout_ms is {timeout_ms}; a hook may run for at most \
                 {MAX_HOOK_TIMEOUT_MS} ms (one hour)"
            )));
        }
        let agent = raw.agent;
        let max_turns = agent
            .max_turns
            .as_ref()
            .map(|n| Number::positive("agent.max_turns", Some(n), 1))
            .transpose()?;
        Ok(WorkflowConfig {
            tracker,
            polling_interval_ms: Number::positive(
                "polling.interval_ms",
                raw.polling.interval_ms.as_ref(),
                DEFAULT_POLLING_INTERVAL_MS,
            )?,
            workspace_root: (raw.workspace.root.as_deref())
                .map(|root| resolve_root(root, directory))
                .transpose()?,
            hooks: Hooks {
                after_create: hooks.after_create,
                before_run: hooks.before_run,
                after_run: hooks.after_run,
                before_remove: hooks.before_remove,
                timeout_ms,
            },
            agent: AgentLimits {
                max_concurrent_agents: Number::positive(
                    "agent.max_concurrent_agents",
                    agent.max_concurrent_agents.as_ref(),
                    DEFAULT_MAX_CONCURRENT_AGENTS,
                )?,
                max_turns,
                max_retry_backoff_ms: Number::positive(
                    "agent.max_retry_backoff_ms",
                    agent.max_retry_backoff_ms.as_ref(),
                    DEFAULT_MAX_RETRY_BACKOFF_MS,
                )?,
                max_concurrent_agents_by_state: by_state(agent.max_concurrent_agents_by_state),
            },
            task: raw.task,
            execute_on_approval: raw.actions.execute_on_approval,
        })
    }
}

/// Symphony: keys normalized, entries that are not positive integers ignored.
fn by_state(raw: BTreeMap<String, serde_yaml_ng::Value>) -> BTreeMap<String, u64> {
    raw.into_iter()
        .filter_map(|(state, limit)| {
            let limit = limit.as_u64().filter(|n| *n > 0)?;
            Some((state.trim().to_lowercase(), limit))
        })
        .collect()
}

impl RawSource {
    fn into_tracker(self) -> RawTracker {
        RawTracker {
            kind: self.kind,
            endpoint: None,
            api_key: self.secret_ref,
            repository: self.repository,
            project_slug: self.project_slug,
            active_states: None,
            terminal_states: None,
            provider: RawProvider::default(),
            required_labels: Vec::new(),
            events: self.events,
            assignee: None,
        }
    }
}

impl RawTracker {
    fn resolve(self) -> Result<Tracker> {
        let provider = self.provider;
        let endpoint = provider.endpoint.or(provider.api_url).or(self.endpoint);
        let api_key = provider.api_key.or(provider.token).or(self.api_key);
        let repository = provider.repo.or(provider.repository).or(self.repository);
        let project_slug = provider.project_slug.or(self.project_slug);
        // Symphony reads a blank assignee as none.
        let assignee = provider.assignee.or(self.assignee);
        let assignee = assignee
            .map(|a| a.trim().to_string())
            .filter(|a| !a.is_empty());
        let kind = match self.kind.as_deref().map(str::trim) {
            Some(name) => TrackerKind::named(name).ok_or_else(|| {
                let names = TrackerKind::names();
                WorkflowError::Parse(format!("tracker.kind must be {names}, not {name}"))
            })?,
            None => return Err(WorkflowError::Parse("tracker.kind is required".into())),
        };
        let api = kind.api();
        let (active, terminal) = api.default_states();
        let strings = |states: &[&str]| states.iter().map(|s| s.to_string()).collect();
        let tracker = Tracker {
            kind,
            endpoint: endpoint.unwrap_or_else(|| api.default_endpoint().to_string()),
            api_key: None,
            repository,
            project_slug,
            active_states: self
                .active_states
                .map_or_else(|| strings(active), States::into_vec),
            terminal_states: self
                .terminal_states
                .map_or_else(|| strings(terminal), States::into_vec),
            required_labels: self.required_labels.iter().map(|l| normalized(l)).collect(),
            events: self.events,
            assignee,
        };
        if let Some(unknown) = tracker.events.iter().find(|e| !EVENTS.contains(&e.trim())) {
            return Err(WorkflowError::Parse(format!(
                "tracker.events: {unknown:?} is no event (expected {})",
                EVENTS.join(", ")
            )));
        }
        if tracker.active_states.is_empty() {
            let why = "tracker.active_states names no state: no item would ever be worked on";
            return Err(WorkflowError::Parse(why.into()));
        }
        // A workflow wrong in both hears of its tracker's settings first, the key's after.
        api.check(&tracker).map_err(WorkflowError::Parse)?;
        let api_key = match api_key.as_deref() {
            Some(key) => Some(api_key_ref(key)?),
            None => api.default_key().map(|name| SecretRef::Env(name.into())),
        };
        Ok(Tracker { api_key, ..tracker })
    }
}

/// Symphony's `workspace.root` as a path: in a file's workflow (`directory` its directory),
/// `$VAR` (the whole root, or its first part) is the variable's value in this process, `~`
/// its home, and a relative root lies in `directory`. A workflow given as text may name
/// only an absolute root: it has no directory, and its writer (perhaps a tenant) no say in
/// the host's environment. The value a variable holds is never echoed.
fn resolve_root(root: &str, directory: Option<&Path>) -> Result<String> {
    let root = root.trim();
    let refused = |why: String| Err(WorkflowError::Parse(format!("workspace.root: {why}")));
    let Some(directory) = directory else {
        return match Path::new(root).is_absolute() {
            true => Ok(root.to_string()),
            false => refused(format!(
                "{root:?} is not an absolute path (a relative root, $VAR or ~ is read only \
                 in a WORKFLOW.md file, against its own directory and its host)"
            )),
        };
    };
    let (head, rest) = root.split_once('/').unwrap_or((root, ""));
    let base = match head {
        "~" => std::env::var("HOME").ok(),
        _ => match head.strip_prefix('$') {
            Some(name) => std::env::var(name).ok(),
            None => return Ok(directory.join(root).to_string_lossy().into_owned()),
        },
    };
    match base.filter(|value| !value.trim().is_empty()) {
        Some(base) if rest.is_empty() => Ok(base),
        Some(base) => Ok(Path::new(&base).join(rest).to_string_lossy().into_owned()),
        None => refused(format!("{head} is not set in this process's environment")),
    }
}

/// `$VAR` is `env:VAR`; anything else must be a Keel secret reference. The value is never
/// echoed: it may be a token someone pasted.
fn api_key_ref(value: &str) -> Result<SecretRef> {
    let reference = match value.strip_prefix('$') {
        Some(name) => format!("env:{name}"),
        None => value.to_string(),
    };
    SecretRef::parse(&reference).map_err(|_| {
        WorkflowError::Parse(
            "tracker.api_key must be $VAR or a secret reference (env:NAME, file:/path, \
             keychain:NAME); raw tokens are never accepted"
                .into(),
        )
    })
}

/// Why an import or a poll was refused, beside the store's own errors.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ExternalError {
    #[error(transparent)]
    Workflow(#[from] WorkflowError),
    /// The source or the payload cannot be imported (no tracker, an unknown payload shape).
    #[error("{0}")]
    Unusable(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// A source's workflow, read from its row or its file, now.
pub(crate) fn load_workflow(source: &SourceRecord) -> Result<Workflow, WorkflowError> {
    match (&source.workflow_markdown, &source.workflow_path) {
        (Some(text), _) => Workflow::parse(text),
        (None, Some(path)) => Workflow::load(std::path::Path::new(path)),
        (None, None) => Err(WorkflowError::MissingFile(
            "the source names no workflow".into(),
        )),
    }
}

/// The workflow's tracker; a source cannot exist without one.
pub(crate) fn tracker(workflow: &Workflow) -> Result<&Tracker, ExternalError> {
    workflow
        .config
        .tracker
        .as_ref()
        .ok_or_else(|| ExternalError::Unusable("the workflow names no tracker".into()))
}

/// An item's tracker as a worker writes to or reads it now: the item, its source's workflow
/// and tracker, and the token resolved; `Err((code, message))` when it cannot be used (its
/// workflow broke, its token is not there).
pub(crate) async fn target_of<'p>(
    poller: &'p Poller,
    scope: &Scope,
    item_id: &str,
) -> Result<Result<(Target<'p>, Workflow), (&'static str, String)>, StoreError> {
    let mut conn = poller.pool.acquire().await?;
    let item = crate::external::get_item(&mut conn, scope, item_id).await?;
    let source = crate::external::get_source(&mut conn, scope, &item.source_id).await?;
    drop(conn);
    let workflow = match load_workflow(&source) {
        Ok(workflow) => workflow,
        Err(error) => return Ok(Err((error.code().as_str(), error.to_string()))),
    };
    let Ok(tracker) = tracker(&workflow) else {
        let message = "the workflow names no tracker".to_string();
        return Ok(Err((ErrorCode::WorkflowParseError.as_str(), message)));
    };
    let token = match token(tracker, (&source, scope), &poller.secrets) {
        Ok(token) => token,
        Err(unresolved) => return Ok(Err((unresolved.code.as_str(), unresolved.message))),
    };
    let target = Target {
        poller,
        item,
        tracker: tracker.clone(),
        token,
    };
    Ok(Ok((target, workflow)))
}

/// The tracker of a workflow whose `tracker` is `settings` (YAML), for the trackers' unit
/// tests: parsed as a workflow's is, with its kind's defaults, hence here, above them.
#[cfg(test)]
pub(crate) fn test_tracker(settings: &str) -> Tracker {
    let workflow = Workflow::parse(&format!("---\ntracker: {settings}\n---\n"));
    workflow.unwrap().config.tracker.unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    const GITHUB: &str = "---
tracker:
  kind: github
  repository: acme/widgets
  api_key: $GITHUB_TOKEN
  active_states: ' open '
polling:
  interval_ms: '5000'
agent:
  max_concurrent_agents_by_state: { ' Open ': 2, closed: 0 }
task:
  execution_kind: shell
  shell_command: echo hi
future_key: ignored
---
Fix {{ issue.identifier }}: {{ issue.title | upcase }}{% if attempt %} (retry {{ attempt }}){% endif %}
";

    fn issue() -> Issue {
        serde_json::from_value(serde_json::json!({
            "id": "1", "identifier": "acme/widgets#7", "title": "broken", "state": "open",
        }))
        .unwrap()
    }

    #[test]
    fn a_github_workflow_parses_with_its_defaults_and_renders() {
        let workflow = Workflow::parse(GITHUB).unwrap();
        let tracker = workflow.config.tracker.clone().unwrap();
        assert_eq!(tracker.kind, TrackerKind::Github);
        assert_eq!(tracker.endpoint, "https://api.github.com");
        assert_eq!(tracker.api_key, Some(SecretRef::Env("GITHUB_TOKEN".into())));
        assert_eq!(tracker.active_states, ["open"]);
        assert_eq!(tracker.terminal_states, ["closed"]);
        assert!(tracker.is_active(" OPEN") && !tracker.is_active("closed"));
        assert_eq!(
            tracker.target(),
            "github:https://api.github.com:acme/widgets"
        );
        let config = &workflow.config;
        assert_eq!(config.polling_interval_ms, 5000);
        assert_eq!(config.hooks.timeout_ms, 60_000);
        assert_eq!(config.agent.max_concurrent_agents, 10);
        assert_eq!(config.agent.max_retry_backoff_ms, 300_000);
        let by_state = &config.agent.max_concurrent_agents_by_state;
        assert_eq!(
            by_state.iter().collect::<Vec<_>>(),
            [(&"open".to_string(), &2)]
        );
        assert_eq!(
            workflow.render(&issue(), None).unwrap(),
            "Fix acme/widgets#7: BROKEN"
        );
        assert_eq!(
            workflow.render(&issue(), Some(2)).unwrap(),
            "Fix acme/widgets#7: BROKEN (retry 2)"
        );
        let draft = workflow.task_draft("the prompt".into(), &issue()).unwrap();
        assert_eq!(draft.shell_command.as_deref(), Some("echo hi"));
        assert_eq!(draft.prompt.as_deref(), Some("the prompt"));
    }

    #[test]
    fn each_item_pushes_to_a_branch_its_issue_names() {
        let text = "---\ntask: {execution_kind: shell, shell_command: echo, repo: /srv/w.git,\n\
                    base_branch: main, push_branch: 'keel/{{ issue.identifier }}'}\n---\nhi";
        let workflow = Workflow::parse(text).unwrap();
        let draft = workflow.task_draft("hi".into(), &issue()).unwrap();
        assert_eq!(draft.push_branch.as_deref(), Some("keel/acme/widgets#7"));
        let broken = text.replace("{{ issue.identifier }}", "{{ issue.identifier ");
        assert!(matches!(
            Workflow::parse(&broken),
            Err(WorkflowError::TemplateParse(_))
        ));
    }

    /// Symphony: "current WORKFLOW.md file is valid and complete": its own file (a
    /// `tracker.provider` block, no key: `LINEAR_API_KEY`, a root under `~`, its
    /// `codex` settings unknown here and ignored) loads as it is.
    #[test]
    fn symphony_current_workflow_md_is_valid_and_complete() {
        let fixtures = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/symphony");
        let workflow = Workflow::load(&fixtures.join("WORKFLOW.md")).unwrap();
        let config = &workflow.config;
        let tracker = config.tracker.as_ref().unwrap();
        assert_eq!(tracker.kind, TrackerKind::Linear);
        assert_eq!(
            tracker.project_slug.as_deref(),
            Some("symphony-0c79b11b75ea")
        );
        assert_eq!(
            tracker.api_key,
            Some(SecretRef::Env("LINEAR_API_KEY".into()))
        );
        assert!(tracker.required_labels.is_empty());
        assert_eq!(
            tracker.active_states,
            ["Todo", "In Progress", "Merging", "Rework"]
        );
        assert_eq!(tracker.terminal_states.len(), 5);
        let home = std::env::var("HOME").unwrap();
        let root = Path::new(&home).join("code/symphony-workspaces");
        assert_eq!(config.workspace_root.as_deref(), root.to_str());
        assert_eq!(config.polling_interval_ms, 5000);
        assert_eq!(config.agent.max_concurrent_agents, 10);
        assert_eq!(config.agent.max_turns, Some(20));
        let after_create = config.hooks.after_create.as_deref().unwrap();
        assert!(
            after_create.starts_with("git clone --depth 1"),
            "{after_create}"
        );
        assert!(config.hooks.before_remove.is_some());
        assert!(workflow.prompt_template.contains("{{ issue.identifier }}"));
        workflow.render(&issue(), Some(2)).unwrap();
    }

    /// Symphony: `tracker.provider` holds the adapter's own settings, which win over the
    /// same ones beside `kind`; a tracker key given nowhere is Linear's `LINEAR_API_KEY`.
    #[test]
    fn the_provider_block_names_the_adapters_settings() {
        let linear = Workflow::parse(
            "---\ntracker:\n  kind: linear\n  project_slug: outer\n  provider:\n    \
             project_slug: inner\n    api_key: $TEAM_KEY\n    endpoint: https://l.example/gql\n---\n",
        )
        .unwrap();
        let tracker = linear.config.tracker.unwrap();
        assert_eq!(tracker.project_slug.as_deref(), Some("inner"));
        assert_eq!(tracker.api_key, Some(SecretRef::Env("TEAM_KEY".into())));
        assert_eq!(tracker.endpoint, "https://l.example/gql");
        let github = Workflow::parse(
            "---\ntracker:\n  kind: github\n  provider: {repo: a/b, token: $GH, api_url: \
             https://ghe.example/api/v3}\n---\n",
        )
        .unwrap();
        let tracker = github.config.tracker.unwrap();
        assert_eq!(tracker.repository.as_deref(), Some("a/b"));
        assert_eq!(tracker.api_key, Some(SecretRef::Env("GH".into())));
        assert_eq!(tracker.endpoint, "https://ghe.example/api/v3");
        let keyless = Workflow::parse("---\ntracker: {kind: github, repository: a/b}\n---\n");
        assert_eq!(keyless.unwrap().config.tracker.unwrap().api_key, None);
    }

    /// Symphony: a workspace root may name `$VAR`, `~`, or a path relative to the
    /// WORKFLOW.md; only a file's workflow reads them, a workflow given as text may not.
    #[test]
    fn a_file_s_workspace_root_resolves_variables_home_and_its_own_directory() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("WORKFLOW.md");
        let with_root = |root: &str| format!("---\nworkspace:\n  root: {root}\n---\n");
        let root_of = |root: &str| {
            std::fs::write(&file, with_root(root)).unwrap();
            Workflow::load(&file).map(|w| w.config.workspace_root.unwrap())
        };
        let home = std::env::var("HOME").unwrap();
        assert_eq!(root_of("$HOME").unwrap(), home);
        assert_eq!(root_of("$HOME/items").unwrap(), format!("{home}/items"));
        assert_eq!(root_of("~/items").unwrap(), format!("{home}/items"));
        let items = dir.path().join("items");
        assert_eq!(root_of("items").unwrap(), items.to_str().unwrap());
        assert_eq!(root_of("/srv/items").unwrap(), "/srv/items");
        let unset = root_of("$KEEL_TEST_UNSET_VARIABLE")
            .unwrap_err()
            .to_string();
        assert!(
            unset.contains("$KEEL_TEST_UNSET_VARIABLE is not set"),
            "{unset}"
        );
        for text_only in ["items", "$HOME", "~/items"] {
            let refused = Workflow::parse(&with_root(text_only)).unwrap_err();
            assert!(
                refused.to_string().contains("not an absolute path"),
                "{refused}"
            );
        }
        let absolute = Workflow::parse(&with_root("/srv/items")).unwrap();
        assert_eq!(
            absolute.config.workspace_root.as_deref(),
            Some("/srv/items")
        );
    }

    /// Symphony's refusals: a state list that names nothing (`","`), a hook timeout that
    /// is not positive, GitHub states it never reports, a blank project slug; and Keel's
    /// own: an assignee for GitHub, which routes nothing.
    #[test]
    fn settings_symphony_refuses_are_refused_with_the_field_named() {
        for (settings, field) in [
            (
                "tracker: {kind: linear, project_slug: eng, active_states: ','}",
                "active_states",
            ),
            (
                "tracker: {kind: linear, project_slug: eng, active_states: []}",
                "active_states",
            ),
            ("hooks: {timeout_ms: 0}", "hooks.timeout_ms"),
            ("hooks: {timeout_ms: -5}", "hooks.timeout_ms"),
            (
                "tracker: {kind: github, repository: a/b, active_states: [open, triage]}",
                "active_states",
            ),
            (
                "tracker: {kind: github, repository: a/b, terminal_states: [open]}",
                "terminal_states",
            ),
            (
                "tracker: {kind: linear, project_slug: '  '}",
                "project_slug",
            ),
            (
                "tracker: {kind: github, repository: a/b, assignee: me}",
                "tracker.assignee",
            ),
        ] {
            let refused = Workflow::parse(&format!("---\n{settings}\n---\n")).unwrap_err();
            assert_eq!(
                refused.code().as_str(),
                "workflow_parse_error",
                "{settings}"
            );
            assert!(refused.to_string().contains(field), "{settings}: {refused}");
        }
        let joined = Workflow::parse(
            "---\ntracker: {kind: linear, project_slug: eng, active_states: 'Todo,  Review,'}\n---\n",
        );
        let states = joined.unwrap().config.tracker.unwrap().active_states;
        assert_eq!(states, ["Todo", "Review"]);
    }

    #[test]
    fn seed_000s_source_form_is_the_same_model() {
        let workflow = Workflow::parse(
            "---\nsource:\n  kind: linear\n  projectSlug: eng\n  secretRef: keychain:LINEAR\n  \
             events: [issue.opened]\n---\nbody",
        )
        .unwrap();
        let tracker = workflow.config.tracker.unwrap();
        assert_eq!(tracker.kind, TrackerKind::Linear);
        assert_eq!(tracker.project_slug.as_deref(), Some("eng"));
        assert_eq!(tracker.api_key, Some(SecretRef::Keychain("LINEAR".into())));
        assert_eq!(tracker.events, ["issue.opened"]);
        let unknown =
            "---\nsource: {kind: github, repository: a/b, events: [issue.created]}\n---\n";
        let error = Workflow::parse(unknown).unwrap_err().to_string();
        assert!(
            error.contains("tracker.events: \"issue.created\" is no event"),
            "{error}"
        );
        assert_eq!(tracker.active_states, ["Todo", "In Progress"]);
        assert_eq!(tracker.endpoint, "https://api.linear.app/graphql");
        let github = Workflow::parse(
            "---\nsource: {kind: github, repository: a/b, secretRef: env:GITHUB_TOKEN}\n---\n",
        )
        .unwrap();
        let from_source = github.config.tracker.unwrap();
        let from_tracker = Workflow::parse(
            "---\ntracker: {kind: github, repository: a/b, api_key: env:GITHUB_TOKEN}\n---\n",
        )
        .unwrap()
        .config
        .tracker
        .unwrap();
        assert_eq!(from_source, from_tracker);
    }

    #[test]
    fn without_front_matter_the_whole_file_is_the_template() {
        let workflow = Workflow::parse("Hello {{ issue.title }}\n").unwrap();
        assert_eq!(workflow.config.tracker, None);
        assert_eq!(workflow.config.polling_interval_ms, 30_000);
        assert_eq!(workflow.render(&issue(), None).unwrap(), "Hello broken");
    }

    fn code(text: &str) -> &'static str {
        Workflow::parse(text).unwrap_err().code().as_str()
    }

    #[test]
    fn every_error_class_has_its_code() {
        let missing = Workflow::load(std::path::Path::new("/nonexistent/WORKFLOW.md"));
        assert_eq!(
            missing.unwrap_err().code().as_str(),
            "missing_workflow_file"
        );
        assert_eq!(code("---\ntracker: [\n---\n"), "workflow_parse_error");
        assert_eq!(
            code("---\ntracker: {kind: jira}\n---\n"),
            "workflow_parse_error"
        );
        assert_eq!(
            code("---\ntracker: {kind: github}\n---\n"),
            "workflow_parse_error"
        );
        assert_eq!(code("---\nno: end\n"), "workflow_parse_error");
        assert_eq!(code("---\ntask: {shell: x}\n---\n"), "workflow_parse_error");
        assert_eq!(
            code("---\npolling: {interval_ms: -1}\n---\n"),
            "workflow_parse_error"
        );
        let capped = Workflow::parse("---\nhooks: {timeout_ms: 999999999999}\n---\n");
        let error = capped.unwrap_err();
        assert_eq!(error.code().as_str(), "workflow_parse_error");
        assert!(error.to_string().contains("at most 3600000 ms"), "{error}");
        let hour = Workflow::parse("---\nhooks: {timeout_ms: 3600000}\n---\n").unwrap();
        assert_eq!(
            hour.config.hooks.timeout(),
            std::time::Duration::from_secs(3600)
        );
        assert_eq!(
            code("---\n- a\n- b\n---\n"),
            "workflow_front_matter_not_a_map"
        );
        assert_eq!(
            code("---\njust text\n---\n"),
            "workflow_front_matter_not_a_map"
        );
        assert_eq!(code("{% if %}"), "template_parse_error");
        assert_eq!(code("{{ issue.title "), "template_parse_error");
        assert_eq!(code("{{ issue.title | shout }}"), "template_render_error");
        let unknown = Workflow::parse("{{ issue.nope }} {{ nobody }}").unwrap();
        let error = unknown.render(&issue(), None).unwrap_err();
        assert_eq!(error.code().as_str(), "template_render_error");
        let unknown = Workflow::parse("{{ nobody }}").unwrap();
        let error = unknown.render(&issue(), None).unwrap_err();
        assert_eq!(error.code().as_str(), "template_render_error");
    }

    #[test]
    fn each_kind_is_named_as_the_workflow_and_the_wire_name_it() {
        for kind in TrackerKind::ALL {
            let name = kind.api().name();
            assert_eq!(serde_json::to_value(kind).unwrap(), name);
            assert_eq!(TrackerKind::named(name), Some(kind));
        }
        let error = Workflow::parse("---\ntracker: {kind: jira}\n---\n").unwrap_err();
        assert_eq!(
            error.to_string(),
            "the workflow front matter is not valid: tracker.kind must be github or linear, \
             not jira"
        );
    }

    #[test]
    fn a_raw_token_is_refused_without_being_echoed() {
        let error = Workflow::parse(
            "---\ntracker: {kind: github, repository: a/b, api_key: ghp_canary123}\n---\n",
        )
        .unwrap_err();
        assert_eq!(error.code().as_str(), "workflow_parse_error");
        assert!(!error.to_string().contains("ghp_canary123"), "{error}");
    }
}
