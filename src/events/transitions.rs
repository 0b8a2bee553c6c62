//! The audit trail: one row per state change of a task, run, approval or media job, written in the
//! transaction that made the change.

use keel_api_types::ListOrder;
use sqlx::PgConnection;

use crate::db::Result;
use crate::domain::{Actor, Scope};
use crate::events::Pruned;

/// One state change to record.
pub(crate) struct Transition<'a> {
    pub(crate) entity_type: &'static str,
    pub(crate) entity_id: &'a str,
    /// The task a task, run or approval belongs to; None for a media job.
    pub(crate) task_id: Option<&'a str>,
    pub(crate) from: Option<&'a str>,
    pub(crate) to: &'a str,
    pub(crate) reason: Option<&'a str>,
}

pub(crate) use keel_api_types::TransitionRecord;

pub(crate) async fn record(
    conn: &mut PgConnection,
    scope: &Scope,
    transition: Transition<'_>,
    actor: &Actor,
) -> Result<()> {
    record_all(conn, scope, &[transition], actor).await
}

/// Records several changes by one actor in one statement, in order.
pub(crate) async fn record_all(
    conn: &mut PgConnection,
    scope: &Scope,
    transitions: &[Transition<'_>],
    actor: &Actor,
) -> Result<()> {
    let column = |f: fn(&Transition<'_>) -> Option<String>| -> Vec<Option<String>> {
        transitions.iter().map(f).collect()
    };
    let entity_types = column(|t| Some(t.entity_type.to_string()));
    let entity_ids = column(|t| Some(t.entity_id.to_string()));
    let task_ids = column(|t| t.task_id.map(str::to_string));
    let froms = column(|t| t.from.map(str::to_string));
    let tos = column(|t| Some(t.to.to_string()));
    let reasons = column(|t| t.reason.map(str::to_string));
    sqlx::query!(
        "INSERT INTO state_transitions (workspace_id, entity_type, entity_id, task_id, from_status,
                                        to_status, reason, actor)
         SELECT $1, entity_type, entity_id, task_id, from_status, to_status, reason, $8
         FROM unnest($2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[])
              WITH ORDINALITY AS t(entity_type, entity_id, task_id, from_status, to_status, reason, n)
         ORDER BY n",
        scope.workspace(),
        &entity_types as &[Option<String>],
        &entity_ids as &[Option<String>],
        &task_ids as &[Option<String>],
        &froms as &[Option<String>],
        &tos as &[Option<String>],
        &reasons as &[Option<String>],
        actor.to_string(),
    )
    .execute(conn)
    .await?;
    Ok(())
}

/// Oldest first, or newest first with [`ListOrder::Desc`]; `after` is the id of the last
/// record of the previous page.
pub async fn list(
    conn: &mut PgConnection,
    scope: &Scope,
    entity_type: Option<&str>,
    entity_id: Option<&str>,
    (order, after): (ListOrder, Option<i64>),
    limit: i64,
) -> Result<Vec<TransitionRecord>> {
    macro_rules! page {
        ($bound:literal, $order:literal) => {
            sqlx::query_as!(
                TransitionRecord,
                "SELECT id, entity_type, entity_id, task_id, from_status, to_status, reason,
                        actor, occurred_at
                 FROM state_transitions
                 WHERE workspace_id = $1 AND ($2::text IS NULL OR entity_type = $2)
                   AND ($3::text IS NULL OR entity_id = $3) AND "
                    + $bound
                    + "
                 ORDER BY id "
                    + $order
                    + " LIMIT $5",
                scope.workspace(),
                entity_type,
                entity_id,
                // Every id is past 0 and before i64::MAX: the first page's bound is an
                // index bound too.
                after.unwrap_or(match order {
                    ListOrder::Asc => 0,
                    ListOrder::Desc => i64::MAX,
                }),
                limit,
            )
            .fetch_all(conn)
            .await?
        };
    }
    let rows = match order {
        ListOrder::Asc => page!("id > $4", "ASC"),
        ListOrder::Desc => page!("id < $4", "DESC"),
    };
    Ok(rows)
}

/// History retention over the audit trail: of the `limit` transitions after id `after`,
/// deletes those older than `days` days (see [`crate::events::prune`]); rows another
/// replica's pass holds are left to it.
pub(crate) async fn prune(
    conn: &mut PgConnection,
    after: i64,
    days: i32,
    limit: i64,
) -> Result<Pruned> {
    let pruned = sqlx::query_as!(
        Pruned,
        r#"WITH batch AS (
               SELECT id FROM (
                   SELECT id, occurred_at FROM state_transitions
                   WHERE id > $1 ORDER BY id LIMIT $3
               ) AS next
               WHERE occurred_at < now() - make_interval(days => $2)
           ), doomed AS (
               SELECT id FROM state_transitions WHERE id IN (SELECT id FROM batch)
               FOR UPDATE SKIP LOCKED
           ), deleted AS (
               DELETE FROM state_transitions WHERE id IN (SELECT id FROM doomed) RETURNING id
           )
           SELECT (SELECT max(id) FROM batch) AS last,
                  (SELECT count(*) FROM deleted) AS "deleted!""#,
        after,
        days,
        limit,
    )
    .fetch_one(conn)
    .await?;
    Ok(pruned)
}
