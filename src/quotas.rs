//! Byte quotas: how much one run and one workspace may store (artifact bytes, steps' input
//! and output, client events' data). The database counts and enforces them (migration
//! 0046): triggers add each write's bytes to the run's and the workspace's counters in the
//! transaction that writes them, and refuse one that would go over the quota its
//! connection carries. Each process sets its quotas on every connection of its pool
//! ([`StorageQuotas::session_settings`]), so every write path (a worker's output, steps and
//! files, a media download, a client's append) is held to them without checking anything
//! itself; a refusal comes back as [`StoreError::QuotaExceeded`](crate::db::StoreError),
//! which the API answers with 413 `storage_quota_exceeded` and an attempt ends with (a run's
//! `last_error`, a media job's `error_code`).

/// The SQLSTATE the counting triggers raise (`RAISE … USING ERRCODE`).
const QUOTA_EXCEEDED: &str = "KQ001";

/// A run's quota when remote mode sets none: 1 GiB, far above what a run's logs
/// (`KEEL_ARTIFACT_MAX_BYTES` per stream) and files need.
pub const REMOTE_RUN_MAX_STORED_BYTES: u64 = 1 << 30;
/// A workspace's quota when remote mode sets none: 100 GiB.
pub const REMOTE_WORKSPACE_MAX_STORED_BYTES: u64 = 100 << 30;

/// What one run and one workspace may store; None: no quota.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StorageQuotas {
    pub run: Option<u64>,
    pub workspace: Option<u64>,
}

impl StorageQuotas {
    /// The session settings the counting triggers read, for a pool's connections: one per
    /// quota set (an unset one is no quota).
    pub fn session_settings(&self) -> Vec<(&'static str, String)> {
        [
            ("keel.run_max_stored_bytes", self.run),
            ("keel.workspace_max_stored_bytes", self.workspace),
        ]
        .into_iter()
        .filter_map(|(name, quota)| Some((name, quota?.to_string())))
        .collect()
    }
}

/// The triggers' message, when `error` is their refusal.
pub(crate) fn refusal(error: &sqlx::Error) -> Option<String> {
    match error {
        sqlx::Error::Database(db) if db.code().as_deref() == Some(QUOTA_EXCEEDED) => {
            Some(db.message().to_string())
        }
        _ => None,
    }
}
