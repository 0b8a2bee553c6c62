//! The patches API over real HTTP against real Postgres: a run's patch artifacts (written
//! with the store helper the agent runtime uses) are listed, read and reverted in the run's
//! workspace, with drift, double reverts and active runs refused.

use crate::support;

use std::time::Duration;

use crate::support::TestApp;
use keel::artifacts::content::ContentStore;
use keel::domain::Scope;
use keel::events;
use keel::events::Subject;
use keel::runs::patches;
use keel_client::{EventType, PatchDetail, RunStatus};
use keel_workers::agent::Patch;
use reqwest::StatusCode;

const RUN_TIMEOUT: Duration = Duration::from_secs(30);

async fn insert(app: &TestApp, task_id: &str, run_id: &str, name: &str, patch: &Patch) -> String {
    let mut tx = app.pool.begin().await.unwrap();
    let scope = Scope::local();
    let run = Subject::Run { task_id, run_id };
    let record = patches::insert_patch(&mut tx, &ContentStore::Postgres, &scope, run, name, patch)
        .await
        .unwrap();
    events::append(&mut tx, &scope, &[patches::created_event(run, &record)])
        .await
        .unwrap();
    tx.commit().await.unwrap();
    record.id
}

#[tokio::test]
async fn patches_list_read_and_revert_with_drift_detection() {
    let app = TestApp::start().await;
    let c = &app.client;
    let (task_id, run_id) = c
        .run_shell("printf after > a.txt; printf new > b.txt")
        .await;
    let run = c.wait_terminal(&task_id, &run_id, RUN_TIMEOUT).await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    let workspace = app.data_dir.path().join("workspaces").join(&run_id);
    let modified = Patch {
        path: "a.txt".into(),
        before: Some("before".into()),
        after: Some("after".into()),
        proposed: false,
    };
    let created = Patch {
        path: "b.txt".into(),
        before: None,
        after: Some("new".into()),
        proposed: false,
    };
    let a = insert(&app, &task_id, &run_id, "patch-1-1", &modified).await;
    let b = insert(&app, &task_id, &run_id, "patch-1-2", &created).await;

    let base = format!("/v1/tasks/{task_id}/runs/{run_id}/patches");
    let page = c
        .api
        .list_patches(&task_id, &run_id)
        .query("limit", Some(1));
    let (status, page) = page.send_with_status().await.unwrap();
    assert_eq!(status, StatusCode::OK, "{page:?}");
    assert_eq!(page.data[0].id, a);
    assert_eq!(page.data[0].path, "a.txt");
    assert_eq!(page.data[0].status, "applied");
    assert_eq!(page.data[0].before_bytes, Some(6));
    assert_eq!(page.data[0].after_bytes, Some(5));
    assert!(page.has_more);
    let cursor = page.next_cursor.unwrap();
    let next = c
        .api
        .list_patches(&task_id, &run_id)
        .query("cursor", Some(cursor));
    let next = next.await.unwrap();
    assert_eq!(next.data[0].id, b);
    assert!(next.data[0].before_bytes.is_none());

    // keel-client has no operation reading one patch, nor reverting one.
    let (status, one) = c.get(&format!("{base}/{a}")).await;
    assert_eq!(status, StatusCode::OK, "{one}");
    let one: PatchDetail = support::record(&one);
    assert_eq!(one.before.as_deref(), Some("before"));
    assert_eq!(one.after.as_deref(), Some("after"));

    // Drift: the file changed since the patch; the workspace stays as it is.
    std::fs::write(workspace.join("a.txt"), "edited by hand").unwrap();
    let (status, error) = c.post_empty(&format!("{base}/{a}/revert")).await;
    assert_eq!(status, StatusCode::CONFLICT, "{error}");
    assert_eq!(
        std::fs::read_to_string(workspace.join("a.txt")).unwrap(),
        "edited by hand"
    );

    std::fs::write(workspace.join("a.txt"), "after").unwrap();
    let (status, reverted) = c.post_empty(&format!("{base}/{a}/revert")).await;
    assert_eq!(status, StatusCode::OK, "{reverted}");
    let reverted: PatchDetail = support::record(&reverted);
    assert_eq!(reverted.summary.status, "reverted");
    assert_eq!(
        std::fs::read_to_string(workspace.join("a.txt")).unwrap(),
        "before"
    );
    let (status, twice) = c.post_empty(&format!("{base}/{a}/revert")).await;
    assert_eq!(status, StatusCode::CONFLICT, "{twice}");

    // A created file is removed by its revert.
    let (status, _) = c.post_empty(&format!("{base}/{b}/revert")).await;
    assert_eq!(status, StatusCode::OK);
    assert!(!workspace.join("b.txt").exists());
    let page = c.api.list_patches(&task_id, &run_id).await.unwrap();
    assert!(page.data.iter().all(|p| p.status == "reverted"));
    let events = c.api.list_run_events(&task_id, &run_id, None).await;
    let events = events.unwrap().data;
    let reverted_events = events
        .iter()
        .filter(|e| e.event_type == EventType::ToolFileReverted)
        .count();
    assert_eq!(reverted_events, 2, "{events:?}");
}

#[tokio::test]
async fn an_active_run_or_another_runs_patch_is_refused() {
    let app = TestApp::start().await;
    let c = &app.client;
    let (task_id, run_id) = c.run_shell("printf x > a.txt; sleep 30").await;
    support::wait_for(RUN_TIMEOUT, "the run to start", || async {
        (c.run(&task_id, &run_id).await.status == RunStatus::Running).then_some(())
    })
    .await;
    let patch = Patch {
        path: "a.txt".into(),
        before: None,
        after: Some("x".into()),
        proposed: false,
    };
    let id = insert(&app, &task_id, &run_id, "patch-1-1", &patch).await;
    let base = format!("/v1/tasks/{task_id}/runs/{run_id}/patches");
    let (status, error) = c.post_empty(&format!("{base}/{id}/revert")).await;
    assert_eq!(status, StatusCode::CONFLICT, "{error}");

    let (other_task, other_run) = c.run_shell("true").await;
    c.wait_terminal(&other_task, &other_run, RUN_TIMEOUT).await;
    let elsewhere = format!("/v1/tasks/{other_task}/runs/{other_run}/patches/{id}");
    assert_eq!(c.get(&elsewhere).await.0, StatusCode::NOT_FOUND);
    let (status, _) = c.post_empty(&format!("{elsewhere}/revert")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = c.get(&format!("{base}/art_missing")).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // A workspace this process cannot reach (here: removed) is named as such.
    let gone = Patch {
        path: "a.txt".into(),
        before: None,
        after: Some("x".into()),
        proposed: false,
    };
    let id = insert(&app, &other_task, &other_run, "patch-1-1", &gone).await;
    let workspace = app.data_dir.path().join("workspaces").join(&other_run);
    std::fs::remove_dir_all(&workspace).unwrap();
    let (status, error) = c
        .post_empty(&format!(
            "/v1/tasks/{other_task}/runs/{other_run}/patches/{id}/revert"
        ))
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{error}");
    assert_eq!(error["error"]["type"], "workspace_unavailable", "{error}");
    c.api.cancel_run(&task_id, &run_id).await.unwrap();
}
