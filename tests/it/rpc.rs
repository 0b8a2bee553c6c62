//! `keel rpc`: the real binary, speaking NDJSON on stdio and on a Unix socket, bridged to
//! a real API and worker over HTTP.

use std::collections::VecDeque;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, Command};

use crate::support::{self, TestApp, wait_for};
use keel_client::{EventRecord, RunRecord, RunStatus, TaskRecord};

const LINE_WAIT: Duration = Duration::from_secs(30);

/// One end of an NDJSON session: requests out, every line in, each checked to be a
/// protocol line.
struct Peer<R, W> {
    input: W,
    lines: Lines<BufReader<R>>,
    /// Lines read while waiting for an answer: events and notices.
    pushed: VecDeque<Value>,
    next_id: u64,
}

impl<R: AsyncRead + Unpin, W: AsyncWrite + Unpin> Peer<R, W> {
    fn new(output: R, input: W) -> Self {
        Peer {
            input,
            lines: BufReader::new(output).lines(),
            pushed: VecDeque::new(),
            next_id: 1,
        }
    }

    async fn send_line(&mut self, line: &str) {
        self.input.write_all(line.as_bytes()).await.unwrap();
        self.input.write_all(b"\n").await.unwrap();
        self.input.flush().await.unwrap();
    }

    /// The next line; it must be one JSON object with `"v": 1`.
    async fn read(&mut self) -> Value {
        let line = tokio::time::timeout(LINE_WAIT, self.lines.next_line())
            .await
            .expect("a line in time")
            .expect("readable output")
            .expect("the session is still open");
        let value: Value =
            serde_json::from_str(&line).unwrap_or_else(|_| panic!("not JSON: {line}"));
        assert_eq!(value["v"], 1, "{line}");
        value
    }

    /// The answer to `id`; lines pushed meanwhile are kept for [`Peer::pushed`].
    async fn answer(&mut self, id: &Value) -> Value {
        loop {
            let line = self.read().await;
            if line.get("id") == Some(id) {
                return line;
            }
            assert!(
                line.get("event").is_some() || line.get("notice").is_some(),
                "{line}"
            );
            self.pushed.push_back(line);
        }
    }

    async fn call(&mut self, method: &str, params: Value) -> Value {
        let id = json!(self.next_id);
        self.next_id += 1;
        let request = json!({"v": 1, "id": id, "method": method, "params": params});
        self.send_line(&request.to_string()).await;
        self.answer(&id).await
    }

    /// The result of a call that must succeed.
    async fn ok(&mut self, method: &str, params: Value) -> Value {
        let answer = self.call(method, params).await;
        assert!(answer.get("error").is_none(), "{method}: {answer}");
        answer["result"].clone()
    }

    /// The next pushed line (event or notice).
    async fn pushed(&mut self) -> Value {
        match self.pushed.pop_front() {
            Some(line) => line,
            None => self.read().await,
        }
    }
}

fn rpc_command(base: &str) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_keel"));
    command
        .args(["--url", base, "rpc"])
        .env_remove("KEEL_RUNTIME_TOKEN")
        .kill_on_drop(true);
    command
}

fn stdio_peer(
    base: &str,
) -> (
    Child,
    Peer<tokio::process::ChildStdout, tokio::process::ChildStdin>,
) {
    let mut child = rpc_command(base)
        .arg("--stdio")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("keel rpc starts");
    let peer = Peer::new(child.stdout.take().unwrap(), child.stdin.take().unwrap());
    (child, peer)
}

#[tokio::test]
async fn a_run_is_driven_and_its_persisted_events_are_pushed() {
    let app = TestApp::start().await;
    let (_child, mut peer) = stdio_peer(&app.client.base);

    let methods = peer.ok("harness.methods", json!({})).await;
    let create = methods["methods"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "tasks.create")
        .expect("tasks.create is listed")
        .clone();
    assert!(
        create["params"]["properties"]["body"].is_object(),
        "{create}"
    );

    let body = json!({"execution_kind": "shell", "shell_command": "echo one; echo two"});
    // The bridge answers with the API's JSON: the contract's records.
    let task = peer.ok("tasks.create", json!({"body": body})).await;
    let task_id = support::record::<TaskRecord>(&task).id;
    let run = peer
        .ok("tasks.start", json!({"task_id": task_id, "body": {}}))
        .await;
    let run_id = support::record::<RunRecord>(&run).id;

    let subscribed = peer
        .ok(
            "events.subscribe",
            json!({"task_id": task_id, "run_id": run_id}),
        )
        .await;
    let subscription = subscribed["subscription"].as_str().unwrap().to_string();

    let mut events = Vec::new();
    loop {
        let line = peer.pushed().await;
        if let Some(notice) = line.get("notice") {
            assert_eq!(notice["kind"], "subscription.ended", "{line}");
            assert_eq!(notice["subscription"], subscription.as_str());
            assert!(notice.get("error").is_none(), "{line}");
            break;
        }
        assert_eq!(line["subscription"], subscription.as_str(), "{line}");
        events.push(line["event"].clone());
    }
    let types: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
    assert_eq!(types.last(), Some(&"run.finished"), "{types:?}");
    let sequences: Vec<i64> = events
        .iter()
        .filter_map(|e| e["sequence"].as_i64())
        .collect();
    assert_eq!(
        sequences,
        (1..=events.len() as i64).collect::<Vec<_>>(),
        "gap-free, once each"
    );

    // What was pushed is what the API persisted.
    let persisted = peer
        .ok("runs.events", json!({"task_id": task_id, "run_id": run_id}))
        .await;
    let persisted = support::page::<EventRecord>(&persisted).data;
    assert_eq!(persisted.len(), events.len());
    for (pushed, stored) in events.iter().zip(persisted) {
        assert_eq!(pushed["event_id"], stored.event_id.as_str());
        assert_eq!(pushed["type"], stored.event_type.as_str());
    }
    let run = peer
        .ok("runs.get", json!({"task_id": task_id, "run_id": run_id}))
        .await;
    assert_eq!(
        support::record::<RunRecord>(&run).status,
        RunStatus::Completed,
        "{run}"
    );

    // The run's output reads over the session as over HTTP: text as text, from an offset.
    let ids = json!({"task_id": task_id, "run_id": run_id});
    let artifacts = peer.ok("runs.artifacts", ids.clone()).await;
    let stdout = artifacts["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["name"] == "stdout")
        .unwrap_or_else(|| panic!("{artifacts}"));
    let mut params = ids.clone();
    params["artifact_id"] = stdout["id"].clone();
    let whole = peer.ok("runs.artifactContent", params.clone()).await;
    assert_eq!(
        whole,
        json!({"encoding": "utf8", "text": "one\ntwo\n", "offset": 0, "length": 8,
               "next_offset": 8, "complete": true})
    );
    params["offset"] = json!(4);
    let rest = peer.ok("runs.artifactContent", params.clone()).await;
    assert_eq!(
        (&rest["text"], &rest["offset"], &rest["next_offset"]),
        (&json!("two\n"), &json!(4), &json!(8))
    );
    params["artifact_id"] = json!("art_missing");
    let missing = peer.call("runs.artifactContent", params).await;
    assert_eq!(missing["error"]["code"], "not_found", "{missing}");
}

#[tokio::test]
async fn bad_lines_get_stable_codes_and_the_session_goes_on() {
    let app = TestApp::api_only().await;
    let (mut child, mut peer) = stdio_peer(&app.client.base);

    let code = |line: &Value| {
        line["error"]["code"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    peer.send_line("{not json").await;
    let line = peer.read().await;
    assert_eq!(
        (code(&line), line["id"].clone()),
        ("parse_error".into(), Value::Null)
    );

    peer.send_line(r#"{"v":2,"id":"old","method":"tasks.list"}"#)
        .await;
    let line = peer.answer(&json!("old")).await;
    assert_eq!(code(&line), "unsupported_version");

    peer.send_line(&format!(
        r#"{{"v":1,"id":9,"method":"{}"}}"#,
        "x".repeat(2 << 20)
    ))
    .await;
    let line = peer.read().await;
    assert_eq!(
        (code(&line), line["id"].clone()),
        ("line_too_long".into(), Value::Null)
    );

    assert_eq!(
        code(&peer.call("tasks.explode", json!({})).await),
        "method_not_found"
    );
    assert_eq!(
        code(&peer.call("tasks.get", json!({})).await),
        "invalid_params"
    );
    assert_eq!(
        code(&peer.call("tasks.list", json!({"colour": "red"})).await),
        "invalid_params"
    );

    // The API's own refusals keep its envelope: its type is the code.
    let missing = peer
        .call("tasks.get", json!({"task_id": "task_missing"}))
        .await;
    assert_eq!(code(&missing), "not_found", "{missing}");
    assert!(
        missing["error"]["message"]
            .as_str()
            .unwrap()
            .contains("request "),
        "{missing}"
    );
    let invalid = peer
        .call("tasks.create", json!({"body": {"execution_kind": "shell"}}))
        .await;
    assert_eq!(code(&invalid), "invalid_request", "{invalid}");
    let message = invalid["error"]["message"].as_str().unwrap();
    assert!(message.contains("shell_command"), "{invalid}");
    assert_eq!(
        invalid["error"]["hint"],
        "Fix the request as the message says and send it again."
    );
    let subscribe = peer
        .call(
            "events.subscribe",
            json!({"task_id": "task_missing", "run_id": "run_missing"}),
        )
        .await;
    assert_eq!(code(&subscribe), "not_found", "{subscribe}");
    assert_eq!(
        code(
            &peer
                .call("events.unsubscribe", json!({"subscription": "sub_9"}))
                .await
        ),
        "not_found"
    );

    // Still alive after all that.
    let status = peer.ok("daemon.status", json!({})).await;
    assert_eq!(status["pid"], child.id().unwrap());
    assert_eq!(status["live"], true);
    assert!(status["started_at"].is_string());
    let listed = peer.ok("tasks.list", json!({"limit": 5})).await;
    assert!(listed["data"].is_array(), "{listed}");

    // Closing stdin ends the session and the process.
    drop(peer);
    let exit = tokio::time::timeout(LINE_WAIT, child.wait())
        .await
        .expect("keel rpc exits");
    assert!(exit.unwrap().success());
}

#[tokio::test]
async fn the_socket_is_owner_only_and_serves_each_connection() {
    let app = TestApp::api_only().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("keel.sock");
    let mut child = rpc_command(&app.client.base)
        .arg("--socket")
        .arg(&path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("keel rpc starts");
    wait_for(LINE_WAIT, "the socket to appear", || async {
        path.exists().then_some(())
    })
    .await;
    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "mode {mode:o}");

    let connect = |path: &Path| {
        let path = path.to_path_buf();
        async move {
            let (output, input) = tokio::net::UnixStream::connect(path)
                .await
                .unwrap()
                .into_split();
            Peer::new(output, input)
        }
    };
    let (mut first, mut second) = (connect(&path).await, connect(&path).await);
    let pid = child.id().unwrap();
    assert_eq!(first.ok("daemon.status", json!({})).await["pid"], pid);
    assert_eq!(second.ok("daemon.status", json!({})).await["pid"], pid);
    drop(first);
    assert!(second.ok("tasks.list", json!({})).await["data"].is_array());

    // A second server on the same path is refused; the first keeps serving.
    let refused = rpc_command(&app.client.base)
        .arg("--socket")
        .arg(&path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .await
        .unwrap();
    assert!(!refused.success());
    assert_eq!(second.ok("daemon.status", json!({})).await["pid"], pid);

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let exit = tokio::time::timeout(LINE_WAIT, child.wait())
        .await
        .expect("keel rpc exits");
    assert!(exit.unwrap().success());
    assert!(!path.exists(), "the socket is removed at shutdown");
}
