//! Roles, secret grants, provider hosts and tenant directories in remote mode, over real
//! HTTP against a `keel api` with two orgs (the header form, `X-Keel-Role` counted): one
//! test per attack a member (or an org's operator, on its own request or beyond its
//! grants) could try, each asserting the attack is refused and the victim's rows and files
//! are as they were. The runtime operator (`runtime_operator`) is the deployment's own.

use crate::support;
use crate::support::two_orgs;

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::support::llm::{FakeLlm, Turn};
use crate::support::{Client, KeelProcess};
use keel::artifacts::content::ContentStore;
use keel::domain::Scope;
use keel::events::Subject;
use keel::runs::patches;
use keel_client::{
    ActionStatus, ApprovalStatus, Imported, ItemRecord, ItemState, McpServer, MediaJobRecord,
    MediaJobStatus, Proposed, ProviderCheck, ProviderView, Resolution, RunStatus, SourceRecord,
    StepStatus, TaskDraft, WorkspaceLimits,
};
use keel_workers::agent::Patch;
use reqwest::StatusCode;
use serde_json::{Value, json};
use two_orgs::{REMOTE_ENV, member_client, operator_client, org_client, runtime_operator_client};

/// The operator's own secrets: in the API's environment, granted to no workspace.
const OPERATOR_KEY: &str = "sk-operator-openai-canary-7f3a";
const OPERATOR_GITHUB: &str = "ghp_operator_canary_51c2";
/// Org a's own key, granted to it.
const ORG_A_KEY: &str = "sk-org-a-granted-key-90d1";

/// An API in remote mode (shell runs wait for approval, no worker), org a granted
/// `env:ORG_A_API_KEY`, presets allowed to reach `listener` (127.0.0.1 on its port), and a
/// workspace root.
struct Stack {
    api: KeelProcess,
    base: String,
    root: PathBuf,
    db: String,
    env: Vec<(String, String)>,
    dir: tempfile::TempDir,
}

async fn stack(listener: &str) -> Stack {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("roots");
    std::fs::create_dir(&root).unwrap();
    let root = std::fs::canonicalize(root).unwrap();
    let port = reqwest::Url::parse(listener).unwrap().port().unwrap();
    let hosts = format!("127.0.0.1:{port}");
    let settings = [
        ("KEEL_APPROVAL_POLICIES", "shell_exec"),
        ("KEEL_SECRET_GRANTS", "org_a=env:ORG_A_API_KEY"),
        ("KEEL_PROVIDER_HOSTS", hosts.as_str()),
        ("KEEL_CHAT_ALLOW_PRIVATE_ADDRESSES", "true"),
        ("KEEL_WORKSPACE_ROOTS", root.to_str().unwrap()),
        ("OPENAI_API_KEY", OPERATOR_KEY),
        ("GITHUB_TOKEN", OPERATOR_GITHUB),
        ("ORG_A_API_KEY", ORG_A_KEY),
    ];
    let env = [REMOTE_ENV.as_slice(), &settings].concat();
    let db = support::fresh_database().await;
    let api = support::spawn_api_with_env(&db, dir.path(), "api", &env).await;
    let base = api.client.as_ref().unwrap().base.clone();
    let env = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Stack {
        api,
        base,
        root,
        db,
        env,
        dir,
    }
}

impl Stack {
    /// A worker with the API's settings: it runs the maintenance that removes terminal
    /// items' workspaces.
    fn spawn_worker(&self) -> KeelProcess {
        let env: Vec<(&str, &str)> = self.env.iter().map(|(k, v)| (&k[..], &v[..])).collect();
        let data = self.dir.path().join("worker-data");
        support::spawn_worker_with_env(&self.db, self.dir.path(), "worker", 3000, &data, &env)
    }

    fn member(&self, org: &str) -> Client {
        org_client(&self.base, org)
    }

    fn operator(&self, org: &str) -> Client {
        operator_client(&self.base, org)
    }

    fn runtime_operator(&self, org: &str) -> Client {
        runtime_operator_client(&self.base, org)
    }

    /// The API's log holds none of the operator's secrets.
    fn assert_no_secret_logged(&self) {
        let log = self.api.log_text();
        for secret in [OPERATOR_KEY, OPERATOR_GITHUB, ORG_A_KEY] {
            assert!(!log.contains(secret), "a secret reached the log");
        }
    }
}

/// 422 `invalid_request`: what the domain refuses.
fn assert_invalid(status: StatusCode, body: &Value) {
    assert_refused(
        status,
        body,
        StatusCode::UNPROCESSABLE_ENTITY,
        "invalid_request",
    );
}

fn assert_refused(status: StatusCode, body: &Value, expected: StatusCode, kind: &str) {
    assert_eq!(status, expected, "{body}");
    assert_eq!(body["error"]["type"], kind, "{body}");
}

/// A started shell run that waits for approval: (task, run, approval).
async fn gated(c: &Client) -> (String, String, String) {
    let (task_id, run_id) = c.run_shell("echo gated").await;
    let approvals = c.api.list_task_approvals(&task_id, None);
    let (status, approvals) = approvals.send_with_status().await.unwrap();
    assert_eq!(status, StatusCode::OK, "{approvals:?}");
    let approval_id = approvals.data[0].id.clone();
    (task_id, run_id, approval_id)
}

async fn resolve(
    c: &Client,
    (task_id, _, approval_id): &(String, String, String),
) -> (StatusCode, Value) {
    let path = format!("/v1/tasks/{task_id}/approvals/{approval_id}/resolve");
    c.post(&path, json!({ "decision": "approve" })).await
}

/// The run still waits and its approval is still pending.
async fn assert_still_pending(
    c: &Client,
    (task_id, run_id, approval_id): &(String, String, String),
) {
    let run = c.run(task_id, run_id).await;
    assert_eq!(run.status, RunStatus::AwaitingApproval, "{run:?}");
    let approval = c.api.get_approval(task_id, approval_id).await.unwrap().data;
    assert_eq!(approval.status, ApprovalStatus::Pending, "{approval:?}");
    assert!(approval.resolved_by.is_none(), "{approval:?}");
}

/// The tenant's listener (a chat model answering once) and a stack that allows presets
/// to reach it.
async fn started() -> (FakeLlm, Stack) {
    let llm = FakeLlm::start(vec![Turn::text("pong")]).await;
    let stack = stack(&llm.openai_base()).await;
    (llm, stack)
}

#[tokio::test]
async fn whoami_tells_a_member_from_an_operator() {
    let (_llm, stack) = started().await;
    let member = stack.member("a").api.whoami().await.unwrap().data;
    assert_eq!(member.role, "member", "{member:?}");
    let operator = stack.operator("a").api.whoami().await.unwrap().data;
    assert_eq!(operator.role, "operator", "{operator:?}");
    let root = stack.runtime_operator("a").api.whoami().await.unwrap().data;
    assert_eq!(root.role, "runtime_operator", "{root:?}");
    // An unknown role proves nothing.
    let forged = support::client_with_headers(
        &stack.base,
        &[
            ("x-keel-remote-secret", two_orgs::SHARED_SECRET),
            ("x-keel-actor-id", "mallory"),
            ("x-keel-org-id", "org_a"),
            ("x-keel-runtime-id", "rt_two_orgs"),
            ("x-keel-role", "root"),
        ],
    );
    let (status, body) = forged.get("/v1/whoami").await;
    assert_refused(status, &body, StatusCode::UNAUTHORIZED, "unauthorized");
}

/// `approver` resolving `gate` is refused (403) and the run still waits; the refusal's
/// message.
async fn refused_resolution(approver: &Client, gate: &(String, String, String)) -> String {
    let (status, body) = resolve(approver, gate).await;
    assert_refused(status, &body, StatusCode::FORBIDDEN, "forbidden");
    assert_still_pending(approver, gate).await;
    body["error"]["message"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn a_member_cannot_resolve_an_approval() {
    let (_llm, stack) = started().await;
    let member = stack.member("a");
    let gate = gated(&member).await;
    refused_resolution(&member, &gate).await;
    // The org's operator (someone else) may.
    let (status, body) = resolve(&stack.operator("a"), &gate).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        support::record::<Resolution>(&body)
            .approval
            .resolved_by
            .as_deref(),
        Some("operator_a"),
        "{body}"
    );
}

#[tokio::test]
async fn an_operator_cannot_approve_their_own_run() {
    let (_llm, stack) = started().await;
    let operator = stack.operator("a");
    let own = gated(&operator).await;
    let message = refused_resolution(&operator, &own).await;
    assert!(message.contains("KEEL_ALLOW_SELF_APPROVAL"), "{message}");
    // Nor does a member of the org decide it for them.
    refused_resolution(&stack.member("a"), &own).await;
}

#[tokio::test]
async fn a_member_cannot_set_limits_not_even_its_own() {
    let (_llm, stack) = started().await;
    let member = stack.member("b");
    for workspace in ["org_b", "org_a"] {
        let url = format!("{}/v1/workspaces/{workspace}/limits", stack.base);
        let put = member.http.put(url).json(&json!({ "max_concurrent": 100 }));
        let (status, body) = member.send(put).await;
        assert_refused(status, &body, StatusCode::FORBIDDEN, "forbidden");
    }
    // An operator of org b sets b's, never a's.
    let operator = stack.operator("b");
    let url = format!("{}/v1/workspaces/org_a/limits", stack.base);
    let put = operator.http.put(url).json(&json!({ "max_concurrent": 0 }));
    let (status, body) = operator.send(put).await;
    assert_refused(status, &body, StatusCode::FORBIDDEN, "forbidden");
    // keel-client has no operation for the caller's own workspace.
    for org in ["a", "b"] {
        let (_, limits) = stack.operator(org).get("/v1/workspace").await;
        let own: WorkspaceLimits = support::record(&limits);
        assert!(own.max_concurrent.is_none(), "{limits}");
    }
}

/// A workspace's approval policy is an operator's: a member can neither read nor lift its
/// own workspace's gates, and an operator sets its own workspace's only.
#[tokio::test]
async fn only_an_operator_reads_or_sets_its_own_workspaces_approval_policy() {
    let (_llm, stack) = started().await;
    let body = json!({ "gates": { "shell_exec": "allow", "git_exec": "allow",
        "file_write": "allow", "network_egress": "allow", "read_file": "allow",
        "all_tools": "allow" } });
    let policy = |org: &str| format!("{}/v1/workspaces/org_{org}/approval-policy", stack.base);
    let member = stack.member("b");
    for org in ["b", "a"] {
        let requests = [
            member.http.get(policy(org)),
            member.http.put(policy(org)).json(&body),
            member.http.delete(policy(org)),
        ];
        for request in requests {
            let (status, answer) = member.send(request).await;
            assert_refused(status, &answer, StatusCode::FORBIDDEN, "forbidden");
        }
    }
    let operator = stack.operator("b");
    let (status, answer) = operator
        .send(operator.http.put(policy("a")).json(&body))
        .await;
    assert_refused(status, &answer, StatusCode::FORBIDDEN, "forbidden");
    let (status, answer) = operator
        .send(operator.http.put(policy("b")).json(&body))
        .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["data"]["source"], "workspace");
    let (_, a) = stack
        .operator("a")
        .send(stack.operator("a").http.get(policy("a")))
        .await;
    assert_eq!(
        a["data"]["source"], "default",
        "b's policy is b's alone: {a}"
    );
}

fn workflow(root: Option<&Path>, hooks: &str) -> String {
    let workspace = root.map_or(String::new(), |r| {
        format!("workspace:\n  root: {}\n", r.display())
    });
    format!(
        "---\ntracker:\n  kind: github\n  repository: acme/widgets\n{workspace}{hooks}\
         task:\n  execution_kind: shell\n  shell_command: echo item\n---\nWork on {{{{ issue.title }}}}\n"
    )
}

async fn register(c: &Client, markdown: &str) -> (StatusCode, Value) {
    c.post(
        "/v1/external-work/sources",
        json!({ "workflow_markdown": markdown }),
    )
    .await
}

#[tokio::test]
async fn a_member_cannot_register_hooks_or_roots_or_in_place_work() {
    let (_llm, stack) = started().await;
    let member = stack.member("a");
    let hook = workflow(None, "hooks:\n  after_create: cat /proc/$PPID/environ\n");
    let rooted = workflow(Some(&stack.root), "");
    let in_place = "---\ntracker: {kind: github, repository: acme/widgets}\n\
                    task: {execution_kind: shell, shell_command: ls, workspace_mode: in_place, \
                    working_directory: /}\n---\nx";
    for markdown in [hook.as_str(), rooted.as_str(), in_place] {
        let (status, body) = register(&member, markdown).await;
        assert_refused(status, &body, StatusCode::FORBIDDEN, "forbidden");
    }
    let sources = member.api.list_sources().await.unwrap().data;
    assert!(sources.is_empty(), "{sources:?}");
    // A plain source is a member's to register; the operator's hooks are the operator's.
    let (status, body) = register(&member, &workflow(None, "")).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, body) = register(&stack.operator("b"), &hook).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
}

/// A comment action `proposer` proposes on a GitHub issue it imports into `source`.
async fn proposed_comment(proposer: &Client, source: &str, number: u64) -> String {
    let payload = json!({ "id": 9000 + number, "number": number, "title": "t",
                          "state": "open", "updated_at": "2026-11-30T09:00:00Z" });
    let import = json!({ "source_id": source, "payload": payload });
    let (status, body) = proposer.post("/v1/external-work/import", import).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let item = body["data"]["item"]["id"].as_str().unwrap().to_string();
    let at = format!("/v1/external-work/items/{item}/actions");
    let comment = json!({ "kind": "comment", "body": "On it." });
    let (status, body) = proposer.post(&at, comment).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    body["data"]["action"]["id"].as_str().unwrap().to_string()
}

/// Seed 000's §Cancel External Work Action: the proposer or an operator cancels; another
/// member of the org may not cancel what someone else proposed.
#[tokio::test]
async fn a_member_cannot_cancel_another_members_proposal() {
    let (_llm, stack) = started().await;
    let (proposer, other) = (
        stack.member("a"),
        member_client(&stack.base, "a", "actor_a2"),
    );
    let (status, body) = register(&proposer, &workflow(None, "")).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let source = body["data"]["id"].as_str().unwrap().to_string();
    let cancel = |action: &str| format!("/v1/external-work/actions/{action}/cancel");

    let first = proposed_comment(&proposer, &source, 1).await;
    let (status, body) = other
        .post(&cancel(&first), json!({ "reason": "mine now" }))
        .await;
    assert_refused(status, &body, StatusCode::FORBIDDEN, "forbidden");
    let action = proposer.api.get_action(&first).await.unwrap().data;
    assert_eq!(action.status, ActionStatus::PendingApproval, "{action:?}");
    let (status, body) = proposer
        .post(&cancel(&first), json!({ "reason": "not needed" }))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["data"]["status"], "cancelled", "{body}");
    assert_eq!(body["data"]["cancelled_by"], "actor_a", "{body}");

    // The org's operator cancels anyone's.
    let second = proposed_comment(&proposer, &source, 2).await;
    let (status, body) = stack.operator("a").post(&cancel(&second), json!({})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["data"]["cancelled_by"], "operator_a", "{body}");
}

/// An agent task with one stdio MCP server, `command`.
fn with_stdio_server(command: &str) -> TaskDraft {
    let server = McpServer {
        name: "tools".into(),
        transport: None,
        command: Some(command.into()),
        args: vec!["--serve".into()],
        env: Default::default(),
        url: None,
        headers: Default::default(),
        approval_policy: None,
        tools: None,
    };
    TaskDraft {
        mcp_servers: Some(vec![server]),
        ..support::agent_loop("hi")
    }
}

/// A stdio MCP server is a program the worker starts for the task: a member's task names
/// one only when the deployment lists its command (`KEEL_MCP_STDIO_COMMANDS`), checked when
/// the task is written and again at each start (the list may have narrowed since); an
/// operator's task names any, and its start waits for approval as a shell command's does.
#[tokio::test]
async fn a_member_names_a_stdio_mcp_server_only_when_the_deployment_lists_its_command() {
    let (llm, stack) = started().await;
    let listed = stack.narrowed(&[("KEEL_MCP_STDIO_COMMANDS", "/usr/bin/listed-mcp")]);
    let (listing, member) = stack.api_with("api-listed", &listed).await;
    let (status, body) = member
        .post("/v1/tasks", support::wire(&with_stdio_server("/bin/sh")))
        .await;
    assert_refused(status, &body, StatusCode::FORBIDDEN, "forbidden");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("\"/bin/sh\"") && message.contains("KEEL_MCP_STDIO_COMMANDS"),
        "{body}"
    );
    assert!(member.api.list_tasks(None).await.unwrap().data.is_empty());
    let members = member
        .create_task(&with_stdio_server("/usr/bin/listed-mcp"))
        .await;
    let operator = operator_client(&listing.client.as_ref().unwrap().base, "a");
    let operators = operator.create_task(&with_stdio_server("/bin/sh")).await;

    // This API lists nothing: the member's task no longer starts; the operator's does.
    let (status, body) = operator
        .post(
            "/v1/providers",
            chat_preset(&llm.openai_base(), "env:ORG_A_API_KEY"),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let member = stack.member("a");
    let (status, body) = member
        .post(&format!("/v1/tasks/{}/start", members.id), json!({}))
        .await;
    assert_refused(status, &body, StatusCode::FORBIDDEN, "forbidden");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("/usr/bin/listed-mcp")
    );
    let run = member.start(&operators.id).await;
    assert_eq!(run.status, RunStatus::AwaitingApproval, "{run:?}");
}

fn chat_preset(base_url: &str, key: &str) -> Value {
    json!({ "kind": "openai-compatible", "model": "fake-chat-1", "api": "openai-completions",
            "base_url": base_url, "api_key_ref": key, "capabilities": ["chat"], "enabled": true })
}

#[tokio::test]
async fn a_member_cannot_send_the_operators_secrets_to_its_listener() {
    let (llm, stack) = started().await;
    let member = stack.member("a");
    let mine = llm.openai_base();
    // The operator's key, in the key or a secret header, aimed at the member's listener.
    let mut header = chat_preset(&mine, "env:ORG_A_API_KEY");
    header["secret_header_refs"] = json!({ "x-forward": "env:GITHUB_TOKEN" });
    for body in [chat_preset(&mine, "env:OPENAI_API_KEY"), header] {
        let (status, refused) = member.post("/v1/providers", body).await;
        assert_invalid(status, &refused);
        assert!(
            refused["error"]["message"]
                .as_str()
                .unwrap()
                .contains("not granted"),
            "{refused}"
        );
    }
    // The runtime operator's preset naming its key at the vendor: neither the member nor
    // the org's operator re-aims it.
    let operator = stack.runtime_operator("a");
    let vendor = chat_preset("https://api.openai.com/v1", "env:OPENAI_API_KEY");
    let (status, body) = operator.post("/v1/providers", vendor).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let id = support::record::<ProviderView>(&body).id;
    let url = format!("{}/v1/providers/{id}", stack.base);
    for c in [&member, &stack.operator("a")] {
        let patch = c.http.patch(&url).json(&json!({ "base_url": mine }));
        let (status, body) = c.send(patch).await;
        assert_refused(status, &body, StatusCode::FORBIDDEN, "forbidden");
    }
    let kept = member.api.get_provider(&id).await.unwrap().data;
    assert_eq!(kept.base_url, "https://api.openai.com/v1", "{kept:?}");
    // Nor ask whether the operator's secrets are set.
    let (status, body) = member
        .get("/v1/secrets/status?ref=env:OPENAI_API_KEY")
        .await;
    assert_invalid(status, &body);
    // Org b was granted nothing, not even org a's key.
    let (status, body) = stack
        .member("b")
        .post("/v1/providers", chat_preset(&mine, "env:ORG_A_API_KEY"))
        .await;
    assert_invalid(status, &body);
    assert!(llm.requests().is_empty(), "a request reached the listener");

    // What org a was granted does reach an allowed host: the listener hears org a's key.
    let (status, body) = member
        .post("/v1/providers", chat_preset(&mine, "env:ORG_A_API_KEY"))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let own = support::record::<ProviderView>(&body).id;
    let check = format!("/v1/providers/{own}/check?live=true");
    let (status, body) = member.post_empty(&check).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let heard = llm.requests();
    assert_eq!(heard.len(), 1);
    let authorization = heard[0].header("authorization").unwrap_or_default();
    assert_eq!(authorization, format!("Bearer {ORG_A_KEY}"));
    assert!(heard[0].header("x-forward").is_none());
    stack.assert_no_secret_logged();
}

#[tokio::test]
async fn a_members_chat_preset_reaches_only_allowed_hosts_over_https() {
    let (llm, stack) = started().await;
    let member = stack.member("a");
    let port = reqwest::Url::parse(&llm.openai_base())
        .unwrap()
        .port()
        .unwrap();
    for base_url in [
        "https://evil.example/v1".to_string(),
        "http://api.openai.com/v1".to_string(),
        "https://api.openai.com:8443/v1".to_string(),
        format!("http://127.0.0.1:{}/v1", port + 1),
        "http://169.254.169.254/latest".to_string(),
    ] {
        let (status, body) = member
            .post("/v1/providers", chat_preset(&base_url, "env:ORG_A_API_KEY"))
            .await;
        assert_invalid(status, &body);
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .starts_with("base_url"),
            "{base_url}: {body}"
        );
    }
    let presets = member.api.list_providers().await.unwrap().data;
    assert!(presets.is_empty(), "{presets:?}");
    let (status, body) = member
        .post(
            "/v1/providers",
            chat_preset("https://api.openai.com/v1", "env:ORG_A_API_KEY"),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert!(llm.requests().is_empty());
}

impl Stack {
    /// The stack's settings with `changed` ones in their place: what a process started
    /// after the operator narrowed them sees.
    fn narrowed(&self, changed: &[(&str, &str)]) -> Vec<(String, String)> {
        let mut env = self.env.clone();
        env.retain(|(k, _)| changed.iter().all(|(c, _)| c != k));
        env.extend(changed.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        env
    }

    /// A second API on the same database with the narrowed settings; its client as org
    /// a's member.
    async fn api_with(&self, name: &str, env: &[(String, String)]) -> (KeelProcess, Client) {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (&k[..], &v[..])).collect();
        let api = support::spawn_api_with_env(&self.db, self.dir.path(), name, &env).await;
        let base = api.client.as_ref().unwrap().base.clone();
        (api, org_client(&base, "a"))
    }
}

/// A check of preset `id` through `c` (live when it is a chat preset): its code and message.
async fn checked(c: &Client, id: &str) -> (String, String) {
    let (status, body) = c
        .post_empty(&format!("/v1/providers/{id}/check?live=true"))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let check: ProviderCheck = support::record(&body);
    (check.code, check.message)
}

#[tokio::test]
async fn a_members_preset_is_refused_at_use_once_its_grant_or_host_is_withdrawn() {
    let (llm, stack) = started().await;
    let mine = llm.openai_base();
    let (status, body) = stack
        .member("a")
        .post("/v1/providers", chat_preset(&mine, "env:ORG_A_API_KEY"))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let member_preset = support::record::<ProviderView>(&body).id;
    // The runtime operator's preset at the same listener with the deployment's key.
    let (status, body) = stack
        .runtime_operator("a")
        .post("/v1/providers", chat_preset(&mine, "env:OPENAI_API_KEY"))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let operator_preset = support::record::<ProviderView>(&body).id;

    // The grant moved to org b: an API started since refuses the member's preset.
    let ungranted = stack.narrowed(&[("KEEL_SECRET_GRANTS", "org_b=env:ORG_A_API_KEY")]);
    let (api, member) = stack.api_with("api-ungranted", &ungranted).await;
    let (code, message) = checked(&member, &member_preset).await;
    assert_eq!(code, "secret_not_granted", "{message}");
    assert!(message.contains("env:ORG_A_API_KEY"), "{message}");
    // The chat host delisted: refused too.
    let delisted = stack.narrowed(&[("KEEL_PROVIDER_HOSTS", "127.0.0.1:1")]);
    let (api_delisted, member_delisted) = stack.api_with("api-delisted", &delisted).await;
    let (code, message) = checked(&member_delisted, &member_preset).await;
    assert_eq!(code, "provider_host_not_allowed", "{message}");
    assert!(llm.requests().is_empty(), "a request reached the listener");

    // A worker started with the narrowed grants fails the member's agent run before any
    // call; the runtime operator's preset is not held to the grants and its run calls the
    // model.
    let env: Vec<(&str, &str)> = ungranted.iter().map(|(k, v)| (&k[..], &v[..])).collect();
    let data = stack.dir.path().join("worker-data");
    let _worker =
        support::spawn_worker_with_env(&stack.db, stack.dir.path(), "worker", 3000, &data, &env);
    let agent = |provider: &str| TaskDraft {
        requested_provider: Some(provider.into()),
        ..support::agent_loop("hi")
    };
    let (task_id, run_id) = member.start_task(&agent(&member_preset)).await;
    let run = member
        .wait_terminal(&task_id, &run_id, Duration::from_secs(60))
        .await;
    assert_eq!(run.status, RunStatus::Failed, "{run:?}");
    let error = run.last_error.as_deref().unwrap();
    assert!(error.starts_with("secret_not_granted"), "{error}");
    assert!(llm.requests().is_empty(), "a request reached the listener");
    let operator = runtime_operator_client(&api.client.as_ref().unwrap().base, "a");
    let (task_id, run_id) = operator.start_task(&agent(&operator_preset)).await;
    operator
        .wait_terminal(&task_id, &run_id, Duration::from_secs(60))
        .await;
    let heard = llm.requests();
    assert_eq!(heard.len(), 1, "the operator's preset called its host");
    let authorization = heard[0].header("authorization").unwrap_or_default();
    assert_eq!(authorization, format!("Bearer {OPERATOR_KEY}"));
    for log in [api.log_text(), api_delisted.log_text()] {
        assert!(!log.contains(ORG_A_KEY) && !log.contains(OPERATOR_KEY));
    }
    stack.assert_no_secret_logged();
}

/// A member's media preset at the vendor's stand-in, submitted to a worker started after the
/// grant was withdrawn: the job fails with `secret_not_granted` and the vendor hears nothing.
#[tokio::test]
async fn a_members_media_job_is_refused_once_its_grant_is_withdrawn() {
    let vendor = wiremock::MockServer::start().await;
    let stack = stack(&vendor.uri()).await;
    let member = stack.member("a");
    let preset = json!({ "kind": "openai-images", "model": "gpt-image-1", "api": "media-job",
        "base_url": format!("{}/v1", vendor.uri()), "api_key_ref": "env:ORG_A_API_KEY",
        "capabilities": ["image_generate"], "enabled": true });
    let (status, body) = member.post("/v1/providers", preset).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let provider = support::record::<ProviderView>(&body).id;
    // The stand-in is on loopback: the worker may call it, so only the grant stops it.
    let ungranted = stack.narrowed(&[
        ("KEEL_SECRET_GRANTS", "org_b=env:ORG_A_API_KEY"),
        ("KEEL_MEDIA_ALLOW_PRIVATE_ADDRESSES", "true"),
    ]);
    let env: Vec<(&str, &str)> = ungranted.iter().map(|(k, v)| (&k[..], &v[..])).collect();
    let data = stack.dir.path().join("worker-data");
    let _worker =
        support::spawn_worker_with_env(&stack.db, stack.dir.path(), "worker", 3000, &data, &env);

    let job = json!({ "provider_id": provider, "operation": "image_generate",
                      "prompt": "a lighthouse at dusk", "input": {} });
    let (status, body) = member.post("/v1/media-jobs", job).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let id = support::record::<MediaJobRecord>(&body).id;
    let (status, body) = member.post_empty(&format!("/v1/media-jobs/{id}/run")).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let ended = support::wait_for(Duration::from_secs(60), "the media job to end", || async {
        let job = member.api.get_media_job(&id).await.unwrap().data;
        let ended = matches!(
            job.status,
            MediaJobStatus::Succeeded | MediaJobStatus::Failed
        );
        ended.then_some(job)
    })
    .await;
    assert_eq!(ended.status, MediaJobStatus::Failed, "{ended:?}");
    assert_eq!(
        ended.last_error_code.as_deref(),
        Some("secret_not_granted"),
        "{ended:?}"
    );
    let heard = vendor.received_requests().await.unwrap_or_default();
    assert!(heard.is_empty(), "a request reached the vendor");
    stack.assert_no_secret_logged();
}

/// An item of acme/widgets#7 imported into `source` (open, or closed later).
async fn import(c: &Client, source: &str, state: &str, updated_at: &str) -> ItemRecord {
    let payload =
        json!({ "number": 7, "title": "shared", "state": state, "updated_at": updated_at });
    let body = json!({ "source_id": source, "payload": payload });
    let (status, body) = c.post("/v1/external-work/import", body).await;
    assert!(status.is_success(), "{body}");
    support::record::<Imported>(&body).item
}

#[tokio::test]
async fn two_orgs_tracking_one_repository_keep_their_directories_apart() {
    let (_llm, stack) = started().await;
    let markdown = workflow(Some(&stack.root), "");
    let (a, b) = (stack.operator("a"), stack.operator("b"));
    let mut sources = Vec::new();
    for c in [&a, &b] {
        let (status, body) = register(c, &markdown).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        sources.push(support::record::<SourceRecord>(&body).id);
    }
    let (a_source, b_source) = (&sources[0], &sources[1]);
    let a_item = import(&a, a_source, "open", "2026-11-30T09:00:00Z").await;
    let b_item = import(&b, b_source, "open", "2026-11-30T09:00:00Z").await;
    let a_dir = PathBuf::from(a_item.workspace_path.as_deref().unwrap());
    let b_dir = PathBuf::from(b_item.workspace_path.as_deref().unwrap());
    assert_eq!(
        a_dir,
        stack
            .root
            .join("org_a")
            .join(support::tracker::widget_key(7))
    );
    assert_eq!(
        b_dir,
        stack
            .root
            .join("org_b")
            .join(support::tracker::widget_key(7))
    );
    assert!(a_dir.is_dir() && b_dir.is_dir());
    // Org a's run would write here; org b's run works in its own directory and sees none.
    std::fs::write(a_dir.join("notes.txt"), "org a's notes").unwrap();
    assert!(!b_dir.join("notes.txt").exists());

    // Org b's item closes; its reconcile and removal touch org b's workspace alone.
    let closed = import(&b, b_source, "closed", "2026-11-30T10:00:00Z").await;
    assert_eq!(closed.state, ItemState::Terminal, "{closed:?}");
    let reconcile = format!("/v1/external-work/sources/{b_source}/reconcile");
    let _worker = stack.spawn_worker();
    let (status, body) = b.post_empty(&reconcile).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // The workers' maintenance removes a terminal item's workspace.
    let gone = || async { (!b_dir.exists()).then_some(()) };
    support::wait_for(Duration::from_secs(20), "org b's workspace to go", gone).await;
    assert_eq!(
        std::fs::read_to_string(a_dir.join("notes.txt")).unwrap(),
        "org a's notes"
    );
    let items = a.api.list_items(a_source).await.unwrap().data;
    assert_eq!(items[0].workspace_path, a_item.workspace_path, "{items:?}");

    // A member of org b cannot work in place in org a's directory, only beneath its own.
    let member = stack.member("b");
    let in_place = |dir: &Path| support::in_place(dir, "cat notes.txt");
    let refused = support::wire(&in_place(&a_dir));
    let (status, body) = member.post("/v1/tasks", refused).await;
    assert_invalid(status, &body);
    let refused = support::wire(&in_place(&stack.root));
    let (status, body) = member.post("/v1/tasks", refused).await;
    assert_invalid(status, &body);
    let own = stack.root.join("org_b").join("scratch");
    std::fs::create_dir(&own).unwrap();
    let task = member.create_task(&in_place(&own)).await;
    assert_eq!(
        task.sandbox_allowed_root.as_deref(),
        stack.root.join("org_b").to_str(),
        "{task:?}"
    );
}

/// A GitHub source of `repository` whose tracker token is `api_key`, running `echo`.
fn keyed_source(repository: &str, api_key: &str) -> String {
    format!(
        "---\ntracker:\n  kind: github\n  repository: {repository}\n  api_key: {api_key}\n\
         task:\n  execution_kind: shell\n  shell_command: echo item\n---\nWork on {{{{ issue.title }}}}\n"
    )
}

/// What `c` is told of a source's tracker key: its status's `secret`.
async fn key_status(c: &Client, source: &str) -> Value {
    let (status, body) = c
        .get(&format!("/v1/external-work/sources/{source}/status"))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["data"]["secret"].clone()
}

#[tokio::test]
async fn a_tenants_tracker_key_is_held_to_its_grants_when_written_and_at_each_poll() {
    let (_llm, stack) = started().await;
    // The deployment's token, and org a's granted key named by org b: refused at writing,
    // to a member and to an org's operator alike.
    let attempts = [
        (stack.member("a"), "$GITHUB_TOKEN"),
        (stack.operator("a"), "env:GITHUB_TOKEN"),
        (stack.member("b"), "env:ORG_A_API_KEY"),
        (stack.operator("b"), "$ORG_A_API_KEY"),
    ];
    for (c, key) in &attempts {
        let (status, body) = register(c, &keyed_source("acme/widgets", key)).await;
        assert_invalid(status, &body);
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.starts_with("tracker.api_key"), "{message}");
        assert!(message.contains("not granted"), "{message}");
        let sources = c.api.list_sources().await.unwrap().data;
        assert!(sources.is_empty(), "{key}: {sources:?}");
    }
    // Org a's own key is org a's to name; the runtime operator names the deployment's.
    let member = stack.member("a");
    let (status, body) = register(&member, &keyed_source("acme/widgets", "$ORG_A_API_KEY")).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let registrant = (
        &body["data"]["registered_by"],
        &body["data"]["registered_by_role"],
    );
    assert_eq!(registrant, (&json!("actor_a"), &json!("member")), "{body}");
    let source = support::record::<SourceRecord>(&body);
    let root = stack.runtime_operator("a");
    let (status, body) = register(&root, &keyed_source("acme/tools", "$GITHUB_TOKEN")).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert_eq!(key_status(&member, &source.id).await["configured"], true);

    // The grant moved to org b: an API started since refuses to use the key, before any
    // request, and its status no longer says whether the key is set.
    let ungranted = stack.narrowed(&[("KEEL_SECRET_GRANTS", "org_b=env:ORG_A_API_KEY")]);
    let (_api, narrowed) = stack.api_with("api-ungranted", &ungranted).await;
    let reconcile = format!("/v1/external-work/sources/{}/reconcile", source.id);
    let (status, body) = narrowed.post_empty(&reconcile).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["data"]["error_code"], "secret_not_granted", "{body}");
    let secret = key_status(&narrowed, &source.id).await;
    assert_eq!(secret["error_code"], "secret_not_granted", "{secret}");
    assert_eq!(secret["configured"], false, "{secret}");
    // And so does a worker's background poll.
    let env: Vec<(&str, &str)> = ungranted.iter().map(|(k, v)| (&k[..], &v[..])).collect();
    let data = stack.dir.path().join("worker-data");
    let _worker =
        support::spawn_worker_with_env(&stack.db, stack.dir.path(), "worker", 3000, &data, &env);
    let background = format!("/v1/external-work/sources/{}/background", source.id);
    let (status, body) = member.post(&background, json!({ "enabled": true })).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let polled = support::wait_for(Duration::from_secs(60), "a background poll", || async {
        let polled = member.api.get_source(&source.id).await.unwrap().data;
        polled.last_poll_at.is_some().then_some(polled)
    })
    .await;
    assert_eq!(
        polled.last_error_code.as_deref(),
        Some("secret_not_granted"),
        "{polled:?}"
    );
    stack.assert_no_secret_logged();
}

/// A source's tracker endpoint is the tracker's public one for a tenant: aimed elsewhere,
/// even with the org's own key, registering is 403 and nothing is stored. The runtime
/// operator aims one at the deployment's own tracker, and its poll carries the
/// deployment's token there.
#[tokio::test]
async fn only_the_runtime_operator_aims_a_source_at_another_endpoint() {
    let (_llm, stack) = started().await;
    let tracker = wiremock::MockServer::start().await;
    let aimed = |key: &str| {
        keyed_source("acme/widgets", key).replacen(
            "  kind: github\n",
            &format!("  kind: github\n  endpoint: {}\n", tracker.uri()),
            1,
        )
    };
    for c in [stack.member("a"), stack.operator("a")] {
        let (status, body) = register(&c, &aimed("$ORG_A_API_KEY")).await;
        assert_refused(status, &body, StatusCode::FORBIDDEN, "forbidden");
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.starts_with("tracker.endpoint"), "{message}");
        assert!(c.api.list_sources().await.unwrap().data.is_empty());
    }
    let root = stack.runtime_operator("a");
    let (status, body) = register(&root, &aimed("$GITHUB_TOKEN")).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let source = support::record::<SourceRecord>(&body);
    let poll = format!("/v1/external-work/sources/{}/poll", source.id);
    let (status, body) = root.post(&poll, json!({})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let heard = tracker.received_requests().await.unwrap_or_default();
    assert!(!heard.is_empty(), "the poll reached no tracker: {body}");
    let authorization = heard[0].headers.get("authorization").unwrap();
    assert_eq!(
        authorization.to_str().unwrap(),
        format!("Bearer {OPERATOR_GITHUB}")
    );
    stack.assert_no_secret_logged();
}

/// The key's third use, an approved tracker action's send: a worker started after org a's
/// grant moved fails the action with `secret_not_granted` before the token is read. (With
/// the key still usable it would call the tracker's public endpoint, which this machine
/// cannot reach: another error.)
#[tokio::test]
async fn a_tenants_tracker_action_is_refused_at_send_once_its_grant_is_withdrawn() {
    let (_llm, stack) = started().await;
    let member = stack.member("a");
    let markdown = keyed_source("acme/widgets", "$ORG_A_API_KEY");
    let (status, body) = register(&member, &markdown).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let source = support::record::<SourceRecord>(&body);
    let item = import(&member, &source.id, "open", "2026-11-30T09:00:00Z").await;
    let at = format!("/v1/external-work/items/{}/actions", item.id);
    let comment = json!({ "kind": "comment", "body": "Done." });
    let (status, body) = member.post(&at, comment).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let Proposed { action, approval } = support::record(&body);

    let ungranted = stack.narrowed(&[("KEEL_SECRET_GRANTS", "org_b=env:ORG_A_API_KEY")]);
    let env: Vec<(&str, &str)> = ungranted.iter().map(|(k, v)| (&k[..], &v[..])).collect();
    let data = stack.dir.path().join("worker-data");
    let _worker =
        support::spawn_worker_with_env(&stack.db, stack.dir.path(), "worker", 3000, &data, &env);
    let resolve = format!(
        "/v1/tasks/{}/approvals/{}/resolve",
        approval.task_id, approval.id
    );
    let (status, body) = stack
        .operator("a")
        .post(&resolve, json!({ "decision": "approve" }))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    // Sending it is an operator's decision too.
    let execute = format!("/v1/external-work/actions/{}/execute", action.id);
    let (status, body) = member.post_empty(&execute).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let (status, body) = stack.operator("a").post_empty(&execute).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let ended = support::wait_for(Duration::from_secs(60), "the action to end", || async {
        let current = member.api.get_action(&action.id).await.unwrap().data;
        let ended = matches!(current.status, ActionStatus::Failed | ActionStatus::Sent);
        ended.then_some(current)
    })
    .await;
    assert_eq!(ended.status, ActionStatus::Failed, "{ended:?}");
    assert_eq!(
        ended.last_error_code.as_deref(),
        Some("secret_not_granted"),
        "{ended:?}"
    );
    assert!(ended.response.is_none(), "the tracker answered: {ended:?}");
    stack.assert_no_secret_logged();
}

#[tokio::test]
async fn secret_status_answers_a_tenant_only_for_granted_references() {
    let (_llm, stack) = started().await;
    let status = |c: Client, reference: &'static str| async move {
        c.get(&format!("/v1/secrets/status?ref={reference}")).await
    };
    // The org's operator learns nothing of the deployment's secrets, nor org b of org a's.
    for (c, reference) in [
        (stack.operator("a"), "env:OPENAI_API_KEY"),
        (stack.operator("a"), "env:GITHUB_TOKEN"),
        (stack.member("a"), "env:OPENAI_API_KEY"),
        (stack.operator("b"), "env:ORG_A_API_KEY"),
    ] {
        let (code, body) = status(c, reference).await;
        assert_invalid(code, &body);
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("not granted")
        );
    }
    // What org a was granted, org a is told of; the runtime operator of anything allowed.
    for (c, reference) in [
        (stack.member("a"), "env:ORG_A_API_KEY"),
        (stack.operator("a"), "env:ORG_A_API_KEY"),
        (stack.runtime_operator("b"), "env:OPENAI_API_KEY"),
    ] {
        let (code, body) = status(c, reference).await;
        assert_eq!(code, StatusCode::OK, "{body}");
        assert_eq!(body["data"]["configured"], true, "{body}");
    }
}

#[tokio::test]
async fn an_org_operator_is_held_to_the_grants_and_hosts_the_runtime_operator_is_not() {
    let (llm, stack) = started().await;
    let operator = stack.operator("a");
    let port = reqwest::Url::parse(&llm.openai_base())
        .unwrap()
        .port()
        .unwrap();
    // Off the list: the port KEEL_PROVIDER_HOSTS names is the listener's, not this one.
    let unlisted = format!("http://127.0.0.1:{}/v1", port + 1);
    let refused = [
        (
            chat_preset("https://api.openai.com/v1", "env:OPENAI_API_KEY"),
            "api_key_ref",
        ),
        (chat_preset(&unlisted, "env:ORG_A_API_KEY"), "base_url"),
    ];
    for (preset, field) in refused {
        let (status, body) = operator.post("/v1/providers", preset).await;
        assert_invalid(status, &body);
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.starts_with(field), "{message}");
    }
    let presets = operator.api.list_providers().await.unwrap().data;
    assert!(presets.is_empty(), "{presets:?}");
    // An MCP server carrying the deployment's key, or aimed at an unlisted host.
    let mcp = |url: &str, key: &str| {
        let mut task = support::wire(&support::agent_loop("hi"));
        task["mcp_servers"] = json!([{ "name": "remote", "url": url,
                                       "headers": { "Authorization": key } }]);
        task
    };
    let listed = format!("{}/mcp", llm.openai_base());
    for task in [
        mcp(&listed, "env:OPENAI_API_KEY"),
        mcp("https://mcp.example.com/mcp", "env:ORG_A_API_KEY"),
    ] {
        let (status, body) = operator.post("/v1/tasks", task).await;
        assert_invalid(status, &body);
        let message = body["error"]["message"].as_str().unwrap();
        assert!(message.starts_with("mcp_servers"), "{message}");
    }
    let (status, body) = operator
        .post("/v1/tasks", mcp(&listed, "env:ORG_A_API_KEY"))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");

    // The deployment's own operator names its key and aims anywhere.
    let root = stack.runtime_operator("a");
    let (status, body) = root
        .post(
            "/v1/providers",
            chat_preset(&unlisted, "env:OPENAI_API_KEY"),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let (status, body) = root
        .post(
            "/v1/tasks",
            mcp("https://mcp.example.com/mcp", "env:OPENAI_API_KEY"),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    assert!(llm.requests().is_empty(), "a request reached the listener");
}

/// A tenant's MCP server is checked again by the worker: written where the host was listed,
/// it is not reached by a worker whose `KEEL_PROVIDER_HOSTS` no longer lists it. Its step
/// fails with why, nothing reaches the server (not even the granted header), and the run
/// goes on without its tools.
#[tokio::test]
async fn a_tenants_mcp_server_is_not_reached_once_its_host_is_delisted() {
    let (llm, stack) = started().await;
    let server = wiremock::MockServer::start().await;
    // The model is the deployment's, not held to the list; the server's host is listed
    // (any port of 127.0.0.1) for the API the member writes the task through.
    let root = stack.runtime_operator("a");
    let (status, body) = root
        .post(
            "/v1/providers",
            chat_preset(&llm.openai_base(), "env:OPENAI_API_KEY"),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let preset = support::record::<ProviderView>(&body).id;
    let listing = stack.narrowed(&[("KEEL_PROVIDER_HOSTS", "127.0.0.1")]);
    let (_listing, member) = stack.api_with("api-listing", &listing).await;
    let remote = McpServer {
        name: "remote".into(),
        transport: None,
        command: None,
        args: Vec::new(),
        env: Default::default(),
        url: Some(format!("{}/mcp", server.uri())),
        headers: [("Authorization".to_string(), "env:ORG_A_API_KEY".to_string())].into(),
        approval_policy: None,
        tools: None,
    };
    let draft = TaskDraft {
        requested_provider: Some(preset),
        mcp_servers: Some(vec![remote]),
        ..support::agent_loop("hi")
    };
    // The stack's worker lists the model's port alone.
    let _worker = stack.spawn_worker();
    let (task_id, run_id) = member.start_task(&draft).await;
    let run = member
        .wait_terminal(&task_id, &run_id, Duration::from_secs(60))
        .await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    let steps = member.api.list_steps(&task_id, &run_id).await.unwrap().data;
    let step = steps.iter().find(|s| s.name == "mcp_server");
    let step = step.unwrap_or_else(|| panic!("no mcp_server step: {steps:?}"));
    assert_eq!(step.status, StepStatus::Failed, "{step:?}");
    let error = step.error.as_deref().unwrap_or_default();
    assert!(error.contains("KEEL_PROVIDER_HOSTS"), "{error}");
    let heard = server.received_requests().await.unwrap_or_default();
    assert!(heard.is_empty(), "a request reached the MCP server");
    assert_eq!(llm.requests().len(), 1, "the run called its model");
    stack.assert_no_secret_logged();
}

/// The run `task_id`'s schedule started: waits until it exists.
async fn scheduled_run(c: &Client, task_id: &str) -> String {
    support::wait_for(Duration::from_secs(60), "the scheduled run", || async {
        let task = c.api.get_task(task_id).await.unwrap().data;
        task.latest_run_id
    })
    .await
}

/// The pending approval of `run_id`, as a gate to resolve.
async fn gate_of(c: &Client, task_id: &str, run_id: &str) -> (String, String, String) {
    let approvals = c.api.list_task_approvals(task_id, None).await.unwrap().data;
    let approval = approvals.iter().find(|a| a.run_id == run_id).unwrap();
    (task_id.into(), run_id.into(), approval.id.clone())
}

#[tokio::test]
async fn a_schedules_runs_are_requested_by_its_writer_who_cannot_approve_them() {
    let (_llm, stack) = started().await;
    let operator = stack.operator("a");
    let task = operator
        .create_task(&support::shell("echo scheduled"))
        .await;
    let run_at = chrono::Utc::now() + chrono::Duration::seconds(1);
    let schedule = json!({ "kind": "once", "timezone": "UTC", "enabled": true,
                           "run_at": run_at.to_rfc3339() });
    let url = format!("{}/v1/tasks/{}/schedule", stack.base, task.id);
    let (status, body) = operator.send(operator.http.put(url).json(&schedule)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let written_by = body["data"]["written_by"].clone();
    // The workers' dispatch fires it: the run waits for approval, asked for by the writer.
    let _worker = stack.spawn_worker();
    let run_id = scheduled_run(&operator, &task.id).await;
    let run = operator.run(&task.id, &run_id).await;
    assert!(run.schedule_id.is_some(), "{run:?}");
    assert_eq!(run.requested_by.as_deref(), Some("operator_a"), "{run:?}");
    let gate = gate_of(&operator, &task.id, &run_id).await;
    let message = refused_resolution(&operator, &gate).await;
    assert!(message.contains("operator_a requested this"), "{message}");
    // Someone else decides it.
    let (status, body) = resolve(&stack.runtime_operator("a"), &gate).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(written_by, "operator_a", "the schedule shows its writer");
}

#[tokio::test]
async fn an_imported_runs_requester_is_the_sources_registrant() {
    let (_llm, stack) = started().await;
    let operator = stack.operator("a");
    let (status, body) = register(&operator, &workflow(None, "")).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let registered_by = body["data"]["registered_by"].clone();
    let source = support::record::<SourceRecord>(&body);
    // A member imports the item; the operator's workflow asked for its run.
    let item = import(
        &stack.member("a"),
        &source.id,
        "open",
        "2026-11-30T09:00:00Z",
    )
    .await;
    let (task_id, run_id) = (item.task_id.unwrap(), item.run_id.unwrap());
    let run = operator.run(&task_id, &run_id).await;
    assert_eq!(run.status, RunStatus::AwaitingApproval, "{run:?}");
    assert_eq!(run.requested_by.as_deref(), Some("operator_a"), "{run:?}");
    let gate = gate_of(&operator, &task_id, &run_id).await;
    refused_resolution(&operator, &gate).await;
    let (status, body) = resolve(&stack.runtime_operator("a"), &gate).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        registered_by, "operator_a",
        "the source shows its registrant"
    );
}

#[tokio::test]
async fn patches_are_changed_only_by_an_operator_who_did_not_request_the_run() {
    let (_llm, stack) = started().await;
    let operator = stack.operator("a");
    // The operator's run, cancelled while it waited: ended, with a proposed patch.
    let (task_id, run_id, _) = gated(&operator).await;
    let cancel = format!("/v1/tasks/{task_id}/runs/{run_id}/cancel");
    let (status, body) = operator.post_empty(&cancel).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let proposal = Patch {
        path: "notes.txt".into(),
        before: None,
        after: Some("proposed".into()),
        proposed: true,
    };
    let pool = support::pool(&stack.db).await;
    let mut tx = pool.begin().await.unwrap();
    let (scope, run) = (
        Scope::new("org_a"),
        Subject::Run {
            task_id: &task_id,
            run_id: &run_id,
        },
    );
    let patch = patches::insert_patch(
        &mut tx,
        &ContentStore::Postgres,
        &scope,
        run,
        "p",
        &proposal,
    )
    .await
    .unwrap()
    .id;
    tx.commit().await.unwrap();
    let base = format!("/v1/tasks/{task_id}/runs/{run_id}/patches/{patch}");
    // Neither a member nor the run's requester changes it.
    for c in [stack.member("a"), operator.clone()] {
        for verb in ["apply", "revert", "discard"] {
            let (status, body) = c.post_empty(&format!("{base}/{verb}")).await;
            assert_refused(status, &body, StatusCode::FORBIDDEN, "forbidden");
        }
    }
    let (_, body) = operator.get(&base).await;
    assert_eq!(body["data"]["status"], "proposed", "{body}");
    // Another operator does.
    let (status, body) = stack
        .runtime_operator("a")
        .post_empty(&format!("{base}/discard"))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["data"]["status"], "discarded", "{body}");
}

#[tokio::test]
async fn a_member_cannot_delete_an_operators_preset() {
    let (_llm, stack) = started().await;
    let (member, operator) = (stack.member("a"), stack.operator("a"));
    let preset = chat_preset("https://api.openai.com/v1", "env:ORG_A_API_KEY");
    let (status, body) = operator.post("/v1/providers", preset.clone()).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let operators = support::record::<ProviderView>(&body).id;
    let url = format!("/v1/providers/{operators}");
    let (status, body) = member.delete(&url).await;
    assert_refused(status, &body, StatusCode::FORBIDDEN, "forbidden");
    // Nor makes it its own by an edit first (an edit makes a preset its editor's).
    let patch = member
        .http
        .patch(format!("{}{url}", stack.base))
        .json(&json!({ "enabled": false }));
    let (status, body) = member.send(patch).await;
    assert_refused(status, &body, StatusCode::FORBIDDEN, "forbidden");
    let (status, body) = member.delete(&url).await;
    assert_refused(status, &body, StatusCode::FORBIDDEN, "forbidden");
    let kept = member.api.get_provider(&operators).await.unwrap().data;
    assert!(kept.enabled, "{kept:?}");
    // A member's own is the member's to delete; the operator's, an operator's.
    let (status, body) = member.post("/v1/providers", preset).await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let own = support::record::<ProviderView>(&body).id;
    for (c, id) in [(&member, &own), (&operator, &operators)] {
        let (status, body) = c.delete(&format!("/v1/providers/{id}")).await;
        assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
    }
    // The runtime operator's is the runtime operator's, whoever else is an operator.
    let root = stack.runtime_operator("a");
    let (status, body) = root
        .post(
            "/v1/providers",
            chat_preset("https://api.openai.com/v1", "env:OPENAI_API_KEY"),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let deployments = format!(
        "/v1/providers/{}",
        support::record::<ProviderView>(&body).id
    );
    let (status, body) = operator.delete(&deployments).await;
    assert_refused(status, &body, StatusCode::FORBIDDEN, "forbidden");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("the runtime operator"), "{message}");
    let (status, body) = root.delete(&deployments).await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{body}");
}
