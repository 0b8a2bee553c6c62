//! Local mode's owner (issue 47): `keel serve` with no runtime token makes one at its first
//! start, in `<data-dir>/runtime-token` (mode 0600), and serves with it; the CLI, `keel rpc`
//! and `keel console` read it from there when they talk to a loopback API, so the README's
//! walkthrough needs no flag, while a run or another user of the host, who cannot read the
//! file, is refused. Real `keel serve` and `keel` processes throughout.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use reqwest::header::{COOKIE, SET_COOKIE};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::support::{self, Client, KeelProcess};

const TOKEN_FILE: &str = "runtime-token";
const CLI_TIMEOUT: Duration = Duration::from_secs(60);
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// The uid of another user of the host.
const NOBODY: u32 = 65534;

/// A `keel serve` on a free loopback port with `dir` as its working directory (so its data
/// directory is the default, `dir/.keel`, unless `env` says otherwise) and no runtime
/// token of its own unless `env` gives one.
fn spawn_serve(db: &str, dir: &Path, name: &str, env: &[(&str, &str)]) -> KeelProcess {
    let port = support::free_port();
    let log = dir.join(format!("{name}.log"));
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_keel"));
    command
        .arg("serve")
        .current_dir(dir)
        .env("KEEL_DATABASE_URL", db)
        .env("KEEL_LISTEN", format!("127.0.0.1:{port}"))
        .env("RUST_LOG", "info,sqlx=warn")
        .env_remove("KEEL_RUNTIME_TOKEN")
        .env_remove("KEEL_DATA_DIR")
        .env_remove("KEEL_APPROVAL_POLICIES")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    KeelProcess {
        child: command.spawn().unwrap(),
        client: Some(Client::new(format!("http://127.0.0.1:{port}"))),
        log,
        _delegated: None,
    }
}

/// Waits until the server answers its (open) liveness probe; fails with its log when it
/// exits first.
async fn answering(process: &mut KeelProcess) -> Client {
    let client = process.client.clone().unwrap();
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if let Some(status) = process.child.try_wait().unwrap() {
            panic!("keel serve exited ({status}): {}", process.log_text());
        }
        if client.healthy().await {
            return client;
        }
        assert!(Instant::now() < deadline, "{}", process.log_text());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `keel <args>` in `dir` against `url`, with no token, identity or data directory in its
/// environment: what a person types in the directory they started `keel serve` in.
fn keel_command(url: &str, dir: &Path, args: &[&str]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_keel"));
    command
        .args(args)
        .current_dir(dir)
        .env("KEEL_URL", url)
        .env_remove("KEEL_RUNTIME_TOKEN")
        .env_remove("KEEL_IDENTITY")
        .env_remove("KEEL_DATA_DIR")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    command
}

async fn finished(mut command: tokio::process::Command) -> Output {
    tokio::time::timeout(CLI_TIMEOUT, command.output())
        .await
        .expect("the CLI exits in time")
        .expect("the CLI ran")
}

async fn keel(url: &str, dir: &Path, args: &[&str]) -> Output {
    finished(keel_command(url, dir, args)).await
}

fn describe(output: &Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// The trimmed stdout of a command that must exit with `code`.
fn printed(output: &Output, code: i32) -> String {
    assert_eq!(output.status.code(), Some(code), "{}", describe(output));
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

fn token_in(data: &Path) -> String {
    std::fs::read_to_string(data.join(TOKEN_FILE))
        .expect("the token file")
        .trim()
        .to_string()
}

fn bearer(client: &Client, token: &str) -> Client {
    support::client_with_headers(
        &client.base,
        &[("authorization", &format!("Bearer {token}"))],
    )
}

/// Refused with the error envelope: 401 `unauthorized`.
fn assert_unauthorized(status: StatusCode, body: &Value) {
    assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    assert_eq!(body["error"]["type"], "unauthorized", "{body}");
}

/// A port already taken fails `keel serve` at once, before its database starts, saying how
/// to choose another.
#[tokio::test]
async fn serve_on_a_taken_port_fails_before_starting_its_database() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let listen = taken.local_addr().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_keel"))
        .arg("serve")
        .current_dir(dir.path())
        .env("KEEL_LISTEN", &listen)
        .env_remove("KEEL_DATABASE_URL")
        .env_remove("KEEL_DATA_DIR")
        .env_remove("KEEL_RUNTIME_TOKEN")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("listening on {listen}")),
        "{stderr}"
    );
    assert!(stderr.contains("--listen"), "{stderr}");
    assert!(!stderr.contains("embedded PostgreSQL"), "{stderr}");
    assert!(!dir.path().join(".keel/postgres").exists());
}

#[tokio::test]
async fn the_walkthrough_needs_no_flag_and_a_request_without_the_token_is_refused() {
    let db = support::fresh_database().await;
    let dir = tempfile::tempdir().unwrap();
    support::let_the_sandbox_through(dir.path());
    let mut serve = spawn_serve(&db, dir.path(), "serve", &[]);
    let client = answering(&mut serve).await;
    let url = client.base.clone();
    // It says where it answers, and a log that is no terminal keeps no colour codes.
    let log = serve.log_text();
    let ready = format!("keel: ready: API {url}, console {url}/console");
    assert!(log.lines().any(|line| line == ready), "{log}");
    assert!(!log.contains('\u{1b}'), "{log}");

    let (status, body) = client.get("/v1/whoami").await;
    assert_unauthorized(status, &body);
    let (status, body) = client
        .post(
            "/v1/tasks",
            json!({"execution_kind": "shell",
        "shell_command": "true"}),
        )
        .await;
    assert_unauthorized(status, &body);

    // README.md's walkthrough, word for word but for the command it runs.
    let dir = dir.path();
    let task = printed(
        &keel(
            &url,
            dir,
            &["tasks", "create", "--quiet", "--shell", "echo step 1"],
        )
        .await,
        0,
    );
    let run = printed(
        &keel(&url, dir, &["tasks", "start", &task, "--quiet"]).await,
        0,
    );
    printed(
        &keel(&url, dir, &["runs", "watch", &run, "--no-wait"]).await,
        3,
    );
    let approval = printed(
        &keel(
            &url,
            dir,
            &[
                "approvals",
                "list",
                "--task",
                &task,
                "--status",
                "pending",
                "--quiet",
            ],
        )
        .await,
        0,
    );
    printed(
        &keel(&url, dir, &["approvals", "approve", &approval]).await,
        0,
    );
    let watched = printed(&keel(&url, dir, &["runs", "watch", &run]).await, 0);
    assert!(watched.contains("step 1"), "{watched}");
    printed(&keel(&url, dir, &["status"]).await, 0);

    // `keel rpc` finds it the same way.
    let mut rpc = keel_command(&url, dir, &["rpc", "--stdio"]);
    let mut rpc = rpc
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let request = json!({"v": 1, "id": 1, "method": "system.whoami", "params": {}});
    let mut stdin = rpc.stdin.take().unwrap();
    stdin
        .write_all(format!("{request}\n").as_bytes())
        .await
        .unwrap();
    let mut lines = BufReader::new(rpc.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(CLI_TIMEOUT, lines.next_line())
        .await
        .expect("an answer in time")
        .unwrap()
        .expect("an answer");
    let answer: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(answer["result"]["data"]["actor_id"], "local", "{answer}");
}

#[tokio::test]
async fn the_token_file_is_private_kept_across_restarts_and_refused_when_others_may_read_it() {
    let db = support::fresh_database().await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join(".keel");
    let file = data.join(TOKEN_FILE);

    let mut serve = spawn_serve(&db, dir.path(), "first", &[]);
    let client = answering(&mut serve).await;
    let meta = std::fs::metadata(&file).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    assert_eq!(meta.uid(), nix::unistd::geteuid().as_raw());
    let token = token_in(&data);
    assert!(token.len() >= 32, "{token}");
    let (status, body) = bearer(&client, &token).get("/v1/whoami").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    serve.terminate(START_TIMEOUT);
    assert!(!serve.log_text().contains(&token), "{}", serve.log_text());

    // The next start serves with the same token.
    let mut serve = spawn_serve(&db, dir.path(), "second", &[]);
    let client = answering(&mut serve).await;
    assert_eq!(token_in(&data), token);
    let (status, body) = bearer(&client, &token).get("/v1/whoami").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    serve.terminate(START_TIMEOUT);

    // A token file others may read is no secret: the server refuses to start with it.
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o640)).unwrap();
    let mut serve = spawn_serve(&db, dir.path(), "readable", &[]);
    let status = serve.wait_exit(START_TIMEOUT);
    assert!(!status.success());
    let log = serve.log_text();
    assert!(
        log.contains(&file.display().to_string()) || log.contains(TOKEN_FILE),
        "{log}"
    );
    assert!(log.contains("0640") && !log.contains(&token), "{log}");

    // An explicit KEEL_RUNTIME_TOKEN wins, and leaves the file as it is.
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let explicit = "an-explicit-runtime-token-0123456789";
    let mut serve = spawn_serve(
        &db,
        dir.path(),
        "explicit",
        &[("KEEL_RUNTIME_TOKEN", explicit)],
    );
    let client = answering(&mut serve).await;
    let (status, body) = bearer(&client, explicit).get("/v1/whoami").await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (status, body) = bearer(&client, &token).get("/v1/whoami").await;
    assert_unauthorized(status, &body);
    assert_eq!(token_in(&data), token);
}

#[tokio::test]
async fn neither_a_run_nor_another_user_of_the_host_can_read_the_token_or_use_the_api() {
    let db = support::fresh_database().await;
    let dir = tempfile::tempdir().unwrap();
    support::let_the_sandbox_through(dir.path());
    let data = dir.path().join(".keel");
    let file = data.join(TOKEN_FILE);
    let mut serve = spawn_serve(
        &db,
        dir.path(),
        "serve",
        &[("KEEL_APPROVAL_POLICIES", "none")],
    );
    let client = answering(&mut serve).await;
    let url = client.base.clone();
    let owner = bearer(&client, &token_in(&data));

    // A run with the network on, as the hostile-tenant pass had it: its network is its
    // own, so it does not reach the port at all, and it has no token to show.
    let attack = format!(
        "cat {file} || echo token unreadable; \
         curl -s -o /dev/null -w 'api %{{http_code}}\\n' {url}/v1/approvals; true",
        file = file.display()
    );
    let draft = keel_client::TaskDraft {
        sandbox_network: Some(true),
        ..support::shell(&attack)
    };
    let (task, run) = owner.start_task(&draft).await;
    let record = owner.wait_terminal(&task, &run, START_TIMEOUT).await;
    let stdout = owner.stdout(&task, &run).await;
    assert_eq!(record.status, keel_client::RunStatus::Completed, "{stdout}");
    assert!(stdout.contains("token unreadable"), "{stdout}");
    assert!(
        stdout.contains("api 000"),
        "the run reached the API: {stdout}"
    );

    // Another user of the host, who can reach the directory but not read the file.
    let as_nobody = |mut command: tokio::process::Command| {
        command.uid(NOBODY).gid(NOBODY);
        command
    };
    let cat = tokio::process::Command::new("cat")
        .arg(&file)
        .uid(NOBODY)
        .gid(NOBODY)
        .output();
    let cat = cat.await.unwrap();
    assert!(!cat.status.success(), "{}", describe(&cat));
    let mut command = keel_command(&url, dir.path(), &["whoami"]);
    command.env("KEEL_DATA_DIR", &data);
    let output = finished(as_nobody(command)).await;
    assert_eq!(output.status.code(), Some(4), "{}", describe(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("ermission denied"), "{stderr}");
    let command = keel_command(&url, Path::new("/"), &["whoami"]);
    let output = finished(as_nobody(command)).await;
    assert_eq!(output.status.code(), Some(4), "{}", describe(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("(unauthorized, HTTP 401"), "{stderr}");
}

#[tokio::test]
async fn keel_console_prints_a_sign_in_link_good_for_one_sign_in() {
    let db = support::fresh_database().await;
    let dir = tempfile::tempdir().unwrap();
    let mut serve = spawn_serve(&db, dir.path(), "serve", &[]);
    let client = answering(&mut serve).await;
    let url = client.base.clone();

    let link = printed(&keel(&url, dir.path(), &["console"]).await, 0);
    let prefix = format!("{url}/console#sign-in=");
    let code = link
        .strip_prefix(&prefix)
        .unwrap_or_else(|| panic!("{link}"));
    assert!(code.len() >= 32, "{link}");
    let other = printed(&keel(&url, dir.path(), &["console"]).await, 0);
    assert_ne!(other, link);

    // The browser posts the code from the link's fragment (which never reaches a server).
    let sign_in = |code: &str| {
        client
            .http
            .post(format!("{url}/console/session"))
            .json(&json!({ "code": code }))
    };
    let response = sign_in(code).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let cookie = response.headers()[SET_COOKIE].to_str().unwrap().to_string();
    assert!(cookie.contains("HttpOnly; SameSite=Strict"), "{cookie}");
    let session: Value = response.json().await.unwrap();
    assert_eq!(session["data"]["signed_in"], true, "{session}");
    let pair = cookie.split(';').next().unwrap();
    let (status, body) = client
        .send(
            client
                .http
                .get(format!("{url}/v1/whoami"))
                .header(COOKIE, pair),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");

    // Once only, and only codes this server issued.
    let (status, body) = client.send(sign_in(code)).await;
    assert_unauthorized(status, &body);
    let (status, body) = client.send(sign_in(&"0".repeat(code.len()))).await;
    assert_unauthorized(status, &body);
    // Only the token's holder gets one.
    let (status, body) = client.post_empty("/console/sign-in-codes").await;
    assert_unauthorized(status, &body);

    let log = serve.log_text();
    let token = token_in(&dir.path().join(".keel"));
    assert!(!log.contains(&token) && !log.contains(code), "{log}");
}
