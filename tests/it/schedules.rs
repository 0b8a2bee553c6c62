//! Schedules against a real Postgres: the HTTP resource, and dispatch driven through
//! `dispatch_due` with a simulated clock (several dispatchers at once, skips, coalescing,
//! stale claims, edit-versus-dispatch races), plus one firing through a real worker.

use crate::support;

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, SubsecRound, TimeDelta, Utc};
use keel::domain::{Actor, Scope};
use keel::runs::AdmissionRules;
use keel::schedules::dispatch::{STALE_CLAIM, dispatch_due};

/// Dispatch with no approval gates, as the test apps run.
fn no_gates() -> AdmissionRules {
    AdmissionRules::default()
}
use crate::support::{Client, TestApp, wait_for};
use keel::{runs, schedules};
use keel_client::{
    EventType, OccurrenceRecord, OccurrenceStatus, RunRecord, RunStatus, ScheduleRecord,
    TransitionRecord,
};
use reqwest::StatusCode;
use serde_json::{Value, json};
use sqlx::PgPool;

/// Now, to the second: what a client would send, and what the database stores exactly.
fn now() -> DateTime<Utc> {
    Utc::now().trunc_subsecs(0)
}

fn minutes(n: i64) -> TimeDelta {
    TimeDelta::minutes(n)
}

fn time(text: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(text)
        .unwrap_or_else(|e| panic!("not a time: {text}: {e}"))
        .with_timezone(&Utc)
}

/// When the schedule fires next; it must have a time.
fn next_run(schedule: &ScheduleRecord) -> DateTime<Utc> {
    schedule
        .next_run_at
        .unwrap_or_else(|| panic!("no next_run_at: {schedule:?}"))
}

async fn put_schedule(c: &Client, task_id: &str, body: Value) -> (StatusCode, Value) {
    c.send(
        c.http
            .put(format!("{}/v1/tasks/{task_id}/schedule", c.base))
            .json(&body),
    )
    .await
}

/// Creates a shell task with the given schedule; returns the task id and the schedule.
async fn scheduled_task(c: &Client, schedule: Value) -> (String, ScheduleRecord) {
    let task_id = c.create_task(&support::shell("true")).await.id;
    let (status, body) = put_schedule(c, &task_id, schedule).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    (task_id, support::record(&body))
}

fn every_minute() -> Value {
    json!({ "kind": "cron", "timezone": "Europe/Madrid", "cron_expression": "* * * * *",
            "enabled": true })
}

async fn schedule(c: &Client, task_id: &str) -> ScheduleRecord {
    let schedule = c.api.get_schedule(task_id).send_with_status().await;
    let (status, schedule) = schedule.unwrap();
    assert_eq!(status, StatusCode::OK, "{schedule:?}");
    schedule.data
}

/// The schedule as the API sent it: whether `next_run_at` is there at all is part of the
/// contract (omitted while paused or spent), which the record cannot tell from null.
async fn schedule_sent(c: &Client, task_id: &str) -> Value {
    let body = c.api.get_schedule(task_id).raw().await.unwrap();
    serde_json::from_slice(&body).unwrap()
}

/// Whether two schedules are the same, field by field as the API renders them.
fn same(a: &ScheduleRecord, b: &ScheduleRecord) -> bool {
    serde_json::to_value(a).unwrap() == serde_json::to_value(b).unwrap()
}

/// The schedule's occurrences (raw: keel-client has no operation listing them).
async fn occurrences(c: &Client, task_id: &str) -> Vec<OccurrenceRecord> {
    let (status, body) = c
        .get(&format!(
            "/v1/tasks/{task_id}/schedule/occurrences?limit=200"
        ))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    support::page(&body).data
}

/// The schedule's audit trail as (from, to, reason, actor) (raw: keel-client has no
/// operation listing it).
async fn transitions_of(
    c: &Client,
    schedule_id: &str,
) -> Vec<(Option<String>, String, Option<String>, String)> {
    let path = format!("/v1/state-transitions?entity_type=schedule&entity_id={schedule_id}");
    let (status, body) = c.get(&path).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let rows = support::page::<TransitionRecord>(&body).data;
    rows.into_iter()
        .map(|t| (t.from_status, t.to_status, t.reason, t.actor))
        .collect()
}

/// A transition as [`transitions_of`] lists it.
fn transition(
    from: Option<&str>,
    to: &str,
    reason: &str,
    actor: &str,
) -> (Option<String>, String, Option<String>, String) {
    (
        from.map(str::to_string),
        to.to_string(),
        Some(reason.to_string()),
        actor.to_string(),
    )
}

async fn runs_of(c: &Client, task_id: &str) -> Vec<RunRecord> {
    let runs = c.api.list_runs(task_id).query("limit", Some(200));
    let (status, runs) = runs.send_with_status().await.unwrap();
    assert_eq!(status, StatusCode::OK, "{runs:?}");
    runs.data
}

async fn cancel(pool: &PgPool, task_id: &str, run_id: &str) {
    let mut tx = pool.begin().await.unwrap();
    runs::cancel(&mut tx, &Scope::local(), task_id, run_id, &Actor::System)
        .await
        .unwrap();
    tx.commit().await.unwrap();
}

async fn assert_refused(
    c: &Client,
    request: reqwest::RequestBuilder,
    status: StatusCode,
    mention: &str,
) {
    let (got, body) = c.send(request).await;
    assert_eq!(
        got, status,
        "expected {status} mentioning '{mention}': {body}"
    );
    let kind = match status {
        StatusCode::NOT_FOUND => "not_found",
        StatusCode::CONFLICT => "conflict",
        _ => "invalid_request",
    };
    assert_eq!(body["error"]["type"], kind, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains(mention),
        "'{message}' should mention '{mention}'"
    );
}

#[tokio::test]
async fn a_schedule_is_created_replaced_paused_and_deleted() {
    let app = TestApp::api_only().await;
    let c = &app.client;
    let task = c.create_task(&support::shell("true")).await;
    let task_id = task.id.as_str();
    let path = format!("/v1/tasks/{task_id}/schedule");
    assert_refused(
        c,
        c.http.get(format!("{}{path}", c.base)),
        StatusCode::NOT_FOUND,
        "schedule",
    )
    .await;

    let (status, created) = put_schedule(
        c,
        task_id,
        json!({ "kind": "cron", "timezone": "Europe/Madrid", "cron_expression": "0 9 * * 1-5",
                "enabled": true }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{created}");
    assert_eq!(created["object"], "task_schedule");
    let created: ScheduleRecord = support::record(&created);
    assert!(created.id.starts_with("sched_"));
    assert_eq!(created.task_id, task_id);
    assert_eq!(created.kind, "cron");
    assert_eq!(created.timezone, "Europe/Madrid");
    assert_eq!(created.revision, 1);
    assert!(next_run(&created) > Utc::now());
    let read = schedule(c, task_id).await;
    assert!(same(&read, &created), "{read:?} vs {created:?}");

    let later = (now() + TimeDelta::days(2)).to_rfc3339();
    let (status, replaced) = put_schedule(
        c,
        task_id,
        json!({ "kind": "once", "timezone": "UTC", "run_at": later, "enabled": true }),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{replaced}");
    let replaced: ScheduleRecord = support::record(&replaced);
    assert_eq!(replaced.id, created.id);
    assert_eq!(replaced.created_at, created.created_at);
    assert_eq!(replaced.revision, 2);
    assert_eq!(replaced.kind, "once");
    assert_eq!(replaced.cron_expression, None);
    assert_eq!(next_run(&replaced), time(&later));

    // Paused: the definition stays, `next_run_at` is omitted (read raw: the record cannot
    // tell an omitted field from null).
    let (_, paused) = put_schedule(
        c,
        task_id,
        json!({ "kind": "once", "timezone": "UTC", "run_at": later, "enabled": false }),
    )
    .await;
    assert!(paused["data"].get("next_run_at").is_none(), "{paused}");
    let paused: ScheduleRecord = support::record(&paused);
    assert!(!paused.enabled);
    assert_eq!(paused.run_at, Some(time(&later)));

    let (status, _) = c.delete(&path).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(
        transitions_of(c, &created.id).await,
        [
            transition(None, "enabled", "created", "local"),
            transition(Some("enabled"), "disabled", "replaced", "local"),
            transition(Some("disabled"), "deleted", "deleted", "local"),
        ],
        "a replacement that keeps the state records nothing"
    );
    assert_refused(
        c,
        c.http.get(format!("{}{path}", c.base)),
        StatusCode::NOT_FOUND,
        "schedule",
    )
    .await;
    assert_refused(
        c,
        c.http.delete(format!("{}{path}", c.base)),
        StatusCode::NOT_FOUND,
        "schedule",
    )
    .await;
    let missing = "/v1/tasks/task_missing/schedule";
    assert_refused(
        c,
        c.http.get(format!("{}{missing}", c.base)),
        StatusCode::NOT_FOUND,
        "task",
    )
    .await;
    assert_refused(
        c,
        c.http
            .put(format!("{}{missing}", c.base))
            .json(&every_minute()),
        StatusCode::NOT_FOUND,
        "task",
    )
    .await;
    assert_refused(
        c,
        c.http.get(format!("{}{missing}/occurrences", c.base)),
        StatusCode::NOT_FOUND,
        "task",
    )
    .await;
}

#[tokio::test]
async fn every_field_and_query_value_is_validated_with_a_clear_4xx() {
    let app = TestApp::api_only().await;
    let c = &app.client;
    let (task_id, _) = scheduled_task(c, every_minute()).await;
    let url = format!("{}/v1/tasks/{task_id}/schedule", c.base);
    let past = (Utc::now() - minutes(1)).to_rfc3339();
    let future = (Utc::now() + minutes(60)).to_rfc3339();
    let unprocessable = StatusCode::UNPROCESSABLE_ENTITY;
    let bodies = [
        (json!({ "timezone": "UTC", "enabled": true }), "kind"),
        (
            json!({ "kind": "weekly", "timezone": "UTC", "enabled": true }),
            "kind",
        ),
        (
            json!({ "kind": "cron", "cron_expression": "* * * * *", "enabled": true }),
            "timezone",
        ),
        (
            json!({ "kind": "cron", "timezone": "UTC", "cron_expression": "* * * * *" }),
            "enabled",
        ),
        (
            json!({ "kind": "cron", "timezone": "UTC", "cron_expression": "* * * * *",
                 "enabled": "yes" }),
            "enabled",
        ),
        (
            json!({ "kind": "cron", "timezone": "Local", "cron_expression": "* * * * *",
                 "enabled": true }),
            "timezone",
        ),
        (
            json!({ "kind": "cron", "timezone": "Europe/Atlantis", "cron_expression": "* * * * *",
                 "enabled": true }),
            "timezone",
        ),
        (
            json!({ "kind": "cron", "timezone": "UTC", "enabled": true }),
            "cron_expression",
        ),
        (
            json!({ "kind": "cron", "timezone": "UTC", "cron_expression": "0 * * * * *",
                 "enabled": true }),
            "cron_expression",
        ),
        (
            json!({ "kind": "cron", "timezone": "UTC", "cron_expression": "@daily",
                 "enabled": true }),
            "cron_expression",
        ),
        (
            json!({ "kind": "cron", "timezone": "UTC", "cron_expression": "0 0 L * *",
                 "enabled": true }),
            "cron_expression",
        ),
        (
            json!({ "kind": "cron", "timezone": "UTC", "cron_expression": "0 0 31 2 *",
                 "enabled": false }),
            "cron_expression",
        ),
        (
            json!({ "kind": "cron", "timezone": "UTC", "cron_expression": "* * * * *",
                 "run_at": future, "enabled": true }),
            "run_at",
        ),
        (
            json!({ "kind": "once", "timezone": "UTC", "enabled": true }),
            "run_at",
        ),
        (
            json!({ "kind": "once", "timezone": "UTC", "run_at": past, "enabled": true }),
            "run_at",
        ),
        (
            json!({ "kind": "once", "timezone": "UTC", "run_at": "2030-01-01 09:00",
                 "enabled": true }),
            "run_at",
        ),
        (
            json!({ "kind": "once", "timezone": "UTC", "run_at": future,
                 "cron_expression": "* * * * *", "enabled": true }),
            "cron_expression",
        ),
        (
            json!({ "kind": "cron", "timezone": "UTC", "cron_expression": "* * * * *",
                 "enabled": true, "revision": 0 }),
            "revision",
        ),
        (
            json!({ "kind": "cron", "timezone": "UTC", "cron_expression": "* * * * *",
                 "enabled": true, "every": "minute" }),
            "every",
        ),
    ];
    for (body, field) in bodies {
        assert_refused(c, c.http.put(&url).json(&body), unprocessable, field).await;
    }
    assert_refused(
        c,
        c.http
            .put(&url)
            .header("content-type", "application/json")
            .body("{"),
        StatusCode::BAD_REQUEST,
        "malformed JSON",
    )
    .await;
    // Nothing refused changed the schedule.
    assert_eq!(schedule(c, &task_id).await.revision, 1);

    let bad = StatusCode::BAD_REQUEST;
    let too_many: String = (0..201).map(|i| format!("task_id=task_{i}&")).collect();
    let queries = [
        ("/v1/task-schedules?enabled=maybe".to_string(), "enabled"),
        ("/v1/task-schedules?limit=0".to_string(), "limit"),
        ("/v1/task-schedules?limit=201".to_string(), "limit"),
        ("/v1/task-schedules?limit=ten".to_string(), "limit"),
        ("/v1/task-schedules?status=on".to_string(), "status"),
        (format!("/v1/task-schedules?{too_many}"), "task_id"),
        (
            format!("/v1/tasks/{task_id}/schedule/occurrences?limit=201"),
            "limit",
        ),
        (
            format!("/v1/tasks/{task_id}/schedule/occurrences?cursor=yesterday"),
            "cursor",
        ),
        (
            format!("/v1/tasks/{task_id}/schedule/occurrences?after=1"),
            "after",
        ),
    ];
    for (path, mention) in queries {
        assert_refused(c, c.http.get(format!("{}{path}", c.base)), bad, mention).await;
    }
}

#[tokio::test]
async fn the_list_filters_by_task_ids_and_enabled_and_pages() {
    let app = TestApp::api_only().await;
    let c = &app.client;
    let mut ids = Vec::new();
    for enabled in [true, false, true] {
        let (task_id, _) = scheduled_task(
            c,
            json!({ "kind": "cron", "timezone": "UTC", "cron_expression": "0 * * * *",
                    "enabled": enabled }),
        )
        .await;
        ids.push(task_id);
    }
    // keel-client has no operation listing schedules: the pages are read raw.
    let tasks_of = |body: &Value| -> Vec<String> {
        let page = support::page::<ScheduleRecord>(body);
        page.data.into_iter().map(|s| s.task_id).collect()
    };
    let (status, all) = c.get("/v1/task-schedules").await;
    assert_eq!(status, StatusCode::OK, "{all}");
    assert_eq!(support::page::<ScheduleRecord>(&all).object, "list");
    assert_eq!(
        tasks_of(&all),
        [ids[2].as_str(), &ids[1], &ids[0]],
        "newest first"
    );

    let (_, enabled) = c.get("/v1/task-schedules?enabled=true").await;
    assert_eq!(tasks_of(&enabled), [ids[2].as_str(), &ids[0]]);
    let (_, paused) = c.get("/v1/task-schedules?enabled=false").await;
    assert_eq!(tasks_of(&paused), [ids[1].as_str()]);
    assert!(paused["data"][0].get("next_run_at").is_none());

    // Repeats collapse, blanks are ignored, filters AND together.
    let (_, some) = c
        .get(&format!(
            "/v1/task-schedules?task_id={0}&task_id={1}&task_id={0}&task_id=&enabled=true",
            ids[0], ids[1]
        ))
        .await;
    assert_eq!(tasks_of(&some), [ids[0].as_str()]);

    let (_, first) = c.get("/v1/task-schedules?limit=2").await;
    let first = support::page::<ScheduleRecord>(&first);
    assert!(first.has_more);
    let cursor = first.next_cursor.unwrap();
    let (_, second) = c
        .get(&format!("/v1/task-schedules?limit=2&cursor={cursor}"))
        .await;
    assert_eq!(tasks_of(&second), [ids[0].as_str()]);
    assert!(!support::page::<ScheduleRecord>(&second).has_more);
}

#[tokio::test]
async fn a_once_schedule_fires_once_even_when_overdue_then_disables_itself() {
    let app = TestApp::api_only().await;
    let c = &app.client;
    let run_at = now() + minutes(60);
    let (task_id, created) = scheduled_task(
        c,
        json!({ "kind": "once", "timezone": "Europe/Madrid", "run_at": run_at.to_rfc3339(),
                "enabled": true }),
    )
    .await;
    assert!(
        dispatch_due(&app.pool, &no_gates(), run_at - TimeDelta::seconds(1))
            .await
            .unwrap()
            .is_empty()
    );

    // The runtime was down for three days: it fires once, for its instant.
    let restart = run_at + TimeDelta::days(3);
    let fired = dispatch_due(&app.pool, &no_gates(), restart).await.unwrap();
    assert_eq!(fired.len(), 1, "{fired:?}");
    assert_eq!(fired[0].status.as_str(), "started");
    assert_eq!(fired[0].scheduled_for, run_at);
    let spent = schedule(c, &task_id).await;
    assert!(!spent.enabled);
    let sent = schedule_sent(c, &task_id).await;
    assert!(sent["data"].get("next_run_at").is_none(), "{sent}");
    assert_eq!(spent.revision, 2);
    let spent_by = transition(
        Some("enabled"),
        "disabled",
        "no time left to fire",
        "system",
    );
    assert_eq!(transitions_of(c, &created.id).await[1], spent_by);

    let run_id = fired[0].run_id.clone().unwrap();
    let run = c.run(&task_id, &run_id).await;
    assert_eq!(run.status, RunStatus::Queued);
    assert_eq!(run.schedule_id.as_ref(), Some(&created.id));
    assert_eq!(run.schedule_occurrence_id.as_ref(), Some(&fired[0].id));
    assert_eq!(run.scheduled_for, Some(run_at));
    let created_event = &c.events(&task_id, &run_id).await[0];
    assert_eq!(created_event.event_type, EventType::RunCreated);
    assert_eq!(
        created_event.data["schedule"]["schedule_id"],
        created.id.as_str()
    );

    cancel(&app.pool, &task_id, &run_id).await;
    assert!(
        dispatch_due(&app.pool, &no_gates(), restart + TimeDelta::days(1))
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(occurrences(c, &task_id).await.len(), 1);
    assert_eq!(runs_of(c, &task_id).await.len(), 1);

    // Re-arming the consumed instant is refused; a new future one is accepted.
    let again = |at: DateTime<Utc>| json!({ "kind": "once", "timezone": "UTC", "run_at": at.to_rfc3339(), "enabled": true });
    let (status, body) = put_schedule(c, &task_id, again(run_at)).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("new future run_at")
    );
    let action = body["error"]["operator_action"].as_str().unwrap();
    assert!(action.contains("keel schedules set"), "{body}");
    let (status, body) = put_schedule(c, &task_id, again(run_at + minutes(1))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

#[tokio::test]
async fn a_manual_run_has_no_schedule_provenance() {
    let app = TestApp::api_only().await;
    let (task_id, run_id) = app.client.run_shell("true").await;
    let run = app.client.run(&task_id, &run_id).await;
    assert_eq!(run.schedule_id, None, "{run:?}");
    assert_eq!(run.schedule_occurrence_id, None, "{run:?}");
    assert_eq!(run.scheduled_for, None, "{run:?}");
}

/// Three dispatchers, each with its own pool, step a shared simulated clock one minute at a
/// time through three hours of an every-minute cron. Every minute has exactly one
/// occurrence whatever the interleaving: started when the task is idle, skipped while its
/// previous run is still active (runs are cancelled every third minute).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_dispatchers_record_exactly_one_occurrence_per_minute() {
    const MINUTES: i64 = 180;
    let app = TestApp::api_only().await;
    let c = &app.client;
    let (task_id, created) = scheduled_task(c, every_minute()).await;
    let first = next_run(&created);
    let mut dispatchers = Vec::new();
    for _ in 0..3 {
        dispatchers.push(support::pool(&app.db_url).await);
    }
    let mut active: Option<String> = None;
    let mut started = 0;
    for minute in 0..MINUTES {
        let now = first + minutes(minute) + TimeDelta::seconds(minute % 7);
        let barrier = Arc::new(tokio::sync::Barrier::new(dispatchers.len()));
        let rounds: Vec<_> = dispatchers
            .iter()
            .map(|pool| {
                let (pool, barrier) = (pool.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    dispatch_due(&pool, &no_gates(), now).await.unwrap()
                })
            })
            .collect();
        let mut resolved = Vec::new();
        for round in rounds {
            resolved.extend(round.await.unwrap());
        }
        assert_eq!(resolved.len(), 1, "minute {minute}: {resolved:?}");
        let occurrence = &resolved[0];
        assert_eq!(occurrence.scheduled_for, first + minutes(minute));
        match &active {
            None => {
                assert_eq!(occurrence.status.as_str(), "started", "minute {minute}");
                active = occurrence.run_id.clone();
                started += 1;
            }
            Some(_) => {
                assert_eq!(occurrence.status.as_str(), "skipped", "minute {minute}");
                assert!(occurrence.error.as_deref().unwrap().contains("active run"));
            }
        }
        if minute % 3 == 2 {
            cancel(&app.pool, &task_id, &active.take().unwrap()).await;
        }
    }

    let recorded = occurrences(c, &task_id).await;
    assert_eq!(recorded.len() as i64, MINUTES);
    let times: HashSet<DateTime<Utc>> = recorded.iter().map(|o| o.scheduled_for).collect();
    assert_eq!(times.len() as i64, MINUTES, "one occurrence per minute");
    assert!(
        recorded
            .windows(2)
            .all(|w| w[0].scheduled_for > w[1].scheduled_for)
    );
    let runs = runs_of(c, &task_id).await;
    assert_eq!(runs.len(), started);
    let linked: HashSet<&str> = runs
        .iter()
        .map(|r| r.schedule_occurrence_id.as_deref().unwrap())
        .collect();
    assert_eq!(linked.len(), runs.len(), "no occurrence has two runs");
    assert_eq!(
        next_run(&schedule(c, &task_id).await),
        first + minutes(MINUTES)
    );
}

#[tokio::test]
async fn an_active_run_makes_the_occurrence_skipped_not_a_backlog() {
    let app = TestApp::api_only().await;
    let c = &app.client;
    let (task_id, created) = scheduled_task(c, every_minute()).await;
    let first = next_run(&created);
    let (status, manual) = c
        .post(&format!("/v1/tasks/{task_id}/start"), json!({}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{manual}");
    let manual_id = support::record::<RunRecord>(&manual).id;

    let skipped = dispatch_due(&app.pool, &no_gates(), first).await.unwrap();
    assert_eq!(skipped[0].status.as_str(), "skipped");
    assert_eq!(skipped[0].run_id, None);
    assert!(skipped[0].error.as_deref().unwrap().contains(&manual_id));
    assert!(skipped[0].completed_at.is_some());

    // A run waiting for approval is active too.
    sqlx::query("UPDATE runs SET status = 'awaiting_approval' WHERE id = $1")
        .bind(&manual_id)
        .execute(&app.pool)
        .await
        .unwrap();
    let skipped = dispatch_due(&app.pool, &no_gates(), first + minutes(1))
        .await
        .unwrap();
    assert_eq!(skipped[0].status.as_str(), "skipped");

    // Once the task is idle, the next time starts a run; the skipped ones are not replayed.
    cancel(&app.pool, &task_id, &manual_id).await;
    let started = dispatch_due(&app.pool, &no_gates(), first + minutes(2))
        .await
        .unwrap();
    assert_eq!(started.len(), 1);
    assert_eq!(started[0].status.as_str(), "started");
    assert_eq!(started[0].scheduled_for, first + minutes(2));
    assert_eq!(runs_of(c, &task_id).await.len(), 2);
    let statuses: Vec<OccurrenceStatus> = occurrences(c, &task_id)
        .await
        .iter()
        .map(|o| o.status)
        .collect();
    use OccurrenceStatus::{Skipped, Started};
    assert_eq!(statuses, [Started, Skipped, Skipped]);
}

#[tokio::test]
async fn missed_cron_times_coalesce_into_one_occurrence_without_backfill() {
    let app = TestApp::api_only().await;
    let c = &app.client;
    let (task_id, created) = scheduled_task(
        c,
        json!({ "kind": "cron", "timezone": "Europe/Madrid", "cron_expression": "*/10 * * * *",
                "enabled": true }),
    )
    .await;
    let first = next_run(&created);
    // Down for five hours and a bit: thirty-one times were missed.
    let restart = first + minutes(5 * 60 + 4);
    let fired = dispatch_due(&app.pool, &no_gates(), restart).await.unwrap();
    assert_eq!(fired.len(), 1, "{fired:?}");
    assert_eq!(fired[0].status.as_str(), "started");
    assert_eq!(
        fired[0].scheduled_for,
        first + minutes(5 * 60),
        "the latest missed time"
    );
    assert_eq!(
        next_run(&schedule(c, &task_id).await),
        first + minutes(5 * 60 + 10)
    );
    assert!(
        dispatch_due(&app.pool, &no_gates(), restart + minutes(1))
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(occurrences(c, &task_id).await.len(), 1);
    assert_eq!(runs_of(c, &task_id).await.len(), 1);
}

#[tokio::test]
async fn a_stale_claim_is_taken_over_and_its_late_dispatcher_changes_nothing() {
    let app = TestApp::api_only().await;
    let c = &app.client;
    let (task_id, created) = scheduled_task(c, every_minute()).await;
    let due = next_run(&created);

    // A dispatcher claims the occurrence and dies before resolving it.
    let mut tx = app.pool.begin().await.unwrap();
    let locked = schedules::lock_due(&mut tx, due, 10).await.unwrap();
    schedules::advance(&mut tx, &locked[0], Some(due + minutes(1)))
        .await
        .unwrap();
    let abandoned = schedules::claim(&mut tx, &locked[0], due, due)
        .await
        .unwrap()
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        occurrences(c, &task_id).await[0].status,
        OccurrenceStatus::Claimed
    );

    // Pause the schedule so only the claim is left to dispatch.
    let mut paused = every_minute();
    paused["enabled"] = json!(false);
    let (status, body) = put_schedule(c, &task_id, paused).await;
    assert_eq!(status, StatusCode::OK, "{body}");

    // A fresh claim is left to its holder.
    let early = due + STALE_CLAIM - TimeDelta::seconds(1);
    assert!(
        dispatch_due(&app.pool, &no_gates(), early)
            .await
            .unwrap()
            .is_empty()
    );

    let taken = dispatch_due(
        &app.pool,
        &no_gates(),
        due + STALE_CLAIM + TimeDelta::seconds(1),
    )
    .await
    .unwrap();
    assert_eq!(taken.len(), 1, "{taken:?}");
    assert_eq!(taken[0].id, abandoned.occurrence_id);
    assert_eq!(taken[0].status.as_str(), "started");
    assert_eq!(taken[0].scheduled_for, due);

    // The dead dispatcher's token no longer holds the occurrence.
    let mut tx = app.pool.begin().await.unwrap();
    assert!(!schedules::lock_claim(&mut tx, &abandoned).await.unwrap());
    tx.rollback().await.unwrap();
    assert_eq!(runs_of(c, &task_id).await.len(), 1);
}

#[tokio::test]
async fn an_edit_based_on_a_revision_a_dispatch_advanced_gets_409() {
    let app = TestApp::api_only().await;
    let c = &app.client;
    let (task_id, created) = scheduled_task(c, every_minute()).await;
    let read = created.revision;
    dispatch_due(&app.pool, &no_gates(), next_run(&created))
        .await
        .unwrap();

    let mut edit = every_minute();
    edit["cron_expression"] = json!("*/5 * * * *");
    edit["revision"] = json!(read);
    let (status, body) = put_schedule(c, &task_id, edit.clone()).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["type"], "conflict");
    // The hint names the command that reads the schedule as it is now.
    let action = body["error"]["operator_action"].as_str().unwrap();
    let show = format!("keel schedules show {task_id}");
    assert!(action.contains(&show), "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("reload"),
        "{body}"
    );
    assert_eq!(
        schedule(c, &task_id).await.cron_expression.as_deref(),
        Some("* * * * *")
    );

    let current = schedule(c, &task_id).await.revision;
    assert_eq!(current, read + 1);
    edit["revision"] = json!(current);
    let (status, body) = put_schedule(c, &task_id, edit).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let edited: ScheduleRecord = support::record(&body);
    assert_eq!(edited.revision, current + 1);
    assert_eq!(edited.cron_expression.as_deref(), Some("*/5 * * * *"));
    // The replacement kept the history.
    assert_eq!(occurrences(c, &task_id).await.len(), 1);
}

/// Edits and dispatches race many times; each edit carries the revision it read. Whatever
/// the interleaving, every edit either applies or gets 409, every revision bump is an
/// applied edit or a dispatch, and no time is recorded twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn edits_racing_dispatch_either_apply_or_conflict() {
    const ROUNDS: i64 = 40;
    let app = TestApp::api_only().await;
    let c = &app.client;
    let (task_id, created) = scheduled_task(c, every_minute()).await;
    let first = next_run(&created);
    let dispatcher = support::pool(&app.db_url).await;
    let (mut applied, mut refused, mut dispatched) = (0, 0, 0);
    for round in 0..ROUNDS {
        let read = schedule(c, &task_id).await.revision;
        let mut edit = every_minute();
        edit["revision"] = json!(read);
        let now = first + minutes(round);
        let pool = dispatcher.clone();
        let dispatch =
            tokio::spawn(async move { dispatch_due(&pool, &no_gates(), now).await.unwrap() });
        let (status, body) = put_schedule(c, &task_id, edit).await;
        match status {
            StatusCode::OK => applied += 1,
            StatusCode::CONFLICT => {
                assert!(
                    body["error"]["message"]
                        .as_str()
                        .unwrap()
                        .contains("reload")
                );
                refused += 1;
            }
            other => panic!("round {round}: {other} {body}"),
        }
        let resolved = dispatch.await.unwrap();
        dispatched += resolved.len() as i64;
        for occurrence in resolved {
            if let Some(run_id) = occurrence.run_id {
                cancel(&app.pool, &task_id, &run_id).await;
            }
        }
    }
    assert_eq!(applied + refused, ROUNDS);
    let revision = schedule(c, &task_id).await.revision;
    assert_eq!(revision, 1 + applied + dispatched);
    let recorded = occurrences(c, &task_id).await;
    assert_eq!(recorded.len() as i64, dispatched);
    let times: HashSet<DateTime<Utc>> = recorded.iter().map(|o| o.scheduled_for).collect();
    assert_eq!(times.len(), recorded.len());
}

#[tokio::test]
async fn deleting_the_task_deletes_its_schedule_and_occurrences() {
    let app = TestApp::api_only().await;
    let c = &app.client;
    let (task_id, created) = scheduled_task(c, every_minute()).await;
    let fired = dispatch_due(&app.pool, &no_gates(), next_run(&created))
        .await
        .unwrap();
    cancel(&app.pool, &task_id, fired[0].run_id.as_deref().unwrap()).await;
    let (status, body) = c.delete(&format!("/v1/tasks/{task_id}")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    for table in ["task_schedules", "schedule_occurrences"] {
        let left: i64 =
            sqlx::query_scalar(sqlx::AssertSqlSafe(format!("SELECT count(*) FROM {table}")))
                .fetch_one(&app.pool)
                .await
                .unwrap();
        assert_eq!(left, 0, "{table}");
    }
}

#[tokio::test]
async fn occurrences_list_newest_first_in_pages() {
    let app = TestApp::api_only().await;
    let c = &app.client;
    let (task_id, created) = scheduled_task(c, every_minute()).await;
    let first = next_run(&created);
    for minute in 0..5 {
        dispatch_due(&app.pool, &no_gates(), first + minutes(minute))
            .await
            .unwrap();
    }
    let mut seen = Vec::new();
    let mut path = format!("/v1/tasks/{task_id}/schedule/occurrences?limit=2");
    loop {
        let (status, page) = c.get(&path).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        let page = support::page::<OccurrenceRecord>(&page);
        seen.extend(page.data.iter().map(|o| o.scheduled_for));
        match page.next_cursor {
            Some(cursor) => {
                path = format!("/v1/tasks/{task_id}/schedule/occurrences?limit=2&cursor={cursor}")
            }
            None => break,
        }
    }
    let expected: Vec<DateTime<Utc>> = (0..5).rev().map(|m| first + minutes(m)).collect();
    assert_eq!(seen, expected);
}

/// The scheduler loop of a real worker fires a schedule on the wall clock and the run
/// executes like any other.
#[tokio::test]
async fn a_worker_fires_a_due_schedule_and_runs_it() {
    let app = TestApp::start().await;
    let c = &app.client;
    let run_at = now() + TimeDelta::seconds(5);
    let (task_id, _) = scheduled_task(
        c,
        json!({ "kind": "once", "timezone": "UTC", "run_at": run_at.to_rfc3339(),
                "enabled": true }),
    )
    .await;
    let run = wait_for(Duration::from_secs(30), "the scheduled run", || async {
        runs_of(c, &task_id).await.first().cloned()
    })
    .await;
    let run = c
        .wait_terminal(&task_id, &run.id, Duration::from_secs(30))
        .await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    assert_eq!(run.scheduled_for, Some(run_at));
    assert_eq!(
        occurrences(c, &task_id).await[0].status,
        OccurrenceStatus::Started
    );
}

/// Three real `keel worker` processes dispatch on one database: thirty `once` schedules
/// due at the same instant each fire exactly once (one occurrence, one run, run to its
/// end), whichever process claims them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_worker_processes_fire_each_due_schedule_exactly_once() {
    const TASKS: usize = 30;
    let app = TestApp::api_only().await;
    let c = &app.client;
    let run_at = now() + TimeDelta::seconds(3);
    let once = json!({ "kind": "once", "timezone": "UTC", "run_at": run_at.to_rfc3339(),
                       "enabled": true });
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        tasks.push(scheduled_task(c, once.clone()).await.0);
    }
    let logs = tempfile::tempdir().unwrap();
    let _workers: Vec<_> = (0..3)
        .map(|i| {
            let name = format!("worker{i}");
            let (db, data) = (&app.db_url, app.data_dir.path());
            let env = [("KEEL_APPROVAL_POLICIES", "none")];
            support::spawn_worker_with_env(db, logs.path(), &name, 5_000, data, &env)
        })
        .collect();

    for task_id in &tasks {
        let run = wait_for(Duration::from_secs(60), "the scheduled run", || async {
            runs_of(c, task_id).await.first().cloned()
        })
        .await;
        let run = c
            .wait_terminal(task_id, &run.id, Duration::from_secs(60))
            .await;
        assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    }
    // Every schedule is spent, so nothing more can fire: the counts are final.
    for task_id in &tasks {
        assert!(!schedule(c, task_id).await.enabled);
        let fired = occurrences(c, task_id).await;
        assert_eq!(fired.len(), 1, "{fired:?}");
        assert_eq!(fired[0].status, OccurrenceStatus::Started);
        assert_eq!(runs_of(c, task_id).await.len(), 1);
    }
}
