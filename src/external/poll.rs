//! The `poll` job: one poll of an external work source's tracker, and the import of what it
//! found. A source's background schedule is its one `poll` job row (ref_id: the source id):
//! each attempt polls, then hands the row back due again in `polling.interval_ms`, so any
//! number of workers share the schedule, at most one polls a source at a time, and a
//! restart (or a worker killed mid-poll) loses nothing. Imports are idempotent by the item's
//! key, so a poll repeated after a crash duplicates nothing.
//!
//! Each tracker has its module: [`github`] (REST, ETags) and [`linear`] (GraphQL, paginated);
//! [`import`] records one item and acts on it; [`workspace`] prepares items' workspaces
//! and removes those of terminal items (a duty of the workers' maintenance); [`actions`] proposes and sends the approval-gated
//! writes, the only ones Keel makes on a tracker. This module runs the passes over a source
//! (poll, reconcile, retries, waiting items) and the background job.

pub use crate::external::actions::job::{ActionJobs, Proposed, propose};
pub use crate::external::import::{Imported, import};
use crate::external::import::{retry, start};
pub use crate::external::workspace::remove_terminal_workspaces;

/// A tracker of `kind` on its public endpoint, for the trackers' unit tests.
#[cfg(test)]
pub(crate) fn test_tracker(
    kind: TrackerKind,
    subject: &str,
    active: &str,
    terminal: &str,
) -> Tracker {
    let subject = Some(subject.to_string());
    let (repository, project_slug) = match kind {
        TrackerKind::Github => (subject, None),
        TrackerKind::Linear => (None, subject),
    };
    Tracker {
        kind,
        endpoint: kind.default_endpoint().into(),
        api_key: None,
        repository,
        project_slug,
        active_states: vec![active.into()],
        terminal_states: vec![terminal.into()],
        events: Vec::new(),
    }
}

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::future::BoxFuture;
use keel_workers::media::Secret;
use reqwest::header::{self, HeaderMap};
use serde_json::Value;
use sqlx::PgPool;

use crate::artifacts::content::ContentStore;
use crate::db::StoreError;
use crate::domain::{Actor, Scope};
use crate::external;
use crate::external::workflow::{Issue, Tracker, TrackerKind, Workflow, WorkflowError};
use crate::external::{ItemRecord, POLL_KIND, PollRecord, SourceRecord};
use crate::external::{github, linear, workspace};
use crate::providers::secrets::{SecretPolicy, Unresolved};
use crate::queue::worker::{Job, JobHandler};
use crate::queue::{self, Lease};
use crate::runs::AdmissionRules;

/// Items read per list when the caller names no limit (the seed's default).
pub const DEFAULT_LIMIT: u32 = 50;
/// A rate limit that says nothing about when it lifts waits this long.
const DEFAULT_BACKOFF: Duration = Duration::from_secs(60);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

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
    pub(crate) http: reqwest::Client,
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

/// The item of a manual import's payload: a webhook payload or the item itself, as the
/// tracker's API has it.
pub fn payload_candidate(tracker: &Tracker, payload: &Value) -> Result<Candidate, String> {
    match tracker.kind {
        TrackerKind::Github => github::payload_candidate(tracker, payload),
        TrackerKind::Linear => linear::payload_candidate(tracker, payload),
    }
}

/// A polled item of the tracker, normalized.
pub(crate) fn polled_candidate(tracker: &Tracker, value: &Value) -> Result<Candidate, String> {
    match tracker.kind {
        TrackerKind::Github => github::candidate(tracker, value),
        TrackerKind::Linear => linear::candidate(tracker, value),
    }
}

pub use keel_api_types::PollSummary;

/// How a poll counts what it did (the summary is a wire type, defined in the contract crate).
trait Tally {
    fn count(&mut self, imported: &Imported);
    fn failed(&mut self, code: &str, message: String);
}

impl Tally for PollSummary {
    fn count(&mut self, imported: &Imported) {
        self.candidates += 1;
        self.cancelled_runs += u64::from(imported.cancelled_run_id.is_some());
        if imported.duplicate {
            self.duplicates += 1;
            return;
        }
        let item = &imported.item;
        if let (Some(workspace::REFUSED), Some(message)) =
            (item.last_error_code.as_deref(), &item.last_error)
        {
            self.failed(workspace::REFUSED, message.clone());
        }
        match item.state.as_str() {
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

/// What one pass over a source asks its tracker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pass {
    /// The candidate lists (up to `limit` items), then, where the lists do not show every
    /// state, the claimed items with active runs.
    Poll { limit: u32 },
    /// Only the claimed items with active runs.
    Reconcile,
}

/// Runs one pass over a source and records the outcome on it; returns the summary and the
/// workflow's polling interval (the default when the workflow cannot be read).
pub async fn poll(
    poller: &Poller,
    scope: &Scope,
    source: &SourceRecord,
    pass: Pass,
    actor: &Actor,
) -> Result<(PollSummary, Duration), StoreError> {
    let mut outcome = Outcome {
        summary: PollSummary::default(),
        record: PollRecord {
            backoff_until: source.backoff_until.filter(|until| *until > Utc::now()),
            etags: source.etags.0.clone(),
            ..PollRecord::default()
        },
    };
    let mut interval = Duration::from_millis(30_000);
    match load_workflow(source) {
        Err(error) => outcome.summary.failed(error.code(), error.to_string()),
        Ok(workflow) => {
            interval = Duration::from_millis(workflow.config.polling_interval_ms);
            let imports = Imports {
                poller,
                scope,
                source,
                workflow: &workflow,
                actor,
            };
            imports.pass(pass, &mut outcome).await?;
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

/// Keeps what a fetch says of the source (a rate limit, an error) and gives its items.
fn take(fetched: Fetched, record: &mut PollRecord, summary: &mut PollSummary) -> Vec<Value> {
    record.backoff_until = record.backoff_until.or(fetched.backoff_until);
    if let Some((code, message)) = fetched.error {
        summary.failed(code, message);
    }
    fetched.items
}

/// What importing a poll's items needs.
struct Imports<'a> {
    poller: &'a Poller,
    scope: &'a Scope,
    source: &'a SourceRecord,
    workflow: &'a Workflow,
    actor: &'a Actor,
}

impl Imports<'_> {
    async fn pass(&self, pass: Pass, outcome: &mut Outcome) -> Result<(), StoreError> {
        let Outcome { summary, record } = outcome;
        let Ok(tracker) = tracker(self.workflow) else {
            let message = "the workflow names no tracker".to_string();
            summary.failed("workflow_parse_error", message);
            return Ok(());
        };
        if let Some(until) = record.backoff_until {
            let message = format!("rate limited until {until}; no request was sent");
            summary.failed("rate_limited", message);
            return Ok(());
        }
        let token = match token(tracker, &self.poller.secrets) {
            Ok(token) => token,
            Err(unresolved) => {
                summary.failed(unresolved.code, unresolved.message);
                return Ok(());
            }
        };
        let token = token.as_ref();
        let seen = match pass {
            Pass::Poll { limit } => {
                let (poller, etags) = (self.poller, &self.source.etags.0);
                let fetched = match tracker.kind {
                    TrackerKind::Github => {
                        github::fetch(poller, tracker, token, etags, limit).await
                    }
                    TrackerKind::Linear => linear::fetch(poller, tracker, token, limit).await,
                };
                summary.not_modified = fetched.items.is_empty() && fetched.not_modified;
                record.etags = fetched.etags.clone();
                let items = take(fetched, record, summary);
                self.all(tracker, &items, summary).await?
            }
            Pass::Reconcile => Vec::new(),
        };
        // GitHub's lists have every state; Linear's query only the active ones.
        let asks = pass == Pass::Reconcile || tracker.kind == TrackerKind::Linear;
        let limited = record.backoff_until.is_some() || summary.error_code.is_some();
        if asks && !limited {
            self.reconcile(tracker, token, &seen, record, summary)
                .await?;
        }
        // Runs that ended or were cancelled since may have freed slots; failed ones of
        // items still active are tried again first.
        self.retry_failed(tracker, summary).await?;
        self.start_waiting(tracker, summary).await?;
        let (poller, scope, source, workflow) =
            (self.poller, self.scope, self.source, self.workflow);
        summary.claimed +=
            workspace::advance_unstarted(poller, scope, source, workflow, self.actor).await?;
        Ok(())
    }

    /// Retries the failed runs of items whose newest version is still active (see [`retry`]).
    async fn retry_failed(
        &self,
        tracker: &Tracker,
        summary: &mut PollSummary,
    ) -> Result<(), StoreError> {
        let (poller, scope, source) = (self.poller, self.scope, self.source);
        let mut conn = poller.pool.acquire().await?;
        let failed = external::claimed_with_failed_runs(&mut conn, scope, &source.id, 50).await?;
        drop(conn);
        for failed in failed {
            let state = &failed.newest_tracker_state;
            if !tracker.is_active(state) || tracker.is_terminal(state) {
                continue;
            }
            let mut tx = poller.pool.begin().await?;
            let identifier = &failed.item.identifier;
            external::lock_subject(&mut tx, scope, &source.id, identifier).await?;
            // Another poller may have retried it since it was read.
            let current = external::claimed_version(&mut tx, scope, &source.id, identifier).await?;
            if current.is_none_or(|c| c.run_id != failed.item.run_id) {
                continue;
            }
            let started = retry(&mut tx, poller, scope, self.workflow, &failed, self.actor).await?;
            tx.commit().await?;
            summary.retried += u64::from(started);
        }
        Ok(())
    }

    /// Starts the items that waited for a free slot, oldest first, while slots are free.
    async fn start_waiting(
        &self,
        tracker: &Tracker,
        summary: &mut PollSummary,
    ) -> Result<(), StoreError> {
        let (poller, scope, source) = (self.poller, self.scope, self.source);
        let mut conn = poller.pool.acquire().await?;
        let waiting = external::waiting_for_slots(&mut conn, scope, &source.id, 50).await?;
        drop(conn);
        for item in waiting {
            let Ok(issue) = serde_json::from_value::<Issue>(item.issue.clone()) else {
                continue;
            };
            if !tracker.is_active(&issue.state) {
                continue;
            }
            let mut tx = poller.pool.begin().await?;
            external::lock_subject(&mut tx, scope, &source.id, &item.identifier).await?;
            if external::claimed_version(&mut tx, scope, &source.id, &item.identifier)
                .await?
                .is_some()
            {
                continue;
            }
            let started = start(
                &mut tx,
                poller,
                scope,
                self.workflow,
                &item,
                &issue,
                self.actor,
            )
            .await?;
            tx.commit().await?;
            match started.state.as_str() {
                "claimed" => summary.claimed += 1,
                _ if started.last_error_code.as_deref() == Some("no_free_slot") => break,
                _ => {}
            }
        }
        Ok(())
    }

    /// Asks the tracker for the current version of each claimed item whose run is still
    /// active or failed (but those in `seen`), and imports them: one that left the active
    /// states has its run cancelled, or is not retried.
    async fn reconcile(
        &self,
        tracker: &Tracker,
        token: Option<&Secret>,
        seen: &[String],
        record: &mut PollRecord,
        summary: &mut PollSummary,
    ) -> Result<(), StoreError> {
        let mut conn = self.poller.pool.acquire().await?;
        let claimed =
            external::claimed_to_reconcile(&mut conn, self.scope, &self.source.id, linear::PAGE)
                .await?;
        drop(conn);
        let unseen: Vec<&ItemRecord> = claimed
            .iter()
            .filter(|item| !seen.iter().any(|id| item.issue["id"] == *id.as_str()))
            .collect();
        if unseen.is_empty() {
            return Ok(());
        }
        let fetched = fetch_items(self.poller, tracker, token, &unseen).await;
        let items = take(fetched, record, summary);
        self.all(tracker, &items, summary).await?;
        Ok(())
    }

    /// Imports each item in turn; an item that cannot be read is skipped with a warning.
    /// Returns the tracker ids of the items it read.
    async fn all(
        &self,
        tracker: &Tracker,
        items: &[Value],
        summary: &mut PollSummary,
    ) -> Result<Vec<String>, StoreError> {
        let mut seen = Vec::new();
        for value in items {
            let candidate = match polled_candidate(tracker, value) {
                Ok(candidate) => candidate,
                Err(message) => {
                    let source_id = &self.source.id;
                    tracing::warn!(%source_id, %message, "skipped a tracker item");
                    continue;
                }
            };
            seen.push(candidate.issue.id.clone());
            let (poller, scope, source) = (self.poller, self.scope, self.source);
            match import(poller, scope, source, self.workflow, &candidate, self.actor).await {
                Ok(imported) => summary.count(&imported),
                Err(ExternalError::Store(error)) => return Err(error),
                Err(other) => summary.failed("import_failed", other.to_string()),
            }
        }
        Ok(seen)
    }
}

/// The tracker's token, resolved now (it is never kept): None when the workflow names
/// none.
pub(crate) fn token(
    tracker: &Tracker,
    secrets: &SecretPolicy,
) -> Result<Option<Secret>, Unresolved> {
    tracker
        .api_key
        .as_ref()
        .map(|r| r.resolve(secrets))
        .transpose()
}

/// The current version of each of these items, whatever their state, from the tracker.
pub(crate) async fn fetch_items(
    poller: &Poller,
    tracker: &Tracker,
    token: Option<&Secret>,
    items: &[&ItemRecord],
) -> Fetched {
    match tracker.kind {
        TrackerKind::Github => github::fetch_items(poller, tracker, token, items).await,
        TrackerKind::Linear => linear::fetch_items(poller, tracker, token, items).await,
    }
}

/// What the tracker's lists gave.
#[derive(Debug, Default)]
pub(crate) struct Fetched {
    pub(crate) items: Vec<Value>,
    pub(crate) etags: BTreeMap<String, String>,
    /// Some list answered 304 (and none answered anything new).
    pub(crate) not_modified: bool,
    pub(crate) backoff_until: Option<DateTime<Utc>>,
    pub(crate) error: Option<(&'static str, String)>,
}

/// Whether a tracker's answer refused the request for its rate limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The answer says so (a 429, Linear's `RATELIMITED`).
    Certain,
    /// A refusal that is a rate limit only when the limit is spent (GitHub's 403).
    Possible,
    None,
}

/// The headers in which a tracker tells how much of its limit is left and when it resets.
pub(crate) struct LimitHeaders {
    pub(crate) remaining: &'static str,
    pub(crate) reset: &'static str,
    /// The reset time is in epoch milliseconds, not seconds.
    pub(crate) reset_in_ms: bool,
}

/// When requests may resume, if the answer says to wait: `Retry-After` (seconds) on a
/// refusal, else the reset time once the remaining count is 0; a refusal that is certainly
/// a rate limit (or a possible one with the limit spent) naming neither waits
/// [`DEFAULT_BACKOFF`].
pub(crate) fn resume_at(
    refusal: Refusal,
    headers: &HeaderMap,
    names: &LimitHeaders,
    now: DateTime<Utc>,
) -> Option<DateTime<Utc>> {
    let number = |name: &str| {
        headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<i64>().ok())
    };
    let refused = refusal != Refusal::None;
    if refused && let Some(seconds) = number(header::RETRY_AFTER.as_str()) {
        return Some(now + chrono::Duration::seconds(seconds.max(1)));
    }
    let spent = number(names.remaining) == Some(0);
    if spent && let Some(reset) = number(names.reset) {
        let at = if names.reset_in_ms {
            DateTime::from_timestamp_millis(reset)
        } else {
            DateTime::from_timestamp(reset, 0)
        };
        return at.filter(|at| *at > now);
    }
    (refusal == Refusal::Certain || (refused && spent))
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
        crate::attempt::observe(POLL_KIND, ref_id, span, async move {
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
        let pass = Pass::Poll {
            limit: DEFAULT_LIMIT,
        };
        let (summary, interval) = match poll(&self.poller, &scope, &source, pass, &actor).await {
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
