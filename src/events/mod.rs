//! The append-only event log: a per-subject `sequence` and the public feed's position.
//!
//! Nothing serializes appends across the deployment. Each event stores `feed_xid`, the id
//! of the transaction that wrote it (or its subject's previous event's, when that is
//! greater, so a subject's events stay in order in the feed), and the feed is ordered by
//! `(feed_xid, id)`. Readers deliver only events below the horizon, the oldest transaction
//! still running (`pg_snapshot_xmin`): every transaction below it has ended, so no event
//! can later appear before a position already delivered (see docs/api.md, "Events").
//!
//! Appends of one subject are serialized by a transaction-level advisory lock on the
//! subject, held until commit, so its `sequence` is gap-free and commits in order. Append
//! events last in a transaction, after every row lock it takes, and once per transaction
//! (the locks of all its subjects are taken in one sorted order), so no lock cycle can
//! form through them.

pub mod transitions;

use sqlx::PgConnection;

use crate::db::Result;
use crate::domain::{EventType, Scope, new_id};

/// Arbitrary constant naming the class of the per-subject append locks (the two-key form of
/// advisory locks, so they cannot collide with Keel's one-key locks).
const SUBJECT_LOCK_CLASS: i32 = 0x6b65_6576;

/// What an event is about: each subject has its own `sequence`.
#[derive(Debug, Clone, Copy)]
pub enum Subject<'a> {
    Run { task_id: &'a str, run_id: &'a str },
    MediaJob(&'a str),
}

impl<'a> Subject<'a> {
    /// The column naming the subject in `run_events` and `artifacts`, and its id.
    pub(crate) fn key(self) -> (&'static str, &'a str) {
        match self {
            Subject::Run { run_id, .. } => ("run_id", run_id),
            Subject::MediaJob(id) => ("media_job_id", id),
        }
    }

    pub(crate) fn columns(self) -> (Option<&'a str>, Option<&'a str>, Option<&'a str>) {
        match self {
            Subject::Run { task_id, run_id } => (Some(task_id), Some(run_id), None),
            Subject::MediaJob(id) => (None, None, Some(id)),
        }
    }
}

pub struct NewEvent<'a> {
    pub(crate) subject: Subject<'a>,
    pub(crate) event_type: EventType,
    pub(crate) data: serde_json::Value,
}

impl<'a> NewEvent<'a> {
    pub fn new(task_id: &'a str, run_id: &'a str, event_type: EventType) -> Self {
        NewEvent {
            subject: Subject::Run { task_id, run_id },
            event_type,
            data: serde_json::json!({}),
        }
    }

    pub(crate) fn media_job(media_job_id: &'a str, event_type: EventType) -> Self {
        NewEvent {
            subject: Subject::MediaJob(media_job_id),
            event_type,
            data: serde_json::json!({}),
        }
    }

    pub(crate) fn with(mut self, data: serde_json::Value) -> Self {
        self.data = data;
        self
    }
}

pub use keel_api_types::EventRecord;

/// `query_as!` of [`EventRecord`]s: `$before` (up to its `SELECT`), then the event's columns
/// (`type` as an [`EventType`], its feed position as `cursor`), then `$after` (its
/// `FROM run_events …`).
macro_rules! query_events {
    ($before:literal, $after:literal $(, $arg:expr)* $(,)?) => {
        sqlx::query_as!(
            EventRecord,
            $before
                + r#" 1 AS "schema_version!", event_id, task_id, run_id, media_job_id, sequence,
                      feed_xid::text || '-' || id AS "cursor!", occurred_at,
                      type AS "event_type: EventType", data "#
                + $after
            $(, $arg)*
        )
    };
}

/// A position in the public feed: the `(feed_xid, id)` of the last event delivered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct FeedCursor {
    xid: u64,
    id: i64,
}

impl FeedCursor {
    /// Reads a cursor as [`EventRecord::cursor`] writes it, `<feed_xid>-<id>`, ASCII digits
    /// only (no sign, no spaces); `None` for anything else.
    pub fn parse(text: &str) -> Option<Self> {
        let (xid, id) = text.split_once('-')?;
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(xid) || !digits(id) {
            return None;
        }
        Some(FeedCursor {
            xid: xid.parse().ok()?,
            id: id.parse().ok()?,
        })
    }
}

/// Appends events of one workspace's subjects: one statement whatever their number, the
/// `append_events` function (`sql/append_events.sql`), which takes the subjects' locks and
/// then numbers the events in an INSERT that reads after them.
///
/// No NOTIFY: PostgreSQL serializes the commits of every transaction that notifies (one
/// lock on the notification queue, held through the commit's WAL flush), which would make
/// every event-writing transaction of the deployment commit one at a time. Streams learn
/// of commits from the snapshot instead ([`snapshot`]).
pub async fn append(conn: &mut PgConnection, scope: &Scope, events: &[NewEvent<'_>]) -> Result<()> {
    append_counted(conn, scope, events).await.map(drop)
}

/// [`append`], answering how many events it wrote: `events` and the `task.updated` it adds.
pub(crate) async fn append_counted(
    conn: &mut PgConnection,
    scope: &Scope,
    events: &[NewEvent<'_>],
) -> Result<usize> {
    if events.is_empty() {
        return Ok(0);
    }
    let batch = Batch::of(events);
    sqlx::query_scalar!(
        r#"SELECT append_events($1, $2, $3, $4, $5, $6, $7, $8) AS "appended!""#,
        SUBJECT_LOCK_CLASS,
        &batch.event_ids,
        &batch.task_ids as &[Option<&str>],
        &batch.run_ids as &[Option<&str>],
        &batch.media_job_ids as &[Option<&str>],
        &batch.types as &[&str],
        &batch.data as &[serde_json::Value],
        scope.workspace(),
    )
    .fetch_one(conn)
    .await?;
    Ok(batch.types.len())
}

/// Events as the columns of an `append_events` call (`sql/append_events.sql`), with the
/// `task.updated` they add: for a statement that appends them besides its own write
/// (a run's transition), so the append costs no round trip of its own. Such a statement
/// must be its transaction's last to take a lock, as [`append`] is.
#[derive(Default)]
pub(crate) struct Batch<'a> {
    pub(crate) event_ids: Vec<String>,
    pub(crate) task_ids: Vec<Option<&'a str>>,
    pub(crate) run_ids: Vec<Option<&'a str>>,
    pub(crate) media_job_ids: Vec<Option<&'a str>>,
    pub(crate) types: Vec<&'static str>,
    pub(crate) data: Vec<serde_json::Value>,
}

impl<'a> Batch<'a> {
    /// The lock class `append_events` takes the subjects' locks in.
    pub(crate) const LOCK_CLASS: i32 = SUBJECT_LOCK_CLASS;

    pub(crate) fn of(events: &[NewEvent<'a>]) -> Batch<'a> {
        let mut batch = Batch::default();
        for (event, update) in events.iter().zip(task_updates(events)) {
            if let Some(update) = update {
                batch.push(&update);
            }
            batch.push(event);
        }
        batch
    }

    fn push(&mut self, event: &NewEvent<'a>) {
        let (task_id, run_id, media_job_id) = event.subject.columns();
        self.event_ids.push(new_id("evt"));
        self.task_ids.push(task_id);
        self.run_ids.push(run_id);
        self.media_job_ids.push(media_job_id);
        self.types.push(event.event_type.as_str());
        self.data.push(event.data.clone());
    }
}

/// The `task.updated` to append before each of `events`, if any: before each event that
/// changes its run's status, and so its task's (a task's status is its latest run's, and
/// only a task's latest run can change status). The task's change reaches the run's stream
/// and the feed in the statement that appends the run's, at no cost of its own in round
/// trips. One per run and status within a batch (two gates' `approval.requested` make one).
fn task_updates<'a>(events: &[NewEvent<'a>]) -> Vec<Option<NewEvent<'a>>> {
    let mut announced: Vec<(&str, &str)> = Vec::new();
    events
        .iter()
        .map(|event| {
            let (Subject::Run { task_id, run_id }, Some(status)) =
                (event.subject, task_status_after(event))
            else {
                return None;
            };
            if announced.contains(&(run_id, status)) {
                return None;
            }
            announced.push((run_id, status));
            let data = serde_json::json!({ "status": status, "run_id": run_id });
            Some(NewEvent::new(task_id, run_id, EventType::TaskUpdated).with(data))
        })
        .collect()
}

/// The status a run (and its task) has once `event` is recorded, for the events that
/// record a change of it. An external action's approval never holds its run.
fn task_status_after(event: &NewEvent<'_>) -> Option<&'static str> {
    Some(match event.event_type {
        EventType::RunQueued => "queued",
        EventType::RunStarted => "running",
        EventType::RunFinished => "completed",
        EventType::RunFailed => "failed",
        EventType::RunCancelled => "cancelled",
        EventType::ApprovalRequested if event.data["kind"] != "external_action" => {
            "awaiting_approval"
        }
        _ => return None,
    })
}

/// What one batch of history retention did: the greatest id it examined that was old
/// enough to go (None when the batch held none: the older rows were all examined), and how
/// many rows it deleted.
pub(crate) struct Pruned {
    pub(crate) last: Option<i64>,
    pub(crate) deleted: i64,
}

/// History retention over events: of the `limit` events after id `after`, deletes those
/// that occurred more than `days` days ago, except each subject's last one, which keeps
/// the subject's numbering going on from where it stood (a stream's `Last-Event-ID`, a
/// resume's checkpoint). Ids grow with time, so the batches walk the oldest first, and a
/// batch past the old ones reads `limit` rows and finds none. Rows another replica's pass
/// holds are left to it (`SKIP LOCKED`), so two passes never wait on each other.
pub(crate) async fn prune(
    conn: &mut PgConnection,
    after: i64,
    days: i32,
    limit: i64,
) -> Result<Pruned> {
    let pruned = sqlx::query_as!(
        Pruned,
        r#"WITH batch AS (
               SELECT id, run_id, media_job_id, sequence FROM (
                   SELECT id, run_id, media_job_id, sequence, occurred_at FROM run_events
                   WHERE id > $1 ORDER BY id LIMIT $3
               ) AS next
               WHERE occurred_at < now() - make_interval(days => $2)
           ), doomed AS (
               SELECT e.id FROM run_events e
               WHERE e.id IN (
                   SELECT b.id FROM batch b
                   WHERE EXISTS (SELECT 1 FROM run_events n
                                 WHERE n.run_id = b.run_id AND n.sequence > b.sequence)
                      OR EXISTS (SELECT 1 FROM run_events n
                                 WHERE n.media_job_id = b.media_job_id AND n.sequence > b.sequence))
               FOR UPDATE SKIP LOCKED
           ), deleted AS (
               DELETE FROM run_events e WHERE e.id IN (SELECT id FROM doomed) RETURNING e.id
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

/// The sequence of the run's last event (0 before its first).
pub async fn last_sequence_of_run(
    conn: &mut PgConnection,
    scope: &Scope,
    run_id: &str,
) -> Result<i64> {
    let last = sqlx::query_scalar!(
        "SELECT max(sequence) FROM run_events WHERE workspace_id = $1 AND run_id = $2",
        scope.workspace(),
        run_id,
    )
    .fetch_one(conn)
    .await?;
    Ok(last.unwrap_or(0))
}

pub async fn list_for_run(
    conn: &mut PgConnection,
    scope: &Scope,
    run_id: &str,
    after_sequence: i64,
    limit: i64,
) -> Result<Vec<EventRecord>> {
    let rows = query_events!(
        "SELECT",
        "FROM run_events
         WHERE workspace_id = $1 AND run_id = $2 AND sequence > $3
         ORDER BY sequence LIMIT $4",
        scope.workspace(),
        run_id,
        after_sequence,
        limit,
    )
    .fetch_all(conn)
    .await?;
    Ok(rows)
}

/// Filters of the public feed: they AND together; the types within `event_types` OR.
#[derive(Debug, Clone, Default)]
pub struct FeedFilter {
    pub event_types: Option<Vec<String>>,
    pub task_id: Option<String>,
    pub media_job_id: Option<String>,
}

/// One workspace's events after the cursor in feed order, only those below the horizon:
/// another workspace's never appear, though their positions interleave.
pub async fn list_feed(
    conn: &mut PgConnection,
    scope: &Scope,
    filter: &FeedFilter,
    after: FeedCursor,
    limit: i64,
) -> Result<Vec<EventRecord>> {
    // The horizon comes from the statement's own snapshot, the one its rows come from.
    let rows = query_events!(
        "SELECT",
        "FROM run_events
         WHERE workspace_id = $1 AND (feed_xid, id) > ($2::text::xid8, $3)
           AND feed_xid < (SELECT pg_snapshot_xmin(pg_current_snapshot()))
           AND ($4::text[] IS NULL OR type = ANY($4))
           AND ($5::text IS NULL OR task_id = $5)
           AND ($6::text IS NULL OR media_job_id = $6)
         ORDER BY feed_xid, id LIMIT $7",
        scope.workspace(),
        after.xid.to_string(),
        after.id,
        filter.event_types.as_deref(),
        filter.task_id.as_deref(),
        filter.media_job_id.as_deref(),
        limit,
    )
    .fetch_all(conn)
    .await?;
    Ok(rows)
}

/// The current snapshot, as text. It changes whenever a writing transaction anywhere in the
/// cluster takes its id or ends, so with every commit of events and every advance of the
/// feed's horizon: what the streams poll to learn that there may be something new to read.
pub(crate) async fn snapshot(conn: &mut PgConnection) -> Result<String> {
    let snapshot = sqlx::query_scalar!(r#"SELECT pg_current_snapshot()::text AS "snapshot!""#)
        .fetch_one(conn)
        .await?;
    Ok(snapshot)
}
