//! Workspaces (tenants): the store confines every query to its scope. Workspace A owns one
//! of each resource; workspace B, on the same database, can neither read nor change any of
//! them and gets NotFound exactly as for an unknown id. The database itself keeps a child
//! in its parent's workspace. Over HTTP, local mode records the `local` actor.

use crate::support;

use std::time::Duration;

use crate::support::wait_for;
use chrono::Utc;
use keel::approvals::{ApprovalFilter, Decision, OLDEST_FIRST};
use keel::db::StoreError;
use keel::domain::{Actor, Role, Scope};
use keel::events::transitions;
use keel::events::{EventRecord, FeedCursor, FeedFilter, Subject};
use keel::media;
use keel::media::Operation;
use keel::media::{NewMediaJob, Refused};
use keel::providers::ProviderFields;
use keel::queue;
use keel::runs::steps;
use keel::runs::{Admission, AdmissionRules, Admitted, Origin, RunRecord};
use keel::schedules::{NewSchedule, ScheduleDraft};
use keel::system::leases::LeaseStatus;
use keel::system::{leases, stats};
use keel::tasks::NewTask;
use keel::tasks::TaskDraft;
use keel::{approvals, artifacts, events, providers, runs, schedules, tasks};
use keel_client::{ListOrder, TransitionRecord};
use reqwest::StatusCode;
use serde_json::json;
use sqlx::PgPool;

const LEASE: Duration = Duration::from_secs(30);

/// One of each resource in workspace A.
struct Seeded {
    pool: PgPool,
    a: Scope,
    b: Scope,
    task_id: String,
    run_id: String,
    approval_id: String,
    step_id: String,
    artifact_id: String,
    provider_id: String,
    media_job_id: String,
}

fn alice() -> Actor {
    Actor::Person("alice".into())
}

fn gated() -> AdmissionRules {
    AdmissionRules {
        approvals: "shell_exec".parse().unwrap(),
        approval_ttl: None,
        ..AdmissionRules::default()
    }
}

async fn new_task(conn: &mut sqlx::PgConnection, scope: &Scope) -> String {
    let draft = TaskDraft {
        execution_kind: Some("shell".into()),
        shell_command: Some("echo tenancy".into()),
        ..TaskDraft::default()
    };
    let task = NewTask::parse(draft, &Default::default()).unwrap();
    tasks::insert(conn, scope, &task, &alice())
        .await
        .unwrap()
        .id
}

async fn start(
    conn: &mut sqlx::PgConnection,
    scope: &Scope,
    task_id: &str,
    rules: &AdmissionRules,
) -> RunRecord {
    let admission = Admission::new(Origin::Start);
    match runs::admit(conn, scope, task_id, admission, rules, &alice()).await {
        Ok(Admitted::New(run)) => run,
        other => panic!("expected a new run, got {:?}", other.map(|_| ())),
    }
}

fn cron_schedule() -> NewSchedule {
    let draft = ScheduleDraft {
        kind: Some("cron".into()),
        timezone: Some("UTC".into()),
        enabled: Some(true),
        cron_expression: Some("0 9 * * *".into()),
        ..ScheduleDraft::default()
    };
    NewSchedule::parse(draft, Utc::now()).unwrap()
}

fn image_preset() -> keel::providers::ProviderSpec {
    ProviderFields {
        kind: "openai-images".into(),
        model: "gpt-image-1".into(),
        api: "media-job".into(),
        base_url: "https://api.openai.com/v1".into(),
        api_key_ref: Some("env:TENANCY_TEST_KEY".into()),
        capabilities: vec!["image_generate".into()],
        enabled: true,
        ..ProviderFields::default()
    }
    .validate(
        &keel::providers::secrets::SecretPolicy::new(vec!["*".into()], vec![]),
        &Default::default(),
        &keel::domain::Caller::local(),
    )
    .unwrap()
}

/// Workspace A's task, gated run, approval, step, artifact, schedule, provider preset and
/// queued media job (whose job is then claimed, so A has a live lease too).
async fn seed() -> Seeded {
    let pool = support::pool(&support::fresh_database().await).await;
    let (a, b) = (Scope::new("ws_a"), Scope::new("ws_b"));
    let mut tx = pool.begin().await.unwrap();
    let task_id = new_task(&mut tx, &a).await;
    let run = start(&mut tx, &a, &task_id, &gated()).await;
    let approval_id = approvals::list(&mut tx, &a, of_task(&task_id), OLDEST_FIRST, 10)
        .await
        .unwrap()[0]
        .id
        .clone();
    let step_id = steps::start(&mut tx, &a, &task_id, &run.id, "prepare", &json!({}))
        .await
        .unwrap()
        .id;
    let owner = Subject::Run {
        task_id: &task_id,
        run_id: &run.id,
    };
    let artifact_id = artifacts::open(&mut tx, &a, owner, "stdout", "stdout", "text/plain")
        .await
        .unwrap()
        .id;
    schedules::put(
        &mut tx,
        &a,
        &task_id,
        &cron_schedule(),
        Utc::now(),
        &alice(),
    )
    .await
    .unwrap();
    let provider_id = providers::create(&mut tx, &a, &image_preset())
        .await
        .unwrap()
        .id;
    let job = NewMediaJob {
        provider_id: &provider_id,
        operation: Operation::ImageGenerate,
        prompt: "a lighthouse",
        input: &json!({}),
    };
    let media_job_id = media::create(&mut tx, &a, job, &alice()).await.unwrap().id;
    media::run(&mut tx, &a, &media_job_id, &alice())
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let kinds = [keel::attempt::JobKind::Media.as_str().to_string()];
    let claimed = queue::claim(
        &queue::QueuePool::new(&pool, 1),
        "wrk_tenancy",
        &kinds,
        10,
        LEASE,
    )
    .await
    .unwrap();
    assert_eq!(claimed.len(), 1);
    assert_eq!(
        claimed[0].workspace_id, "ws_a",
        "a lease carries its workspace"
    );
    Seeded {
        pool,
        a,
        b,
        task_id,
        run_id: run.id,
        approval_id,
        step_id,
        artifact_id,
        provider_id,
        media_job_id,
    }
}

fn assert_not_found<T: std::fmt::Debug>(result: Result<T, StoreError>, what: &str) {
    match result {
        Err(StoreError::NotFound(_)) => {}
        other => panic!("{what}: expected NotFound, got {other:?}"),
    }
}

#[tokio::test]
async fn another_workspace_gets_not_found_for_each_of_a_workspaces_rows() {
    let s = seed().await;
    let (a, b) = (&s.a, &s.b);
    let mut conn = s.pool.acquire().await.unwrap();
    let c = &mut *conn;
    let run_owner = Subject::Run {
        task_id: &s.task_id,
        run_id: &s.run_id,
    };

    // A reads its own rows...
    tasks::get(c, a, &s.task_id).await.unwrap();
    runs::get(c, a, &s.task_id, &s.run_id).await.unwrap();
    approvals::get(c, a, &s.task_id, &s.approval_id)
        .await
        .unwrap();
    artifacts::get(c, a, run_owner, &s.artifact_id)
        .await
        .unwrap();
    schedules::get(c, a, &s.task_id).await.unwrap();
    providers::get(c, a, &s.provider_id).await.unwrap();
    media::get(c, a, &s.media_job_id).await.unwrap();

    // ...and B gets NotFound for every one, as for an id that does not exist.
    assert_not_found(tasks::get(c, b, &s.task_id).await, "task");
    assert_not_found(tasks::get(c, b, "task_unknown").await, "unknown task");
    assert_not_found(runs::get(c, b, &s.task_id, &s.run_id).await, "run");
    assert_not_found(runs::get_by_id(c, b, &s.run_id).await, "run by id");
    assert_not_found(
        approvals::get(c, b, &s.task_id, &s.approval_id).await,
        "approval",
    );
    assert_not_found(
        artifacts::get(c, b, run_owner, &s.artifact_id).await,
        "artifact",
    );
    assert_not_found(schedules::get(c, b, &s.task_id).await, "schedule");
    assert_not_found(
        schedules::occurrences(c, b, &s.task_id, None, 10).await,
        "occurrences",
    );
    assert_not_found(providers::get(c, b, &s.provider_id).await, "provider");
    assert_not_found(media::get(c, b, &s.media_job_id).await, "media job");
}

#[tokio::test]
async fn another_workspace_lists_none_of_a_workspaces_rows() {
    let s = seed().await;
    let (a, b) = (&s.a, &s.b);
    let mut conn = s.pool.acquire().await.unwrap();
    let c = &mut *conn;
    let run_owner = Subject::Run {
        task_id: &s.task_id,
        run_id: &s.run_id,
    };
    let media_owner = Subject::MediaJob(&s.media_job_id);
    let no_filter = schedules::ScheduleFilter::default();
    let (feed, start) = (FeedFilter::default(), FeedCursor::default());
    // The feed shows an event once every transaction older than its own has ended, in any
    // database of the cluster: another test running alongside may hold one open a moment.
    wait_for(
        Duration::from_secs(20),
        "A's events to reach its feed",
        || async {
            let mut conn = s.pool.acquire().await.unwrap();
            let listed = events::list_feed(&mut conn, a, &feed, start, 1)
                .await
                .unwrap();
            (!listed.is_empty()).then_some(())
        },
    )
    .await;

    // Each list, as (A's count, B's count).
    let counts = [
        (
            "tasks",
            tasks::list(c, a, None, None, 50).await.unwrap().len(),
            tasks::list(c, b, None, None, 50).await.unwrap().len(),
        ),
        (
            "runs",
            runs::list(c, a, &s.task_id, None, 50).await.unwrap().len(),
            runs::list(c, b, &s.task_id, None, 50).await.unwrap().len(),
        ),
        (
            "steps",
            steps::list(c, a, &s.run_id, 0, 50).await.unwrap().len(),
            steps::list(c, b, &s.run_id, 0, 50).await.unwrap().len(),
        ),
        (
            "run artifacts",
            artifacts::list(c, a, run_owner, None, 50)
                .await
                .unwrap()
                .len(),
            artifacts::list(c, b, run_owner, None, 50)
                .await
                .unwrap()
                .len(),
        ),
        (
            "approval inbox",
            approvals::list(c, a, ApprovalFilter::default(), OLDEST_FIRST, 50)
                .await
                .unwrap()
                .len(),
            approvals::list(c, b, ApprovalFilter::default(), OLDEST_FIRST, 50)
                .await
                .unwrap()
                .len(),
        ),
        (
            "task approvals",
            approvals::list(c, a, of_task(&s.task_id), OLDEST_FIRST, 50)
                .await
                .unwrap()
                .len(),
            approvals::list(c, b, of_task(&s.task_id), OLDEST_FIRST, 50)
                .await
                .unwrap()
                .len(),
        ),
        (
            "schedules",
            schedules::list(c, a, &no_filter, None, 50)
                .await
                .unwrap()
                .len(),
            schedules::list(c, b, &no_filter, None, 50)
                .await
                .unwrap()
                .len(),
        ),
        (
            "providers",
            providers::list(c, a, None, 50).await.unwrap().len(),
            providers::list(c, b, None, 50).await.unwrap().len(),
        ),
        (
            "media jobs",
            media::list(c, a, &Default::default(), None, 50)
                .await
                .unwrap()
                .len(),
            media::list(c, b, &Default::default(), None, 50)
                .await
                .unwrap()
                .len(),
        ),
        (
            "run events",
            events::list_for_run(c, a, &s.run_id, 0, 50)
                .await
                .unwrap()
                .len(),
            events::list_for_run(c, b, &s.run_id, 0, 50)
                .await
                .unwrap()
                .len(),
        ),
        (
            "feed",
            events::list_feed(c, a, &feed, start, 200)
                .await
                .unwrap()
                .len(),
            events::list_feed(c, b, &feed, start, 200)
                .await
                .unwrap()
                .len(),
        ),
        (
            "transitions",
            transitions::list(c, a, None, None, (ListOrder::Asc, None), 200)
                .await
                .unwrap()
                .len(),
            transitions::list(c, b, None, None, (ListOrder::Asc, None), 200)
                .await
                .unwrap()
                .len(),
        ),
        (
            "active leases",
            leases::list(c, a, LeaseStatus::Active, 0, 50)
                .await
                .unwrap()
                .len(),
            leases::list(c, b, LeaseStatus::Active, 0, 50)
                .await
                .unwrap()
                .len(),
        ),
        (
            "queue stats",
            stats::queue(c, a).await.unwrap().len(),
            stats::queue(c, b).await.unwrap().len(),
        ),
    ];
    for (list, in_a, in_b) in counts {
        assert!(in_a > 0, "{list}: workspace A sees its own rows");
        assert_eq!(in_b, 0, "{list}: workspace B sees none of A's rows");
    }
    // Media artifacts: the job has none yet, so B is checked against the job's scope.
    assert!(
        artifacts::list(c, b, media_owner, None, 50)
            .await
            .unwrap()
            .is_empty()
    );
    let actors: Vec<String> = transitions::list(c, a, None, None, (ListOrder::Asc, None), 200)
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.actor)
        .collect();
    assert!(actors.iter().all(|actor| actor == "alice"), "{actors:?}");
}

#[tokio::test]
async fn another_workspace_changes_none_of_a_workspaces_rows() {
    let s = seed().await;
    let (a, b) = (&s.a, &s.b);
    let bob = Actor::Person("bob".into());
    // Each attempt in its own transaction, rolled back whatever it did.
    macro_rules! attempt {
        ($what:expr, |$c:ident| $call:expr) => {{
            let mut tx = s.pool.begin().await.unwrap();
            let $c = &mut *tx;
            let result = $call.await;
            tx.rollback().await.unwrap();
            assert_not_found(result, $what);
        }};
    }
    attempt!("delete task", |c| tasks::delete(c, b, &s.task_id, &bob));
    attempt!("start", |c| async {
        let admission = Admission::new(Origin::Start);
        runs::admit(c, b, &s.task_id, admission, &gated(), &bob)
            .await
            .map(|_| ())
    });
    attempt!("cancel run", |c| runs::cancel(
        c, b, &s.task_id, &s.run_id, &bob
    ));
    attempt!("resolve approval", |c| async {
        let approver = approvals::Approver {
            actor: bob.clone(),
            may_approve_own: true,
        };
        let found = approvals::decidable(c, b, &s.task_id, &s.approval_id, &approver).await?;
        runs::resolve_gate(c, b, &found, Decision::Approve, None, &bob)
            .await
            .map(|_| ())
    });
    attempt!("finish step", |c| steps::finish(
        c,
        b,
        &s.step_id,
        Some(&json!({})),
        None
    ));
    attempt!("replace schedule", |c| schedules::put(
        c,
        b,
        &s.task_id,
        &cron_schedule(),
        Utc::now(),
        &bob
    ));
    attempt!("delete schedule", |c| schedules::delete(
        c, b, &s.task_id, &bob
    ));
    attempt!("update provider", |c| providers::update(
        c,
        b,
        &s.provider_id,
        &image_preset()
    ));
    attempt!("delete provider", |c| providers::delete(
        c,
        b,
        &s.provider_id,
        Role::RuntimeOperator
    ));
    attempt!("cancel media job", |c| media::cancel(
        c,
        b,
        &s.media_job_id,
        &bob
    ));
    let mut tx = s.pool.begin().await.unwrap();
    let job = NewMediaJob {
        provider_id: &s.provider_id,
        operation: Operation::ImageGenerate,
        prompt: "not yours",
        input: &json!({}),
    };
    let refused = media::create(&mut tx, b, job, &bob).await;
    assert!(
        matches!(refused, Err(Refused::Store(StoreError::NotFound(_)))),
        "{refused:?}"
    );
    let refused = media::run(&mut tx, b, &s.media_job_id, &bob).await;
    assert!(
        matches!(refused, Err(Refused::Store(StoreError::NotFound(_)))),
        "{refused:?}"
    );
    tx.rollback().await.unwrap();

    // A's rows are as they were.
    let mut conn = s.pool.acquire().await.unwrap();
    let c = &mut *conn;
    let run = runs::get(c, a, &s.task_id, &s.run_id).await.unwrap();
    assert_eq!(run.status.as_str(), "awaiting_approval");
    let approval = approvals::get(c, a, &s.task_id, &s.approval_id)
        .await
        .unwrap();
    assert_eq!(approval.status.as_str(), "pending");
    assert_eq!(
        steps::list(c, a, &s.run_id, 0, 10).await.unwrap()[0].status,
        keel_api_types::StepStatus::Running
    );
    assert_eq!(schedules::get(c, a, &s.task_id).await.unwrap().revision, 1);
    providers::get(c, a, &s.provider_id).await.unwrap();
    let job = media::get(c, a, &s.media_job_id).await.unwrap();
    assert_eq!(job.status.as_str(), "queued");
    let bobs: Vec<_> = transitions::list(c, a, None, None, (ListOrder::Asc, None), 200)
        .await
        .unwrap()
        .into_iter()
        .filter(|t| t.actor == "bob")
        .collect();
    assert!(bobs.is_empty(), "{bobs:?}");
}

#[tokio::test]
async fn the_feed_of_a_workspace_holds_none_of_anothers_events_though_they_interleave() {
    let s = seed().await;
    let (a, b) = (&s.a, &s.b);
    // B's events are written between two batches of A's, so their global sequences
    // interleave. B's run is not gated: it is queued, for the lease below.
    let mut tx = s.pool.begin().await.unwrap();
    let b_task = new_task(&mut tx, b).await;
    start(&mut tx, b, &b_task, &AdmissionRules::default()).await;
    tx.commit().await.unwrap();
    let mut tx = s.pool.begin().await.unwrap();
    runs::cancel(&mut tx, a, &s.task_id, &s.run_id, &alice())
        .await
        .unwrap();
    tx.commit().await.unwrap();

    let mut conn = s.pool.acquire().await.unwrap();
    let feed = FeedFilter::default();
    let start = FeedCursor::default();
    // The feed shows a commit once no older transaction is open anywhere in the cluster
    // (the other tests' included): wait until A's last batch, the cancel, is past it.
    let of_a = wait_for(
        Duration::from_secs(10),
        "A's cancel in its feed",
        || async {
            let mut conn = s.pool.acquire().await.unwrap();
            let of_a = events::list_feed(&mut conn, a, &feed, start, 200)
                .await
                .unwrap();
            let cancelled = keel_client::EventType::RunCancelled;
            of_a.iter()
                .any(|e| e.event_type == cancelled)
                .then_some(of_a)
        },
    )
    .await;
    let of_b = events::list_feed(&mut conn, b, &feed, start, 200)
        .await
        .unwrap();
    assert!(!of_b.is_empty());
    assert!(
        of_b.iter()
            .all(|e| e.task_id.as_deref() == Some(b_task.as_str())),
        "B's feed holds only B's events: {of_b:?}"
    );
    assert!(
        of_a.iter()
            .all(|e| e.task_id.as_deref() != Some(b_task.as_str()))
    );
    let position = |e: &EventRecord| FeedCursor::parse(&e.cursor).unwrap();
    let (first_a, last_a) = (position(&of_a[0]), position(of_a.last().unwrap()));
    assert!(
        of_b.iter()
            .all(|e| first_a < position(e) && position(e) < last_a),
        "B's events lie between A's in the feed order"
    );
    // A filter naming A's task does not reach across either.
    let by_task = FeedFilter {
        task_id: Some(s.task_id.clone()),
        ..FeedFilter::default()
    };
    assert!(
        events::list_feed(&mut conn, b, &by_task, start, 200)
            .await
            .unwrap()
            .is_empty()
    );
    // The released lease history is scoped too.
    let kinds = [keel::attempt::JobKind::Run.as_str().to_string()];
    let lease = queue::claim(
        &queue::QueuePool::new(&s.pool, 1),
        "wrk_b",
        &kinds,
        1,
        LEASE,
    )
    .await
    .unwrap();
    let mut tx = s.pool.begin().await.unwrap();
    queue::settle(&mut tx, &lease[0], queue::Disposition::Complete)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let released = |scope: Scope| {
        let pool = s.pool.clone();
        async move {
            let mut conn = pool.acquire().await.unwrap();
            leases::list(&mut conn, &scope, LeaseStatus::Released, 0, 50)
                .await
                .unwrap()
                .len()
        }
    };
    assert_eq!(released(b.clone()).await, 1);
    assert_eq!(released(a.clone()).await, 0);
}

#[tokio::test]
async fn the_database_keeps_a_child_in_its_parents_workspace() {
    let s = seed().await;
    let foreign_run = sqlx::query(
        "INSERT INTO runs (id, task_id, number, status, finished_at, workspace_id)
         VALUES ('run_foreign', $1, 99, 'completed', now(), 'ws_b')",
    )
    .bind(&s.task_id)
    .execute(&s.pool)
    .await
    .unwrap_err();
    assert!(
        foreign_run.to_string().contains("runs_task_workspace"),
        "{foreign_run}"
    );
    let foreign_job = sqlx::query(
        "INSERT INTO media_jobs (id, provider_id, operation, prompt, status, workspace_id)
         VALUES ('media_job_foreign', $1, 'image_generate', 'x', 'queued', 'ws_b')",
    )
    .bind(&s.provider_id)
    .execute(&s.pool)
    .await
    .unwrap_err();
    assert!(
        foreign_job
            .to_string()
            .contains("media_jobs_provider_workspace"),
        "{foreign_job}"
    );
    // An insert that forgets the workspace fails rather than landing in `default`.
    let unscoped = sqlx::query(
        "INSERT INTO tasks (id, execution_kind, shell_command, workspace_mode)
         VALUES ('task_unscoped', 'shell', 'true', 'ephemeral')",
    )
    .execute(&s.pool)
    .await
    .unwrap_err();
    assert!(unscoped.to_string().contains("workspace_id"), "{unscoped}");
}

#[tokio::test]
async fn local_mode_records_the_local_actor_on_approvals_and_transitions() {
    let db_url = support::fresh_database().await;
    let dir = tempfile::tempdir().unwrap();
    let gates = [("KEEL_APPROVAL_POLICIES", "shell_exec")];
    let api = support::spawn_api_with_env(&db_url, dir.path(), "api", &gates).await;
    let _worker = support::spawn_worker_with_env(
        &db_url,
        dir.path(),
        "worker",
        5_000,
        &dir.path().join("data"),
        &gates,
    );
    let c = api.client.as_ref().unwrap();
    let (task_id, run_id) = c.run_shell("echo approved").await;
    let approvals = c.api.list_task_approvals(&task_id, None);
    let (status, approvals) = approvals.send_with_status().await.unwrap();
    assert_eq!(status, StatusCode::OK, "{approvals:?}");
    let approval_id = approvals.data[0].id.clone();
    let (status, resolved) = c
        .post(
            &format!("/v1/tasks/{task_id}/approvals/{approval_id}/resolve"),
            json!({ "decision": "approve" }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{resolved}");
    let resolution: keel_client::Resolution = support::record(&resolved);
    assert_eq!(resolution.approval.resolved_by.as_deref(), Some("local"));
    let run = c
        .wait_terminal(&task_id, &run_id, Duration::from_secs(30))
        .await;
    assert_eq!(run.status, keel_client::RunStatus::Completed, "{run:?}");

    // keel-client has no operation listing the audit trail: its pages are read raw.
    let (status, trail) = c
        .get(&format!("/v1/state-transitions?entity_id={run_id}"))
        .await;
    assert_eq!(status, StatusCode::OK, "{trail}");
    let trail = support::page::<TransitionRecord>(&trail).data;
    let actors: Vec<(&str, &str)> = trail
        .iter()
        .map(|t| (t.to_status.as_str(), t.actor.as_str()))
        .collect();
    assert_eq!(actors[0], ("awaiting_approval", "local"), "{actors:?}");
    assert_eq!(actors[1], ("queued", "local"), "{actors:?}");
    assert!(
        actors[2..]
            .iter()
            .all(|(_, actor)| actor.starts_with("worker:")),
        "{actors:?}"
    );
    let (_, approval_trail) = c
        .get(&format!("/v1/state-transitions?entity_id={approval_id}"))
        .await;
    let approval_trail = support::page::<TransitionRecord>(&approval_trail).data;
    let approved = approval_trail
        .iter()
        .find(|t| t.to_status == "approved")
        .unwrap();
    assert_eq!(approved.actor, "local");
    let events = c.events(&task_id, &run_id).await;
    let resolved_event = events
        .iter()
        .find(|e| e.event_type == keel_client::EventType::ApprovalResolved)
        .unwrap();
    assert_eq!(resolved_event.data["resolved_by"], "local");
    let created = events
        .iter()
        .find(|e| e.event_type == keel_client::EventType::RunCreated)
        .unwrap();
    assert_eq!(created.data["actor"], "local");
}

/// The approvals of one task.
fn of_task(task_id: &str) -> ApprovalFilter<'_> {
    ApprovalFilter {
        task_id: Some(task_id),
        ..ApprovalFilter::default()
    }
}
