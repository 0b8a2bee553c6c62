//! The queue protocol itself: claims, leases, fencing, nack and reclaim, driven through
//! the same functions workers use, with time moved by SQL instead of sleeps.

use crate::support;

use std::time::Duration;

use keel::domain::Scope;
use keel::queue::{self, Disposition, Positions, QueueError};
use keel_client::{EventType, RunStatus};

use sqlx::PgPool;

const LEASE: Duration = Duration::from_secs(30);
const KIND: &str = "test";

/// The queue's own connections, as a worker has them, on the test's database.
fn q(pool: &PgPool) -> queue::QueuePool {
    queue::QueuePool::new(pool, 1)
}

fn kinds() -> Vec<String> {
    vec![KIND.to_string()]
}

async fn enqueue(pool: &PgPool, ref_id: &str, priority: i32) {
    let mut conn = pool.acquire().await.unwrap();
    queue::enqueue(&mut conn, &Scope::local(), KIND, ref_id, priority)
        .await
        .unwrap();
}

async fn expire_all(pool: &PgPool) {
    sqlx::query("UPDATE queue_jobs SET lease_expires_at = now() - interval '1 second' WHERE lease_owner IS NOT NULL")
        .execute(pool)
        .await
        .unwrap();
}

#[tokio::test]
async fn enqueue_is_idempotent_and_claims_follow_priority() {
    let pool = support::pool(&support::fresh_database().await).await;
    enqueue(&pool, "low", 0).await;
    enqueue(&pool, "high", 5).await;
    enqueue(&pool, "low", 0).await;
    let first = queue::claim(&q(&pool), "a", &kinds(), 1, LEASE)
        .await
        .unwrap();
    let second = queue::claim(&q(&pool), "a", &kinds(), 10, LEASE)
        .await
        .unwrap();
    assert_eq!(first[0].ref_id, "high");
    assert_eq!(second.len(), 1, "one row per (kind, ref_id)");
    assert_eq!(second[0].ref_id, "low");
    assert!(
        first
            .iter()
            .chain(&second)
            .all(|l| l.fencing_token == 1 && l.attempts == 1)
    );
    // Leased jobs are not claimed again while their lease is live.
    assert!(
        queue::claim(&q(&pool), "b", &kinds(), 10, LEASE)
            .await
            .unwrap()
            .is_empty()
    );
    // Other kinds are not claimed.
    enqueue(&pool, "x", 0).await;
    assert!(
        queue::claim(&q(&pool), "b", &["other".to_string()], 10, LEASE)
            .await
            .unwrap()
            .is_empty()
    );
}

/// The next notification on the queue's wake channel (its payload is the job's kind),
/// within a bound.
async fn next_wake(listener: &mut sqlx::postgres::PgListener) -> String {
    let notification = tokio::time::timeout(Duration::from_secs(10), listener.recv())
        .await
        .expect("a wake within 10 s")
        .unwrap();
    notification.payload().to_string()
}

#[tokio::test]
async fn an_enqueue_behind_a_waiting_job_of_its_kind_wakes_no_one() {
    let pool = support::pool(&support::fresh_database().await).await;
    let mut listener = sqlx::postgres::PgListener::connect_with(&pool)
        .await
        .unwrap();
    listener.listen(queue::JOBS_CHANNEL).await.unwrap();
    let enqueue_kind = |kind: &'static str, ref_id: &'static str| {
        let pool = pool.clone();
        async move {
            let mut conn = pool.acquire().await.unwrap();
            queue::enqueue(&mut conn, &Scope::local(), kind, ref_id, 0)
                .await
                .unwrap();
        }
    };
    enqueue_kind(KIND, "first").await;
    enqueue_kind(KIND, "behind").await;
    // A wake of another kind as a marker: notifications arrive in commit order, so had the
    // second job woken the workers, its wake would come before this one.
    enqueue_kind("other", "marker").await;
    assert_eq!(next_wake(&mut listener).await, KIND);
    assert_eq!(next_wake(&mut listener).await, "other");
    // Another workspace's job is not held up behind this one's (a fair claim may leave
    // a workspace's jobs waiting at its limit): it wakes the workers.
    let mut conn = pool.acquire().await.unwrap();
    queue::enqueue(&mut conn, &Scope::new("ws_other"), KIND, "elsewhere", 0)
        .await
        .unwrap();
    assert_eq!(next_wake(&mut listener).await, KIND);
    // Once the waiting jobs are claimed, the next job wakes the workers again.
    let claimed = queue::claim(&q(&pool), "a", &kinds(), 10, LEASE)
        .await
        .unwrap();
    assert_eq!(claimed.len(), 3);
    enqueue_kind(KIND, "after").await;
    assert_eq!(next_wake(&mut listener).await, KIND);
}

#[tokio::test]
async fn a_stale_lease_holder_is_fenced_out_after_a_takeover() {
    let pool = support::pool(&support::fresh_database().await).await;
    enqueue(&pool, "job", 0).await;
    let a = queue::claim(&q(&pool), "worker-a", &kinds(), 1, LEASE)
        .await
        .unwrap()
        .remove(0);
    assert_eq!(
        queue::heartbeat(
            &mut pool.acquire().await.unwrap(),
            "worker-a",
            &[(a.job_id, a.fencing_token)],
            LEASE
        )
        .await
        .unwrap(),
        [a.job_id]
    );

    expire_all(&pool).await;
    let b = queue::claim(&q(&pool), "worker-b", &kinds(), 1, LEASE)
        .await
        .unwrap()
        .remove(0);
    assert_eq!(b.job_id, a.job_id);
    assert_eq!(b.fencing_token, a.fencing_token + 1);
    assert_eq!(b.attempts, 2);

    // Every write of the old holder is refused.
    assert!(
        queue::heartbeat(
            &mut pool.acquire().await.unwrap(),
            "worker-a",
            &[(a.job_id, a.fencing_token)],
            LEASE
        )
        .await
        .unwrap()
        .is_empty()
    );
    assert!(matches!(
        queue::begin_fenced(&pool, &a).await,
        Err(QueueError::LeaseLost)
    ));
    let mut conn = pool.acquire().await.unwrap();
    assert!(matches!(
        queue::settle(&mut conn, &a, Disposition::Complete).await,
        Err(QueueError::LeaseLost)
    ));
    let stale = Disposition::Retry {
        error: "stale".into(),
        delay: Duration::ZERO,
    };
    assert!(matches!(
        queue::settle(&mut conn, &a, stale).await,
        Err(QueueError::LeaseLost)
    ));
    // The new holder's are not.
    let mut tx = queue::begin_fenced(&pool, &b).await.unwrap();
    queue::settle(&mut tx, &b, Disposition::Complete)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM queue_jobs")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(left, 0);
}

#[tokio::test]
async fn nack_delays_the_job_and_shutdown_release_costs_no_attempt() {
    let pool = support::pool(&support::fresh_database().await).await;
    enqueue(&pool, "job", 0).await;
    let first = queue::claim(&q(&pool), "a", &kinds(), 1, LEASE)
        .await
        .unwrap()
        .remove(0);
    let mut conn = pool.acquire().await.unwrap();
    let boom = Disposition::Retry {
        error: "boom".into(),
        delay: queue::backoff(first.attempts),
    };
    queue::settle(&mut conn, &first, boom).await.unwrap();
    let (error, waits): (String, bool) =
        sqlx::query_as("SELECT last_error, run_after > now() FROM queue_jobs")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(error, "boom");
    assert!(waits, "a nacked job waits for its backoff");
    assert!(
        queue::claim(&q(&pool), "b", &kinds(), 1, LEASE)
            .await
            .unwrap()
            .is_empty()
    );

    sqlx::query("UPDATE queue_jobs SET run_after = now()")
        .execute(&pool)
        .await
        .unwrap();
    let second = queue::claim(&q(&pool), "b", &kinds(), 1, LEASE)
        .await
        .unwrap()
        .remove(0);
    assert_eq!(second.attempts, 2);
    queue::settle(&mut conn, &second, Disposition::Release)
        .await
        .unwrap();
    let third = queue::claim(&q(&pool), "c", &kinds(), 1, LEASE)
        .await
        .unwrap()
        .remove(0);
    assert_eq!(
        third.attempts, 2,
        "a release without penalty gives the attempt back"
    );
}

#[tokio::test]
async fn the_reconciler_requeues_a_run_whose_lease_expired() {
    let app = support::TestApp::api_only().await;
    let (task_id, run_id) = app.client.run_shell("true").await;
    // Play a worker that claimed and started the run, then vanished.
    let lease = queue::claim(&q(&app.pool), "wrk_gone", &["run".to_string()], 1, LEASE)
        .await
        .unwrap()
        .remove(0);
    sqlx::query("UPDATE runs SET status = 'running', attempt = 1, worker_id = 'wrk_gone', started_at = now() WHERE id = $1")
        .bind(&run_id)
        .execute(&app.pool)
        .await
        .unwrap();
    assert_eq!(
        keel::maintenance::Reconciler::default()
            .pass(&app.pool)
            .await
            .unwrap(),
        0,
        "a live lease is left alone"
    );
    expire_all(&app.pool).await;
    assert_eq!(
        keel::maintenance::Reconciler::default()
            .pass(&app.pool)
            .await
            .unwrap(),
        1
    );

    let run = app.client.run(&task_id, &run_id).await;
    assert_eq!(run.status, RunStatus::Queued);
    let events = app.client.events(&task_id, &run_id).await;
    let gap = events
        .iter()
        .find(|e| e.event_type == EventType::GapRunDisconnected)
        .expect("a gap event");
    assert_eq!(gap.data["reason"], "worker_lease_expired");
    assert_eq!(gap.data["previous_worker_id"], "wrk_gone");
    assert_eq!(events.last().unwrap().event_type, EventType::RunQueued);
    let (owner, token): (Option<String>, i64) =
        sqlx::query_as("SELECT lease_owner, fencing_token FROM queue_jobs")
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!(owner, None);
    assert!(matches!(
        queue::begin_fenced(&app.pool, &lease).await,
        Err(QueueError::LeaseLost)
    ));
    assert_eq!(token, lease.fencing_token);
}

#[tokio::test]
async fn boot_recovery_re_enqueues_runs_that_lost_their_queue_row() {
    let app = support::TestApp::api_only().await;
    let mut runs = Vec::new();
    for _ in 0..3 {
        runs.push(app.client.run_shell("true").await);
    }
    sqlx::query("DELETE FROM queue_jobs")
        .execute(&app.pool)
        .await
        .unwrap();
    assert_eq!(keel::maintenance::recover(&app.pool).await.unwrap(), 3);
    assert_eq!(
        keel::maintenance::recover(&app.pool).await.unwrap(),
        0,
        "recovery is idempotent"
    );
    let jobs: i64 = sqlx::query_scalar("SELECT count(*) FROM queue_jobs")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(jobs, 3);
}

#[tokio::test]
async fn a_batched_ack_is_fenced_row_by_row() {
    let pool = support::pool(&support::fresh_database().await).await;
    enqueue(&pool, "kept", 0).await;
    enqueue(&pool, "taken", 0).await;
    let held = queue::claim(&q(&pool), "worker-a", &kinds(), 2, LEASE)
        .await
        .unwrap();
    let taken = held.iter().find(|l| l.ref_id == "taken").unwrap();
    sqlx::query(
        "UPDATE queue_jobs SET lease_expires_at = now() - interval '1 second' WHERE id = $1",
    )
    .bind(taken.job_id)
    .execute(&pool)
    .await
    .unwrap();
    let takeover = queue::claim(&q(&pool), "worker-b", &kinds(), 1, LEASE)
        .await
        .unwrap();
    assert_eq!(takeover[0].job_id, taken.job_id);

    let settlements: Vec<queue::Settlement> = held
        .iter()
        .map(|l| queue::Settlement::of(l, queue::Disposition::Complete))
        .collect();
    let acked = queue::settle_many(&q(&pool), "worker-a", &settlements)
        .await
        .unwrap();
    let kept = held.iter().find(|l| l.ref_id == "kept").unwrap();
    assert_eq!(acked, [kept.job_id], "only the lease still held is acked");
    let left: Vec<String> = sqlx::query_scalar("SELECT ref_id FROM queue_jobs")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(
        left,
        ["taken"],
        "the job taken over stays with its new holder"
    );
}

/// A database where job "first" was claimed (the positions returned reached it) and job
/// "late" then became due with a `run_after` `behind` the position.
async fn claimed_one_then_late_by(behind: &str) -> (PgPool, Positions) {
    let pool = support::pool(&support::fresh_database().await).await;
    enqueue(&pool, "first", 0).await;
    let first = queue::claim(&q(&pool), "a", &kinds(), 1, LEASE)
        .await
        .unwrap()
        .remove(0);
    let mut from = Positions::default();
    from.advance(&first);
    enqueue(&pool, "late", 0).await;
    sqlx::query("UPDATE queue_jobs SET run_after = $1 - $2::interval WHERE ref_id = 'late'")
        .bind(first.run_after)
        .bind(behind)
        .execute(&pool)
        .await
        .unwrap();
    (pool, from)
}

#[tokio::test]
async fn a_positioned_claim_reads_on_from_its_positions_and_every_other_priority_from_its_head() {
    // Behind the position (by more than the slack): only a full claim finds it.
    let (pool, from) = claimed_one_then_late_by("1 minute").await;
    for (name, priority) in [("second", 0), ("urgent", 9), ("someday", -3)] {
        enqueue(&pool, name, priority).await;
    }
    let next = queue::claim_from(
        &q(&pool),
        "a",
        KIND,
        &from,
        queue::LATE_COMMIT_SLACK,
        10,
        LEASE,
    )
    .await
    .unwrap();
    let names: Vec<&str> = next.iter().map(|l| l.ref_id.as_str()).collect();
    assert_eq!(
        names,
        ["urgent", "second", "someday"],
        "in claim order: higher and lower priorities from their head, its own from its position"
    );
    let rest = queue::claim(&q(&pool), "a", &kinds(), 10, LEASE)
        .await
        .unwrap();
    assert_eq!(rest[0].ref_id, "late");
}

#[tokio::test]
async fn a_commit_later_than_the_short_slack_waits_for_the_wide_read() {
    // Committed as if its transaction had begun 200 ms before the position.
    let (pool, from) = claimed_one_then_late_by("200 milliseconds").await;
    let queue = q(&pool);
    let claim = |slack| queue::claim_from(&queue, "a", KIND, &from, slack, 10, LEASE);
    assert!(claim(queue::COMMIT_SLACK).await.unwrap().is_empty());
    let wide = claim(queue::LATE_COMMIT_SLACK).await.unwrap();
    assert_eq!(wide.len(), 1);
    assert_eq!(wide[0].ref_id, "late");
}

#[tokio::test]
async fn an_expiry_scan_from_a_time_reads_only_the_leases_that_expired_since() {
    let pool = support::pool(&support::fresh_database().await).await;
    enqueue(&pool, "long-ago", 0).await;
    enqueue(&pool, "just-now", 0).await;
    queue::claim(&q(&pool), "a", &kinds(), 2, LEASE)
        .await
        .unwrap();
    sqlx::query(
        "UPDATE queue_jobs SET lease_expires_at = now() - CASE ref_id
             WHEN 'long-ago' THEN interval '1 hour' ELSE interval '1 second' END",
    )
    .execute(&pool)
    .await
    .unwrap();
    let mut conn = pool.acquire().await.unwrap();
    let since: chrono::DateTime<chrono::Utc> =
        sqlx::query_scalar("SELECT now() - interval '1 minute'")
            .fetch_one(&mut *conn)
            .await
            .unwrap();
    let names =
        |leases: Vec<queue::Lease>| leases.into_iter().map(|l| l.ref_id).collect::<Vec<_>>();
    let windowed = queue::expired(&mut conn, 10, Some(since)).await.unwrap();
    assert_eq!(names(windowed), ["just-now"]);
    let full = queue::expired(&mut conn, 10, None).await.unwrap();
    assert_eq!(names(full), ["long-ago", "just-now"]);
}

/// Rows and index entries read from queue_jobs so far. Both pools must have one
/// connection: a backend publishes what it read only at its next flush, forced here.
async fn rows_read(pool: &PgPool, queue: &queue::QueuePool) -> i64 {
    for pool in [pool, queue.pool()] {
        sqlx::query("SELECT pg_stat_force_next_flush()")
            .execute(pool)
            .await
            .unwrap();
    }
    sqlx::query_scalar(
        "SELECT (SELECT seq_tup_read + idx_tup_fetch FROM pg_stat_user_tables
                 WHERE relname = 'queue_jobs')
              + (SELECT sum(idx_tup_read) FROM pg_stat_user_indexes WHERE relname = 'queue_jobs')
                    ::bigint",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn claims_read_in_index_order_whatever_the_statistics_say() {
    let pool = keel::db::connect(&support::fresh_database().await, 1, "test")
        .await
        .unwrap();
    let ids = |prefix: &str, n| (0..n).map(|i| format!("{prefix}-{i}")).collect::<Vec<_>>();
    let mut conn = pool.acquire().await.unwrap();
    sqlx::query("ALTER TABLE queue_jobs SET (autovacuum_enabled = false)")
        .execute(&mut *conn)
        .await
        .unwrap();
    // Statistics from an ANALYZE that found mostly dead rows, as one does while an old
    // snapshot is held: a table of 100 rows, where 5000 more are due by the claim.
    for (prefix, n) in [("early", 100), ("gone", 20_000)] {
        insert_due(&mut conn, &ids(prefix, n)).await;
    }
    sqlx::raw_sql("DELETE FROM queue_jobs WHERE ref_id LIKE 'gone-%'; ANALYZE queue_jobs")
        .execute(&mut *conn)
        .await
        .unwrap();
    insert_due(&mut conn, &ids("due", 5000)).await;
    drop(conn);

    let queue = q(&pool);
    let before = rows_read(&pool, &queue).await;
    let claimed = queue::claim(&queue, "a", &kinds(), 10, LEASE)
        .await
        .unwrap();
    let full = rows_read(&pool, &queue).await - before;
    let positioned = queue::claim_from(
        &queue,
        "a",
        KIND,
        &Positions::default(),
        queue::LATE_COMMIT_SLACK,
        10,
        LEASE,
    )
    .await
    .unwrap();
    let from_head = rows_read(&pool, &queue).await - before - full;
    assert_eq!((claimed.len(), positioned.len()), (10, 10));
    // Each claim reads ten due entries and leases ten rows by their key: read in order, it
    // stops at its limit. Planned by those statistics, it scanned the heap and sorted
    // everything due.
    assert!(
        full < 100 && from_head < 100,
        "claims of 10 jobs read {full} and {from_head} rows and index entries"
    );
}

/// Jobs of the test kind, due now, many to a statement (the queue enqueues one at a time).
async fn insert_due(conn: &mut sqlx::PgConnection, ref_ids: &[String]) {
    sqlx::query(
        "INSERT INTO queue_jobs (kind, ref_id, workspace_id)
         SELECT $1, ref_id, 'default' FROM unnest($2::text[]) AS r(ref_id)",
    )
    .bind(KIND)
    .bind(ref_ids)
    .execute(conn)
    .await
    .unwrap();
}
