//! Live views: a run's stream with `projection=state` carries the run's state (the run,
//! its last steps and artifacts, its pending approvals) on the last frame of each burst, so
//! a client follows a run from its frames alone, over real HTTP.

use crate::support;

use std::time::Duration;

use futures_util::StreamExt;
use keel_client::sse::RunItem;
use keel_client::{ActivityKind, ActivityStatus, ProjectedEvent, RunState, RunStatus};
use reqwest::StatusCode;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);

/// The stream's events with their state, up to the frame of `until` (an event type).
async fn frames_until(
    c: &support::Client,
    task_id: &str,
    run_id: &str,
    until: &str,
) -> Vec<ProjectedEvent> {
    let stream = c.api.stream_run_states(task_id, run_id, None);
    let mut stream = std::pin::pin!(stream);
    let mut frames = Vec::new();
    let collected = tokio::time::timeout(WAIT, async {
        while let Some(item) = stream.next().await {
            if let RunItem::Event(frame) = item.expect("a frame") {
                let done = frame.event.event_type.as_str() == until;
                frames.push(frame);
                if done {
                    return;
                }
            }
        }
    })
    .await;
    assert!(collected.is_ok(), "no {until} within {WAIT:?}: {frames:?}");
    frames
}

/// The state the last frame carrying one held.
fn latest_state(frames: &[ProjectedEvent]) -> &RunState {
    frames
        .iter()
        .rev()
        .find_map(|f| f.state.as_ref())
        .expect("a frame with the run's state")
}

#[tokio::test]
async fn a_runs_stream_carries_its_state_so_a_view_needs_no_refetch() {
    let app = support::TestApp::with_approvals("shell_exec").await;
    let c = &app.client;
    let (task_id, run_id) = c.start_task(&support::shell("echo live")).await;

    // Waiting for an approval: the state says so, with the approval to decide.
    let frames = frames_until(c, &task_id, &run_id, "approval.requested").await;
    let waiting = latest_state(&frames);
    assert_eq!(waiting.run.status, RunStatus::AwaitingApproval);
    assert_eq!(waiting.pending_approvals.len(), 1, "{waiting:?}");
    let approval = &waiting.pending_approvals[0];
    assert_eq!(approval.action_summary[1], "  echo live");
    let path = format!("/v1/tasks/{task_id}/approvals/{}/resolve", approval.id);
    let (status, body) = c.post(&path, json!({ "decision": "approve" })).await;
    assert_eq!(status, StatusCode::OK, "{body}");

    // To its end: the last frame's state is the finished run, its step and its output,
    // and no approval left pending. Every state holds at least its frame's event.
    let frames = frames_until(c, &task_id, &run_id, "run.finished").await;
    let last = frames.last().unwrap();
    let done = last
        .state
        .as_ref()
        .expect("the last frame carries the state");
    assert_eq!(done.run.status, RunStatus::Completed);
    assert!(done.pending_approvals.is_empty(), "{done:?}");
    assert_eq!(done.steps.len(), 1, "{done:?}");
    let names: Vec<&str> = done.artifacts.iter().map(|a| a.name.as_str()).collect();
    assert!(names.contains(&"stdout"), "{names:?}");
    for frame in frames.iter().filter(|f| f.state.is_some()) {
        let (state, data) = (frame.state.as_ref().unwrap(), &frame.event.data);
        if let Some(id) = data["artifact_id"].as_str() {
            assert!(state.artifacts.iter().any(|a| a.id == id), "{frame:?}");
        }
        if let Some(id) = data["step_id"].as_str() {
            assert!(state.steps.iter().any(|s| s.id == id), "{frame:?}");
        }
    }
    let sequences: Vec<i64> = frames.iter().map(|f| f.event.sequence).collect();
    let mut sorted = sequences.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sequences, sorted, "each event once, in order");

    // Its activity: the approval it waited on, its step, its end.
    let activity = crate::agent_loop::activity(c, &task_id, &run_id).await;
    let items: Vec<(ActivityKind, ActivityStatus, &str)> = activity
        .iter()
        .map(|i| (i.kind, i.status, i.title.as_str()))
        .collect();
    assert_eq!(
        items,
        [
            (
                ActivityKind::Approval,
                ActivityStatus::Completed,
                "approval: run a shell command (sh -c)"
            ),
            (
                ActivityKind::Step,
                ActivityStatus::Completed,
                "shell: sh -c echo live"
            ),
            (
                ActivityKind::RunResult,
                ActivityStatus::Completed,
                "run completed"
            ),
        ],
        "{activity:#?}"
    );
    assert!(!activity[0].needs_action);
    assert_eq!(activity[2].summary.as_deref(), Some("exit code 0"));

    // An unknown projection is refused with the envelope.
    let (status, body) = c
        .get(&format!(
            "/v1/tasks/{task_id}/runs/{run_id}/stream?projection=everything"
        ))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["error"]["type"], "invalid_request", "{body}");
}
