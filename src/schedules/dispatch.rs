//! Schedule dispatch: turns due schedules into runs. It runs in every worker (and `serve`)
//! and is correct with any number of dispatchers at once, with no leader and no
//! process-local lock:
//!
//! 1. **Take over**: a claim left unresolved (its dispatcher died between claiming and
//!    resolving) is re-claimed with a new token after [`STALE_CLAIM`] and resolved first.
//! 2. **Claim** (one transaction): lock due schedules with `SKIP LOCKED`, insert the
//!    occurrence for the time each fires for (unique on schedule and time) as `claimed`
//!    under a fresh token, and advance `next_run_at` and the revision.
//! 3. **Resolve** (one transaction per claim): lock the task row, then the occurrence if the
//!    token still holds it, and admit the run through `runs::admit`, the path a manual start
//!    takes, requested by the schedule's last writer (so they cannot approve it, as they
//!    could not approve a run they started by hand). A refusal because a run is active makes the occurrence `skipped`; any other
//!    refusal makes it `failed` with the reason. The run and the occurrence's outcome
//!    commit together, so an occurrence never has two runs.
//!
//! Time comes in as `now`, so tests step a simulated clock through hours of schedule.

use chrono::{DateTime, TimeDelta, Utc};
use sqlx::{Connection, PgConnection, PgPool};

use crate::db::{Result, StoreError};
use crate::domain::{Actor, Scope};
use crate::runs;
use crate::runs::{Admission, AdmissionRules, Admitted, Origin, ScheduleProvenance};
use crate::schedules;
use crate::schedules::{Claim, OccurrenceRecord, Outcome, ScheduleRecord, ScheduleRecordExt};
use crate::tasks;

/// Schedules claimed per transaction.
const BATCH: i64 = 100;

/// How long a claim may stay unresolved before another dispatcher takes it over. Resolving
/// takes one short transaction, so a claim this old was abandoned; taking over a live one
/// anyway is safe (the token fences it), only wasteful.
pub const STALE_CLAIM: TimeDelta = TimeDelta::seconds(60);

/// Fires every schedule due at `now` and takes over stale claims; returns the occurrences
/// this call resolved.
pub async fn dispatch_due(
    pool: &PgPool,
    rules: &AdmissionRules,
    now: DateTime<Utc>,
) -> Result<Vec<OccurrenceRecord>> {
    let mut resolved = Vec::new();
    // Abandoned claims first: they stand for earlier times than anything due now.
    let mut tx = pool.begin().await?;
    let stale = schedules::take_over_stale(&mut tx, now - STALE_CLAIM, now, BATCH).await?;
    tx.commit().await?;
    if !stale.is_empty() {
        tracing::warn!(claims = stale.len(), "took over stale schedule claims");
    }
    resolve_all(pool, rules, &stale, now, &mut resolved).await?;
    loop {
        let (taken, claims) = claim_due(pool, now).await?;
        resolve_all(pool, rules, &claims, now, &mut resolved).await?;
        if taken < BATCH as usize {
            break;
        }
    }
    Ok(resolved)
}

/// Step 1 for one batch: returns how many schedules it took, and the claims it made.
async fn claim_due(pool: &PgPool, now: DateTime<Utc>) -> Result<(usize, Vec<Claim>)> {
    let mut tx = pool.begin().await?;
    let due = schedules::lock_due(&mut tx, now, BATCH).await?;
    let mut claims = Vec::new();
    for schedule in &due {
        claims.extend(fire(&mut tx, schedule, now).await?);
    }
    tx.commit().await?;
    Ok((due.len(), claims))
}

/// Claims the occurrence a locked, due schedule fires for and advances the schedule.
async fn fire(
    conn: &mut PgConnection,
    schedule: &ScheduleRecord,
    now: DateTime<Utc>,
) -> Result<Option<Claim>> {
    let due = schedule
        .next_run_at
        .expect("an enabled schedule has a next_run_at (a table CHECK says so)");
    let definition = match schedule.definition() {
        Ok(definition) => definition,
        Err(invalid) => {
            // Only a changed cron parser gets here; firing on a guess would be worse.
            tracing::error!(schedule_id = %schedule.id, %invalid,
                "a stored schedule no longer parses; disabling it");
            schedules::advance(conn, schedule, None).await?;
            return Ok(None);
        }
    };
    let firing = definition.fire(due, now);
    schedules::advance(conn, schedule, firing.next_run_at).await?;
    schedules::claim(conn, schedule, firing.scheduled_for, now).await
}

async fn resolve_all(
    pool: &PgPool,
    rules: &AdmissionRules,
    claims: &[Claim],
    now: DateTime<Utc>,
    resolved: &mut Vec<OccurrenceRecord>,
) -> Result<()> {
    for claim in claims {
        resolved.extend(resolve(pool, rules, claim, now).await?);
    }
    Ok(())
}

/// Step 2: None when the claim is no longer this dispatcher's to resolve.
async fn resolve(
    pool: &PgPool,
    rules: &AdmissionRules,
    claim: &Claim,
    now: DateTime<Utc>,
) -> Result<Option<OccurrenceRecord>> {
    let mut tx = pool.begin().await?;
    let scope = claim.scope();
    // The task row first, the lock order of admission and task deletion.
    match tasks::lock(&mut tx, &scope, &claim.task_id).await {
        // The task is gone, and with it the schedule and this occurrence.
        Err(StoreError::NotFound(_)) => return Ok(None),
        other => other?,
    }
    if !schedules::lock_claim(&mut tx, claim).await? {
        return Ok(None);
    }
    let writer = schedules::writer(&mut tx, &scope, &claim.schedule_id).await?;
    let outcome = admit(&mut tx, &scope, rules, claim, writer).await?;
    let occurrence =
        schedules::resolve(&mut tx, &scope, &claim.occurrence_id, &outcome, now).await?;
    tx.commit().await?;
    Ok(Some(occurrence))
}

/// Admits the run inside a savepoint, so that a refusal, even one the database raised,
/// leaves the transaction usable for recording why. Keel admits it (`system` in the audit
/// trail); the schedule's `writer` requested it.
async fn admit(
    conn: &mut PgConnection,
    scope: &Scope,
    rules: &AdmissionRules,
    claim: &Claim,
    writer: Option<String>,
) -> Result<Outcome> {
    let mut savepoint = conn.begin().await?;
    let admission = Admission {
        schedule: Some(ScheduleProvenance {
            schedule_id: claim.schedule_id.clone(),
            schedule_occurrence_id: claim.occurrence_id.clone(),
            scheduled_for: claim.scheduled_for,
        }),
        requester: writer.map(Actor::Person),
        ..Admission::new(Origin::Start)
    };
    match runs::admit(
        &mut savepoint,
        scope,
        &claim.task_id,
        admission,
        rules,
        &Actor::System,
    )
    .await
    {
        Ok(Admitted::New(run) | Admitted::Replayed(run)) => {
            savepoint.commit().await?;
            Ok(Outcome::Started { run_id: run.id })
        }
        Err(
            StoreError::Conflict(reason)
            | StoreError::ConflictNext {
                message: reason, ..
            },
        ) => {
            savepoint.rollback().await?;
            Ok(Outcome::Skipped { reason })
        }
        Err(error) => {
            savepoint.rollback().await?;
            tracing::warn!(occurrence_id = %claim.occurrence_id, %error,
                "a scheduled run could not be created");
            Ok(Outcome::Failed {
                reason: error.to_string(),
            })
        }
    }
}
