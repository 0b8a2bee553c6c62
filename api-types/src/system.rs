//! Health, readiness, system figures, queue leases and the audit trail.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Liveness: the process serves HTTP.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Health {
    #[schema(example = "ok")]
    pub status: String,
    pub time: DateTime<Utc>,
    pub version: String,
}

/// Readiness: the database answers and has every migration this binary needs.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Readiness {
    /// `ready` or `not_ready`.
    pub status: String,
    /// `ok` or `unreachable`.
    pub database: String,
    /// `current`, `pending` or `unknown`.
    pub migrations: String,
}

/// The workspace's queue figures and leases, and the live workers.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct SystemStats {
    /// Per job kind, of the caller's workspace: depth, ready, leased, age of the oldest
    /// ready job.
    pub queue: Vec<KindStats>,
    pub active_leases: i64,
    pub workers: Workers,
    #[schema(example = "postgres")]
    pub queue_backend: String,
    pub version: String,
}

/// The live workers.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Workers {
    /// Workers with a fresh heartbeat, across every replica.
    pub live: usize,
    pub list: Vec<WorkerStats>,
}

/// One job kind's queue figures.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "sqlx", derive(sqlx::FromRow))]
pub struct KindStats {
    pub kind: String,
    /// Jobs waiting to be claimed (due now or later).
    pub depth: i64,
    /// Jobs due now and not yet claimed.
    pub ready: i64,
    pub leased: i64,
    /// Age of the oldest unclaimed due job, in milliseconds.
    pub oldest_age_ms: Option<i64>,
}

/// A live worker.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "sqlx", derive(sqlx::FromRow))]
pub struct WorkerStats {
    pub id: String,
    /// The worker's host; null for a remote caller (tenants do not learn the deployment's
    /// hosts).
    pub hostname: Option<String>,
    /// The worker's process id; null for a remote caller.
    pub pid: Option<i32>,
    pub kinds: Vec<String>,
    pub concurrency: i32,
    /// Leases the worker holds; in an API response, of the caller's workspace only.
    pub active_leases: i64,
    pub last_seen_ms_ago: i64,
}

/// A queue lease, live or ended.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "sqlx", derive(sqlx::FromRow))]
pub struct LeaseRecord {
    #[schema(value_type = crate::LeaseStatus)]
    pub status: String,
    pub job_id: i64,
    pub kind: String,
    pub ref_id: String,
    pub owner: String,
    pub fencing_token: i64,
    pub claimed_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub heartbeats: i32,
    pub released_at: Option<DateTime<Utc>>,
    /// How a released lease ended: `acked`, `retried`, `released`, `expired`, `withdrawn`.
    pub outcome: Option<String>,
}

/// One state change in the audit trail.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "sqlx", derive(sqlx::FromRow))]
pub struct TransitionRecord {
    pub id: i64,
    #[schema(value_type = crate::EntityType)]
    pub entity_type: String,
    pub entity_id: String,
    pub task_id: Option<String>,
    pub from_status: Option<String>,
    pub to_status: String,
    pub reason: Option<String>,
    pub actor: String,
    pub occurred_at: DateTime<Utc>,
}

/// Queue throughput of the caller's workspace over the last minutes: attempts that ended,
/// per job kind, in buckets of equal width, oldest first; the last bucket is the current,
/// partial one.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct Throughput {
    /// The window asked for.
    pub minutes: i64,
    /// Width of a bucket: 10 s for windows up to 15 minutes, 60 s beyond.
    pub bucket_seconds: i64,
    /// Start of the first bucket.
    pub since: DateTime<Utc>,
    /// Only kinds with an ended attempt in the window, by name.
    pub kinds: Vec<KindThroughput>,
}

/// One job kind's ended attempts in the window.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct KindThroughput {
    pub kind: String,
    /// Jobs acked in the window: their work is over, whatever the domain outcome (a run
    /// whose command exited 1 is a completed job with a failed run).
    pub completed: i64,
    /// Attempts that failed in the window: put back to be retried, or whose lease expired
    /// and was taken over.
    pub failed: i64,
    /// Every bucket of the window, empty ones included.
    pub buckets: Vec<ThroughputBucket>,
}

/// One bucket of a kind's throughput.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ThroughputBucket {
    pub start: DateTime<Utc>,
    pub completed: i64,
    pub failed: i64,
}
