//! The `poll` job: one poll of an external work source's tracker, and the import of what it
//! found. A source's background schedule is its one `poll` job row (ref_id: the source id):
//! each attempt polls, then hands the row back due again in `polling.interval_ms`, so any
//! number of workers share the schedule, at most one polls a source at a time, and a
//! restart (or a worker killed mid-poll) loses nothing. Imports are idempotent by the item's
//! key, so a poll repeated after a crash duplicates nothing.
//!
//! Beneath it: [`tracker`](super::tracker) (what the trackers share, and
//! [`TrackerApi`](super::tracker::TrackerApi), what each does its own way),
//! [`github`](super::github) (REST, ETags) and [`linear`](super::linear) (GraphQL,
//! paginated); [`import`](super::import) records one item and acts on it, and carries on
//! the items left unstarted; [`workspace`] prepares items' workspaces and removes those of
//! terminal items (a duty of the workers' maintenance). This module runs the passes over a
//! source (poll, reconcile, retries, waiting items, items left unstarted) and the
//! background job.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, FixedOffset, Utc};
use futures_util::future::BoxFuture;
use keel_workers::media::Secret;
use serde_json::Value;

use crate::attempt::JobKind;
use crate::attempt::fence::DomainRow;
use crate::attempt::{self, Attempted, Failure, Verdict};
use crate::db::StoreError;
use crate::domain::{Actor, Scope};
use crate::events::NewEvent;
use crate::external;
use crate::external::import::{
    Imported, NOT_LISTENED, advance_unstarted, import, retry, start, stop_claimed_run,
};
use crate::external::tracker::{Candidate, Fetched, ITEMS_PER_FETCH, Poller, Tracker, token};
use crate::external::workflow::{
    ExternalError, Issue, Workflow, WorkflowError, load_workflow, tracker,
};
use crate::external::workspace;
use crate::external::{ItemRecord, PollRecord, SourceRecord};
use crate::queue::worker::{Job, JobHandler};
use crate::queue::{self, Disposition, Lease};
use sqlx::PgConnection;

/// Items read per list when the caller names no limit (the seed's default).
pub(crate) const DEFAULT_LIMIT: u32 = 50;

pub(crate) use keel_api_types::PollSummary;

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
        if item.last_error_code.as_deref() == Some(NOT_LISTENED) {
            self.not_listened += 1;
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
pub(crate) enum Pass {
    /// The candidate lists (up to `limit` items), then the claimed items they did not show
    /// (asked by id: one that left the active states, or that the tracker no longer has,
    /// is neither retried nor left running).
    Poll { limit: u32 },
    /// Only the claimed items with active runs.
    Reconcile,
}

/// Runs one pass over a source and records the outcome on it; returns the summary and the
/// workflow's polling interval (the default when the workflow cannot be read).
pub(crate) async fn poll(
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
    let loaded = match &source.workflow_path {
        Some(path) => loaded_or_last_good(poller, scope, source, path, &mut outcome).await?,
        None => load_workflow(source),
    };
    match loaded {
        Err(error) => outcome
            .summary
            .failed(error.code().as_str(), error.to_string()),
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

/// A `workflow_path` source's workflow as the file has it now, its text kept as the last
/// good one; or, when an edit broke the file, the last good one (Symphony keeps polling on
/// its last known good config), with the error on the poll.
async fn loaded_or_last_good(
    poller: &Poller,
    scope: &Scope,
    source: &SourceRecord,
    path: &str,
    outcome: &mut Outcome,
) -> Result<Result<Workflow, WorkflowError>, StoreError> {
    let path = std::path::Path::new(path);
    let error = match Workflow::read(path) {
        Ok((text, workflow)) => {
            outcome.record.workflow_last_good = Some(text);
            return Ok(Ok(workflow));
        }
        Err(error) => error,
    };
    let mut conn = poller.pool.acquire().await?;
    let last_good = external::workflow_last_good(&mut conn, scope, &source.id).await?;
    let Some(workflow) = last_good.and_then(|text| Workflow::parse_as_of(&text, path).ok()) else {
        return Ok(Err(error));
    };
    let message = format!("{error}; polling with the last version of the file that parsed");
    outcome.summary.failed(error.code().as_str(), message);
    Ok(Ok(workflow))
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
        let token = match token(tracker, (self.source, self.scope), &self.poller.secrets) {
            Ok(token) => token,
            Err(unresolved) => {
                summary.failed(unresolved.code.as_str(), unresolved.message);
                return Ok(());
            }
        };
        let (token, api) = (token.as_ref(), tracker.api());
        let seen = match pass {
            Pass::Poll { limit } => {
                let (poller, etags) = (self.poller, &self.source.etags.0);
                let fetched = api.fetch(poller, tracker, token, etags, limit).await;
                summary.not_modified = fetched.items.is_empty() && fetched.not_modified;
                record.etags = fetched.etags.clone();
                let items = take(fetched, record, summary);
                self.all(tracker, &items, summary).await?
            }
            Pass::Reconcile => Vec::new(),
        };
        let limited = |record: &PollRecord, summary: &PollSummary| {
            record.backoff_until.is_some() || summary.error_code.is_some()
        };
        let mut vanished = Vec::new();
        if !limited(record, summary) {
            vanished = self
                .reconcile(tracker, token, &seen, record, summary)
                .await?;
        }
        // Runs that ended or were cancelled since may have freed slots; failed ones of
        // items still active are tried again first. Both start from what the tracker said
        // in this pass, so neither starts anything when it could not be asked (Symphony
        // revalidates an item before it dispatches it).
        if !limited(record, summary) {
            self.retry_failed(tracker, &vanished, summary).await?;
            self.start_waiting(tracker, summary).await?;
        }
        let (poller, scope, source, workflow) =
            (self.poller, self.scope, self.source, self.workflow);
        summary.claimed += advance_unstarted(poller, scope, source, workflow, self.actor).await?;
        Ok(())
    }

    /// Retries the failed runs of items whose newest version is still active (see
    /// [`retry`]), but those the tracker no longer shows (`vanished`, its ids).
    async fn retry_failed(
        &self,
        tracker: &Tracker,
        vanished: &[String],
        summary: &mut PollSummary,
    ) -> Result<(), StoreError> {
        let (poller, scope, source) = (self.poller, self.scope, self.source);
        let mut conn = poller.pool.acquire().await?;
        let failed = external::claimed_with_failed_runs(&mut conn, scope, &source.id, 50).await?;
        drop(conn);
        for failed in failed {
            if vanished
                .iter()
                .any(|id| failed.item.issue["id"] == *id.as_str())
            {
                continue;
            }
            let wanted = serde_json::from_value::<Issue>(failed.newest_issue.clone())
                .is_ok_and(|issue| tracker.wants(&issue) && !tracker.is_terminal(&issue.state));
            if !wanted {
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
            if !tracker.wants(&issue) {
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
    /// active or failed, and of each item waiting for a slot (but those in `seen`), and
    /// imports them: one that left the active states has its run cancelled, or is not
    /// retried or started. One the tracker no longer shows (deleted, moved out of the
    /// project, out of the token's sight) has its active run stopped and keeps its
    /// workspace (Symphony); returns the tracker ids of those.
    async fn reconcile(
        &self,
        tracker: &Tracker,
        token: Option<&Secret>,
        seen: &[String],
        record: &mut PollRecord,
        summary: &mut PollSummary,
    ) -> Result<Vec<String>, StoreError> {
        let mut conn = self.poller.pool.acquire().await?;
        let (scope, source_id) = (self.scope, &self.source.id);
        let claimed =
            external::claimed_to_reconcile(&mut conn, scope, source_id, ITEMS_PER_FETCH).await?;
        drop(conn);
        let unseen: Vec<&ItemRecord> = claimed
            .iter()
            .filter(|item| !seen.iter().any(|id| item.issue["id"] == *id.as_str()))
            .collect();
        if unseen.is_empty() {
            return Ok(Vec::new());
        }
        let fetched = tracker
            .api()
            .fetch_items(self.poller, tracker, token, &unseen)
            .await;
        let answered = fetched.error.is_none() && fetched.backoff_until.is_none();
        let items = take(fetched, record, summary);
        let shown = self.all(tracker, &items, summary).await?;
        if !answered {
            return Ok(Vec::new());
        }
        let mut vanished = Vec::new();
        for item in unseen {
            if shown.iter().any(|id| item.issue["id"] == *id.as_str()) {
                continue;
            }
            let stopped = self.stop_vanished(item).await?;
            summary.cancelled_runs += u64::from(stopped);
            vanished.extend(item.issue["id"].as_str().map(String::from));
        }
        Ok(vanished)
    }

    /// Stops the active run of a claimed item the tracker no longer shows; true when there
    /// was one.
    async fn stop_vanished(&self, item: &ItemRecord) -> Result<bool, StoreError> {
        let (scope, source_id) = (self.scope, &self.source.id);
        let mut tx = self.poller.pool.begin().await?;
        external::lock_subject(&mut tx, scope, source_id, &item.identifier).await?;
        let claimed =
            external::claimed_version(&mut tx, scope, source_id, &item.identifier).await?;
        let Some(claimed) = claimed else {
            return Ok(false);
        };
        let why = "is no longer shown by the tracker (deleted, or moved out of its sight)";
        let stopped = stop_claimed_run(&mut tx, scope, &claimed, why).await?;
        tx.commit().await?;
        Ok(stopped.is_some())
    }

    /// Imports each item in dispatch order ([`dispatch_order`]: the first ones take the
    /// free slots); an item that cannot be read is skipped with a warning. Returns the
    /// tracker ids of the items it read.
    async fn all(
        &self,
        tracker: &Tracker,
        items: &[Value],
        summary: &mut PollSummary,
    ) -> Result<Vec<String>, StoreError> {
        let mut candidates: Vec<Candidate> = items
            .iter()
            .filter_map(|value| match tracker.api().candidate(tracker, value) {
                Ok(candidate) => Some(candidate),
                Err(message) => {
                    let source_id = &self.source.id;
                    tracing::warn!(%source_id, %message, "skipped a tracker item");
                    None
                }
            })
            .collect();
        candidates.sort_by_cached_key(|candidate| dispatch_order(&candidate.issue));
        let mut seen = Vec::new();
        for candidate in &candidates {
            seen.push(candidate.issue.id.clone());
            let (poller, scope, source) = (self.poller, self.scope, self.source);
            match import(poller, scope, source, self.workflow, candidate, self.actor).await {
                Ok(imported) => summary.count(&imported),
                Err(ExternalError::Store(error)) => return Err(error),
                Err(other) => summary.failed("import_failed", other.to_string()),
            }
        }
        Ok(seen)
    }
}

/// Symphony's dispatch order: priority 1 (urgent) to 4 first, an item without one after;
/// then the oldest created (an item without a creation time last); then the identifier.
fn dispatch_order(issue: &Issue) -> (i64, bool, Option<DateTime<FixedOffset>>, String) {
    let priority = issue.priority.filter(|p| (1..=4).contains(p)).unwrap_or(5);
    let created =
        (issue.created_at.as_deref()).and_then(|at| DateTime::parse_from_rfc3339(at).ok());
    (
        priority,
        created.is_none(),
        created,
        issue.identifier.clone(),
    )
}

/// The handler of `poll` jobs: a background poll of the job's source, then the job row is
/// handed back due again after the workflow's interval (or when a rate limit lifts).
pub(crate) struct PollJobs {
    pub(crate) poller: Poller,
}

impl JobHandler for PollJobs {
    fn kind(&self) -> &'static str {
        JobKind::Poll.as_str()
    }

    fn run(self: Arc<Self>, job: Job) -> BoxFuture<'static, ()> {
        crate::attempt::observed!(JobKind::Poll, "poll", source_id, job, async move {
            self.execute(job).await
        })
    }
}

impl PollJobs {
    async fn execute(&self, job: Job) -> Result<&'static str, StoreError> {
        let (pool, lease) = (&self.poller.pool, &job.lease);
        let Some(source) = attempt::begin::<SourceRecord>(pool, lease, &()).await? else {
            return Ok("stopped");
        };
        let actor = Actor::Worker(lease.owner.clone());
        let pass = Pass::Poll {
            limit: DEFAULT_LIMIT,
        };
        let verdict = match poll(&self.poller, &lease.scope(), &source, pass, &actor).await {
            Ok((summary, interval)) => {
                let wait = summary
                    .backoff_until
                    .and_then(|until| (until - Utc::now()).to_std().ok())
                    .map_or(interval, |backoff| backoff.max(interval));
                Verdict::Ended(Polled { wait })
            }
            Err(StoreError::LeaseLost) => return Err(StoreError::LeaseLost),
            Err(error) => {
                // The schedule outlives a failing database: try again, backing off.
                tracing::warn!(source_id = %source.id, %error, "background poll failed");
                Verdict::Retry(Failure::runtime(error.to_string()))
            }
        };
        attempt::conclude(pool, &job, &source, &(), verdict).await
    }
}

/// The source, if it was not deleted.
async fn source_if_any(
    conn: &mut PgConnection,
    scope: &Scope,
    id: &str,
) -> Result<Option<SourceRecord>, StoreError> {
    match external::get_source(conn, scope, id).await {
        Ok(source) => Ok(Some(source)),
        Err(StoreError::NotFound(_)) => Ok(None),
        Err(error) => Err(error),
    }
}

/// A background poll's pass that ran: the next one is due after `wait`, while the source's
/// background polling is on.
pub(crate) struct Polled {
    wait: Duration,
}

/// A source is the row of its `poll` job: the job lives while its background polling is on.
impl DomainRow for SourceRecord {
    async fn lock(conn: &mut PgConnection, lease: &Lease) -> Result<Option<Self>, StoreError> {
        queue::fence(conn, lease).await?;
        source_if_any(conn, &lease.scope(), &lease.ref_id).await
    }

    fn has_ended(&self) -> bool {
        !self.background_enabled
    }
}

/// A poll has no state of its own on the source, and its schedule never gives up: a failed
/// pass is tried again, backing off.
impl Attempted for SourceRecord {
    type Ending = Polled;
    type Context = ();

    fn is_running(&self) -> bool {
        false
    }

    fn gave_up(&self, _: &(), _: String, _: Option<&Failure>) -> Option<Polled> {
        None
    }

    fn label(_: &Polled) -> &'static str {
        "polled"
    }

    /// The job row comes back due after the wait, without counting an attempt: the
    /// schedule lives on in it.
    fn disposition(polled: &Polled) -> Disposition {
        Disposition::Snooze {
            reason: "next background poll".into(),
            delay: polled.wait,
        }
    }

    /// Withdraws the snoozed job when the source's background polling stopped meanwhile.
    async fn end<'r>(
        &'r self,
        conn: &mut PgConnection,
        lease: &Lease,
        _: &'r mut Polled,
    ) -> Result<Vec<NewEvent<'r>>, StoreError> {
        let scope = lease.scope();
        let still = source_if_any(conn, &scope, &self.id).await?;
        if still.is_none_or(|source| source.has_ended()) {
            queue::remove(conn, &scope, &lease.kind, &self.id, queue::Locked::Wait).await?;
        }
        Ok(Vec::new())
    }

    async fn requeue<'r>(
        &'r self,
        _: &mut PgConnection,
        _: &Lease,
        _: &'r Failure,
        _: Duration,
    ) -> Result<Vec<NewEvent<'r>>, StoreError> {
        Ok(Vec::new())
    }
}
