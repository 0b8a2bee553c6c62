//! What a preset, an artifact or a local process cannot reach: secret references outside the
//! operator's policy (refused by a real `keel api` when written and asked about, and by a
//! real `keel worker` when a stored one is used), artifact content a browser could run, and
//! the embedded cluster without its password.

use crate::support;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use crate::support::{Client, wait_for};
use keel::artifacts;
use keel::artifacts::content::ContentStore;
use keel::db::embedded::{Durability, EmbeddedPostgres};
use keel::domain::Scope;
use keel::events::Subject;
use keel_client::{MediaJobRecord, MediaJobStatus, ProviderView, SecretStatus};
use reqwest::StatusCode;
use serde_json::{Value, json};
use wiremock::MockServer;

const PNG: &[u8] = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR-keel-test-image";
const SVG: &[u8] = b"<svg xmlns='http://www.w3.org/2000/svg'><script>alert(1)</script></svg>";
const FILE_SECRET: &str = "file-secret-value-4b1d";

/// Writes an artifact of `content_type` on a run, through the same store workers use.
async fn artifact(
    pool: &sqlx::PgPool,
    run: (&str, &str),
    name: &str,
    content_type: &str,
    bytes: &[u8],
) -> String {
    let owner = Subject::Run {
        task_id: run.0,
        run_id: run.1,
    };
    let mut tx = pool.begin().await.unwrap();
    let scope = Scope::local();
    let record = artifacts::open(&mut tx, &scope, owner, name, "file", content_type)
        .await
        .unwrap();
    ContentStore::Postgres
        .append(&mut tx, &scope, &record.id, bytes, 1 << 20)
        .await
        .unwrap();
    artifacts::close(&mut tx, &scope, &record.id).await.unwrap();
    tx.commit().await.unwrap();
    record.id
}

#[tokio::test]
async fn artifact_content_is_sandboxed_and_only_inert_types_are_inline() {
    let db_url = support::fresh_database().await;
    let pool = support::pool(&db_url).await;
    let logs = tempfile::tempdir().unwrap();
    let api = support::spawn_api_with_env(&db_url, logs.path(), "api", &[]).await;
    let client = api.client.clone().unwrap();
    let (task_id, run_id) = client.run_shell("true").await;
    let run = (task_id.as_str(), run_id.as_str());

    // (name, content type, bytes, the download's file name when not inline)
    let cases: [(&str, &str, &[u8], Option<&str>); 8] = [
        ("image-0.png", "image/png", PNG, None),
        ("stdout", "text/plain; charset=utf-8", b"hello\n", None),
        ("metadata.json", "application/json", b"{}", None),
        ("image-1.svg", "image/svg+xml", SVG, Some("image-1.svg")),
        (
            "page.html",
            "text/html",
            b"<script>1</script>",
            Some("page.html"),
        ),
        ("PAGE", "Text/HTML; charset=utf-8", b"<b>", Some("PAGE")),
        ("notes.md", "text/markdown", b"# hi", Some("notes.md")),
        ("a\"b/../c.html", "text/html", b"<i>", Some("a_b_.._c.html")),
    ];
    for (name, content_type, bytes, attachment) in cases {
        let id = artifact(&pool, run, name, content_type, bytes).await;
        let url = format!(
            "{}/v1/tasks/{task_id}/runs/{run_id}/artifacts/{id}/content",
            client.base
        );
        let response = client.http.get(url).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{name}");
        let headers = response.headers().clone();
        let header = |h: &str| headers.get(h).map(|v| v.to_str().unwrap().to_string());
        assert_eq!(header("content-type").as_deref(), Some(content_type));
        assert_eq!(header("x-content-type-options").as_deref(), Some("nosniff"));
        assert_eq!(
            header("content-security-policy").as_deref(),
            Some("sandbox; default-src 'none'"),
            "{name}"
        );
        let expected = attachment.map(|file| format!("attachment; filename=\"{file}\""));
        assert_eq!(header("content-disposition"), expected, "{name}");
        assert_eq!(response.bytes().await.unwrap().as_ref(), bytes);
    }
}

/// The error envelope's message of a 422, which must name `field` and the policy.
fn assert_refused(status: StatusCode, body: &Value, field: &str, what: &str) {
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{what}: {body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with(&format!("{field}: ")),
        "{what}: {message}"
    );
    assert!(message.contains("secret policy"), "{what}: {message}");
}

fn preset(api_key_ref: &str, base_url: &str) -> Value {
    json!({
        "kind": "openai-images", "model": "gpt-image-1", "api": "media-job",
        "base_url": base_url, "api_key_ref": api_key_ref,
        "capabilities": ["image_generate"], "enabled": true,
    })
}

async fn status_of(client: &Client, reference: &str) -> (StatusCode, Value) {
    let query: String = form_urlencoded::Serializer::new(String::new())
        .append_pair("ref", reference)
        .finish();
    client.get(&format!("/v1/secrets/status?{query}")).await
}

/// A root with a secret file, and a link in it that leads out to /etc/passwd.
fn secret_root() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("key"), format!("{FILE_SECRET}\n")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", dir.path().join("escape")).unwrap();
    dir
}

#[tokio::test]
async fn presets_and_secret_status_reach_only_what_the_policy_allows() {
    let db_url = support::fresh_database().await;
    let logs = tempfile::tempdir().unwrap();
    let root = secret_root();
    let root_text = root.path().to_str().unwrap();
    let env = [
        ("KEEL_SECRET_FILE_ROOTS", root_text),
        ("OPENAI_API_KEY", "sk-policy-test-openai"),
    ];
    let api = support::spawn_api_with_env(&db_url, logs.path(), "api", &env).await;
    let client = api.client.clone().unwrap();
    let base_url = "https://api.openai.com/v1";

    let outside = format!("file:{root_text}/../../etc/passwd");
    for refused in [
        "env:KEEL_DATABASE_URL",
        "env:DATABASE_URL",
        "env:AWS_SECRET_ACCESS_KEY",
        "env:OTEL_EXPORTER_OTLP_HEADERS",
        "env:KEEL_RUNTIME_TOKEN",
        "env:PATH",
        "file:/etc/passwd",
        &outside,
    ] {
        let (status, body) = client
            .post("/v1/providers", preset(refused, base_url))
            .await;
        assert_refused(status, &body, "api_key_ref", refused);
        let (status, body) = status_of(&client, refused).await;
        assert_refused(status, &body, "ref", refused);
    }
    let mut with_header = preset("env:OPENAI_API_KEY", base_url);
    with_header["secret_header_refs"] = json!({ "X-Extra": "env:KEEL_DATABASE_URL" });
    let (status, body) = client.post("/v1/providers", with_header).await;
    assert_refused(status, &body, "secret_header_refs", "a secret header");

    // No existence oracle: a file that exists and one that does not read the same.
    let exists = status_of(&client, "file:/etc/passwd").await;
    let missing = status_of(&client, "file:/etc/no-such-file-keel").await;
    assert_eq!(exists.0, missing.0);
    assert_eq!(exists.1["error"]["type"], missing.1["error"]["type"]);

    let key_file = format!("file:{root_text}/key");
    for allowed in ["env:OPENAI_API_KEY", &key_file] {
        let (status, body) = client
            .post("/v1/providers", preset(allowed, base_url))
            .await;
        assert_eq!(status, StatusCode::CREATED, "{allowed}: {body}");
        let preset: ProviderView = support::record(&body);
        assert!(preset.api_key_configured, "{body}");
        let (status, body) = status_of(&client, allowed).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert!(support::record::<SecretStatus>(&body).configured, "{body}");
        assert!(!body.to_string().contains(FILE_SECRET));
    }
    // Allowed by its path, refused by where it leads; and a missing file under the root.
    let (status, body) = status_of(&client, &format!("file:{root_text}/escape")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let escape: SecretStatus = support::record(&body);
    assert!(!escape.configured, "{body}");
    let message = escape.message.unwrap();
    assert!(message.contains("symbolic link"), "{message}");
    assert!(!body.to_string().contains("root:"), "{body}");
    let (status, body) = status_of(&client, &format!("file:{root_text}/nope")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let missing: SecretStatus = support::record(&body);
    assert_eq!(
        missing.error_code.as_deref(),
        Some("secret_missing"),
        "{body}"
    );
}

#[tokio::test]
async fn a_worker_checks_the_policy_again_when_it_resolves_a_stored_preset() {
    let db_url = support::fresh_database().await;
    let (logs, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let secret = ("WIDE_POLICY_SECRET", "sk-must-not-leave-4b1d");
    // The API once allowed any name; the worker runs the default policy.
    let hosts = ("KEEL_PROVIDER_HOSTS", "127.0.0.1");
    let api_env = [("KEEL_SECRET_ENV_ALLOW", "*"), secret, hosts];
    let api = support::spawn_api_with_env(&db_url, logs.path(), "api", &api_env).await;
    let client = api.client.clone().unwrap();
    let worker_env = [
        secret,
        ("KEEL_MEDIA_ALLOW_PRIVATE_ADDRESSES", "true"),
        hosts,
    ];
    let _worker = support::spawn_worker_with_env(
        &db_url,
        logs.path(),
        "worker",
        2_000,
        data.path(),
        &worker_env,
    );
    let vendor = MockServer::start().await;

    let (status, body) = client
        .post(
            "/v1/providers",
            preset(&format!("env:{}", secret.0), &vendor.uri()),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let provider = support::record::<ProviderView>(&body).id;
    let (status, body) = client
        .post(
            "/v1/media-jobs",
            json!({ "provider_id": provider, "operation": "image_generate", "prompt": "x" }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let job = support::record::<MediaJobRecord>(&body).id;
    let (status, body) = client
        .post_empty(&format!("/v1/media-jobs/{job}/run"))
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");

    let ended = wait_for(Duration::from_secs(60), "the job to fail", || async {
        let job = client.api.get_media_job(&job).await.unwrap().data;
        (job.status == MediaJobStatus::Failed).then_some(job)
    })
    .await;
    assert_eq!(
        ended.last_error_code.as_deref(),
        Some("secret_not_allowed"),
        "{ended:?}"
    );
    let requests = vendor.received_requests().await.unwrap();
    assert!(requests.is_empty(), "the vendor was called: {requests:?}");
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// Connects once and runs a query: whether the server let `url` in.
async fn admits(url: &str) -> bool {
    match keel::db::connect(url, 1, "test").await {
        Ok(pool) => {
            let one: Result<i32, _> = sqlx::query_scalar("SELECT 1").fetch_one(&pool).await;
            pool.close().await;
            one.is_ok()
        }
        Err(_) => false,
    }
}

/// The cluster's URL without its password, and with a wrong one.
fn without_password(cluster: &EmbeddedPostgres) -> (String, String) {
    let password = std::fs::read_to_string(cluster.password_file()).unwrap();
    let url = cluster.url("postgres");
    let bare = url.replacen(&format!(":{}@", password.trim()), "@", 1);
    assert_ne!(bare, url, "the URL carries the password");
    let wrong = url.replacen(password.trim(), "0000", 1);
    (bare, wrong)
}

#[tokio::test]
async fn the_embedded_cluster_requires_its_password_and_migrates_a_trusting_one() {
    // Not a tempdir (0700): the cluster's user must traverse the path. The throwaway
    // cluster's watchdog removes it when this process ends.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let root = std::env::temp_dir().join(format!("keel-secrets-{}-{nanos}", std::process::id()));
    let start = |root: std::path::PathBuf| {
        tokio::task::spawn_blocking(move || {
            EmbeddedPostgres::start(&root, Durability::Throwaway).unwrap()
        })
    };
    let cluster = start(root.clone()).await.unwrap();
    assert_eq!(mode(&cluster.password_file()), 0o600);
    assert!(admits(&cluster.url("postgres")).await);
    let (bare, wrong) = without_password(&cluster);
    assert!(!admits(&bare).await, "admitted without a password");
    assert!(!admits(&wrong).await, "admitted with a wrong password");

    // A cluster as an older Keel made it: trust everywhere, no password file.
    tokio::task::spawn_blocking(move || cluster.stop())
        .await
        .unwrap();
    let hba = root.join("pgdata/pg_hba.conf");
    std::fs::write(
        &hba,
        "local all all trust\nhost all all 127.0.0.1/32 trust\n",
    )
    .unwrap();
    std::fs::remove_file(root.join("password")).unwrap();

    let cluster = start(root.clone()).await.unwrap();
    assert_eq!(mode(&cluster.password_file()), 0o600);
    assert!(admits(&cluster.url("postgres")).await);
    let (bare, _) = without_password(&cluster);
    assert!(!admits(&bare).await, "still trusting after the migration");
    assert!(root.join("pgdata/pg_hba.conf.trust").exists());
    let password = std::fs::read_to_string(cluster.password_file()).unwrap();
    let log = std::fs::read_to_string(root.join("postgres.log")).unwrap_or_default();
    assert!(
        !log.contains(password.trim()),
        "the server log shows the password"
    );
    tokio::task::spawn_blocking(move || cluster.stop())
        .await
        .unwrap();
}
