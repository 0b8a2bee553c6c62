//! The runtime host's identity, generated once and kept in the database.

use sqlx::PgConnection;

use crate::db::Result;

/// The runtime host's id: the stored one, or a new one stored now. Concurrent first starts
/// agree: only one insert wins, and both read the winner.
pub(crate) async fn host_id(conn: &mut PgConnection) -> Result<String> {
    sqlx::query!(
        "INSERT INTO runtime_identity (host_id) VALUES ($1) ON CONFLICT DO NOTHING",
        crate::domain::new_id("runtime"),
    )
    .execute(&mut *conn)
    .await?;
    let id = sqlx::query_scalar!("SELECT host_id FROM runtime_identity")
        .fetch_one(&mut *conn)
        .await?;
    Ok(id)
}
