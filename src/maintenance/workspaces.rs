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
//!
//! A task's persistent workspace, `<data_dir>/workspaces/<task_id>`, is kept as long as its
//! task exists, and removed by the first pass after the task is deleted.

use std::io::ErrorKind;
use std::path::PathBuf;
use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::db::StoreError;
use crate::runs::retention;

/// What a sweep can fail on: the database, or this worker's disk.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SweepError {
    #[error(transparent)]
    Database(#[from] StoreError),
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

type Result<T> = std::result::Result<T, SweepError>;

/// Directory names one query checks at most.
const BATCH: usize = 500;

#[derive(Debug, Clone)]
pub(crate) struct WorkspaceSweep {
    /// This worker's `<data_dir>/workspaces`.
    pub(crate) root: PathBuf,
    pub(crate) retention: Duration,
}

impl WorkspaceSweep {
    /// One pass; returns how many workspaces it removed.
    pub(crate) async fn pass(&self, pool: &PgPool) -> Result<usize> {
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
            for task_id in self.orphaned(pool, batch).await? {
                let path = self.root.join(&task_id);
                match tokio::fs::remove_dir_all(&path).await {
                    Ok(()) => removed += 1,
                    Err(e) if e.kind() == ErrorKind::NotFound => {}
                    Err(error) => tracing::warn!(%error, task_id, "could not remove a workspace"),
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

    /// Of the names, the task ids whose task no longer exists: their persistent
    /// workspaces. A deleted task gets no run again, so nothing can be working there.
    async fn orphaned(&self, pool: &PgPool, names: &[String]) -> Result<Vec<String>> {
        let task_ids: Vec<String> = names
            .iter()
            .filter(|name| name.starts_with("task_"))
            .cloned()
            .collect();
        if task_ids.is_empty() {
            return Ok(Vec::new());
        }
        let mut conn = pool.acquire().await.map_err(StoreError::from)?;
        Ok(retention::deleted_tasks(&mut conn, &task_ids).await?)
    }

    async fn expired(&self, pool: &PgPool, names: &[String]) -> Result<Vec<String>> {
        let mut conn = pool.acquire().await.map_err(StoreError::from)?;
        Ok(retention::expired(&mut conn, names, self.retention).await?)
    }

    /// Claims the run's workspace under its task's lock, removes the directory and marks
    /// the run; false when another replica or an admission holds the task, or a resume
    /// made the workspace live again.
    async fn remove(&self, pool: &PgPool, run_id: &str) -> Result<bool> {
        let mut tx = pool.begin().await.map_err(StoreError::from)?;
        if !retention::lock_task_of(&mut tx, run_id).await?
            || !retention::mark_removed(&mut tx, run_id, self.retention).await?
        {
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
        tx.commit().await.map_err(StoreError::from)?;
        Ok(true)
    }

    /// Sweeps every `interval` until `stop` fires.
    pub async fn run(self, pool: PgPool, interval: Duration, stop: CancellationToken) {
        crate::maintenance::every(interval, stop, || async {
            if let Err(error) = self.pass(&pool).await {
                tracing::warn!(%error, "workspace retention sweep failed");
            }
        })
        .await
    }
}

fn io_error(path: &std::path::Path, source: std::io::Error) -> SweepError {
    SweepError::Io {
        path: path.to_path_buf(),
        source,
    }
}
