//! Fair claims across workspaces: no workspace's backlog delays another's first job by
//! more than one claim, and no workspace holds more leases than its limit, however many
//! claims race for it; a worker in remote mode shares its slots out without being told.

use crate::support;

use std::collections::HashMap;
use std::time::Duration;

use keel::queue::{Lease, fair};
use keel_client::{RunRecord, RunStatus, WorkspaceLimits};
use sqlx::PgPool;

const LEASE: Duration = Duration::from_secs(30);
const KIND: &str = "test";
const UNLIMITED: u32 = u32::MAX;

/// Queues `count` due jobs of `workspace`, older ones first.
async fn backlog(pool: &PgPool, workspace: &str, count: i32) {
    sqlx::query(
        "INSERT INTO queue_jobs (kind, ref_id, workspace_id, run_after)
         SELECT $1, $2 || '-' || n, $2, now() - interval '1 hour' + n * interval '1 ms'
         FROM generate_series(1, $3) AS n",
    )
    .bind(KIND)
    .bind(workspace)
    .bind(count)
    .execute(pool)
    .await
    .unwrap();
}

fn per_workspace(leases: &[Lease]) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for lease in leases {
        let workspace = lease.ref_id.split('-').next().unwrap().to_string();
        *counts.entry(workspace).or_default() += 1;
    }
    counts
}

async fn held(pool: &PgPool, workspace: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM queue_jobs WHERE workspace_id = $1 AND lease_owner IS NOT NULL",
    )
    .bind(workspace)
    .fetch_one(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_backlog_does_not_delay_another_workspaces_first_job() {
    let pool = support::pool(&support::fresh_database().await).await;
    backlog(&pool, "big", 1000).await;
    // Queued after the whole backlog: claim order alone would reach it last.
    backlog(&pool, "small", 1).await;
    let first = fair::claim(&pool, "w", KIND, 1, LEASE, UNLIMITED)
        .await
        .unwrap();
    let second = fair::claim(&pool, "w", KIND, 1, LEASE, UNLIMITED)
        .await
        .unwrap();
    let claimed: Vec<&str> = first.iter().chain(&second).map(|l| &*l.ref_id).collect();
    assert!(
        claimed.contains(&"small-1"),
        "the small workspace's job was claimed within two claims of one: {claimed:?}"
    );
    // A claim with room for both takes each workspace's first job before anyone's second.
    let pool = support::pool(&support::fresh_database().await).await;
    backlog(&pool, "big", 1000).await;
    backlog(&pool, "small", 3).await;
    let leases = fair::claim(&pool, "w", KIND, 4, LEASE, UNLIMITED)
        .await
        .unwrap();
    assert_eq!(
        per_workspace(&leases),
        HashMap::from([("big".into(), 2), ("small".into(), 2)])
    );
}

#[tokio::test]
async fn claims_stop_at_a_workspaces_limit_and_an_override_moves_it() {
    let pool = support::pool(&support::fresh_database().await).await;
    backlog(&pool, "a", 10).await;
    backlog(&pool, "b", 10).await;
    let leases = fair::claim(&pool, "w", KIND, 50, LEASE, 3).await.unwrap();
    assert_eq!(
        per_workspace(&leases),
        HashMap::from([("a".into(), 3), ("b".into(), 3)])
    );
    assert!(
        fair::claim(&pool, "w", KIND, 50, LEASE, 3)
            .await
            .unwrap()
            .is_empty(),
        "both workspaces are at their limit"
    );
    sqlx::query(
        "INSERT INTO workspace_limits (workspace_id, max_concurrent, updated_by) VALUES ('a', 5, 'test')",
    )
    .execute(&pool)
    .await
    .unwrap();
    let leases = fair::claim(&pool, "w", KIND, 50, LEASE, 3).await.unwrap();
    assert_eq!(per_workspace(&leases), HashMap::from([("a".into(), 2)]));
    // A finished job frees its slot.
    sqlx::query("DELETE FROM queue_jobs WHERE ref_id = 'b-1'")
        .execute(&pool)
        .await
        .unwrap();
    let leases = fair::claim(&pool, "w", KIND, 50, LEASE, 3).await.unwrap();
    assert_eq!(per_workspace(&leases), HashMap::from([("b".into(), 1)]));
}

#[tokio::test]
async fn an_expired_lease_is_reclaimed_within_the_limit() {
    let pool = support::pool(&support::fresh_database().await).await;
    backlog(&pool, "a", 5).await;
    let first = fair::claim(&pool, "w1", KIND, 50, LEASE, 2).await.unwrap();
    assert_eq!(first.len(), 2);
    sqlx::query(
        "UPDATE queue_jobs SET lease_expires_at = now() - interval '1 s' WHERE ref_id = $1",
    )
    .bind(&first[0].ref_id)
    .execute(&pool)
    .await
    .unwrap();
    let taken = fair::claim(&pool, "w2", KIND, 50, LEASE, 2).await.unwrap();
    assert_eq!(taken.len(), 1, "one slot is free: the expired lease's");
    assert_eq!(
        taken[0].ref_id, first[0].ref_id,
        "the expired job is taken first"
    );
    assert_eq!(taken[0].fencing_token, first[0].fencing_token + 1);
    assert_eq!(held(&pool, "a").await, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_claims_never_exceed_the_limit() {
    let pool = support::pool(&support::fresh_database().await).await;
    backlog(&pool, "a", 2000).await;
    for round in 0..20 {
        // Ten claims at once, each wanting one job, against a limit of three.
        let claims: Vec<_> = (0..10)
            .map(|n| {
                let pool = pool.clone();
                tokio::spawn(async move {
                    fair::claim(&pool, &format!("w{n}"), KIND, 1, LEASE, 3)
                        .await
                        .unwrap()
                        .len()
                })
            })
            .collect();
        let mut total = 0;
        for claim in claims {
            total += claim.await.unwrap();
        }
        assert_eq!(held(&pool, "a").await, 3, "round {round}");
        assert_eq!(total, 3, "round {round}");
        // The three finish: the next round has three free slots again.
        sqlx::query("DELETE FROM queue_jobs WHERE lease_owner IS NOT NULL")
            .execute(&pool)
            .await
            .unwrap();
    }
}

const SECRET: &str = "fairness-shared-secret-0123456789";
const RUNTIME: &str = "keel-fairness";

/// `keel api` in remote mode, trusting the header form with [`SECRET`].
async fn remote_api(db: &str, logs: &std::path::Path) -> support::KeelProcess {
    let env = [
        ("KEEL_REMOTE_MODE", "1"),
        ("KEEL_RUNTIME_ID", RUNTIME),
        ("KEEL_REMOTE_SHARED_SECRET", SECRET),
    ];
    support::spawn_api_with_env(db, logs, "api", &env).await
}

/// A client of the remote runtime acting in `org`.
fn member(base: &str, org: &str) -> support::Client {
    support::client_with_headers(
        base,
        &[
            ("x-keel-remote-secret", SECRET),
            ("x-keel-actor-id", "someone"),
            ("x-keel-org-id", org),
            ("x-keel-runtime-id", RUNTIME),
        ],
    )
}

/// A remote API and a member each of two workspaces, `busy` and `quiet`.
async fn busy_and_quiet(
    db: &str,
    logs: &std::path::Path,
) -> (support::KeelProcess, support::Client, support::Client) {
    let api = remote_api(db, logs).await;
    let base = api.client.as_ref().unwrap().base.clone();
    let (busy, quiet) = (member(&base, "busy"), member(&base, "quiet"));
    (api, busy, quiet)
}

fn start_of(run: &RunRecord) -> chrono::DateTime<chrono::Utc> {
    run.started_at
        .unwrap_or_else(|| panic!("started_at of {run:?}"))
}

fn end_of(run: &RunRecord) -> chrono::DateTime<chrono::Utc> {
    run.finished_at
        .unwrap_or_else(|| panic!("finished_at of {run:?}"))
}

/// The most runs of `runs` that were running at one moment.
fn most_at_once(runs: &[RunRecord]) -> usize {
    let mut edges: Vec<_> = runs
        .iter()
        .flat_map(|r| [(start_of(r), 1i32), (end_of(r), -1)])
        .collect();
    // At the same instant an end comes before a start: the slot was handed over.
    edges.sort();
    let mut running = 0;
    let mut most = 0;
    for (_, step) in edges {
        running += step;
        most = most.max(running);
    }
    most as usize
}

#[tokio::test]
async fn a_real_worker_keeps_each_workspace_within_its_limit_and_serves_both() {
    let db = support::fresh_database().await;
    let logs = tempfile::tempdir().unwrap();
    let (_api, busy, quiet) = busy_and_quiet(&db, logs.path()).await;
    let mut started = Vec::new();
    for _ in 0..6 {
        started.push(("busy", busy.run_shell("sleep 0.5").await));
    }
    // Queued behind the whole backlog: claims in queue order would reach it last.
    started.push(("quiet", quiet.run_shell("echo quiet").await));

    let data = tempfile::tempdir().unwrap();
    let _worker = support::spawn_worker_with_env(
        &db,
        logs.path(),
        "worker",
        5_000,
        data.path(),
        &[("KEEL_MAX_CONCURRENT_PER_WORKSPACE", "2")],
    );
    let mut runs = Vec::new();
    for (org, (task, run)) in &started {
        let client = if *org == "busy" { &busy } else { &quiet };
        let run = client
            .wait_terminal(task, run, Duration::from_secs(60))
            .await;
        assert_eq!(run.status, RunStatus::Completed, "{run:?}");
        runs.push(run);
    }
    let (quiet_run, busy_runs) = runs.split_last().unwrap();
    assert_eq!(
        most_at_once(busy_runs),
        2,
        "the busy workspace ran up to its limit, never past it"
    );
    let mut busy_starts: Vec<_> = busy_runs.iter().map(start_of).collect();
    busy_starts.sort();
    assert!(
        start_of(quiet_run) < busy_starts[2],
        "the quiet workspace's run started in the first claims, before the busy one's third \
         run: {quiet_run:?} vs {busy_starts:?}"
    );
}

/// Remote mode shares a worker's slots out unasked: a worker of 8 slots lets one workspace
/// hold 4 of them, so a busy workspace's backlog leaves room for a quiet one's run.
#[tokio::test]
async fn a_remote_worker_shares_its_slots_between_workspaces_by_default() {
    let db = support::fresh_database().await;
    let logs = tempfile::tempdir().unwrap();
    let (_api, busy, quiet) = busy_and_quiet(&db, logs.path()).await;
    let mut busy_started = Vec::new();
    for _ in 0..8 {
        busy_started.push(busy.run_shell("sleep 2").await);
    }
    let (quiet_task, quiet_run) = quiet.run_shell("echo quiet").await;

    let data = tempfile::tempdir().unwrap();
    support::let_the_sandbox_through(data.path());
    // The worker's 8 slots (support's `--concurrency 8`), and no per-workspace setting.
    let _worker = support::spawn_worker_with_env(
        &db,
        logs.path(),
        "worker",
        5_000,
        data.path(),
        &[("KEEL_REMOTE_MODE", "1")],
    );
    let mut busy_runs = Vec::new();
    for (task, run) in &busy_started {
        let run = busy.wait_terminal(task, run, Duration::from_secs(90)).await;
        assert_eq!(run.status, RunStatus::Completed, "{run:?}");
        busy_runs.push(run);
    }
    let quiet_run = quiet
        .wait_terminal(&quiet_task, &quiet_run, Duration::from_secs(30))
        .await;
    assert_eq!(quiet_run.status, RunStatus::Completed, "{quiet_run:?}");
    assert_eq!(
        most_at_once(&busy_runs),
        4,
        "the busy workspace held half the worker's slots, never more"
    );
    let mut busy_starts: Vec<_> = busy_runs.iter().map(start_of).collect();
    busy_starts.sort();
    assert!(
        start_of(&quiet_run) < busy_starts[4],
        "the quiet workspace's run started beside the busy one's first four: {quiet_run:?} \
         vs {busy_starts:?}"
    );
}

async fn put_limit(
    client: &support::Client,
    workspace: &str,
    body: serde_json::Value,
) -> (reqwest::StatusCode, serde_json::Value) {
    let url = format!("{}/v1/workspaces/{workspace}/limits", client.base);
    client.send(client.http.put(url).json(&body)).await
}

/// An operator's limit binds a worker that has no per-workspace limit of its own (no
/// `KEEL_MAX_CONCURRENT_PER_WORKSPACE`, local mode): 0 holds the workspace's runs queued
/// until it is lifted.
#[tokio::test]
async fn a_limit_of_zero_pauses_a_workspace_on_a_worker_without_a_limit_of_its_own() {
    let app = support::TestApp::start().await;
    let c = &app.client;
    let zero = serde_json::json!({ "max_concurrent": 0 });
    let (status, body) = put_limit(c, "default", zero).await;
    assert_eq!(status, 200, "{body}");
    let task = c.create_task(&support::shell("echo held")).await;
    let run = c.start(&task.id).await;
    // The absence of a claim, over a window of several of the worker's claim passes after
    // it has read the limits again (an unlimited run of `echo` ends well within it).
    tokio::time::sleep(fair::OPERATOR_LIMITS_TTL * 3).await;
    let held = c.run(&task.id, &run.id).await;
    assert_eq!(held.status, RunStatus::Queued, "{held:?}");
    let lifted = serde_json::json!({ "max_concurrent": null });
    let (status, body) = put_limit(c, "default", lifted).await;
    assert_eq!(status, 200, "{body}");
    let ended = c
        .wait_terminal(&task.id, &run.id, Duration::from_secs(30))
        .await;
    assert_eq!(ended.status, RunStatus::Completed, "{ended:?}");
}

#[tokio::test]
async fn operators_set_a_workspaces_limit_and_members_cannot() {
    let app = support::TestApp::api_only().await;
    let (status, body) = put_limit(
        &app.client,
        "acme",
        serde_json::json!({ "max_concurrent": 4 }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let limits: WorkspaceLimits = support::record(&body);
    assert_eq!(limits.max_concurrent, Some(4));
    assert_eq!(limits.updated_by.as_deref(), Some("local"));
    let limit: Option<i32> = sqlx::query_scalar(
        "SELECT max_concurrent FROM workspace_limits WHERE workspace_id = 'acme'",
    )
    .fetch_one(&app.pool)
    .await
    .unwrap();
    assert_eq!(limit, Some(4), "the fair claim reads what was set");
    for bad in [
        serde_json::json!({ "max_concurrent": -1 }),
        serde_json::json!({ "max_concurrent": 3_000_000_000u64 }),
        serde_json::json!({ "limit": 1 }),
    ] {
        let (status, body) = put_limit(&app.client, "acme", bad.clone()).await;
        assert!(status.is_client_error(), "{bad} → {status} {body}");
        assert_eq!(body["error"]["type"], "invalid_request", "{body}");
    }
    let (status, body) = put_limit(
        &app.client,
        "acme",
        serde_json::json!({ "max_concurrent": null }),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let limits: WorkspaceLimits = support::record(&body);
    assert!(limits.max_concurrent.is_none(), "{body}");

    let db = support::fresh_database().await;
    let logs = tempfile::tempdir().unwrap();
    let api = remote_api(&db, logs.path()).await;
    let member = member(&api.client.as_ref().unwrap().base, "acme");
    let (status, body) = put_limit(
        &member,
        "acme",
        serde_json::json!({ "max_concurrent": 100 }),
    )
    .await;
    assert_eq!(
        status, 403,
        "a workspace cannot raise its own limit: {body}"
    );
    assert_eq!(body["error"]["type"], "forbidden", "{body}");
    let (status, body) = member.get("/v1/workspaces/other/limits").await;
    assert_eq!(status, 403, "{body}");
    // keel-client has no operation for the caller's own workspace.
    let (status, body) = member.get("/v1/workspace").await;
    assert_eq!(status, 200, "{body}");
    let own: WorkspaceLimits = support::record(&body);
    assert_eq!(own.workspace_id, "acme", "{body}");
}
