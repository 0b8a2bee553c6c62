//! Schedule rows and their occurrences: the definition a client writes (checked against the
//! revision it read), and the steps dispatch takes: lock due schedules, claim an occurrence
//! and advance, take over stale claims, resolve a claim.
//!
//! Lock order, shared with run admission and task deletion: task row, then schedule row,
//! then occurrence row. The two dispatch steps that start elsewhere (locking due schedules,
//! taking over stale claims) use `SKIP LOCKED` and never wait, so they cannot deadlock.

use chrono::{DateTime, Utc};
use sqlx::PgConnection;

use crate::db::{Result, StoreError};
use crate::domain::{Actor, Scope, new_id};
use crate::events::transitions;
use crate::events::transitions::Transition;
use crate::schedules::{NewSchedule, Schedule, Trigger};
use crate::tasks;

use keel_api_types::OccurrenceStatus;
pub(crate) use keel_api_types::{OccurrenceRecord, ScheduleRecord};

/// `query_as!` of [`ScheduleRecord`]s: `$before` (up to its `SELECT` or `RETURNING`), then
/// the schedule's columns, then `$after` (its `FROM …`, or nothing).
macro_rules! query_schedules {
    ($before:literal, $after:literal $(, $arg:expr)* $(,)?) => {
        sqlx::query_as!(
            ScheduleRecord,
            $before
                + " id, task_id, kind, timezone, run_at, cron_expression, enabled, next_run_at,
                   revision, written_by, created_at, updated_at, workspace_id "
                + $after
            $(, $arg)*
        )
    };
}

/// `query_as!` of [`OccurrenceRecord`]s: `$before` (up to its `SELECT` or `RETURNING`), then
/// the occurrence's columns (`status` as an [`OccurrenceStatus`]), then `$after` (its
/// `FROM …`, or nothing).
macro_rules! query_occurrences {
    ($before:literal, $after:literal $(, $arg:expr)* $(,)?) => {
        sqlx::query_as!(
            OccurrenceRecord,
            $before
                + r#" id, task_id, schedule_id, scheduled_for,
                      status AS "status: OccurrenceStatus", claimed_at, run_id, error,
                      completed_at "#
                + $after
            $(, $arg)*
        )
    };
}

/// `query_as!` of [`Claim`]s: `$before` (a statement on occurrences up to its `SELECT` or
/// `RETURNING`), then the columns of a claimed occurrence, then `$after` (its `FROM …`, or
/// nothing).
macro_rules! query_claims {
    ($before:literal, $after:literal $(, $arg:expr)* $(,)?) => {
        sqlx::query_as!(
            Claim,
            $before
                + r#" id AS occurrence_id, schedule_id, task_id, scheduled_for,
                      claim_token AS "token!", workspace_id "#
                + $after
            $(, $arg)*
        )
    };
}

/// What the dispatcher reads off a stored schedule.
pub(crate) trait ScheduleRecordExt {
    /// The schedule's workspace, for the dispatcher's writes on its behalf.
    fn scope(&self) -> Scope;
    fn definition(&self) -> Result<Schedule, crate::domain::Invalid>;
}

impl ScheduleRecordExt for ScheduleRecord {
    fn scope(&self) -> Scope {
        Scope::new(self.workspace_id.clone())
    }

    fn definition(&self) -> Result<Schedule, crate::domain::Invalid> {
        Schedule::from_stored(&self.timezone, self.run_at, self.cron_expression.as_deref())
    }
}

/// An occurrence this dispatcher holds: only the holder of `token` may resolve it.
#[derive(Debug, Clone)]
pub struct Claim {
    pub occurrence_id: String,
    pub(crate) schedule_id: String,
    pub(crate) task_id: String,
    pub(crate) scheduled_for: DateTime<Utc>,
    pub(crate) token: String,
    pub(crate) workspace_id: String,
}

impl Claim {
    /// The workspace of the claimed occurrence's schedule and task.
    pub(crate) fn scope(&self) -> Scope {
        Scope::new(self.workspace_id.clone())
    }
}

/// How a claimed occurrence ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    Started {
        run_id: String,
    },
    /// Another run of the task was active; there is no backlog.
    Skipped {
        reason: String,
    },
    /// The run could not be created.
    Failed {
        reason: String,
    },
}

pub async fn get(conn: &mut PgConnection, scope: &Scope, task_id: &str) -> Result<ScheduleRecord> {
    let schedule = query_schedules!(
        "SELECT",
        "FROM task_schedules WHERE workspace_id = $1 AND task_id = $2",
        scope.workspace(),
        task_id,
    )
    .fetch_optional(&mut *conn)
    .await?;
    match schedule {
        Some(schedule) => Ok(schedule),
        None => Err(missing(conn, scope, task_id).await),
    }
}

/// A missing schedule, told apart from a missing task.
async fn missing(conn: &mut PgConnection, scope: &Scope, task_id: &str) -> StoreError {
    let task = sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM tasks WHERE workspace_id = $1 AND id = $2) AS "exists!""#,
        scope.workspace(),
        task_id,
    )
    .fetch_one(conn)
    .await;
    match task {
        Ok(true) => StoreError::NotFound("schedule"),
        Ok(false) => StoreError::NotFound("task"),
        Err(error) => error.into(),
    }
}

/// What `GET /v1/task-schedules` filters on; an empty `task_ids` matches every task.
#[derive(Debug, Clone, Default)]
pub struct ScheduleFilter {
    pub(crate) task_ids: Vec<String>,
    pub(crate) enabled: Option<bool>,
}

/// Newest first; `before` is the id of the last schedule of the previous page.
pub async fn list(
    conn: &mut PgConnection,
    scope: &Scope,
    filter: &ScheduleFilter,
    before: Option<&str>,
    limit: i64,
) -> Result<Vec<ScheduleRecord>> {
    let rows = query_schedules!(
        "SELECT",
        "FROM task_schedules
         WHERE workspace_id = $5 AND (cardinality($1::text[]) = 0 OR task_id = ANY($1))
           AND ($2::boolean IS NULL OR enabled = $2)
           AND ($3::text IS NULL OR id < $3)
         ORDER BY id DESC LIMIT $4",
        &filter.task_ids,
        filter.enabled,
        before,
        limit,
        scope.workspace(),
    )
    .fetch_all(conn)
    .await?;
    Ok(rows)
}

/// Creates or replaces the task's schedule as `actor` writes it. A replacement keeps the
/// id, `created_at` and the occurrence history and bumps the revision; either way `actor`
/// becomes the schedule's writer, the requester of the runs it starts from now on. When the
/// client says which revision it read and the schedule has moved on since (an edit, or a
/// dispatch that advanced it), the edit is refused rather than applied over a state the
/// client never saw.
pub async fn put(
    conn: &mut PgConnection,
    scope: &Scope,
    task_id: &str,
    new: &NewSchedule,
    now: DateTime<Utc>,
    actor: &Actor,
) -> Result<ScheduleRecord> {
    tasks::lock(conn, scope, task_id).await?;
    let current = sqlx::query!(
        "SELECT id, revision, enabled FROM task_schedules
         WHERE workspace_id = $1 AND task_id = $2 FOR UPDATE",
        scope.workspace(),
        task_id,
    )
    .fetch_optional(&mut *conn)
    .await?
    .map(|row| (row.id, row.revision, row.enabled));
    check_revision(
        task_id,
        current.as_ref().map(|c| c.1),
        new.expected_revision,
    )?;
    if let (Some((schedule_id, ..)), Trigger::Once { run_at }) = (&current, &new.schedule.trigger) {
        refuse_consumed_instant(conn, scope, schedule_id, *run_at).await?;
    }
    let (run_at, cron_expression) = match &new.schedule.trigger {
        Trigger::Once { run_at } => (Some(*run_at), None),
        Trigger::Cron { expression, .. } => (None, Some(expression.as_str())),
    };
    let next_run_at = new.next_run_at(now);
    let schedule = query_schedules!(
        "INSERT INTO task_schedules (id, task_id, kind, timezone, run_at, cron_expression,
                                     enabled, next_run_at, workspace_id, written_by)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
         ON CONFLICT (task_id) DO UPDATE SET
             kind = EXCLUDED.kind, timezone = EXCLUDED.timezone, run_at = EXCLUDED.run_at,
             cron_expression = EXCLUDED.cron_expression, enabled = EXCLUDED.enabled,
             next_run_at = EXCLUDED.next_run_at, revision = task_schedules.revision + 1,
             written_by = EXCLUDED.written_by, updated_at = now()
         RETURNING",
        "",
        new_id("sched"),
        task_id,
        new.schedule.kind(),
        new.schedule.timezone.name(),
        run_at,
        cron_expression,
        next_run_at.is_some(),
        next_run_at,
        scope.workspace(),
        actor.to_string(),
    )
    .fetch_one(&mut *conn)
    .await?;
    let was = current.map(|c| state(c.2));
    let (is, reason) = (
        state(schedule.enabled),
        if was.is_some() { "replaced" } else { "created" },
    );
    if was != Some(is) {
        record(conn, scope, &schedule, was, is, reason, actor).await?;
    }
    Ok(schedule)
}

/// A schedule's state in the audit trail: `enabled` or `disabled` (paused, or spent), and
/// `deleted` at the end.
fn state(enabled: bool) -> &'static str {
    if enabled { "enabled" } else { "disabled" }
}

async fn record(
    conn: &mut PgConnection,
    scope: &Scope,
    schedule: &ScheduleRecord,
    from: Option<&str>,
    to: &str,
    reason: &str,
    actor: &Actor,
) -> Result<()> {
    let change = Transition {
        entity_type: "schedule",
        entity_id: &schedule.id,
        task_id: Some(&schedule.task_id),
        from,
        to,
        reason: Some(reason),
    };
    transitions::record(conn, scope, change, actor).await
}

fn check_revision(task_id: &str, current: Option<i64>, expected: Option<i64>) -> Result<()> {
    let reload =
        format!("reload it (GET /v1/tasks/{task_id}/schedule) and apply your change again");
    let next = format!(
        "Read the schedule as it is now (keel schedules show {task_id}), then set it again \
         with its revision."
    );
    match (current, expected) {
        (_, None) => Ok(()),
        (Some(current), Some(expected)) if current == expected => Ok(()),
        (Some(current), Some(expected)) => Err(StoreError::conflict_next(
            format!(
                "the schedule changed since revision {expected} was read (it is at revision \
                 {current} now): {reload}"
            ),
            next,
        )),
        (None, Some(expected)) => Err(StoreError::conflict_next(
            format!("the schedule read at revision {expected} no longer exists: {reload}"),
            next,
        )),
    }
}

/// A `once` schedule whose instant already fired cannot be armed again for that instant:
/// the occurrence exists, so it would never fire. This catches a replacement racing the
/// dispatch that consumed it.
async fn refuse_consumed_instant(
    conn: &mut PgConnection,
    scope: &Scope,
    schedule_id: &str,
    run_at: DateTime<Utc>,
) -> Result<()> {
    let fired = sqlx::query_scalar!(
        r#"SELECT EXISTS (SELECT 1 FROM schedule_occurrences
                          WHERE workspace_id = $3 AND schedule_id = $1 AND scheduled_for = $2)
                  AS "exists!""#,
        schedule_id,
        run_at,
        scope.workspace(),
    )
    .fetch_one(conn)
    .await?;
    if fired {
        return Err(StoreError::conflict_next(
            format!(
                "the schedule already fired for run_at {}; reload it and choose a new future \
                 run_at",
                run_at.to_rfc3339()
            ),
            "Set the schedule with a later time (keel schedules set TASK_ID --at RFC3339).",
        ));
    }
    Ok(())
}

/// Removes the task's schedule and its occurrence history.
pub async fn delete(
    conn: &mut PgConnection,
    scope: &Scope,
    task_id: &str,
    actor: &Actor,
) -> Result<()> {
    tasks::lock(conn, scope, task_id).await?;
    let deleted = query_schedules!(
        "DELETE FROM task_schedules WHERE workspace_id = $1 AND task_id = $2 RETURNING",
        "",
        scope.workspace(),
        task_id,
    )
    .fetch_optional(&mut *conn)
    .await?;
    let deleted = deleted.ok_or(StoreError::NotFound("schedule"))?;
    let was = state(deleted.enabled);
    record(
        conn,
        scope,
        &deleted,
        Some(was),
        "deleted",
        "deleted",
        actor,
    )
    .await
}

/// The task's occurrences, newest first; `before` is the `scheduled_for` of the last
/// occurrence of the previous page.
pub async fn occurrences(
    conn: &mut PgConnection,
    scope: &Scope,
    task_id: &str,
    before: Option<DateTime<Utc>>,
    limit: i64,
) -> Result<Vec<OccurrenceRecord>> {
    let schedule = get(conn, scope, task_id).await?;
    let rows = query_occurrences!(
        "SELECT",
        "FROM schedule_occurrences
         WHERE workspace_id = $4 AND schedule_id = $1
           AND ($2::timestamptz IS NULL OR scheduled_for < $2)
         ORDER BY scheduled_for DESC LIMIT $3",
        &schedule.id,
        before,
        limit,
        scope.workspace(),
    )
    .fetch_all(conn)
    .await?;
    Ok(rows)
}

/// Locks up to `limit` schedules due at `now`, in every workspace (dispatch serves them
/// all; each record carries its workspace), skipping those another dispatcher (or an
/// edit) holds: they are being handled.
pub async fn lock_due(
    conn: &mut PgConnection,
    now: DateTime<Utc>,
    limit: i64,
) -> Result<Vec<ScheduleRecord>> {
    let rows = query_schedules!(
        "SELECT",
        "FROM task_schedules
         WHERE enabled AND next_run_at <= $1
         ORDER BY next_run_at LIMIT $2
         FOR UPDATE SKIP LOCKED",
        now,
        limit,
    )
    .fetch_all(conn)
    .await?;
    Ok(rows)
}

/// Moves a locked schedule to its next time (`None`: spent, so disabled), fenced by the
/// revision it was read at, and bumps the revision so an edit based on the old state fails.
pub async fn advance(
    conn: &mut PgConnection,
    schedule: &ScheduleRecord,
    next_run_at: Option<DateTime<Utc>>,
) -> Result<()> {
    let updated = sqlx::query!(
        "UPDATE task_schedules
         SET next_run_at = $3::timestamptz, enabled = $3::timestamptz IS NOT NULL,
             revision = revision + 1, updated_at = now()
         WHERE workspace_id = $4 AND id = $1 AND revision = $2",
        &schedule.id,
        schedule.revision,
        next_run_at,
        &schedule.workspace_id,
    )
    .execute(&mut *conn)
    .await?
    .rows_affected();
    if updated != 1 {
        return Err(StoreError::Conflict(format!(
            "schedule {} changed while it was being dispatched",
            schedule.id
        )));
    }
    match next_run_at {
        None if schedule.enabled => {
            let reason = "no time left to fire";
            record(
                conn,
                &schedule.scope(),
                schedule,
                Some("enabled"),
                "disabled",
                reason,
                &Actor::System,
            )
            .await
        }
        _ => Ok(()),
    }
}

/// Records the occurrence for `scheduled_for` as claimed by a fresh token. None when that
/// time already has an occurrence: it was recorded once, and that is all it gets.
pub async fn claim(
    conn: &mut PgConnection,
    schedule: &ScheduleRecord,
    scheduled_for: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Result<Option<Claim>> {
    let claim = query_claims!(
        "INSERT INTO schedule_occurrences (id, schedule_id, task_id, scheduled_for, status,
                                           claim_token, claimed_at, workspace_id)
         VALUES ($1, $2, $3, $4, 'claimed', gen_random_uuid()::text, $5, $6)
         ON CONFLICT (schedule_id, scheduled_for) DO NOTHING
         RETURNING",
        "",
        new_id("occ"),
        &schedule.id,
        &schedule.task_id,
        scheduled_for,
        now,
        &schedule.workspace_id,
    )
    .fetch_optional(conn)
    .await?;
    Ok(claim)
}

/// Re-claims, with new tokens, occurrences still `claimed` since before `claimed_before`,
/// in every workspace:
/// their dispatcher died or stalled between claiming and resolving. A stalled one that
/// wakes finds its token gone and does nothing.
pub(crate) async fn take_over_stale(
    conn: &mut PgConnection,
    claimed_before: DateTime<Utc>,
    now: DateTime<Utc>,
    limit: i64,
) -> Result<Vec<Claim>> {
    let claims = query_claims!(
        "UPDATE schedule_occurrences SET claim_token = gen_random_uuid()::text, claimed_at = $2
         WHERE id IN (SELECT id FROM schedule_occurrences
                      WHERE status = 'claimed' AND claimed_at < $1
                      ORDER BY claimed_at LIMIT $3
                      FOR UPDATE SKIP LOCKED)
         RETURNING",
        "",
        claimed_before,
        now,
        limit,
    )
    .fetch_all(conn)
    .await?;
    Ok(claims)
}

/// Locks the claimed occurrence if `claim` still holds it; false when it was resolved or
/// taken over meanwhile.
pub async fn lock_claim(conn: &mut PgConnection, claim: &Claim) -> Result<bool> {
    let held = sqlx::query_scalar!(
        "SELECT id FROM schedule_occurrences
         WHERE workspace_id = $3 AND id = $1 AND status = 'claimed' AND claim_token = $2
         FOR UPDATE",
        &claim.occurrence_id,
        &claim.token,
        &claim.workspace_id,
    )
    .fetch_optional(conn)
    .await?;
    Ok(held.is_some())
}

/// Who requests the runs of a schedule: its last writer, if known. Read once the claim is
/// locked (behind the task row, which every edit takes first), so it is the writer of the
/// schedule the run is admitted under.
pub(crate) async fn writer(
    conn: &mut PgConnection,
    scope: &Scope,
    schedule_id: &str,
) -> Result<Option<String>> {
    let writer = sqlx::query_scalar!(
        "SELECT written_by FROM task_schedules WHERE workspace_id = $1 AND id = $2",
        scope.workspace(),
        schedule_id,
    )
    .fetch_optional(conn)
    .await?;
    Ok(writer.flatten())
}

/// Ends a claim (locked with [`lock_claim`]) with its outcome.
pub(crate) async fn resolve(
    conn: &mut PgConnection,
    scope: &Scope,
    occurrence_id: &str,
    outcome: &Outcome,
    now: DateTime<Utc>,
) -> Result<OccurrenceRecord> {
    let (status, run_id, error) = match outcome {
        Outcome::Started { run_id } => ("started", Some(run_id), None),
        Outcome::Skipped { reason } => ("skipped", None, Some(reason)),
        Outcome::Failed { reason } => ("failed", None, Some(reason)),
    };
    let occurrence = query_occurrences!(
        "UPDATE schedule_occurrences
         SET status = $2, run_id = $3, error = $4, completed_at = $5, claim_token = NULL
         WHERE workspace_id = $6 AND id = $1
         RETURNING",
        "",
        occurrence_id,
        status,
        run_id,
        error,
        now,
        scope.workspace(),
    )
    .fetch_one(conn)
    .await?;
    Ok(occurrence)
}
