//! The import of one tracker item: its version recorded once under its key, and what
//! follows from its state: a task started (within the workflow's concurrency limits and
//! blocker rule), the run of an earlier version cancelled, or a failed run retried. An item
//! with a workspace is carried on from `workspace_preparing` or `ready` to its started run
//! ([`advance`]), its directory made by [`workspace`].

use std::time::Duration;

use chrono::Utc;

use crate::artifacts::content::ContentStore;
use crate::db::StoreError;
use crate::domain::{Actor, Invalid, Role, Scope};
use crate::events::Subject;
use crate::external;
use crate::external::github::head_sha;
use crate::external::tracker::{Candidate, Poller};
use crate::external::workflow::{ExternalError, Issue, Workflow, WorkflowError, tracker};
use crate::external::workspace;
use crate::external::{FailedClaim, ItemChange, ItemRecord, NewItem, SourceRecord};
use crate::runs;
use crate::runs::{Admission, Admitted, Origin};
use crate::tasks::Hooks;
use crate::tasks::{NewTask, TaskDraft};
use crate::{artifacts, tasks};
use keel_api_types::ItemState;

/// The code of an item whose event the workflow's `events` leave out.
pub(crate) const NOT_LISTENED: &str = "event_not_listened";
/// The code of an item a `Todo` blocker holds back.
const BLOCKED: &str = "blocked_by_open_issues";
/// The evidence a started run carries: the normalized item and the prompt rendered from it;
/// the most any evidence artifact holds.
const ITEM_ARTIFACT: &str = "external_work_item.json";
const PROMPT_ARTIFACT: &str = "prompt.md";
const MAX_EVIDENCE_BYTES: i64 = 1024 * 1024;

pub(crate) use keel_api_types::Imported;

/// Imports one candidate: the item, and for a new item in an active state the task the
/// workflow's `task` section makes of it, with the rendered prompt, started through the
/// normal admission path (approval gates included), with the item and the prompt as
/// evidence artifacts of its run. With `workspace.root`, the item's workspace is prepared
/// first (see [`workspace`]).
pub(crate) async fn import(
    poller: &Poller,
    scope: &Scope,
    source: &SourceRecord,
    workflow: &Workflow,
    candidate: &Candidate,
    actor: &Actor,
) -> Result<Imported, ExternalError> {
    let mut imported = record(poller, scope, source, workflow, candidate, actor).await?;
    if imported.item.state == ItemState::WorkspacePreparing {
        let item = &imported.item;
        imported.item = advance(poller, scope, workflow, item, actor).await?;
        // A known version left mid-preparation (a process stopped) that starts now.
        imported.duplicate &= imported.item.state != ItemState::Claimed;
    }
    Ok(imported)
}

/// Carries an item on from `workspace_preparing` (its workspace prepared) or `ready` to
/// its started run; returns it as it ends (still `workspace_preparing` when another
/// process is preparing it).
pub async fn advance(
    poller: &Poller,
    scope: &Scope,
    workflow: &Workflow,
    item: &ItemRecord,
    actor: &Actor,
) -> Result<ItemRecord, StoreError> {
    let mut item = item.clone();
    if item.state == ItemState::WorkspacePreparing {
        item = workspace::prepare(poller, scope, &item).await?;
    }
    if item.state != ItemState::Ready {
        return Ok(item);
    }
    let mut tx = poller.pool.begin().await?;
    external::lock_subject(&mut tx, scope, &item.source_id, &item.identifier).await?;
    let current = crate::external::item_workspaces::get(&mut tx, scope, &item.id).await?;
    let claimed = external::claimed_version(&mut tx, scope, &item.source_id, &item.identifier)
        .await?
        .is_some();
    // A newer version (or another process) takes it on from here.
    if current.state != ItemState::Ready
        || claimed
        || !crate::external::item_workspaces::is_newest(&mut tx, scope, &current).await?
    {
        return Ok(current);
    }
    let Ok(issue) = serde_json::from_value::<Issue>(current.issue.clone()) else {
        return Ok(current);
    };
    let started = start(&mut tx, poller, scope, workflow, &current, &issue, actor).await?;
    tx.commit().await?;
    Ok(started)
}

/// Carries on the items a pass (or a process that stopped) left `workspace_preparing` or
/// `ready`; returns how many started.
pub(crate) async fn advance_unstarted(
    poller: &Poller,
    scope: &Scope,
    source: &SourceRecord,
    workflow: &Workflow,
    actor: &Actor,
) -> Result<u64, StoreError> {
    let mut conn = poller.pool.acquire().await?;
    let unstarted = crate::external::item_workspaces::unstarted(
        &mut conn,
        scope,
        &source.id,
        workspace::PER_PASS,
    )
    .await?;
    drop(conn);
    let mut started = 0;
    for item in unstarted {
        let item = advance(poller, scope, workflow, &item, actor).await?;
        started += u64::from(item.state == ItemState::Claimed);
    }
    Ok(started)
}

/// Records one candidate and acts on it in one transaction. The subject's lock makes two
/// importers of versions of one item give it one task between them.
async fn record(
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
        let mut item = external::item_by_key(&mut tx, scope, &candidate.idempotency_key).await?;
        // The same version, but its blockers may have finished since.
        let held =
            item.last_error_code.as_deref() == Some(BLOCKED) && item.state == ItemState::Discovered;
        let mut started = false;
        if held
            && external::claimed_version(&mut tx, scope, &source.id, &issue.identifier)
                .await?
                .is_none()
        {
            item = external::refresh_issue(&mut tx, scope, &item.id, &issue_json).await?;
            item = start(&mut tx, poller, scope, workflow, &item, issue, actor).await?;
            tx.commit().await.map_err(StoreError::from)?;
            started = item.state == ItemState::Claimed;
        }
        return Ok(Imported {
            item,
            duplicate: !started,
            cancelled_run_id: None,
        });
    };
    let claimed = external::claimed_version(&mut tx, scope, &source.id, &issue.identifier).await?;
    let item = if tracker.is_terminal(&issue.state) {
        let change = ItemChange {
            state: "terminal",
            ..ItemChange::default()
        };
        external::update_item(&mut tx, scope, &item.id, &change).await?
    } else if tracker.wants(issue) && claimed.is_none() {
        let previous =
            external::previous_key(&mut tx, scope, &source.id, &issue.identifier, &item.id).await?;
        let event = event_of(
            candidate.kind,
            previous.as_deref(),
            &candidate.idempotency_key,
        );
        if tracker.listens_to(&event) {
            start(&mut tx, poller, scope, workflow, &item, issue, actor).await?
        } else {
            let why = format!("{event} is not among the workflow's tracker.events");
            let change = ItemChange {
                state: "discovered",
                error: Some((NOT_LISTENED, &why)),
                ..ItemChange::default()
            };
            external::update_item(&mut tx, scope, &item.id, &change).await?
        }
    } else {
        // Not to be worked on, or an earlier version of it already has its task.
        item
    };
    let cancelled_run_id = match claimed {
        Some(claimed) if !tracker.wants(issue) => {
            let why = if !tracker.is_active(&issue.state) {
                format!("left the active states (now {})", issue.state)
            } else if !issue.assigned_to_worker {
                "is no longer assigned as tracker.assignee asks".to_string()
            } else {
                "no longer carries every required label".to_string()
            };
            stop_claimed_run(&mut tx, scope, &claimed, &why).await?
        }
        _ => None,
    };
    tx.commit().await.map_err(StoreError::from)?;
    Ok(Imported {
        item,
        duplicate: false,
        cancelled_run_id,
    })
}

/// What a version of an item of `kind` is, as seed 000's `events` name it: the first
/// version of its subject `<subject>.opened`, a pull request's version with a new head SHA
/// `pull_request.synchronize`, any other `<subject>.edited`. Derived from the versions
/// Keel has, so a poll and a webhook's import of one change name it alike.
fn event_of(kind: &str, previous_key: Option<&str>, key: &str) -> String {
    let subject = match kind {
        "github_pull_request" => "pull_request",
        _ => "issue",
    };
    let change = match previous_key {
        None => "opened",
        Some(previous) if subject == "pull_request" && head_sha(previous) != head_sha(key) => {
            "synchronize"
        }
        Some(_) => "edited",
    };
    format!("{subject}.{change}")
}

/// Reconciliation: an item no longer to be worked on (it left the active states, or lost
/// a required label: `why`) has its run cancelled (a finished run stays as it is).
/// Returns the run's id when it was still active.
pub(crate) async fn stop_claimed_run(
    conn: &mut sqlx::PgConnection,
    scope: &Scope,
    claimed: &ItemRecord,
    why: &str,
) -> Result<Option<String>, StoreError> {
    let (Some(task_id), Some(run_id)) = (&claimed.task_id, &claimed.run_id) else {
        return Ok(None);
    };
    let reason = format!("the tracker item {} {why}", claimed.identifier);
    let before = runs::get(conn, scope, task_id, run_id).await?;
    if before.status().is_terminal() {
        return Ok(None);
    }
    runs::cancel_because(conn, scope, task_id, run_id, &Actor::System, &reason).await?;
    Ok(Some(run_id.clone()))
}

/// Renders the prompt, creates the task and admits its first run, when the workflow's
/// concurrency limits leave a slot; an item the workflow cannot make a task of is left
/// `blocked` with the reason, one without a slot `discovered` with `no_free_slot`. With
/// `workspace.root`, an item that is not `ready` is only marked `workspace_preparing`: its
/// workspace is prepared outside the transaction (see [`workspace`]), then this starts it.
/// The run is requested by the source's registrant; `actor` is who admits it.
pub(crate) async fn start(
    conn: &mut sqlx::PgConnection,
    poller: &Poller,
    scope: &Scope,
    workflow: &Workflow,
    item: &ItemRecord,
    issue: &Issue,
    actor: &Actor,
) -> Result<ItemRecord, StoreError> {
    if let Some(open) = open_blockers(workflow, issue) {
        let change = ItemChange {
            state: "discovered",
            error: Some((BLOCKED, &open)),
            ..ItemChange::default()
        };
        return external::update_item(conn, scope, &item.id, &change).await;
    }
    if let Some(full) = no_free_slot(conn, scope, workflow, item).await? {
        let change = ItemChange {
            state: "discovered",
            error: Some(("no_free_slot", &full)),
            ..ItemChange::default()
        };
        return external::update_item(conn, scope, &item.id, &change).await;
    }
    if let Some(root) = &workflow.config.workspace_root
        && item.state != ItemState::Ready
    {
        return workspace::claim(conn, poller, scope, root, item).await;
    }
    let directory = item.workspace_path.as_deref();
    let writer = external::registrant_role(conn, scope, &item.source_id).await?;
    let task = match new_task(poller, workflow, issue, directory, writer) {
        Ok(task) => task,
        Err((code, message)) => return workspace::blocked(conn, scope, item, code, &message).await,
    };
    // The one refusal a stored task meets: its `in_place` directory nests with another's.
    let record = match tasks::insert(conn, scope, &task, actor).await {
        Ok(record) => record,
        Err(StoreError::Unprocessable { message, .. }) => {
            return workspace::blocked(conn, scope, item, workspace::REFUSED, &message).await;
        }
        Err(error) => return Err(error),
    };
    let mut admission = Admission::new(Origin::Start);
    admission.reason = Some(format!("external work item {}", issue.identifier));
    admission.requester = external::registrant(conn, scope, &item.source_id).await?;
    let run = match runs::admit(conn, scope, &record.id, admission, &poller.rules, actor).await? {
        Admitted::New(run) | Admitted::Replayed(run) => run,
    };
    let prompt = task.prompt.as_deref().unwrap_or_default();
    let run_subject = Subject::Run {
        task_id: &record.id,
        run_id: &run.id,
    };
    write_evidence(conn, poller, scope, run_subject, item, prompt).await?;
    let change = ItemChange {
        state: "claimed",
        prompt: task.prompt.as_deref(),
        task_id: Some(&record.id),
        run_id: Some(&run.id),
        error: None,
    };
    external::update_item(conn, scope, &item.id, &change).await
}

/// The evidence a started run carries: the normalized item and the prompt rendered from it.
pub(crate) async fn write_evidence(
    conn: &mut sqlx::PgConnection,
    poller: &Poller,
    scope: &Scope,
    run: Subject<'_>,
    item: &ItemRecord,
    prompt: &str,
) -> Result<(), StoreError> {
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
        let written = Evidence {
            name,
            content_type,
            bytes,
        };
        evidence_artifact(conn, &poller.content, scope, run, written).await?;
    }
    Ok(())
}

/// One `metadata` artifact of external work's evidence (an import's item and prompt, an
/// action's calls and answers, a triage record's check), written whole.
pub(crate) struct Evidence<'a> {
    pub(crate) name: &'a str,
    pub(crate) content_type: &'a str,
    pub(crate) bytes: &'a [u8],
}

/// Writes `evidence` as an artifact of `run`, bounded; returns the artifact's id.
pub(crate) async fn evidence_artifact(
    conn: &mut sqlx::PgConnection,
    content: &ContentStore,
    scope: &Scope,
    run: Subject<'_>,
    evidence: Evidence<'_>,
) -> Result<String, StoreError> {
    let Evidence {
        name,
        content_type,
        bytes,
    } = evidence;
    let artifact = artifacts::open(conn, scope, run, name, "metadata", content_type).await?;
    content
        .append(conn, scope, &artifact.id, bytes, MAX_EVIDENCE_BYTES)
        .await?;
    artifacts::close(conn, scope, &artifact.id).await?;
    Ok(artifact.id)
}

/// How long a failed item waits before retry number `attempt` (1-based): Symphony's
/// `min(10 s × 2^(attempt − 1), agent.max_retry_backoff_ms)`.
pub(crate) fn retry_delay(attempt: u32, max_backoff_ms: u64) -> Duration {
    let exponent = attempt.saturating_sub(1).min(20);
    Duration::from_millis((10_000u64 << exponent).min(max_backoff_ms))
}

/// Retries a claimed item's failed run once its backoff has passed, if its newest version
/// is still active and a slot is free: the prompt rendered again with `attempt`, a retry
/// run of its task. Before then the item waits as `retry_wait`. Returns whether it started.
pub(crate) async fn retry(
    conn: &mut sqlx::PgConnection,
    poller: &Poller,
    scope: &Scope,
    workflow: &Workflow,
    failed: &FailedClaim,
    actor: &Actor,
) -> Result<bool, StoreError> {
    let item = &failed.item;
    let (Some(task_id), Some(run_id)) = (&item.task_id, &item.run_id) else {
        return Ok(false);
    };
    let attempt = u32::try_from(failed.run_count).unwrap_or(u32::MAX);
    let due =
        failed.run_finished_at + retry_delay(attempt, workflow.config.agent.max_retry_backoff_ms);
    let waiting = ItemChange {
        state: "retry_wait",
        prompt: item.prompt.as_deref(),
        task_id: Some(task_id),
        run_id: Some(run_id),
        error: Some((
            "run_failed",
            failed.run_error.as_deref().unwrap_or("the run failed"),
        )),
    };
    if Utc::now() < due || no_free_slot(conn, scope, workflow, item).await?.is_some() {
        if item.state != ItemState::RetryWait {
            external::update_item(conn, scope, &item.id, &waiting).await?;
        }
        return Ok(false);
    }
    let issue: Issue = serde_json::from_value(item.issue.clone())
        .map_err(|e| StoreError::Conflict(format!("item {} cannot be read: {e}", item.id)))?;
    let prompt = match workflow.render(&issue, Some(attempt)) {
        Ok(prompt) => prompt,
        Err(error) => {
            let blocked = ItemChange {
                state: "blocked",
                error: Some((error.code().as_str(), &error.to_string())),
                ..waiting
            };
            external::update_item(conn, scope, &item.id, &blocked).await?;
            return Ok(false);
        }
    };
    tasks::set_prompt(conn, scope, task_id, &prompt).await?;
    let mut admission = Admission::new(Origin::Retry(run_id.clone()));
    admission.reason = Some(format!("retry {attempt} of {}", item.identifier));
    admission.requester = external::registrant(conn, scope, &item.source_id).await?;
    let run = match runs::admit(conn, scope, task_id, admission, &poller.rules, actor).await? {
        Admitted::New(run) | Admitted::Replayed(run) => run,
    };
    let run_subject = Subject::Run {
        task_id,
        run_id: &run.id,
    };
    write_evidence(conn, poller, scope, run_subject, item, &prompt).await?;
    let claimed = ItemChange {
        state: "claimed",
        prompt: Some(&prompt),
        task_id: Some(task_id),
        run_id: Some(&run.id),
        error: None,
    };
    external::update_item(conn, scope, &item.id, &claimed).await?;
    Ok(true)
}

/// Why a `Todo` item may not start yet (Symphony's blocker rule): a blocker that is not in
/// a terminal state, or whose state is unknown.
pub(crate) fn open_blockers(workflow: &Workflow, issue: &Issue) -> Option<String> {
    let tracker = workflow.config.tracker.as_ref()?;
    if issue.state.trim().to_lowercase() != "todo" {
        return None;
    }
    let open: Vec<&str> = issue
        .blocked_by
        .iter()
        .filter(|b| b.state.as_deref().is_none_or(|s| !tracker.is_terminal(s)))
        .map(|b| {
            b.identifier
                .as_deref()
                .or(b.id.as_deref())
                .unwrap_or("an issue")
        })
        .collect();
    (!open.is_empty()).then(|| format!("blocked by {} (not finished)", open.join(", ")))
}

/// Why the item may not start now: `agent.max_concurrent_agents` (or the limit for its
/// state) items of the source already have an active run.
pub(crate) async fn no_free_slot(
    conn: &mut sqlx::PgConnection,
    scope: &Scope,
    workflow: &Workflow,
    item: &ItemRecord,
) -> Result<Option<String>, StoreError> {
    external::lock_slots(conn, scope, &item.source_id).await?;
    let state = item.tracker_state.trim().to_lowercase();
    let (all, in_state) = external::active_runs(conn, scope, &item.source_id, &state).await?;
    let agent = &workflow.config.agent;
    if all as u64 >= agent.max_concurrent_agents {
        let max = agent.max_concurrent_agents;
        return Ok(Some(format!(
            "agent.max_concurrent_agents ({max}) items of this source have active runs"
        )));
    }
    Ok(agent
        .max_concurrent_agents_by_state
        .get(&state)
        .filter(|max| in_state as u64 >= **max)
        .map(|max| {
            format!(
                "{max} items in state {state} have active runs (max_concurrent_agents_by_state)"
            )
        }))
}

/// The task an item becomes; in `directory` (its workspace) when the workflow has a
/// `workspace.root`, carrying the workflow's hooks (all of them: its workers run them, and
/// its approval shows them).
pub(crate) fn new_task(
    poller: &Poller,
    workflow: &Workflow,
    issue: &Issue,
    directory: Option<&str>,
    writer: Role,
) -> Result<NewTask, (&'static str, String)> {
    let workflow_error = |e: WorkflowError| (e.code().as_str(), e.to_string());
    let prompt = workflow.render(issue, None).map_err(workflow_error)?;
    let draft = workflow.task_draft(prompt, issue).map_err(workflow_error)?;
    task_in(poller, workflow, draft, directory, writer)
}

/// The task `draft` (of `workflow`) is: in `directory` when given, with the workflow's
/// hooks, checked as `POST /v1/tasks` checks one, written as `writer` (the source's
/// registrant's role: the secrets it names are held to that role at each use).
pub(crate) fn task_in(
    poller: &Poller,
    workflow: &Workflow,
    draft: TaskDraft,
    directory: Option<&str>,
    writer: Role,
) -> Result<NewTask, (&'static str, String)> {
    let invalid_task = |e: Invalid| ("invalid_task", e.to_string());
    let mut task = NewTask::parse(draft, &poller.rules.timeouts).map_err(invalid_task)?;
    task.written_by = writer;
    let hooks = workflow.config.hooks.clone();
    match directory {
        Some(directory) => task.in_item_directory(directory, hooks),
        None => task.hooks = Some(hooks).filter(Hooks::any),
    }
    task.check_workspace(&poller.rules.workspace_roots)
        .map_err(invalid_task)?;
    Ok(task)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_version_is_named_as_seed_000s_events_name_it() {
        let pull = |sha: &str| format!("github:pull_request:a/b:8:{sha}:2026-01-01T00:00:00Z");
        let kind = "github_pull_request";
        assert_eq!(event_of(kind, None, &pull("a")), "pull_request.opened");
        assert_eq!(
            event_of(kind, Some(&pull("a")), &pull("b")),
            "pull_request.synchronize"
        );
        let edited = pull("a").replace("01T", "02T");
        assert_eq!(
            event_of(kind, Some(&pull("a")), &edited),
            "pull_request.edited"
        );
        assert_eq!(event_of("linear_issue", None, "linear:x"), "issue.opened");
        assert_eq!(event_of("github_issue", Some("k1"), "k2"), "issue.edited");
    }

    #[test]
    fn retries_back_off_exponentially_up_to_the_workflows_cap() {
        assert_eq!(retry_delay(1, 300_000), Duration::from_secs(10));
        assert_eq!(retry_delay(3, 300_000), Duration::from_secs(40));
        assert_eq!(retry_delay(10, 300_000), Duration::from_secs(300));
        assert_eq!(retry_delay(u32::MAX, 300_000), Duration::from_secs(300));
        assert_eq!(retry_delay(1, 1), Duration::from_millis(1));
    }
}
