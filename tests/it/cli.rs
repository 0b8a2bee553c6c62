//! The operator CLI: the real `keel` binary against a real `keel api` and `keel worker`
//! over HTTP — ids on stdout, JSON as the API sent it, watch output and exit codes, error
//! envelopes, and a watch that outlives a killed and restarted API.

use crate::support;

use std::path::Path;
use std::process::{Output, Stdio};
use std::time::Duration;

use crate::support::tracker;
use crate::support::{KeelProcess, spawn_api_with_approvals, spawn_worker, wait_for};
use keel_client::{
    EventRecord, EventType, ItemRecord, MediaJobRecord, MediaJobStatus, PollSummary, ProviderView,
    RunStatus, ScheduleRecord, SourceRecord, SystemStats,
};
use serde_json::{Value, json};

const CLI_TIMEOUT: Duration = Duration::from_secs(90);

/// An API (with `approvals` gates) and a worker on a fresh database.
struct Keel {
    api: KeelProcess,
    _worker: KeelProcess,
    /// Logs and the worker's data directory, removed after the processes.
    _dir: tempfile::TempDir,
}

impl Keel {
    async fn start(approvals: &str) -> Keel {
        let db = support::fresh_database().await;
        let dir = tempfile::tempdir().unwrap();
        let api = spawn_api_with_approvals(&db, dir.path(), "api", approvals).await;
        let worker = spawn_worker(&db, dir.path(), "worker", 5_000, &dir.path().join("w"));
        Keel {
            api,
            _worker: worker,
            _dir: dir,
        }
    }

    fn client(&self) -> &support::Client {
        self.api.client.as_ref().unwrap()
    }

    fn url(&self) -> &str {
        &self.client().base
    }
}

/// `keel <args>` against `url`, to its exit.
pub(crate) async fn cli(url: &str, args: &[&str]) -> Output {
    let output = command(url, args).output();
    tokio::time::timeout(CLI_TIMEOUT, output)
        .await
        .expect("the CLI exits in time")
        .expect("the CLI ran")
}

fn command(url: &str, args: &[&str]) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(env!("CARGO_BIN_EXE_keel"));
    command
        .args(args)
        .env("KEEL_URL", url)
        .env_remove("KEEL_RUNTIME_TOKEN")
        .env_remove("KEEL_IDENTITY")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    command
}

pub(crate) fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn code(output: &Output) -> i32 {
    output.status.code().expect("exited, not killed")
}

fn describe(output: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        output.status.code(),
        stdout(output),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// `keel tasks create --quiet --shell command`: the new task's id.
async fn create_shell(url: &str, command: &str) -> String {
    create(url, &["--shell", command]).await
}

/// `keel tasks create --quiet ARGS…`: the new task's id.
async fn create(url: &str, args: &[&str]) -> String {
    let args: Vec<&str> = ["tasks", "create", "--quiet"]
        .into_iter()
        .chain(args.iter().copied())
        .collect();
    let output = cli(url, &args).await;
    assert_eq!(code(&output), 0, "{}", describe(&output));
    stdout(&output).trim().to_string()
}

/// How many lines of `text` are exactly `line`.
fn count(text: &str, line: &str) -> usize {
    text.lines().filter(|l| *l == line).count()
}

#[tokio::test]
async fn create_quiet_prints_the_id_and_json_output_is_the_apis() {
    let keel = Keel::start("none").await;
    let output = cli(keel.url(), &["tasks", "create", "-q", "--shell", "echo hi"]).await;
    assert_eq!(code(&output), 0, "{}", describe(&output));
    let id = stdout(&output);
    assert!(
        id.starts_with("task_") && id.trim_end().lines().count() == 1,
        "{id:?}"
    );
    let task = keel.client().api.get_task(id.trim()).await.unwrap().data;
    assert_eq!(task.shell_command.as_deref(), Some("echo hi"));

    // --mcp: a server as JSON, stored with the task; JSON that is no server is refused.
    let server = r#"{"name": "time", "command": "mcp-server-time", "tools": ["get_current_time"]}"#;
    let args = ["--prompt", "What time is it?", "--mcp", server];
    let agent = keel.client().api.get_task(&create(keel.url(), &args).await);
    let agent = agent.await.unwrap().data;
    let servers = agent.mcp_servers.expect("the task's servers").0;
    assert_eq!(
        (servers[0].name.as_str(), servers[0].tools.clone()),
        ("time", Some(vec!["get_current_time".into()]))
    );
    let args = [
        "tasks",
        "create",
        "--prompt",
        "x",
        "--mcp",
        r#"{"name": "time"}"#,
    ];
    let refused = cli(keel.url(), &args).await;
    assert_ne!(code(&refused), 0, "{}", describe(&refused));
    let said = describe(&refused);
    assert!(said.contains("exactly one of command"), "{said}");

    // --workspace-mode persistent: the task's directory, kept across its runs.
    let args = ["--shell", "ls", "--workspace-mode", "persistent"];
    let kept = keel.client().api.get_task(&create(keel.url(), &args).await);
    let kept = kept.await.unwrap().data;
    assert_eq!(kept.workspace_mode, "persistent");

    // --repo with --push-branch: where a completed run's changes go.
    let args = [
        "--shell",
        "ls",
        "--repo",
        "/srv/r",
        "--push-branch",
        "keel/x",
    ];
    let pushing = keel.client().api.get_task(&create(keel.url(), &args).await);
    let pushing = pushing.await.unwrap().data;
    assert_eq!(pushing.push_branch.as_deref(), Some("keel/x"));

    let output = cli(keel.url(), &["tasks", "list", "--output", "json"]).await;
    assert_eq!(code(&output), 0, "{}", describe(&output));
    let printed: Value = serde_json::from_slice(&output.stdout).expect("JSON on stdout");
    // The API's answer as sent: the CLI prints it unchanged.
    let (_, api) = keel.client().get("/v1/tasks").await;
    assert_eq!(printed, api);

    // The table has the task, one row under the headers.
    let output = cli(keel.url(), &["tasks", "list"]).await;
    let table = stdout(&output);
    assert!(table.lines().next().unwrap().starts_with("ID"), "{table}");
    assert!(
        table.contains(id.trim()) && table.contains("echo hi"),
        "{table}"
    );

    // --start: the same request starts it, and the task shown has its run.
    let output = cli(
        keel.url(),
        &["tasks", "create", "--start", "--shell", "true"],
    )
    .await;
    assert_eq!(code(&output), 0, "{}", describe(&output));
    let shown = stdout(&output);
    let run_line = shown.lines().find(|l| l.starts_with("latest run"));
    let run_id = run_line
        .and_then(|l| l.split_whitespace().last())
        .unwrap_or("");
    assert!(run_id.starts_with("run_"), "{shown}");
    let task_line = shown.lines().find(|l| l.starts_with("id "));
    let task_id = task_line.and_then(|l| l.split_whitespace().last()).unwrap();
    let task = keel.client().api.get_task(task_id).await.unwrap().data;
    assert_eq!(task.latest_run_id.as_deref(), Some(run_id), "{shown}");
    assert_eq!(task.run_count, 1, "{shown}");
}

/// A file task from the command line: `--file` and `--content` write (the default
/// operation), `--file-operation` names another, and an unknown one is a usage error.
#[tokio::test]
async fn a_file_task_is_created_and_run_from_the_command_line() {
    let keel = Keel::start("none").await;
    let workspaces = keel._dir.path().join("w/workspaces");
    for (operation, expected) in [(None, "written\n"), (Some("append"), "written\n")] {
        let mut args = vec!["--file", "notes.txt", "--content", "written\n"];
        args.extend(
            operation
                .map(|op| ["--file-operation", op])
                .into_iter()
                .flatten(),
        );
        args.extend(["--workspace-mode", "persistent", "--start"]);
        let id = create(keel.url(), &args).await;
        let task = keel.client().api.get_task(&id).await.unwrap().data;
        assert_eq!(
            task.file_operation.as_deref(),
            Some(operation.unwrap_or("write"))
        );
        let run_id = task.latest_run_id.unwrap();
        let run = keel
            .client()
            .wait_terminal(&id, &run_id, Duration::from_secs(30))
            .await;
        assert_eq!(run.status, RunStatus::Completed, "{run:?}");
        let written = std::fs::read_to_string(workspaces.join(&id).join("notes.txt")).unwrap();
        assert_eq!(written, expected);
    }
    let args = ["tasks", "create", "--file", "x", "--file-operation", "move"];
    let refused = cli(keel.url(), &args).await;
    assert_eq!(code(&refused), 4, "{}", describe(&refused));
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("[possible values: write, append, delete]"),
        "{stderr}"
    );
}

#[tokio::test]
async fn start_watch_prints_each_output_line_once_and_exits_with_the_run() {
    let keel = Keel::start("none").await;
    let task = create_shell(
        keel.url(),
        "for i in 1 2 3; do echo line $i; sleep 0.3; done; echo warn >&2",
    )
    .await;
    let output = cli(keel.url(), &["tasks", "start", &task, "--watch"]).await;
    assert_eq!(code(&output), 0, "{}", describe(&output));
    let text = stdout(&output);
    for i in 1..=3 {
        assert_eq!(count(&text, &format!("line {i}")), 1, "{text}");
    }
    assert!(
        text.lines()
            .any(|l| l.starts_with("step 1 shell completed ") && l.ends_with('s')),
        "a step line with its elapsed time: {text}"
    );
    assert!(text.contains("run finished in"), "{text}");
    assert_eq!(
        count(&String::from_utf8_lossy(&output.stderr), "warn"),
        1,
        "{}",
        describe(&output)
    );

    // A failing command: exit code 1, its output still printed.
    let task = create_shell(keel.url(), "echo before failing; exit 3").await;
    let output = cli(keel.url(), &["tasks", "start", &task, "--watch"]).await;
    assert_eq!(code(&output), 1, "{}", describe(&output));
    assert_eq!(
        count(&stdout(&output), "before failing"),
        1,
        "{}",
        describe(&output)
    );
}

/// The events a `--output json` watch printed: every stdout line an event object, in
/// strictly increasing `sequence` (so none twice).
fn events_of(output: &Output) -> Vec<Value> {
    let events: Vec<Value> = stdout(output)
        .lines()
        .map(|line| {
            serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{e}: {line:?}\n{}", describe(output)))
        })
        .collect();
    assert!(!events.is_empty(), "{}", describe(output));
    for event in &events {
        assert!(event["type"].is_string(), "{event}\n{}", describe(output));
    }
    let sequences: Vec<i64> = events
        .iter()
        .map(|e| e["sequence"].as_i64().unwrap())
        .collect();
    assert!(
        sequences.windows(2).all(|w| w[0] < w[1]),
        "{sequences:?}\n{}",
        describe(output)
    );
    events
}

/// An event line of a JSON watch, as the contract's record.
fn event(line: &Value) -> EventRecord {
    serde_json::from_value(line.clone()).unwrap_or_else(|e| panic!("{e}: {line}"))
}

#[tokio::test]
async fn a_json_watch_prints_the_events_alone_one_a_line() {
    let keel = Keel::start("none").await;
    let task = create_shell(keel.url(), "echo one; echo two").await;
    let args = ["tasks", "start", &task, "--watch", "--output", "json"];
    let output = cli(keel.url(), &args).await;
    assert_eq!(code(&output), 0, "{}", describe(&output));
    let events = events_of(&output);
    let last = event(events.last().unwrap());
    assert_eq!(
        last.event_type,
        EventType::RunFinished,
        "{}",
        describe(&output)
    );
    // run.finished carries the exit code; the step's event carries its status.
    assert_eq!(last.data["exit_code"], 0, "{last:?}");
    let step = events
        .iter()
        .map(event)
        .rfind(|e| e.event_type == EventType::StepFinished);
    assert_eq!(step.unwrap().data["status"], "completed", "{events:?}");
    // The run's output lines are not there: stdout is the events'.
    assert_eq!(count(&stdout(&output), "one"), 0, "{}", describe(&output));
    // The events as the API lists them, unchanged (read raw: the comparison is of JSON).
    let run = last.run_id.as_deref().unwrap();
    let (_, listed) = keel
        .client()
        .get(&format!("/v1/tasks/{task}/runs/{run}/events?limit=200"))
        .await;
    assert_eq!(listed["data"].as_array().unwrap(), &events);

    let task = create_shell(keel.url(), "exit 3").await;
    let args = ["tasks", "start", &task, "--watch", "--output", "json"];
    let output = cli(keel.url(), &args).await;
    assert_eq!(code(&output), 1, "{}", describe(&output));
    let events = events_of(&output);
    let last = event(events.last().unwrap());
    assert_eq!(
        last.event_type,
        EventType::RunFailed,
        "{}",
        describe(&output)
    );
    assert_eq!(last.data["exit_code"], 3, "{last:?}");
}

#[tokio::test]
async fn an_approval_gated_run_exits_3_then_approve_and_watch_exit_0() {
    let keel = Keel::start("shell_exec").await;
    let url = keel.url();
    let task = create_shell(url, "echo approved output").await;
    let output = cli(url, &["tasks", "start", &task, "--watch", "--no-wait"]).await;
    assert_eq!(code(&output), 3, "{}", describe(&output));
    let text = stdout(&output);
    let prompt = format!("keel --url {url} approvals approve apr_");
    let approve = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("approve: "))
        .unwrap_or_else(|| panic!("an approve command: {text}"));
    assert!(approve.starts_with(&prompt), "{text}");
    assert!(
        text.contains("echo approved output"),
        "the action summary: {text}"
    );
    let approval = approve.rsplit(' ').next().unwrap();
    let pending = [
        "approvals",
        "list",
        "--task",
        &task,
        "--status",
        "pending",
        "-q",
    ];
    let output = cli(url, &pending).await;
    assert_eq!(
        stdout(&output),
        format!("{approval}\n"),
        "{}",
        describe(&output)
    );
    let gated = keel.client().api.get_task(&task).await.unwrap().data;
    let gated = gated.latest_run_id.unwrap();
    let output = cli(url, &["approvals", "list", "--run", &gated, "-q"]).await;
    assert_eq!(
        stdout(&output),
        format!("{approval}\n"),
        "{}",
        describe(&output)
    );
    let output = cli(url, &["approvals", "show", approval, "--output", "json"]).await;
    let shown = json_of(&output);
    assert_eq!(shown["data"]["status"], "pending", "{shown}");
    assert_eq!(shown["data"]["run_id"], gated.as_str(), "{shown}");

    // The printed command itself, `--url` before the subcommand and all.
    let printed: Vec<&str> = approve.split(' ').skip(1).collect();
    let output = cli(url, &printed).await;
    assert_eq!(code(&output), 0, "{}", describe(&output));
    let task = keel.client().api.get_task(&task).await.unwrap().data;
    let run = task.latest_run_id.as_deref().unwrap();
    let output = cli(url, &["runs", "watch", run]).await;
    assert_eq!(code(&output), 0, "{}", describe(&output));
    let text = stdout(&output);
    assert_eq!(count(&text, "approved output"), 1, "{text}");
    // The replayed request is history now: no command to approve it again.
    assert!(
        text.contains(&format!("approval {approval} approved by")),
        "{text}"
    );
    assert!(!text.contains("approve: "), "{text}");
}

/// A long run's watch says how it is doing at each heartbeat: its time, its step, its model
/// calls and cost; the stream's frames carry them only when asked.
#[tokio::test]
async fn a_long_runs_watch_prints_a_heartbeat_line() {
    let keel = Keel::start("none").await;
    let url = keel.url().to_string();
    let task = create_shell(&url, "sleep 3").await;
    let output = cli(&url, &["tasks", "start", &task, "--quiet"]).await;
    let run = stdout(&output).trim().to_string();
    let output = cli(&url, &["runs", "watch", &run, "--heartbeat", "1"]).await;
    assert_eq!(code(&output), 0, "{}", describe(&output));
    let watched = stdout(&output);
    let beats: Vec<&str> = watched.lines().filter(|l| l.starts_with("… ")).collect();
    assert!(!beats.is_empty(), "{watched}");
    assert!(
        beats
            .iter()
            .any(|l| l.contains(" shell (running), 0 model calls, $0.0000")),
        "{watched}"
    );
    let output = cli(&url, &["runs", "watch", &run, "--heartbeat", "0"]).await;
    assert_eq!(code(&output), 4, "{}", describe(&output));
    assert!(
        describe(&output).contains("1..=300"),
        "{}",
        describe(&output)
    );
    let (status, body) = keel
        .client()
        .get(&format!(
            "/v1/tasks/{task}/runs/{run}/stream?heartbeat_s=301"
        ))
        .await;
    assert_eq!(status, reqwest::StatusCode::BAD_REQUEST, "{body}");
}

#[tokio::test]
async fn a_cancelled_run_exits_2() {
    let keel = Keel::start("none").await;
    let url = keel.url().to_string();
    let task = create_shell(&url, "echo started; sleep 60").await;
    let watch = command(&url, &["tasks", "start", &task, "--watch"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let client = keel.client();
    let run = wait_for(Duration::from_secs(30), "the run to be running", || async {
        let task = client.api.get_task(&task).await.ok()?.data;
        let run = task.latest_run_id?;
        (client.run(&task.id, &run).await.status == RunStatus::Running).then_some(run)
    })
    .await;
    // A conflict says what to do about it, with the command that does it.
    let cancel = format!("keel runs cancel {run}");
    for args in [["tasks", "start", &task], ["tasks", "delete", &task]] {
        let output = cli(&url, &args).await;
        assert_ne!(code(&output), 0, "{}", describe(&output));
        assert!(
            describe(&output).contains(&cancel),
            "{args:?}: {}",
            describe(&output)
        );
    }
    let output = cli(&url, &["runs", "cancel", &run]).await;
    assert_eq!(code(&output), 0, "{}", describe(&output));
    let output = tokio::time::timeout(CLI_TIMEOUT, watch.wait_with_output())
        .await
        .expect("the watch ends with the run")
        .unwrap();
    assert_eq!(code(&output), 2, "{}", describe(&output));
}

#[tokio::test]
async fn an_error_prints_the_envelope_with_its_request_id() {
    let keel = Keel::start("none").await;
    let output = cli(keel.url(), &["tasks", "show", "task_missing"]).await;
    assert_eq!(code(&output), 4, "{}", describe(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 2, "{stderr}");
    assert!(
        lines[0].contains("The resource does not exist."),
        "{stderr}"
    );
    assert!(lines[0].contains("task not found"), "{stderr}");
    assert!(lines[0].contains("request id req_"), "{stderr}");
    assert!(lines[1].starts_with("hint: Check the id"), "{stderr}");
    assert!(output.stdout.is_empty());
}

/// Times show in the machine's zone, with the zone, or in UTC with `--utc`.
#[tokio::test]
async fn times_show_in_the_local_zone_with_the_zone_or_in_utc() {
    let keel = Keel::start("none").await;
    let id = create_shell(keel.url(), "true").await;
    let task = keel.client().api.get_task(&id).await.unwrap().data;
    let shown = |utc: bool| {
        let mut args = vec!["tasks", "show", id.as_str()];
        if utc {
            args.push("--utc");
        }
        let mut command = command(keel.url(), &args);
        command.env("TZ", "Asia/Tokyo").output()
    };
    let tokyo = shown(false).await.unwrap();
    let created = task.created_at + chrono::Duration::hours(9);
    let local = format!("{} +09:00", created.format("%Y-%m-%d %H:%M:%S"));
    assert!(
        stdout(&tokyo).contains(&local),
        "{local}\n{}",
        describe(&tokyo)
    );
    let utc = shown(true).await.unwrap();
    let at = format!("{} UTC", task.created_at.format("%Y-%m-%d %H:%M:%S"));
    assert!(stdout(&utc).contains(&at), "{at}\n{}", describe(&utc));
}

/// With nothing listening at the URL, the CLI says so and how to start Keel.
#[tokio::test]
async fn an_unreachable_api_is_named_with_how_to_start_keel() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let output = cli(&url, &["tasks", "list"]).await;
    assert_eq!(code(&output), 4, "{}", describe(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 2, "{stderr}");
    assert!(lines[0].contains("Connection refused"), "{stderr}");
    assert!(lines[1].starts_with("hint: nothing answers at"), "{stderr}");
    assert!(lines[1].contains("`keel serve`"), "{stderr}");
}

/// What the run has written to stdout so far (nothing before its artifact exists).
async fn written(client: &support::Client, task: &str, run: &str) -> String {
    let artifacts = client.api.list_artifacts(task, run).await;
    let artifacts = artifacts.map(|a| a.data).unwrap_or_default();
    match artifacts.iter().find(|a| a.name == "stdout") {
        Some(_) => client.stdout(task, run).await,
        None => String::new(),
    }
}

/// Starts `keel api` on `port` (no approval gates) and waits until it answers.
async fn spawn_api_on(db: &str, dir: &Path, name: &str, port: u16) -> KeelProcess {
    let log = dir.join(format!("{name}.log"));
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_keel"))
        .env("KEEL_DATABASE_URL", db)
        .env("KEEL_APPROVAL_POLICIES", "none")
        .args(["api", "--listen", &format!("127.0.0.1:{port}")])
        .args(["--stream-poll-ms", "500"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let client = support::Client::new(format!("http://127.0.0.1:{port}"));
    let process = KeelProcess {
        child,
        client: Some(client.clone()),
        log,
        _delegated: None,
    };
    wait_for(Duration::from_secs(20), "keel api to answer", || async {
        client.healthy().await.then_some(())
    })
    .await;
    process
}

#[tokio::test]
async fn watch_prints_every_line_and_event_once_across_an_api_killed_and_restarted() {
    let db = support::fresh_database().await;
    let dir = tempfile::tempdir().unwrap();
    let port = support::free_port();
    let mut api = spawn_api_on(&db, dir.path(), "api-1", port).await;
    let _worker = spawn_worker(&db, dir.path(), "worker", 5_000, &dir.path().join("w"));
    let url = format!("http://127.0.0.1:{port}");
    let task = create_shell(
        &url,
        "for i in $(seq 1 12); do echo line $i; sleep 0.4; done",
    )
    .await;
    let output = cli(&url, &["tasks", "start", &task, "--quiet"]).await;
    let run = stdout(&output).trim().to_string();
    assert!(run.starts_with("run_"), "{}", describe(&output));
    let follow = |args: &[&str]| {
        command(&url, args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let watch = follow(&["runs", "watch", &run]);
    let json_watch = follow(&["runs", "watch", &run, "--output", "json"]);

    // Mid-run: some lines are out, most are still to come.
    let client = api.client.clone().unwrap();
    wait_for(
        Duration::from_secs(30),
        "the run to print line 3",
        || async {
            written(&client, &task, &run)
                .await
                .contains("line 3\n")
                .then_some(())
        },
    )
    .await;
    api.kill9();
    let api = spawn_api_on(&db, dir.path(), "api-2", port).await;

    let output = tokio::time::timeout(CLI_TIMEOUT, watch.wait_with_output())
        .await
        .expect("the watch ends with the run")
        .unwrap();
    assert_eq!(code(&output), 0, "{}", describe(&output));
    let text = stdout(&output);
    for i in 1..=12 {
        assert_eq!(count(&text, &format!("line {i}")), 1, "line {i}: {text}");
    }
    assert_eq!(
        text.lines()
            .filter(|l| l.starts_with("run finished"))
            .count(),
        1,
        "{text}"
    );
    let output = tokio::time::timeout(CLI_TIMEOUT, json_watch.wait_with_output())
        .await
        .expect("the JSON watch ends with the run")
        .unwrap();
    assert_eq!(code(&output), 0, "{}", describe(&output));
    // Read raw: the comparison is of JSON, the CLI's lines against the API's list.
    let (_, listed) = api
        .client
        .as_ref()
        .unwrap()
        .get(&format!("/v1/tasks/{task}/runs/{run}/events?limit=200"))
        .await;
    assert_eq!(listed["data"].as_array().unwrap(), &events_of(&output));
    drop(api);
}

#[tokio::test]
async fn the_other_commands_answer_from_the_api() {
    let keel = Keel::start("none").await;
    let url = keel.url();
    let first = create_shell(url, "echo one").await;
    let second = create_shell(url, "echo two").await;

    // Every page: one task a page, both rows.
    let output = cli(url, &["tasks", "list", "--limit", "1", "--all"]).await;
    let table = stdout(&output);
    assert!(
        table.contains(&first) && table.contains(&second),
        "{}",
        describe(&output)
    );
    let output = cli(url, &["tasks", "list", "--limit", "1"]).await;
    assert!(!stdout(&output).contains(&first), "{}", describe(&output));
    assert!(String::from_utf8_lossy(&output.stderr).contains("more: --cursor "));

    let output = cli(url, &["tasks", "start", &first, "--watch"]).await;
    assert_eq!(code(&output), 0, "{}", describe(&output));
    let task = keel.client().api.get_task(&first).await.unwrap().data;
    let run = task.latest_run_id.as_deref().unwrap();
    let output = cli(url, &["runs", "logs", run]).await;
    assert_eq!(stdout(&output), "one\n", "{}", describe(&output));
    let output = cli(url, &["runs", "show", run, "--output", "json"]).await;
    // The API's answer as sent: the CLI prints it unchanged.
    let (_, api) = keel
        .client()
        .get(&format!("/v1/tasks/{first}/runs/{run}"))
        .await;
    assert_eq!(
        serde_json::from_slice::<Value>(&output.stdout).unwrap(),
        api
    );
    let output = cli(url, &["runs", "list", &first]).await;
    assert!(stdout(&output).contains(run), "{}", describe(&output));
    // Every task's runs, by status: the one completed run, and no failed one.
    let output = cli(url, &["runs", "list", "--status", "completed", "-q"]).await;
    assert_eq!(stdout(&output), format!("{run}\n"), "{}", describe(&output));
    let failed = ["runs", "list", &first, "--status", "failed", "-q"];
    let output = cli(url, &failed).await;
    assert_eq!(stdout(&output), "", "{}", describe(&output));
    let output = cli(url, &["runs", "list", "--status", "sleeping"]).await;
    assert_eq!(code(&output), 4, "{}", describe(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("unknown status 'sleeping'"), "{stderr}");

    let set = ["schedules", "set", &second, "--cron", "0 9 * * 1-5"];
    let output = cli(url, &set).await;
    assert_eq!(code(&output), 0, "{}", describe(&output));
    let output = cli(url, &["schedules", "show", &second, "--output", "json"]).await;
    let schedule: ScheduleRecord = support::record(&json_of(&output));
    assert_eq!(schedule.cron_expression.as_deref(), Some("0 9 * * 1-5"));
    let output = cli(url, &["schedules", "delete", &second]).await;
    assert_eq!(code(&output), 0, "{}", describe(&output));
    let output = cli(url, &["schedules", "show", &second]).await;
    assert_eq!(code(&output), 4, "{}", describe(&output));

    for args in [
        &["status"][..],
        &["providers", "list"],
        &["approvals", "list"],
    ] {
        let output = cli(url, args).await;
        assert_eq!(code(&output), 0, "{args:?}: {}", describe(&output));
    }
    let output = cli(url, &["status", "--output", "json"]).await;
    let stats: SystemStats = support::record(&json_of(&output));
    assert!(stats.workers.live >= 1, "{stats:?}");

    let output = cli(url, &["tasks", "delete", &second]).await;
    assert_eq!(code(&output), 0, "{}", describe(&output));
    let (status, _) = keel.client().get(&format!("/v1/tasks/{second}")).await;
    assert_eq!(status, 404);
}

/// The commands of issue 33 on a task's run (steps, events, artifacts, lineage, patches)
/// and schedule, the feed, usage, a secret's status, throughput, workspace limits, the
/// audit trail, the leases, whoami, the provider templates, and last the API's shutdown.
#[tokio::test]
async fn run_lineage_patches_schedules_transitions_and_leases_answer_from_the_api() {
    let keel = Keel::start("none").await;
    let url = keel.url();
    let task = create_shell(url, "echo one").await;
    let output = cli(url, &["tasks", "start", &task, "--watch"]).await;
    assert_eq!(code(&output), 0, "{}", describe(&output));
    let run = keel.client().api.get_task(&task).await.unwrap().data;
    let run = run.latest_run_id.unwrap();

    let output = cli(url, &["runs", "steps", &run, "-q"]).await;
    assert_eq!(stdout(&output).lines().count(), 1, "{}", describe(&output));
    let output = cli(url, &["runs", "artifacts", &run, "--output", "json"]).await;
    let artifacts = json_of(&output);
    assert!(
        artifacts["data"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a["kind"] == "stdout" && a["size_bytes"] == 4),
        "{artifacts}"
    );
    let of_run = cli(url, &["runs", "artifacts", &run, "-q"]).await;
    let of_task = cli(url, &["tasks", "artifacts", &task, "-q"]).await;
    assert_eq!(stdout(&of_task), stdout(&of_run), "{}", describe(&of_task));
    let steps = cli(url, &["runs", "steps", &run, "-q"]).await;
    let step = stdout(&steps).trim().to_string();
    let output = cli(url, &["runs", "step", &run, &step, "--output", "json"]).await;
    assert_eq!(
        json_of(&output)["data"]["id"],
        step.as_str(),
        "{}",
        describe(&output)
    );
    let stdout_artifact = artifacts["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["kind"] == "stdout")
        .unwrap()
        .clone();
    let artifact = stdout_artifact["id"].as_str().unwrap();
    let output = cli(
        url,
        &["runs", "artifact", &run, artifact, "--output", "json"],
    )
    .await;
    assert_eq!(json_of(&output)["data"], stdout_artifact);
    // The run's log: every event by sequence, and after a cursor (a sequence).
    let output = cli(url, &["runs", "events", &run, "--all", "-q"]).await;
    let sequences: Vec<String> = stdout(&output).lines().map(String::from).collect();
    assert!(sequences.len() >= 3, "{}", describe(&output));
    assert_eq!(sequences[0], "1", "{}", describe(&output));
    let after = [
        "runs", "events", &run, "--cursor", "2", "--limit", "1", "-q",
    ];
    let output = cli(url, &after).await;
    assert_eq!(stdout(&output), "3\n", "{}", describe(&output));
    // The workspace's feed, one task's.
    let feed = [
        "events", "list", "--task", &task, "--all", "--output", "json",
    ];
    let output = cli(url, &feed).await;
    let events: Vec<Value> = stdout(&output)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(events.len(), sequences.len(), "{}", describe(&output));
    assert!(events.iter().all(|e| e["run_id"] == run.as_str()));

    let output = cli(url, &["usage", "summary", "--output", "json"]).await;
    assert_eq!(json_of(&output)["data"]["totals"]["calls"], 0);
    let output = cli(url, &["usage", "summary", "--scope", "provider"]).await;
    assert_eq!(code(&output), 0, "{}", describe(&output));
    let output = cli(url, &["usage", "events", "--run", &run, "-q"]).await;
    assert_eq!(stdout(&output), "", "{}", describe(&output));
    let args = [
        "secrets",
        "status",
        "env:CLI_PARITY_NEVER_SET_API_KEY",
        "--output",
        "json",
    ];
    let output = cli(url, &args).await;
    assert_eq!(
        json_of(&output)["data"]["configured"],
        false,
        "{}",
        describe(&output)
    );
    let output = cli(url, &["throughput", "--minutes", "5", "--output", "json"]).await;
    let throughput = json_of(&output);
    assert_eq!(throughput["data"]["minutes"], 5, "{throughput}");
    let output = cli(url, &["workspace", "show", "--output", "json"]).await;
    let own = json_of(&output);
    let workspace = own["data"]["workspace_id"].as_str().unwrap().to_string();
    let set = [
        "workspace",
        "set-limits",
        &workspace,
        "--max-concurrent",
        "3",
    ];
    let output = cli(url, &set).await;
    assert_eq!(code(&output), 0, "{}", describe(&output));
    let output = cli(url, &["workspace", "show", &workspace, "--output", "json"]).await;
    assert_eq!(json_of(&output)["data"]["max_concurrent"], 3);
    let output = cli(url, &["workspace", "set-limits", &workspace, "--default"]).await;
    assert_eq!(code(&output), 0, "{}", describe(&output));
    let output = cli(url, &["workspace", "show", "--output", "json"]).await;
    assert_eq!(json_of(&output)["data"]["max_concurrent"], Value::Null);

    // The approval policy: set changes only what it names, in the policy in force.
    let set = [
        "workspace",
        "set-policy",
        &workspace,
        "--gate",
        "shell_exec=deny",
        "--mcp",
        "github=ask",
        "--write-path",
        "src",
        "--output",
        "json",
    ];
    let output = cli(url, &set).await;
    let policy = json_of(&output);
    assert_eq!(policy["data"]["source"], "workspace", "{policy}");
    assert_eq!(policy["data"]["gates"]["shell_exec"], "deny", "{policy}");
    assert_eq!(policy["data"]["mcp_servers"]["github"], "ask", "{policy}");
    assert_eq!(
        policy["data"]["allowed_write_paths"],
        json!(["src"]),
        "{policy}"
    );
    let output = cli(
        url,
        &[
            "workspace",
            "set-policy",
            &workspace,
            "--gate",
            "shell_exec=never",
        ],
    )
    .await;
    assert_ne!(code(&output), 0, "{}", describe(&output));
    assert!(
        describe(&output).contains("allow, ask or deny"),
        "{}",
        describe(&output)
    );
    let output = cli(url, &["workspace", "policy", &workspace]).await;
    assert!(
        stdout(&output).contains("github=ask"),
        "{}",
        describe(&output)
    );
    let output = cli(
        url,
        &["workspace", "reset-policy", &workspace, "--output", "json"],
    )
    .await;
    assert_eq!(
        json_of(&output)["data"]["source"],
        "default",
        "{}",
        describe(&output)
    );

    let output = cli(url, &["whoami", "--output", "json"]).await;
    let session = json_of(&output);
    assert!(session["data"]["workspace"].is_string(), "{session}");
    let output = cli(url, &["providers", "templates", "-q"]).await;
    assert!(!stdout(&output).is_empty(), "{}", describe(&output));

    // A shell run has no conversation: the API's refusal, as an envelope.
    for args in [
        &["runs", "continue", &run, "--prompt", "and then?"][..],
        &["runs", "retry-from-model-call", &run, "--model-call", "1"],
    ] {
        let output = cli(url, args).await;
        assert_eq!(code(&output), 4, "{args:?}: {}", describe(&output));
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("only agent_loop runs"), "{stderr}");
    }
    // Nor file changes.
    let output = cli(url, &["runs", "patches", "list", &run, "--output", "json"]).await;
    assert_eq!(code(&output), 0, "{}", describe(&output));
    assert_eq!(json_of(&output)["data"], json!([]));
    for verb in ["show", "revert", "apply", "discard"] {
        let output = cli(url, &["runs", "patches", verb, &run, "art_nope"]).await;
        assert_eq!(code(&output), 4, "{verb}: {}", describe(&output));
    }

    // A run the caller carries out itself: started, its work appended, ended.
    let other = create_shell(url, "echo held by its client").await;
    let output = cli(url, &["runs", "client-start", &other, "--output", "json"]).await;
    let started = json_of(&output);
    let held = started["data"]["run"]["id"].as_str().unwrap().to_string();
    let token = started["data"]["lease_token"].as_str().unwrap().to_string();
    let notes = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(notes.path(), "what I found\n").unwrap();
    let artifact = format!("notes={}", notes.path().display());
    let appended = [
        "runs",
        "append",
        &held,
        "--token",
        &token,
        "--event",
        r#"message={"text":"hi"}"#,
        "--step",
        "check",
        "--artifact",
        &artifact,
        "--finish",
        "completed",
        "--output",
        "json",
    ];
    let output = cli(url, &appended).await;
    let accepted = json_of(&output);
    assert_eq!(accepted["data"]["run"]["status"], "completed", "{accepted}");
    // The step's two events, the artifact's, the client's, the task's change and the end.
    assert_eq!(accepted["data"]["appended"], 6, "{accepted}");
    let bogus = [
        "runs", "append", &held, "--token", &token, "--finish", "maybe",
    ];
    let output = cli(url, &bogus).await;
    assert_ne!(code(&output), 0, "{}", describe(&output));
    assert!(
        describe(&output).contains("completed or failed"),
        "{}",
        describe(&output)
    );

    let set = [
        "schedules",
        "set",
        &task,
        "--cron",
        "0 9 * * 1-5",
        "--disabled",
    ];
    let output = cli(url, &set).await;
    assert_eq!(code(&output), 0, "{}", describe(&output));
    let output = cli(url, &["schedules", "list", "--output", "json"]).await;
    let listed = support::page::<ScheduleRecord>(&json_of(&output)).data;
    assert_eq!(listed.len(), 1, "{}", describe(&output));
    assert_eq!(listed[0].task_id, task);
    let output = cli(url, &["schedules", "list", "--enabled", "true", "-q"]).await;
    assert_eq!(stdout(&output), "", "{}", describe(&output));
    let output = cli(url, &["schedules", "list", "--task", &task, "-q"]).await;
    assert_eq!(stdout(&output), format!("{}\n", listed[0].id));
    let output = cli(
        url,
        &["schedules", "occurrences", &task, "--output", "json"],
    )
    .await;
    assert_eq!(code(&output), 0, "{}", describe(&output));
    assert_eq!(json_of(&output)["data"], json!([]));

    let args = [
        "transitions",
        "list",
        "--entity-type",
        "run",
        "--entity-id",
        &run,
    ];
    let output = cli(url, &[&args[..], &["--all", "--output", "json"]].concat()).await;
    assert_eq!(code(&output), 0, "{}", describe(&output));
    let changes: Vec<Value> = stdout(&output)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(changes.len() >= 2, "{changes:?}");
    assert!(changes.iter().all(|c| c["entity_id"] == run.as_str()));
    // Newest first: the run's end, then how it got there.
    assert_eq!(
        changes.first().unwrap()["to_status"],
        "completed",
        "{changes:?}"
    );

    let args = ["leases", "list", "--status", "released", "--output", "json"];
    let output = cli(url, &args).await;
    let leases = json_of(&output);
    assert!(
        leases["data"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l["ref_id"] == run.as_str()),
        "{leases}"
    );
    let output = cli(url, &["leases", "list", "--status", "sleeping"]).await;
    assert_eq!(code(&output), 4, "{}", describe(&output));

    // Last: the API stops, and answers no more.
    let output = cli(url, &["shutdown", "--output", "json"]).await;
    assert_eq!(json_of(&output)["data"]["status"], "shutting_down");
    wait_for(Duration::from_secs(30), "the API to stop", || async {
        let output = cli(url, &["status"]).await;
        (code(&output) == 4).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_media_job_is_created_run_and_watched_to_its_end() {
    use wiremock::matchers::{method, path};
    use wiremock::{Mock, MockServer, ResponseTemplate};
    const KEY_ENV: &str = "KEEL_SECRET_TEST_CLI_MEDIA_KEY";
    let env = [
        (KEY_ENV, "sk-cli-test"),
        ("KEEL_MEDIA_ALLOW_PRIVATE_ADDRESSES", "true"),
        ("KEEL_PROVIDER_HOSTS", "127.0.0.1"),
    ];
    let db = support::fresh_database().await;
    let dir = tempfile::tempdir().unwrap();
    let api = support::spawn_api_with_env(&db, dir.path(), "api", &env).await;
    let work = dir.path().join("w");
    let _worker = support::spawn_worker_with_env(&db, dir.path(), "worker", 5_000, &work, &env);
    let vendor = MockServer::start().await;
    Mock::given(method("POST"))
        .and(path("/api/v3/images/generations"))
        .respond_with(ResponseTemplate::new(200).set_body_json(serde_json::json!({
            "model": "seedream-model", "created": 1,
            "data": [{ "url": format!("{}/files/out.png", vendor.uri()) }],
        })))
        .mount(&vendor)
        .await;
    Mock::given(method("GET"))
        .and(path("/files/out.png"))
        .respond_with(
            ResponseTemplate::new(200).set_body_raw(&b"\x89PNG\r\n\x1a\n"[..], "image/png"),
        )
        .mount(&vendor)
        .await;
    let client = api.client.clone().unwrap();
    // A Seedream preset on the vendor stand-in whose key is `key_ref`: its id.
    let preset = |key_ref: String| {
        let client = client.clone();
        let base_url = format!("{}/api/v3", vendor.uri());
        async move {
            let draft = serde_json::json!({
                "kind": "seedream", "model": "seedream-model", "api": "media-job",
                "base_url": base_url, "api_key_ref": key_ref,
                "capabilities": ["image_generate"], "enabled": true,
            });
            let (_, preset) = client.post("/v1/providers", draft).await;
            support::record::<ProviderView>(&preset).id
        }
    };
    let provider = preset(format!("env:{KEY_ENV}")).await;
    let url = &client.base;

    let output = cli(url, &["providers", "check", &provider]).await;
    assert_eq!(code(&output), 0, "{}", describe(&output));
    assert!(stdout(&output).contains("ready"), "{}", describe(&output));
    // A preset that cannot be used (its key's variable is not set) ends the check failed.
    let keyless = preset("env:NOBODY_SET_THIS_API_KEY".to_string()).await;
    let output = cli(url, &["providers", "check", &keyless]).await;
    assert_eq!(code(&output), 1, "{}", describe(&output));
    assert!(stdout(&output).contains("false"), "{}", describe(&output));

    let create = [
        "media",
        "create",
        "--provider",
        &provider,
        "--prompt",
        "a lighthouse",
    ];
    let output = cli(url, &[&create[..], &["--quiet", "--watch"]].concat()).await;
    assert_eq!(code(&output), 0, "{}", describe(&output));
    let id = stdout(&output).trim().to_string();
    assert!(id.starts_with("media_job_"), "{}", describe(&output));
    let output = cli(url, &["media", "show", &id, "--output", "json"]).await;
    let job: MediaJobRecord = support::record(&json_of(&output));
    assert_eq!(job.status, MediaJobStatus::Succeeded, "{job:?}");
    // As JSON: the create answer's object, then the job's events, one a line.
    let output = cli(
        url,
        &[&create[..], &["--watch", "--output", "json"]].concat(),
    )
    .await;
    assert_eq!(code(&output), 0, "{}", describe(&output));
    let text = stdout(&output);
    let (created, events) = text.split_once('\n').expect("lines");
    let created: Value = serde_json::from_str(created).unwrap();
    let job_id = support::record::<MediaJobRecord>(&created).id;
    let job_id = job_id.as_str();
    let events: Vec<Value> = events
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(events.iter().all(|e| e["media_job_id"] == job_id), "{text}");
    assert_eq!(
        events.last().unwrap()["type"],
        "media_job.succeeded",
        "{text}"
    );
    // Watching an ended job replays its events and tells its end at once.
    let output = cli(url, &["media", "watch", &id, "--output", "json"]).await;
    assert_eq!(code(&output), 0, "{}", describe(&output));
    let replayed: Vec<Value> = stdout(&output)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        replayed[0]["type"],
        "media_job.queued",
        "{}",
        describe(&output)
    );
    assert_eq!(
        replayed.last().unwrap()["type"],
        "media_job.succeeded",
        "{}",
        describe(&output)
    );
    let output = cli(url, &["media", "watch", &id]).await;
    assert_eq!(code(&output), 0, "{}", describe(&output));
    assert!(
        stdout(&output).contains(&format!("media job {id} succeeded")),
        "{}",
        describe(&output)
    );

    // A job created without running, cancelled; the lists by status and by provider.
    let output = cli(url, &[&create[..], &["--quiet", "--no-run"]].concat()).await;
    let queued = stdout(&output).trim().to_string();
    let output = cli(url, &["media", "cancel", &queued, "--output", "json"]).await;
    let job: MediaJobRecord = support::record(&json_of(&output));
    assert_eq!(job.status, MediaJobStatus::Cancelled, "{job:?}");
    let output = cli(url, &["media", "list", "--status", "cancelled", "-q"]).await;
    assert_eq!(
        stdout(&output),
        format!("{queued}\n"),
        "{}",
        describe(&output)
    );
    let output = cli(
        url,
        &["media", "list", "--provider", &provider, "--all", "-q"],
    )
    .await;
    assert_eq!(stdout(&output).lines().count(), 3, "{}", describe(&output));
    let output = cli(url, &["media", "cancel", "media_job_nope"]).await;
    assert_eq!(code(&output), 4, "{}", describe(&output));
    let output = cli(url, &["media", "show", &id, "--output", "json"]).await;
    let made = support::record::<MediaJobRecord>(&json_of(&output)).artifact_ids;
    let output = cli(url, &["media", "artifacts", &id, "--output", "json"]).await;
    let artifacts = json_of(&output);
    let image = artifacts["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["content_type"] == "image/png")
        .unwrap_or_else(|| panic!("an image: {artifacts}"));
    let output = cli(
        url,
        &["media", "content", &id, image["id"].as_str().unwrap()],
    )
    .await;
    assert_eq!(code(&output), 0, "{}", describe(&output));
    assert_eq!(output.stdout, b"\x89PNG\r\n\x1a\n");
    let output = cli(url, &["media", "artifacts", &id, "-q"]).await;
    let listed: Vec<String> = stdout(&output).lines().map(String::from).collect();
    assert!(
        !made.is_empty() && listed == made,
        "{made:?}: {}",
        describe(&output)
    );
}

#[tokio::test]
async fn the_runtime_token_is_sent_when_given() {
    const TOKEN: &str = "cli-test-runtime-token-0123456789";
    let db = support::fresh_database().await;
    let dir = tempfile::tempdir().unwrap();
    let env = [("KEEL_RUNTIME_TOKEN", TOKEN)];
    let api = support::spawn_api_with_env(&db, dir.path(), "api", &env).await;
    let url = &api.client.as_ref().unwrap().base;
    let output = cli(url, &["tasks", "list"]).await;
    assert_eq!(code(&output), 4, "{}", describe(&output));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("(unauthorized, HTTP 401"),
        "{}",
        describe(&output)
    );
    let output = cli(url, &["tasks", "list", "--token", TOKEN]).await;
    assert_eq!(code(&output), 0, "{}", describe(&output));
}

#[tokio::test]
async fn server_settings_belong_to_the_server_roles_not_to_operator_help() {
    // No API needed: help is printed before anything is reached.
    let output = cli("http://127.0.0.1:9", &["tasks", "list", "--help"]).await;
    assert_eq!(code(&output), 0, "{}", describe(&output));
    let help = stdout(&output);
    for server in ["--database-url", "--approval-policies"] {
        assert!(!help.contains(server), "{server} in: {help}");
    }
    // `--data-dir` is both: where a local `keel serve` keeps its token, which an operator
    // command reads.
    for operator in ["--url", "--token", "--data-dir", "--output", "--status"] {
        assert!(help.contains(operator), "{operator} missing: {help}");
    }
    let output = cli("http://127.0.0.1:9", &["serve", "--help"]).await;
    assert_eq!(code(&output), 0, "{}", describe(&output));
    let help = stdout(&output);
    assert!(
        help.contains("--database-url") && help.contains("--approval-policies"),
        "{help}"
    );

    // After the role's name they work; before it they are no longer options of `keel`.
    let db = support::fresh_database().await;
    let output = cli("", &["migrate", "--database-url", &db]).await;
    assert_eq!(code(&output), 0, "{}", describe(&output));
    assert_eq!(stdout(&output), "migrations applied\n");
    let output = cli("", &["--database-url", &db, "migrate"]).await;
    assert_eq!(code(&output), 4, "{}", describe(&output));
}

#[tokio::test]
async fn a_database_error_is_said_once_with_its_cause() {
    // A database the server does not have: refused at once (no retrying), its reason said
    // once, where the pool's timeout used to hide it or sqlx's message repeated it.
    let db = support::fresh_database().await;
    let (base, _) = db.rsplit_once('/').unwrap();
    let missing = format!("{base}/keel_no_such_database");
    let output = cli("", &["migrate", "--database-url", &missing]).await;
    assert_eq!(code(&output), 1, "{}", describe(&output));
    let stderr = String::from_utf8_lossy(&output.stderr);
    let reason = "database \"keel_no_such_database\" does not exist";
    assert_eq!(stderr.matches(reason).count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("keel: connecting to PostgreSQL: "),
        "{stderr}"
    );
}

/// The JSON a `--output json` command printed.
fn json_of(output: &Output) -> Value {
    serde_json::from_slice(&output.stdout).unwrap_or_else(|e| panic!("{e}: {}", describe(output)))
}

#[tokio::test]
async fn an_external_work_source_is_created_polled_listed_and_deleted() {
    let github = wiremock::MockServer::start().await;
    let issues = json!([tracker::github_issue(1, "open")]);
    tracker::list("issues", issues, "\"i1\"")
        .mount(&github)
        .await;
    tracker::list("pulls", json!([]), "\"p1\"")
        .mount(&github)
        .await;
    let dir = tempfile::tempdir().unwrap();
    let db = support::fresh_database().await;
    let api = support::spawn_api_with_env(&db, dir.path(), "api", &[tracker::TOKEN_ENV]).await;
    let url = &api.client.as_ref().unwrap().base;
    let workflow = dir.path().join("WORKFLOW.md");
    let text = format!(
        "---\ntracker:\n  kind: github\n  endpoint: {}\n  repository: acme/widgets\n  \
         api_key: $ACME_GITHUB_TOKEN\ntask:\n  execution_kind: shell\n  \
         shell_command: echo imported\n---\nWork on {{{{ issue.identifier }}}}\n",
        github.uri()
    );
    std::fs::write(&workflow, text).unwrap();

    let file = workflow.to_str().unwrap();
    let output = cli(
        url,
        &[
            "external-work",
            "sources",
            "create",
            "--quiet",
            "--file",
            file,
        ],
    )
    .await;
    assert_eq!(code(&output), 0, "{}", describe(&output));
    let id = stdout(&output).trim().to_string();
    assert!(
        id.starts_with("extsrc_") || !id.is_empty(),
        "{}",
        describe(&output)
    );

    let output = cli(url, &["external-work", "sources", "list"]).await;
    assert!(stdout(&output).contains(&id), "{}", describe(&output));
    let args = ["--output", "json", "external-work", "sources", "show", &id];
    let shown: SourceRecord = support::record(&json_of(&cli(url, &args).await));
    assert_eq!(shown.id, id);

    let args = ["--output", "json", "external-work", "sources", "poll", &id];
    let output = cli(url, &args).await;
    assert_eq!(code(&output), 0, "{}", describe(&output));
    let summary: PollSummary = support::record(&json_of(&output));
    assert_eq!(summary.candidates, 1, "{}", describe(&output));

    let args = ["--output", "json", "external-work", "items", "list", &id];
    let items = json_of(&cli(url, &args).await);
    let listed = support::page::<ItemRecord>(&items).data;
    assert_eq!(listed[0].identifier, "acme/widgets#1", "{items}");
    // The token reached GitHub only: never the CLI's output.
    assert!(!items.to_string().contains(tracker::CANARY));
    let args = [
        "--output",
        "json",
        "external-work",
        "items",
        "show",
        &listed[0].id,
    ];
    let shown = json_of(&cli(url, &args).await);
    assert_eq!(shown["data"], items["data"][0], "{shown}");

    let args = [
        "--output",
        "json",
        "external-work",
        "sources",
        "status",
        &id,
    ];
    let status = json_of(&cli(url, &args).await);
    assert_eq!(status["data"]["source_id"], id.as_str(), "{status}");
    assert_eq!(status["data"]["workflow"]["valid"], true, "{status}");
    let background = ["external-work", "sources", "background", &id, "--enabled"];
    let args = [&background[..], &["false", "--output", "json"]].concat();
    let source: SourceRecord = support::record(&json_of(&cli(url, &args).await));
    assert!(!source.background_enabled, "{source:?}");
    let args = [
        "--output",
        "json",
        "external-work",
        "sources",
        "reconcile",
        &id,
    ];
    let output = cli(url, &args).await;
    assert_eq!(code(&output), 0, "{}", describe(&output));
    let _: PollSummary = support::record(&json_of(&output));

    let payload = dir.path().join("issue-2.json");
    std::fs::write(&payload, tracker::github_issue(2, "open").to_string()).unwrap();
    let payload = payload.to_str().unwrap();
    let import = [
        "external-work",
        "import",
        "--source",
        &id,
        "--payload",
        payload,
    ];
    let output = cli(url, &[&import[..], &["--output", "json"]].concat()).await;
    assert_eq!(code(&output), 0, "{}", describe(&output));
    let imported = json_of(&output);
    assert_eq!(
        imported["data"]["item"]["identifier"], "acme/widgets#2",
        "{imported}"
    );
    assert_eq!(imported["data"]["duplicate"], false, "{imported}");

    let item = &listed[0].id;
    let propose = [
        "external-work",
        "actions",
        "propose",
        item,
        "--kind",
        "comment",
        "--body",
        "Looking.",
        "--output",
        "json",
    ];
    let output = cli(url, &propose).await;
    assert_eq!(code(&output), 0, "{}", describe(&output));
    let proposed = json_of(&output);
    let action = proposed["data"]["action"]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let output = cli(url, &["external-work", "actions", "list", item, "-q"]).await;
    assert_eq!(
        stdout(&output),
        format!("{action}\n"),
        "{}",
        describe(&output)
    );
    let args = [
        "--output",
        "json",
        "external-work",
        "actions",
        "show",
        &action,
    ];
    let shown = json_of(&cli(url, &args).await);
    assert_eq!(shown["data"], proposed["data"]["action"], "{shown}");

    let output = cli(url, &["external-work", "sources", "delete", &id]).await;
    assert_eq!(code(&output), 0, "{}", describe(&output));
    let output = cli(url, &["external-work", "sources", "show", &id]).await;
    assert_eq!(code(&output), 4, "{}", describe(&output));
}

#[tokio::test]
async fn providers_create_then_show_names_the_secret_by_reference_only() {
    const KEY: (&str, &str) = ("RELAY_CLI_TEST_API_KEY", "sk-cli-canary-81f3");
    let dir = tempfile::tempdir().unwrap();
    let db = support::fresh_database().await;
    let api = support::spawn_api_with_env(&db, dir.path(), "api", &[KEY]).await;
    let url = &api.client.as_ref().unwrap().base;
    let args = [
        "providers",
        "create",
        "--quiet",
        "--kind",
        "openai-compatible",
        "--provider-id",
        "relay",
        "--model",
        "dpv4",
        "--api",
        "openai-completions",
        "--base-url",
        "http://127.0.0.1:8317/v1",
        "--api-key-ref",
        "env:RELAY_CLI_TEST_API_KEY",
        "--capability",
        "chat",
        "--input",
        "text",
    ];
    let output = cli(url, &args).await;
    assert_eq!(code(&output), 0, "{}", describe(&output));
    let id = stdout(&output).trim().to_string();

    for format in ["table", "json"] {
        let output = cli(url, &["--output", format, "providers", "show", &id]).await;
        assert_eq!(code(&output), 0, "{}", describe(&output));
        let text = stdout(&output);
        assert!(
            text.contains("env:RELAY_CLI_TEST_API_KEY") && text.contains("dpv4"),
            "{text}"
        );
        assert!(
            !text.contains(KEY.1),
            "the secret's value was printed: {text}"
        );
    }

    let update = [
        "providers",
        "update",
        &id,
        "--model",
        "dpv5",
        "--no-api-key-ref",
        "--output",
        "json",
    ];
    let output = cli(url, &update).await;
    assert_eq!(code(&output), 0, "{}", describe(&output));
    let updated: ProviderView = support::record(&json_of(&output));
    assert_eq!(updated.model, "dpv5");
    assert_eq!(updated.api_key_ref, None, "{updated:?}");
    assert_eq!(
        updated.base_url, "http://127.0.0.1:8317/v1",
        "the others stay"
    );
    let output = cli(url, &["providers", "delete", &id]).await;
    assert_eq!(code(&output), 0, "{}", describe(&output));
    let output = cli(url, &["providers", "show", &id]).await;
    assert_eq!(code(&output), 4, "{}", describe(&output));
}
