//! The console's server side over real HTTP against real `keel api` processes: the session
//! endpoints in each auth mode, the cookie as a credential of `/v1`, the CSRF header on the
//! cookie's changes, and the Host check of the open session routes. The pages themselves
//! are tested in a browser by console_test.py beside this file.

use crate::support;

use crate::support::{Client, KeelProcess, fresh_database, spawn_api_with_env};
use reqwest::StatusCode;
use reqwest::header::{CONTENT_SECURITY_POLICY, COOKIE, LOCATION, SET_COOKIE};
use serde_json::{Value, json};

const TOKEN: &str = "console-runtime-token-0123456789";
const RUNTIME_ID: &str = "rt_console";
const SHARED_SECRET: &str = "console-shared-secret-0123456789";

async fn spawn(name: &str, env: &[(&str, &str)]) -> (KeelProcess, Client, tempfile::TempDir) {
    let db = fresh_database().await;
    let logs = tempfile::tempdir().unwrap();
    let process = spawn_api_with_env(&db, logs.path(), name, env).await;
    let client = process.client.clone().unwrap();
    (process, client, logs)
}

/// A request to `path` with these headers, and the response's status, headers and body.
async fn call(
    client: &Client,
    method: reqwest::Method,
    path: &str,
    headers: &[(&str, &str)],
    body: Option<Value>,
) -> (StatusCode, reqwest::header::HeaderMap, Value) {
    let no_redirects = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let mut request = no_redirects.request(method, format!("{}{path}", client.base));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    let (status, headers) = (response.status(), response.headers().clone());
    (status, headers, support::json_or_null(response).await)
}

/// A session cookie's value as the server signs one under [`TOKEN`] (the documented
/// `<expiry>.<hex HMAC-SHA256 of "keel-console-session:<expiry>">`), ending at `expires`.
fn session_cookie(expires: i64) -> String {
    use hmac::{Hmac, KeyInit, Mac};
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(TOKEN.as_bytes()).unwrap();
    mac.update(format!("keel-console-session:{expires}").as_bytes());
    format!("{expires}.{}", hex::encode(mac.finalize().into_bytes()))
}

fn set_cookie(headers: &reqwest::header::HeaderMap) -> String {
    headers[SET_COOKIE].to_str().unwrap().to_string()
}

#[tokio::test]
async fn the_session_cookie_stands_for_the_token_and_its_changes_need_the_csrf_header() {
    let env = [
        ("KEEL_RUNTIME_TOKEN", TOKEN),
        ("KEEL_CONSOLE_SESSION_TTL_SECS", "600"),
    ];
    let (_process, client, _logs) = spawn("console-token", &env).await;
    use reqwest::Method as M;

    let (status, headers, body) = call(&client, M::GET, "/console/session", &[], None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(headers["cache-control"], "no-store");
    assert!(
        headers[CONTENT_SECURITY_POLICY]
            .to_str()
            .unwrap()
            .contains("frame-ancestors 'none'")
    );
    let session = &body["data"];
    assert_eq!(
        (session["mode"].as_str(), session["sign_in"].as_str()),
        (Some("local"), Some("token"))
    );
    assert_eq!(session["signed_in"], false);
    assert!(session["csrf_token"].is_null(), "{body}");

    let wrong = json!({ "token": "not-the-runtime-token" });
    let (status, headers, body) =
        call(&client, M::POST, "/console/session", &[], Some(wrong)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert_eq!(body["error"]["type"], "unauthorized");
    assert!(!headers.contains_key(SET_COOKIE));

    let right = json!({ "token": TOKEN });
    let (status, headers, body) = call(
        &client,
        M::POST,
        "/console/session",
        &[],
        Some(right.clone()),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let cookie = set_cookie(&headers);
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/", "Max-Age=600"] {
        assert!(cookie.contains(attribute), "{cookie}");
    }
    assert!(
        !cookie.contains("Secure") && !cookie.contains(TOKEN),
        "{cookie}"
    );
    assert_eq!(body["data"]["signed_in"], true);
    let csrf = body["data"]["csrf_token"].as_str().unwrap().to_string();
    assert!(!csrf.contains(TOKEN));
    let pair = cookie.split(';').next().unwrap().to_string();

    // Behind a proxy that speaks https, the cookie never travels in the clear.
    let https = [("x-forwarded-proto", "https")];
    let (_, headers, _) = call(&client, M::POST, "/console/session", &https, Some(right)).await;
    assert!(set_cookie(&headers).contains("; Secure"));

    // The cookie reads; a change it proves needs the session's CSRF token.
    let with_cookie = [(COOKIE.as_str(), pair.as_str())];
    let (status, _, _) = call(&client, M::GET, "/v1/tasks", &with_cookie, None).await;
    assert_eq!(status, StatusCode::OK);
    let draft = json!({ "execution_kind": "shell", "shell_command": "true" });
    for csrf_header in [None, Some("wrong")] {
        let mut headers = with_cookie.to_vec();
        headers.extend(csrf_header.map(|v| ("x-keel-csrf", v)));
        let (status, _, body) =
            call(&client, M::POST, "/v1/tasks", &headers, Some(draft.clone())).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{csrf_header:?}: {body}");
        assert_eq!(body["error"]["type"], "forbidden");
    }
    let signed = [
        (COOKIE.as_str(), pair.as_str()),
        ("x-keel-csrf", csrf.as_str()),
    ];
    let (status, _, body) = call(&client, M::POST, "/v1/tasks", &signed, Some(draft.clone())).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    // The session endpoint now says the same.
    let (_, _, body) = call(&client, M::GET, "/console/session", &with_cookie, None).await;
    assert_eq!(body["data"]["csrf_token"], csrf.as_str());

    // A bearer request is unaffected by CSRF; a wrong bearer is refused whatever cookie
    // rides along; a cookie of another token is no session.
    let bearer = format!("Bearer {TOKEN}");
    let (status, _, _) = call(
        &client,
        M::POST,
        "/v1/tasks",
        &[("authorization", bearer.as_str())],
        Some(draft),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED);
    let wrong_bearer = [
        (COOKIE.as_str(), pair.as_str()),
        ("authorization", "Bearer nope"),
    ];
    let (status, _, _) = call(&client, M::GET, "/v1/tasks", &wrong_bearer, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let stale = [(COOKIE.as_str(), "keel_session=0123abcd")];
    let (status, _, _) = call(&client, M::GET, "/v1/tasks", &stale, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    // The cookie carries its signed expiry, KEEL_CONSOLE_SESSION_TTL_SECS from sign-in.
    let value = pair.strip_prefix("keel_session=").unwrap();
    let (expires, signature) = value.split_once('.').unwrap();
    let left = expires.parse::<i64>().unwrap() - chrono::Utc::now().timestamp();
    assert!((590..=600).contains(&left), "{left} s left");
    // Signed here as the server signs (so the refusals below are of the expiry alone), a
    // live cookie is a session; one whose expiry has passed is not, and neither is the
    // live signature under a later expiry.
    let signed_here = format!(
        "keel_session={}",
        session_cookie(chrono::Utc::now().timestamp() + 300)
    );
    let headers = [(COOKIE.as_str(), signed_here.as_str())];
    let (status, _, _) = call(&client, M::GET, "/v1/tasks", &headers, None).await;
    assert_eq!(status, StatusCode::OK, "{signed_here}");
    let ended = chrono::Utc::now().timestamp() - 1;
    let extended = format!("keel_session={}.{signature}", ended + 86_400);
    for cookie in [format!("keel_session={}", session_cookie(ended)), extended] {
        let headers = [(COOKIE.as_str(), cookie.as_str())];
        let (status, _, _) = call(&client, M::GET, "/v1/tasks", &headers, None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{cookie}");
        let (_, _, body) = call(&client, M::GET, "/console/session", &headers, None).await;
        assert_eq!(body["data"]["signed_in"], false, "{cookie}");
    }

    // A browser without script signs in with the form and is sent back to the console.
    let form = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .post(format!("{}/console/session", client.base))
        .form(&[("token", TOKEN)])
        .send()
        .await
        .unwrap();
    assert_eq!(form.status(), StatusCode::SEE_OTHER);
    assert_eq!(form.headers()[LOCATION], "/console");
    assert!(set_cookie(form.headers()).starts_with("keel_session="));
    // The token or a sign-in link's code, one of them.
    let both = json!({ "token": TOKEN, "code": "0123456789abcdef" });
    let (status, headers, body) = call(&client, M::POST, "/console/session", &[], Some(both)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert!(!headers.contains_key(SET_COOKIE));

    // Signing out clears the cookie; the open session routes still check the Host.
    let (status, headers, body) =
        call(&client, M::DELETE, "/console/session", &with_cookie, None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(set_cookie(&headers).contains("Max-Age=0"));
    assert_eq!(body["data"]["signed_in"], false);
    let rebound = [("host", "evil.example")];
    let (status, _, _) = call(
        &client,
        M::POST,
        "/console/session",
        &rebound,
        Some(json!({ "token": TOKEN })),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn remote_mode_shows_the_proxys_identity_and_has_no_token_sign_in() {
    let env = [
        ("KEEL_REMOTE_MODE", "1"),
        ("KEEL_RUNTIME_ID", RUNTIME_ID),
        ("KEEL_REMOTE_SHARED_SECRET", SHARED_SECRET),
    ];
    let (_process, client, _logs) = spawn("console-remote", &env).await;
    use reqwest::Method as M;
    let identity = [
        ("x-keel-remote-secret", SHARED_SECRET),
        ("x-keel-actor-id", "ada"),
        ("x-keel-org-id", "org_console"),
        ("x-keel-runtime-id", RUNTIME_ID),
    ];
    let (status, _, body) = call(&client, M::GET, "/console/session", &identity, None).await;
    assert_eq!(status, StatusCode::OK);
    let session = &body["data"];
    assert_eq!(
        (session["mode"].as_str(), session["sign_in"].as_str()),
        (Some("remote"), Some("proxy"))
    );
    assert_eq!(
        (session["signed_in"].as_bool(), session["actor_id"].as_str()),
        (Some(true), Some("ada"))
    );
    assert!(session["csrf_token"].is_null(), "{body}");
    let (_, _, body) = call(&client, M::GET, "/console/session", &[], None).await;
    assert_eq!(body["data"]["signed_in"], false);

    let (status, headers, body) = call(
        &client,
        M::POST,
        "/console/session",
        &[],
        Some(json!({ "token": TOKEN })),
    )
    .await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert!(!headers.contains_key(SET_COOKIE));
    // No sign-in links either: the proxy signs people in.
    let codes = "/console/sign-in-codes";
    let (status, _, body) = call(&client, M::POST, codes, &identity, None).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let cookie = [(COOKIE.as_str(), "keel_session=anything")];
    let (status, _, _) = call(&client, M::GET, "/v1/tasks", &cookie, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // The page itself is served to anyone; what it shows comes from the API.
    let (status, headers, _) = call(&client, M::GET, "/console", &[], None).await;
    assert_eq!(status, StatusCode::OK);
    assert!(
        headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/html")
    );
}

#[tokio::test]
async fn a_runtime_without_a_token_has_nothing_to_sign_in_to() {
    let (_process, client, _logs) = spawn("console-open", &[]).await;
    use reqwest::Method as M;
    let (_, _, body) = call(&client, M::GET, "/console/session", &[], None).await;
    assert_eq!(body["data"]["sign_in"], "none");
    assert_eq!(body["data"]["signed_in"], true);
    let (status, _, body) = call(
        &client,
        M::POST,
        "/console/session",
        &[],
        Some(json!({ "token": TOKEN })),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let codes = "/console/sign-in-codes";
    let (status, _, body) = call(&client, M::POST, codes, &[], None).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let (status, headers, _) = call(&client, M::GET, "/", &[], None).await;
    assert_eq!(status, StatusCode::SEE_OTHER);
    assert_eq!(headers[LOCATION], "/console");
}
