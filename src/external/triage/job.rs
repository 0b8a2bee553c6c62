//! The `ci_triage` job (ref_id: its scan's id), run by workers only: it asks GitHub for the
//! pull request's head, records a `stale` record and reads no CI when the head moved on since
//! the item's version, and otherwise reads the head's failing checks and jobs (GET only) and
//! records each once, with its evidence and, when asked, the fix task. A scan that dies
//! half-way is taken over and done again: a check recorded before is found as a duplicate.
//! Starting a record's fix run ([`start_fix_run`]) is the API's: one run per record, task
//! and head.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use serde_json::{Value, json};
use sqlx::PgConnection;

use crate::attempt::fence::DomainRow;
use crate::attempt::{self, Attempted, Failure, JobKind, Verdict};
use crate::db::StoreError;
use crate::domain::{Actor, Role, Scope};
use crate::events::{NewEvent, Subject};
use crate::external::github::head_sha;
use crate::external::import::{Evidence, evidence_artifact, task_in};
use crate::external::tracker::{Pause, Poller, Target};
use crate::external::triage::checks::{Failing, Reader};
use crate::external::triage::store::{self, NewRecord, RecordChange};
use crate::external::workflow::{Workflow, target_of};
use crate::external::{self, ItemRecord};
use crate::queue::worker::{Job, JobHandler};
use crate::queue::{self, Disposition, Lease};
use crate::runs::{self, Admission, AdmissionRules, Admitted, Origin, RunRecord};
use crate::tasks;
use keel_api_types::{
    CheckKind, DEFAULT_TRIAGE_RECORDS, ErrorCode, FixRun, MAX_TRIAGE_RECORDS, ScanStatus,
    TriageRecord, TriageRequest, TriageScan, TriageStatus, TriageSummary,
};

/// The most of a job's log a fix task's prompt quotes (its end); the evidence keeps more.
const PROMPT_LOG_BYTES: usize = 8 * 1024;

/// Asks for a scan of a pull request item's CI: recorded `queued`, its job queued in the
/// same transaction. 422 `unsupported_action` for an item that is no pull request.
pub(crate) async fn request_scan(
    conn: &mut PgConnection,
    scope: &Scope,
    item_id: &str,
    request: &TriageRequest,
    actor: &Actor,
) -> Result<TriageScan, StoreError> {
    let item = external::get_item(conn, scope, item_id).await?;
    if item.kind != "github_pull_request" {
        return Err(StoreError::Unprocessable {
            code: ErrorCode::UnsupportedAction,
            message: format!(
                "CI triage is for pull requests ({} is a {})",
                item.identifier, item.kind
            ),
        });
    }
    let limit = request.limit.unwrap_or(DEFAULT_TRIAGE_RECORDS);
    if !(1..=MAX_TRIAGE_RECORDS).contains(&limit) {
        return Err(StoreError::Unprocessable {
            code: ErrorCode::InvalidRequest,
            message: format!("limit: must be 1 to {MAX_TRIAGE_RECORDS}, not {limit}"),
        });
    }
    let create_task = request.create_task.unwrap_or(true);
    let requested_by = actor.to_string();
    let scan = store::insert_scan(
        conn,
        scope,
        &item.id,
        limit as i32,
        create_task,
        &requested_by,
    )
    .await?;
    queue::enqueue(conn, scope, JobKind::CiTriage.as_str(), &scan.id, 0).await?;
    Ok(scan)
}

/// Starts a record's fix run, or answers the one it started: admitted as a start of its
/// task with the record's idempotency key. 409 `triage_not_runnable` for a stale record or
/// one without a task.
pub(crate) async fn start_fix_run(
    conn: &mut PgConnection,
    scope: &Scope,
    triage_id: &str,
    rules: &AdmissionRules,
    actor: &Actor,
) -> Result<FixRun, StoreError> {
    let record = store::lock_record(conn, scope, triage_id).await?;
    let refused = |why: String| StoreError::Refused {
        code: ErrorCode::TriageNotRunnable,
        message: format!("ci triage record {triage_id} {why}"),
    };
    if record.status == TriageStatus::Stale {
        return Err(refused(
            "is stale: the pull request's head moved on; triage it again".into(),
        ));
    }
    let Some(task_id) = record.task_id.clone() else {
        return Err(refused(format!("has no fix task ({})", record.status)));
    };
    if let Some(run_id) = &record.run_id {
        let run = runs::get(conn, scope, &task_id, run_id).await?;
        return Ok(FixRun {
            triage: record,
            run,
        });
    }
    let admission = Admission {
        idempotency: Some((record.idempotency_key.clone(), json!({}))),
        reason: Some(format!("the fix of ci triage record {triage_id}")),
        ..Admission::new(Origin::Start)
    };
    let run: RunRecord = match runs::admit(conn, scope, &task_id, admission, rules, actor).await? {
        Admitted::New(run) | Admitted::Replayed(run) => run,
    };
    let change = RecordChange {
        status: Some(TriageStatus::RunRequested),
        run_id: Some(&run.id),
        ..RecordChange::default()
    };
    let triage = store::update_record(conn, scope, triage_id, &change).await?;
    Ok(FixRun { triage, run })
}

/// The handler of `ci_triage` jobs.
pub(crate) struct TriageJobs {
    pub(crate) poller: Poller,
}

impl JobHandler for TriageJobs {
    fn kind(&self) -> &'static str {
        JobKind::CiTriage.as_str()
    }

    fn run(self: Arc<Self>, job: Job) -> BoxFuture<'static, ()> {
        crate::attempt::observed!(JobKind::CiTriage, "ci_triage", scan_id, job, async move {
            tokio::select! {
                done = self.execute(&job) => done,
                () = job.interrupt.cancelled() => Err(StoreError::LeaseLost),
            }
        })
    }
}

/// How a scan ends: its summary, or why GitHub could not be read for it.
pub(crate) struct Scanned(Result<TriageSummary, (&'static str, String)>);

impl DomainRow for TriageScan {
    async fn lock(conn: &mut PgConnection, lease: &Lease) -> Result<Option<Self>, StoreError> {
        queue::fence(conn, lease).await?;
        store::lock_scan(conn, &lease.scope(), &lease.ref_id).await
    }

    fn has_ended(&self) -> bool {
        self.status != ScanStatus::Queued
    }
}

impl Attempted for TriageScan {
    type Ending = Scanned;
    type Context = ();

    fn is_running(&self) -> bool {
        false
    }

    fn gave_up(&self, _: &(), error: String, failure: Option<&Failure>) -> Option<Scanned> {
        let (code, message) = match failure {
            Some(failure) => (failure.code, failure.message.clone()),
            None => ("gave_up", error),
        };
        Some(Scanned(Err((code, message))))
    }

    fn label(ending: &Scanned) -> &'static str {
        match ending.0 {
            Ok(_) => ScanStatus::Done.as_str(),
            Err(_) => ScanStatus::Failed.as_str(),
        }
    }

    fn disposition(_: &Scanned) -> Disposition {
        Disposition::Complete
    }

    async fn end<'r>(
        &'r self,
        conn: &mut PgConnection,
        lease: &Lease,
        ending: &'r mut Scanned,
    ) -> Result<Vec<NewEvent<'r>>, StoreError> {
        let outcome = match &ending.0 {
            Ok(summary) => Ok(summary),
            Err((code, message)) => Err((*code, message.as_str())),
        };
        store::finish_scan(conn, &lease.scope(), &self.id, outcome).await?;
        Ok(Vec::new())
    }

    /// GitHub could not be asked: the scan stays queued, to be tried again.
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

/// Why a scan stops before its end: GitHub is to be asked again later, or cannot be used.
enum Stop {
    Pause(Pause),
    Unusable(&'static str, String),
}

impl From<Pause> for Stop {
    fn from(pause: Pause) -> Stop {
        Stop::Pause(pause)
    }
}

impl TriageJobs {
    async fn execute(&self, job: &Job) -> Result<&'static str, StoreError> {
        let (pool, lease) = (&self.poller.pool, &job.lease);
        let Some(scan) = attempt::begin::<TriageScan>(pool, lease, &()).await? else {
            return Ok("ended");
        };
        let verdict = match self.scan(lease, &scan).await? {
            Ok(summary) => Verdict::Ended(Scanned(Ok(summary))),
            Err(Stop::Unusable(code, message)) => Verdict::Ended(Scanned(Err((code, message)))),
            Err(Stop::Pause(pause)) => Verdict::Retry(Failure {
                code: pause.code,
                after: pause
                    .until
                    .and_then(|until| (until - chrono::Utc::now()).to_std().ok()),
                message: pause.message,
            }),
        };
        attempt::conclude(pool, job, &scan, &(), verdict).await
    }

    /// The scan itself: the head asked for, then a stale record or each failing check's.
    async fn scan(
        &self,
        lease: &Lease,
        scan: &TriageScan,
    ) -> Result<Result<TriageSummary, Stop>, StoreError> {
        let scope = lease.scope();
        let (target, workflow) = match target_of(&self.poller, &scope, &scan.item_id).await? {
            Ok(resolved) => resolved,
            Err((code, message)) => return Ok(Err(Stop::Unusable(code, message))),
        };
        let head = match self.current_head(&target).await {
            Ok(Some(head)) => head,
            Ok(None) => {
                let message = format!("{} is gone from GitHub", target.item.identifier);
                return Ok(Err(Stop::Unusable("tracker_item_gone", message)));
            }
            Err(pause) => return Ok(Err(pause.into())),
        };
        let mut summary = TriageSummary::default();
        let scanning = Scanning {
            lease,
            scan,
            target: &target,
            workflow: &workflow,
            head: &head,
        };
        let recorded = head_sha(&target.item.idempotency_key).unwrap_or_default();
        if head.sha != recorded {
            let reason = format!(
                "the pull request's head is now {} (the item has {recorded}): no CI was read",
                head.sha
            );
            let stale = Checked::stale(recorded, &reason);
            self.record(&scanning, &stale, &mut summary).await?;
            return Ok(Ok(summary));
        }
        let reader = Reader {
            poller: &self.poller,
            tracker: &target.tracker,
            token: target.token.as_ref(),
        };
        let failing = match reader.failing(&head.sha, scan.max_records as usize).await {
            Ok(failing) => failing,
            Err(pause) => return Ok(Err(pause.into())),
        };
        for check in failing {
            let log = match check.kind {
                CheckKind::WorkflowJob => match reader.job_log(check.id).await {
                    Ok(log) => Ok(log),
                    Err(pause) if pause.code == "rate_limited" => return Ok(Err(pause.into())),
                    Err(pause) => Err(pause.message),
                },
                CheckKind::CheckRun => Ok(String::new()),
            };
            let checked = Checked::failing(check, log);
            self.record(&scanning, &checked, &mut summary).await?;
        }
        Ok(Ok(summary))
    }

    /// The pull request's head now; None when GitHub no longer has it.
    async fn current_head(&self, target: &Target<'_>) -> Result<Option<Head>, Pause> {
        Ok(target.current().await?.and_then(|pull| {
            Some(Head {
                sha: pull.pointer("/head/sha")?.as_str()?.to_string(),
                reference: pull
                    .pointer("/head/ref")
                    .and_then(Value::as_str)
                    .map(String::from),
            })
        }))
    }

    /// Records one check (or the stale head) in its own fenced transaction: the record, its
    /// evidence on the item's run, and its fix task; a check recorded before is counted a
    /// duplicate.
    async fn record(
        &self,
        scanning: &Scanning<'_>,
        checked: &Checked,
        summary: &mut TriageSummary,
    ) -> Result<(), StoreError> {
        let Scanning {
            lease,
            scan,
            target,
            workflow,
            head,
        } = scanning;
        let scope = lease.scope();
        let item = &target.item;
        let (repository, number) = subject(item);
        let check = checked.check.as_ref();
        let mut tx = queue::begin_fenced(&self.poller.pool, lease).await?;
        let new = NewRecord {
            item_id: &item.id,
            scan_id: &scan.id,
            repository,
            subject_number: number,
            head_sha: checked.head_sha.as_deref().unwrap_or(&head.sha),
            head_ref: head.reference.as_deref(),
            check_kind: check.map(|c| c.kind),
            check_name: check.map_or("", |c| c.name.as_str()),
            check_id: check.map(|c| c.id),
            conclusion: check.map(|c| c.conclusion.as_str()),
            details_url: check.and_then(|c| c.details_url.as_deref()),
            status: checked.status(),
            reason: checked.reason.as_deref(),
        };
        let record = match store::insert_once(&mut tx, &scope, &new).await? {
            Ok(record) => record,
            Err(existing) => {
                summary.duplicates += 1;
                summary.triage_ids.push(existing.id);
                tx.commit().await?;
                return Ok(());
            }
        };
        summary.triage_ids.push(record.id.clone());
        let artifact_id = self
            .evidence(&mut tx, &scope, item, &record, checked)
            .await?;
        let fixed = match record.status {
            TriageStatus::Triaged if scan.create_task => {
                let writer = external::registrant_role(&mut tx, &scope, &item.source_id).await?;
                let task = fix_task(&self.poller, workflow, item, &record, checked, writer);
                Some(match task {
                    Ok(task) => match tasks::insert(&mut tx, &scope, &task, &actor(lease)).await {
                        Ok(inserted) => Ok(inserted.id),
                        Err(StoreError::Unprocessable { message, .. }) => Err(message),
                        Err(error) => return Err(error),
                    },
                    Err((_, message)) => Err(message),
                })
            }
            _ => None,
        };
        let mut change = RecordChange {
            artifact_id: artifact_id.as_deref(),
            ..RecordChange::default()
        };
        match (&record.status, &fixed) {
            (TriageStatus::Stale, _) => summary.stale += 1,
            (TriageStatus::Failed, _) => summary.failed += 1,
            (_, None) => summary.triaged += 1,
            (_, Some(Ok(task_id))) => {
                summary.triaged += 1;
                summary.task_created += 1;
                change.task_id = Some(task_id);
                change.status = Some(TriageStatus::TaskCreated);
            }
            (_, Some(Err(why))) => {
                summary.triaged += 1;
                summary.blocked += 1;
                change.status = Some(TriageStatus::Blocked);
                change.reason = Some(why);
            }
        }
        store::update_record(&mut tx, &scope, &record.id, &change).await?;
        tx.commit().await?;
        Ok(())
    }

    /// The record's evidence as an artifact of the item's run (when it has one): the check,
    /// and a job's log tail.
    async fn evidence(
        &self,
        conn: &mut PgConnection,
        scope: &Scope,
        item: &ItemRecord,
        record: &TriageRecord,
        checked: &Checked,
    ) -> Result<Option<String>, StoreError> {
        let (Some(task_id), Some(run_id)) = (&item.task_id, &item.run_id) else {
            return Ok(None);
        };
        let evidence = json!({
            "triage_id": record.id,
            "head_sha": record.head_sha,
            "check": checked.check.as_ref().map(|c| json!({
                "kind": c.kind, "name": c.name, "id": c.id, "conclusion": c.conclusion,
                "details_url": c.details_url, "summary": c.summary,
            })),
            "log_tail": checked.log.as_ref().ok(),
            "log_error": checked.log.as_ref().err(),
            "reason": checked.reason,
        });
        let text = serde_json::to_string_pretty(&evidence).expect("JSON serializes");
        let run = Subject::Run { task_id, run_id };
        let name = format!("ci_triage_{}.json", record.id);
        let written = Evidence {
            name: &name,
            content_type: "application/json",
            bytes: text.as_bytes(),
        };
        let content = &self.poller.content;
        let artifact_id = evidence_artifact(conn, content, scope, run, written).await?;
        Ok(Some(artifact_id))
    }
}

/// One scan's context: its lease and row, the item's tracker and workflow, the head now.
struct Scanning<'a> {
    lease: &'a Lease,
    scan: &'a TriageScan,
    target: &'a Target<'a>,
    workflow: &'a Workflow,
    head: &'a Head,
}

/// The pull request's head as GitHub has it now.
struct Head {
    sha: String,
    reference: Option<String>,
}

/// What one record is made of: a failing check with its log (or why the log could not be
/// read), or the stale head the item had.
struct Checked {
    check: Option<Failing>,
    log: Result<String, String>,
    /// A stale record's head (the item's).
    head_sha: Option<String>,
    reason: Option<String>,
}

impl Checked {
    fn stale(head_sha: &str, reason: &str) -> Checked {
        Checked {
            check: None,
            log: Ok(String::new()),
            head_sha: Some(head_sha.to_string()),
            reason: Some(reason.to_string()),
        }
    }

    fn failing(check: Failing, log: Result<String, String>) -> Checked {
        let reason = log
            .as_ref()
            .err()
            .map(|why| format!("the job's log could not be read: {why}"));
        Checked {
            check: Some(check),
            log,
            head_sha: None,
            reason,
        }
    }

    fn status(&self) -> TriageStatus {
        match (&self.check, &self.log) {
            (None, _) => TriageStatus::Stale,
            (Some(_), Err(_)) => TriageStatus::Failed,
            (Some(_), Ok(_)) => TriageStatus::Triaged,
        }
    }
}

/// A record's fix task: the workflow's task for the item, on the pull request's branch
/// (`base_branch`), its results pushed to a branch of their own, with a prompt that says
/// what failed and that nothing on GitHub is changed but through an approved action.
fn fix_task(
    poller: &Poller,
    workflow: &Workflow,
    item: &ItemRecord,
    record: &TriageRecord,
    checked: &Checked,
    writer: Role,
) -> Result<tasks::NewTask, (&'static str, String)> {
    let issue: external::workflow::Issue = serde_json::from_value(item.issue.clone())
        .map_err(|e| ("invalid_task", format!("the item is unreadable: {e}")))?;
    let prompt = fix_prompt(record, checked);
    let mut draft = workflow
        .task_draft(prompt, &issue)
        .map_err(|e| (e.code().as_str(), e.to_string()))?;
    if draft.repo.is_some()
        && let Some(branch) = &record.head_ref
    {
        let short = &record.head_sha[..record.head_sha.len().min(7)];
        draft.base_branch = Some(branch.clone());
        draft.push_branch = Some(format!("keel/ci-fix/{}-{short}", record.subject_number));
    }
    task_in(
        poller,
        workflow,
        draft,
        item.workspace_path.as_deref(),
        writer,
    )
}

fn fix_prompt(record: &TriageRecord, checked: &Checked) -> String {
    let check = checked.check.as_ref();
    let mut prompt = format!(
        "The CI check \"{}\" failed ({}) on {}#{} at commit {}.\n",
        record.check_name,
        check.map_or("failure", |c| c.conclusion.as_str()),
        record.repository,
        record.subject_number,
        record.head_sha,
    );
    if let Some(url) = check.and_then(|c| c.details_url.as_deref()) {
        prompt.push_str(&format!("Details: {url}\n"));
    }
    if let Some(summary) = check.and_then(|c| c.summary.as_deref()) {
        prompt.push_str(&format!("\n{summary}\n"));
    }
    if let Ok(log) = &checked.log
        && !log.is_empty()
    {
        let start = log.len().saturating_sub(PROMPT_LOG_BYTES);
        let start = (start..log.len())
            .find(|i| log.is_char_boundary(*i))
            .unwrap_or(log.len());
        prompt.push_str(&format!(
            "\nThe end of its log:\n```\n{}\n```\n",
            &log[start..]
        ));
    }
    let branch = record
        .head_ref
        .as_deref()
        .unwrap_or("the pull request's branch");
    prompt.push_str(&format!(
        "\nFix the failure in this workspace ({branch}). Do not push, comment, review, merge \
         or change GitHub in any other way yourself: the run's result is pushed to a branch \
         of its own, and any change on GitHub goes through an approval-gated tracker action."
    ));
    prompt
}

/// The repository and number of a pull request item (`owner/repo#123`).
fn subject(item: &ItemRecord) -> (&str, i64) {
    let (repository, number) = item
        .identifier
        .rsplit_once('#')
        .unwrap_or((&item.identifier, ""));
    (repository, number.parse().unwrap_or_default())
}

fn actor(lease: &Lease) -> Actor {
    Actor::Worker(lease.owner.clone())
}
