//! The S3 content store against an in-memory S3 endpoint: a real `keel worker` writes a
//! run's output as objects, another `keel api` reads it back, and the store's size cap and
//! rollback behaviour hold at the chunk level.

use crate::support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::fake_s3::{ACCESS_KEY_ID, BUCKET, FakeS3, SECRET_ACCESS_KEY};
use crate::support::{TestApp, spawn_api, spawn_api_with_env, spawn_worker_with_env, wait_for};
use keel::artifacts;
use keel::artifacts::content::ContentStore;
use keel::config::{ContentArgs, ContentStoreKind};
use keel::domain::Scope;
use keel::events::Subject;
use keel_client::RunStatus;
use object_store::aws::AmazonS3Builder;
use reqwest::StatusCode;
use sqlx::PgPool;

const RUN_TIMEOUT: Duration = Duration::from_secs(30);

/// (offset, object key, whether `data` is NULL, size) of each chunk, in offset order.
async fn chunks(pool: &PgPool, artifact_id: &str) -> Vec<(i64, Option<String>, bool, i64)> {
    sqlx::query_as(
        "SELECT offset_bytes, object_key, data IS NULL, size_bytes FROM artifact_chunks
         WHERE artifact_id = $1 ORDER BY offset_bytes",
    )
    .bind(artifact_id)
    .fetch_all(pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn a_worker_writes_output_to_s3_and_another_api_reads_it_back() {
    let s3 = FakeS3::start().await;
    let db_url = support::fresh_database().await;
    let pool = support::pool(&db_url).await;
    let dir = tempfile::tempdir().unwrap();
    let env = s3.env("/tenant-a/");
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();

    let writer_api = spawn_api_with_env(&db_url, dir.path(), "api-1", &env).await;
    let worker = spawn_worker_with_env(
        &db_url,
        dir.path(),
        "worker",
        5_000,
        &dir.path().join("data"),
        &env,
    );
    let c = writer_api.client.as_ref().unwrap();
    let (task_id, run_id) = c.run_shell("seq 1 3000; echo done >&2").await;
    let run = c.wait_terminal(&task_id, &run_id, RUN_TIMEOUT).await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    let expected: String = (1..=3000).map(|n| format!("{n}\n")).collect();

    let reader_api = spawn_api_with_env(&db_url, dir.path(), "api-2", &env).await;
    let r = reader_api.client.as_ref().unwrap();
    let list = r.api.list_artifacts(&task_id, &run_id);
    let (status, list) = list.send_with_status().await.unwrap();
    assert_eq!(status, StatusCode::OK, "{list:?}");
    let stdout = list
        .data
        .into_iter()
        .find(|a| a.name == "stdout")
        .expect("a stdout artifact");
    assert_eq!(stdout.storage, "s3");
    assert_eq!(stdout.size_bytes, expected.len() as i64);
    assert!(!stdout.truncated);
    let stdout_id = stdout.id.as_str();
    let content_path = format!("/v1/tasks/{task_id}/runs/{run_id}/artifacts/{stdout_id}/content");
    let content = r.api.artifact_content(&task_id, &run_id, stdout_id);
    let (status, content) = content.raw_with_status().await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(String::from_utf8_lossy(&content), expected);

    // Every chunk is an object under the trimmed prefix, at its zero-padded offset, and
    // no chunk keeps its bytes in the database.
    let rows = chunks(&pool, stdout_id).await;
    assert!(!rows.is_empty());
    let mut offset = 0;
    for (chunk_offset, key, data_is_null, size) in &rows {
        assert_eq!(*chunk_offset, offset);
        assert!(
            data_is_null,
            "chunk at {chunk_offset} kept its bytes inline"
        );
        let key = key.as_deref().expect("an object key");
        assert_eq!(
            key,
            format!("tenant-a/artifacts/{stdout_id}/{chunk_offset:020}")
        );
        let object = s3.object(BUCKET, key).expect("the chunk's object");
        assert_eq!(object.len() as i64, *size);
        assert_eq!(
            object,
            expected.as_bytes()[offset as usize..(offset + size) as usize]
        );
        offset += size;
    }
    assert_eq!(offset as usize, expected.len());
    let stderr: Vec<u8> = s3
        .keys(BUCKET)
        .into_iter()
        .filter(|k| !k.starts_with(&format!("tenant-a/artifacts/{stdout_id}/")))
        .flat_map(|k| s3.object(BUCKET, &k).unwrap())
        .collect();
    assert_eq!(stderr, b"done\n");

    // An API without the S3 store fails the read rather than serving nothing, and tells
    // its operator why.
    let postgres_api = spawn_api(&db_url, dir.path(), "api-postgres").await;
    let p = postgres_api.client.as_ref().unwrap();
    let (status, body) = p.get(&content_path).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR, "{body}");
    wait_for(Duration::from_secs(5), "the API to log why", || async {
        let log = std::fs::read_to_string(&postgres_api.log).unwrap();
        log.contains("is kept in S3, but this process has no S3 content store")
            .then_some(())
    })
    .await;

    for process in [&worker, &writer_api, &reader_api] {
        let log = std::fs::read_to_string(&process.log).unwrap();
        assert!(
            !log.contains(SECRET_ACCESS_KEY),
            "{} logged the secret",
            process.log.display()
        );
    }
}

fn s3_args(s3: &FakeS3, prefix: Option<&str>) -> ContentArgs {
    ContentArgs {
        content_store: ContentStoreKind::S3,
        s3_bucket: Some(BUCKET.into()),
        s3_prefix: prefix.map(Into::into),
        s3_endpoint: Some(s3.endpoint.clone()),
        s3_region: Some("us-east-1".into()),
        s3_allow_http: true,
    }
}

fn s3_store(s3: &FakeS3) -> ContentStore {
    let credentials = AmazonS3Builder::new()
        .with_access_key_id(ACCESS_KEY_ID)
        .with_secret_access_key(SECRET_ACCESS_KEY);
    ContentStore::s3(&s3_args(s3, None).s3_settings(), credentials).unwrap()
}

/// A queued run (no worker) and an open artifact on it.
async fn open_artifact(app: &TestApp, name: &str) -> String {
    let (task_id, run_id) = app.client.run_shell("true").await;
    let owner = Subject::Run {
        task_id: &task_id,
        run_id: &run_id,
    };
    let mut conn = app.pool.acquire().await.unwrap();
    artifacts::open(
        &mut conn,
        &Scope::local(),
        owner,
        name,
        "file",
        "text/plain",
    )
    .await
    .unwrap()
    .id
}

#[tokio::test]
async fn s3_appends_stop_at_the_size_cap_and_mark_the_artifact_truncated() {
    let s3 = FakeS3::start().await;
    let app = TestApp::api_only().await;
    let store = s3_store(&s3);
    assert!(!format!("{store:?}").contains(SECRET_ACCESS_KEY));
    let id = open_artifact(&app, "capped").await;

    let mut tx = app.pool.begin().await.unwrap();
    store
        .append(&mut tx, &Scope::local(), &id, b"hello ", 8)
        .await
        .unwrap();
    store
        .append(&mut tx, &Scope::local(), &id, b"world", 8)
        .await
        .unwrap();
    store
        .append(&mut tx, &Scope::local(), &id, b"more", 8)
        .await
        .unwrap();
    tx.commit().await.unwrap();

    let (size, truncated, storage): (i64, bool, String) =
        sqlx::query_as("SELECT size_bytes, truncated, storage FROM artifacts WHERE id = $1")
            .bind(&id)
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!((size, truncated, storage.as_str()), (8, true, "s3"));
    let key = |offset: i64| format!("artifacts/{id}/{offset:020}");
    assert_eq!(
        chunks(&app.pool, &id).await,
        vec![(0, Some(key(0)), true, 6), (6, Some(key(6)), true, 2)]
    );
    assert_eq!(s3.keys(BUCKET), vec![key(0), key(6)]);
    assert_eq!(s3.object(BUCKET, &key(6)).unwrap(), b"wo");
    assert_eq!(read(&store, &app, &id).await, b"hello wo");
}

#[tokio::test]
async fn a_rolled_back_s3_append_leaves_an_orphan_that_the_retry_overwrites() {
    let s3 = FakeS3::start().await;
    let app = TestApp::api_only().await;
    let store = s3_store(&s3);
    let id = open_artifact(&app, "retried").await;
    let key = format!("artifacts/{id}/{:020}", 0);

    let mut tx = app.pool.begin().await.unwrap();
    store
        .append(&mut tx, &Scope::local(), &id, b"lost", 100)
        .await
        .unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(s3.object(BUCKET, &key).unwrap(), b"lost");
    assert_eq!(read(&store, &app, &id).await, b"");

    let mut tx = app.pool.begin().await.unwrap();
    store
        .append(&mut tx, &Scope::local(), &id, b"kept", 100)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(s3.keys(BUCKET), vec![key.clone()]);
    assert_eq!(s3.object(BUCKET, &key).unwrap(), b"kept");
    assert_eq!(read(&store, &app, &id).await, b"kept");
}

#[tokio::test]
async fn the_postgres_store_keeps_chunks_inline() {
    let app = TestApp::api_only().await;
    let id = open_artifact(&app, "inline").await;
    let store = ContentStore::Postgres;
    let mut tx = app.pool.begin().await.unwrap();
    store
        .append(&mut tx, &Scope::local(), &id, b"abc", 4)
        .await
        .unwrap();
    store
        .append(&mut tx, &Scope::local(), &id, b"def", 4)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        chunks(&app.pool, &id).await,
        vec![(0, None, false, 3), (3, None, false, 1)]
    );
    assert_eq!(read(&store, &app, &id).await, b"abcd");
}

#[tokio::test]
async fn a_worker_refuses_to_start_with_s3_selected_and_no_bucket() {
    let db_url = support::fresh_database().await;
    let mut child = Command::new(env!("CARGO_BIN_EXE_keel"))
        .arg("worker")
        .env("KEEL_DATABASE_URL", &db_url)
        .env("KEEL_CONTENT_STORE", "s3")
        .env_remove("KEEL_S3_BUCKET")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("keel worker kept running without a bucket");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert!(!status.success());
    assert!(stderr.contains("KEEL_S3_BUCKET"), "{stderr}");
}

async fn read(store: &ContentStore, app: &TestApp, id: &str) -> Vec<u8> {
    use futures_util::TryStreamExt;
    let chunks: Vec<bytes::Bytes> = store
        .stream(app.pool.clone(), id.to_string())
        .try_collect()
        .await
        .unwrap();
    chunks.concat()
}

#[tokio::test]
async fn a_stream_reads_page_after_page_up_to_the_size_it_started_at() {
    let app = TestApp::api_only().await;
    let id = open_artifact(&app, "paged").await;
    let store = ContentStore::Postgres;
    let expected: Vec<u8> = (0..40u8).flat_map(|i| [b'a' + i % 26; 3]).collect();
    for chunk in expected.chunks(3) {
        let mut tx = app.pool.begin().await.unwrap();
        store
            .append(&mut tx, &Scope::local(), &id, chunk, 1_000)
            .await
            .unwrap();
        tx.commit().await.unwrap();
    }
    // 40 chunks: more than one page of chunk rows.
    assert_eq!(read(&store, &app, &id).await, expected);

    let mut stream = Box::pin(store.stream(app.pool.clone(), id.clone()));
    let first = futures_util::StreamExt::next(&mut stream)
        .await
        .unwrap()
        .unwrap();
    let mut tx = app.pool.begin().await.unwrap();
    store
        .append(&mut tx, &Scope::local(), &id, b"later", 1_000)
        .await
        .unwrap();
    tx.commit().await.unwrap();
    let rest: Vec<bytes::Bytes> = futures_util::TryStreamExt::try_collect(stream)
        .await
        .unwrap();
    let read_then: Vec<u8> = std::iter::once(first).chain(rest).flatten().collect();
    assert_eq!(
        read_then, expected,
        "bytes appended after the read began are not in it"
    );
}

#[tokio::test]
async fn content_after_an_offset_skips_the_bytes_already_read() {
    let app = TestApp::api_only().await;
    let (task_id, run_id) = app.client.run_shell("true").await;
    let owner = Subject::Run {
        task_id: &task_id,
        run_id: &run_id,
    };
    let mut conn = app.pool.acquire().await.unwrap();
    let id = artifacts::open(
        &mut conn,
        &Scope::local(),
        owner,
        "log",
        "file",
        "text/plain",
    )
    .await
    .unwrap()
    .id;
    drop(conn);
    let store = ContentStore::Postgres;
    for chunk in ["abc", "def", "gh\u{e9}"] {
        let mut tx = app.pool.begin().await.unwrap();
        let (bytes, scope) = (chunk.as_bytes(), &Scope::local());
        store
            .append(&mut tx, scope, &id, bytes, 1_000)
            .await
            .unwrap();
        tx.commit().await.unwrap();
    }
    let url = format!(
        "{}/v1/tasks/{task_id}/runs/{run_id}/artifacts/{id}/content",
        app.client.base
    );
    let get = |query: &'static str| {
        let request = app.client.http.get(format!("{url}{query}"));
        async move {
            let response = request.send().await.unwrap();
            (response.status(), response.bytes().await.unwrap().to_vec())
        }
    };
    let whole = "abcdefgh\u{e9}".as_bytes().to_vec();
    assert_eq!(get("").await, (StatusCode::OK, whole.clone()));
    assert_eq!(get("?offset=0").await, (StatusCode::OK, whole.clone()));
    // Inside a chunk, at a chunk's start, inside a character, at and past the end.
    assert_eq!(
        get("?offset=4").await,
        (StatusCode::OK, whole[4..].to_vec())
    );
    assert_eq!(
        get("?offset=6").await,
        (StatusCode::OK, whole[6..].to_vec())
    );
    assert_eq!(
        get("?offset=9").await,
        (StatusCode::OK, whole[9..].to_vec())
    );
    assert_eq!(get("?offset=10").await, (StatusCode::OK, Vec::new()));
    let beyond = "?offset=9223372036854775807";
    assert_eq!(get(beyond).await, (StatusCode::OK, Vec::new()));
    let bad = [
        "?offset=-1",
        "?offset=9223372036854775808",
        "?offset=ten",
        "?offset=1&x=2",
    ];
    for bad in bad {
        let (status, body) = get(bad).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
        let envelope: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert!(
            envelope["error"]["message"].is_string(),
            "{bad}: {envelope}"
        );
    }

    // The typed client's reader asks the server for the tail alone.
    let tail = app
        .client
        .api
        .artifact_content(&task_id, &run_id, &id)
        .tail(5)
        .await;
    assert_eq!(tail.unwrap().to_vec(), whole[5..].to_vec());
}
