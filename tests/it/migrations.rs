//! Migrations that cannot run in a transaction (`CREATE INDEX CONCURRENTLY`): what guards
//! the ones after them, and `migrate` from several processes at once; the settings the
//! run path's functions must keep; and that the functions kept as source files beside
//! their callers are the ones the migrations left.

use futures_util::future::join_all;
use sqlx::{Connection, PgConnection};

use crate::support;

async fn constraint_exists(conn: &mut PgConnection, name: &str) -> bool {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_constraint WHERE conname = $1)")
        .bind(name)
        .fetch_one(conn)
        .await
        .unwrap()
}

/// `keel api` on a database no migration ran on says what applies them, and waits: once
/// `keel migrate` ran, it answers, and its readiness says the migrations are current.
#[tokio::test]
async fn an_api_on_an_unmigrated_database_says_to_migrate_and_waits() {
    let url = support::empty_database().await;
    let dir = tempfile::tempdir().unwrap();
    let mut api = support::start_api(&url, dir.path(), "api", &[]);
    let wait = std::time::Duration::from_secs(20);
    support::wait_for(wait, "the API to say what to run", || async {
        api.log_text().contains("run `keel migrate`").then_some(())
    })
    .await;
    assert!(
        api.child.try_wait().unwrap().is_none(),
        "{}",
        api.log_text()
    );
    let (migrated, output) = support::run_keel(&url, &["migrate"]);
    assert!(migrated, "{output}");
    let client = api.client.clone().unwrap();
    support::wait_for(wait, "the API to answer", || async {
        client.healthy().await.then_some(())
    })
    .await;
    let (status, body) = client.get("/readyz").await;
    assert_eq!(status, reqwest::StatusCode::OK, "{body}");
    assert_eq!(body["migrations"], "current", "{body}");
}

/// 0040 drops the full key of media events only once 0038's partial one is valid: a
/// build that was interrupted leaves an invalid index (which `IF NOT EXISTS` then skips),
/// and media events would be left with no unique key at all.
#[tokio::test]
async fn the_full_media_event_key_stays_until_its_partial_one_is_valid() {
    let url = support::empty_database().await;
    let mut conn = PgConnection::connect(&url).await.unwrap();
    keel::db::MIGRATOR.run_to(39, &mut conn).await.unwrap();
    // What an interrupted CREATE INDEX CONCURRENTLY leaves behind.
    sqlx::query(
        "UPDATE pg_index SET indisvalid = false
         WHERE indexrelid = 'run_events_media_sequence'::regclass",
    )
    .execute(&mut conn)
    .await
    .unwrap();

    let refused = keel::db::MIGRATOR.run(&mut conn).await.unwrap_err();
    let message = refused.to_string();
    assert!(message.contains("run_events_media_sequence"), "{message}");
    assert!(message.contains("REINDEX INDEX CONCURRENTLY"), "{message}");
    assert!(constraint_exists(&mut conn, "run_events_media_job_sequence").await);

    // Rebuilt as the error says, the migrations go on and the full key goes.
    sqlx::query("REINDEX INDEX CONCURRENTLY run_events_media_sequence")
        .execute(&mut conn)
        .await
        .unwrap();
    keel::db::MIGRATOR.run(&mut conn).await.unwrap();
    assert!(!constraint_exists(&mut conn, "run_events_media_job_sequence").await);
}

/// 0053 gives the tasks from before titles one from what they run: the first line, white
/// space folded, control characters dropped, cut at 80 characters.
#[tokio::test]
async fn tasks_from_before_titles_get_one_from_what_they_run() {
    let url = support::empty_database().await;
    let mut conn = PgConnection::connect(&url).await.unwrap();
    keel::db::MIGRATOR.run_to(52, &mut conn).await.unwrap();
    let prompt = format!("{}\nmore", "y".repeat(100));
    let tasks = [
        (
            "task_a",
            "shell",
            None,
            Some("  echo   a\u{1}b\t c\necho two"),
            None,
        ),
        ("task_b", "agent_loop", Some(prompt.as_str()), None, None),
        ("task_c", "git", None, None, Some("status --short")),
    ];
    for (id, kind, prompt, shell, git) in tasks {
        sqlx::query(
            "INSERT INTO tasks (id, workspace_id, execution_kind, prompt, shell_command,
                                git_command, workspace_mode, timeout_ms)
             VALUES ($1, 'default', $2, $3, $4, $5, 'ephemeral', 60000)",
        )
        .bind(id)
        .bind(kind)
        .bind(prompt)
        .bind(shell)
        .bind(git)
        .execute(&mut conn)
        .await
        .unwrap();
    }
    keel::db::MIGRATOR.run(&mut conn).await.unwrap();
    let titles: Vec<String> = sqlx::query_scalar("SELECT title FROM tasks ORDER BY id")
        .fetch_all(&mut conn)
        .await
        .unwrap();
    assert_eq!(titles, ["echo ab c", &"y".repeat(80), "git status --short"]);
}

/// The database takes exactly the terminal codes the runtime writes.
#[tokio::test]
async fn the_runs_terminal_codes_are_the_runtimes() {
    let url = support::fresh_database().await;
    let mut conn = PgConnection::connect(&url).await.unwrap();
    let definition: String = sqlx::query_scalar(
        "SELECT pg_get_constraintdef(oid) FROM pg_constraint
         WHERE conname = 'runs_terminal_code_known'",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    let quoted: Vec<&str> = definition.split('\'').skip(1).step_by(2).collect();
    let codes: Vec<&str> = keel_client::TerminalCode::ALL
        .iter()
        .map(|c| c.as_str())
        .collect();
    assert_eq!(quoted, codes, "{definition}");
}

/// Several `migrate`s at once (replicas starting together) all succeed: the ones waiting
/// for the lock wait between statements. Waiting inside `pg_advisory_lock` (sqlx's lock)
/// held a snapshot, which the `CREATE INDEX CONCURRENTLY` under the lock waited for, and
/// PostgreSQL broke the deadlock by cancelling one of them (every time, in three tries).
#[tokio::test]
async fn concurrent_migrations_all_succeed_through_the_concurrent_index_builds() {
    let url = support::empty_database().await;
    let pools = join_all((0..3).map(|_| support::pool(&url))).await;
    let migrated = join_all(pools.iter().map(keel::db::migrate)).await;
    for result in &migrated {
        assert!(result.is_ok(), "{result:?}");
    }
    let valid: bool = sqlx::query_scalar(
        "SELECT indisvalid FROM pg_index WHERE indexrelid = 'run_events_media_sequence'::regclass",
    )
    .fetch_one(&pools[0])
    .await
    .unwrap();
    assert!(valid);
}

/// The functions every run calls keep the plans they build (0042): PL/pgSQL (a SQL function
/// is parsed and planned at every call) with `plan_cache_mode = force_generic_plan` (their
/// arrays made a custom plan look cheaper at every call). `CREATE OR REPLACE FUNCTION`
/// drops a function's settings unless it states them again, which this would catch.
#[tokio::test]
async fn the_run_paths_functions_keep_their_plans() {
    let url = support::fresh_database().await;
    let mut conn = PgConnection::connect(&url).await.unwrap();
    let functions: Vec<(String, String, Option<Vec<String>>)> = sqlx::query_as(
        "SELECT p.proname::text, l.lanname::text, p.proconfig FROM pg_proc p
         JOIN pg_language l ON l.oid = p.prolang
         WHERE p.proname IN ('append_events', 'archive_leases') ORDER BY p.proname",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    let names: Vec<&str> = functions.iter().map(|(name, ..)| name.as_str()).collect();
    assert_eq!(names, ["append_events", "archive_leases"]);
    for (name, language, settings) in &functions {
        assert_eq!(language, "plpgsql", "{name}");
        let settings = settings.as_deref().unwrap_or_default();
        assert!(
            settings
                .iter()
                .any(|s| s == "plan_cache_mode=force_generic_plan"),
            "{name}: {settings:?}"
        );
    }
}

/// The SQL functions kept as source files beside their callers are the ones the migrations
/// left in the database: each file, applied again, changes nothing of its function's
/// definition (`pg_get_functiondef`: arguments, language, settings, body). A migration
/// cannot include a file, so changing one of them is editing its file and adding a
/// migration that holds a copy of it; this fails until both agree.
#[tokio::test]
async fn the_databases_functions_are_their_source_files() {
    const SOURCES: [(&str, &str); 4] = [
        (
            "enqueue_job",
            include_str!("../../src/queue/sql/enqueue_job.sql"),
        ),
        (
            "fence_job",
            include_str!("../../src/queue/sql/fence_job.sql"),
        ),
        (
            "archive_leases",
            include_str!("../../src/queue/sql/archive_leases.sql"),
        ),
        (
            "append_events",
            include_str!("../../src/events/sql/append_events.sql"),
        ),
    ];
    const DEFINITION: &str = "SELECT pg_get_functiondef(to_regproc($1)::oid)";
    let url = support::fresh_database().await;
    let mut conn = PgConnection::connect(&url).await.unwrap();
    for (name, source) in SOURCES {
        let mut tx = conn.begin().await.unwrap();
        let migrated: String = sqlx::query_scalar(DEFINITION)
            .bind(name)
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        sqlx::raw_sql(source).execute(&mut *tx).await.unwrap();
        let from_source: String = sqlx::query_scalar(DEFINITION)
            .bind(name)
            .fetch_one(&mut *tx)
            .await
            .unwrap();
        tx.rollback().await.unwrap();
        assert_eq!(
            migrated, from_source,
            "{name}: the database's definition, then its source file's"
        );
    }
}
