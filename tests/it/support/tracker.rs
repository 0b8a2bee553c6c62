//! A local GitHub for the external work tests: its issues, lists answering with ETags,
//! and the sources and items the API made of them.

use keel_client::{ItemRecord, RunRecord};
use reqwest::StatusCode;
use serde_json::{Value, json};
use wiremock::matchers::{header, method, path};
use wiremock::{Mock, ResponseTemplate};

use crate::support::Client;

/// The tracker token: it must reach GitHub and nothing else (no row, event, log, artifact).
pub const CANARY: &str = "ghp_canary_5e1f0c0ffee";
pub const TOKEN_ENV: (&str, &str) = ("ACME_GITHUB_TOKEN", CANARY);

/// The directory name Symphony's workspace key gives an item of `acme/widgets` (its
/// identifier sanitized, then `--` and 16 hex digits of the identifier's SHA-256).
pub fn widget_key(number: u64) -> String {
    use sha2::Digest;
    let identifier = format!("acme/widgets#{number}");
    let digest = sha2::Sha256::digest(identifier.as_bytes());
    let hash: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
    format!("acme_widgets_{number}--{hash}")
}

pub fn github_issue(number: u64, state: &str) -> Value {
    json!({ "id": 1000 + number, "number": number, "title": format!("issue {number}"),
            "state": state, "updated_at": "2026-11-30T09:00:00Z",
            "html_url": format!("https://github.com/acme/widgets/issues/{number}"),
            "labels": [{ "name": "Bug" }] })
}

/// A list answering 200 with an ETag to a request carrying the token.
pub fn list(list: &str, items: Value, etag: &str) -> Mock {
    Mock::given(method("GET"))
        .and(path(format!("/repos/acme/widgets/{list}")))
        .and(header("authorization", format!("Bearer {CANARY}").as_str()))
        .respond_with(
            ResponseTemplate::new(200)
                .insert_header("etag", etag)
                .insert_header("x-ratelimit-remaining", "4999")
                .set_body_json(items),
        )
}

pub async fn register(client: &Client, markdown: &str) -> (StatusCode, Value) {
    client
        .post(
            "/v1/external-work/sources",
            json!({ "workflow_markdown": markdown }),
        )
        .await
}

/// The items a source found.
pub async fn items_of(client: &Client, source_id: &str) -> Vec<ItemRecord> {
    let items = client.api.list_items(source_id).send_with_status().await;
    let (status, items) = items.expect("the source's items");
    assert_eq!(status, StatusCode::OK, "{items:?}");
    items.data
}

/// The run of an item that has one.
pub async fn run_of(client: &Client, item: &ItemRecord) -> RunRecord {
    let (task_id, run_id) = (item.task_id.as_deref(), item.run_id.as_deref());
    client.run(task_id.unwrap(), run_id.unwrap()).await
}
