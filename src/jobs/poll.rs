//! The `poll` job: one poll of an external work source's tracker, and the import of what it
//! found. A source's background schedule is its one `poll` job row (ref_id: the source id):
//! each attempt polls, then hands the row back due again in `polling.interval_ms`, so any
//! number of workers share the schedule, at most one polls a source at a time, and a
//! restart (or a worker killed mid-poll) loses nothing. Imports are idempotent by the item's
//! key, so a poll repeated after a crash duplicates nothing.
//!
//! GitHub only in this slice: REST `GET`s of the repository's issues and pull requests,
//! with the stored ETag as `If-None-Match` and rate limits honoured.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use keel_workers::media::Secret;
use reqwest::StatusCode;
use reqwest::header::{self, HeaderMap};
use serde::Serialize;
use serde_json::Value;
use sqlx::PgPool;

use crate::domain::secret::SecretPolicy;
use crate::domain::workflow::{Issue, Tracker, TrackerKind, Workflow, WorkflowError};
use crate::domain::{Actor, Invalid, NewTask, Scope};
use crate::queue::worker::{Job, JobHandler};
use crate::queue::{self, Lease};
use crate::store::content::ContentStore;
use crate::store::events::Subject;
use crate::store::external::{
    self, ItemChange, ItemRecord, NewItem, POLL_KIND, PollRecord, SourceRecord,
};
use crate::store::runs::{self, Admission, AdmissionRules, Admitted, Origin};
use crate::store::{StoreError, artifacts, tasks};

/// Items read per list when the caller names no limit (the seed's default).
pub const DEFAULT_LIMIT: u32 = 50;
/// A rate limit that says nothing about when it lifts waits this long.
const DEFAULT_BACKOFF: Duration = Duration::from_secs(60);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// The evidence a started run carries: the normalized item and the prompt rendered from it.
const ITEM_ARTIFACT: &str = "external_work_item.json";
const PROMPT_ARTIFACT: &str = "prompt.md";
const MAX_EVIDENCE_BYTES: i64 = 1024 * 1024;

/// Why an import or a poll was refused, beside the store's own errors.
#[derive(Debug, thiserror::Error)]
pub enum ExternalError {
    #[error(transparent)]
    Workflow(#[from] WorkflowError),
    /// The source or the payload cannot be imported (no tracker, an unknown payload shape).
    #[error("{0}")]
    Unusable(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// What polls and imports need, in a worker or (for `POST .../poll`) in the API.
#[derive(Clone)]
pub struct Poller {
    pub pool: PgPool,
    pub rules: AdmissionRules,
    /// Where the evidence artifacts (the item, the prompt) of a started run go.
    pub content: ContentStore,
    /// Checked at each resolution of a tracker token.
    pub secrets: SecretPolicy,
    http: reqwest::Client,
}

impl Poller {
    pub fn new(
        pool: PgPool,
        rules: AdmissionRules,
        content: ContentStore,
        secrets: SecretPolicy,
    ) -> Poller {
        let http = reqwest::Client::builder()
            .timeout(REQUEST_TIMEOUT)
            .user_agent(concat!("keel/", env!("CARGO_PKG_VERSION")))
            .build()
            .expect("a client with a timeout and a user agent builds");
        Poller {
            pool,
            rules,
            content,
            secrets,
            http,
        }
    }
}

/// A source's workflow, read from its row or its file, now.
pub fn load_workflow(source: &SourceRecord) -> Result<Workflow, WorkflowError> {
    match (&source.workflow_markdown, &source.workflow_path) {
        (Some(text), _) => Workflow::parse(text),
        (None, Some(path)) => Workflow::load(std::path::Path::new(path)),
        (None, None) => Err(WorkflowError::MissingFile(
            "the source names no workflow".into(),
        )),
    }
}

/// The workflow's tracker; a source cannot exist without one.
pub fn tracker(workflow: &Workflow) -> Result<&Tracker, ExternalError> {
    workflow
        .config
        .tracker
        .as_ref()
        .ok_or_else(|| ExternalError::Unusable("the workflow names no tracker".into()))
}

/// One tracker item, normalized, with what keys it.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub idempotency_key: String,
    pub kind: &'static str,
    pub issue: Issue,
}

/// A GitHub issue or pull request (as the REST API or a webhook payload has it) of
/// `repository`, normalized. The key carries `updated_at` (and a pull request's head SHA):
/// a changed item is a new version, the same version again a duplicate.
pub fn github_candidate(repository: &str, value: &Value) -> Result<Candidate, String> {
    let text = |field: &str| value.get(field).and_then(Value::as_str);
    let number = value
        .get("number")
        .and_then(Value::as_u64)
        .ok_or("a GitHub item needs its number")?;
    let updated_at = text("updated_at").ok_or("a GitHub item needs its updated_at")?;
    let state = text("state").ok_or("a GitHub item needs its state")?;
    let head = value.get("head");
    let (kind, key) = match head {
        Some(head) => {
            let sha = head
                .get("sha")
                .and_then(Value::as_str)
                .ok_or("a pull request needs its head.sha")?;
            let key = format!("github:pull_request:{repository}:{number}:{sha}:{updated_at}");
            ("github_pull_request", key)
        }
        None => (
            "github_issue",
            format!("github:issue:{repository}:{number}:{updated_at}"),
        ),
    };
    let labels = value
        .get("labels")
        .and_then(Value::as_array)
        .map(|labels| {
            labels
                .iter()
                .filter_map(|l| l.get("name").and_then(Value::as_str))
                .map(str::to_lowercase)
                .collect()
        })
        .unwrap_or_default();
    let id = match value.get("id") {
        Some(Value::String(id)) => id.clone(),
        Some(id) => id.to_string(),
        None => number.to_string(),
    };
    let issue = Issue {
        id,
        identifier: format!("{repository}#{number}"),
        title: text("title").unwrap_or_default().to_string(),
        description: text("body").map(String::from),
        priority: None,
        state: state.to_string(),
        branch_name: head
            .and_then(|h| h.get("ref"))
            .and_then(Value::as_str)
            .map(String::from),
        url: text("html_url").map(String::from),
        labels,
        blocked_by: Vec::new(),
        created_at: text("created_at").map(String::from),
        updated_at: Some(updated_at.to_string()),
    };
    Ok(Candidate {
        idempotency_key: key,
        kind,
        issue,
    })
}

/// The item of a manual import's payload: a webhook payload (`pull_request` or `issue`
/// beside `repository`) or the item itself.
pub fn payload_candidate(tracker: &Tracker, payload: &Value) -> Result<Candidate, String> {
    if tracker.kind != TrackerKind::Github {
        return Err("only GitHub payloads can be imported in this version".into());
    }
    let repository = tracker.repository.as_deref().unwrap_or_default();
    if let Some(named) = payload
        .pointer("/repository/full_name")
        .and_then(Value::as_str)
        && !named.eq_ignore_ascii_case(repository)
    {
        return Err(format!(
            "the payload is of {named}, not of the source's repository {repository}"
        ));
    }
    let item = ["pull_request", "issue"]
        .iter()
        .find_map(|field| payload.get(*field))
        .unwrap_or(payload);
    github_candidate(repository, item)
}

/// How one candidate's import ended.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Imported {
    pub item: ItemRecord,
    /// True when the key was imported before: nothing changed.
    pub duplicate: bool,
}

/// Imports one candidate in one transaction: the item, and for a new item in an active
/// state the task the workflow's `task` section makes of it, with the rendered prompt,
/// started through the normal admission path (approval gates included), with the item and
/// the prompt as evidence artifacts of its run. The subject's
/// lock makes two importers of versions of one item give it one task between them.
pub async fn import(
    poller: &Poller,
    scope: &Scope,
    source: &SourceRecord,
    workflow: &Workflow,
    candidate: &Candidate,
    actor: &Actor,
) -> Result<Imported, ExternalError> {
    let tracker = tracker(workflow)?;
    let issue = &candidate.issue;
    let issue_json = serde_json::to_value(issue).expect("an issue serializes");
    let mut tx = poller.pool.begin().await.map_err(StoreError::from)?;
    external::lock_subject(&mut tx, scope, &source.id, &issue.identifier).await?;
    let new = NewItem {
        source_id: &source.id,
        idempotency_key: &candidate.idempotency_key,
        kind: candidate.kind,
        identifier: &issue.identifier,
        tracker_state: &issue.state,
        issue: &issue_json,
    };
    let Some(item) = external::insert_item(&mut tx, scope, &new).await? else {
        let item = external::item_by_key(&mut tx, scope, &candidate.idempotency_key).await?;
        return Ok(Imported {
            item,
            duplicate: true,
        });
    };
    let item = if tracker.is_terminal(&issue.state) {
        let change = ItemChange {
            state: "terminal",
            ..ItemChange::default()
        };
        external::update_item(&mut tx, scope, &item.id, &change).await?
    } else if !tracker.is_active(&issue.state)
        || external::claimed_version(&mut tx, scope, &source.id, &issue.identifier)
            .await?
            .is_some()
    {
        // Not to be worked on, or an earlier version of it already has its task.
        item
    } else {
        start(&mut tx, poller, scope, workflow, &item, issue, actor).await?
    };
    tx.commit().await.map_err(StoreError::from)?;
    Ok(Imported {
        item,
        duplicate: false,
    })
}

/// Renders the prompt, creates the task and admits its first run; an item the workflow
/// cannot make a task of is left `blocked` with the reason.
async fn start(
    conn: &mut sqlx::PgConnection,
    poller: &Poller,
    scope: &Scope,
    workflow: &Workflow,
    item: &ItemRecord,
    issue: &Issue,
    actor: &Actor,
) -> Result<ItemRecord, StoreError> {
    let task = match new_task(poller, workflow, issue) {
        Ok(task) => task,
        Err((code, message)) => {
            let change = ItemChange {
                state: "blocked",
                error: Some((code, &message)),
                ..ItemChange::default()
            };
            return external::update_item(conn, scope, &item.id, &change).await;
        }
    };
    let record = tasks::insert(conn, scope, &task, actor).await?;
    let mut admission = Admission::new(Origin::Start);
    admission.reason = Some(format!("external work item {}", issue.identifier));
    let run = match runs::admit(conn, scope, &record.id, admission, &poller.rules, actor).await? {
        Admitted::New(run) | Admitted::Replayed(run) => run,
    };
    let prompt = task.prompt.as_deref().unwrap_or_default();
    let run_subject = Subject::Run {
        task_id: &record.id,
        run_id: &run.id,
    };
    let item_json = serde_json::to_vec_pretty(&item.issue).expect("JSON serializes");
    let evidence = [
        (ITEM_ARTIFACT, "application/json", item_json.as_slice()),
        (
            PROMPT_ARTIFACT,
            "text/markdown; charset=utf-8",
            prompt.as_bytes(),
        ),
    ];
    for (name, content_type, bytes) in evidence {
        let artifact =
            artifacts::open(conn, scope, run_subject, name, "metadata", content_type).await?;
        poller
            .content
            .append(conn, scope, &artifact.id, bytes, MAX_EVIDENCE_BYTES)
            .await?;
        artifacts::close(conn, scope, &artifact.id).await?;
    }
    let change = ItemChange {
        state: "claimed",
        prompt: task.prompt.as_deref(),
        task_id: Some(&record.id),
        run_id: Some(&run.id),
        error: None,
    };
    external::update_item(conn, scope, &item.id, &change).await
}

fn new_task(
    poller: &Poller,
    workflow: &Workflow,
    issue: &Issue,
) -> Result<NewTask, (&'static str, String)> {
    let workflow_error = |e: WorkflowError| (e.code(), e.to_string());
    let invalid_task = |e: Invalid| ("invalid_task", e.to_string());
    let prompt = workflow.render(issue, None).map_err(workflow_error)?;
    let draft = workflow.task_draft(prompt).map_err(workflow_error)?;
    let task = NewTask::parse(draft, &poller.rules.timeouts).map_err(invalid_task)?;
    task.check_workspace(&poller.rules.workspace_roots)
        .map_err(invalid_task)?;
    Ok(task)
}

/// What one poll did, as `POST .../poll` answers and the source's `last_poll` keeps.
#[derive(Debug, Clone, Default, Serialize, utoipa::ToSchema)]
pub struct PollSummary {
    pub candidates: u64,
    /// New items that became tasks.
    pub claimed: u64,
    pub duplicates: u64,
    pub blocked: u64,
    /// New items neither active nor terminal, or whose subject already has a task.
    pub discovered: u64,
    pub terminal: u64,
    /// Every list answered 304: nothing changed.
    pub not_modified: bool,
    /// Set while a rate limit holds requests back.
    pub backoff_until: Option<DateTime<Utc>>,
    pub error_code: Option<String>,
    pub error: Option<String>,
}

impl PollSummary {
    fn count(&mut self, imported: &Imported) {
        self.candidates += 1;
        if imported.duplicate {
            self.duplicates += 1;
            return;
        }
        match imported.item.state.as_str() {
            "claimed" => self.claimed += 1,
            "blocked" => self.blocked += 1,
            "terminal" => self.terminal += 1,
            _ => self.discovered += 1,
        }
    }

    fn failed(&mut self, code: &str, message: String) {
        self.error_code = Some(code.to_string());
        self.error = Some(message);
    }
}

/// Polls a source once and records the outcome on it; returns the summary and the
/// workflow's polling interval (the default when the workflow cannot be read).
pub async fn poll(
    poller: &Poller,
    scope: &Scope,
    source: &SourceRecord,
    limit: u32,
    actor: &Actor,
) -> Result<(PollSummary, Duration), StoreError> {
    let mut outcome = Outcome {
        summary: PollSummary::default(),
        record: PollRecord {
            backoff_until: source.backoff_until.filter(|until| *until > Utc::now()),
            ..PollRecord::default()
        },
    };
    let mut interval = Duration::from_millis(30_000);
    match load_workflow(source) {
        Err(error) => outcome.summary.failed(error.code(), error.to_string()),
        Ok(workflow) => {
            interval = Duration::from_millis(workflow.config.polling_interval_ms);
            poll_with(poller, scope, source, &workflow, limit, actor, &mut outcome).await?;
        }
    }
    let Outcome {
        mut summary,
        mut record,
    } = outcome;
    summary.backoff_until = record.backoff_until;
    record.summary = serde_json::to_value(&summary).expect("a summary serializes");
    record.error = summary.error_code.clone().zip(summary.error.clone());
    let mut conn = poller.pool.acquire().await?;
    external::record_poll(&mut conn, scope, &source.id, &record).await?;
    Ok((summary, interval))
}

/// What a poll reports, and what it leaves on its source.
struct Outcome {
    summary: PollSummary,
    record: PollRecord,
}

async fn poll_with(
    poller: &Poller,
    scope: &Scope,
    source: &SourceRecord,
    workflow: &Workflow,
    limit: u32,
    actor: &Actor,
    outcome: &mut Outcome,
) -> Result<(), StoreError> {
    let Outcome { summary, record } = outcome;
    let Ok(tracker) = tracker(workflow) else {
        summary.failed(
            "workflow_parse_error",
            "the workflow names no tracker".into(),
        );
        return Ok(());
    };
    if let Some(until) = record.backoff_until {
        let message = format!("rate limited until {until}; no request was sent");
        summary.failed("rate_limited", message);
        return Ok(());
    }
    if tracker.kind != TrackerKind::Github {
        summary.failed(
            "tracker_not_supported",
            "Linear polling is not implemented yet".into(),
        );
        return Ok(());
    }
    let token = match &tracker.api_key {
        None => None,
        Some(reference) => match reference.resolve(&poller.secrets) {
            Ok(token) => Some(token),
            Err(unresolved) => {
                summary.failed(unresolved.code, unresolved.message);
                return Ok(());
            }
        },
    };
    let fetched = fetch_github(poller, tracker, token.as_ref(), &source.etags.0, limit).await;
    record.etags = fetched.etags;
    record.backoff_until = fetched.backoff_until;
    summary.not_modified = fetched.items.is_empty() && fetched.not_modified;
    if let Some((code, message)) = fetched.error {
        summary.failed(code, message);
    }
    let repository = tracker.repository.as_deref().unwrap_or_default();
    for value in &fetched.items {
        let candidate = match github_candidate(repository, value) {
            Ok(candidate) => candidate,
            Err(message) => {
                tracing::warn!(source_id = %source.id, %message, "skipped a GitHub item");
                continue;
            }
        };
        match import(poller, scope, source, workflow, &candidate, actor).await {
            Ok(imported) => summary.count(&imported),
            Err(ExternalError::Store(error)) => return Err(error),
            Err(other) => summary.failed("import_failed", other.to_string()),
        }
    }
    Ok(())
}

/// What the tracker's lists gave.
#[derive(Debug, Default)]
struct Fetched {
    items: Vec<Value>,
    etags: BTreeMap<String, String>,
    /// Some list answered 304 (and none answered anything new).
    not_modified: bool,
    backoff_until: Option<DateTime<Utc>>,
    error: Option<(&'static str, String)>,
}

/// GETs the repository's issues, then its pull requests (the issues list has pull requests
/// too, without their head SHA: those entries are left to the second list). A rate limit
/// stops the poll there, without failing the source.
async fn fetch_github(
    poller: &Poller,
    tracker: &Tracker,
    token: Option<&Secret>,
    etags: &BTreeMap<String, String>,
    limit: u32,
) -> Fetched {
    let mut fetched = Fetched::default();
    let base = tracker.endpoint.trim_end_matches('/');
    let repository = tracker.repository.as_deref().unwrap_or_default();
    let per_page = limit.clamp(1, 100);
    for list in ["issues", "pulls"] {
        let url = format!(
            "{base}/repos/{repository}/{list}?state=all&sort=updated&direction=desc&per_page={per_page}"
        );
        let mut request = poller
            .http
            .get(&url)
            .header(header::ACCEPT, "application/vnd.github+json")
            .header("X-GitHub-Api-Version", "2022-11-28");
        if let Some(token) = token {
            request = request.bearer_auth(token.expose());
        }
        if let Some(etag) = etags.get(&url) {
            request = request.header(header::IF_NONE_MATCH, etag);
        }
        let response = match request.send().await {
            Ok(response) => response,
            Err(error) => {
                // Without the URL: reqwest's message would repeat it, and it is known.
                let message = format!("GET {list} failed: {}", error.without_url());
                fetched.error = Some(("tracker_unreachable", message));
                return fetched;
            }
        };
        let status = response.status();
        let headers = response.headers().clone();
        if let Some(until) = rate_limited(status, &headers, Utc::now()) {
            fetched.backoff_until = Some(until);
            if status == StatusCode::FORBIDDEN || status == StatusCode::TOO_MANY_REQUESTS {
                let message = format!("GitHub rate limited the {list} list ({status})");
                fetched.error = Some(("rate_limited", message));
                return fetched;
            }
        }
        match status {
            StatusCode::NOT_MODIFIED => fetched.not_modified = true,
            status if status.is_success() => {
                if let Some(etag) = headers.get(header::ETAG).and_then(|v| v.to_str().ok()) {
                    fetched.etags.insert(url.clone(), etag.to_string());
                }
                match response.json::<Vec<Value>>().await {
                    Ok(items) => fetched.items.extend(
                        items
                            .into_iter()
                            .filter(|item| list == "pulls" || item.get("pull_request").is_none())
                            .take(limit as usize),
                    ),
                    Err(error) => {
                        let message = format!("GitHub's {list} list is not JSON: {error}");
                        fetched.error = Some(("tracker_error", message));
                        return fetched;
                    }
                }
            }
            status => {
                let message = format!("GitHub answered the {list} list with {status}");
                fetched.error = Some(("tracker_error", message));
                return fetched;
            }
        }
    }
    fetched
}

/// When requests may resume, if the response says to wait: `Retry-After` (seconds) on a
/// 403 or 429, else `X-RateLimit-Reset` (epoch seconds) once `X-RateLimit-Remaining` is 0;
/// a 429 (or a 403 with the limit spent) naming neither waits [`DEFAULT_BACKOFF`].
fn rate_limited(
    status: StatusCode,
    headers: &HeaderMap,
    now: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    let number = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<i64>().ok())
    };
    let limited = status == StatusCode::TOO_MANY_REQUESTS || status == StatusCode::FORBIDDEN;
    if limited && let Some(seconds) = number(header::RETRY_AFTER.as_str()) {
        return Some(now + chrono::Duration::seconds(seconds.max(1)));
    }
    let spent = number("x-ratelimit-remaining") == Some(0);
    if spent && let Some(reset) = number("x-ratelimit-reset") {
        return DateTime::from_timestamp(reset, 0).filter(|at| *at > now);
    }
    (status == StatusCode::TOO_MANY_REQUESTS || (limited && spent))
        .then(|| now + chrono::Duration::from_std(DEFAULT_BACKOFF).expect("a minute"))
}

/// The handler of `poll` jobs: a background poll of the job's source, then the job row is
/// handed back due again after the workflow's interval (or when a rate limit lifts).
pub struct PollJobs {
    pub poller: Poller,
}

impl JobHandler for PollJobs {
    fn kind(&self) -> &'static str {
        POLL_KIND
    }

    fn run(self: Arc<Self>, job: Job) -> BoxFuture<'static, ()> {
        let span = tracing::info_span!(
            "poll",
            source_id = %job.lease.ref_id,
            outcome = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
        );
        let ref_id = job.lease.ref_id.clone();
        super::observe(POLL_KIND, ref_id, span, async move {
            self.execute(&job.lease).await
        })
    }
}

impl PollJobs {
    async fn execute(&self, lease: &Lease) -> Result<&'static str, StoreError> {
        let scope = lease.scope();
        let Some(source) = self.background_source(&scope, lease).await? else {
            self.finish(lease, None).await?;
            return Ok("stopped");
        };
        let actor = Actor::Worker(lease.owner.clone());
        let (summary, interval) =
            match poll(&self.poller, &scope, &source, DEFAULT_LIMIT, &actor).await {
                Ok(polled) => polled,
                Err(StoreError::LeaseLost) => return Err(StoreError::LeaseLost),
                Err(error) => {
                    // The schedule outlives a failing database: try again, backing off.
                    tracing::warn!(source_id = %source.id, %error, "background poll failed");
                    let mut tx = queue::begin_fenced(&self.poller.pool, lease).await?;
                    let delay = queue::backoff(lease.attempts);
                    queue::retry(&mut tx, lease, &error.to_string(), delay, true).await?;
                    tx.commit().await?;
                    return Ok("retried");
                }
            };
        let wait = summary
            .backoff_until
            .and_then(|until| (until - Utc::now()).to_std().ok())
            .map_or(interval, |backoff| backoff.max(interval));
        let next = self.background_source(&scope, lease).await?.map(|_| wait);
        self.finish(lease, next).await?;
        Ok("polled")
    }

    /// The job's source while its background polling is on.
    async fn background_source(
        &self,
        scope: &Scope,
        lease: &Lease,
    ) -> Result<Option<SourceRecord>, StoreError> {
        let mut conn = self.poller.pool.acquire().await?;
        match external::get_source(&mut conn, scope, &lease.ref_id).await {
            Ok(source) => Ok(source.background_enabled.then_some(source)),
            Err(StoreError::NotFound(_)) => Ok(None),
            Err(error) => Err(error),
        }
    }

    /// Hands the job row back due after `next`, without counting an attempt (the schedule
    /// lives on in it), or acks it when the source's background polling stopped.
    async fn finish(&self, lease: &Lease, next: Option<Duration>) -> Result<(), StoreError> {
        let mut tx = queue::begin_fenced(&self.poller.pool, lease).await?;
        match next {
            Some(delay) => {
                queue::retry(&mut tx, lease, "next background poll", delay, false).await?
            }
            None => queue::complete(&mut tx, lease).await?,
        }
        tx.commit().await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn github_items_are_keyed_by_version() {
        let issue = json!({ "id": 11, "number": 7, "title": "Broken", "state": "open",
            "updated_at": "2026-01-01T00:00:00Z", "labels": [{ "name": "Bug" }],
            "html_url": "https://github.com/a/b/issues/7" });
        let candidate = github_candidate("a/b", &issue).unwrap();
        assert_eq!(
            candidate.idempotency_key,
            "github:issue:a/b:7:2026-01-01T00:00:00Z"
        );
        assert_eq!(candidate.kind, "github_issue");
        assert_eq!(candidate.issue.identifier, "a/b#7");
        assert_eq!(candidate.issue.labels, ["bug"]);
        let pull = json!({ "id": 12, "number": 8, "title": "Fix", "state": "open",
            "updated_at": "2026-01-02T00:00:00Z", "head": { "sha": "abc", "ref": "fix-it" } });
        let candidate = github_candidate("a/b", &pull).unwrap();
        assert_eq!(
            candidate.idempotency_key,
            "github:pull_request:a/b:8:abc:2026-01-02T00:00:00Z"
        );
        assert_eq!(candidate.issue.branch_name.as_deref(), Some("fix-it"));
        assert!(github_candidate("a/b", &json!({ "number": 1 })).is_err());
    }

    #[test]
    fn rate_limits_come_from_the_headers() {
        let now = Utc::now();
        let headers = |pairs: &[(&'static str, &str)]| {
            let mut map = HeaderMap::new();
            for (name, value) in pairs {
                map.insert(*name, value.parse().unwrap());
            }
            map
        };
        let retry = rate_limited(
            StatusCode::TOO_MANY_REQUESTS,
            &headers(&[("retry-after", "7")]),
            now,
        );
        assert_eq!(retry, Some(now + chrono::Duration::seconds(7)));
        let reset = (now + chrono::Duration::seconds(90)).timestamp();
        let spent = headers(&[
            ("x-ratelimit-remaining", "0"),
            ("x-ratelimit-reset", &reset.to_string()),
        ]);
        assert_eq!(
            rate_limited(StatusCode::FORBIDDEN, &spent, now),
            DateTime::from_timestamp(reset, 0)
        );
        assert_eq!(
            rate_limited(
                StatusCode::OK,
                &headers(&[("x-ratelimit-remaining", "5")]),
                now
            ),
            None
        );
        assert_eq!(
            rate_limited(StatusCode::FORBIDDEN, &HeaderMap::new(), now),
            None
        );
        assert!(rate_limited(StatusCode::TOO_MANY_REQUESTS, &HeaderMap::new(), now).is_some());
    }
}
