//! External work rows: sources (a tracker target and its WORKFLOW.md) and the items their
//! polls and imports found, each keyed by its idempotency key.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use sqlx::PgConnection;
use sqlx::types::Json;

use keel_api_types::{Etags, ItemState};
pub(crate) use keel_api_types::{ItemRecord, SourceRecord};

use crate::attempt::JobKind;
use crate::db::{Result, StoreError};
use crate::domain::{Actor, Role, Scope, new_id};
use crate::queue::{self, Locked};

/// `query_as!` of [`SourceRecord`]s: `$before` (up to its `SELECT` or `RETURNING`), then the
/// source's columns (`etags` as [`Etags`]), then `$after` (its `FROM …`, or nothing).
macro_rules! query_sources {
    ($before:literal, $after:literal $(, $arg:expr)* $(,)?) => {
        sqlx::query_as!(
            SourceRecord,
            $before
                + r#" id, tracker_kind, target, workflow_markdown, workflow_path,
                      etags AS "etags: Etags", backoff_until, background_enabled, last_poll_at,
                      last_poll, last_error_code, last_error, last_error_at, registered_by,
                      registered_by_role, created_at, updated_at "#
                + $after
            $(, $arg)*
        )
    };
}

/// `query_as!` of [`ItemRecord`]s: `$before` (up to its `SELECT` or `RETURNING`), then the
/// item's columns (`state` as an [`ItemState`]), then `$after` (its `FROM …`, or nothing).
macro_rules! query_items {
    ($before:literal, $after:literal $(, $arg:expr)* $(,)?) => {
        sqlx::query_as!(
            ItemRecord,
            $before
                + r#" id, source_id, idempotency_key, kind, identifier, tracker_state,
                      state AS "state: ItemState", issue, prompt, task_id, run_id,
                      last_error_code, last_error, workspace_path, hook_output, created_at,
                      updated_at "#
                + $after
            $(, $arg)*
        )
    };
}
pub(crate) use query_items;

/// The [`ItemRecord`] of a `query!` row that selects its columns (`state` as an
/// [`ItemState`]) besides others, which stay readable on the row.
macro_rules! item_record {
    ($row:ident) => {
        ItemRecord {
            id: $row.id,
            source_id: $row.source_id,
            idempotency_key: $row.idempotency_key,
            kind: $row.kind,
            identifier: $row.identifier,
            tracker_state: $row.tracker_state,
            state: $row.state,
            issue: $row.issue,
            prompt: $row.prompt,
            task_id: $row.task_id,
            run_id: $row.run_id,
            last_error_code: $row.last_error_code,
            last_error: $row.last_error,
            workspace_path: $row.workspace_path,
            hook_output: $row.hook_output,
            created_at: $row.created_at,
            updated_at: $row.updated_at,
        }
    };
}
pub(crate) use item_record;

/// Where a source's workflow comes from.
#[derive(Debug, Clone)]
pub(crate) enum WorkflowOrigin {
    Markdown(String),
    Path(String),
}

/// Registers a source as `registrant` (its actor and role); the same target again returns
/// the existing one (and false), its registrant unchanged.
pub(crate) async fn insert_source(
    conn: &mut PgConnection,
    scope: &Scope,
    (tracker_kind, target): (&str, &str),
    workflow: &WorkflowOrigin,
    (registrant, role): (&Actor, Role),
) -> Result<(SourceRecord, bool)> {
    let (markdown, path) = match workflow {
        WorkflowOrigin::Markdown(text) => (Some(text), None),
        WorkflowOrigin::Path(path) => (None, Some(path)),
    };
    let inserted = query_sources!(
        "INSERT INTO external_sources (id, workspace_id, tracker_kind, target,
                                       workflow_markdown, workflow_path, registered_by,
                                       registered_by_role)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
         ON CONFLICT (workspace_id, target) DO NOTHING
         RETURNING",
        "",
        new_id("extsrc"),
        scope.workspace(),
        tracker_kind,
        target,
        markdown,
        path,
        registrant.to_string(),
        role.as_str(),
    )
    .fetch_optional(&mut *conn)
    .await?;
    match inserted {
        Some(source) => Ok((source, true)),
        None => {
            let existing = query_sources!(
                "SELECT",
                "FROM external_sources WHERE workspace_id = $1 AND target = $2",
                scope.workspace(),
                target,
            )
            .fetch_one(&mut *conn)
            .await?;
            Ok((existing, false))
        }
    }
}

/// Who requests the runs of a source's items: its registrant, when recorded. The runs of
/// a workflow are asked for by whoever registered it, whoever (or whatever) polls it.
pub(crate) async fn registrant(
    conn: &mut PgConnection,
    scope: &Scope,
    source_id: &str,
) -> Result<Option<Actor>> {
    let registered_by = sqlx::query_scalar!(
        "SELECT registered_by FROM external_sources WHERE workspace_id = $1 AND id = $2",
        scope.workspace(),
        source_id,
    )
    .fetch_optional(conn)
    .await?;
    Ok(registered_by.flatten().map(Actor::Person))
}

/// The last text of the source's `workflow_path` file that parsed, if a poll kept one.
pub(crate) async fn workflow_last_good(
    conn: &mut PgConnection,
    scope: &Scope,
    source_id: &str,
) -> Result<Option<String>> {
    let text = sqlx::query_scalar!(
        "SELECT workflow_last_good FROM external_sources WHERE workspace_id = $1 AND id = $2",
        scope.workspace(),
        source_id,
    )
    .fetch_optional(conn)
    .await?;
    Ok(text.flatten())
}

/// The role the source was registered with: the role its items' tasks are written as,
/// held to at each use of a secret they name (a member's to its workspace's grants).
pub(crate) async fn registrant_role(
    conn: &mut PgConnection,
    scope: &Scope,
    source_id: &str,
) -> Result<Role> {
    let role = sqlx::query_scalar!(
        "SELECT registered_by_role FROM external_sources WHERE workspace_id = $1 AND id = $2",
        scope.workspace(),
        source_id,
    )
    .fetch_optional(conn)
    .await?
    .ok_or(StoreError::NotFound("external work source"))?;
    // A role this build does not know is held to the least.
    Ok(Role::parse(Some(&role)).unwrap_or(Role::Member))
}

pub(crate) async fn get_source(
    conn: &mut PgConnection,
    scope: &Scope,
    id: &str,
) -> Result<SourceRecord> {
    query_sources!(
        "SELECT",
        "FROM external_sources WHERE workspace_id = $1 AND id = $2",
        scope.workspace(),
        id,
    )
    .fetch_optional(conn)
    .await?
    .ok_or(StoreError::NotFound("external work source"))
}

/// Oldest first; `after` is the id of the last source of the previous page.
pub(crate) async fn list_sources(
    conn: &mut PgConnection,
    scope: &Scope,
    after: Option<&str>,
    limit: i64,
) -> Result<Vec<SourceRecord>> {
    let rows = query_sources!(
        "SELECT",
        "FROM external_sources
         WHERE workspace_id = $1 AND ($2::text IS NULL OR id > $2) ORDER BY id LIMIT $3",
        scope.workspace(),
        after,
        limit,
    )
    .fetch_all(conn)
    .await?;
    Ok(rows)
}

/// Deletes a source with its items and its background poll job (the tasks they created
/// stay).
pub(crate) async fn delete_source(conn: &mut PgConnection, scope: &Scope, id: &str) -> Result<()> {
    let deleted = sqlx::query!(
        "DELETE FROM external_sources WHERE workspace_id = $1 AND id = $2",
        scope.workspace(),
        id,
    )
    .execute(&mut *conn)
    .await?;
    if deleted.rows_affected() == 0 {
        return Err(StoreError::NotFound("external work source"));
    }
    queue::remove(conn, scope, JobKind::Poll.as_str(), id, Locked::Skip).await?;
    Ok(())
}

/// Turns background polling on (the source's one `poll` job, shared by every worker) or off;
/// a poll in flight finds the flag off when it ends, and acks its job.
pub(crate) async fn set_background(
    conn: &mut PgConnection,
    scope: &Scope,
    id: &str,
    enabled: bool,
) -> Result<SourceRecord> {
    let source = query_sources!(
        "UPDATE external_sources SET background_enabled = $3, updated_at = now()
         WHERE workspace_id = $1 AND id = $2
         RETURNING",
        "",
        scope.workspace(),
        id,
        enabled,
    )
    .fetch_optional(&mut *conn)
    .await?
    .ok_or(StoreError::NotFound("external work source"))?;
    if enabled {
        queue::enqueue(conn, scope, JobKind::Poll.as_str(), id, 0).await?;
    } else {
        queue::remove(conn, scope, JobKind::Poll.as_str(), id, Locked::Skip).await?;
    }
    Ok(source)
}

/// What one poll leaves on its source.
#[derive(Debug, Clone, Default)]
pub(crate) struct PollRecord {
    /// ETags to remember, by list URL (merged into the stored ones).
    pub(crate) etags: BTreeMap<String, String>,
    pub(crate) backoff_until: Option<DateTime<Utc>>,
    pub(crate) summary: serde_json::Value,
    /// `(code, message)`; None clears the last error.
    pub(crate) error: Option<(String, String)>,
    /// A `workflow_path` file's text that parsed, kept for when an edit breaks it.
    pub(crate) workflow_last_good: Option<String>,
}

pub(crate) async fn record_poll(
    conn: &mut PgConnection,
    scope: &Scope,
    id: &str,
    poll: &PollRecord,
) -> Result<()> {
    let (code, message) = poll.error.clone().unzip();
    sqlx::query!(
        "UPDATE external_sources
         SET etags = etags || $3::jsonb, backoff_until = $4, last_poll_at = now(),
             last_poll = $5, last_error_code = $6, last_error = $7,
             last_error_at = CASE WHEN $6::text IS NULL THEN last_error_at ELSE now() END,
             workflow_last_good = coalesce($8, workflow_last_good), updated_at = now()
         WHERE workspace_id = $1 AND id = $2",
        scope.workspace(),
        id,
        Json(&poll.etags) as Json<&BTreeMap<String, String>>,
        poll.backoff_until,
        &poll.summary,
        code,
        message,
        poll.workflow_last_good,
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// A version of a tracker item, as a poll or import found it.
#[derive(Debug, Clone)]
pub(crate) struct NewItem<'a> {
    pub(crate) source_id: &'a str,
    pub(crate) idempotency_key: &'a str,
    pub(crate) kind: &'a str,
    pub(crate) identifier: &'a str,
    pub(crate) tracker_state: &'a str,
    pub(crate) issue: &'a serde_json::Value,
}

/// Records an item; None when its idempotency key was recorded before (a duplicate). A
/// concurrent insert of the same key waits for the first to commit, then finds it.
pub(crate) async fn insert_item(
    conn: &mut PgConnection,
    scope: &Scope,
    item: &NewItem<'_>,
) -> Result<Option<ItemRecord>> {
    let row = query_items!(
        "INSERT INTO external_work_items (id, workspace_id, source_id, idempotency_key, kind,
                                          identifier, tracker_state, state, issue)
         VALUES ($1, $2, $3, $4, $5, $6, $7, 'discovered', $8)
         ON CONFLICT (workspace_id, idempotency_key) DO NOTHING
         RETURNING",
        "",
        new_id("extitem"),
        scope.workspace(),
        item.source_id,
        item.idempotency_key,
        item.kind,
        item.identifier,
        item.tracker_state,
        item.issue,
    )
    .fetch_optional(conn)
    .await?;
    Ok(row)
}

/// Serializes the imports of one subject (every version of one issue or pull request) for
/// the rest of the transaction, so two workers never both give it a task.
pub(crate) async fn lock_subject(
    conn: &mut PgConnection,
    scope: &Scope,
    source_id: &str,
    identifier: &str,
) -> Result<()> {
    sqlx::query!(
        "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
        format!(
            "external_work:{}:{source_id}:{identifier}",
            scope.workspace()
        ),
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// The version of this subject that has its task, if any.
pub(crate) async fn claimed_version(
    conn: &mut PgConnection,
    scope: &Scope,
    source_id: &str,
    identifier: &str,
) -> Result<Option<ItemRecord>> {
    let row = query_items!(
        "SELECT",
        "FROM external_work_items
         WHERE workspace_id = $1 AND source_id = $2 AND identifier = $3
           AND task_id IS NOT NULL
         LIMIT 1",
        scope.workspace(),
        source_id,
        identifier,
    )
    .fetch_optional(conn)
    .await?;
    Ok(row)
}

/// The key of the version of the subject recorded before `item_id`, the newest of them;
/// None for its first.
pub(crate) async fn previous_key(
    conn: &mut PgConnection,
    scope: &Scope,
    source_id: &str,
    identifier: &str,
    item_id: &str,
) -> Result<Option<String>> {
    let key = sqlx::query_scalar!(
        "SELECT idempotency_key FROM external_work_items
         WHERE workspace_id = $1 AND source_id = $2 AND identifier = $3 AND id <> $4
         ORDER BY created_at DESC, id DESC LIMIT 1",
        scope.workspace(),
        source_id,
        identifier,
        item_id,
    )
    .fetch_optional(conn)
    .await?;
    Ok(key)
}

/// The source's claimed items whose run is still active or failed (a retry is coming),
/// oldest first, then the items waiting for a slot (the newest version of each: it starts
/// only as the tracker has it now), then those that still have a workspace (a terminal
/// version removes it): what a reconciliation asks the tracker about.
pub(crate) async fn claimed_to_reconcile(
    conn: &mut PgConnection,
    scope: &Scope,
    source_id: &str,
    limit: u32,
) -> Result<Vec<ItemRecord>> {
    let rows = sqlx::query_as!(
        ItemRecord,
        r#"SELECT i.id, i.source_id, i.idempotency_key, i.kind, i.identifier, i.tracker_state,
                  i.state AS "state: ItemState", i.issue, i.prompt, i.task_id, i.run_id,
                  i.last_error_code, i.last_error, i.workspace_path, i.hook_output,
                  i.created_at, i.updated_at
           FROM external_work_items i
           LEFT JOIN runs r ON r.workspace_id = i.workspace_id AND r.id = i.run_id
           WHERE i.workspace_id = $1 AND i.source_id = $2
             AND (r.status IN ('queued', 'running', 'awaiting_approval', 'failed')
                  OR (r.id IS NOT NULL AND i.workspace_path IS NOT NULL)
                  OR (i.state = 'discovered' AND i.last_error_code = 'no_free_slot'
                      AND NOT EXISTS (SELECT 1 FROM external_work_items n
                                      WHERE n.workspace_id = i.workspace_id
                                        AND n.source_id = i.source_id
                                        AND n.identifier = i.identifier AND n.id > i.id)))
           ORDER BY CASE WHEN r.status IN ('queued', 'running', 'awaiting_approval', 'failed')
                         THEN 0 WHEN r.id IS NULL THEN 1 ELSE 2 END,
                    i.id
           LIMIT $3"#,
        scope.workspace(),
        source_id,
        i64::from(limit),
    )
    .fetch_all(conn)
    .await?;
    Ok(rows)
}

/// Serializes the starts of one source's items across every importer, so that two of them
/// cannot both take the last free slot. Taken after the subject's lock.
pub(crate) async fn lock_slots(
    conn: &mut PgConnection,
    scope: &Scope,
    source_id: &str,
) -> Result<()> {
    sqlx::query!(
        "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
        format!("external_work_slots:{}:{source_id}", scope.workspace()),
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// How many of the source's items have an active run: all of them, and those whose
/// tracker state (trimmed, lowercased) is now `state`: the state of the subject's newest
/// version, so an item that moved on counts in the state it moved to (Symphony counts by
/// the current tracked state).
pub(crate) async fn active_runs(
    conn: &mut PgConnection,
    scope: &Scope,
    source_id: &str,
    state: &str,
) -> Result<(i64, i64)> {
    let counts = sqlx::query!(
        r#"SELECT count(*) AS "all!",
                  count(*) FILTER (WHERE lower(btrim(newest.tracker_state)) = $3) AS "in_state!"
           FROM external_work_items i
           JOIN runs r ON r.workspace_id = i.workspace_id AND r.id = i.run_id
           CROSS JOIN LATERAL (
               SELECT n.tracker_state FROM external_work_items n
               WHERE n.workspace_id = i.workspace_id AND n.source_id = i.source_id
                 AND n.identifier = i.identifier
               ORDER BY n.id DESC LIMIT 1
           ) newest
           WHERE i.workspace_id = $1 AND i.source_id = $2
             AND r.status IN ('queued', 'running', 'awaiting_approval')"#,
        scope.workspace(),
        source_id,
        state.trim().to_lowercase(),
    )
    .fetch_one(conn)
    .await?;
    Ok((counts.all, counts.in_state))
}

/// A claimed item whose run failed, with what its retry needs.
#[derive(Debug, Clone)]
pub(crate) struct FailedClaim {
    pub(crate) item: ItemRecord,
    pub(crate) run_finished_at: DateTime<Utc>,
    pub(crate) run_error: Option<String>,
    /// The task's runs so far: the next one is retry number `run_count`.
    pub(crate) run_count: i32,
    /// The issue as the subject's newest version has it.
    pub(crate) newest_issue: serde_json::Value,
}

/// The source's items whose task's latest run failed, oldest first.
pub(crate) async fn claimed_with_failed_runs(
    conn: &mut PgConnection,
    scope: &Scope,
    source_id: &str,
    limit: u32,
) -> Result<Vec<FailedClaim>> {
    let rows = sqlx::query!(
        r#"SELECT i.id, i.source_id, i.idempotency_key, i.kind, i.identifier, i.tracker_state,
                  i.state AS "state: ItemState", i.issue, i.prompt, i.task_id, i.run_id,
                  i.last_error_code, i.last_error, i.workspace_path, i.hook_output,
                  i.created_at, i.updated_at,
                  r.finished_at AS "run_finished_at!", r.last_error AS run_error, t.run_count,
                  (SELECT n.issue FROM external_work_items n
                   WHERE n.workspace_id = i.workspace_id AND n.source_id = i.source_id
                     AND n.identifier = i.identifier
                   ORDER BY n.id DESC LIMIT 1) AS "newest_issue!"
           FROM external_work_items i
           JOIN runs r ON r.workspace_id = i.workspace_id AND r.id = i.run_id
           JOIN tasks t ON t.workspace_id = i.workspace_id AND t.id = i.task_id
           WHERE i.workspace_id = $1 AND i.source_id = $2 AND r.status = 'failed'
             AND t.latest_run_id = r.id
           ORDER BY i.id LIMIT $3"#,
        scope.workspace(),
        source_id,
        i64::from(limit),
    )
    .fetch_all(conn)
    .await?;
    Ok(rows
        .into_iter()
        .map(|row| FailedClaim {
            item: item_record!(row),
            run_finished_at: row.run_finished_at,
            run_error: row.run_error,
            run_count: row.run_count,
            newest_issue: row.newest_issue,
        })
        .collect())
}

/// Items left waiting for a free slot, the newest version of each subject, in dispatch
/// order (priority 1 to 4, then none; the oldest created; the identifier, as `poll`'s
/// `dispatch_order`): what a poll starts once slots free up.
pub(crate) async fn waiting_for_slots(
    conn: &mut PgConnection,
    scope: &Scope,
    source_id: &str,
    limit: u32,
) -> Result<Vec<ItemRecord>> {
    let rows = query_items!(
        "SELECT",
        "FROM (
             SELECT DISTINCT ON (identifier) * FROM external_work_items
             WHERE workspace_id = $1 AND source_id = $2
             ORDER BY identifier, id DESC
         ) newest
         WHERE state = 'discovered' AND last_error_code = 'no_free_slot'
         ORDER BY CASE WHEN (issue->>'priority')::bigint BETWEEN 1 AND 4
                       THEN (issue->>'priority')::bigint ELSE 5 END,
                  issue->>'created_at' NULLS LAST, identifier
         LIMIT $3",
        scope.workspace(),
        source_id,
        i64::from(limit),
    )
    .fetch_all(conn)
    .await?;
    Ok(rows)
}

/// Where an item stands after its import.
#[derive(Debug, Clone, Default)]
pub(crate) struct ItemChange<'a> {
    pub(crate) state: &'a str,
    pub(crate) prompt: Option<&'a str>,
    pub(crate) task_id: Option<&'a str>,
    pub(crate) run_id: Option<&'a str>,
    pub(crate) error: Option<(&'a str, &'a str)>,
}

pub(crate) async fn update_item(
    conn: &mut PgConnection,
    scope: &Scope,
    id: &str,
    change: &ItemChange<'_>,
) -> Result<ItemRecord> {
    let (code, message) = change.error.unzip();
    let row = query_items!(
        "UPDATE external_work_items
         SET state = $3, prompt = $4, task_id = $5, run_id = $6, last_error_code = $7,
             last_error = $8, updated_at = now()
         WHERE workspace_id = $1 AND id = $2
         RETURNING",
        "",
        scope.workspace(),
        id,
        change.state,
        change.prompt,
        change.task_id,
        change.run_id,
        code,
        message,
    )
    .fetch_one(conn)
    .await?;
    Ok(row)
}

/// Replaces an item's normalized issue with a fresher reading of the same version (its
/// blockers' states change without a new version).
pub(crate) async fn refresh_issue(
    conn: &mut PgConnection,
    scope: &Scope,
    id: &str,
    issue: &serde_json::Value,
) -> Result<ItemRecord> {
    let row = query_items!(
        "UPDATE external_work_items SET issue = $3, updated_at = now()
         WHERE workspace_id = $1 AND id = $2
         RETURNING",
        "",
        scope.workspace(),
        id,
        issue,
    )
    .fetch_one(conn)
    .await?;
    Ok(row)
}

/// An item by its id (the one an action is proposed on, or an API read).
pub(crate) async fn get_item(
    conn: &mut PgConnection,
    scope: &Scope,
    item_id: &str,
) -> Result<ItemRecord> {
    query_items!(
        "SELECT",
        "FROM external_work_items WHERE workspace_id = $1 AND id = $2",
        scope.workspace(),
        item_id,
    )
    .fetch_optional(conn)
    .await?
    .ok_or(StoreError::NotFound("external work item"))
}

/// The item a key names (the one a duplicate import found).
pub(crate) async fn item_by_key(
    conn: &mut PgConnection,
    scope: &Scope,
    key: &str,
) -> Result<ItemRecord> {
    query_items!(
        "SELECT",
        "FROM external_work_items WHERE workspace_id = $1 AND idempotency_key = $2",
        scope.workspace(),
        key,
    )
    .fetch_optional(conn)
    .await?
    .ok_or(StoreError::NotFound("external work item"))
}

/// A source's items, oldest first.
pub(crate) async fn list_items(
    conn: &mut PgConnection,
    scope: &Scope,
    filter: ItemFilter<'_>,
    after: Option<&str>,
    limit: i64,
) -> Result<Vec<ItemRecord>> {
    let rows = query_items!(
        "SELECT",
        "FROM external_work_items
         WHERE workspace_id = $1 AND ($2::text IS NULL OR id > $2)
           AND ($3::text IS NULL OR source_id = $3) AND ($4::text IS NULL OR state = $4)
           AND ($5::text IS NULL OR kind = $5)
         ORDER BY id LIMIT $6",
        scope.workspace(),
        after,
        filter.source_id,
        filter.state.map(ItemState::as_str),
        filter.kind,
        limit,
    )
    .fetch_all(conn)
    .await?;
    Ok(rows)
}

/// Which of a workspace's items to list: each filter given narrows the list.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct ItemFilter<'a> {
    pub(crate) source_id: Option<&'a str>,
    pub(crate) state: Option<ItemState>,
    pub(crate) kind: Option<&'a str>,
}

/// How many of a source's items are in each state.
pub(crate) async fn item_counts(
    conn: &mut PgConnection,
    scope: &Scope,
    source_id: &str,
) -> Result<BTreeMap<String, i64>> {
    let rows = sqlx::query!(
        r#"SELECT state, count(*) AS "count!" FROM external_work_items
           WHERE workspace_id = $1 AND source_id = $2 GROUP BY state"#,
        scope.workspace(),
        source_id,
    )
    .fetch_all(conn)
    .await?;
    Ok(rows.into_iter().map(|row| (row.state, row.count)).collect())
}
