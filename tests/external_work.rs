//! External work against real `keel` processes: WORKFLOW.md errors over HTTP and on the
//! command line, sources, GitHub polls against a local server speaking GitHub's REST
//! protocol (ETags, 304, rate limits), and imports that create each task once.

mod support;

use reqwest::StatusCode;
use serde_json::{Value, json};
use support::TestApp;

const WORKFLOW: &str = "---
tracker:
  kind: github
  repository: acme/widgets
task:
  execution_kind: shell
  shell_command: echo imported
---
Fix {{ issue.identifier }}: {{ issue.title }}{% if attempt %} (attempt {{ attempt }}){% endif %}
";

fn issue() -> Value {
    json!({ "id": "1", "identifier": "acme/widgets#7", "title": "broken", "state": "open" })
}

#[tokio::test]
async fn render_answers_every_workflow_error_class_with_its_type() {
    let app = TestApp::api_only().await;
    let render = |markdown: &str, issue: Value| {
        let body = json!({ "workflow_markdown": markdown, "issue": issue, "attempt": 2 });
        app.client.post("/v1/external-work/render", body)
    };
    let (status, body) = render(WORKFLOW, issue()).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body["data"]["prompt"],
        "Fix acme/widgets#7: broken (attempt 2)"
    );
    let cases = [
        ("---\ntracker: [\n---\n", "workflow_parse_error"),
        ("---\n- a list\n---\n", "workflow_front_matter_not_a_map"),
        ("{% if %}", "template_parse_error"),
        ("{{ issue.title | shout }}", "template_render_error"),
        ("{{ issue.missing }}", "template_render_error"),
    ];
    for (markdown, expected) in cases {
        let (status, body) = render(markdown, issue()).await;
        assert_eq!(
            status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{markdown}: {body}"
        );
        assert_eq!(body["error"]["type"], expected, "{markdown}: {body}");
    }
    let (status, body) = render(WORKFLOW, json!({ "title": "no id" })).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["type"], "invalid_request");
}

#[test]
fn keel_workflow_checks_and_renders_and_fails_with_the_error_class() {
    let dir = tempfile::tempdir().unwrap();
    let (workflow, broken, issue_file) = (
        dir.path().join("WORKFLOW.md"),
        dir.path().join("BROKEN.md"),
        dir.path().join("issue.json"),
    );
    std::fs::write(&workflow, WORKFLOW).unwrap();
    std::fs::write(&broken, "---\n- not a map\n---\n").unwrap();
    std::fs::write(&issue_file, issue().to_string()).unwrap();
    let path = |p: &std::path::Path| p.to_str().unwrap().to_string();
    let (ok, out) = support::run_keel("", &["workflow", "check", &path(&workflow)]);
    assert!(ok, "{out}");
    assert!(out.contains("\"repository\": \"acme/widgets\""), "{out}");
    let (ok, out) = support::run_keel(
        "",
        &[
            "workflow",
            "render",
            &path(&workflow),
            "--issue",
            &path(&issue_file),
            "--attempt",
            "3",
        ],
    );
    assert!(ok, "{out}");
    assert_eq!(out.trim(), "Fix acme/widgets#7: broken (attempt 3)");
    let (ok, out) = support::run_keel("", &["workflow", "check", &path(&broken)]);
    assert!(
        !ok && out.contains("workflow_front_matter_not_a_map"),
        "{out}"
    );
    let missing = dir.path().join("nope.md");
    let (ok, out) = support::run_keel("", &["workflow", "check", &path(&missing)]);
    assert!(!ok && out.contains("missing_workflow_file"), "{out}");
}
