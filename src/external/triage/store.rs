//! Triage rows: a scan (the `ci_triage` job's row, ref_id its id) and the records it makes,
//! one per failing check of a head, each found again rather than made twice.

use sqlx::PgConnection;

use crate::db::{Result, StoreError};
use crate::domain::{Scope, new_id};
use keel_api_types::{
    CheckKind, ScanStatus, TriageRecord, TriageScan, TriageStatus, TriageSummary,
};

/// `query_as!` of [`TriageScan`]s: `$before`, the scan's columns, then `$after`.
macro_rules! query_scans {
    ($before:literal, $after:literal $(, $arg:expr)* $(,)?) => {
        sqlx::query_as!(
            TriageScan,
            $before
                + r#" id, item_id, max_records, create_task, status AS "status: ScanStatus",
                      summary, last_error_code, last_error, requested_by, created_at,
                      finished_at, updated_at "#
                + $after
            $(, $arg)*
        )
    };
}

/// `query_as!` of [`TriageRecord`]s: `$before`, the record's columns, then `$after`.
macro_rules! query_records {
    ($before:literal, $after:literal $(, $arg:expr)* $(,)?) => {
        sqlx::query_as!(
            TriageRecord,
            $before
                + r#" id, item_id, scan_id, repository, subject_number, head_sha, head_ref,
                      check_kind AS "check_kind: CheckKind", check_name, check_id, conclusion,
                      details_url, status AS "status: TriageStatus", reason, task_id, run_id,
                      artifact_id, idempotency_key, created_at, updated_at "#
                + $after
            $(, $arg)*
        )
    };
}

/// Records a scan, `queued`; the caller queues its job in the same transaction.
pub(crate) async fn insert_scan(
    conn: &mut PgConnection,
    scope: &Scope,
    item_id: &str,
    max_records: i32,
    create_task: bool,
    requested_by: &str,
) -> Result<TriageScan> {
    let row = query_scans!(
        "INSERT INTO ci_triage_scans (id, workspace_id, item_id, max_records, create_task,
                                      status, requested_by)
         VALUES ($1, $2, $3, $4, $5, 'queued', $6) RETURNING",
        "",
        new_id("ciscan"),
        scope.workspace(),
        item_id,
        max_records,
        create_task,
        requested_by,
    )
    .fetch_one(conn)
    .await?;
    Ok(row)
}

pub(crate) async fn get_scan(
    conn: &mut PgConnection,
    scope: &Scope,
    id: &str,
) -> Result<TriageScan> {
    query_scans!(
        "SELECT",
        "FROM ci_triage_scans WHERE workspace_id = $1 AND id = $2",
        scope.workspace(),
        id,
    )
    .fetch_optional(conn)
    .await?
    .ok_or(StoreError::NotFound("ci triage scan"))
}

/// Locks a scan for the rest of the transaction; None when it is gone.
pub(crate) async fn lock_scan(
    conn: &mut PgConnection,
    scope: &Scope,
    id: &str,
) -> Result<Option<TriageScan>> {
    let row = query_scans!(
        "SELECT",
        "FROM ci_triage_scans WHERE workspace_id = $1 AND id = $2 FOR UPDATE",
        scope.workspace(),
        id,
    )
    .fetch_optional(conn)
    .await?;
    Ok(row)
}

/// Ends a scan `done` with its summary, or `failed` with the error.
pub(crate) async fn finish_scan(
    conn: &mut PgConnection,
    scope: &Scope,
    id: &str,
    outcome: std::result::Result<&TriageSummary, (&str, &str)>,
) -> Result<TriageScan> {
    let (status, summary, error) = match outcome {
        Ok(summary) => (
            ScanStatus::Done,
            Some(serde_json::to_value(summary).expect("a summary serializes")),
            None,
        ),
        Err(error) => (ScanStatus::Failed, None, Some(error)),
    };
    let (code, message) = error.unzip();
    let row = query_scans!(
        "UPDATE ci_triage_scans
         SET status = $3, summary = $4, last_error_code = $5, last_error = $6,
             finished_at = now(), updated_at = now()
         WHERE workspace_id = $1 AND id = $2 RETURNING",
        "",
        scope.workspace(),
        id,
        status.as_str(),
        summary,
        code,
        message,
    )
    .fetch_one(conn)
    .await?;
    Ok(row)
}

/// A triage record to make.
#[derive(Debug, Clone)]
pub(crate) struct NewRecord<'a> {
    pub(crate) item_id: &'a str,
    pub(crate) scan_id: &'a str,
    pub(crate) repository: &'a str,
    pub(crate) subject_number: i64,
    pub(crate) head_sha: &'a str,
    pub(crate) head_ref: Option<&'a str>,
    pub(crate) check_kind: Option<CheckKind>,
    pub(crate) check_name: &'a str,
    pub(crate) check_id: Option<i64>,
    pub(crate) conclusion: Option<&'a str>,
    pub(crate) details_url: Option<&'a str>,
    pub(crate) status: TriageStatus,
    pub(crate) reason: Option<&'a str>,
}

/// Makes the record, `Ok(Err(existing))` when this check of this head has one already.
pub(crate) async fn insert_once(
    conn: &mut PgConnection,
    scope: &Scope,
    new: &NewRecord<'_>,
) -> Result<std::result::Result<TriageRecord, TriageRecord>> {
    let id = new_id("citri");
    let inserted = query_records!(
        "INSERT INTO ci_triage (id, workspace_id, item_id, scan_id, repository, subject_number,
                                head_sha, head_ref, check_kind, check_name, check_id,
                                conclusion, details_url, status, reason, idempotency_key)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, '')
         ON CONFLICT ON CONSTRAINT ci_triage_once DO NOTHING RETURNING",
        "",
        id,
        scope.workspace(),
        new.item_id,
        new.scan_id,
        new.repository,
        new.subject_number,
        new.head_sha,
        new.head_ref,
        new.check_kind.map(CheckKind::as_str),
        new.check_name,
        new.check_id,
        new.conclusion,
        new.details_url,
        new.status.as_str(),
        new.reason,
    )
    .fetch_optional(&mut *conn)
    .await?;
    if let Some(record) = inserted {
        return Ok(Ok(record));
    }
    let existing = query_records!(
        "SELECT",
        "FROM ci_triage
         WHERE workspace_id = $1 AND item_id = $2 AND head_sha = $3 AND check_name = $4",
        scope.workspace(),
        new.item_id,
        new.head_sha,
        new.check_name,
    )
    .fetch_one(conn)
    .await?;
    Ok(Err(existing))
}

/// What a record's fix task and evidence left on it.
#[derive(Debug, Clone, Default)]
pub(crate) struct RecordChange<'a> {
    pub(crate) status: Option<TriageStatus>,
    pub(crate) reason: Option<&'a str>,
    pub(crate) task_id: Option<&'a str>,
    pub(crate) run_id: Option<&'a str>,
    pub(crate) artifact_id: Option<&'a str>,
}

/// Applies a change: each field given replaces the record's; the idempotency key follows
/// the task.
pub(crate) async fn update_record(
    conn: &mut PgConnection,
    scope: &Scope,
    id: &str,
    change: &RecordChange<'_>,
) -> Result<TriageRecord> {
    let row = query_records!(
        "UPDATE ci_triage
         SET status = coalesce($3, status), reason = coalesce($4, reason),
             task_id = coalesce($5, task_id), run_id = coalesce($6, run_id),
             artifact_id = coalesce($7, artifact_id),
             idempotency_key = 'ci-triage:' || id || ':' || coalesce($5, task_id, '') || ':'
                               || head_sha,
             updated_at = now()
         WHERE workspace_id = $1 AND id = $2 RETURNING",
        "",
        scope.workspace(),
        id,
        change.status.map(TriageStatus::as_str),
        change.reason,
        change.task_id,
        change.run_id,
        change.artifact_id,
    )
    .fetch_one(conn)
    .await?;
    Ok(row)
}

pub(crate) async fn get_record(
    conn: &mut PgConnection,
    scope: &Scope,
    id: &str,
) -> Result<TriageRecord> {
    query_records!(
        "SELECT",
        "FROM ci_triage WHERE workspace_id = $1 AND id = $2",
        scope.workspace(),
        id,
    )
    .fetch_optional(conn)
    .await?
    .ok_or(StoreError::NotFound("ci triage record"))
}

/// Locks a record for the rest of the transaction.
pub(crate) async fn lock_record(
    conn: &mut PgConnection,
    scope: &Scope,
    id: &str,
) -> Result<TriageRecord> {
    query_records!(
        "SELECT",
        "FROM ci_triage WHERE workspace_id = $1 AND id = $2 FOR UPDATE",
        scope.workspace(),
        id,
    )
    .fetch_optional(conn)
    .await?
    .ok_or(StoreError::NotFound("ci triage record"))
}

/// Which records to list: each filter given narrows the list.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct RecordFilter<'a> {
    pub(crate) item_id: Option<&'a str>,
    pub(crate) source_id: Option<&'a str>,
    pub(crate) status: Option<TriageStatus>,
}

/// A workspace's records, oldest first.
pub(crate) async fn list_records(
    conn: &mut PgConnection,
    scope: &Scope,
    filter: RecordFilter<'_>,
    after: Option<&str>,
    limit: i64,
) -> Result<Vec<TriageRecord>> {
    let rows = query_records!(
        "SELECT",
        "FROM ci_triage t
         WHERE t.workspace_id = $1 AND ($2::text IS NULL OR t.id > $2)
           AND ($3::text IS NULL OR t.item_id = $3) AND ($4::text IS NULL OR t.status = $4)
           AND ($5::text IS NULL OR t.item_id IN (
                SELECT i.id FROM external_work_items i
                WHERE i.workspace_id = $1 AND i.source_id = $5))
         ORDER BY t.id LIMIT $6",
        scope.workspace(),
        after,
        filter.item_id,
        filter.status.map(TriageStatus::as_str),
        filter.source_id,
        limit,
    )
    .fetch_all(conn)
    .await?;
    Ok(rows)
}
