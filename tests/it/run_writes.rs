//! How a run's worker writes: step and output rows are held back and written with the next
//! durable write or within a short deadline, so a long process's step and outputs show
//! up while it runs, and a cancel still finds and closes them.

use std::time::Duration;

use crate::support::{TestApp, wait_for};
use keel_client::{ArtifactStatus, RunStatus, StepRecord, StepStatus};

const RUN_TIMEOUT: Duration = Duration::from_secs(30);

#[tokio::test]
async fn a_long_process_shows_its_step_and_outputs_while_it_runs() {
    let app = TestApp::start().await;
    let c = &app.client;
    let (task_id, run_id) = c.run_shell("sleep 600").await;
    let run_path = format!("/v1/tasks/{task_id}/runs/{run_id}");

    // The process writes nothing, so only the deadline flush can have written these.
    let steps: Vec<StepRecord> = wait_for(RUN_TIMEOUT, "the running step", || async {
        let steps = c.api.list_steps(&task_id, &run_id).await.unwrap().data;
        let first = steps.first().map(|s| s.status);
        (first == Some(StepStatus::Running)).then_some(steps)
    })
    .await;
    assert_eq!(steps[0].name, "shell");
    let artifacts = c.api.list_artifacts(&task_id, &run_id).await.unwrap().data;
    let mut names: Vec<&str> = artifacts.iter().map(|a| a.name.as_str()).collect();
    names.sort();
    assert_eq!(names, ["stderr", "stdout"]);
    assert!(
        artifacts
            .iter()
            .all(|a| a.status == ArtifactStatus::Writing),
        "{artifacts:?}"
    );
    assert_eq!(c.run(&task_id, &run_id).await.status, RunStatus::Running);
    let types: Vec<String> = c
        .events(&task_id, &run_id)
        .await
        .iter()
        .map(|e| e.event_type.to_string())
        .collect();
    let written = ["step.started", "artifact.created", "artifact.created"];
    assert!(
        types.windows(3).any(|w| w == written),
        "the held rows' events, in the order reported: {types:?}"
    );

    let (status, body) = c.post_empty(&format!("{run_path}/cancel")).await;
    assert_eq!(status, reqwest::StatusCode::OK, "{body}");
    let steps = c.api.list_steps(&task_id, &run_id).await.unwrap().data;
    assert_eq!(steps[0].status, StepStatus::Cancelled);
    let artifacts = c.api.list_artifacts(&task_id, &run_id).await.unwrap().data;
    assert!(
        artifacts
            .iter()
            .all(|a| a.status == ArtifactStatus::Complete),
        "{artifacts:?}"
    );
}

#[tokio::test]
async fn a_short_run_records_its_step_outputs_and_end_in_order() {
    let app = TestApp::start().await;
    let c = &app.client;
    let (task_id, run_id) = c.run_shell("echo out; echo err >&2; exit 3").await;
    let run = c.wait_terminal(&task_id, &run_id, RUN_TIMEOUT).await;
    assert_eq!(run.status, RunStatus::Failed);
    assert_eq!(run.exit_code, Some(3));
    let steps = c.api.list_steps(&task_id, &run_id).await.unwrap().data;
    assert_eq!(steps.len(), 1);
    assert_eq!(steps[0].status, StepStatus::Failed);
    assert_eq!(c.stdout(&task_id, &run_id).await, "out\n");
    let types: Vec<String> = c
        .events(&task_id, &run_id)
        .await
        .iter()
        .map(|e| e.event_type.to_string())
        .collect();
    let tail: Vec<&str> = types
        .iter()
        .map(String::as_str)
        .skip_while(|t| *t != "step.started")
        .collect();
    assert_eq!(
        tail,
        [
            "step.started",
            "artifact.created",
            "artifact.created",
            "step.failed",
            "task.updated",
            "run.failed"
        ],
        "{types:?}"
    );
    let sequences: Vec<i64> = c
        .events(&task_id, &run_id)
        .await
        .iter()
        .map(|e| e.sequence)
        .collect();
    assert!(
        sequences.windows(2).all(|w| w[1] == w[0] + 1),
        "{sequences:?}"
    );
}
