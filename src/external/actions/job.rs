//! Approval-gated tracker actions, the only writes Keel makes on a tracker. A proposal on
//! an item ([`propose`]) records exactly what will be sent, with the target as it stood,
//! and an `external_action` approval that says so. Approving it queues an
//! `external_action` job ([`ActionJobs`]) that asks the tracker for the target again,
//! refuses with `stale_target` when it changed, and otherwise makes exactly the stored
//! calls ([`send`]), recording the answer as an artifact of the action's run.
//!
//! At most once: the action is marked `sending` in its own transaction before the call. A
//! later attempt that finds it `sending` (its worker died, or the call's outcome was not
//! known) looks for the hidden marker `<!-- keel-action:ID -->` every comment and review
//! ends with, and sends only when the tracker has none; a label change is idempotent and
//! is sent again.

use keel_api_types::ErrorCode;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use serde_json::{Value, json};
use sqlx::PgConnection;

use crate::approvals;
use crate::approvals::ActionSummary;
use crate::artifacts::content::ContentStore;
use crate::attempt::JobKind;
use crate::attempt::fence::DomainRow;
use crate::attempt::{self, Attempted, Failure, Verdict};
use crate::db::StoreError;
use crate::domain::{Actor, Scope, new_id};
use crate::events;
use crate::events::NewEvent;
use crate::events::Subject;
use crate::external;
use crate::external::ItemRecord;
use crate::external::actions::send;
use crate::external::actions::{ActionRecord, NewAction, Outcome};
use crate::external::actions::{ProposedAction, Unbranched, marker};
use crate::external::github::head_sha;
use crate::external::import::{Evidence, evidence_artifact};
use crate::external::tracker::{self, Call, Pause, Poller, Target, Tracker};
use crate::external::workflow::{ExternalError, load_workflow, target_of, tracker};
use crate::queue::worker::{Job, JobHandler, LeaseDeadline};
use crate::queue::{self, Disposition, Lease};
use crate::runs;
use keel_api_types::ActionStatus;
use keel_workers::media::Secret;
use std::time::Duration;

pub(crate) use keel_api_types::Proposed;

/// Records a proposal on an item: the calls it makes, the target as stored now, and its
/// approval, attached to the item's task and to `run_id` (a run of that task proposing
/// it) or the task's current run. The caller commits.
pub(crate) async fn propose(
    conn: &mut PgConnection,
    scope: &Scope,
    item_id: &str,
    action: &ProposedAction,
    run_id: Option<&str>,
    actor: &Actor,
) -> Result<Proposed, ExternalError> {
    let item = crate::external::get_item(conn, scope, item_id).await?;
    let source = external::get_source(conn, scope, &item.source_id).await?;
    let workflow = load_workflow(&source)?;
    let tracker = tracker(&workflow)?;
    let claimed = external::claimed_version(conn, scope, &item.source_id, &item.identifier)
        .await?
        .and_then(|claimed| claimed.task_id.zip(claimed.run_id))
        .ok_or_else(|| StoreError::Refused {
            code: ErrorCode::ItemNotClaimed,
            message: format!(
                "{} has no task yet: an action is attached to the task working on it",
                item.identifier
            ),
        })?;
    let (task_id, current_run) = claimed;
    let run = match runs::get(conn, scope, &task_id, run_id.unwrap_or(&current_run)).await {
        Err(StoreError::NotFound(_)) => {
            return Err(StoreError::Unprocessable {
                code: ErrorCode::InvalidRequest,
                message: format!("run_id: not a run of {}'s task {task_id}", item.identifier),
            }
            .into());
        }
        found => found?,
    };
    let action = &branches(conn, scope, &task_id, action.clone()).await?;
    let id = new_id("xact");
    let calls = tracker.api().calls(tracker, &item, action, &id)?;
    let calls_json = serde_json::to_value(&calls).expect("calls serialize");
    let proposal = action.to_json();
    let target = snapshot(&item);
    let proposed_by = actor.to_string();
    let new = NewAction {
        id: &id,
        item_id: &item.id,
        task_id: &task_id,
        run_id: &run.id,
        kind: action.kind(),
        proposal: &proposal,
        calls: &calls_json,
        target: &target,
        proposed_by: &proposed_by,
        proposed_by_run_id: run_id,
    };
    let mut recorded = crate::external::actions::insert(conn, scope, &new).await?;
    let summary = summary(tracker, &item, action, &calls, &id);
    let approval = approvals::create_for_action(conn, scope, &run, &id, &summary, actor).await?;
    events::append(conn, scope, &[approvals::requested_event(&approval)]).await?;
    recorded.approval_id = Some(approval.id.clone());
    Ok(Proposed {
        action: recorded,
        approval,
    })
}

/// A pull request from the branch the task's runs push to (`push_branch`) into its
/// `base_branch`, unless the proposal names them.
async fn branches(
    conn: &mut PgConnection,
    scope: &Scope,
    task_id: &str,
    action: ProposedAction,
) -> Result<ProposedAction, ExternalError> {
    if !matches!(action, ProposedAction::PullRequest { .. }) {
        return Ok(action);
    }
    let task = crate::tasks::get(conn, scope, task_id).await?;
    let invalid = |message| StoreError::Unprocessable {
        code: ErrorCode::InvalidRequest,
        message,
    };
    let refusal = match action.with_branches(task.push_branch, task.base_branch) {
        Ok(action) => return Ok(action),
        Err(Unbranched::NothingPushed) => StoreError::Refused {
            code: ErrorCode::NothingPushed,
            message: format!("task {task_id} pushes no branch (push_branch) and head names none"),
        },
        Err(Unbranched::NoBase) => invalid(format!(
            "base: is required: task {task_id} names no base_branch"
        )),
        Err(Unbranched::SameBranch(branch)) => invalid(format!(
            "head and base are both {branch}: a pull request needs two branches"
        )),
    };
    Err(refusal.into())
}

/// The target as the proposer saw it: the item's version.
fn snapshot(item: &ItemRecord) -> Value {
    json!({
        "identifier": item.identifier,
        "state": item.tracker_state,
        "updated_at": item.issue["updated_at"],
        "head_sha": head_sha(&item.idempotency_key),
        "idempotency_key": item.idempotency_key,
    })
}

/// What the approver sees: each call, the target's version, then what is written.
fn summary(
    tracker: &Tracker,
    item: &ItemRecord,
    action: &ProposedAction,
    calls: &[Call],
    id: &str,
) -> ActionSummary {
    let endpoint = tracker.endpoint.trim_end_matches('/');
    let mut lines: Vec<String> = calls
        .iter()
        .map(|call| format!("{} {endpoint}{}", call.method, call.path))
        .collect();
    let head = head_sha(&item.idempotency_key)
        .map(|sha| format!(", head {sha}"))
        .unwrap_or_default();
    let updated = item.issue["updated_at"].as_str().unwrap_or("unknown");
    lines.push(format!(
        "on {} ({}), state {}, updated_at {updated}{head}",
        item.identifier, item.kind, item.tracker_state
    ));
    let body = match action {
        ProposedAction::Comment { body } => Some(body.as_str()),
        ProposedAction::Labels { add, remove } => {
            let changes = [("add", add), ("remove", remove)];
            for (verb, names) in changes.iter().filter(|(_, names)| !names.is_empty()) {
                lines.push(format!("{verb} labels: {}", names.join(", ")));
            }
            None
        }
        ProposedAction::Review { event, body } => {
            lines.push(format!("review: {}", event.as_str()));
            body.as_deref()
        }
        ProposedAction::PullRequest { body, .. } => {
            let call = calls.first().map(|c| &c.body);
            let field = |name: &str| call.and_then(|b| b[name].as_str()).unwrap_or("none");
            lines.push(format!(
                "pull request {} -> {}: {}",
                field("head"),
                field("base"),
                field("title")
            ));
            body.as_deref()
        }
    };
    if let Some(body) = body {
        lines.push(format!(
            "body ({} bytes, then the marker {}):",
            body.len(),
            marker(id)
        ));
        lines.extend(body.lines().map(|line| format!("  {line}")));
    }
    ActionSummary::of_lines(&lines, false)
}

/// The handler of `external_action` jobs: sends one approved action.
pub(crate) struct ActionJobs {
    pub(crate) poller: Poller,
}

impl JobHandler for ActionJobs {
    fn kind(&self) -> &'static str {
        JobKind::ExternalAction.as_str()
    }

    fn run(self: Arc<Self>, job: Job) -> BoxFuture<'static, ()> {
        crate::attempt::observed!(
            JobKind::ExternalAction,
            "external_action",
            action_id,
            job,
            async move {
                tokio::select! {
                    done = self.execute(&job) => done,
                    // Past its local deadline (or lease lost, or shut down) the attempt stops
                    // where it is: a POST in flight is abandoned, its answer unawaited. The
                    // action stays `sending`, and its next owner looks for its marker first.
                    () = job.interrupt.cancelled() => Err(StoreError::LeaseLost),
                }
            }
        )
    }
}

/// How an attempt ends the action.
pub(crate) enum Ending {
    Sent(Vec<tracker::Answer>),
    Stale {
        reason: String,
        now: Value,
    },
    Failed {
        code: &'static str,
        message: String,
        answers: Vec<tracker::Answer>,
    },
    /// The job used up its attempts without reaching the tracker.
    GaveUp {
        code: &'static str,
        message: String,
    },
}

/// An attempt's ending with what writing it needs: where its evidence goes, and the token
/// the evidence must not hold.
pub(crate) struct ActionEnding {
    ending: Ending,
    content: ContentStore,
    token: Option<Secret>,
}

/// An attempt's end as the skeleton takes it: an ending, or a pause for a retry.
fn verdict(
    next: Result<Ending, Pause>,
    target: Option<&Target<'_>>,
    content: &ContentStore,
) -> Verdict<ActionEnding> {
    match next {
        Ok(ending) => Verdict::Ended(ActionEnding {
            ending,
            content: content.clone(),
            token: target.and_then(|t| t.token.clone()),
        }),
        Err(pause) => Verdict::Retry(Failure {
            code: pause.code,
            after: pause
                .until
                .and_then(|until| (until - chrono::Utc::now()).to_std().ok()),
            message: pause.message,
        }),
    }
}

impl DomainRow for ActionRecord {
    async fn lock(conn: &mut PgConnection, lease: &Lease) -> Result<Option<Self>, StoreError> {
        queue::fence(conn, lease).await?;
        let scope = lease.scope();
        crate::external::actions::lock(conn, &scope, &lease.ref_id).await
    }

    /// Only an approved action is sent, or one being sent looked for; any other (or one
    /// gone with its item, its source deleted) leaves nothing to do.
    fn has_ended(&self) -> bool {
        !matches!(self.status, ActionStatus::Approved | ActionStatus::Sending)
    }
}

impl Attempted for ActionRecord {
    type Ending = ActionEnding;
    /// Where the evidence goes.
    type Context = ContentStore;

    fn is_running(&self) -> bool {
        false
    }

    fn gave_up(
        &self,
        content: &ContentStore,
        error: String,
        failure: Option<&Failure>,
    ) -> Option<ActionEnding> {
        let (code, message) = match failure {
            Some(failure) => (failure.code, failure.message.clone()),
            None => ("gave_up", error),
        };
        Some(ActionEnding {
            ending: Ending::GaveUp { code, message },
            content: content.clone(),
            token: None,
        })
    }

    fn label(ending: &ActionEnding) -> &'static str {
        match ending.ending {
            Ending::Sent(_) => ActionStatus::Sent.as_str(),
            Ending::Stale { .. } => ActionStatus::StaleTarget.as_str(),
            Ending::Failed { .. } | Ending::GaveUp { .. } => ActionStatus::Failed.as_str(),
        }
    }

    fn disposition(_: &ActionEnding) -> Disposition {
        Disposition::Complete
    }

    /// The action's evidence artifact and its final status.
    async fn end<'r>(
        &'r self,
        conn: &mut PgConnection,
        lease: &Lease,
        ending: &'r mut ActionEnding,
    ) -> Result<Vec<NewEvent<'r>>, StoreError> {
        let scope = lease.scope();
        let current = current_status(conn, &scope, &self.id).await?;
        let (status, evidence, response, error) = evidence(self, &ending.ending, current);
        let text =
            serde_json::to_string_pretty(&json!({ "action_id": self.id, "evidence": evidence }))
                .expect("JSON serializes");
        // The tracker may echo what it was sent; the token never goes into a row.
        let text = match &ending.token {
            Some(token) if !token.expose().is_empty() => text.replace(token.expose(), "[redacted]"),
            _ => text,
        };
        let run = Subject::Run {
            task_id: &self.task_id,
            run_id: &self.run_id,
        };
        let name = format!("external_action_{}.json", self.id);
        let written = Evidence {
            name: &name,
            content_type: "application/json",
            bytes: text.as_bytes(),
        };
        let artifact_id = evidence_artifact(conn, &ending.content, &scope, run, written).await?;
        let error = error
            .as_ref()
            .map(|(code, message)| (*code, message.as_str()));
        let outcome = Outcome {
            response: response.as_ref(),
            artifact_id: Some(&artifact_id),
            error,
        };
        crate::external::actions::update(conn, &scope, &self.id, status, &outcome).await?;
        Ok(Vec::new())
    }

    /// The tracker could not be asked: the action keeps its status, with the error.
    async fn requeue<'r>(
        &'r self,
        conn: &mut PgConnection,
        lease: &Lease,
        failure: &'r Failure,
        _: Duration,
    ) -> Result<Vec<NewEvent<'r>>, StoreError> {
        let scope = lease.scope();
        let status = current_status(conn, &scope, &self.id).await?;
        let outcome = Outcome {
            error: Some((failure.code, &failure.message)),
            ..Outcome::default()
        };
        crate::external::actions::update(conn, &scope, &self.id, status, &outcome).await?;
        Ok(Vec::new())
    }
}

/// An ending's status, evidence, response and error; one that gave up after the action
/// was marked `sending` may have reached the tracker, and says so.
fn evidence(
    action: &ActionRecord,
    ending: &Ending,
    current: ActionStatus,
) -> (
    ActionStatus,
    Value,
    Option<Value>,
    Option<(&'static str, String)>,
) {
    match ending {
        Ending::Sent(answers) => {
            let evidence = json!({ "outcome": "sent", "answers": answers });
            let response = answers.last().map(tracker::Answer::short);
            (ActionStatus::Sent, evidence, response, None)
        }
        Ending::Stale { reason, now } => {
            let evidence = json!({ "outcome": "stale_target", "reason": reason,
                                   "target_then": action.target, "target_now": now });
            let error = Some(("stale_target", reason.clone()));
            (ActionStatus::StaleTarget, evidence, None, error)
        }
        Ending::Failed {
            code,
            message,
            answers,
        } => failed(code, message.clone(), answers),
        Ending::GaveUp { code, message } => {
            let unsure = if current == ActionStatus::Sending {
                "; it may have been sent: look for its marker on the tracker"
            } else {
                ""
            };
            failed(code, format!("{message}{unsure}"), &[])
        }
    }
}

fn failed(
    code: &'static str,
    message: String,
    answers: &[tracker::Answer],
) -> (
    ActionStatus,
    Value,
    Option<Value>,
    Option<(&'static str, String)>,
) {
    let evidence = json!({ "outcome": "failed", "code": code, "message": message,
                           "answers": answers });
    (ActionStatus::Failed, evidence, None, Some((code, message)))
}

impl ActionJobs {
    async fn execute(&self, job: &Job) -> Result<&'static str, StoreError> {
        let (pool, lease) = (&self.poller.pool, &job.lease);
        let content = &self.poller.content;
        let Some(action) = attempt::begin::<ActionRecord>(pool, lease, content).await? else {
            return Ok("ended");
        };
        let target = match self.target(&lease.scope(), &action).await? {
            Ok(target) => target,
            Err(ending) => {
                let verdict = verdict(Ok(ending), None, content);
                return attempt::conclude(pool, job, &action, content, verdict).await;
            }
        };
        let Some(next) = self.attempt(lease, &job.deadline, &action, &target).await? else {
            // Cancelled while its target was asked for: the job ends with the action.
            attempt::fence::lock_unless_ended::<ActionRecord>(pool, lease).await?;
            return Ok("ended");
        };
        let verdict = verdict(next, Some(&target), content);
        attempt::conclude(pool, job, &action, content, verdict).await
    }

    /// An approved action is checked against its target, marked `sending` and sent; one
    /// already `sending` is looked for by its marker first, and sent only when not found.
    /// None: it was cancelled before it could be marked.
    async fn attempt(
        &self,
        lease: &Lease,
        deadline: &LeaseDeadline,
        action: &ActionRecord,
        target: &Target<'_>,
    ) -> Result<Option<Result<Ending, Pause>>, StoreError> {
        let calls: Vec<Call> = serde_json::from_value(action.calls.clone()).map_err(|e| {
            StoreError::Conflict(format!("action {} is unreadable: {e}", action.id))
        })?;
        if action.status == ActionStatus::Approved {
            match send::changed(target, action).await {
                Err(pause) => return Ok(Some(Err(pause))),
                Ok(Some((reason, now))) => return Ok(Some(Ok(Ending::Stale { reason, now }))),
                Ok(None) => {}
            }
            // Committed before the call: a later attempt then knows it may have gone out.
            let mut tx = queue::begin_fenced(&self.poller.pool, lease).await?;
            let scope = lease.scope();
            let locked = crate::external::actions::lock(&mut tx, &scope, &action.id).await?;
            if locked.is_none_or(|now| now.status != ActionStatus::Approved) {
                return Ok(None);
            }
            let sending = Outcome::default();
            crate::external::actions::update(
                &mut tx,
                &lease.scope(),
                &action.id,
                ActionStatus::Sending,
                &sending,
            )
            .await?;
            tx.commit().await?;
        } else {
            match send::find_marked(target, &calls, &marker(&action.id)).await {
                Err(pause) => return Ok(Some(Err(pause))),
                Ok(Some(found)) => return Ok(Some(Ok(Ending::Sent(vec![found])))),
                Ok(None) => {}
            }
        }
        // The POST cannot be taken back: it goes out only while the lease is safely ahead
        // of its local deadline. Past it, another worker may hold the action, finds it
        // `sending` and looks for its marker before sending anything.
        if let Err(near) = deadline.ensure_ahead().await {
            tracing::warn!(action_id = %action.id, "{near}; not sending");
            return Err(StoreError::LeaseLost);
        }
        Ok(Some(match send::perform(target, &calls).await {
            Ok(answers) => Ok(Ending::Sent(answers)),
            Err(tracker::Failure::Pause(pause)) => Err(pause),
            Err(tracker::Failure::Refused {
                code,
                message,
                answers,
            }) => Ok(Ending::Failed {
                code,
                message,
                answers,
            }),
        }))
    }

    /// The item, its tracker and the token, resolved now; an ending when the action can no
    /// longer be sent (its workflow broke, its token is not there).
    async fn target(
        &self,
        scope: &Scope,
        action: &ActionRecord,
    ) -> Result<Result<Target<'_>, Ending>, StoreError> {
        Ok(target_of(&self.poller, scope, &action.item_id)
            .await?
            .map(|(target, _)| target)
            .map_err(|(code, message)| Ending::Failed {
                code,
                message,
                answers: Vec::new(),
            }))
    }
}

async fn current_status(
    conn: &mut PgConnection,
    scope: &Scope,
    id: &str,
) -> Result<ActionStatus, StoreError> {
    Ok(crate::external::actions::get(conn, scope, id).await?.status)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn item(kind: &str, identifier: &str, key: &str) -> ItemRecord {
        ItemRecord {
            id: "extitem_1".into(),
            source_id: "extsrc_1".into(),
            idempotency_key: key.into(),
            kind: kind.into(),
            identifier: identifier.into(),
            tracker_state: "open".into(),
            state: keel_api_types::ItemState::Claimed,
            issue: json!({ "id": "uuid-1", "updated_at": "2026-01-02T00:00:00Z" }),
            prompt: None,
            task_id: Some("task_1".into()),
            run_id: Some("run_1".into()),
            last_error_code: None,
            last_error: None,
            workspace_path: None,
            hook_output: None,
            created_at: chrono::Utc::now(),
            updated_at: chrono::Utc::now(),
        }
    }

    #[test]
    fn each_action_is_its_trackers_exact_calls() {
        let github = crate::external::workflow::test_tracker("{kind: github, repository: a/b}");
        let pull = item(
            "github_pull_request",
            "a/b#8",
            "github:pull_request:a/b:8:abc:2026-01-02T00:00:00Z",
        );
        let approve = ProposedAction::Review {
            event: crate::external::actions::rules::ReviewEvent::Approve,
            body: None,
        };
        let calls = github
            .api()
            .calls(&github, &pull, &approve, "xact_1")
            .unwrap();
        assert_eq!(calls[0].path, "/repos/a/b/pulls/8/reviews");
        assert_eq!(
            calls[0].body,
            json!({ "event": "APPROVE", "body": "<!-- keel-action:xact_1 -->", "commit_id": "abc" })
        );
        let issue = item(
            "github_issue",
            "a/b#7",
            "github:issue:a/b:7:2026-01-02T00:00:00Z",
        );
        let refused = calls_error(&github, &issue, &approve);
        assert_eq!(refused, "unsupported_action");
        let labels = ProposedAction::Labels {
            add: vec![],
            remove: vec!["needs review".into(), "bug".into()],
        };
        let calls = github
            .api()
            .calls(&github, &issue, &labels, "xact_1")
            .unwrap();
        let paths: Vec<(&str, &str)> = calls
            .iter()
            .map(|c| (c.method.as_str(), c.path.as_str()))
            .collect();
        assert_eq!(
            paths,
            [
                ("DELETE", "/repos/a/b/issues/7/labels/needs%20review"),
                ("DELETE", "/repos/a/b/issues/7/labels/bug")
            ]
        );
        let settings =
            "{kind: linear, project_slug: eng, active_states: Todo, terminal_states: Done}";
        let linear = crate::external::workflow::test_tracker(settings);
        let comment = ProposedAction::Comment { body: "hi".into() };
        let calls = linear
            .api()
            .calls(&linear, &issue, &comment, "xact_1")
            .unwrap();
        assert_eq!(calls[0].path, "");
        assert_eq!(
            calls[0].body["variables"],
            json!({ "issueId": "uuid-1", "body": "hi\n\n<!-- keel-action:xact_1 -->" })
        );
        assert_eq!(calls_error(&linear, &issue, &labels), "unsupported_action");
    }

    fn calls_error(tracker: &Tracker, item: &ItemRecord, action: &ProposedAction) -> &'static str {
        match tracker.api().calls(tracker, item, action, "xact_1") {
            Err(StoreError::Unprocessable { code, .. }) => code.as_str(),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
}
