//! The database: the pool every process opens (with the bounds each session carries),
//! migrations, and [`StoreError`], the one error type of every store function. The SQL
//! itself lives with the feature whose tables it reads and writes (docs/architecture.md);
//! store functions take a connection (or a transaction, which derefs to one), so one
//! transaction can span a domain write, its events and the enqueue of its job.

pub mod embedded;

use std::time::Duration;

use keel_api_types::ErrorCode;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Connection, PgConnection, PgPool};

pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("./migrations");

/// Errors of the store layer.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{0} not found")]
    NotFound(&'static str),
    #[error("{0}")]
    Conflict(String),
    /// A conflict, and what to do about it (the command that does it where one exists):
    /// the 409's `operator_action`.
    #[error("{message}")]
    ConflictNext { message: String, next: String },
    /// A conflict with its own error code, for clients that branch on it.
    #[error("{message}")]
    Refused { code: ErrorCode, message: String },
    /// The request cannot be carried out as the stored rows stand (422), with its own code:
    /// `model_not_configured`.
    #[error("{message}")]
    Unprocessable { code: ErrorCode, message: String },
    /// The caller may not do this to these rows (403): someone else must.
    #[error("{0}")]
    Forbidden(String),
    /// A fenced write found that this worker no longer holds the job's lease.
    #[error("the lease on this job was lost")]
    LeaseLost,
    /// A write would take what a run or a workspace stores past its byte quota (the
    /// database refused it: [`crate::quotas`]); the message says which, `storage_quota_exceeded: …`.
    #[error("{0}")]
    QuotaExceeded(String),
    #[error(transparent)]
    Database(sqlx::Error),
    /// The object store holding artifact bytes failed, or this process has none.
    #[error("content store: {0}")]
    Content(String),
}

pub(crate) type Result<T, E = StoreError> = std::result::Result<T, E>;

impl StoreError {
    /// A conflict (409) and what to do about it: its `operator_action`.
    pub(crate) fn conflict_next(message: impl Into<String>, next: impl Into<String>) -> Self {
        StoreError::ConflictNext {
            message: message.into(),
            next: next.into(),
        }
    }

    /// Whether the database could not be reached or ended the session (a failover, a cut
    /// connection, a server shutting down): the same statements may succeed on a fresh
    /// connection.
    pub(crate) fn is_unreachable(&self) -> bool {
        matches!(self, StoreError::Database(error) if crate::queue::reach::unreachable(error))
    }
}

/// A database error, or the quota refusal the database raises ([`crate::quotas::refusal`]).
impl From<sqlx::Error> for StoreError {
    fn from(error: sqlx::Error) -> Self {
        match crate::quotas::refusal(&error) {
            Some(message) => StoreError::QuotaExceeded(message),
            None => StoreError::Database(error),
        }
    }
}

impl From<crate::queue::QueueError> for StoreError {
    fn from(error: crate::queue::QueueError) -> Self {
        match error {
            crate::queue::QueueError::LeaseLost => StoreError::LeaseLost,
            crate::queue::QueueError::Database(error) => error.into(),
        }
    }
}

/// A transaction left idle this long is ended by the server. Keel's transactions are
/// short and never span executor work, so this only ever fires on a process that was
/// paused or partitioned mid-transaction: without it, such a process would hold its row
/// locks (and the event-order lock) and stall every other process until it woke up.
const IDLE_IN_TRANSACTION_TIMEOUT: &str = "5s";

/// The longest any one statement of Keel's runs: its statements are small (a claim, an
/// ack, a page of rows), so one that runs this long is stuck behind a lock or a server in
/// trouble, and is better cancelled (and retried) than waited on. Migrations, which may
/// build an index, lift it for their own connection ([`migrate`]).
const STATEMENT_TIMEOUT: &str = "60s";

/// How the server finds a client that vanished (a worker's host gone, a partition): TCP
/// keepalives after 10 s idle, every 5 s, 3 unanswered ones end the session, and data
/// unacknowledged for 20 s ends it (Linux servers; elsewhere the server only logs that it
/// cannot). Its locks and its backend go with it. sqlx 0.9 sets no socket option on the
/// client's end; there every call is bounded by a timeout of its own instead (docs/queue.md,
/// "Bounds").
const SERVER_KEEPALIVES: [(&str, &str); 4] = [
    ("tcp_keepalives_idle", "10"),
    ("tcp_keepalives_interval", "5"),
    ("tcp_keepalives_count", "3"),
    ("tcp_user_timeout", "20000"),
];

/// How long a request for a connection waits when every one is busy, being opened or
/// tested (a database that does not answer): then it fails, and the API answers 503.
pub(crate) const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);

/// Opens a pool; every connection says which Keel process it belongs to, and carries the
/// bounds above.
pub async fn connect(url: &str, max_connections: u32, role: &str) -> Result<PgPool> {
    connect_with(url, max_connections, role, &[]).await
}

/// [`connect`], each connection also carrying `settings` (a server process's byte quotas,
/// [`crate::quotas`]).
pub async fn connect_with(
    url: &str,
    max_connections: u32,
    role: &str,
    settings: &[(&str, String)],
) -> Result<PgPool> {
    let options: PgConnectOptions = url.parse()?;
    let own = settings.iter().map(|(name, value)| (*name, value.as_str()));
    let options = options.application_name(&format!("keel-{role}")).options(
        [
            (
                "idle_in_transaction_session_timeout",
                IDLE_IN_TRANSACTION_TIMEOUT,
            ),
            ("statement_timeout", STATEMENT_TIMEOUT),
        ]
        .into_iter()
        .chain(SERVER_KEEPALIVES)
        .chain(own),
    );
    let pool = PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(ACQUIRE_TIMEOUT)
        .connect_with(options.clone())
        .await;
    match pool {
        Ok(pool) => Ok(pool),
        // The pool's timeout hides why its connections failed: one direct try says
        // (refused, no such database, a password refused), or times out as it did.
        Err(sqlx::Error::PoolTimedOut) => {
            let direct =
                tokio::time::timeout(ACQUIRE_TIMEOUT, PgConnection::connect_with(&options));
            match direct.await {
                Ok(Err(cause)) => Err(cause.into()),
                Ok(Ok(_)) | Err(_) => Err(sqlx::Error::PoolTimedOut.into()),
            }
        }
        Err(error) => Err(error.into()),
    }
}

/// The name of Keel's own migration lock (a session-level advisory lock).
const MIGRATION_LOCK: &str = "keel:migrate";
/// How often a `migrate` that found another one running tries the lock again, and how
/// long it waits in all (an index build on a large table takes minutes).
const MIGRATION_LOCK_RETRY: Duration = Duration::from_millis(200);
const MIGRATION_LOCK_WAIT: Duration = Duration::from_secs(3600);

/// Applies pending migrations. Safe to run from several processes at once: one migrates
/// while it holds Keel's migration lock, the others wait for it. They wait by trying the
/// lock between statements, not inside `pg_advisory_lock` (as sqlx's own lock, which is
/// then free, would): a session waiting inside a statement holds a snapshot, which a
/// `CREATE INDEX CONCURRENTLY` under the lock waits for, a deadlock PostgreSQL ended by
/// cancelling one of them (tests/it/migrations.rs). The migrating connection has no
/// statement timeout (an index build may take longer); `RESET` gives it back to the pool
/// with the pool's.
pub async fn migrate(pool: &PgPool) -> Result<()> {
    let mut conn = pool.acquire().await?;
    sqlx::query!("SET statement_timeout = 0")
        .execute(&mut *conn)
        .await?;
    lock_migrations(&mut conn).await?;
    let migrated = MIGRATOR
        .run(&mut *conn)
        .await
        .map_err(|e| StoreError::Database(e.into()));
    session_unlock(&mut conn, MIGRATION_LOCK).await?;
    migrated?;
    sqlx::query!("RESET statement_timeout")
        .execute(&mut *conn)
        .await?;
    Ok(())
}

async fn lock_migrations(conn: &mut PgConnection) -> Result<()> {
    let deadline = tokio::time::Instant::now() + MIGRATION_LOCK_WAIT;
    loop {
        if try_session_lock(conn, MIGRATION_LOCK).await? {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(StoreError::Conflict(format!(
                "another keel migrate held the migration lock for {} s",
                MIGRATION_LOCK_WAIT.as_secs()
            )));
        }
        tokio::time::sleep(MIGRATION_LOCK_RETRY).await;
    }
}

/// Takes the session-level advisory lock named `key` if no other session holds it. It
/// outlives transactions: the holder gives it up with [`session_unlock`] or by closing
/// the connection (as its process's death does).
pub(crate) async fn try_session_lock(conn: &mut PgConnection, key: &str) -> Result<bool> {
    let locked = sqlx::query_scalar!(
        r#"SELECT pg_try_advisory_lock(hashtextextended($1, 0)) AS "locked!""#,
        key,
    )
    .fetch_one(conn)
    .await?;
    Ok(locked)
}

async fn session_unlock(conn: &mut PgConnection, key: &str) -> Result<()> {
    sqlx::query_scalar!("SELECT pg_advisory_unlock(hashtextextended($1, 0))", key)
        .fetch_one(conn)
        .await?;
    Ok(())
}

/// PostgreSQL's SQLSTATE for a relation that does not exist.
const UNDEFINED_TABLE: &str = "42P01";

/// Whether the database has every migration this binary knows.
pub(crate) async fn migrations_current(pool: &PgPool) -> Result<bool> {
    let latest = MIGRATOR.iter().map(|m| m.version).max().unwrap_or(0);
    // Not a `query!`: `_sqlx_migrations` is sqlx's own table, which no migration creates,
    // so the database scripts/sqlx-prepare describes statements against has none.
    let applied: Option<i64> =
        match sqlx::query_scalar("SELECT max(version) FROM _sqlx_migrations WHERE success")
            .fetch_one(pool)
            .await
        {
            Ok(applied) => applied,
            // No migration ever ran here: sqlx's table is not there yet.
            Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some(UNDEFINED_TABLE) => None,
            Err(e) => return Err(e.into()),
        };
    Ok(applied.unwrap_or(0) >= latest)
}

/// True when a database error is a violation of the named unique index or constraint.
pub(crate) fn violates(error: &sqlx::Error, constraint: &str) -> bool {
    matches!(error, sqlx::Error::Database(db) if db.constraint() == Some(constraint))
}
