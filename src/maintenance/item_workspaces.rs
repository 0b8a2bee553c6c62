//! External work items' workspaces: a terminal item's directory is removed here, by the
//! workers, `before_remove` first (see [`remove_terminal_workspaces`]), never by a poll or
//! an import, which may run in the API process. The duty has a loop of its own: a hook may
//! run for up to an hour, which must hold up no other duty.

use std::time::Duration;

use sqlx::PgPool;
use tokio_util::sync::CancellationToken;

use crate::external::workspace::remove_terminal_workspaces;

/// Removes terminal items' workspaces every `interval` until `stop` fires, once no run
/// holding this `lease` can still be working in them.
pub async fn run(pool: PgPool, interval: Duration, lease: Duration, stop: CancellationToken) {
    crate::maintenance::every(interval, stop, || async {
        match remove_terminal_workspaces(&pool, lease).await {
            Ok(0) => {}
            Ok(removed) => tracing::info!(removed, "removed terminal items' workspaces"),
            Err(error) => tracing::warn!(%error, "removing terminal items' workspaces failed"),
        }
    })
    .await
}
