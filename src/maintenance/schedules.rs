//! Schedule dispatch as a duty: each pass turns the schedules that came due into runs
//! (`schedules::dispatch` decides how; a unique key keeps replicas from firing one twice).

use chrono::Utc;
use sqlx::PgPool;

use crate::runs::AdmissionRules;

/// One pass of schedule dispatch.
pub(super) async fn pass(pool: &PgPool, rules: &AdmissionRules) {
    if let Err(error) = crate::schedules::dispatch::dispatch_due(pool, rules, Utc::now()).await {
        tracing::warn!(%error, "schedule dispatch failed");
    }
}
