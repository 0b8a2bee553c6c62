//! Steps: what a run did, one row per executor step.

use chrono::{DateTime, Utc};
use keel_workers::StepResult;
use sqlx::PgConnection;
use sqlx::types::Json;

use crate::artifacts::{NewArtifact, Upserted, UpsertedJson};
use crate::db::{Result, StoreError};
use crate::domain::{EventType, Scope, new_id};
use crate::events;
use crate::events::NewEvent;
use keel_api_types::{StepStatus, cut_chars};

pub(crate) use keel_api_types::StepRecord;

/// `query_as!` of [`StepRecord`]s: `$before` (up to its `SELECT` or `RETURNING`), then the
/// step's columns (`status` as a [`StepStatus`]), then `$after` (its `FROM …`, or nothing).
macro_rules! query_steps {
    ($before:literal, $after:literal $(, $arg:expr)* $(,)?) => {
        sqlx::query_as!(
            StepRecord,
            $before
                + r#" id, run_id, task_id, index, name, status AS "status: StepStatus", input,
                      output, error, started_at, finished_at "#
                + $after
            $(, $arg)*
        )
    };
}

/// A step as its executor reported it, possibly already ended: a run context may hold a
/// step back and write it once, started and finished, with the next durable write.
pub struct NewStep<'a> {
    pub(crate) id: &'a str,
    pub(crate) task_id: &'a str,
    pub(crate) run_id: &'a str,
    pub(crate) name: &'a str,
    pub(crate) input: &'a serde_json::Value,
    pub(crate) started_at: DateTime<Utc>,
    pub(crate) ended: Option<(&'a StepResult, DateTime<Utc>)>,
}

/// Starts a step now, with its `step.started` event.
pub async fn start(
    conn: &mut PgConnection,
    scope: &Scope,
    task_id: &str,
    run_id: &str,
    name: &str,
    input: &serde_json::Value,
) -> Result<StepRecord> {
    let id = new_id("step");
    let step = NewStep {
        id: &id,
        task_id,
        run_id,
        name,
        input,
        started_at: Utc::now(),
        ended: None,
    };
    let step = insert(conn, scope, &step).await?;
    events::append(conn, scope, &[started_event(&step)]).await?;
    Ok(step)
}

/// Stores a step with the next index of its run; its events are [`started_event`] and, once
/// it ended, [`finished_event`].
pub async fn insert(
    conn: &mut PgConnection,
    scope: &Scope,
    step: &NewStep<'_>,
) -> Result<StepRecord> {
    let (mut steps, _) = write(conn, scope, std::slice::from_ref(step), &[]).await?;
    steps.pop().ok_or(StoreError::NotFound("step"))
}

/// Stores a run's new steps (each with its run's next index, in order) and creates or
/// reopens the artifacts they opened (as `artifacts::upsert` does; each name at most once),
/// in one statement: what a run context held back, written with one round trip.
pub(crate) async fn write(
    conn: &mut PgConnection,
    scope: &Scope,
    steps: &[NewStep<'_>],
    artifacts: &[NewArtifact<'_>],
) -> Result<(Vec<StepRecord>, Vec<Upserted>)> {
    let mut s = StepColumns::default();
    for step in steps {
        s.push(step);
    }
    let mut a = ArtifactColumns::default();
    for artifact in artifacts {
        a.push(artifact);
    }
    let written = sqlx::query!(
        r#"WITH step_rows AS (
               INSERT INTO steps (id, run_id, task_id, index, name, status, input, output, error,
                                  started_at, finished_at, workspace_id)
               SELECT s.id, s.run_id, s.task_id,
                      COALESCE((SELECT max(index) FROM steps e WHERE e.run_id = s.run_id), 0)
                          + row_number() OVER (PARTITION BY s.run_id ORDER BY s.n),
                      s.name, s.status, s.input, s.output, s.error, s.started_at, s.finished_at, $11
               FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[],
                           $6::jsonb[], $7::jsonb[], $8::text[], $9::timestamptz[],
                           $10::timestamptz[])
                    WITH ORDINALITY AS s (id, run_id, task_id, name, status, input, output, error,
                                          started_at, finished_at, n)
               RETURNING id, run_id, task_id, index, name, status, input, output, error,
                         started_at, finished_at
           ), artifact_rows AS (
               INSERT INTO artifacts (id, run_id, task_id, name, kind, content_type, status,
                                      workspace_id)
               SELECT a.id, a.run_id, a.task_id, a.name, a.kind, a.content_type, a.status, $11
               FROM unnest($12::text[], $13::text[], $14::text[], $15::text[], $16::text[],
                           $17::text[], $18::text[])
                    AS a (id, run_id, task_id, name, kind, content_type, status)
               ON CONFLICT (run_id, name) DO UPDATE SET status = EXCLUDED.status, updated_at = now()
                   WHERE artifacts.workspace_id = EXCLUDED.workspace_id
               -- `xmax = 0`: the row version is this statement's insert, not an update.
               RETURNING id, run_id, task_id, media_job_id, name, kind, content_type, size_bytes,
                         truncated, status, storage, created_at, updated_at, xmax = 0 AS created
           )
           SELECT
               (SELECT COALESCE(jsonb_agg(to_jsonb(r) ORDER BY r.index), '[]') FROM step_rows r)
                   AS "steps!: Json<Vec<StepRecord>>",
               (SELECT COALESCE(jsonb_agg(jsonb_build_object('artifact', to_jsonb(r) - 'created',
                                                             'created', r.created)
                                          ORDER BY a.n), '[]')
                FROM unnest($12::text[]) WITH ORDINALITY AS a (id, n)
                JOIN artifact_rows r ON r.name = ($15::text[])[a.n])
                   AS "artifacts!: Json<Vec<UpsertedJson>>""#,
        &s.ids as &[&str],
        &s.run_ids as &[&str],
        &s.task_ids as &[&str],
        &s.names as &[&str],
        &s.statuses as &[&str],
        &s.inputs as &[&serde_json::Value],
        &s.outputs as &[Option<&serde_json::Value>],
        &s.errors as &[Option<&str>],
        &s.started as &[DateTime<Utc>],
        &s.finished as &[Option<DateTime<Utc>>],
        scope.workspace(),
        &a.ids as &[&str],
        &a.run_ids as &[Option<&str>],
        &a.task_ids as &[Option<&str>],
        &a.names as &[&str],
        &a.kinds as &[&str],
        &a.content_types as &[&str],
        &a.statuses as &[&str],
    )
    .fetch_one(conn)
    .await?;
    let artifacts = written
        .artifacts
        .0
        .into_iter()
        .map(Upserted::from)
        .collect();
    Ok((written.steps.0, artifacts))
}

/// New steps as the columns `unnest` reads.
#[derive(Default)]
struct StepColumns<'a> {
    ids: Vec<&'a str>,
    run_ids: Vec<&'a str>,
    task_ids: Vec<&'a str>,
    names: Vec<&'a str>,
    statuses: Vec<&'static str>,
    inputs: Vec<&'a serde_json::Value>,
    outputs: Vec<Option<&'a serde_json::Value>>,
    errors: Vec<Option<&'a str>>,
    started: Vec<DateTime<Utc>>,
    finished: Vec<Option<DateTime<Utc>>>,
}

impl<'a> StepColumns<'a> {
    fn push(&mut self, step: &NewStep<'a>) {
        let (status, output, error, finished_at) = match step.ended {
            None => ("running", None, None, None),
            Some((result, at)) => {
                let (output, error) = result_columns(result);
                (status_of(result), output, error, Some(at))
            }
        };
        self.ids.push(step.id);
        self.run_ids.push(step.run_id);
        self.task_ids.push(step.task_id);
        self.names.push(step.name);
        self.statuses.push(status);
        self.inputs.push(step.input);
        self.outputs.push(output);
        self.errors.push(error);
        self.started.push(step.started_at);
        self.finished.push(finished_at);
    }
}

/// A run's new artifacts as the columns `unnest` reads.
#[derive(Default)]
struct ArtifactColumns<'a> {
    ids: Vec<&'a str>,
    run_ids: Vec<Option<&'a str>>,
    task_ids: Vec<Option<&'a str>>,
    names: Vec<&'a str>,
    kinds: Vec<&'a str>,
    content_types: Vec<&'a str>,
    statuses: Vec<&'static str>,
}

impl<'a> ArtifactColumns<'a> {
    fn push(&mut self, artifact: &NewArtifact<'a>) {
        let (task_id, run_id, media_job_id) = artifact.owner.columns();
        debug_assert!(media_job_id.is_none(), "a step's artifacts are its run's");
        self.ids.push(artifact.id);
        self.run_ids.push(run_id);
        self.task_ids.push(task_id);
        self.names.push(artifact.name);
        self.kinds.push(artifact.kind);
        self.content_types.push(artifact.content_type);
        self.statuses.push(artifact.status());
    }
}

/// Ends a running step as `completed` (with output) or `failed` (with an error), with its
/// event.
pub async fn finish(
    conn: &mut PgConnection,
    scope: &Scope,
    step_id: &str,
    output: Option<&serde_json::Value>,
    error: Option<&str>,
) -> Result<StepRecord> {
    let result = match (output, error) {
        (_, Some(error)) => StepResult::Failed {
            error: error.to_string(),
        },
        (output, None) => StepResult::Completed {
            output: output.cloned().unwrap_or(serde_json::Value::Null),
        },
    };
    let step = end(conn, scope, step_id, &result, Utc::now()).await?;
    events::append(conn, scope, &[finished_event(&step)]).await?;
    Ok(step)
}

/// Ends a running step; its event is [`finished_event`].
pub(crate) async fn end(
    conn: &mut PgConnection,
    scope: &Scope,
    step_id: &str,
    result: &StepResult,
    at: DateTime<Utc>,
) -> Result<StepRecord> {
    let (output, error) = result_columns(result);
    query_steps!(
        "UPDATE steps SET status = $2, output = $3, error = $4, finished_at = $5
         WHERE id = $1 AND workspace_id = $6 AND status = 'running'
         RETURNING",
        "",
        step_id,
        status_of(result),
        output,
        error,
        at,
        scope.workspace(),
    )
    .fetch_optional(conn)
    .await?
    .ok_or(StoreError::NotFound("running step"))
}

/// `step.started` of a stored step.
pub(crate) fn started_event(step: &StepRecord) -> NewEvent<'_> {
    let data = serde_json::json!({ "step_id": step.id, "index": step.index, "name": step.name,
                                   "tool": tool_of(step) });
    NewEvent::new(&step.task_id, &step.run_id, EventType::StepStarted).with(data)
}

/// The tool an agent's `tool_call` step called (its input's `name`), so a reader of the
/// stream need not fetch the step to say which; None for other steps.
pub(super) fn tool_of(step: &StepRecord) -> Option<&str> {
    match step.name.as_str() {
        "tool_call" => step.input["name"].as_str(),
        _ => None,
    }
}

/// The arguments of a `tool_call` step, abridged for a line of the stream (the step has
/// them whole); None for other steps.
fn arguments_of(step: &StepRecord) -> Option<String> {
    tool_of(step)?;
    let arguments = step.input["arguments"].as_str()?;
    Some(cut_chars(arguments, EVENT_ARGUMENTS_CHARS).0)
}

/// The most characters of a tool call's arguments its step's end event carries.
const EVENT_ARGUMENTS_CHARS: usize = 500;

/// `step.finished` or `step.failed` of an ended step.
pub(crate) fn finished_event(step: &StepRecord) -> NewEvent<'_> {
    let event_type = if step.status == StepStatus::Failed {
        EventType::StepFailed
    } else {
        EventType::StepFinished
    };
    let data = serde_json::json!({ "step_id": step.id, "index": step.index, "name": step.name,
                                   "tool": tool_of(step), "arguments": arguments_of(step),
                                   "status": step.status,
                                   "output": step.output, "error": step.error,
                                   "started_at": step.started_at,
                                   "finished_at": step.finished_at });
    NewEvent::new(&step.task_id, &step.run_id, event_type).with(data)
}

fn status_of(result: &StepResult) -> &'static str {
    match result {
        StepResult::Completed { .. } => "completed",
        StepResult::Failed { .. } => "failed",
    }
}

fn result_columns(result: &StepResult) -> (Option<&serde_json::Value>, Option<&str>) {
    match result {
        StepResult::Completed { output } => (Some(output).filter(|o| !o.is_null()), None),
        StepResult::Failed { error } => (None, Some(error)),
    }
}

pub async fn list(
    conn: &mut PgConnection,
    scope: &Scope,
    run_id: &str,
    after_index: i32,
    limit: i64,
) -> Result<Vec<StepRecord>> {
    let rows = query_steps!(
        "SELECT",
        "FROM steps WHERE workspace_id = $1 AND run_id = $2 AND index > $3
         ORDER BY index LIMIT $4",
        scope.workspace(),
        run_id,
        after_index,
        limit,
    )
    .fetch_all(conn)
    .await?;
    Ok(rows)
}

/// A run's last `limit` steps, in their order.
pub async fn latest(
    conn: &mut PgConnection,
    scope: &Scope,
    run_id: &str,
    limit: i64,
) -> Result<Vec<StepRecord>> {
    let mut rows = query_steps!(
        "SELECT",
        "FROM steps WHERE workspace_id = $1 AND run_id = $2 ORDER BY index DESC LIMIT $3",
        scope.workspace(),
        run_id,
        limit,
    )
    .fetch_all(conn)
    .await?;
    rows.reverse();
    Ok(rows)
}

/// One of a run's steps.
pub async fn get(
    conn: &mut PgConnection,
    scope: &Scope,
    run_id: &str,
    step_id: &str,
) -> Result<StepRecord> {
    query_steps!(
        "SELECT",
        "FROM steps WHERE workspace_id = $1 AND run_id = $2 AND id = $3",
        scope.workspace(),
        run_id,
        step_id,
    )
    .fetch_optional(conn)
    .await?
    .ok_or(StoreError::NotFound("step"))
}
