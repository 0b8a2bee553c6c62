//! Who may call the API, against real `keel` processes over real HTTP: the runtime token,
//! the Host allowlist, the refusal of an unprotected listener, the local-only shutdown,
//! remote identities (JWT by secret, public key and JWKS; the header form), the route
//! policy, the rate limit and `whoami`.

use crate::support;

use std::path::PathBuf;
use std::time::Duration;

use crate::support::{
    Client, KeelProcess, client_with_headers, fresh_database, raw_exchange, run_keel_until_exit,
    spawn_api_with_env, spawn_worker_with_env, wait_for,
};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use keel_client::{RuntimeMode, Session, ShutdownAccepted};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

const TOKEN: &str = "test-runtime-token-0123456789";
const RUNTIME_ID: &str = "rt_test";
const JWT_SECRET: &str = "a-test-hs256-secret-of-at-least-32-bytes";
const SHARED_SECRET: &str = "test-shared-secret-0123456789";

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/auth")
        .join(name)
}

fn fixture_str(name: &str) -> String {
    fixture(name).to_str().unwrap().to_string()
}

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

/// Claims a valid identity carries, for `org`.
fn claims(org: &str) -> Value {
    json!({ "sub": "actor_1", "org": org, "aud": RUNTIME_ID, "iat": now(), "exp": now() + 120,
            "project": "proj_1", "name": "Ada Lovelace" })
}

fn sign(claims: &Value, algorithm: Algorithm, kid: Option<&str>, key: &EncodingKey) -> String {
    let mut header = Header::new(algorithm);
    header.kid = kid.map(str::to_string);
    jsonwebtoken::encode(&header, claims, key).unwrap()
}

fn hs256(claims: &Value, secret: &str) -> String {
    let key = EncodingKey::from_secret(secret.as_bytes()).unwrap();
    sign(claims, Algorithm::HS256, None, &key)
}

fn ed25519(claims: &Value, private: &str, kid: Option<&str>) -> String {
    let key = EncodingKey::from_ed_pem(&std::fs::read(fixture(private)).unwrap()).unwrap();
    sign(claims, Algorithm::EdDSA, kid, &key)
}

fn rs256(claims: &Value, kid: Option<&str>) -> String {
    let key = EncodingKey::from_rsa_pem(&std::fs::read(fixture("rsa.pem")).unwrap()).unwrap();
    sign(claims, Algorithm::RS256, kid, &key)
}

/// An unsigned token: `alg: none`.
fn unsigned(claims: &Value) -> String {
    let part = |v: Value| URL_SAFE_NO_PAD.encode(v.to_string());
    format!(
        "{}.{}.",
        part(json!({ "alg": "none", "typ": "JWT" })),
        part(claims.clone())
    )
}

async fn status_with(client: &Client, path: &str, headers: &[(&str, &str)]) -> (StatusCode, Value) {
    let mut request = client.http.get(format!("{}{path}", client.base));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    client.send(request).await
}

/// Asserts the 401 envelope, and returns its message (the same for every failure).
fn assert_unauthorized(status: StatusCode, body: &Value, case: &str) -> String {
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{case}: {body}");
    assert_eq!(body["error"]["type"], "unauthorized", "{case}: {body}");
    assert!(body["error"]["request_id"].is_string(), "{case}: {body}");
    body["error"]["message"].as_str().unwrap().to_string()
}

async fn spawn(name: &str, env: &[(&str, &str)]) -> (KeelProcess, Client, tempfile::TempDir) {
    let db = fresh_database().await;
    let logs = tempfile::tempdir().unwrap();
    let process = spawn_api_with_env(&db, logs.path(), name, env).await;
    let client = process.client.clone().unwrap();
    (process, client, logs)
}

fn remote_env<'a>(extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    let mut env = vec![("KEEL_REMOTE_MODE", "1"), ("KEEL_RUNTIME_ID", RUNTIME_ID)];
    env.extend_from_slice(extra);
    env
}

#[tokio::test]
async fn the_runtime_token_guards_every_v1_route_and_leaves_the_probes_open() {
    let (process, client, _logs) = spawn("token", &[("KEEL_RUNTIME_TOKEN", TOKEN)]).await;
    for probe in ["/healthz", "/readyz"] {
        let (status, _) = client.get(probe).await;
        assert_eq!(status, StatusCode::OK, "{probe}");
    }
    let wrong_bearer = "Bearer not-the-token-at-all";
    let cases: [(&str, &[(&str, &str)]); 6] = [
        ("missing", &[]),
        ("empty bearer", &[("authorization", "Bearer ")]),
        ("another scheme", &[("authorization", "Basic dGVzdDp0ZXN0")]),
        ("wrong bearer", &[("authorization", wrong_bearer)]),
        (
            "wrong header",
            &[("x-keel-runtime-token", "not-the-token-at-all")],
        ),
        (
            "a right and a wrong one",
            &[
                ("x-keel-runtime-token", TOKEN),
                ("authorization", wrong_bearer),
            ],
        ),
    ];
    let mut messages = Vec::new();
    for (case, headers) in cases {
        let (status, body) = status_with(&client, "/v1/tasks", headers).await;
        messages.push(assert_unauthorized(status, &body, case));
    }
    messages.dedup();
    assert_eq!(
        messages.len(),
        1,
        "one message for every failure: {messages:?}"
    );
    // An unknown path is not an oracle for what exists.
    let (status, body) = client.get("/v1/nowhere").await;
    assert_unauthorized(status, &body, "unknown path");

    let bearer = format!("Bearer {TOKEN}");
    for headers in [
        [("authorization", bearer.as_str())],
        [("x-keel-runtime-token", TOKEN)],
    ] {
        let authorized = client_with_headers(&client.base, &headers);
        let (status, body) = authorized.get("/v1/tasks").await;
        assert_eq!(status, StatusCode::OK, "{body}");
        authorized.create_task(&support::shell("true")).await;
        let (status, body) = authorized.get("/v1/nowhere").await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    }
    assert!(
        !process.log_text().contains(TOKEN),
        "the token reached the log"
    );
}

#[tokio::test]
async fn the_host_must_be_on_the_allowlist_and_cors_is_off_unless_configured() {
    let (_process, client, _logs) = spawn("hosts", &[]).await;
    let (status, body) = status_with(&client, "/v1/tasks", &[("host", "evil.example")]).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error"]["type"], "forbidden");
    let (status, _) = status_with(&client, "/v1/tasks", &[("host", "localhost:1")]).await;
    assert_eq!(status, StatusCode::OK, "loopback names on any port");
    // Probes come from orchestrators addressing pod IPs: no Host check.
    let (status, _) = status_with(&client, "/healthz", &[("host", "10.1.2.3:8420")]).await;
    assert_eq!(status, StatusCode::OK);
    let response = client
        .http
        .get(format!("{}/v1/tasks", client.base))
        .header("origin", "https://ui.example")
        .send()
        .await
        .unwrap();
    assert!(
        response
            .headers()
            .get("access-control-allow-origin")
            .is_none()
    );

    let (_process, client, _logs) = spawn(
        "hosts-configured",
        &[
            ("KEEL_ALLOWED_HOSTS", "keel.example.com"),
            ("KEEL_CORS_ORIGINS", "https://ui.example"),
        ],
    )
    .await;
    let (status, _) = status_with(&client, "/v1/tasks", &[("host", "keel.example.com:443")]).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _) = client.get("/v1/tasks").await;
    assert_eq!(
        status,
        StatusCode::FORBIDDEN,
        "the list replaces the default"
    );
    let preflight = client
        .http
        .request(Method::OPTIONS, format!("{}/v1/tasks", client.base))
        .header("host", "keel.example.com")
        .header("origin", "https://ui.example")
        .header("access-control-request-method", "POST")
        .header(
            "access-control-request-headers",
            "authorization,content-type",
        )
        .send()
        .await
        .unwrap();
    assert!(preflight.status().is_success(), "{}", preflight.status());
    assert_eq!(
        preflight.headers()["access-control-allow-origin"],
        "https://ui.example"
    );
}

#[tokio::test]
async fn a_malformed_or_repeated_host_is_a_bad_request() {
    let (_process, client, _logs) = spawn("hosts-strict", &[]).await;
    let request = |hosts: &[&str]| {
        let lines: String = hosts.iter().map(|h| format!("Host: {h}\r\n")).collect();
        format!("GET /v1/tasks HTTP/1.1\r\n{lines}Connection: close\r\n\r\n")
    };
    let (status, response) = raw_exchange(&client.base, &request(&["localhost"])).await;
    assert_eq!(status, 200, "{response}");
    for hosts in [
        &["[::1]evil.example"][..],
        &["localhost", "evil.example"],
        &["localhost", "localhost"],
    ] {
        let (status, response) = raw_exchange(&client.base, &request(hosts)).await;
        assert_eq!(status, 400, "{hosts:?}: {response}");
        assert!(response.contains("\"invalid_request\""), "{response}");
    }
}

#[tokio::test]
async fn a_client_that_never_finishes_its_request_line_is_disconnected() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (_process, client, _logs) =
        spawn("slowloris", &[("KEEL_HEADER_READ_TIMEOUT_SECS", "1")]).await;
    let address = client.base.trim_start_matches("http://").to_string();
    let mut slow = tokio::net::TcpStream::connect(&address).await.unwrap();
    slow.write_all(b"GET /v1/ta").await.unwrap();
    // Generous next to the 1 s bound: the assertion is that the server closes it at all.
    let mut buf = [0u8; 256];
    let read = tokio::time::timeout(Duration::from_secs(30), slow.read(&mut buf)).await;
    match read {
        Ok(Ok(0)) | Ok(Err(_)) => {}
        Ok(Ok(n)) => {
            // A 408 before the close is fine too; then the stream must end.
            let text = String::from_utf8_lossy(&buf[..n]).into_owned();
            assert!(text.starts_with("HTTP/1.1 408"), "{text}");
        }
        Err(_) => panic!("the half-sent request still holds its connection after 30 s"),
    }
    // Whole requests are served as before.
    let (status, response) = raw_exchange(
        &client.base,
        "GET /v1/tasks HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(status, 200, "{response}");
}

/// A body that stops, or trickles in a byte every 100 ms (never a long gap), past
/// `KEEL_BODY_READ_TIMEOUT_SECS` is answered 408 with the envelope, and the connection
/// closed: the deadline is the whole body's.
#[tokio::test]
async fn a_body_that_does_not_arrive_in_time_is_refused() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (_process, client, _logs) =
        spawn("slow-body", &[("KEEL_BODY_READ_TIMEOUT_SECS", "1")]).await;
    let address = client.base.trim_start_matches("http://").to_string();
    let head = "POST /v1/tasks HTTP/1.1\r\nHost: localhost\r\n\
                Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n";
    for trickle in [false, true] {
        let stream = tokio::net::TcpStream::connect(&address).await.unwrap();
        let (mut read, mut write) = stream.into_split();
        write.write_all(head.as_bytes()).await.unwrap();
        write.write_all(br#"{"execution_kind":"#).await.unwrap();
        let started = std::time::Instant::now();
        // The writing half stays open either way: a closed one would end the body early.
        let sender = tokio::spawn(async move {
            while trickle && write.write_all(b" ").await.is_ok() {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            std::future::pending::<()>().await;
        });
        let mut response = Vec::new();
        // Until the server closes; generous next to the 1 s deadline.
        let read = tokio::time::timeout(Duration::from_secs(30), read.read_to_end(&mut response));
        assert!(
            read.await.is_ok(),
            "trickle {trickle}: no answer after 30 s"
        );
        let elapsed = started.elapsed();
        sender.abort();
        let response = String::from_utf8_lossy(&response);
        assert!(
            response.starts_with("HTTP/1.1 408"),
            "trickle {trickle}: {response}"
        );
        assert!(response.contains("\"invalid_request\""), "{response}");
        assert!(response.contains("\"request_id\""), "{response}");
        assert!(
            elapsed >= Duration::from_secs(1),
            "{elapsed:?}: the whole deadline"
        );
    }
    // A body that arrives in time is served as before.
    let body = r#"{"execution_kind":"shell","shell_command":"true"}"#;
    let request = format!(
        "POST /v1/tasks HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let (status, response) = raw_exchange(&client.base, &request).await;
    assert_eq!(status, 201, "{response}");
}

#[tokio::test]
async fn a_web_page_cannot_change_a_local_keel_without_a_token() {
    let (_process, client, _logs) = spawn("cross-site", &[]).await;
    let task = client.create_task(&support::shell("true")).await;
    let start = format!("{}/v1/tasks/{}/start", client.base, task.id);
    let shutdown = format!("{}/v1/system/shutdown", client.base);
    let send = |url: &str, headers: &[(&str, &str)], body: &'static str| {
        let mut request = client.http.post(url).body(body);
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        client.send(request)
    };
    let own = client.base.clone();
    let json = ("content-type", "application/json");
    // What a form or fetch() on another site's page sends without a preflight.
    let cases = [
        (
            "a text/plain body",
            &start,
            vec![("content-type", "text/plain")],
            "{}",
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
        ),
        (
            "another origin",
            &start,
            vec![json, ("origin", "https://evil.example")],
            "{}",
            StatusCode::FORBIDDEN,
        ),
        (
            "a cross-site fetch",
            &start,
            vec![json, ("sec-fetch-site", "cross-site")],
            "{}",
            StatusCode::FORBIDDEN,
        ),
        (
            "another port of this host",
            &start,
            vec![json, ("origin", "http://127.0.0.1:1")],
            "{}",
            StatusCode::FORBIDDEN,
        ),
        (
            "a stop from another origin",
            &shutdown,
            vec![("origin", "https://evil.example")],
            "",
            StatusCode::FORBIDDEN,
        ),
    ];
    for (case, url, headers, body, expected) in &cases {
        let (status, response) = send(url, headers, body).await;
        assert_eq!(status, *expected, "{case}: {response}");
        assert!(response["error"]["type"].is_string(), "{case}: {response}");
    }
    let runs = client.api.list_runs(&task.id).await.unwrap().data;
    assert!(runs.is_empty(), "nothing was started");
    // The console's own pages (same origin) and clients that are no browser still work.
    let same_origin = [
        json,
        ("origin", own.as_str()),
        ("sec-fetch-site", "same-origin"),
    ];
    let (status, response) = send(&start, &same_origin, "{}").await;
    assert_eq!(status, StatusCode::CREATED, "{response}");
    let other = client.create_task(&support::shell("true")).await;
    let start_other = format!("{}/v1/tasks/{}/start", client.base, other.id);
    let (status, response) = send(&start_other, &[], "").await;
    assert_eq!(status, StatusCode::CREATED, "{response}");
}

#[tokio::test]
async fn a_non_loopback_listener_needs_credentials() {
    let db = fresh_database().await;
    let logs = tempfile::tempdir().unwrap();
    let timeout = Duration::from_secs(20);
    let cases = [
        (
            "open",
            vec![],
            "refusing to listen on 0.0.0.0:0 without authentication",
        ),
        (
            "remote-without-verifier",
            remote_env(&[]),
            "remote mode needs a verifier",
        ),
    ];
    for (name, env, message) in cases {
        let args = ["api", "--listen", "0.0.0.0:0"];
        let (status, output) = run_keel_until_exit(&db, logs.path(), name, &args, &env, timeout);
        assert!(!status.success(), "{name}: {output}");
        assert!(output.contains(message), "{name}: {output}");
    }
    let (status, output) = run_keel_until_exit(
        &db,
        logs.path(),
        "short-token",
        &["api"],
        &[("KEEL_RUNTIME_TOKEN", "short")],
        timeout,
    );
    assert!(
        !status.success() && output.contains("at least 16"),
        "{output}"
    );
}

#[tokio::test]
async fn shutdown_is_local_only_and_stops_the_process() {
    let (mut process, client, _logs) = spawn("shutdown", &[]).await;
    let shutdown = format!("{}/v1/system/shutdown", client.base);
    for (name, value) in [
        ("x-forwarded-for", "203.0.113.9"),
        ("forwarded", "for=203.0.113.9"),
        ("x-forwarded-proto", "https"),
    ] {
        let (status, body) = client
            .send(client.http.post(&shutdown).header(name, value))
            .await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{name}: {body}");
        assert_eq!(body["error"]["type"], "forbidden");
    }
    let (status, body) = client.send(client.http.post(&shutdown)).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(
        support::record::<ShutdownAccepted>(&body).status,
        "shutting_down"
    );
    let exit = process.wait_exit(Duration::from_secs(20));
    assert!(exit.success(), "{exit:?}: {}", process.log_text());
}

#[tokio::test]
async fn whoami_in_local_mode_names_a_stable_host_and_the_local_actions() {
    let db = fresh_database().await;
    let logs = tempfile::tempdir().unwrap();
    let env = [("KEEL_RUNTIME_LABEL", "test-box")];
    let mut ids = Vec::new();
    for name in ["first", "second"] {
        let mut process = spawn_api_with_env(&db, logs.path(), name, &env).await;
        let client = process.client.clone().unwrap();
        let (status, body) = client.get("/v1/whoami").await;
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["object"], "session");
        // Omitted, not null (read raw: the record cannot tell them apart).
        let sent = &body["data"];
        assert!(sent.get("remote_identity").is_none(), "{sent}");
        let session: Session = support::record(&body);
        assert_eq!(session.actor_id, "local");
        assert_eq!(session.workspace, "default");
        let host = &session.runtime_host;
        assert_eq!(host.label, "test-box");
        assert_eq!(host.runtime_mode, RuntimeMode::Local);
        assert_eq!(host.operator_access, "local_operator");
        assert!(host.local_only_actions_available);
        assert_eq!(host.local_only_actions, ["POST /v1/system/shutdown"]);
        assert!(host.id.starts_with("runtime_"));
        ids.push(host.id.clone());
        let (_, proxied) =
            status_with(&client, "/v1/whoami", &[("x-forwarded-for", "1.2.3.4")]).await;
        let proxied = support::record::<Session>(&proxied).runtime_host;
        assert!(!proxied.local_only_actions_available);
        assert!(proxied.local_only_actions.is_empty());
        process.terminate(Duration::from_secs(20));
    }
    assert_eq!(ids[0], ids[1], "the host id is generated once and kept");
}

#[tokio::test]
async fn hs256_identities_are_verified_claim_by_claim() {
    let env = remote_env(&[
        ("KEEL_REMOTE_JWT_SECRET", JWT_SECRET),
        ("KEEL_REMOTE_JWT_LEEWAY_SECS", "1"),
    ]);
    let (_process, client, _logs) = spawn("hs256", &env).await;
    let valid = hs256(&claims("org_a"), JWT_SECRET);
    let (status, body) = status_with(&client, "/v1/whoami", &[("x-keel-identity", &valid)]).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let session: Session = support::record(&body);
    assert_eq!(session.actor_id, "actor_1");
    assert_eq!(session.workspace, "org_a");
    assert_eq!(session.role, "member", "no role claim: a member");
    assert_eq!(session.runtime_host.runtime_mode, RuntimeMode::Remote);
    assert_eq!(session.runtime_host.operator_access, "remote_supervision");
    assert!(!session.runtime_host.local_only_actions_available);
    // Exactly these fields (read raw: the record would ignore an extra one).
    assert_eq!(
        body["data"]["remote_identity"],
        json!({ "actor_id": "actor_1", "org_id": "org_a", "runtime_id": RUNTIME_ID,
                "project_id": "proj_1", "name": "Ada Lovelace", "form": "jwt" })
    );

    let with = |change: Value| {
        let mut c = claims("org_a");
        for (k, v) in change.as_object().unwrap() {
            c[k] = v.clone();
        }
        c
    };
    let without = |claim: &str| {
        let mut c = claims("org_a");
        c.as_object_mut().unwrap().remove(claim);
        c
    };
    let operator = hs256(&with(json!({ "role": "operator" })), JWT_SECRET);
    let (_, body) = status_with(&client, "/v1/whoami", &[("x-keel-identity", &operator)]).await;
    assert_eq!(support::record::<Session>(&body).role, "operator", "{body}");
    let cases = [
        (
            "expired",
            hs256(&with(json!({ "exp": now() - 60 })), JWT_SECRET),
        ),
        (
            "not yet valid",
            hs256(&with(json!({ "nbf": now() + 120 })), JWT_SECRET),
        ),
        (
            "issued in the future",
            hs256(&with(json!({ "iat": now() + 120 })), JWT_SECRET),
        ),
        (
            "too long-lived",
            hs256(&with(json!({ "exp": now() + 3600 })), JWT_SECRET),
        ),
        (
            "wrong audience",
            hs256(&with(json!({ "aud": "another_runtime" })), JWT_SECRET),
        ),
        ("no audience", hs256(&without("aud"), JWT_SECRET)),
        ("no org", hs256(&without("org"), JWT_SECRET)),
        ("no iat", hs256(&without("iat"), JWT_SECRET)),
        (
            "an org that is no id",
            hs256(&with(json!({ "org": "a b" })), JWT_SECRET),
        ),
        // Local mode's workspace: an org of that name would see every local-mode row.
        (
            "the reserved org default",
            hs256(&with(json!({ "org": "default" })), JWT_SECRET),
        ),
        (
            "wrong key",
            hs256(&claims("org_a"), "another-secret-of-at-least-32-bytes!!"),
        ),
        ("alg none", unsigned(&claims("org_a"))),
        (
            "another algorithm",
            ed25519(&claims("org_a"), "ed25519.pem", None),
        ),
        ("malformed", "not.a.jwt".to_string()),
        (
            "a role that is neither member nor operator",
            hs256(&with(json!({ "role": "admin" })), JWT_SECRET),
        ),
    ];
    for (case, token) in &cases {
        let (status, body) = status_with(&client, "/v1/tasks", &[("x-keel-identity", token)]).await;
        assert_unauthorized(status, &body, case);
    }
    // Identity headers from a client count for nothing when only JWTs are configured.
    let spoofed = [
        ("x-keel-actor-id", "actor_1"),
        ("x-keel-org-id", "org_a"),
        ("x-keel-runtime-id", RUNTIME_ID),
        ("x-keel-remote-secret", JWT_SECRET),
    ];
    let (status, body) = status_with(&client, "/v1/tasks", &spoofed).await;
    assert_unauthorized(status, &body, "identity headers without a JWT");
    let (status, body) = client.get("/v1/tasks").await;
    assert_unauthorized(status, &body, "nothing");
    let (status, body) = status_with(
        &client,
        "/v1/tasks",
        &[("authorization", &format!("Bearer {TOKEN}"))],
    )
    .await;
    assert_unauthorized(status, &body, "a runtime token is no identity");

    // Local-only routes are refused in remote mode, identity or not.
    let shutdown = client
        .http
        .post(format!("{}/v1/system/shutdown", client.base))
        .header("x-keel-identity", &valid);
    let (status, body) = client.send(shutdown).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");

    // A captured token stops working once it expires.
    let short = hs256(&with(json!({ "exp": now() + 2 })), JWT_SECRET);
    let (status, _) = status_with(&client, "/v1/tasks", &[("x-keel-identity", &short)]).await;
    assert_eq!(status, StatusCode::OK);
    wait_for(Duration::from_secs(15), "the token to expire", || async {
        let (status, _) = status_with(&client, "/v1/tasks", &[("x-keel-identity", &short)]).await;
        (status == StatusCode::UNAUTHORIZED).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_public_key_verifies_and_its_algorithm_is_the_only_one() {
    let key = fixture_str("ed25519.pub.pem");
    let env = remote_env(&[("KEEL_REMOTE_JWT_PUBLIC_KEY", &key)]);
    let (_process, client, _logs) = spawn("public-key", &env).await;
    let valid = ed25519(&claims("org_a"), "ed25519.pem", None);
    let (status, body) = status_with(&client, "/v1/tasks", &[("x-keel-identity", &valid)]).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let public_pem = std::fs::read_to_string(fixture("ed25519.pub.pem")).unwrap();
    let cases = [
        (
            "wrong key",
            ed25519(&claims("org_a"), "ed25519-other.pem", None),
        ),
        // Algorithm confusion: HS256 "signed" with the public key as the secret.
        (
            "hs256 with the public key",
            hs256(&claims("org_a"), &public_pem),
        ),
        ("rs256", rs256(&claims("org_a"), None)),
        ("alg none", unsigned(&claims("org_a"))),
    ];
    for (case, token) in &cases {
        let (status, body) = status_with(&client, "/v1/tasks", &[("x-keel-identity", token)]).await;
        assert_unauthorized(status, &body, case);
    }
}

#[tokio::test]
async fn a_jwks_chooses_the_key_by_kid() {
    let jwks = fixture_str("jwks.json");
    let env = remote_env(&[("KEEL_REMOTE_JWKS_FILE", &jwks)]);
    let (_process, client, _logs) = spawn("jwks", &env).await;
    for token in [
        ed25519(&claims("org_a"), "ed25519.pem", Some("ed-2025")),
        rs256(&claims("org_a"), Some("rsa-2025")),
    ] {
        let (status, body) =
            status_with(&client, "/v1/tasks", &[("x-keel-identity", &token)]).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    let cases = [
        (
            "unknown kid",
            ed25519(&claims("org_a"), "ed25519.pem", Some("retired")),
        ),
        ("no kid", ed25519(&claims("org_a"), "ed25519.pem", None)),
        (
            "the other key's kid",
            ed25519(&claims("org_a"), "ed25519.pem", Some("rsa-2025")),
        ),
        (
            "right kid, wrong key",
            ed25519(&claims("org_a"), "ed25519-other.pem", Some("ed-2025")),
        ),
    ];
    for (case, token) in &cases {
        let (status, body) = status_with(&client, "/v1/tasks", &[("x-keel-identity", token)]).await;
        assert_unauthorized(status, &body, case);
    }
}

fn identity_headers<'a>(
    secret: &'a str,
    actor: &'a str,
    runtime: &'a str,
) -> Vec<(&'a str, &'a str)> {
    vec![
        ("x-keel-remote-secret", secret),
        ("x-keel-actor-id", actor),
        ("x-keel-org-id", "org_h"),
        ("x-keel-runtime-id", runtime),
    ]
}

#[tokio::test]
async fn the_header_form_needs_the_shared_secret_and_this_runtime() {
    let env = remote_env(&[
        ("KEEL_REMOTE_SHARED_SECRET", SHARED_SECRET),
        ("KEEL_RATE_LIMIT", "3/m,burst=3"),
    ]);
    let (_process, client, _logs) = spawn("headers", &env).await;
    let mut headers = identity_headers(SHARED_SECRET, "actor_h", RUNTIME_ID);
    headers.push(("x-keel-project-id", "proj_h"));
    let (status, body) = status_with(&client, "/v1/whoami", &headers).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(support::record::<Session>(&body).workspace, "org_h");
    // Exactly these fields (read raw: the record would ignore an extra one).
    assert_eq!(
        body["data"]["remote_identity"],
        json!({ "actor_id": "actor_h", "org_id": "org_h", "runtime_id": RUNTIME_ID,
                "project_id": "proj_h", "name": null, "form": "headers" })
    );
    let mut no_actor = identity_headers(SHARED_SECRET, "actor_h", RUNTIME_ID);
    no_actor.remove(1);
    let mut default_org = identity_headers(SHARED_SECRET, "actor_h", RUNTIME_ID);
    default_org[2].1 = "default";
    let cases = [
        (
            "wrong secret",
            identity_headers("not-the-shared-secret-at-all", "actor_h", RUNTIME_ID),
        ),
        (
            "another runtime",
            identity_headers(SHARED_SECRET, "actor_h", "rt_other"),
        ),
        (
            "an actor that is no id",
            identity_headers(SHARED_SECRET, "actor h", RUNTIME_ID),
        ),
        ("no actor", no_actor),
        ("the reserved org default", default_org),
    ];
    for (case, headers) in &cases {
        let (status, body) = status_with(&client, "/v1/whoami", headers).await;
        assert_unauthorized(status, &body, case);
    }

    // The rate limit is per identity: actor_h has spent 1 of 3 (refusals spend nothing).
    for _ in 0..2 {
        let (status, body) = status_with(&client, "/v1/tasks", &headers).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    let mut request = client.http.get(format!("{}/v1/tasks", client.base));
    for (name, value) in &headers {
        request = request.header(*name, *value);
    }
    let response = request.send().await.unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry_after: u64 = response.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=20).contains(&retry_after), "{retry_after}");
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["type"], "rate_limit_exceeded", "{body}");
    let other = identity_headers(SHARED_SECRET, "actor_other", RUNTIME_ID);
    let (status, body) = status_with(&client, "/v1/tasks", &other).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "another actor has its own bucket: {body}"
    );
}

#[tokio::test]
async fn the_rate_limit_applies_in_local_mode_too() {
    let (_process, client, _logs) = spawn("rate-local", &[("KEEL_RATE_LIMIT", "2/h")]).await;
    for _ in 0..2 {
        let (status, _) = client.get("/v1/tasks").await;
        assert_eq!(status, StatusCode::OK);
    }
    let response = client
        .http
        .get(format!("{}/v1/tasks", client.base))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry_after: u64 = response.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1_000..=1_800).contains(&retry_after), "{retry_after}");
    // Probes are never limited.
    let (status, _) = client.get("/healthz").await;
    assert_eq!(status, StatusCode::OK);
}

/// Sends `count` requests for `/v1/whoami` at once as the identity of `headers`; returns
/// how many got through and how long the flood took. Every refusal is the rate limit's.
async fn flood(client: &Client, headers: &[(&str, &str)], count: usize) -> (usize, Duration) {
    let started = std::time::Instant::now();
    let requests = (0..count).map(|_| status_with(client, "/v1/whoami", headers));
    let answers = futures_util::future::join_all(requests).await;
    let elapsed = started.elapsed();
    for (status, body) in &answers {
        match *status {
            StatusCode::OK => {}
            StatusCode::TOO_MANY_REQUESTS => {
                assert_eq!(body["error"]["type"], "rate_limit_exceeded", "{body}");
                assert!(body["error"]["request_id"].is_string(), "{body}");
            }
            other => panic!("{other}: {body}"),
        }
    }
    let passed = answers.iter().filter(|(s, _)| *s == StatusCode::OK);
    (passed.count(), elapsed)
}

/// Remote mode limits each identity without being told to (50/s, 100 at once), `off`
/// lifts it, and local mode stays unlimited unless told otherwise.
#[tokio::test]
async fn remote_mode_limits_each_identity_by_default() {
    const FLOOD: usize = 300;
    let shared = [("KEEL_REMOTE_SHARED_SECRET", SHARED_SECRET)];
    let (_process, client, _logs) = spawn("rate-remote", &remote_env(&shared)).await;
    let flooder = identity_headers(SHARED_SECRET, "actor_flood", RUNTIME_ID);
    let (passed, elapsed) = flood(&client, &flooder, FLOOD).await;
    // The burst, and what refilled while the flood lasted, at most.
    let refilled = (50.0 * elapsed.as_secs_f64()).ceil() as usize;
    assert!(
        (100..=100 + refilled + 1).contains(&passed),
        "{passed} of {FLOOD} passed in {elapsed:?}"
    );
    let other = identity_headers(SHARED_SECRET, "actor_other", RUNTIME_ID);
    let (status, body) = status_with(&client, "/v1/whoami", &other).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "another identity is not slowed: {body}"
    );

    let off = remote_env(&[shared[0], ("KEEL_RATE_LIMIT", "off")]);
    let (_process, client, _logs) = spawn("rate-remote-off", &off).await;
    let (passed, _) = flood(&client, &flooder, FLOOD).await;
    assert_eq!(passed, FLOOD, "KEEL_RATE_LIMIT=off lifts the limit");

    let (_process, client, _logs) = spawn("rate-local-default", &[]).await;
    let (passed, _) = flood(&client, &[], FLOOD).await;
    assert_eq!(passed, FLOOD, "local mode has no limit unless one is set");
}

/// Every documented operation and every table row: the table names exactly the router's
/// routes. The router is walked over HTTP: a route missing from the table answers "not in
/// the route policy", a table row with no route answers the unknown-route 404.
#[tokio::test]
async fn the_route_policy_classifies_every_route() {
    let doc = serde_json::to_value(keel::api::openapi()).unwrap();
    let mut documented = keel::api::documented_routes();
    for (method, path) in documented.iter().filter(|(_, p)| p.starts_with("/v1/")) {
        let operation = &doc["paths"][path][method.to_lowercase()];
        let security = operation["security"].as_array().unwrap();
        assert!(security.len() >= 3, "{method} {path}: {security:?}");
    }
    for scheme in ["bearer", "runtime_token", "identity"] {
        assert!(
            doc["components"]["securitySchemes"][scheme].is_object(),
            "{scheme}"
        );
    }
    let mut table: Vec<(String, String)> = keel::api::ROUTE_POLICY
        .iter()
        .map(|(m, p, _)| (m.to_string(), p.to_string()))
        .collect();
    documented.sort();
    table.sort();
    assert_eq!(table, documented, "the route table and the document differ");

    let (_process, client, _logs) = spawn("policy", &[("KEEL_RUNTIME_TOKEN", TOKEN)]).await;
    let client = client_with_headers(&client.base, &[("x-keel-runtime-token", TOKEN)]);
    for (method, path, class) in keel::api::ROUTE_POLICY {
        if *class == keel::api::RouteClass::LocalOnly {
            continue; // the shutdown is walked by its own test
        }
        let concrete = path.replace('{', "x_").replace('}', "");
        let request = client.http.request(
            Method::from_bytes(method.as_bytes()).unwrap(),
            format!("{}{concrete}", client.base),
        );
        let response = request.send().await.unwrap();
        let status = response.status();
        let body = support::json_or_null(response).await;
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(
            !message.starts_with("route "),
            "{method} {path} is classified but not routed"
        );
        assert!(
            !message.contains("route policy"),
            "{method} {path}: {message}"
        );
        assert_ne!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
        assert_ne!(status, StatusCode::UNAUTHORIZED, "{method} {path}");
    }
}

#[tokio::test]
async fn boolean_settings_accept_one_and_yes() {
    let db = fresh_database().await;
    let logs = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let env = remote_env(&[("KEEL_REMOTE_SHARED_SECRET", SHARED_SECRET)]);
    let env: Vec<_> = env
        .into_iter()
        .map(|(k, v)| {
            if k == "KEEL_REMOTE_MODE" {
                (k, "yes")
            } else {
                (k, v)
            }
        })
        .collect();
    let api = spawn_api_with_env(&db, logs.path(), "api", &env).await;
    let _worker = spawn_worker_with_env(
        &db,
        logs.path(),
        "worker",
        2_000,
        data.path(),
        &[
            ("KEEL_MEDIA_ALLOW_PRIVATE_ADDRESSES", "1"),
            ("KEEL_S3_ALLOW_HTTP", "yes"),
        ],
    );
    let client = client_with_headers(
        &api.client.as_ref().unwrap().base,
        &identity_headers(SHARED_SECRET, "actor_b", RUNTIME_ID),
    );
    let (status, session) = client.api.whoami().send_with_status().await.unwrap();
    assert_eq!(status, StatusCode::OK, "{session:?}");
    let session = session.data;
    assert_eq!(
        session.runtime_host.runtime_mode,
        RuntimeMode::Remote,
        "KEEL_REMOTE_MODE=yes"
    );
    wait_for(
        Duration::from_secs(20),
        "the worker to register",
        || async {
            let stats = client.api.system_stats().await;
            stats.is_ok_and(|s| s.data.workers.live >= 1).then_some(())
        },
    )
    .await;
}
