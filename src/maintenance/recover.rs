//! Boot recovery: every `queued` or `running` run has a queue row. A starting worker
//! re-enqueues durable work whose row is missing, in id-cursor pages; safe on every start
//! and on many replicas at once (enqueue is idempotent).

use sqlx::PgPool;

use crate::attempt::JobKind;
use crate::db::Result;
use crate::domain::Scope;
use crate::queue;
use crate::runs;

const RECOVERY_PAGE: i64 = 500;

/// Re-enqueues durable `queued`/`running` runs that have no queue row, in id-cursor pages,
/// in every workspace (each queue row takes its run's). The page size bounds each read,
/// not the recovery: it pages until the end.
pub async fn recover(pool: &PgPool) -> Result<u64> {
    let mut cursor = String::new();
    let mut enqueued = 0;
    loop {
        let page = runs::active_page(&mut *pool.acquire().await?, &cursor, RECOVERY_PAGE).await?;
        let Some(last) = page.last() else {
            break;
        };
        cursor = last.run_id.clone();
        let mut tx = pool.begin().await?;
        for run in &page {
            let scope = Scope::new(run.workspace_id.clone());
            let new = queue::enqueue(
                &mut tx,
                &scope,
                JobKind::Run.as_str(),
                &run.run_id,
                run.priority,
            )
            .await?;
            enqueued += u64::from(new);
        }
        tx.commit().await?;
    }
    if enqueued > 0 {
        tracing::warn!(
            enqueued,
            "boot recovery re-enqueued runs that had no queue row"
        );
    }
    Ok(enqueued)
}
