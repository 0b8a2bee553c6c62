//! The API contract: the OpenAPI document is served, covers every route, hostile input gets
//! a 4xx with the error envelope, and an operation the document gives no body refuses one.

use crate::support;

use crate::support::{TestApp, raw_exchange};
use reqwest::{Method, StatusCode};
use serde_json::Value;

const METHODS: [&str; 5] = ["get", "post", "put", "patch", "delete"];

fn operations(doc: &Value) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in METHODS.iter().filter(|m| item.get(**m).is_some()) {
            found.push((method.to_string(), path.clone()));
        }
    }
    found
}

#[tokio::test]
async fn the_document_is_served_and_matches_the_build() {
    let app = TestApp::api_only().await;
    let (status, served) = app.client.get("/v1/openapi.json").await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(served["openapi"], "3.1.0");
    assert_eq!(served["info"]["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(served, serde_json::to_value(keel::api::openapi()).unwrap());
    let ops = operations(&served);
    assert!(ops.len() >= 30, "{ops:?}");
    for (method, path) in &ops {
        let operation = &served["paths"][path][method];
        assert!(
            operation["operationId"].is_string(),
            "{method} {path} has no operationId"
        );
        assert!(
            operation["tags"][0].is_string(),
            "{method} {path} has no tag"
        );
        for status in ["400", "404", "422", "500"] {
            assert!(
                operation["responses"][status].is_object(),
                "{method} {path} lacks {status}"
            );
        }
    }
}

/// Every documented operation is routed: no documented path falls through to the
/// unknown-route handler, and no documented method is refused.
#[tokio::test]
async fn every_documented_operation_is_routed() {
    let app = TestApp::api_only().await;
    let doc = serde_json::to_value(keel::api::openapi()).unwrap();
    for (method, path) in operations(&doc) {
        // A local-only action acts on the host (the shutdown would stop this server
        // mid-walk); tests/auth.rs covers those.
        let local_only = keel::api::ROUTE_POLICY.iter().any(|(m, p, class)| {
            m.eq_ignore_ascii_case(&method)
                && *p == path
                && *class == keel::api::RouteClass::LocalOnly
        });
        if local_only {
            continue;
        }
        let concrete = path.replace(['{', '}'], "");
        let url = format!(
            "{}{}",
            app.client.base,
            concrete
                .replace("task_id", "task_x")
                .replace("run_id", "run_x")
        );
        let method = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
        let response = app
            .client
            .http
            .request(method.clone(), &url)
            .send()
            .await
            .unwrap();
        let status = response.status();
        let body = support::json_or_null(response).await;
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(
            !message.starts_with("route "),
            "{method} {path} is documented but not routed"
        );
        assert_ne!(
            status,
            StatusCode::METHOD_NOT_ALLOWED,
            "{method} {path} is documented but refused"
        );
    }
}

/// Routes are registered only through `utoipa_axum::routes!`, which documents them; a
/// plain axum `.route(` would add an undocumented route. `/docs` is the one page for
/// people, not part of the API.
#[test]
fn no_route_is_registered_outside_the_document() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src/api");
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let source = std::fs::read_to_string(&path).unwrap();
        for (number, line) in source.lines().enumerate() {
            let plain_route = line.contains(".route(") || line.contains(".route_service(");
            if plain_route && !line.contains("\"/docs\"") {
                panic!(
                    "{}:{}: undocumented route: {line}",
                    path.display(),
                    number + 1
                );
            }
        }
    }
}

#[tokio::test]
async fn the_reference_page_renders_the_document_without_network() {
    let app = TestApp::api_only().await;
    // No credentials: the page carries the document the browser could not fetch without them.
    let response = reqwest::Client::new()
        .get(format!("{}/docs", app.client.base))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let header = |name: &str| {
        let value = response.headers().get(name);
        value
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default()
    };
    assert!(header("content-type").starts_with("text/html"));
    // Its own inline script and style run, by their hashes; nothing else loads or frames it.
    let policy = header("content-security-policy");
    for directive in [
        "default-src 'none'",
        "script-src 'sha256-",
        "frame-ancestors 'none'",
    ] {
        assert!(policy.contains(directive), "{policy}");
    }
    assert_eq!(header("x-content-type-options"), "nosniff");
    assert_eq!(header("x-frame-options"), "DENY");
    let html = response.text().await.unwrap();
    assert!(html.contains(r#"<script id="document" type="application/json">{"openapi":"3.1"#));
    assert!(!html.contains("fetch("), "the page fetches nothing");
    for tag in ["<script src", "<link", "<img", "<iframe"] {
        assert!(!html.contains(tag), "the page loads nothing: {tag}");
    }
}

async fn assert_envelope(response: reqwest::Response, status: StatusCode, mention: &str) {
    assert_eq!(response.status(), status, "expected {status} ({mention})");
    let body: Value = response.json().await.unwrap();
    let message = body["error"]["message"].as_str().unwrap_or_default();
    assert!(body["error"]["request_id"].is_string(), "{body}");
    assert!(
        message.contains(mention),
        "'{message}' should mention '{mention}'"
    );
}

#[tokio::test]
async fn hostile_input_gets_a_4xx_with_the_envelope() {
    let app = TestApp::api_only().await;
    let c = &app.client;
    let post = |body: Vec<u8>| {
        c.http
            .post(format!("{}/v1/tasks", c.base))
            .header("content-type", "application/json")
            .body(body)
    };
    let deep = format!(
        "{{\"execution_kind\":\"shell\",\"prompt\":{}1{}}}",
        "[".repeat(5000),
        "]".repeat(5000)
    );
    assert_envelope(
        post(deep.into_bytes()).send().await.unwrap(),
        StatusCode::UNPROCESSABLE_ENTITY,
        "prompt",
    )
    .await;
    let invalid_utf8 = b"{\"execution_kind\":\"shell\",\"shell_command\":\"\xff\xfe\"}".to_vec();
    assert_envelope(
        post(invalid_utf8).send().await.unwrap(),
        StatusCode::BAD_REQUEST,
        "shell_command",
    )
    .await;
    let nul = br#"{"execution_kind":"shell","shell_command":"echo \u0000"}"#.to_vec();
    assert_envelope(
        post(nul).send().await.unwrap(),
        StatusCode::BAD_REQUEST,
        "NUL",
    )
    .await;
    let unknown = br#"{"execution_kind":"shell","shell_command":"true","colour":"red"}"#.to_vec();
    assert_envelope(
        post(unknown).send().await.unwrap(),
        StatusCode::UNPROCESSABLE_ENTITY,
        "colour",
    )
    .await;
    let big = vec![b' '; keel::api::MAX_BODY_BYTES + 1];
    assert_envelope(
        post(big).send().await.unwrap(),
        StatusCode::PAYLOAD_TOO_LARGE,
        "length limit",
    )
    .await;

    let get = |path: String| c.http.get(format!("{}{path}", c.base));
    let long_id = "t".repeat(20_000);
    assert_envelope(
        get(format!("/v1/tasks/{long_id}")).send().await.unwrap(),
        StatusCode::NOT_FOUND,
        "task",
    )
    .await;
    assert_envelope(
        get(format!("/v1/events?task_id=%00{long_id}"))
            .send()
            .await
            .unwrap(),
        StatusCode::BAD_REQUEST,
        "NUL",
    )
    .await;
    assert_envelope(
        get("/v1/tasks?limit=-1".into()).send().await.unwrap(),
        StatusCode::BAD_REQUEST,
        "limit",
    )
    .await;
    assert_envelope(
        get("/v1/tasks?limit=99999999999999999999".into())
            .send()
            .await
            .unwrap(),
        StatusCode::BAD_REQUEST,
        "limit",
    )
    .await;
    assert_envelope(
        get("/v1/tasks?limit=1&limit=2".into())
            .send()
            .await
            .unwrap(),
        StatusCode::BAD_REQUEST,
        "duplicate",
    )
    .await;
    let after = "/v1/events?after=99999999999999999999999-1";
    assert_envelope(
        get(after.into()).send().await.unwrap(),
        StatusCode::BAD_REQUEST,
        "after",
    )
    .await;
    for bad in ["-4", "12", "+1-2", "1-2-3", "1-%202"] {
        assert_envelope(
            get(format!("/v1/events?after={bad}")).send().await.unwrap(),
            StatusCode::BAD_REQUEST,
            "after",
        )
        .await;
    }
    let runs = "/v1/tasks/task_x/runs/run_x/events?after_sequence=-4";
    assert_envelope(
        get(runs.into()).send().await.unwrap(),
        StatusCode::BAD_REQUEST,
        "after_sequence",
    )
    .await;
}

/// `request` (a request line and headers, without the blank line) sent raw with `body`, and
/// asserts the 413 envelope that refuses the body.
async fn assert_body_refused(base: &str, request: &str, body: &str, mention: &str) {
    let request = format!("{request}Host: localhost\r\nConnection: close\r\n\r\n{body}");
    let (status, response) = raw_exchange(base, &request).await;
    assert_eq!(status, 413, "{request}: {response}");
    assert!(response.contains("\"invalid_request\""), "{response}");
    assert!(response.contains("\"request_id\""), "{response}");
    assert!(response.contains(mention), "{request}: {response}");
}

/// Every operation the document gives no request body refuses one with 413 and the
/// envelope: announced (2.5 MB, none of it sent) or sent chunked, without a length. Sent
/// nothing, it answers as before. The 2 MiB limit holds on every operation that takes one.
#[tokio::test]
async fn an_operation_that_takes_no_body_refuses_one() {
    let app = TestApp::api_only().await;
    let base = &app.client.base;
    let doc = serde_json::to_value(keel::api::openapi()).unwrap();
    let mut bodiless = 0;
    for (method, path) in operations(&doc) {
        if doc["paths"][&path][&method]["requestBody"].is_object() {
            continue;
        }
        bodiless += 1;
        let concrete = path.replace(['{', '}'], "");
        let line = format!("{} {concrete} HTTP/1.1\r\n", method.to_uppercase());
        let announced =
            format!("{line}Content-Type: application/json\r\nContent-Length: 2500000\r\n");
        assert_body_refused(base, &announced, "", "takes no request body").await;
        let chunked =
            format!("{line}Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n");
        assert_body_refused(
            base,
            &chunked,
            "2\r\n{}\r\n0\r\n\r\n",
            "takes no request body",
        )
        .await;
        // A read answers as it always did (a stream would never end); the shutdown would
        // stop this server: refused above, it did not.
        if method == "get" || path == "/v1/system/shutdown" {
            continue;
        }
        let request = format!("{line}Host: localhost\r\nConnection: close\r\n\r\n");
        let (status, response) = raw_exchange(base, &request).await;
        assert!(
            status != 413 && status < 500,
            "{method} {path} without a body: {response}"
        );
    }
    assert!(bodiless >= 20, "{bodiless} operations take no body");
    let too_large = "POST /v1/tasks HTTP/1.1\r\nContent-Type: application/json\r\n\
                     Content-Length: 2500000\r\n";
    assert_body_refused(base, too_large, "", "length limit").await;
}

/// The document says exactly what the server takes: a task draft is a union on
/// `execution_kind` whose variants require their own fields and refuse others', the
/// resolve and schedule bodies are unions too, and closed sets are enums, query filters
/// included.
#[test]
fn the_document_states_unions_bounds_and_closed_sets() {
    let doc = serde_json::to_value(keel::api::openapi()).unwrap();
    let schemas = &doc["components"]["schemas"];
    let variants = |union: &str, tag: &str| -> Vec<(String, Value)> {
        let union = &schemas[union];
        assert_eq!(union["discriminator"]["propertyName"], tag, "{union}");
        let mapping = union["discriminator"]["mapping"].as_object().unwrap();
        assert_eq!(union["oneOf"].as_array().unwrap().len(), mapping.len());
        mapping
            .iter()
            .map(|(value, reference)| {
                let name = reference.as_str().unwrap().rsplit('/').next().unwrap();
                // A variant with rules across fields is the `allOf` of its closed object
                // and those rules.
                let variant = match schemas[name]["allOf"].as_array() {
                    Some(all) => all[0].clone(),
                    None => schemas[name].clone(),
                };
                assert_eq!(
                    variant["properties"][tag]["enum"],
                    serde_json::json!([value])
                );
                assert_eq!(variant["additionalProperties"], false, "{name}");
                (value.clone(), variant)
            })
            .collect()
    };
    let required = |variant: &Value, field: &str| {
        variant["required"]
            .as_array()
            .unwrap()
            .iter()
            .any(|f| f == field)
    };

    let tasks = variants("TaskDraft", "execution_kind");
    let kinds: Vec<&str> = tasks.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(kinds, ["agent_loop", "file", "git", "shell"]);
    for (kind, variant) in &tasks {
        let own = match kind.as_str() {
            "shell" => "shell_command",
            "git" => "git_command",
            "file" => "file_operation",
            _ => "prompt",
        };
        assert!(
            required(variant, own) && required(variant, "execution_kind"),
            "{kind}"
        );
        let fields = &variant["properties"];
        assert_eq!(fields["budget_micros_usd"]["minimum"], 0, "{kind}");
        assert_eq!(fields["timeout_ms"]["minimum"], 1, "{kind}");
        // Another kind's field is refused, not ignored.
        let foreign = if kind == "shell" {
            "git_command"
        } else {
            "shell_command"
        };
        assert!(fields[foreign].is_null(), "{kind} takes {foreign}");
    }
    let file = &tasks[1].1["properties"];
    assert_eq!(
        file["file_operation"]["enum"],
        serde_json::json!(["write", "append", "delete"])
    );

    let decisions = variants("ResolveRequest", "decision");
    assert_eq!(decisions.len(), 2);
    let schedules = variants("ScheduleDraft", "kind");
    for (kind, variant) in &schedules {
        assert!(
            required(variant, "timezone") && required(variant, "enabled"),
            "{kind}"
        );
        assert_eq!(variant["properties"]["revision"]["minimum"], 1, "{kind}");
    }

    let enum_of = |schema: &Value| -> Vec<String> {
        let schema = match schema["$ref"].as_str() {
            Some(reference) => &schemas[reference.rsplit('/').next().unwrap()],
            None => schema,
        };
        let values = schema["enum"]
            .as_array()
            .unwrap_or_else(|| panic!("{schema}"));
        values
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect()
    };
    let parameter = |path: &str, name: &str| -> Value {
        let parameters = doc["paths"][path]["get"]["parameters"].as_array().unwrap();
        let found = parameters.iter().find(|p| p["name"] == name);
        found.unwrap_or_else(|| panic!("{path} has no {name}"))["schema"].clone()
    };
    for (path, name, count) in [
        ("/v1/tasks", "status", 7),
        ("/v1/approvals", "status", 5),
        ("/v1/media-jobs", "status", 5),
        ("/v1/runtime/leases", "status", 3),
        ("/v1/state-transitions", "entity_type", 6),
        ("/v1/usage/summary", "scope", 3),
        ("/v1/secrets/status", "purpose", 6),
    ] {
        let values = enum_of(&parameter(path, name));
        assert_eq!(values.len(), count, "{path} {name}: {values:?}");
        assert!(values.iter().all(|v| !v.is_empty()), "{path} {name}");
    }
    assert!(enum_of(&parameter("/v1/tasks", "status")).contains(&"not_started".to_string()));

    // Every reference resolves.
    let text = doc.to_string();
    for reference in text.split("\"#/components/schemas/").skip(1) {
        let name = reference.split('"').next().unwrap();
        assert!(schemas[name].is_object(), "dangling reference to {name}");
    }

    // PostgreSQL stores no NUL, so no string parameter takes one.
    for (path, item) in doc["paths"].as_object().unwrap() {
        for operation in item.as_object().unwrap().values() {
            let parameters = operation["parameters"].as_array().into_iter().flatten();
            for schema in parameters.map(|p| &p["schema"]) {
                let free_text = schema["type"] == "string"
                    && schema["enum"].is_null()
                    && schema["format"].is_null();
                if free_text {
                    let pattern = schema["pattern"].as_str().unwrap_or_default();
                    assert!(!pattern.is_empty(), "{path}: {schema}");
                }
            }
        }
    }
}

/// The rules issue 33 moved from descriptions into the document, each where the server
/// applies it (the server still answers 422 naming the field).
#[test]
fn the_document_states_cross_field_rules_names_and_references() {
    use keel_api_types::schema::{ENV_NAME, HEADER_NAME, MAX_JSON_NUMBER, SECRET_REF};
    let doc = serde_json::to_value(keel::api::openapi()).unwrap();
    let schemas = &doc["components"]["schemas"];
    let rules = |name: &str| -> Vec<Value> {
        let all = schemas[name]["allOf"].as_array();
        all.unwrap_or_else(|| panic!("{name} states no rules"))[1..].to_vec()
    };

    // working_directory outside in_place, repo with it, base_branch without repo.
    for name in [
        "ShellTaskDraft",
        "GitTaskDraft",
        "FileTaskDraft",
        "AgentLoopTaskDraft",
    ] {
        let rules = rules(name);
        let workspace = rules[0]["anyOf"].as_array().unwrap();
        assert_eq!(
            workspace[0]["properties"]["working_directory"]["type"],
            "null"
        );
        assert_eq!(
            workspace[1]["properties"]["workspace_mode"]["enum"],
            serde_json::json!(["in_place"])
        );
        assert!(
            workspace[1]["required"]
                .as_array()
                .unwrap()
                .contains(&"working_directory".into())
        );
        assert_eq!(
            rules[1]["anyOf"][1]["required"],
            serde_json::json!(["repo"])
        );
    }

    // At least one label; a review's body but for APPROVE.
    let labels = &rules("LabelsActionRequest")[0]["anyOf"];
    assert_eq!(labels[0]["properties"]["add"]["minItems"], 1);
    assert_eq!(labels[1]["properties"]["remove"]["minItems"], 1);
    let review = &rules("ReviewActionRequest")[0]["anyOf"];
    assert_eq!(
        review[0]["properties"]["event"]["enum"],
        serde_json::json!(["APPROVE"])
    );
    assert_eq!(review[1]["required"], serde_json::json!(["body"]));

    // The zones the server's tz database knows, by name.
    let zones = &schemas["CronScheduleDraft"]["properties"]["timezone"]["enum"];
    let zones: Vec<&str> = zones
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|z| z.as_str())
        .collect();
    assert!(zones.contains(&"Europe/Madrid") && zones.contains(&"UTC"));
    assert!(!zones.iter().any(|z| z.eq_ignore_ascii_case("local")));
    assert_eq!(zones.len(), chrono_tz::TZ_VARIANTS.len());

    // An MCP server: one transport, named environment and headers, secret references.
    let server = &schemas["McpServer"]["allOf"];
    let transports = server[1]["oneOf"].as_array().unwrap();
    assert_eq!(transports[0]["required"], serde_json::json!(["command"]));
    assert_eq!(transports[1]["required"], serde_json::json!(["url"]));
    let fields = &server[0]["properties"];
    assert_eq!(fields["env"]["propertyNames"]["pattern"], ENV_NAME);
    assert_eq!(fields["headers"]["propertyNames"]["pattern"], HEADER_NAME);
    for map in ["env", "headers"] {
        assert_eq!(
            fields[map]["additionalProperties"]["pattern"], SECRET_REF,
            "{map}"
        );
    }
    assert!(fields["tools"]["items"]["pattern"].is_string());
    assert!(fields["url"]["pattern"].is_string());

    // A preset's header names and secret references; free-form numbers within 2^53 - 1.
    for name in ["ProviderDraft", "ProviderPatch"] {
        let fields = &schemas[name]["properties"];
        assert!(
            fields["secret_header_refs"]["propertyNames"]["pattern"].is_string(),
            "{name}"
        );
        assert_eq!(
            fields["secret_header_refs"]["additionalProperties"]["pattern"], SECRET_REF,
            "{name}"
        );
        assert_eq!(fields["api_key_ref"]["pattern"], SECRET_REF, "{name}");
        assert!(fields["base_url"]["pattern"].is_string(), "{name}");
    }
    // `GET /v1/secrets/status` reads a reference by the same grammar.
    let parameters = doc["paths"]["/v1/secrets/status"]["get"]["parameters"]
        .as_array()
        .unwrap();
    let reference = parameters.iter().find(|p| p["name"] == "ref").unwrap();
    assert_eq!(reference["schema"]["pattern"], SECRET_REF);

    let number = &schemas["JsonValue"]["anyOf"][1];
    assert_eq!(number["maximum"], MAX_JSON_NUMBER);
    assert_eq!(number["minimum"], -MAX_JSON_NUMBER);
}
