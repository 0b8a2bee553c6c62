//! MCP servers of agent loop tasks, against real servers no one here wrote, installed by
//! `scripts/mcp-servers` (mcp-server-time and mcp-server-git from PyPI,
//! @modelcontextprotocol/server-everything from npm): their tools join the model's catalog
//! as `mcp__<server>__<tool>`, calls reach them from inside the run's sandbox, and a server
//! that fails, a slow tool or an error is a tool result the model reads. A stdio server is
//! a program the task names: its start waits for the approval a shell command needs, and an
//! attempt's servers start at once under one deadline (shown with stand-ins: a shell that
//! leaves a marker, and programs that never answer).

use crate::agent_loop::{Stack, agent, output};
use crate::repo_workspaces;
use crate::support;
use crate::support::llm::Turn;

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use keel_client::{
    ApprovalPolicyRequest, EventType, GateDecision, GateDecisions, McpServer, RunStatus,
    StepStatus, TaskDraft,
};
use reqwest::StatusCode;
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);
/// The secret the everything server gets in its environment (`env:MCP_TEST_TOKEN`).
const TOKEN: &str = "mcp-test-token-4b1d";

/// Where `scripts/mcp-servers` installed the servers, which it does (once per test run, a
/// no-op when they are there) so that `cargo test` needs nothing run before it.
fn servers_dir() -> PathBuf {
    static INSTALLED: OnceLock<PathBuf> = OnceLock::new();
    INSTALLED
        .get_or_init(|| {
            let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
            let status = std::process::Command::new(root.join("scripts/mcp-servers"))
                .status()
                .expect("running scripts/mcp-servers");
            assert!(
                status.success(),
                "scripts/mcp-servers could not install the MCP servers the tests reach \
                 (python3 -m venv, pip and npm with their registries)"
            );
            root.join("target/mcp-servers")
        })
        .clone()
}

fn server(name: &str, command: PathBuf, args: &[&str]) -> McpServer {
    McpServer {
        name: name.into(),
        transport: None,
        command: Some(command.display().to_string()),
        args: args.iter().map(|a| a.to_string()).collect(),
        env: Default::default(),
        url: None,
        headers: Default::default(),
        approval_policy: None,
        tools: None,
    }
}

fn time() -> McpServer {
    server("time", servers_dir().join("venv/bin/mcp-server-time"), &[])
}

fn everything() -> McpServer {
    let dir = servers_dir().join("node/node_modules/@modelcontextprotocol/server-everything");
    let index = dir.join("dist/index.js").display().to_string();
    McpServer {
        env: [("SERVER_TOKEN".to_string(), "env:MCP_TEST_TOKEN".to_string())].into(),
        ..server("everything", "/usr/bin/node".into(), &[&index, "stdio"])
    }
}

/// A stack whose worker can read the installed servers from its sandbox and has the
/// secret the everything server is given.
async fn stack(script: Vec<Turn>, more: &[(&str, &str)]) -> Stack {
    stack_gating("none", script, more).await
}

/// [`stack`], with the approval policies `policies`.
async fn stack_gating(policies: &str, script: Vec<Turn>, more: &[(&str, &str)]) -> Stack {
    let servers = servers_dir().display().to_string();
    let mut env = vec![
        ("KEEL_SANDBOX_READ_ONLY_PATHS", servers.as_str()),
        ("MCP_TEST_TOKEN", TOKEN),
    ];
    env.extend_from_slice(more);
    Stack::start_with(policies, script, &env).await
}

/// The text of the tool result answering call `id` in a request's messages.
fn tool_result(request: &support::llm::Request, id: &str) -> String {
    let message = request
        .messages()
        .iter()
        .find(|m| m["role"] == "tool" && m["tool_call_id"] == id)
        .unwrap_or_else(|| panic!("no result for {id}: {:?}", request.messages()));
    message["content"].as_str().unwrap_or_default().to_string()
}

/// The tools a request offered the model, by name, with their parameters.
fn offered(request: &support::llm::Request) -> Vec<(String, Value)> {
    let tools = request.body["tools"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    tools
        .iter()
        .map(|t| {
            let function = &t["function"];
            let name = function["name"].as_str().unwrap_or_default().to_string();
            (name, function["parameters"].clone())
        })
        .collect()
}

#[tokio::test]
async fn an_agent_calls_the_tools_of_real_mcp_servers_from_its_sandbox() {
    let bare = repo_workspaces::repository();
    let base = repo_workspaces::serve(bare.path()).await;
    let big = "x".repeat(40_000);
    let script = vec![
        Turn::tool_call(
            "t1",
            "mcp__time__get_current_time",
            r#"{"timezone": "UTC"}"#,
        )
        .and_tool_call("t2", "mcp__everything__get-env", "{}")
        .and_tool_call("t3", "mcp__broken__anything", "{}")
        .and_tool_call("t4", "mcp__git__git_log", r#"{"repo_path": "."}"#),
        Turn::tool_call("t5", "mcp__everything__get-sum", r#"{"a": 2, "b": 3}"#)
            .and_tool_call(
                "t6",
                "mcp__everything__echo",
                &json!({ "message": big }).to_string(),
            )
            .and_tool_call("t7", "mcp__everything__get-sum", r#"{"a": "two"}"#)
            .and_tool_call("t8", "mcp__time__no_such_tool", "{}"),
        Turn::text("Done."),
    ];
    let stack = stack(script, &[]).await;
    let git = server(
        "git",
        servers_dir().join("venv/bin/mcp-server-git"),
        &["--repository", "."],
    );
    let broken = server("broken", "/nonexistent/mcp-server".into(), &[]);
    let draft = TaskDraft {
        repo: Some(format!("{base}/repo.git")),
        mcp_servers: Some(vec![time(), everything(), broken, git]),
        ..agent()
    };
    let (task_id, run_id) = stack.start_agent(draft).await;
    let run = stack.client.wait_terminal(&task_id, &run_id, WAIT).await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");

    // The catalog: the built-in tools, then each live server's, with its own schemas.
    let requests = stack.llm.requests();
    assert_eq!(requests.len(), 3);
    let tools = offered(&requests[0]);
    let schema = |name: &str| {
        let found = tools.iter().find(|(n, _)| n == name);
        found
            .unwrap_or_else(|| panic!("{name} not offered: {tools:?}"))
            .1
            .clone()
    };
    assert!(schema("mcp__time__get_current_time")["properties"]["timezone"].is_object());
    assert!(schema("mcp__everything__get-sum")["properties"]["a"].is_object());
    assert!(schema("mcp__git__git_log")["properties"]["repo_path"].is_object());
    assert!(tools.iter().any(|(n, _)| n == "read_file"));
    assert!(!tools.iter().any(|(n, _)| n.starts_with("mcp__broken__")));

    // What the servers answered.
    let now: Value = serde_json::from_str(&tool_result(&requests[1], "t1")).unwrap();
    assert_eq!(now["timezone"], "UTC", "{now}");
    let today = chrono::Utc::now().format("%Y-%m-%d").to_string();
    assert!(
        now["datetime"].as_str().unwrap().starts_with(&today),
        "{now}"
    );
    // The server's environment: the secret it was given, nothing of the worker's.
    let env = tool_result(&requests[1], "t2");
    assert!(
        env.contains(&format!("\"SERVER_TOKEN\": \"{TOKEN}\"")),
        "{env}"
    );
    for leaked in [
        "FAKE_LLM_API_KEY",
        "DATABASE_URL",
        "MCP_TEST_TOKEN",
        "KEEL_DATABASE",
    ] {
        assert!(!env.contains(leaked), "{leaked} reached the server: {env}");
    }
    let broken = tool_result(&requests[1], "t3");
    assert!(broken.contains("\"broken\" is not available"), "{broken}");
    assert!(broken.contains("/nonexistent/mcp-server"), "{broken}");
    let log = tool_result(&requests[1], "t4");
    assert!(log.contains("main"), "the clone's history: {log}");
    assert!(tool_result(&requests[2], "t5").contains('5'));
    let echoed = tool_result(&requests[2], "t6");
    assert!(
        echoed.len() < 20_000 && echoed.contains("truncated"),
        "{}",
        echoed.len()
    );
    let refused = tool_result(&requests[2], "t7");
    assert!(
        refused.to_lowercase().contains("error") || refused.contains("invalid"),
        "{refused}"
    );
    let unknown = tool_result(&requests[2], "t8");
    assert!(
        unknown.contains("offers this run no tool \"no_such_tool\""),
        "{unknown}"
    );

    // A step per server: the tools it offered, or why it offered none.
    let steps = stack.steps(&task_id, &run_id).await;
    let server_step = |name: &str| {
        let found = steps
            .iter()
            .find(|s| s.name == "mcp_server" && s.input["server"] == name);
        found.unwrap_or_else(|| panic!("no mcp_server step for {name}: {steps:?}"))
    };
    let time_step = server_step("time");
    assert_eq!(time_step.status, StepStatus::Completed);
    let listed = output(time_step)["tools"].to_string();
    assert!(listed.contains("mcp__time__get_current_time"), "{listed}");
    let everything_step = server_step("everything");
    assert_eq!(everything_step.input["env"], json!(["SERVER_TOKEN"]));
    assert!(!everything_step.input.to_string().contains(TOKEN));
    let broken_step = server_step("broken");
    assert_eq!(broken_step.status, StepStatus::Failed);
    let calls = steps.iter().filter(|s| s.name == "tool_call").count();
    assert_eq!(calls, 8, "each call's result persisted as a step");

    // The servers ended with the attempt.
    let entry = format!("SERVER_TOKEN={TOKEN}");
    support::wait_for(WAIT, "the servers to end with the attempt", || async {
        support::processes_with_env(&entry).is_empty().then_some(())
    })
    .await;
}

#[tokio::test]
async fn approval_policies_gate_or_hide_a_server_and_a_slow_tool_times_out() {
    let script = vec![
        Turn::tool_call(
            "t1",
            "mcp__time__get_current_time",
            r#"{"timezone": "UTC"}"#,
        )
        .and_tool_call(
            "t2",
            "mcp__everything__trigger-long-running-operation",
            r#"{"duration": 30, "steps": 3}"#,
        )
        .and_tool_call("t3", "mcp__hidden__echo", "{}"),
        Turn::text("Done."),
    ];
    let stack = stack(script, &[("KEEL_MCP_CALL_TIMEOUT_MS", "2000")]).await;
    let gated = McpServer {
        approval_policy: Some("require_approval".into()),
        tools: Some(vec!["get_current_time".into()]),
        ..time()
    };
    let hidden = McpServer {
        name: "hidden".into(),
        approval_policy: Some("block".into()),
        ..everything()
    };
    let draft = TaskDraft {
        mcp_servers: Some(vec![gated, everything(), hidden]),
        ..agent()
    };
    let (task_id, run_id) = stack.start_agent(draft).await;

    // The gated server's start waits for an operator (its command shown), and so does a call
    // of its tools; approving the call dispatches the bundle.
    let started = approve_the_start(&stack, &task_id).await;
    assert!(started.contains("mcp-server-time"), "{started}");
    let approval = stack.pending_approval(&task_id).await;
    let summary = approval.action_summary.join("\n");
    assert!(summary.contains("mcp__time__get_current_time"), "{summary}");
    stack.decide(&task_id, &approval, "approve").await;
    let run = stack.client.wait_terminal(&task_id, &run_id, WAIT).await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");

    let requests = stack.llm.requests();
    let tools: Vec<String> = offered(&requests[0]).into_iter().map(|(n, _)| n).collect();
    assert!(tools.contains(&"mcp__time__get_current_time".to_string()));
    assert!(
        !tools.contains(&"mcp__time__convert_time".to_string()),
        "the allowlist"
    );
    assert!(
        !tools.iter().any(|n| n.starts_with("mcp__hidden__")),
        "{tools:?}"
    );
    let last = requests.last().unwrap();
    assert!(tool_result(last, "t1").contains("UTC"));
    let slow = tool_result(last, "t2");
    assert!(slow.contains("did not answer within 2 s"), "{slow}");
    let blocked = tool_result(last, "t3");
    assert!(blocked.contains("approval_policy"), "{blocked}");
    // The refusal is the policy's: an event says which, naming the tool.
    let events = stack.client.events(&task_id, &run_id).await;
    let refusals: Vec<_> = events
        .iter()
        .filter(|e| e.event_type == EventType::PolicyToolBlocked)
        .map(|e| (e.data["policy"].clone(), e.data["tool"].clone()))
        .collect();
    assert_eq!(
        refusals,
        [(json!("mcp_server_blocked"), json!("mcp__hidden__echo"))]
    );
}

#[tokio::test]
async fn bad_mcp_servers_are_refused_at_creation() {
    let app = support::TestApp::api_only().await;
    let refused = |servers: Value| {
        let mut body = support::wire(&agent());
        body["mcp_servers"] = servers;
        body
    };
    let cases = [
        json!([{ "name": "Time", "command": "x" }]),
        json!([{ "name": "a", "command": "x", "url": "https://mcp.example.com" }]),
        json!([{ "name": "a", "transport": "http", "command": "x" }]),
        json!([{ "name": "a", "command": "x", "env": { "KEY": "sk-raw-key" } }]),
        json!([{ "name": "a", "command": "x", "env": { "KEY": "env:DATABASE_URL" } }]),
        json!([{ "name": "a", "url": "https://u:p@mcp.example.com" }]),
        json!([{ "name": "a", "command": "x", "approval_policy": "sometimes" }]),
        json!([{ "name": "a", "command": "x" }, { "name": "a", "command": "y" }]),
        json!(
            (0..9)
                .map(|i| json!({ "name": format!("s{i}"), "command": "x" }))
                .collect::<Vec<_>>()
        ),
    ];
    for servers in cases {
        let (status, body) = app.client.post("/v1/tasks", refused(servers.clone())).await;
        assert_eq!(
            status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{servers}: {body}"
        );
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(message.starts_with("mcp_servers: "), "{servers}: {body}");
    }
    let mut shell = support::wire(&support::shell("true"));
    shell["mcp_servers"] = json!([{ "name": "a", "command": "x" }]);
    let (status, body) = app.client.post("/v1/tasks", shell).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");

    // Stored as written, with the transport and policy filled in.
    let mut body = support::wire(&agent());
    body["mcp_servers"] = json!([{ "name": "time", "command": "mcp-server-time" }]);
    let (status, created) = app.client.post("/v1/tasks", body).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(
        created["data"]["mcp_servers"],
        json!([{ "name": "time", "transport": "stdio", "command": "mcp-server-time",
                 "approval_policy": "auto" }])
    );
}

/// server-everything speaking streamable HTTP on a free loopback port; killed when dropped.
async fn everything_over_http() -> (tokio::process::Child, String) {
    let port = support::free_port();
    let dir = servers_dir().join("node/node_modules/@modelcontextprotocol/server-everything");
    let child = tokio::process::Command::new("/usr/bin/node")
        .arg(dir.join("dist/index.js"))
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    support::wait_for(WAIT, "server-everything to listen", || async {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()
    })
    .await;
    (child, format!("http://127.0.0.1:{port}/mcp"))
}

#[tokio::test]
async fn a_streamable_http_server_is_reached_only_by_a_run_with_the_network() {
    let (_server, url) = everything_over_http().await;
    let script = vec![
        Turn::tool_call("t1", "mcp__remote__get-sum", r#"{"a": 40, "b": 2}"#),
        Turn::text("Done."),
        Turn::tool_call("t2", "mcp__remote__get-sum", r#"{"a": 1, "b": 1}"#),
        Turn::text("Done without it."),
    ];
    let stack = stack(script, &[]).await;
    let remote = McpServer {
        name: "remote".into(),
        command: None,
        args: Vec::new(),
        url: Some(url),
        headers: [(
            "Authorization".to_string(),
            "env:MCP_TEST_TOKEN".to_string(),
        )]
        .into(),
        ..time()
    };
    let draft = TaskDraft {
        mcp_servers: Some(vec![remote.clone()]),
        ..agent()
    };
    let (task_id, run_id) = stack.start_agent(draft).await;
    let run = stack.client.wait_terminal(&task_id, &run_id, WAIT).await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    let requests = stack.llm.requests();
    assert!(
        offered(&requests[0])
            .iter()
            .any(|(n, _)| n == "mcp__remote__echo")
    );
    let sum = tool_result(&requests[1], "t1");
    assert!(sum.contains("42"), "{sum}");
    let steps = stack.steps(&task_id, &run_id).await;
    let step = steps.iter().find(|s| s.name == "mcp_server").unwrap();
    assert_eq!(step.status, StepStatus::Completed, "{step:?}");
    assert_eq!(step.input["headers"], json!(["Authorization"]));
    assert!(!step.input.to_string().contains(TOKEN));

    // Without the network, the worker does not reach out for the run.
    let offline = TaskDraft {
        mcp_servers: Some(vec![remote]),
        sandbox_network: Some(false),
        ..agent()
    };
    let (task_id, run_id) = stack.start_agent(offline).await;
    let run = stack.client.wait_terminal(&task_id, &run_id, WAIT).await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    let steps = stack.steps(&task_id, &run_id).await;
    let step = steps.iter().find(|s| s.name == "mcp_server").unwrap();
    assert_eq!(step.status, StepStatus::Failed);
    let refused = tool_result(stack.llm.requests().last().unwrap(), "t2");
    assert!(refused.contains("no network"), "{refused}");
}

#[tokio::test]
async fn all_tools_gates_an_auto_servers_tools_too() {
    let script = vec![
        Turn::tool_call(
            "t1",
            "mcp__time__get_current_time",
            r#"{"timezone": "UTC"}"#,
        ),
        Turn::text("Done."),
    ];
    let stack = stack_gating("all_tools", script, &[]).await;
    let draft = TaskDraft {
        mcp_servers: Some(vec![time()]),
        ..agent()
    };
    let (task_id, run_id) = stack.start_agent(draft).await;
    approve_the_start(&stack, &task_id).await;
    let approval = stack.pending_approval(&task_id).await;
    let summary = approval.action_summary.join("\n");
    assert!(
        summary.starts_with("mcp__time__get_current_time"),
        "{summary}"
    );
    stack.decide(&task_id, &approval, "approve").await;
    let run = stack.client.wait_terminal(&task_id, &run_id, WAIT).await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
}

/// Approves every gate of the run's admission (its stdio servers' start: `shell_command`,
/// and `network_egress` where the policies ask for it); returns the summary they share.
async fn approve_the_start(stack: &Stack, task_id: &str) -> String {
    let pending = stack
        .client
        .api
        .list_task_approvals(task_id, Some("pending"));
    let gates = pending.await.unwrap().data;
    assert!(!gates.is_empty(), "the start waits for an operator");
    for gate in &gates {
        assert!(gate.step_id.is_none(), "an admission's gate: {gate:?}");
        stack.decide(task_id, gate, "approve").await;
    }
    gates[0].action_summary.join("\n")
}

/// A stdio "server" that only leaves `marker` in the run's workspace and exits: whether the
/// file is there tells whether the worker started the program.
fn marker_server(name: &str, marker: &str) -> McpServer {
    let script = format!("echo started > {marker}");
    server(name, "/bin/sh".into(), &["-c", &script])
}

/// Where `marker` was left, in whichever of the stack's workspaces.
fn markers(stack: &Stack, marker: &str) -> Vec<PathBuf> {
    support::files_named(&stack.data_dir(), marker)
}

/// A stdio server is a program the task names, started as a shell command is: under the
/// default policies (which gate `shell_exec`) the run waits for an operator before anything
/// of it starts, and the approval shows the command with its arguments. Approved, it starts.
#[tokio::test]
async fn a_stdio_server_waits_for_the_approval_of_its_command() {
    let script = vec![Turn::text("Done.")];
    let stack = Stack::start_with("shell_exec,git_exec,file_write", script, &[]).await;
    let draft = TaskDraft {
        mcp_servers: Some(vec![marker_server("probe", "probe-started")]),
        ..agent()
    };
    let (task_id, run_id) = stack.start_agent(draft).await;
    let run = stack.client.run(&task_id, &run_id).await;
    assert_eq!(run.status, RunStatus::AwaitingApproval, "{run:?}");
    let approval = stack.pending_approval(&task_id).await;
    assert_eq!(approval.kind, "shell_command", "{approval:?}");
    let summary = approval.action_summary.join("\n");
    assert!(
        summary.contains(
            "start the MCP server probe (stdio):\n  /bin/sh -c 'echo started > probe-started'"
        ),
        "{summary}"
    );
    // While it waits the run has no queue row: no worker can start anything of it.
    assert_eq!(stack.queue_rows(&run_id).await, 0);
    assert!(stack.steps(&task_id, &run_id).await.is_empty());
    assert!(stack.llm.requests().is_empty());
    assert!(markers(&stack, "probe-started").is_empty());

    stack.decide(&task_id, &approval, "approve").await;
    let run = stack.client.wait_terminal(&task_id, &run_id, WAIT).await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    assert_eq!(
        markers(&stack, "probe-started").len(),
        1,
        "started once approved"
    );
    let steps = stack.steps(&task_id, &run_id).await;
    let step = steps.iter().find(|s| s.name == "mcp_server").unwrap();
    assert_eq!(
        step.input["args"],
        json!(["-c", "echo started > probe-started"])
    );
    assert_eq!(step.status, StepStatus::Failed, "a marker is no MCP server");
}

/// Every gate allowed, the workspace's decision for one MCP server as given.
fn allowing_all_but(server: &str, decision: GateDecision) -> ApprovalPolicyRequest {
    let allow = GateDecision::Allow;
    ApprovalPolicyRequest {
        gates: GateDecisions {
            shell_exec: allow,
            git_exec: allow,
            file_write: allow,
            network_egress: allow,
            read_file: allow,
            all_tools: allow,
        },
        mcp_servers: [(server.to_string(), decision)].into(),
        allowed_write_paths: None,
    }
}

/// Where the policies gate nothing, a server's own `require_approval` gates its start, and
/// so does the workspace's `ask` for it by name; a start rejected never runs. A server its
/// `approval_policy` blocks never starts, so it needs no approval.
#[tokio::test]
async fn require_approval_and_the_workspaces_ask_gate_a_servers_start() {
    let stack = Stack::start_with("none", vec![Turn::text("Done.")], &[]).await;
    let gated = McpServer {
        approval_policy: Some("require_approval".into()),
        ..marker_server("probe", "gated-started")
    };
    let draft = |server: McpServer| TaskDraft {
        mcp_servers: Some(vec![server]),
        ..agent()
    };
    let (task_id, run_id) = stack.start_agent(draft(gated)).await;
    let run = stack.client.run(&task_id, &run_id).await;
    assert_eq!(run.status, RunStatus::AwaitingApproval, "{run:?}");
    let approval = stack.pending_approval(&task_id).await;
    assert_eq!(approval.kind, "shell_command", "{approval:?}");
    assert!(
        approval.action_summary.join("\n").contains("/bin/sh -c"),
        "{approval:?}"
    );
    stack.decide(&task_id, &approval, "reject").await;
    let run = stack.client.run(&task_id, &run_id).await;
    assert_eq!(run.status, RunStatus::Cancelled, "{run:?}");

    let policy = allowing_all_but("probe", GateDecision::Ask);
    stack
        .client
        .api
        .put_policy("default", &policy)
        .send()
        .await
        .unwrap();
    let (task_id, run_id) = stack
        .start_agent(draft(marker_server("probe", "asked-started")))
        .await;
    let run = stack.client.run(&task_id, &run_id).await;
    assert_eq!(run.status, RunStatus::AwaitingApproval, "{run:?}");

    let blocked = McpServer {
        approval_policy: Some("block".into()),
        ..marker_server("probe", "blocked-started")
    };
    let (task_id, run_id) = stack.start_agent(draft(blocked)).await;
    let run = stack.client.wait_terminal(&task_id, &run_id, WAIT).await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    for marker in ["gated-started", "asked-started", "blocked-started"] {
        assert!(markers(&stack, marker).is_empty(), "{marker}");
    }
}

/// The servers of an attempt connect at once, under one deadline
/// (`KEEL_MCP_CONNECT_TIMEOUT_MS`): four that never answer hold the run's worker slot for
/// one deadline, not four. Their steps overlap, and each ends at the deadline.
#[tokio::test]
async fn servers_connect_at_once_under_one_deadline() {
    let settings = [("KEEL_MCP_CONNECT_TIMEOUT_MS", "2000")];
    let stack = Stack::start_with("none", vec![Turn::text("Done.")], &settings).await;
    let silent = (0..4)
        .map(|i| server(&format!("silent{i}"), "/bin/sleep".into(), &["600"]))
        .collect();
    let draft = TaskDraft {
        mcp_servers: Some(silent),
        ..agent()
    };
    let (task_id, run_id) = stack.start_agent(draft).await;
    let run = stack.client.wait_terminal(&task_id, &run_id, WAIT).await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    // The attempt that ran to its end: the last four (an attempt whose lease was lost on
    // a loaded host left its own, failed as `worker disconnected`).
    let mut steps: Vec<_> = stack
        .steps(&task_id, &run_id)
        .await
        .into_iter()
        .filter(|s| s.name == "mcp_server")
        .collect();
    assert!(steps.len() >= 4, "{steps:?}");
    let steps = steps.split_off(steps.len() - 4);
    for step in &steps {
        assert_eq!(step.status, StepStatus::Failed, "{step:?}");
        let error = step.error.as_deref().unwrap_or_default();
        assert!(error.contains("within 2 s"), "{error}");
    }
    let last_start = steps.iter().map(|s| s.started_at).max().unwrap();
    let first_end = steps.iter().filter_map(|s| s.finished_at).min().unwrap();
    assert!(
        last_start < first_end,
        "every server started before any gave up: {steps:?}"
    );
}
