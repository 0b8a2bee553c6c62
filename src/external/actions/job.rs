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

use std::sync::Arc;

use futures_util::future::BoxFuture;
use serde_json::{Value, json};
use sqlx::PgConnection;

use crate::approvals;
use crate::approvals::ActionSummary;
use crate::db::StoreError;
use crate::domain::{Actor, Scope, new_id};
use crate::events;
use crate::events::Subject;
use crate::external;
use crate::external::ItemRecord;
use crate::external::actions::send;
use crate::external::actions::send::{Call, Pause, Target};
use crate::external::actions::{ACTION_KIND, ActionRecord, NewAction, Outcome};
use crate::external::actions::{ProposedAction, marked, marker};
use crate::external::github::head_sha;
use crate::external::tracker::{ExternalError, Poller, load_workflow, token, tracker};
use crate::external::workflow::{Tracker, TrackerKind};
use crate::queue::worker::{Job, JobHandler, LeaseDeadline};
use crate::queue::{self, Lease};
use crate::{artifacts, runs};
use keel_api_types::ActionStatus;

/// The evidence of one action's end: the tracker's answer, or the target that changed.
const MAX_EVIDENCE_BYTES: i64 = 1024 * 1024;

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
    let item = crate::external::actions::item(conn, scope, item_id).await?;
    let source = external::get_source(conn, scope, &item.source_id).await?;
    let workflow = load_workflow(&source)?;
    let tracker = tracker(&workflow)?;
    let claimed = external::claimed_version(conn, scope, &item.source_id, &item.identifier)
        .await?
        .and_then(|claimed| claimed.task_id.zip(claimed.run_id))
        .ok_or_else(|| StoreError::Refused {
            code: "item_not_claimed",
            message: format!(
                "{} has no task yet: an action is attached to the task working on it",
                item.identifier
            ),
        })?;
    let (task_id, current_run) = claimed;
    let run = match runs::get(conn, scope, &task_id, run_id.unwrap_or(&current_run)).await {
        Err(StoreError::NotFound(_)) => {
            return Err(StoreError::Unprocessable {
                code: "invalid_request",
                message: format!("run_id: not a run of {}'s task {task_id}", item.identifier),
            }
            .into());
        }
        found => found?,
    };
    let id = new_id("xact");
    let calls = calls(tracker, &item, action, &id)?;
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

/// The exact calls an action makes on the item's tracker.
fn calls(
    tracker: &Tracker,
    item: &ItemRecord,
    action: &ProposedAction,
    id: &str,
) -> Result<Vec<Call>, StoreError> {
    let unsupported = |what: &str| StoreError::Unprocessable {
        code: "unsupported_action",
        message: format!("{what} ({} is a {})", item.identifier, item.kind),
    };
    let call = |method: &str, path: String, body: Value| Call {
        method: method.into(),
        path,
        body,
    };
    if tracker.kind == TrackerKind::Linear {
        let ProposedAction::Comment { body } = action else {
            return Err(unsupported("Keel writes only comments on Linear issues"));
        };
        let variables = json!({ "issueId": item.issue["id"], "body": marked(body, id) });
        let body = json!({ "query": send::COMMENT_CREATE, "variables": variables });
        return Ok(vec![call("POST", String::new(), body)]);
    }
    let repository = tracker.repository.as_deref().unwrap_or_default();
    let number = item
        .identifier
        .rsplit_once('#')
        .map(|(_, n)| n)
        .unwrap_or_default();
    let issue = format!("/repos/{repository}/issues/{number}");
    Ok(match action {
        ProposedAction::Comment { body } => {
            let body = json!({ "body": marked(body, id) });
            vec![call("POST", format!("{issue}/comments"), body)]
        }
        ProposedAction::Labels { add, remove } => {
            let added = (!add.is_empty())
                .then(|| call("POST", format!("{issue}/labels"), json!({ "labels": add })));
            let removed = remove.iter().map(|name| {
                let path = format!("{issue}/labels/{}", path_segment(name));
                call("DELETE", path, Value::Null)
            });
            added.into_iter().chain(removed).collect()
        }
        ProposedAction::Review { event, body } => {
            if item.kind != "github_pull_request" {
                return Err(unsupported("a review is for pull requests only"));
            }
            let text = body
                .as_deref()
                .map_or_else(|| marker(id), |b| marked(b, id));
            let mut review = json!({ "event": event.as_str(), "body": text });
            // Pinned to the commit proposed on: GitHub refuses it for another head.
            if let Some(sha) = head_sha(&item.idempotency_key) {
                review["commit_id"] = json!(sha);
            }
            vec![call(
                "POST",
                format!("/repos/{repository}/pulls/{number}/reviews"),
                review,
            )]
        }
    })
}

/// `name` as one URL path segment.
fn path_segment(name: &str) -> String {
    let mut url = reqwest::Url::parse("http://keel.invalid/").expect("a valid base");
    url.path_segments_mut()
        .expect("a base")
        .pop_if_empty()
        .push(name);
    url.path()[1..].to_string()
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
        ACTION_KIND
    }

    fn run(self: Arc<Self>, job: Job) -> BoxFuture<'static, ()> {
        let span = tracing::info_span!(
            "external_action",
            action_id = %job.lease.ref_id,
            attempt = job.lease.attempts,
            outcome = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
        );
        let ref_id = job.lease.ref_id.clone();
        crate::attempt::observe(ACTION_KIND, ref_id, span, async move {
            tokio::select! {
                done = self.execute(&job.lease, &job.deadline) => done,
                // Past its local deadline (or lease lost, or shut down) the attempt stops
                // where it is: a POST in flight is abandoned, its answer unawaited. The
                // action stays `sending`, and its next owner looks for its marker first.
                () = job.interrupt.cancelled() => Err(StoreError::LeaseLost),
            }
        })
    }
}

/// How an attempt ends the action.
enum Ending {
    Sent(Vec<send::Answer>),
    Stale {
        reason: String,
        now: Value,
    },
    Failed {
        code: &'static str,
        message: String,
        answers: Vec<send::Answer>,
    },
}

/// What an attempt leads to.
enum Next {
    End(Ending),
    Again(Pause),
}

impl ActionJobs {
    async fn execute(
        &self,
        lease: &Lease,
        deadline: &LeaseDeadline,
    ) -> Result<&'static str, StoreError> {
        let scope = lease.scope();
        let mut tx = queue::begin_fenced(&self.poller.pool, lease).await?;
        let action = crate::external::actions::lock(&mut tx, &scope, &lease.ref_id).await?;
        let Some(action) =
            action.filter(|a| matches!(a.status, ActionStatus::Approved | ActionStatus::Sending))
        else {
            // Gone with its item (its source was deleted): nothing to send.
            queue::complete(&mut tx, lease).await?;
            tx.commit().await?;
            return Ok("ended");
        };
        tx.commit().await?;
        if lease.attempts > lease.max_attempts {
            let pause = Pause {
                code: "gave_up",
                message: format!("gave up after {} attempts", lease.max_attempts),
                until: None,
            };
            return self.give_up(lease, &action, pause).await;
        }
        let target = match self.target(&scope, &action).await? {
            Ok(target) => target,
            Err(ending) => return self.finish(lease, &action, None, ending).await,
        };
        match self.attempt(lease, deadline, &action, &target).await? {
            Next::End(ending) => self.finish(lease, &action, Some(&target), ending).await,
            Next::Again(pause) => self.again(lease, &action, pause).await,
        }
    }

    /// An approved action is checked against its target, marked `sending` and sent; one
    /// already `sending` is looked for by its marker first, and sent only when not found.
    async fn attempt(
        &self,
        lease: &Lease,
        deadline: &LeaseDeadline,
        action: &ActionRecord,
        target: &Target<'_>,
    ) -> Result<Next, StoreError> {
        let calls: Vec<Call> = serde_json::from_value(action.calls.clone()).map_err(|e| {
            StoreError::Conflict(format!("action {} is unreadable: {e}", action.id))
        })?;
        if action.status == ActionStatus::Approved {
            match send::changed(target, action).await {
                Err(pause) => return Ok(Next::Again(pause)),
                Ok(Some((reason, now))) => return Ok(Next::End(Ending::Stale { reason, now })),
                Ok(None) => {}
            }
            // Committed before the call: a later attempt then knows it may have gone out.
            let mut tx = queue::begin_fenced(&self.poller.pool, lease).await?;
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
                Err(pause) => return Ok(Next::Again(pause)),
                Ok(Some(found)) => return Ok(Next::End(Ending::Sent(vec![found]))),
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
        Ok(match send::perform(target, &calls).await {
            Ok(answers) => Next::End(Ending::Sent(answers)),
            Err(send::Failure::Pause(pause)) => Next::Again(pause),
            Err(send::Failure::Refused {
                code,
                message,
                answers,
            }) => Next::End(Ending::Failed {
                code,
                message,
                answers,
            }),
        })
    }

    /// The item, its tracker and the token, resolved now; an ending when the action can no
    /// longer be sent (its workflow broke, its token is not there).
    async fn target(
        &self,
        scope: &Scope,
        action: &ActionRecord,
    ) -> Result<Result<Target<'_>, Ending>, StoreError> {
        let failed = |code: &'static str, message: String| Ending::Failed {
            code,
            message,
            answers: Vec::new(),
        };
        let mut conn = self.poller.pool.acquire().await?;
        let item = crate::external::actions::item(&mut conn, scope, &action.item_id).await?;
        let source = external::get_source(&mut conn, scope, &item.source_id).await?;
        drop(conn);
        let workflow = match load_workflow(&source) {
            Ok(workflow) => workflow,
            Err(error) => return Ok(Err(failed(error.code(), error.to_string()))),
        };
        let Ok(tracker) = tracker(&workflow) else {
            let message = "the workflow names no tracker".to_string();
            return Ok(Err(failed("workflow_parse_error", message)));
        };
        let token = match token(tracker, &self.poller.secrets) {
            Ok(token) => token,
            Err(unresolved) => return Ok(Err(failed(unresolved.code, unresolved.message))),
        };
        Ok(Ok(Target {
            poller: &self.poller,
            item,
            tracker: tracker.clone(),
            token,
        }))
    }

    /// Ends the action: its evidence artifact, its status, and the ack, in one fenced
    /// transaction.
    async fn finish(
        &self,
        lease: &Lease,
        action: &ActionRecord,
        target: Option<&Target<'_>>,
        ending: Ending,
    ) -> Result<&'static str, StoreError> {
        let (status, evidence, response, error) = match &ending {
            Ending::Sent(answers) => {
                let evidence = json!({ "outcome": "sent", "answers": answers });
                (
                    ActionStatus::Sent,
                    evidence,
                    answers.last().map(send::Answer::short),
                    None,
                )
            }
            Ending::Stale { reason, now } => {
                let evidence = json!({ "outcome": "stale_target", "reason": reason,
                                       "target_then": action.target, "target_now": now });
                let error = Some(("stale_target", reason.as_str()));
                (ActionStatus::StaleTarget, evidence, None, error)
            }
            Ending::Failed {
                code,
                message,
                answers,
            } => {
                let evidence = json!({ "outcome": "failed", "code": code, "message": message,
                                       "answers": answers });
                (
                    ActionStatus::Failed,
                    evidence,
                    None,
                    Some((*code, message.as_str())),
                )
            }
        };
        let text =
            serde_json::to_string_pretty(&json!({ "action_id": action.id, "evidence": evidence }))
                .expect("JSON serializes");
        // The tracker may echo what it was sent; the token never goes into a row.
        let text = match target.and_then(|t| t.token.as_ref()) {
            Some(token) if !token.expose().is_empty() => text.replace(token.expose(), "[redacted]"),
            _ => text,
        };
        let scope = lease.scope();
        let mut tx = queue::begin_fenced(&self.poller.pool, lease).await?;
        let run = Subject::Run {
            task_id: &action.task_id,
            run_id: &action.run_id,
        };
        let name = format!("external_action_{}.json", action.id);
        let artifact =
            artifacts::open(&mut tx, &scope, run, &name, "metadata", "application/json").await?;
        self.poller
            .content
            .append(
                &mut tx,
                &scope,
                &artifact.id,
                text.as_bytes(),
                MAX_EVIDENCE_BYTES,
            )
            .await?;
        artifacts::close(&mut tx, &scope, &artifact.id).await?;
        let outcome = Outcome {
            response: response.as_ref(),
            artifact_id: Some(&artifact.id),
            error,
        };
        crate::external::actions::update(&mut tx, &scope, &action.id, status, &outcome).await?;
        queue::complete(&mut tx, lease).await?;
        tx.commit().await?;
        Ok(status.as_str())
    }

    /// The tracker could not be asked: try again later (when its rate limit lifts), up to
    /// the job's attempts.
    async fn again(
        &self,
        lease: &Lease,
        action: &ActionRecord,
        pause: Pause,
    ) -> Result<&'static str, StoreError> {
        if lease.attempts >= lease.max_attempts {
            return self.give_up(lease, action, pause).await;
        }
        let delay = pause
            .until
            .and_then(|until| (until - chrono::Utc::now()).to_std().ok())
            .unwrap_or_else(|| queue::backoff(lease.attempts));
        let scope = lease.scope();
        let mut tx = queue::begin_fenced(&self.poller.pool, lease).await?;
        let status = current_status(&mut tx, &scope, &action.id).await?;
        let outcome = Outcome {
            error: Some((pause.code, &pause.message)),
            ..Outcome::default()
        };
        crate::external::actions::update(&mut tx, &scope, &action.id, status, &outcome).await?;
        queue::retry(&mut tx, lease, &pause.message, delay, true).await?;
        tx.commit().await?;
        Ok("retried")
    }

    /// The last attempt could not reach the tracker: the action fails. One that was being
    /// sent may have reached it; the message says so.
    async fn give_up(
        &self,
        lease: &Lease,
        action: &ActionRecord,
        pause: Pause,
    ) -> Result<&'static str, StoreError> {
        let mut conn = self.poller.pool.acquire().await?;
        let status = current_status(&mut conn, &lease.scope(), &action.id).await?;
        drop(conn);
        let unsure = if status == ActionStatus::Sending {
            "; it may have been sent: look for its marker on the tracker"
        } else {
            ""
        };
        let ending = Ending::Failed {
            code: pause.code,
            message: format!("{}{unsure}", pause.message),
            answers: Vec::new(),
        };
        self.finish(lease, action, None, ending).await
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
        let github =
            crate::external::tracker::test_tracker(TrackerKind::Github, "a/b", "open", "closed");
        let pull = item(
            "github_pull_request",
            "a/b#8",
            "github:pull_request:a/b:8:abc:2026-01-02T00:00:00Z",
        );
        let approve = ProposedAction::Review {
            event: crate::external::actions::ReviewEvent::Approve,
            body: None,
        };
        let calls = calls(&github, &pull, &approve, "xact_1").unwrap();
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
        let calls = super::calls(&github, &issue, &labels, "xact_1").unwrap();
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
        let linear =
            crate::external::tracker::test_tracker(TrackerKind::Linear, "eng", "Todo", "Done");
        let comment = ProposedAction::Comment { body: "hi".into() };
        let calls = super::calls(&linear, &issue, &comment, "xact_1").unwrap();
        assert_eq!(calls[0].path, "");
        assert_eq!(
            calls[0].body["variables"],
            json!({ "issueId": "uuid-1", "body": "hi\n\n<!-- keel-action:xact_1 -->" })
        );
        assert_eq!(calls_error(&linear, &issue, &labels), "unsupported_action");
    }

    fn calls_error(tracker: &Tracker, item: &ItemRecord, action: &ProposedAction) -> &'static str {
        match calls(tracker, item, action, "xact_1") {
            Err(StoreError::Unprocessable { code, .. }) => code,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn label_names_are_one_path_segment() {
        assert_eq!(path_segment("needs review/ok"), "needs%20review%2Fok");
        assert_eq!(path_segment("bug"), "bug");
    }
}
