//! The run sandbox with real `keel api` and `keel worker` processes: a run sees none of the
//! worker's environment but its allowlist, nothing a run started outlives it (whatever the
//! way it ends, even when its worker lost the lease), run timeouts have a default and a
//! maximum, a run's network is its own (the host reached only through the egress proxy),
//! and the sandbox flags cut a run off the network or make its workspace read-only.

use crate::support;

use std::net::TcpListener;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use crate::support::{Client, KeelProcess, spawn_api_with_env, spawn_worker_with_env, wait_for};
use keel_client::{RunRecord, RunStatus, TaskDraft};
use reqwest::StatusCode;
use serde_json::json;

const SOON: Duration = Duration::from_secs(30);

/// Worker variables no run may see.
const CANARIES: [(&str, &str); 4] = [
    ("KEEL_CANARY_SECRET", "canary-keel-secret"),
    ("DATABASE_URL", "postgres://canary-database-url"),
    ("AWS_SECRET_ACCESS_KEY", "canary-aws-secret"),
    ("OTEL_EXPORTER_OTLP_HEADERS", "authorization=canary-otlp"),
];

struct Stack {
    client: Client,
    _api: KeelProcess,
    _worker: KeelProcess,
    _dir: tempfile::TempDir,
}

async fn stack(api_env: &[(&str, &str)]) -> Stack {
    stack_with(api_env, &[]).await
}

/// [`stack`] with `worker_env` added to the worker's variables.
async fn stack_with(api_env: &[(&str, &str)], extra_worker_env: &[(&str, &str)]) -> Stack {
    let db = support::fresh_database().await;
    let dir = tempfile::tempdir().unwrap();
    let api = spawn_api_with_env(&db, dir.path(), "api", api_env).await;
    let mut worker_env = CANARIES.to_vec();
    worker_env.push(("KEEL_RUN_ENV_PASSTHROUGH", "SANDBOX_PASSED,SANDBOX_UNSET"));
    worker_env.push(("SANDBOX_PASSED", "passed-through"));
    worker_env.extend(extra_worker_env);
    let worker = spawn_worker_with_env(
        &db,
        dir.path(),
        "worker",
        30_000,
        &dir.path().join("data"),
        &worker_env,
    );
    Stack {
        client: api.client.clone().unwrap(),
        _api: api,
        _worker: worker,
        _dir: dir,
    }
}

#[tokio::test]
async fn a_run_sees_only_its_allowlisted_environment() {
    let s = stack(&[]).await;
    let (task_id, run_id) = s
        .client
        .start_task(&TaskDraft {
            prompt: Some("work-on-the-prompt".into()),
            ..support::shell("env; pwd")
        })
        .await;
    let run = s.client.wait_terminal(&task_id, &run_id, SOON).await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    let out = s.client.stdout(&task_id, &run_id).await;
    let vars: Vec<(&str, &str)> = out.lines().filter_map(|l| l.split_once('=')).collect();
    let names: Vec<&str> = vars.iter().map(|(name, _)| *name).collect();
    for (name, value) in CANARIES {
        assert!(
            !out.contains(value),
            "{name}'s value reached the run: {out}"
        );
    }
    assert!(!names.contains(&"KEEL_DATABASE_URL"), "{out}");
    assert!(
        !out.contains("postgres://"),
        "a database URL reached the run: {out}"
    );
    assert!(
        vars.contains(&("SANDBOX_PASSED", "passed-through")),
        "{out}"
    );
    assert!(vars.contains(&("KEEL_RUN_ID", run_id.as_str())), "{out}");
    assert!(vars.contains(&("KEEL_TASK_ID", task_id.as_str())), "{out}");
    // A task's prompt (external work renders one) reaches its shell run.
    assert!(
        vars.contains(&("KEEL_RUN_PROMPT", "work-on-the-prompt")),
        "{out}"
    );
    assert!(!names.contains(&"SANDBOX_UNSET"), "{out}");
    let workspace = out.lines().last().unwrap();
    let var = |name: &str| vars.iter().find(|(n, _)| *n == name).map(|(_, v)| *v);
    assert_eq!(
        var("HOME"),
        Some(format!("{workspace}/.keel/home").as_str())
    );
    assert_eq!(
        var("TMPDIR"),
        Some(format!("{workspace}/.keel/tmp").as_str())
    );
    let allowed = [
        "PATH",
        "LANG",
        "HOME",
        "TMPDIR",
        "KEEL_TASK_ID",
        "KEEL_RUN_ID",
        "KEEL_RUN_ATTEMPT",
        "KEEL_RUN_PROMPT",
        "KEEL_RUN_SANDBOX_ID",
        "SANDBOX_PASSED",
        // The egress proxy, on the run's own loopback.
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "http_proxy",
        "https_proxy",
        "ALL_PROXY",
        "all_proxy",
        "NO_PROXY",
        "no_proxy",
        // git's ssh, through the proxy's tunnel.
        "GIT_SSH_COMMAND",
        "KEEL_SSH_PROXY_COMMAND",
        // What `sh` itself sets.
        "PWD",
        "OLDPWD",
        "SHLVL",
        "_",
    ];
    for name in &names {
        assert!(allowed.contains(name), "{name} reached the run: {out}");
    }
}

#[tokio::test]
async fn a_worker_refuses_to_pass_keel_s_own_variables() {
    let db = support::fresh_database().await;
    let dir = tempfile::tempdir().unwrap();
    let mut worker = spawn_worker_with_env(
        &db,
        dir.path(),
        "worker",
        30_000,
        &dir.path().join("data"),
        &[("KEEL_RUN_ENV_PASSTHROUGH", "HTTP_PROXY,KEEL_DATABASE_URL")],
    );
    let status = worker.wait_exit(SOON);
    assert!(!status.success());
    let log = worker.log_text();
    assert!(
        log.contains("KEEL_DATABASE_URL is one of Keel's own settings"),
        "{log}"
    );
}

#[tokio::test]
async fn timeouts_have_a_default_and_a_maximum() {
    let s = stack(&[
        ("KEEL_RUN_TIMEOUT_MS", "120000"),
        ("KEEL_RUN_TIMEOUT_MAX_MS", "600000"),
    ])
    .await;
    let task = s.client.create_task(&support::shell("true")).await;
    assert_eq!(task.timeout_ms, Some(120_000), "{task:?}");
    let task = s
        .client
        .create_task(&TaskDraft {
            timeout_ms: Some(600_000),
            ..support::shell("true")
        })
        .await;
    assert_eq!(task.timeout_ms, Some(600_000), "{task:?}");
    let (status, body) = s
        .client
        .post(
            "/v1/tasks",
            json!({ "execution_kind": "shell", "shell_command": "true", "timeout_ms": 600_001 }),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["type"], "invalid_request", "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("timeout_ms"), "{body}");
}

/// A marker no other process on the machine has in its command line.
fn marker() -> String {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    format!(
        "1000.{}{:03}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// Live processes whose command line holds `marker`.
fn processes_with(marker: &str) -> Vec<i32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|cmdline| {
                cmdline
                    .windows(marker.len())
                    .any(|window| window == marker.as_bytes())
            })
        })
        .collect()
}

/// Ways a run's process tries to outlive it; `{m}` is the marker, and the escaped process
/// touches `ready` once it runs.
const ESCAPES: [(&str, &str); 5] = [
    ("setsid", "setsid sh -c 'touch ready; exec sleep {m}' &"),
    ("double fork", "(sh -c 'touch ready; exec sleep {m}' &) &"),
    ("nohup", "nohup sh -c 'touch ready; exec sleep {m}' &"),
    (
        "ignores SIGTERM",
        "sh -c 'trap \"\" TERM; touch ready; exec sleep {m}' &",
    ),
    // Out of the run's cgroup into the root one, wherever the host mounts cgroup2: the run
    // has no /sys, and its uid owns no cgroup.
    (
        "joins the root cgroup",
        "sh -c 'for f in /sys/fs/cgroup/cgroup.procs /sys/fs/cgroup/unified/cgroup.procs; \
         do echo $$ > $f; done 2>/dev/null; touch ready; exec sleep {m}' &",
    ),
];

#[derive(Debug, Clone, Copy)]
enum Ending {
    Completion,
    Timeout,
    Cancel,
}

/// Starts a run that leaves an escaped process behind and ends it the given way; returns
/// the marker once the run has ended.
async fn escape_and_end(client: &Client, escape: &str, ending: Ending) -> String {
    let m = marker();
    let wait_ready = "until [ -e ready ]; do sleep 0.05; done";
    let tail = match ending {
        Ending::Completion => "echo done".to_string(),
        Ending::Timeout | Ending::Cancel => format!("exec sleep {m}"),
    };
    let command = format!("{}\n{wait_ready}\n{tail}", escape.replace("{m}", &m));
    let mut draft = support::shell(&command);
    if let Ending::Timeout = ending {
        draft.timeout_ms = Some(1_500);
    }
    let (task_id, run_id) = client.start_task(&draft).await;
    if let Ending::Cancel = ending {
        wait_for(SOON, "the escaped process to run", || async {
            (!processes_with(&m).is_empty()).then_some(())
        })
        .await;
        client.api.cancel_run(&task_id, &run_id).await.unwrap();
    }
    let run = client.wait_terminal(&task_id, &run_id, SOON).await;
    let expected = match ending {
        Ending::Completion => RunStatus::Completed,
        Ending::Timeout => RunStatus::Failed,
        Ending::Cancel => RunStatus::Cancelled,
    };
    assert_eq!(run.status, expected, "{ending:?}: {run:?}");
    if let Ending::Timeout = ending {
        let error = run.last_error.as_deref().unwrap_or_default();
        assert!(error.contains("timed out"), "{run:?}");
    }
    m
}

#[tokio::test]
async fn no_process_outlives_its_run() {
    let s = stack(&[]).await;
    let runs = ESCAPES.iter().flat_map(|(name, escape)| {
        [Ending::Completion, Ending::Timeout, Ending::Cancel]
            .into_iter()
            .map(move |ending| (*name, *escape, ending))
    });
    let ended = futures_util::future::join_all(runs.map(|(name, escape, ending)| {
        let client = s.client.clone();
        async move {
            let m = escape_and_end(&client, escape, ending).await;
            (name, ending, m)
        }
    }))
    .await;
    // The cgroup (or sweep) kills before the run is recorded as ended; the wait only
    // covers the kernel tearing the processes down.
    for (name, ending, m) in ended {
        wait_for(
            Duration::from_secs(10),
            &format!("{name} processes to be gone after {ending:?}"),
            || async { processes_with(&m).is_empty().then_some(()) },
        )
        .await;
    }
}

/// Whether the listener has a connection waiting (accepted and dropped if so).
fn connected(listener: &TcpListener) -> bool {
    match listener.accept() {
        Ok(_) => true,
        Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => false,
        Err(error) => panic!("accept failed: {error}"),
    }
}

/// A one-line HTTP server at `host` that answers every request with `body`; its port.
fn answering(host: &str, body: &'static str) -> u16 {
    let listener = TcpListener::bind((host, 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            use std::io::{BufRead, Write};
            let mut reader = std::io::BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 2) {
                line.clear();
            }
            let response = format!(
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = stream.write_all(response.as_bytes());
        }
    });
    port
}

/// A run's network is its own: the host's loopback is out of reach directly, and through
/// the egress proxy only a host the deployment lists is reached; the refusal is recorded
/// in the run's `egress` step. Without network there is no proxy at all.
#[tokio::test]
async fn a_run_reaches_the_host_only_through_its_proxy_and_only_where_allowed() {
    let listed = answering("127.0.0.1", "the-listed-host-answered");
    let forbidden = TcpListener::bind("127.0.0.1:0").unwrap();
    forbidden.set_nonblocking(true).unwrap();
    let unlisted = forbidden.local_addr().unwrap().port();
    let allow = format!("127.0.0.1:{listed}");
    let s = stack_with(&[], &[("KEEL_SANDBOX_EGRESS_ALLOW", &allow)]).await;
    // `--noproxy ''`: a run's NO_PROXY keeps 127.0.0.1 for its own loopback.
    let command = format!(
        "bash -c 'exec 3<>/dev/tcp/127.0.0.1/{unlisted}' 2>/dev/null && echo direct-connected; \
         curl -sS --noproxy '' http://127.0.0.1:{unlisted}/ 2>&1; echo; \
         curl -sS --noproxy '' http://127.0.0.1:{listed}/ 2>&1; echo"
    );
    let run_with = |network: bool| {
        let draft = TaskDraft {
            sandbox_network: Some(network),
            ..support::shell(&command)
        };
        let client = s.client.clone();
        async move {
            let (task_id, run_id) = client.start_task(&draft).await;
            let run = client.wait_terminal(&task_id, &run_id, SOON).await;
            assert_eq!(run.status, RunStatus::Completed, "{run:?}");
            let out = client.stdout(&task_id, &run_id).await;
            (out, client.egress(&task_id, &run_id).await)
        }
    };

    let (out, egress) = run_with(true).await;
    assert!(!out.contains("direct-connected"), "{out}");
    assert!(out.contains("the-listed-host-answered"), "{out}");
    assert!(out.contains("127.0.0.1 is not a public address"), "{out}");
    assert!(!connected(&forbidden), "the unlisted listener was reached");
    let egress = egress.expect("an egress step");
    assert_eq!(
        (&egress["connections"], &egress["refused"]),
        (&json!(1), &json!(1)),
        "{egress}"
    );
    let refusal = &egress["refusals"][0];
    assert_eq!(
        refusal["destination"],
        format!("127.0.0.1:{unlisted}"),
        "{egress}"
    );
    assert!(egress["bytes_received"].as_u64().unwrap() > 0, "{egress}");

    let (out, egress) = run_with(false).await;
    assert!(!out.contains("direct-connected"), "{out}");
    assert!(
        !out.contains("answered") && !out.contains("not a public"),
        "{out}"
    );
    assert!(egress.is_none(), "{egress:?}");
    assert!(
        !connected(&forbidden),
        "a run without network reached the host"
    );
}

/// A TCP server at `host` that greets each connection as an SSH server does and sends on
/// the first line the client answers with (its own greeting); its port.
fn ssh_greeter(host: &str) -> (u16, std::sync::mpsc::Receiver<String>) {
    let listener = TcpListener::bind((host, 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    let (greetings, received) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().flatten() {
            use std::io::{BufRead, Write};
            let _ = stream.write_all(b"SSH-2.0-KeelTestServer\r\n");
            let mut line = String::new();
            let _ = std::io::BufReader::new(&stream).read_line(&mut line);
            let _ = greetings.send(line);
        }
    });
    (port, received)
}

/// git's ssh reaches a listed host through the egress proxy's tunnel (ssh speaks no HTTP:
/// the run's `GIT_SSH_COMMAND` names the shim as its `ProxyCommand`), and an unlisted one
/// is refused with the proxy's reason.
#[tokio::test]
async fn git_over_ssh_reaches_out_through_the_proxy() {
    let (listed, greetings) = ssh_greeter(support::RUNS_TEST_HOST);
    let unlisted = support::free_port();
    let s = stack(&[]).await;
    let command = format!(
        "git ls-remote ssh://git@{host}:{listed}/r.git 2>&1; \
         git ls-remote ssh://git@127.0.0.1:{unlisted}/r.git 2>&1; true",
        host = support::RUNS_TEST_HOST
    );
    let (task_id, run_id) = s.client.start_task(&support::shell(&command)).await;
    let run = s.client.wait_terminal(&task_id, &run_id, SOON).await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    let out = s.client.stdout(&task_id, &run_id).await;
    let greeting = greetings
        .recv_timeout(SOON)
        .unwrap_or_else(|_| panic!("ssh never greeted the listed host: {out}"));
    assert!(greeting.starts_with("SSH-2.0-OpenSSH"), "{greeting:?}");
    assert!(
        out.contains(&format!("refused 127.0.0.1:{unlisted}")),
        "{out}"
    );
    let egress = s
        .client
        .egress(&task_id, &run_id)
        .await
        .expect("an egress step");
    assert_eq!(
        (&egress["connections"], &egress["refused"]),
        (&json!(1), &json!(1)),
        "{egress}"
    );
}

#[tokio::test]
async fn a_read_only_workspace_refuses_writes() {
    let s = stack(&[]).await;
    let (task_id, run_id) = s
        .client
        .start_task(&TaskDraft {
            sandbox_read_only: Some(true),
            ..support::shell("pwd; touch \"$PWD/x\"")
        })
        .await;
    let run = s.client.wait_terminal(&task_id, &run_id, SOON).await;
    assert_eq!(run.status, RunStatus::Failed, "{run:?}");
    let error = run.last_error.as_deref().unwrap_or_default();
    assert!(error.contains("Read-only file system"), "{run:?}");
    let out = s.client.stdout(&task_id, &run_id).await;
    let workspace = std::path::Path::new(out.trim());
    assert!(workspace.is_dir(), "{out}");
    assert!(!workspace.join("x").exists(), "the run wrote its workspace");

    let (status, body) = s
        .client
        .post(
            "/v1/tasks",
            json!({
                "execution_kind": "file", "file_path": "a.txt", "file_operation": "write",
                "file_content": "x", "sandbox_read_only": true
            }),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("sandbox_read_only"), "{body}");
}

#[tokio::test]
async fn a_worker_that_lost_its_lease_kills_its_run_s_processes() {
    let db = support::fresh_database().await;
    let dir = tempfile::tempdir().unwrap();
    let api = spawn_api_with_env(&db, dir.path(), "api", &[]).await;
    let client = api.client.clone().unwrap();
    let worker = |name: &str| {
        let data = dir.path().join(name);
        spawn_worker_with_env(&db, dir.path(), name, 1_500, &data, &[])
    };
    // Dropping it SIGKILLs it, stopped or not.
    let first = worker("first");
    let m = marker();
    // Each attempt's escaped process carries its attempt number, so the takeover's own
    // does not count against the first.
    let command = format!("setsid sleep {m}$KEEL_RUN_ATTEMPT &\nsleep 1000");
    let (task_id, run_id) = client.run_shell(&command).await;
    let stray = format!("{m}1");
    wait_for(SOON, "the first attempt's escaped process", || async {
        (!processes_with(&stray).is_empty()).then_some(())
    })
    .await;

    first.signal(nix::sys::signal::Signal::SIGSTOP);
    let _second = worker("second");
    wait_for(SOON, "a second worker to take the run over", || async {
        let run = client.run(&task_id, &run_id).await;
        (run.attempt >= 2).then_some(())
    })
    .await;
    first.signal(nix::sys::signal::Signal::SIGCONT);
    wait_for(
        Duration::from_secs(15),
        "the first worker to kill its lost run's processes",
        || async { processes_with(&stray).is_empty().then_some(()) },
    )
    .await;
    // The takeover's processes go with its run.
    client.api.cancel_run(&task_id, &run_id).await.unwrap();
    client.wait_terminal(&task_id, &run_id, SOON).await;
}

#[tokio::test]
async fn network_egress_gates_only_tasks_with_network() {
    let s = stack(&[("KEEL_APPROVAL_POLICIES", "network_egress")]).await;
    // Any shell command with network can reach out; without, it runs ungated.
    let shell = |network: bool| TaskDraft {
        sandbox_network: Some(network),
        ..support::shell("true")
    };
    let task = s.client.create_task(&shell(true)).await;
    let run = s.client.start(&task.id).await;
    assert_eq!(run.status, RunStatus::AwaitingApproval, "{run:?}");
    let (task_id, run_id) = s.client.start_task(&shell(false)).await;
    let run = s.client.wait_terminal(&task_id, &run_id, SOON).await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");

    let fetch = |network: bool| TaskDraft {
        execution_kind: Some("git".into()),
        git_command: Some("fetch https://example.com/r.git".into()),
        sandbox_network: Some(network),
        ..TaskDraft::default()
    };
    let task = s.client.create_task(&fetch(true)).await;
    let (status, run) = s
        .client
        .post(&format!("/v1/tasks/{}/start", task.id), json!({}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{run}");
    assert_eq!(
        support::record::<RunRecord>(&run).status,
        RunStatus::AwaitingApproval,
        "{run}"
    );

    let (task_id, run_id) = s.client.start_task(&fetch(false)).await;
    // Queued without an approval; the fetch then fails for want of a network.
    let run = s.client.wait_terminal(&task_id, &run_id, SOON).await;
    assert_eq!(run.status, RunStatus::Failed, "{run:?}");
    let error = run.last_error.as_deref().unwrap_or_default();
    assert!(!error.contains("sandbox_unavailable"), "{run:?}");
}
