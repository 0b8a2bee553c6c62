//! Client-orchestrated runs: a run an external agent (an editor, an ACP host) carries out
//! itself and records here: its steps, text artifacts, events and end. Its client holds the run instead of a worker: a lease with a
//! secret token (only its SHA-256 is stored) and an expiry that every accepted append
//! renews. An append is fenced by the lease as a worker's writes are by theirs: the token
//! must match, the lease must not have expired, the run must still be running, and the
//! run row is locked while it writes. A lease that lapses fails the run
//! (`client_lease_expired`), since no one else can do a client's work. Renewals stop at the
//! lease's `renewable_until` (its start plus `KEEL_CLIENT_LEASE_MAX_MS`): a client cannot
//! hold a run for ever by appending, and its run then fails as `client_lease_max_reached`.
//! What the appends store counts toward the run's and the workspace's byte quotas
//! ([`crate::quotas`]); an append over one is refused whole.

use chrono::{DateTime, Utc};
use sha2::{Digest, Sha256};
use sqlx::{PgConnection, PgPool};
use subtle::ConstantTimeEq;

use keel_api_types::{
    ArtifactKind, ClientArtifact, ClientFinish, ClientOutcome, ClientRun, ClientRunRequest,
    ClientStep, DEFAULT_CLIENT_LEASE_MS, MAX_CLIENT_ARTIFACT_CHARS, MAX_CLIENT_ARTIFACTS,
    MAX_CLIENT_EVENTS, MAX_CLIENT_LEASE_MS, MAX_CLIENT_NAME, MAX_CLIENT_STEPS, MIN_CLIENT_LEASE_MS,
    RunEventsAccepted, RunEventsRequest,
};
use keel_workers::StepResult;

use crate::artifacts;
use crate::artifacts::NewArtifact;
use crate::artifacts::content::ContentStore;
use crate::db::{Result, StoreError};
use crate::domain::{
    Actor, EventType, Invalid, RunStatus, Scope, check_free_json, is_word_name, new_id,
};
use crate::events;
use crate::events::{NewEvent, Subject};
use crate::runs::steps::{self, NewStep, StepRecord};
use crate::runs::{self, Admission, AdmissionRules, Admitted, Change, Orchestrator, Origin};

/// Checks a start's body as the document states it.
pub(crate) fn check_start(request: &ClientRunRequest) -> std::result::Result<(), Invalid> {
    if let Some(ms) = request.lease_ms
        && !(MIN_CLIENT_LEASE_MS..=MAX_CLIENT_LEASE_MS).contains(&ms)
    {
        return Err(Invalid::new(
            "lease_ms",
            format!("must be {MIN_CLIENT_LEASE_MS} to {MAX_CLIENT_LEASE_MS}"),
        ));
    }
    check_text("reason", request.reason.as_deref(), 1024)
}

/// Checks an append's body as the document states it.
pub(crate) fn check_append(request: &RunEventsRequest) -> std::result::Result<(), Invalid> {
    if request.events.len() > MAX_CLIENT_EVENTS || request.steps.len() > MAX_CLIENT_STEPS {
        return Err(Invalid::new(
            "events",
            format!(
                "an append carries at most {MAX_CLIENT_EVENTS} events and {MAX_CLIENT_STEPS} steps"
            ),
        ));
    }
    for event in &request.events {
        check_name("events", &event.kind)?;
        check_object("events", &event.data)?;
    }
    for step in &request.steps {
        check_name("steps", &step.name)?;
        check_object("steps", &step.input)?;
        if let Some(output) = &step.output {
            check_object("steps", output)?;
        }
        check_text("steps", step.error.as_deref(), 4096)?;
    }
    if request.artifacts.len() > MAX_CLIENT_ARTIFACTS {
        return Err(Invalid::new(
            "artifacts",
            format!("an append carries at most {MAX_CLIENT_ARTIFACTS} artifacts"),
        ));
    }
    for artifact in &request.artifacts {
        check_name("artifacts", &artifact.name)?;
        check_text("artifacts", Some(&artifact.text), MAX_CLIENT_ARTIFACT_CHARS)?;
        if let Some(media_type) = &artifact.content_type
            && !is_media_type(media_type)
        {
            return Err(Invalid::new(
                "artifacts",
                format!("{media_type:?} is not a media type (type/subtype, no parameters)"),
            ));
        }
    }
    let finish = request.finish.as_ref();
    check_text("finish", finish.and_then(|f| f.error.as_deref()), 4096)
}

/// `type/subtype` of token characters, as the document's pattern states it.
fn is_media_type(value: &str) -> bool {
    let token = |part: &str| {
        !part.is_empty()
            && part
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "!#$&^_.+-".contains(c))
    };
    value.len() <= 127
        && value
            .split_once('/')
            .is_some_and(|(t, s)| token(t) && token(s))
}

/// A client event's kind or step's name: lower-case words and digits joined by one `.`,
/// `_` or `-` ([`keel_api_types::CLIENT_NAME`]).
fn check_name(field: &'static str, name: &str) -> std::result::Result<(), Invalid> {
    match is_word_name(name, &['.', '_', '-']) && name.len() <= MAX_CLIENT_NAME {
        true => Ok(()),
        false => Err(Invalid::new(
            field,
            format!(
                "{name:?}: a kind or name is 1 to {MAX_CLIENT_NAME} lower-case letters and \
                 digits, in words joined by one '.', '_' or '-'"
            ),
        )),
    }
}

fn check_object(
    field: &'static str,
    value: &serde_json::Value,
) -> std::result::Result<(), Invalid> {
    if !value.is_object() {
        return Err(Invalid::new(
            field,
            "data, input and output are JSON objects",
        ));
    }
    check_free_json(field, value)
}

fn check_text(
    field: &'static str,
    text: Option<&str>,
    max: usize,
) -> std::result::Result<(), Invalid> {
    match text {
        Some(text) if text.chars().count() > max || text.contains('\0') => Err(Invalid::new(
            field,
            format!("text is at most {max} characters, without NUL"),
        )),
        _ => Ok(()),
    }
}

/// The longest a client holds its run when remote mode sets no maximum: 24 hours.
pub const REMOTE_CLIENT_LEASE_MAX_MS: u64 = 24 * 3600 * 1000;

/// Starts a client-orchestrated run of the task: running at once, held by the caller, at
/// most for the rules' maximum.
pub(crate) async fn start(
    conn: &mut PgConnection,
    scope: &Scope,
    task_id: &str,
    request: &ClientRunRequest,
    rules: &AdmissionRules,
    actor: &Actor,
) -> Result<ClientRun> {
    let admission = Admission {
        reason: request.reason.clone(),
        orchestrator: Orchestrator::Client,
        ..Admission::new(Origin::Start)
    };
    let Admitted::New(run) = runs::admit(conn, scope, task_id, admission, rules, actor).await?
    else {
        unreachable!("a client run is admitted without an idempotency key, so never replayed");
    };
    let token = new_token();
    let lease_ms = request.lease_ms.unwrap_or(DEFAULT_CLIENT_LEASE_MS) as i32;
    let max_ms = rules.client_lease_max.map(|max| max.as_millis() as f64);
    // least() skips a NULL: without a maximum the lease is simply its length.
    let lease_expires_at = sqlx::query_scalar!(
        "INSERT INTO client_leases (run_id, workspace_id, token_sha256, holder, lease_ms,
                                    expires_at, renewable_until)
         SELECT $1, $2, $3, $4, $5, least(now() + make_interval(secs => $5::int / 1000.0), until),
                until
         FROM (SELECT now() + make_interval(secs => $6::float8 / 1000) AS until) max
         RETURNING expires_at",
        run.id,
        scope.workspace(),
        digest(&token),
        actor.to_string(),
        lease_ms,
        max_ms,
    )
    .fetch_one(conn)
    .await?;
    Ok(ClientRun {
        run,
        lease_token: token,
        lease_expires_at,
    })
}

/// A lease token: 256 random bits, with a prefix that says what it is.
fn new_token() -> String {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).expect("the operating system's random source");
    format!("kcl_{}", hex::encode(bytes))
}

fn digest(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

struct LeaseRow {
    token_sha256: String,
    expires_at: DateTime<Utc>,
    /// Whether the lease ran to its maximum rather than its length.
    at_max: bool,
}

/// Records what the client sends (its steps, its events, its end) on the run it holds, in
/// the caller's transaction, and renews the lease; see the module's fencing.
pub(crate) async fn append(
    conn: &mut PgConnection,
    (scope, content): (&Scope, &ContentStore),
    (task_id, run_id): (&str, &str),
    request: &RunEventsRequest,
    actor: &Actor,
) -> Result<RunEventsAccepted> {
    let run = runs::lock(conn, scope, run_id).await?;
    if run.task_id != task_id {
        return Err(StoreError::NotFound("run"));
    }
    fence(conn, scope, &run, &request.lease_token).await?;
    let mut appended = Vec::new();
    let stored = store_steps(conn, scope, (task_id, run_id), &request.steps).await?;
    for step in &stored {
        appended.push(steps::started_event(step));
        appended.push(steps::finished_event(step));
    }
    let subject = Subject::Run { task_id, run_id };
    for artifact in &request.artifacts {
        appended.push(store_artifact(conn, scope, content, subject, artifact).await?);
    }
    for event in &request.events {
        let data = serde_json::json!({ "kind": event.kind, "data": event.data });
        appended.push(NewEvent::new(task_id, run_id, EventType::ClientEvent).with(data));
    }
    let (run, lease_expires_at) = match &request.finish {
        Some(finish) => {
            let (run, end) = finish_run(conn, scope, &run, finish, actor).await?;
            appended.push(end);
            (run, None)
        }
        None => (run, Some(renew(conn, scope, run_id).await?)),
    };
    let count = events::append_counted(conn, scope, &appended).await?;
    Ok(RunEventsAccepted {
        run,
        appended: count as i64,
        lease_expires_at,
    })
}

/// Refuses an append unless the token holds the locked run's lease, the run still runs and
/// the lease has not lapsed (the module's fencing).
async fn fence(
    conn: &mut PgConnection,
    scope: &Scope,
    run: &runs::RunRecord,
    lease_token: &str,
) -> Result<()> {
    let run_id = &run.id;
    let lease = sqlx::query_as!(
        LeaseRow,
        r#"SELECT token_sha256, expires_at,
                  coalesce(expires_at >= renewable_until, false) AS "at_max!"
           FROM client_leases WHERE workspace_id = $1 AND run_id = $2"#,
        scope.workspace(),
        run_id,
    )
    .fetch_optional(&mut *conn)
    .await?
    .ok_or_else(|| {
        StoreError::Conflict(format!(
            "run {run_id} is carried out by a worker; only a client-orchestrated run takes \
             appends"
        ))
    })?;
    let presented = digest(lease_token);
    if !bool::from(presented.as_bytes().ct_eq(lease.token_sha256.as_bytes())) {
        return Err(StoreError::Forbidden(format!(
            "the lease token does not hold run {run_id}"
        )));
    }
    let start_again = || {
        let task_id = &run.task_id;
        format!("Start a new client run of the task: keel runs client-start {task_id}.")
    };
    if run.status != RunStatus::Running {
        return Err(StoreError::conflict_next(
            format!("run {run_id} is {}; its lease ended with it", run.status),
            start_again(),
        ));
    }
    if lease.expires_at <= Utc::now() {
        return Err(StoreError::conflict_next(
            format!(
                "run {run_id}'s lease expired at {}; the run fails as {}",
                lease.expires_at.to_rfc3339(),
                lapse_code(lease.at_max),
            ),
            start_again(),
        ));
    }
    Ok(())
}

/// Stores the client's steps: a client reports a step once it is over, so each one starts
/// and ends here at the instant it arrives.
async fn store_steps(
    conn: &mut PgConnection,
    scope: &Scope,
    (task_id, run_id): (&str, &str),
    client_steps: &[ClientStep],
) -> Result<Vec<StepRecord>> {
    let mut stored = Vec::new();
    for step in client_steps {
        let result = match step.status {
            ClientOutcome::Completed => StepResult::Completed {
                output: step.output.clone().unwrap_or_default(),
            },
            ClientOutcome::Failed => StepResult::Failed {
                error: step.error.clone().unwrap_or_else(|| "failed".into()),
            },
        };
        let (id, now) = (new_id("step"), Utc::now());
        let new = NewStep {
            id: &id,
            task_id,
            run_id,
            name: &step.name,
            input: &step.input,
            started_at: now,
            ended: Some((&result, now)),
        };
        stored.push(steps::insert(conn, scope, &new).await?);
    }
    Ok(stored)
}

/// Stores a client's text artifact, complete; returns its `artifact.created`. A name the
/// run already used is a conflict.
async fn store_artifact<'a>(
    conn: &mut PgConnection,
    scope: &Scope,
    content: &ContentStore,
    subject: Subject<'a>,
    artifact: &ClientArtifact,
) -> Result<NewEvent<'a>> {
    let id = new_id("art");
    let new = NewArtifact {
        id: &id,
        owner: subject,
        name: &artifact.name,
        kind: ArtifactKind::File.as_str(),
        content_type: artifact.content_type.as_deref().unwrap_or("text/plain"),
        closed: true,
    };
    let upserted = artifacts::upsert(conn, scope, &new).await?;
    let Some(created) = artifacts::created_event(subject, &upserted) else {
        return Err(StoreError::Conflict(format!(
            "the run already has an artifact named {}",
            artifact.name
        )));
    };
    let bytes = artifact.text.as_bytes();
    content
        .append(conn, scope, &upserted.artifact.id, bytes, i64::MAX)
        .await?;
    Ok(created)
}

/// Ends the run as its client says, with the event that says so.
async fn finish_run<'a>(
    conn: &mut PgConnection,
    scope: &Scope,
    run: &'a runs::RunRecord,
    finish: &ClientFinish,
    actor: &Actor,
) -> Result<(runs::RunRecord, NewEvent<'a>)> {
    let (status, event_type) = match finish.status {
        ClientOutcome::Completed => (RunStatus::Completed, EventType::RunFinished),
        ClientOutcome::Failed => (RunStatus::Failed, EventType::RunFailed),
    };
    let error = finish
        .error
        .as_deref()
        .filter(|_| status == RunStatus::Failed);
    let change = Change {
        last_error: error,
        ..Change::default()
    };
    let reason = Some("ended by its client");
    let ended = runs::transition_locked(conn, scope, run, status, change, actor, reason).await?;
    let data = serde_json::json!({ "orchestrator": "client", "error": error });
    Ok((
        ended,
        NewEvent::new(&run.task_id, &run.id, event_type).with(data),
    ))
}

/// Extends the lease by its length from now, up to its maximum.
async fn renew(conn: &mut PgConnection, scope: &Scope, run_id: &str) -> Result<DateTime<Utc>> {
    Ok(sqlx::query_scalar!(
        "UPDATE client_leases
         SET expires_at = least(now() + make_interval(secs => lease_ms / 1000.0), renewable_until)
         WHERE workspace_id = $1 AND run_id = $2 RETURNING expires_at",
        scope.workspace(),
        run_id,
    )
    .fetch_one(conn)
    .await?)
}

/// Most runs one sweep fails.
const SWEEP_BATCH: i64 = 100;

struct Lapsed {
    run_id: String,
    workspace_id: String,
    lease_ms: i32,
}

/// Fails the running client-orchestrated runs whose lease lapsed, each in its own
/// transaction, skipping runs another replica (or an append) holds; returns how many.
pub(crate) async fn expire(pool: &PgPool) -> Result<u64> {
    let lapsed = sqlx::query_as!(
        Lapsed,
        "SELECT c.run_id, c.workspace_id, c.lease_ms FROM client_leases c
         JOIN runs r ON r.id = c.run_id
         WHERE c.expires_at < now() AND r.status = 'running'
         ORDER BY c.expires_at LIMIT $1",
        SWEEP_BATCH,
    )
    .fetch_all(pool)
    .await?;
    let mut failed = 0;
    for lapsed in lapsed {
        let mut tx = pool.begin().await?;
        failed += u64::from(fail_lapsed(&mut tx, &lapsed).await?);
        tx.commit().await?;
    }
    Ok(failed)
}

/// How a run whose lease lapsed fails: its client went silent, or held it as long as it
/// may.
fn lapse_code(at_max: bool) -> &'static str {
    match at_max {
        true => "client_lease_max_reached",
        false => "client_lease_expired",
    }
}

/// Fails one lapsed run, if it is still running with its lease lapsed once locked (an
/// append may have renewed it meanwhile).
async fn fail_lapsed(conn: &mut PgConnection, lapsed: &Lapsed) -> Result<bool> {
    let scope = Scope::new(lapsed.workspace_id.clone());
    let run = runs::lock(conn, &scope, &lapsed.run_id).await?;
    let lease = sqlx::query!(
        r#"SELECT expires_at < now() AS "lapsed!",
                  coalesce(expires_at >= renewable_until, false) AS "at_max!"
           FROM client_leases WHERE run_id = $1"#,
        lapsed.run_id,
    )
    .fetch_one(&mut *conn)
    .await?;
    if run.status != RunStatus::Running || !lease.lapsed {
        return Ok(false);
    }
    let error = match lease.at_max {
        true => format!(
            "{}: the client held the run for the longest a client may (from {})",
            lapse_code(true),
            run.created_at.to_rfc3339()
        ),
        false => format!(
            "{}: the client did not append within its {} ms lease",
            lapse_code(false),
            lapsed.lease_ms
        ),
    };
    let change = Change {
        last_error: Some(&error),
        ..Change::default()
    };
    let (failed, system) = (RunStatus::Failed, &Actor::System);
    runs::transition_locked(conn, &scope, &run, failed, change, system, Some(&error)).await?;
    runs::close_open_work(conn, &scope, &run.id, "failed", &error).await?;
    let data = serde_json::json!({ "orchestrator": "client", "error": error });
    let event = NewEvent::new(&run.task_id, &run.id, EventType::RunFailed).with(data);
    events::append(conn, &scope, &[event]).await?;
    Ok(true)
}
