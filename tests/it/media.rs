//! Media jobs end to end: real `keel api` and `keel worker` processes, vendors replaced by
//! local HTTP servers speaking their protocols (wiremock).

use crate::support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use crate::support::{Client, KeelProcess, SseReader, TestApp, wait_for};
use keel_client::{
    ArtifactKind, ArtifactRecord, EventRecord, EventType, MediaJobRecord, MediaJobStatus,
    ProviderView, SecretStatus,
};
use reqwest::StatusCode;
use serde_json::{Value, json};
use wiremock::matchers::{header, method, path, path_regex};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

const JOB_TIMEOUT: Duration = Duration::from_secs(60);
/// Recognisable, so a test can grep everything Keel wrote for it.
const SECRET: &str = "sk-keel-test-SECRET-7f3a9c";
const KEY_ENV: &str = "KEEL_SECRET_TEST_MEDIA_KEY";
/// The bytes of a PNG signature and a little more: enough to be sniffed as image/png.
const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR-keel-test-image";
const MP4: &[u8] = b"\0\0\0\x18ftypmp42\0\0\0\0mp42isom-keel-test-video";

/// An API and a worker process sharing a database, with the vendor key in their
/// environment and downloads from loopback allowed.
struct Stack {
    client: Client,
    pool: sqlx::PgPool,
    db_url: String,
    logs: tempfile::TempDir,
    data: tempfile::TempDir,
    api: KeelProcess,
    workers: Vec<KeelProcess>,
}

fn env(extra: &[(&'static str, &'static str)]) -> Vec<(&'static str, &'static str)> {
    let mut env = vec![
        (KEY_ENV, SECRET),
        ("KEEL_MEDIA_ALLOW_PRIVATE_ADDRESSES", "true"),
        // The mock vendors listen there, outside every vendor's documented hosts.
        ("KEEL_PROVIDER_HOSTS", "127.0.0.1"),
        ("KEEL_MEDIA_POLL_INTERVAL_MS", "100"),
    ];
    env.extend_from_slice(extra);
    env
}

impl Stack {
    async fn start(worker_env: &[(&'static str, &'static str)]) -> Stack {
        let db_url = support::fresh_database().await;
        let pool = support::pool(&db_url).await;
        let (logs, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let api = support::spawn_api_with_env(&db_url, logs.path(), "api", &env(&[])).await;
        let mut stack = Stack {
            client: api.client.clone().unwrap(),
            pool,
            db_url,
            logs,
            data,
            api,
            workers: Vec::new(),
        };
        stack.add_worker("worker-1", worker_env);
        stack
    }

    fn add_worker(&mut self, name: &str, extra: &[(&'static str, &'static str)]) {
        let (logs, data) = (self.logs.path(), self.data.path());
        let worker =
            support::spawn_worker_with_env(&self.db_url, logs, name, 2_000, data, &env(extra));
        self.workers.push(worker);
    }

    /// Creates an enabled media preset for `vendor` at `base_url`.
    async fn provider(&self, vendor: &str, base_url: &str, capabilities: &[&str]) -> String {
        let (status, body) = self
            .client
            .post(
                "/v1/providers",
                json!({
                    "kind": vendor, "model": format!("{vendor}-model"), "api": "media-job",
                    "base_url": base_url, "api_key_ref": format!("env:{KEY_ENV}"),
                    "capabilities": capabilities, "enabled": true,
                }),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        let preset: ProviderView = support::record(&body);
        assert!(preset.api_key_configured, "{body}");
        preset.id
    }

    /// Creates a job and runs it; returns its id.
    async fn run_job(&self, provider: &str, operation: &str, input: Value) -> String {
        let (status, body) = self
            .client
            .post(
                "/v1/media-jobs",
                json!({ "provider_id": provider, "operation": operation,
                        "prompt": "a lighthouse at dusk", "input": input }),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        let job: MediaJobRecord = support::record(&body);
        assert_eq!(job.status, MediaJobStatus::Queued);
        let id = job.id;
        let (status, body) = self
            .client
            .post_empty(&format!("/v1/media-jobs/{id}/run"))
            .await;
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        id
    }

    async fn job(&self, id: &str) -> MediaJobRecord {
        let job = self.client.api.get_media_job(id).send_with_status().await;
        let (status, job) = job.unwrap();
        assert_eq!(status, StatusCode::OK, "{job:?}");
        job.data
    }

    async fn wait_ended(&self, id: &str) -> MediaJobRecord {
        wait_for(JOB_TIMEOUT, "the media job to end", || async {
            let job = self.job(id).await;
            job.status.is_terminal().then_some(job)
        })
        .await
    }

    async fn artifacts(&self, id: &str) -> Vec<ArtifactRecord> {
        let artifacts = self.client.api.list_media_artifacts(id);
        let (status, artifacts) = artifacts.send_with_status().await.unwrap();
        assert_eq!(status, StatusCode::OK, "{artifacts:?}");
        artifacts.data
    }

    /// An artifact's content type and bytes (raw: the header is part of the answer, and
    /// keel-client reads only a run's artifacts).
    async fn content(&self, id: &str, artifact: &ArtifactRecord) -> (String, Vec<u8>) {
        let url = format!(
            "{}/v1/media-jobs/{id}/artifacts/{}/content",
            self.client.base, artifact.id
        );
        let response = self.client.http.get(url).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        let content_type = response.headers()["content-type"]
            .to_str()
            .unwrap()
            .to_string();
        (content_type, response.bytes().await.unwrap().to_vec())
    }

    async fn event_types(&self, id: &str) -> Vec<String> {
        let ended = |events: &[EventRecord]| {
            events
                .iter()
                .any(|e| e.event_type == EventType::MediaJobSucceeded)
        };
        let path = format!("/v1/events?media_job_id={id}&limit=200");
        let page = self.client.feed_when(&path, ended).await;
        page.data.iter().map(|e| e.event_type.to_string()).collect()
    }
}

fn image_file(server: &MockServer, name: &str) -> String {
    format!("{}/files/{name}", server.uri())
}

#[tokio::test]
async fn an_image_job_runs_on_a_worker_and_its_secret_is_never_written() {
    let stack = Stack::start(&[]).await;
    let vendor = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/api/v3/images/generations"))
        .and(header("authorization", format!("Bearer {SECRET}").as_str()))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({
            "model": "seedream-model", "created": 1,
            "data": [{ "url": image_file(&vendor, "out.png") }],
        })))
        .expect(1)
        .mount(&vendor)
        .await;
    Mock::given(method("GET"))
        .and(path("/files/out.png"))
        .respond_with(ResponseTemplate::new(200).set_body_raw(PNG, "image/png"))
        .expect(1)
        .mount(&vendor)
        .await;
    let base = format!("{}/api/v3", vendor.uri());
    let provider = stack
        .provider("seedream", &base, &["image_generate", "image_edit"])
        .await;
    let mut feed = SseReader::open(&stack.client, "/v1/events/stream", None).await;
    let id = stack
        .run_job(&provider, "image_generate", json!({ "size": "2K" }))
        .await;

    let job = stack.wait_ended(&id).await;
    assert_eq!(job.status, MediaJobStatus::Succeeded, "{job:?}");
    assert_eq!(job.attempt, 1);
    let artifacts = stack.artifacts(&id).await;
    let kinds: Vec<&str> = artifacts.iter().map(|a| a.kind.as_str()).collect();
    assert_eq!(
        kinds.iter().filter(|k| **k == "image").count(),
        1,
        "{artifacts:?}"
    );
    assert!(kinds.contains(&"metadata"), "{artifacts:?}");
    assert_eq!(job.artifact_ids.len(), artifacts.len());
    let image = artifacts
        .iter()
        .find(|a| a.kind == ArtifactKind::Image)
        .unwrap();
    assert_eq!(
        stack.content(&id, image).await,
        ("image/png".to_string(), PNG.to_vec())
    );
    // The download did not carry the vendor's credentials.
    let requests = vendor.received_requests().await.unwrap();
    let download = requests
        .iter()
        .find(|r| r.url.path() == "/files/out.png")
        .unwrap();
    assert!(!download.headers.contains_key("authorization"));

    let types = stack.event_types(&id).await;
    assert_eq!(
        types.first().map(String::as_str),
        Some("media_job.queued"),
        "{types:?}"
    );
    for expected in [
        "media_job.started",
        "media_job.progress",
        "artifact.created",
    ] {
        assert!(
            types.iter().any(|t| t == expected),
            "{expected} in {types:?}"
        );
    }
    assert_eq!(
        types.last().map(String::as_str),
        Some("media_job.succeeded")
    );
    // The public SSE feed carries them live.
    let mut streamed = Vec::new();
    while let Some(event) = feed.next(Duration::from_secs(10)).await {
        if event.data["media_job_id"] == id.as_str() {
            streamed.push(event.data["type"].as_str().unwrap().to_string());
            if streamed.last().unwrap() == "media_job.succeeded" {
                break;
            }
        }
    }
    assert_eq!(streamed, types);

    // A succeeded job does not run again.
    let (status, body) = stack
        .client
        .post_empty(&format!("/v1/media-jobs/{id}/run"))
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    assert_eq!(body["error"]["type"], "media_job_not_runnable");

    assert_secret_nowhere(&stack, &id, &artifacts).await;
    assert_media_keys_hold(&stack, &id).await;
}

/// A media job's events and artifacts keep their unique keys (partial indexes since
/// migrations 0038 and 0039, so a run's rows stay out of them; an artifact's full key stays
/// one release longer): a second event with a sequence the job holds, or a second
/// artifact with a name it holds, is refused.
async fn assert_media_keys_hold(stack: &Stack, id: &str) {
    let copies = [
        (
            &["run_events_media_sequence"][..],
            "INSERT INTO run_events (event_id, media_job_id, sequence, type, workspace_id, feed_xid)
             SELECT 'evt_copy', media_job_id, sequence, type, workspace_id, feed_xid
             FROM run_events WHERE media_job_id = $1 ORDER BY sequence LIMIT 1",
        ),
        (
            &["artifacts_media_job_name", "artifacts_media_name"][..],
            "INSERT INTO artifacts (id, media_job_id, name, kind, content_type, status, workspace_id)
             SELECT 'art_copy', media_job_id, name, kind, content_type, status, workspace_id
             FROM artifacts WHERE media_job_id = $1 ORDER BY id LIMIT 1",
        ),
    ];
    for (keys, copy) in copies {
        let refused = sqlx::query(copy).bind(id).execute(&stack.pool).await;
        let error = refused.expect_err("a duplicate media key was accepted");
        let violated = error.as_database_error().and_then(|e| e.constraint());
        assert!(violated.is_some_and(|key| keys.contains(&key)), "{error}");
    }
}

/// Greps what Keel wrote for the key: every table, both processes' logs, the job, its
/// events and artifacts, and the provider as the API shows it.
async fn assert_secret_nowhere(stack: &Stack, id: &str, artifacts: &[ArtifactRecord]) {
    let tables: Vec<String> =
        sqlx::query_scalar("SELECT tablename::text FROM pg_tables WHERE schemaname = 'public'")
            .fetch_all(&stack.pool)
            .await
            .unwrap();
    for table in tables {
        let sql = format!("SELECT count(*) FROM \"{table}\" t WHERE row_to_json(t)::text LIKE $1");
        let hits: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .bind(format!("%{SECRET}%"))
            .fetch_one(&stack.pool)
            .await
            .unwrap();
        assert_eq!(hits, 0, "the secret is in table {table}");
    }
    let chunks: Vec<Vec<u8>> = sqlx::query_scalar("SELECT data FROM artifact_chunks")
        .fetch_all(&stack.pool)
        .await
        .unwrap();
    let needle = SECRET.as_bytes();
    assert!(
        chunks
            .iter()
            .all(|c| !c.windows(needle.len()).any(|w| w == needle))
    );
    for process in std::iter::once(&stack.api).chain(&stack.workers) {
        let log = std::fs::read_to_string(&process.log).unwrap();
        assert!(
            !log.contains(SECRET),
            "the secret is in {}",
            process.log.display()
        );
    }
    // The job and the presets as the API sent them; the feed's page as read.
    let job = stack.client.api.get_media_job(id).raw().await.unwrap();
    let mut seen = vec![String::from_utf8_lossy(&job).into_owned()];
    let path = format!("/v1/events?media_job_id={id}&limit=200");
    let events = stack.client.feed_when(&path, |e| !e.is_empty()).await;
    seen.push(serde_json::to_string(&events).unwrap());
    let presets = stack.client.api.list_providers().raw().await.unwrap();
    seen.push(String::from_utf8_lossy(&presets).into_owned());
    for artifact in artifacts {
        seen.push(String::from_utf8_lossy(&stack.content(id, artifact).await.1).into_owned());
    }
    assert!(seen.iter().all(|text| !text.contains(SECRET)));
}

#[tokio::test]
async fn vendor_failures_end_with_clear_codes_and_rate_limits_retry() {
    let stack = Stack::start(&[("KEEL_MEDIA_DOWNLOAD_MAX_BYTES", "1000")]).await;
    let openai = MockServer::start().await;
    let b64 = base64_png();
    // The first request is rate limited; the retry succeeds.
    Mock::given(method("POST"))
        .and(path("/v1/images/generations"))
        .respond_with(ResponseTemplate::new(429).insert_header("retry-after", "1"))
        .up_to_n_times(1)
        .with_priority(1)
        .mount(&openai)
        .await;
    Mock::given(method("POST"))
        .and(path("/v1/images/generations"))
        .respond_with(
            ResponseTemplate::new(200).set_body_json(json!({ "data": [{ "b64_json": b64 }] })),
        )
        .mount(&openai)
        .await;
    let provider = stack
        .provider(
            "openai-images",
            &format!("{}/v1", openai.uri()),
            &["image_generate"],
        )
        .await;
    let retried = stack.run_job(&provider, "image_generate", json!({})).await;

    let refusing = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(401).set_body_json(
            json!({ "error": { "message": "Incorrect API key provided", "code": "invalid_api_key" } }),
        ))
        .mount(&refusing)
        .await;
    let unauthorized = stack
        .provider("openai-images", &refusing.uri(), &["image_generate"])
        .await;
    let refused = stack
        .run_job(&unauthorized, "image_generate", json!({}))
        .await;

    let large = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(json!({ "data": [{ "url": image_file(&large, "big.png") }] })),
        )
        .mount(&large)
        .await;
    Mock::given(method("GET"))
        .and(path("/files/big.png"))
        .respond_with(ResponseTemplate::new(200).set_body_raw(vec![7u8; 5_000], "image/png"))
        .mount(&large)
        .await;
    let seedream = stack
        .provider("seedream", &large.uri(), &["image_generate"])
        .await;
    let oversized = stack.run_job(&seedream, "image_generate", json!({})).await;

    let job = stack.wait_ended(&retried).await;
    assert_eq!(job.status, MediaJobStatus::Succeeded, "{job:?}");
    assert_eq!(
        job.attempt, 2,
        "one rate-limited attempt, one that succeeded"
    );
    let retried_again = |events: &[EventRecord]| events.iter().any(|e| e.data["reason"] == "retry");
    let path = format!("/v1/events?media_job_id={retried}");
    let events = stack.client.feed_when(&path, retried_again).await;
    let retry = events
        .data
        .iter()
        .find(|e| e.event_type == EventType::MediaJobQueued && e.data["reason"] == "retry")
        .expect("a retry event");
    assert_eq!(retry.data["error_code"], "rate_limited");

    let job = stack.wait_ended(&refused).await;
    assert_eq!(job.status, MediaJobStatus::Failed);
    assert_eq!(
        job.last_error_code.as_deref(),
        Some("auth_failed"),
        "{job:?}"
    );
    assert_eq!(job.attempt, 1, "an auth failure is not retried");

    let job = stack.wait_ended(&oversized).await;
    assert_eq!(job.status, MediaJobStatus::Failed);
    assert_eq!(
        job.last_error_code.as_deref(),
        Some("download_too_large"),
        "{job:?}"
    );

    // A failed job runs again.
    let (status, body) = stack
        .client
        .post_empty(&format!("/v1/media-jobs/{refused}/run"))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
}

fn base64_png() -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(PNG)
}

/// A Seedance task that stays `running` until the test says it is done, counting polls.
struct SeedanceTask {
    done: Arc<AtomicBool>,
    polls: Arc<AtomicUsize>,
    video_url: String,
}

impl Respond for SeedanceTask {
    fn respond(&self, _: &Request) -> ResponseTemplate {
        self.polls.fetch_add(1, Ordering::SeqCst);
        let body = if self.done.load(Ordering::SeqCst) {
            json!({ "id": "cgt-keel-1", "status": "succeeded",
                    "content": { "video_url": self.video_url } })
        } else {
            json!({ "id": "cgt-keel-1", "status": "running" })
        };
        ResponseTemplate::new(200).set_body_json(body)
    }
}

#[tokio::test]
async fn a_worker_killed_during_a_video_poll_is_replaced_without_a_second_submission() {
    let mut stack = Stack::start(&[]).await;
    let vendor = MockServer::start().await;
    let (done, polls) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicUsize::new(0)),
    );
    Mock::given(method("POST"))
        .and(path("/contents/generations/tasks"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({ "id": "cgt-keel-1" })))
        .expect(1)
        .mount(&vendor)
        .await;
    let task = SeedanceTask {
        done: done.clone(),
        polls: polls.clone(),
        video_url: image_file(&vendor, "video.mp4"),
    };
    Mock::given(method("GET"))
        .and(path_regex("^/contents/generations/tasks/cgt-keel-1$"))
        .respond_with(task)
        .mount(&vendor)
        .await;
    Mock::given(method("GET"))
        .and(path("/files/video.mp4"))
        .respond_with(ResponseTemplate::new(200).set_body_raw(MP4, "video/mp4"))
        .mount(&vendor)
        .await;
    let provider = stack
        .provider("seedance", &vendor.uri(), &["video_generate"])
        .await;
    let id = stack.run_job(&provider, "video_generate", json!({})).await;

    // The first worker submitted the task, stored its id, and is polling it.
    wait_for(
        JOB_TIMEOUT,
        "the vendor task to be stored and polled",
        || async {
            let job = stack.job(&id).await;
            let stored = job.vendor_task_id.as_deref() == Some("cgt-keel-1");
            (stored && polls.load(Ordering::SeqCst) >= 2).then_some(())
        },
    )
    .await;
    stack.workers[0].kill9();
    let polls_before_takeover = polls.load(Ordering::SeqCst);
    stack.add_worker("worker-2", &[]);
    wait_for(
        JOB_TIMEOUT,
        "the second worker to poll the same task",
        || async { (polls.load(Ordering::SeqCst) > polls_before_takeover + 1).then_some(()) },
    )
    .await;
    done.store(true, Ordering::SeqCst);

    let job = stack.wait_ended(&id).await;
    assert_eq!(job.status, MediaJobStatus::Succeeded, "{job:?}");
    assert_eq!(job.attempt, 2, "the second worker took the job over");
    let submissions = vendor
        .received_requests()
        .await
        .unwrap()
        .iter()
        .filter(|r| r.method == wiremock::http::Method::POST)
        .count();
    assert_eq!(submissions, 1, "the generation was submitted exactly once");
    let video = stack
        .artifacts(&id)
        .await
        .into_iter()
        .find(|a| a.kind == ArtifactKind::Video)
        .unwrap();
    assert_eq!(
        stack.content(&id, &video).await,
        ("video/mp4".to_string(), MP4.to_vec())
    );
    let taken_over = |events: &[EventRecord]| {
        events
            .iter()
            .any(|e| e.data["reason"] == "worker_lease_expired")
    };
    let path = format!("/v1/events?media_job_id={id}&limit=200");
    let events = stack.client.feed_when(&path, taken_over).await;
    let takeover = events.data.iter().any(|e| {
        e.event_type == EventType::MediaJobQueued && e.data["reason"] == "worker_lease_expired"
    });
    assert!(takeover, "the takeover is in the job's events: {events:?}");
}

#[tokio::test]
async fn cancelling_a_polling_video_job_stops_it_and_a_rerun_submits_afresh() {
    let stack = Stack::start(&[]).await;
    let vendor = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/contents/generations/tasks"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({ "id": "cgt-keel-2" })))
        .mount(&vendor)
        .await;
    Mock::given(method("GET"))
        .respond_with(
            ResponseTemplate::new(200)
                .set_body_json(json!({ "id": "cgt-keel-2", "status": "running" })),
        )
        .mount(&vendor)
        .await;
    let provider = stack
        .provider("seedance", &vendor.uri(), &["video_generate"])
        .await;
    let id = stack.run_job(&provider, "video_generate", json!({})).await;
    wait_for(JOB_TIMEOUT, "the job to poll its task", || async {
        let job = stack.job(&id).await;
        (job.vendor_task_id.as_deref() == Some("cgt-keel-2")).then_some(())
    })
    .await;
    let (status, body) = stack
        .client
        .post_empty(&format!("/v1/media-jobs/{id}/cancel"))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        support::record::<MediaJobRecord>(&body).status,
        MediaJobStatus::Cancelled
    );
    let (status, _) = stack
        .client
        .post_empty(&format!("/v1/media-jobs/{id}/cancel"))
        .await;
    assert_eq!(status, StatusCode::OK, "cancelling an ended job returns it");
    // The worker stops polling: the poll count settles.
    let settled = wait_for(JOB_TIMEOUT, "polling to stop", || async {
        let before = vendor.received_requests().await.unwrap().len();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let after = vendor.received_requests().await.unwrap().len();
        (before == after).then_some(after)
    })
    .await;
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM queue_jobs WHERE ref_id = $1")
        .bind(&id)
        .fetch_one(&stack.pool)
        .await
        .unwrap();
    assert_eq!(left, 0);

    let (status, body) = stack
        .client
        .post_empty(&format!("/v1/media-jobs/{id}/run"))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert!(
        support::record::<MediaJobRecord>(&body)
            .vendor_task_id
            .is_none(),
        "a rerun starts over: {body}"
    );
    wait_for(JOB_TIMEOUT, "a second submission", || async {
        let requests = vendor.received_requests().await.unwrap();
        let posts = requests
            .iter()
            .filter(|r| r.method == wiremock::http::Method::POST)
            .count();
        (posts == 2 && requests.len() > settled).then_some(())
    })
    .await;
}

#[tokio::test]
async fn presets_take_secret_references_and_jobs_need_a_capable_preset() {
    let app = TestApp::api_only().await;
    let c = &app.client;
    let templates = c.api.list_templates().send_with_status().await;
    let (status, templates) = templates.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert!(templates.data.iter().all(|t| !t.enabled));

    let preset = json!({ "kind": "seedream", "model": "m", "api": "media-job",
                         "base_url": "https://ark.ap-southeast.bytepluses.com/api/v3",
                         "api_key_ref": "env:KEEL_SECRET_TEST_UNSET_KEY_1",
                         "capabilities": ["image_generate"], "enabled": true });
    let mut raw = preset.clone();
    raw["api_key"] = json!("sk-raw");
    let (status, body) = c.post("/v1/providers", raw).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("api_key"),
        "{body}"
    );
    let mut raw_ref = preset.clone();
    raw_ref["api_key_ref"] = json!("sk-raw");
    let (status, body) = c.post("/v1/providers", raw_ref).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let mut header = preset.clone();
    header["headers"] = json!({ "Authorization": "Bearer sk-raw" });
    assert_eq!(
        c.post("/v1/providers", header).await.0,
        StatusCode::UNPROCESSABLE_ENTITY
    );
    let mut incapable = preset.clone();
    incapable["capabilities"] = json!(["video_generate"]);
    assert_eq!(
        c.post("/v1/providers", incapable).await.0,
        StatusCode::UNPROCESSABLE_ENTITY
    );

    let (status, body) = c.post("/v1/providers", preset).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let preset: ProviderView = support::record(&body);
    let id = preset.id;
    assert!(!preset.api_key_configured);
    assert_eq!(preset.api_key_status.unwrap().kind, "env");
    let check = c.api.check_provider(&id, false).await.unwrap().data;
    assert_eq!(check.code, "secret_missing", "{check:?}");
    let checked = c.api.get_provider(&id).await.unwrap().data;
    assert_eq!(
        checked.last_check.unwrap_or_default()["code"],
        "secret_missing"
    );
    let patched = c
        .send(
            c.http
                .patch(format!("{}/v1/providers/{id}", c.base))
                .json(&json!({ "enabled": false })),
        )
        .await;
    assert_eq!(patched.0, StatusCode::OK, "{}", patched.1);
    assert!(
        support::record::<ProviderView>(&patched.1)
            .last_check
            .is_none(),
        "an edit clears the check"
    );

    // Jobs: a disabled preset, a chat preset, an operation the preset does not list.
    let job = |provider: &str, operation: &str| json!({ "provider_id": provider, "operation": operation, "prompt": "p" });
    let (status, body) = c.post("/v1/media-jobs", job(&id, "image_generate")).await;
    assert_eq!(
        (status, body["error"]["type"].as_str()),
        (StatusCode::UNPROCESSABLE_ENTITY, Some("provider_disabled"))
    );
    let (_, chat) = c
        .post("/v1/providers", json!({ "kind": "openai-compatible", "model": "gpt", "api": "openai-completions",
                                       "base_url": "http://127.0.0.1:8317/v1", "capabilities": ["chat"], "enabled": true }))
        .await;
    let chat = support::record::<ProviderView>(&chat).id;
    let (status, body) = c.post("/v1/media-jobs", job(&chat, "image_generate")).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    assert_eq!(body["error"]["type"], "unsupported_capability");
    c.send(
        c.http
            .patch(format!("{}/v1/providers/{id}", c.base))
            .json(&json!({ "enabled": true })),
    )
    .await;
    let (status, body) = c.post("/v1/media-jobs", job(&id, "image_edit")).await;
    assert_eq!(body["error"]["type"], "unsupported_capability", "{body}");
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let (status, created) = c.post("/v1/media-jobs", job(&id, "image_generate")).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    // keel-client has no operation listing media jobs.
    let (status, page) = c
        .get(&format!(
            "/v1/media-jobs?status=queued&provider_id={id}&limit=1"
        ))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        support::page::<MediaJobRecord>(&page).data[0].id,
        support::record::<MediaJobRecord>(&created).id
    );
    assert_eq!(
        c.get("/v1/media-jobs?status=bogus").await.0,
        StatusCode::BAD_REQUEST
    );
    // A preset that jobs name stays.
    assert_eq!(
        c.delete(&format!("/v1/providers/{id}")).await.0,
        StatusCode::CONFLICT
    );
    assert_eq!(
        c.delete(&format!("/v1/providers/{chat}")).await.0,
        StatusCode::NO_CONTENT
    );

    let (status, body) = c
        .get("/v1/secrets/status?ref=keychain%3Aprovider_local&purpose=provider_api_key")
        .await;
    assert_eq!(status, StatusCode::OK);
    let secret: SecretStatus = support::record(&body);
    assert_eq!(
        secret.error_code.as_deref(),
        Some("secret_store_unavailable")
    );
    assert!(!secret.configured);
    assert_eq!(
        c.get("/v1/secrets/status?ref=sk-raw").await.0,
        StatusCode::BAD_REQUEST
    );
}

/// How big the stand-in's image is, and where its first answer cuts it off: past one
/// artifact write (1 MiB), so a cut attempt has stored a part of it.
const FULL_IMAGE: usize = 1_300_000;
const CUT_AT: usize = 1_150_000;

/// A download host that fails mid-body, as a vendor's CDN may: `/files/cut.png` is cut off
/// after [`CUT_AT`] of its declared [`FULL_IMAGE`] bytes the first time and whole after;
/// `/files/endless.png` declares no length and sends 3 MiB. Plain sockets: an HTTP mock
/// cannot end a connection mid-body.
async fn cutting_host(image: Arc<Vec<u8>>) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let served = Arc::new(AtomicUsize::new(0));
    tokio::spawn(async move {
        loop {
            let (mut socket, _) = listener.accept().await.unwrap();
            let (image, served) = (image.clone(), served.clone());
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") && socket.read(&mut byte).await.unwrap() == 1 {
                    head.push(byte[0]);
                }
                let head = String::from_utf8_lossy(&head);
                let (length, body) = if head.starts_with("GET /files/cut.png ") {
                    let first = served.fetch_add(1, Ordering::SeqCst) == 0;
                    let sent = if first { CUT_AT } else { FULL_IMAGE };
                    (
                        format!("Content-Length: {FULL_IMAGE}\r\n"),
                        image[..sent].to_vec(),
                    )
                } else {
                    (String::new(), vec![7u8; 3 << 20])
                };
                let answer = format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: image/png\r\n{length}Connection: close\r\n\r\n"
                );
                // The client may hang up first (past its limit): what it read is the test.
                let _ = socket.write_all(answer.as_bytes()).await;
                let _ = socket.write_all(&body).await;
                let _ = socket.shutdown().await;
            });
        }
    });
    base
}

/// A vendor whose generation answers with one image at `url`.
async fn vendor_of(url: String) -> MockServer {
    let vendor = MockServer::start().await;
    Mock::given(method("POST"))
        .respond_with(ResponseTemplate::new(200).set_body_json(json!({ "data": [{ "url": url }] })))
        .mount(&vendor)
        .await;
    vendor
}

/// A download cut off mid-body leaves nothing behind that could be served as the result:
/// the retried job's image is exactly the vendor's, not the cut attempt's bytes with the
/// whole image after them; a job that fails mid-download (past the download limit, with no
/// length declared) has no artifact at all, listed or in the database.
#[tokio::test]
async fn a_download_cut_off_mid_body_leaves_no_partial_artifact() {
    let stack = Stack::start(&[("KEEL_MEDIA_DOWNLOAD_MAX_BYTES", "1500000")]).await;
    let mut image = PNG.to_vec();
    image.resize(FULL_IMAGE, 7);
    let image = Arc::new(image);
    let host = cutting_host(image.clone()).await;
    let cut = vendor_of(format!("{host}/files/cut.png")).await;
    let endless = vendor_of(format!("{host}/files/endless.png")).await;
    let cut = stack
        .provider("seedream", &cut.uri(), &["image_generate"])
        .await;
    let endless = stack
        .provider("seedream", &endless.uri(), &["image_generate"])
        .await;
    let retried = stack.run_job(&cut, "image_generate", json!({})).await;
    let failed = stack.run_job(&endless, "image_generate", json!({})).await;

    let job = stack.wait_ended(&retried).await;
    assert_eq!(job.status, MediaJobStatus::Succeeded, "{job:?}");
    assert_eq!(job.attempt, 2, "a cut attempt, then a whole one");
    let artifacts = stack.artifacts(&retried).await;
    let images: Vec<&ArtifactRecord> = artifacts
        .iter()
        .filter(|a| a.kind == ArtifactKind::Image)
        .collect();
    assert_eq!(images.len(), 1, "{artifacts:?}");
    assert_eq!(images[0].size_bytes, FULL_IMAGE as i64, "{:?}", images[0]);
    let (_, bytes) = stack.content(&retried, images[0]).await;
    assert!(
        bytes == *image,
        "the served image is the vendor's, byte for byte"
    );

    let job = stack.wait_ended(&failed).await;
    assert_eq!(job.status, MediaJobStatus::Failed, "{job:?}");
    assert_eq!(job.last_error_code.as_deref(), Some("download_too_large"));
    assert!(job.artifact_ids.is_empty(), "{job:?}");
    assert!(stack.artifacts(&failed).await.is_empty());
    let stored: i64 = sqlx::query_scalar("SELECT count(*) FROM artifacts WHERE media_job_id = $1")
        .bind(&failed)
        .fetch_one(&stack.pool)
        .await
        .unwrap();
    assert_eq!(stored, 0, "no partial row is left to serve");
}
