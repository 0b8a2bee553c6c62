//! Client-orchestrated runs whose client stopped appending: their lease lapsed, and since
//! no worker can do a client's work, they fail (`client_lease_expired`).

use sqlx::PgPool;

use crate::runs::client;

pub(super) async fn pass(pool: &PgPool) {
    match client::expire(pool).await {
        Ok(0) => {}
        Ok(failed) => tracing::warn!(failed, "client-orchestrated runs failed: lease lapsed"),
        Err(error) => tracing::warn!(%error, "client lease sweep failed"),
    }
}
