//! Vendor calls that cannot be aimed inward, and approval summaries kept out of the feed:
//! a real `keel api` refuses presets aimed at addresses or hosts the operator did not allow,
//! a real `keel worker` re-checks the host list and caps what a vendor answers, and the
//! public feed's `approval.requested` carries the approval's id but not its summary.

use crate::support;

use std::time::Duration;

use crate::support::{Client, wait_for};
use keel_client::{MediaJobRecord, MediaJobStatus, ProviderCheck, ProviderView};
use reqwest::StatusCode;
use serde_json::{Value, json};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

const KEY: (&str, &str) = ("KEEL_SECRET_VENDOR_CALLS_KEY", "sk-vendor-calls-test");
const HOSTS: (&str, &str) = ("KEEL_PROVIDER_HOSTS", "127.0.0.1");
const PRIVATE: (&str, &str) = ("KEEL_MEDIA_ALLOW_PRIVATE_ADDRESSES", "1");

fn preset(base_url: &str) -> Value {
    json!({
        "kind": "seedream", "model": "seedream-4-0", "api": "media-job",
        "base_url": base_url, "api_key_ref": format!("env:{}", KEY.0),
        "capabilities": ["image_generate"], "enabled": true,
    })
}

fn assert_names_base_url(status: StatusCode, body: &Value, what: &str) -> String {
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{what}: {body}");
    let message = body["error"]["message"].as_str().unwrap().to_string();
    assert!(message.starts_with("base_url: "), "{what}: {message}");
    message
}

/// Starts a media job on `provider` and waits for it to fail; returns the job.
async fn failed_job(client: &Client, provider: &str) -> MediaJobRecord {
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
    wait_for(Duration::from_secs(60), "the job to fail", || async {
        let job = client.api.get_media_job(&job).await.unwrap().data;
        (job.status == MediaJobStatus::Failed).then_some(job)
    })
    .await
}

#[tokio::test]
async fn presets_aimed_inward_or_off_the_vendors_hosts_are_refused() {
    let db_url = support::fresh_database().await;
    let logs = tempfile::tempdir().unwrap();
    let api = support::spawn_api_with_env(&db_url, logs.path(), "api", &[HOSTS]).await;
    let client = api.client.clone().unwrap();

    for base_url in [
        "http://169.254.169.254/latest/meta-data",
        "https://ark.ap-southeast.bytepluses.com.attacker.example/api/v3",
        "http://10.0.0.8:8080/api/v3",
    ] {
        let (status, body) = client.post("/v1/providers", preset(base_url)).await;
        let message = assert_names_base_url(status, &body, base_url);
        assert!(message.contains("KEEL_PROVIDER_HOSTS"), "{message}");
    }
    for base_url in [
        "https://ark.ap-southeast.bytepluses.com/api/v3#fragment",
        "https://user@ark.ap-southeast.bytepluses.com/api/v3",
        "ftp://ark.ap-southeast.bytepluses.com/api/v3",
    ] {
        let (status, body) = client.post("/v1/providers", preset(base_url)).await;
        assert_names_base_url(status, &body, base_url);
    }

    // The documented host and the listed one are accepted; a patch is checked the same.
    let (status, body) = client
        .post(
            "/v1/providers",
            preset("https://ark.ap-southeast.bytepluses.com/api/v3"),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, body) = client
        .post("/v1/providers", preset("http://127.0.0.1:9/api/v3"))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let id = support::record::<ProviderView>(&body).id;
    let patch = json!({ "base_url": "http://169.254.169.254/latest" });
    let url = format!("{}/v1/providers/{id}", client.base);
    let (status, body) = client.send(client.http.patch(url).json(&patch)).await;
    assert_names_base_url(status, &body, "patch");
}

#[tokio::test]
async fn a_worker_caps_vendor_answers_and_the_feed_keeps_approval_summaries_out() {
    let db_url = support::fresh_database().await;
    let (logs, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let api_env = [HOSTS, ("KEEL_APPROVAL_POLICIES", "shell_exec")];
    let api = support::spawn_api_with_env(&db_url, logs.path(), "api", &api_env).await;
    let client = api.client.clone().unwrap();
    let worker_env = [
        KEY,
        HOSTS,
        PRIVATE,
        ("KEEL_MEDIA_RESPONSE_MAX_BYTES", "4096"),
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
    let huge = json!({ "data": [{ "b64_json": "A".repeat(64 * 1024) }] });
    Mock::given(method("POST"))
        .and(path("/api/v3/images/generations"))
        .respond_with(ResponseTemplate::new(200).set_body_json(huge))
        .mount(&vendor)
        .await;

    let (status, body) = client
        .post("/v1/providers", preset(&format!("{}/api/v3", vendor.uri())))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let provider = support::record::<ProviderView>(&body).id;
    let ended = failed_job(&client, &provider).await;
    assert_eq!(
        ended.last_error_code.as_deref(),
        Some("response_too_large"),
        "{ended:?}"
    );
    assert_eq!(vendor.received_requests().await.unwrap().len(), 1);
    let artifacts = client.api.list_media_artifacts(&ended.id).await.unwrap();
    assert!(artifacts.data.is_empty(), "{artifacts:?}");

    // A gated run: its approval has a summary; the feed's event names only the approval.
    let task = client
        .create_task(&support::shell("echo summary-canary-7f3a | sh"))
        .await;
    let task_id = task.id.as_str();
    let (status, body) = client
        .post(&format!("/v1/tasks/{task_id}/start"), json!({}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let approvals = client.api.list_task_approvals(task_id, None).await;
    let approval = &approvals.unwrap().data[0];
    let summary = serde_json::to_string(&approval.action_summary).unwrap();
    assert!(
        summary.contains("echo summary-canary-7f3a | sh"),
        "{approval:?}"
    );
    let events = client
        .feed_when(
            &format!("/v1/events?task_id={task_id}&event_type=approval.requested"),
            |events| !events.is_empty(),
        )
        .await;
    let event = &events.data[0];
    assert_eq!(
        event.data["approval_id"],
        approval.id.as_str(),
        "{events:?}"
    );
    assert!(event.data.get("action_summary").is_none(), "{event:?}");
    let text = serde_json::to_string(&events).unwrap();
    assert!(!text.contains("summary-canary"), "{text}");
}

#[tokio::test]
async fn a_worker_rechecks_the_host_list_before_calling() {
    let db_url = support::fresh_database().await;
    let (logs, data) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    // The API once listed the host; this worker does not.
    let api = support::spawn_api_with_env(&db_url, logs.path(), "api", &[HOSTS]).await;
    let client = api.client.clone().unwrap();
    let _worker = support::spawn_worker_with_env(
        &db_url,
        logs.path(),
        "worker",
        2_000,
        data.path(),
        &[KEY, PRIVATE],
    );
    let vendor = MockServer::start().await;
    let (status, body) = client
        .post("/v1/providers", preset(&format!("{}/api/v3", vendor.uri())))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let provider = support::record::<ProviderView>(&body).id;

    let ended = failed_job(&client, &provider).await;

    assert_eq!(
        ended.last_error_code.as_deref(),
        Some("provider_host_not_allowed"),
        "{ended:?}"
    );
    let requests = vendor.received_requests().await.unwrap();
    assert!(requests.is_empty(), "the vendor was called: {requests:?}");
    // An API process without the host listed says so when asked to check the preset.
    let narrow = support::spawn_api_with_env(&db_url, logs.path(), "narrow-api", &[KEY]).await;
    let (status, body) = narrow
        .client
        .as_ref()
        .unwrap()
        .post_empty(&format!("/v1/providers/{provider}/check"))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let check: ProviderCheck = support::record(&body);
    assert_eq!(check.code, "provider_host_not_allowed", "{body}");
}
