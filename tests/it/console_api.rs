//! The API the console's queue page reads beyond the system stats: the queue's throughput
//! (`GET /v1/system/throughput`), against a real `keel api` in remote mode (two orgs, the
//! header identity form) and real `keel worker`s on one database.

use crate::support;
use crate::support::two_orgs;

use std::time::Duration;

use crate::support::{Client, wait_for};
use keel_client::{Resolution, RunStatus, Session, Throughput};
use reqwest::StatusCode;
use serde_json::json;
use two_orgs::{REMOTE_ENV, operator_client, org_client};

const TIMEOUT: Duration = Duration::from_secs(60);

/// The caller's throughput figures for `query`, answered 200 (raw: keel-client has no
/// operation for them).
async fn throughput(c: &Client, query: &str) -> Throughput {
    let (status, body) = c.get(&format!("/v1/system/throughput{query}")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["object"], "throughput", "{body}");
    support::record(&body)
}

/// A kind's (completed, failed) totals; (0, 0) when the kind is not listed.
fn totals(figures: &Throughput, kind: &str) -> (i64, i64) {
    figures
        .kinds
        .iter()
        .find(|k| k.kind == kind)
        .map_or((0, 0), |k| (k.completed, k.failed))
}

/// Every kind lists each bucket of the window, aligned to the width from `since` on, and
/// its buckets add up to its totals.
fn assert_dense(figures: &Throughput, buckets: usize, width: i64) {
    assert_eq!(figures.bucket_seconds, width, "{figures:?}");
    let since = figures.since;
    assert_eq!(since.timestamp() % width, 0, "{figures:?}");
    for kind in &figures.kinds {
        let list = &kind.buckets;
        assert_eq!(list.len(), buckets, "{kind:?}");
        for (n, bucket) in list.iter().enumerate() {
            assert_eq!(
                bucket.start.timestamp(),
                since.timestamp() + n as i64 * width
            );
        }
        let completed: i64 = list.iter().map(|b| b.completed).sum();
        assert_eq!(completed, kind.completed, "completed: {kind:?}");
        let failed: i64 = list.iter().map(|b| b.failed).sum();
        assert_eq!(failed, kind.failed, "failed: {kind:?}");
    }
}

/// Runs finish in org a and org b; each org's buckets count its own runs alone, a worker
/// killed under a run counts as a failed attempt once another worker takes the job over,
/// and the window is bounded.
#[tokio::test]
async fn throughput_counts_each_workspaces_finished_runs_alone() {
    let db = support::fresh_database().await;
    let (logs, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let api = support::spawn_api_with_env(&db, logs.path(), "api", &REMOTE_ENV).await;
    let mut first = support::spawn_worker_with_env(
        &db,
        logs.path(),
        "worker1",
        2_000,
        data.path(),
        &REMOTE_ENV,
    );
    let base = api.client.as_ref().unwrap().base.clone();
    let (a, b) = (org_client(&base, "a"), org_client(&base, "b"));

    let nothing = throughput(&a, "").await;
    assert_eq!(nothing.minutes, 15, "{nothing:?}");
    assert!(nothing.kinds.is_empty(), "{nothing:?}");

    for (client, runs) in [(&a, 3), (&b, 2)] {
        for n in 0..runs {
            let (task, run) = client.run_shell(&format!("echo {n}")).await;
            let done = client.wait_terminal(&task, &run, TIMEOUT).await;
            assert_eq!(done.status, RunStatus::Completed, "{done:?}");
        }
    }
    // Org b sees its two runs, none of org a's.
    let theirs = throughput(&b, "?minutes=60").await;
    assert_eq!(totals(&theirs, "run"), (2, 0), "{theirs:?}");
    assert_dense(&theirs, 60, 60);
    let one = throughput(&b, "?minutes=1").await;
    assert_dense(&one, 6, 10);
    assert_eq!(totals(&one, "run"), (2, 0), "{one:?}");

    // A run whose command fails is still a job the queue completed.
    let (task, run) = a.run_shell("exit 3").await;
    let done = a.wait_terminal(&task, &run, TIMEOUT).await;
    assert_eq!(done.status, RunStatus::Failed, "{done:?}");

    // The worker dies under a run; the next one takes the expired lease over.
    let (long_task, long_run) = a.run_shell("sleep 60").await;
    a.wait_status(&long_task, &long_run, RunStatus::Running, TIMEOUT)
        .await;
    first.kill9();
    let _second = support::spawn_worker_with_env(
        &db,
        logs.path(),
        "worker2",
        2_000,
        data.path(),
        &REMOTE_ENV,
    );
    let figures = wait_for(TIMEOUT, "the lost attempt to count", || async {
        let figures = throughput(&a, "").await;
        (totals(&figures, "run").1 >= 1).then_some(figures)
    })
    .await;
    assert_eq!(totals(&figures, "run").0, 4, "{figures:?}");
    assert_dense(&figures, 90, 10);
    a.api.cancel_run(&long_task, &long_run).await.unwrap();

    for query in [
        "?minutes=0",
        "?minutes=61",
        "?minutes=-5",
        "?minutes=ten",
        "?hours=1",
    ] {
        let (status, body) = a.get(&format!("/v1/system/throughput{query}")).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{query}: {body}");
        assert_eq!(body["error"]["type"], "invalid_request", "{query}: {body}");
    }
}

/// What the console decides its approve and reject buttons from, in remote mode with
/// shell runs gated: whoami's `role` and `may_approve_own`, and the requester on the run
/// and its approval. Without `KEEL_ALLOW_SELF_APPROVAL` the requester is refused (so the
/// console hides the buttons from them); with it, whoami says so and the requester
/// resolves.
#[tokio::test]
async fn runs_and_approvals_name_their_requester_and_whoami_whether_it_may_resolve_its_own() {
    let db = support::fresh_database().await;
    let logs = tempfile::tempdir().unwrap();
    let gated = [("KEEL_APPROVAL_POLICIES", "shell_exec")];
    let strict_env = [REMOTE_ENV.as_slice(), &gated].concat();
    let strict = support::spawn_api_with_env(&db, logs.path(), "strict", &strict_env).await;
    let base = strict.client.as_ref().unwrap().base.clone();
    let (member, operator) = (org_client(&base, "a"), operator_client(&base, "a"));

    let whoami = |c: Client| async move {
        let (status, me) = c.api.whoami().send_with_status().await.unwrap();
        assert_eq!(status, StatusCode::OK, "{me:?}");
        me.data
    };
    let me: Session = whoami(member.clone()).await;
    assert_eq!(
        (me.role.as_str(), me.may_approve_own),
        ("member", false),
        "{me:?}"
    );
    let me = whoami(operator.clone()).await;
    assert_eq!(
        (me.role.as_str(), me.may_approve_own),
        ("operator", false),
        "{me:?}"
    );

    // The operator's own run: it and its approval name the operator.
    let (task, run) = operator.run_shell("echo mine").await;
    let record = operator.run(&task, &run).await;
    assert_eq!(
        record.requested_by.as_deref(),
        Some("operator_a"),
        "{record:?}"
    );
    let approvals = operator.api.list_task_approvals(&task, None);
    let (status, approvals) = approvals.send_with_status().await.unwrap();
    assert_eq!(status, StatusCode::OK, "{approvals:?}");
    let approval = approvals.data[0].clone();
    assert_eq!(
        approval.requested_by.as_deref(),
        Some("operator_a"),
        "{approval:?}"
    );
    let inbox = operator.api.list_approvals(Some("pending"));
    let (status, inbox) = inbox.send_with_status().await.unwrap();
    assert_eq!(status, StatusCode::OK, "{inbox:?}");
    let inbox = inbox.data;
    assert_eq!(
        inbox[0].requested_by.as_deref(),
        Some("operator_a"),
        "{inbox:?}"
    );
    let resolve = format!("/v1/tasks/{task}/approvals/{}/resolve", approval.id);
    let (status, body) = operator
        .post(&resolve, json!({ "decision": "approve" }))
        .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");

    // The member's run names the member; its operator may decide it.
    let (member_task, member_run) = member.run_shell("echo theirs").await;
    assert_eq!(
        member
            .run(&member_task, &member_run)
            .await
            .requested_by
            .as_deref(),
        Some("actor_a")
    );

    // With self-approval allowed, whoami says so and the requester's decision stands.
    let allowed_env = [strict_env.as_slice(), &[("KEEL_ALLOW_SELF_APPROVAL", "1")]].concat();
    let allowed = support::spawn_api_with_env(&db, logs.path(), "allowed", &allowed_env).await;
    let own = operator_client(&allowed.client.as_ref().unwrap().base, "a");
    let me = whoami(own.clone()).await;
    assert!(me.may_approve_own, "{me:?}");
    let (status, body) = own.post(&resolve, json!({ "decision": "approve" })).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let approval = support::record::<Resolution>(&body).approval;
    assert_eq!(
        approval.requested_by.as_deref(),
        Some("operator_a"),
        "{body}"
    );
    assert_eq!(
        approval.resolved_by.as_deref(),
        Some("operator_a"),
        "{body}"
    );
}
