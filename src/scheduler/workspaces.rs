//! Ephemeral workspace retention: `<data_dir>/workspaces/<run_id>` is removed once every
//! run working in it (the run and the runs resumed from it) has been finished for
//! `KEEL_WORKSPACE_RETENTION_MS`.
//!
//! Workspaces live on the disk of the worker that ran them; with several worker hosts the
//! data directories are not shared. So each worker sweeps its own data directory, and uses
//! the database only to learn which of the runs it finds there ended when. Removal happens
//! under the task's row lock (`FOR UPDATE SKIP LOCKED`), the same lock a resume admission
//! takes, and marks `runs.workspace_removed_at` in that transaction: replicas sharing a
//! data directory skip each other's rows, and a resume either keeps the workspace alive
//! (its run is active) or is refused with `workspace_expired`.

use std::io::ErrorKind;
use std::path::PathBuf;
use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

/// What a sweep can fail on: the database, or this worker's disk.
#[derive(Debug, thiserror::Error)]
pub enum SweepError {
    #[error(transparent)]
    Database(#[from] sqlx::Error),
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

type Result<T> = std::result::Result<T, SweepError>;

/// Directory names one query checks at most.
const BATCH: usize = 500;

/// Runs whose workspace retention ended: no run working in it is active or ended less
/// than $2 ms ago. Shared by the candidate read and the claim, which checks again under
/// the lock.
const RETENTION_ENDED: &str = "o.workspace_removed_at IS NULL
    AND NOT EXISTS (
        SELECT 1 FROM runs r
        WHERE r.task_id = o.task_id AND (r.id = o.id OR r.workspace_run_id = o.id)
          AND (r.finished_at IS NULL
               OR r.finished_at > now() - make_interval(secs => $2::float8 / 1000)))";

#[derive(Debug, Clone)]
pub struct WorkspaceSweep {
    /// This worker's `<data_dir>/workspaces`.
    pub root: PathBuf,
    pub retention: Duration,
}

impl WorkspaceSweep {
    /// One pass; returns how many workspaces it removed.
    pub async fn pass(&self, pool: &PgPool) -> Result<usize> {
        let names = self.local_workspaces().await?;
        let mut removed = 0;
        for batch in names.chunks(BATCH) {
            for run_id in self.expired(pool, batch).await? {
                match self.remove(pool, &run_id).await {
                    Ok(true) => removed += 1,
                    Ok(false) => {}
                    // One directory that cannot go must not keep the others.
                    Err(error) => tracing::warn!(%error, run_id, "could not remove a workspace"),
                }
            }
        }
        if removed > 0 {
            tracing::info!(
                removed,
                "removed ephemeral workspaces whose retention ended"
            );
        }
        Ok(removed)
    }

    /// The run ids this worker has a workspace directory for.
    async fn local_workspaces(&self) -> Result<Vec<String>> {
        let mut entries = match tokio::fs::read_dir(&self.root).await {
            Ok(entries) => entries,
            Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_error(&self.root, e)),
        };
        let mut names = Vec::new();
        while let Some(entry) = entries
            .next_entry()
            .await
            .map_err(|e| io_error(&self.root, e))?
        {
            if let Ok(name) = entry.file_name().into_string() {
                names.push(name);
            }
        }
        Ok(names)
    }

    async fn expired(&self, pool: &PgPool, names: &[String]) -> Result<Vec<String>> {
        Ok(sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT o.id FROM runs o WHERE o.id = ANY($1) AND {RETENTION_ENDED}"
        )))
        .bind(names)
        .bind(self.retention_ms())
        .fetch_all(pool)
        .await?)
    }

    /// Claims the run's workspace under its task's lock, removes the directory and marks
    /// the run; false when another replica or an admission holds the task, or a resume
    /// made the workspace live again.
    async fn remove(&self, pool: &PgPool, run_id: &str) -> Result<bool> {
        let mut tx = pool.begin().await?;
        let locked: Option<String> = sqlx::query_scalar(
            "SELECT t.id FROM tasks t JOIN runs o ON o.task_id = t.id WHERE o.id = $1
             FOR UPDATE OF t SKIP LOCKED",
        )
        .bind(run_id)
        .fetch_optional(&mut *tx)
        .await?;
        if locked.is_none() {
            return Ok(false);
        }
        let claimed: Option<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "UPDATE runs o SET workspace_removed_at = now() WHERE o.id = $1 AND {RETENTION_ENDED}
             RETURNING o.id"
        )))
        .bind(run_id)
        .bind(self.retention_ms())
        .fetch_optional(&mut *tx)
        .await?;
        if claimed.is_none() {
            return Ok(false);
        }
        let path = self.root.join(run_id);
        match tokio::fs::remove_dir_all(&path).await {
            Ok(()) => {}
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            // Not marked: the next pass tries again. A removal that outlasts the
            // server's idle-in-transaction timeout loses the mark the same way, and the
            // next pass finds the directory gone and marks it.
            Err(e) => return Err(io_error(&path, e)),
        }
        tx.commit().await?;
        Ok(true)
    }

    fn retention_ms(&self) -> f64 {
        self.retention.as_millis() as f64
    }

    /// Sweeps every `interval` until `stop` fires.
    pub async fn run(self, pool: PgPool, interval: Duration, stop: CancellationToken) {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            if let Err(error) = self.pass(&pool).await {
                tracing::warn!(%error, "workspace retention sweep failed");
            }
        }
    }
}

fn io_error(path: &std::path::Path, source: std::io::Error) -> SweepError {
    SweepError::Io {
        path: path.to_path_buf(),
        source,
    }
}
