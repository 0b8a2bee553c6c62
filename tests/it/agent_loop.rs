//! Agent loop runs end to end: real Postgres, real `keel api` and `keel worker` processes,
//! and the scripted fake LLM of tests/support/llm.rs as the chat provider.

use crate::support;

use std::path::Path;
use std::time::Duration;

use crate::support::llm::{FakeLlm, Turn};
use crate::support::{Client, KeelProcess, record};
use futures_util::StreamExt;
use keel_client::sse::RunItem;
use keel_client::{
    ActivityItem, ActivityKind, ActivityStatus, ApprovalPolicyRequest, ApprovalRecord,
    ApprovalStatus, ArtifactKind, BlockKind, BlockStatus, ContextSource, EventRecord, EventType,
    GateDecision, GateDecisions, LayerOrigin, OperationKind, PolicySource, ProviderView,
    Resolution, RunRecord, RunStatus, RunTranscript, StepRecord, StepStatus, TaskDraft,
    TranscriptEvent, TurnStatus,
};
use reqwest::StatusCode;
use serde_json::{Value, json};
use sqlx::PgPool;

/// The API key the fake provider demands: it must appear nowhere Keel writes.
const CANARY: &str = "sk-canary-7f3a9c1e5b";
const MODEL: &str = "fake-model";
/// 2 USD / 10 USD per million tokens: micro-USD 2 per prompt token, 10 per completion one.
const PRICES: &str = r#"{"fake-model": {"input_usd_per_mtok": 2.0, "output_usd_per_mtok": 10.0}}"#;
const WAIT: Duration = Duration::from_secs(30);

pub(crate) struct Stack {
    db_url: String,
    pool: PgPool,
    dir: tempfile::TempDir,
    policies: String,
    /// More settings of the API and the workers.
    env: Vec<(String, String)>,
    /// Kept running for the test's length.
    _api: KeelProcess,
    workers: Vec<KeelProcess>,
    pub(crate) client: Client,
    pub(crate) llm: FakeLlm,
    provider_id: String,
}

impl Stack {
    /// An API and a worker gating tools with `policies`, and a chat preset on the fake.
    pub(crate) async fn start(policies: &str, script: Vec<Turn>) -> Stack {
        Stack::start_with(policies, script, &[]).await
    }

    /// [`Stack::start`] with more settings for the API and the workers.
    pub(crate) async fn start_with(
        policies: &str,
        script: Vec<Turn>,
        more: &[(&str, &str)],
    ) -> Stack {
        let llm = FakeLlm::start(script).await.require_key(CANARY);
        let db_url = support::fresh_database().await;
        let dir = tempfile::tempdir().unwrap();
        // The API shares the workers' data directory, so it reaches a run's workspace to
        // revert or apply its patches.
        let data = dir.path().join("data");
        let data = data.to_str().unwrap();
        let mut env = vec![
            ("KEEL_APPROVAL_POLICIES", policies),
            ("KEEL_DATA_DIR", data),
        ];
        env.extend_from_slice(more);
        let api = support::spawn_api_with_env(&db_url, dir.path(), "api", &env).await;
        let client = api.client.clone().unwrap();
        let (status, preset) = client
            .post(
                "/v1/providers",
                json!({ "kind": "openai-compatible", "model": MODEL, "api": "openai-completions",
                        "base_url": llm.openai_base(), "api_key_ref": "env:FAKE_LLM_API_KEY",
                        "capabilities": ["chat", "tool_call"], "enabled": true }),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{preset}");
        let mut stack = Stack {
            pool: support::pool(&db_url).await,
            db_url,
            dir,
            policies: policies.to_string(),
            env: more
                .iter()
                .map(|(name, value)| (name.to_string(), value.to_string()))
                .collect(),
            _api: api,
            workers: Vec::new(),
            client,
            llm,
            provider_id: support::record::<ProviderView>(&preset).id,
        };
        stack.spawn_worker("worker-1");
        stack
    }

    /// The database's URL, to look for what must be in no row.
    pub(crate) fn db_url(&self) -> String {
        self.db_url.clone()
    }

    fn spawn_worker(&mut self, name: &str) {
        let data = self.dir.path().join("data");
        let mut env = vec![
            ("KEEL_APPROVAL_POLICIES", self.policies.as_str()),
            ("KEEL_MODEL_PRICES", PRICES),
            ("FAKE_LLM_API_KEY", CANARY),
            ("KEEL_CHAT_ALLOW_PRIVATE_ADDRESSES", "true"),
        ];
        env.extend(self.env.iter().map(|(n, v)| (n.as_str(), v.as_str())));
        let worker =
            support::spawn_worker_with_env(&self.db_url, self.dir.path(), name, 2_000, &data, &env);
        self.workers.push(worker);
    }

    /// Makes a new chat preset on the fake, speaking `api` at `base_url`, the one the
    /// stack's tasks name; returns its id.
    async fn use_preset(&mut self, kind: &str, api: &str, base_url: String) -> String {
        let (status, preset) = self
            .client
            .post(
                "/v1/providers",
                json!({ "kind": kind, "model": MODEL, "api": api, "base_url": base_url,
                        "api_key_ref": "env:FAKE_LLM_API_KEY",
                        "capabilities": ["chat", "tool_call"], "enabled": true }),
            )
            .await;
        assert_eq!(status, StatusCode::CREATED, "{preset}");
        self.provider_id = support::record::<ProviderView>(&preset).id;
        self.provider_id.clone()
    }

    /// Makes a chat preset speaking Anthropic messages on the fake the stack's tasks name.
    async fn use_anthropic(&mut self) -> String {
        let base_url = self.llm.anthropic_base();
        self.use_preset("anthropic", "anthropic-messages", base_url)
            .await
    }

    /// The cached prompt tokens the ledger recorded for the run's model call `index`.
    async fn cached_tokens(&self, run_id: &str, index: i32) -> i64 {
        sqlx::query_scalar("SELECT cached_tokens FROM model_calls WHERE run_id = $1 AND index = $2")
            .bind(run_id)
            .bind(index)
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }

    /// The data directory the workers keep the runs' workspaces in.
    pub(crate) fn data_dir(&self) -> std::path::PathBuf {
        self.dir.path().join("data")
    }

    /// Creates an agent loop task from `draft` (see [`agent`]) and starts it.
    pub(crate) async fn start_agent(&self, draft: TaskDraft) -> (String, String) {
        self.client.start_task(&draft).await
    }

    pub(crate) async fn steps(&self, task_id: &str, run_id: &str) -> Vec<StepRecord> {
        let steps = self.client.api.list_steps(task_id, run_id);
        let steps = steps.query("limit", Some(200)).send_with_status().await;
        let (status, steps) = steps.unwrap();
        assert_eq!(status, StatusCode::OK, "{steps:?}");
        steps.data
    }

    /// The run's `agent_conversation` artifact, parsed.
    async fn conversation(&self, task_id: &str, run_id: &str) -> Vec<Value> {
        let artifacts = self.client.api.list_artifacts(task_id, run_id).await;
        let artifacts = artifacts.unwrap().data;
        let artifact = artifacts
            .iter()
            .find(|a| a.name == "agent_conversation")
            .unwrap_or_else(|| panic!("no agent_conversation artifact: {artifacts:?}"));
        assert_eq!(artifact.kind, ArtifactKind::AgentConversation);
        let content = self
            .client
            .api
            .artifact_content(task_id, run_id, &artifact.id);
        serde_json::from_slice(&content.raw().await.unwrap()).unwrap()
    }

    pub(crate) async fn pending_approval(&self, task_id: &str) -> ApprovalRecord {
        support::wait_for(WAIT, "a pending approval", || async {
            let pending = self
                .client
                .api
                .list_task_approvals(task_id, Some("pending"));
            pending.await.ok()?.data.into_iter().next()
        })
        .await
    }

    async fn resolve(&self, task_id: &str, approval_id: &str, body: Value) -> (StatusCode, Value) {
        let path = format!("/v1/tasks/{task_id}/approvals/{approval_id}/resolve");
        self.client.post(&path, body).await
    }

    /// Resolves `approval` with `decision` alone; the resolution must be taken (200).
    pub(crate) async fn decide(
        &self,
        task_id: &str,
        approval: &ApprovalRecord,
        decision: &str,
    ) -> Resolution {
        let body = json!({ "decision": decision });
        let (status, body) = self.resolve(task_id, &approval.id, body).await;
        assert_eq!(status, StatusCode::OK, "{body}");
        support::record(&body)
    }

    pub(crate) async fn queue_rows(&self, run_id: &str) -> i64 {
        sqlx::query_scalar("SELECT count(*) FROM queue_jobs WHERE ref_id = $1")
            .bind(run_id)
            .fetch_one(&self.pool)
            .await
            .unwrap()
    }
}

/// The draft of the agent loop tasks here; fields are added with `..agent()`.
/// The prompt of [`agent`]'s task.
const PROMPT: &str = "Tidy the notes.";

pub(crate) fn agent() -> TaskDraft {
    TaskDraft {
        system_prompt: Some("You are careful.".into()),
        ..support::agent_loop(PROMPT)
    }
}

/// A step's output (null when it has none).
pub(crate) fn output(step: &StepRecord) -> Value {
    step.output.clone().unwrap_or_default()
}

/// The run's events of one type.
/// How many of `text`'s lines are `line`.
fn count_lines(text: &str, line: &str) -> usize {
    text.lines().filter(|l| *l == line).count()
}

fn of_type(events: &[EventRecord], event_type: EventType) -> Vec<&EventRecord> {
    events
        .iter()
        .filter(|e| e.event_type == event_type)
        .collect()
}

/// The conversation as the OpenAI protocol carries it, reduced to what both sides share:
/// role, text, tool call ids and names.
fn wire_shape(message: &Value) -> Value {
    let calls: Vec<Value> = message["tool_calls"]
        .as_array()
        .map(|calls| {
            calls
                .iter()
                .map(|c| {
                    let name = c["function"]["name"].as_str().or(c["name"].as_str());
                    let arguments = c["function"]["arguments"]
                        .as_str()
                        .or(c["arguments"].as_str());
                    json!([c["id"], name, arguments])
                })
                .collect()
        })
        .unwrap_or_default();
    let content = match &message["content"] {
        Value::String(text) if !text.is_empty() => Value::String(text.clone()),
        _ => Value::Null,
    };
    json!({ "role": message["role"], "content": content, "tool_calls": calls,
            "tool_call_id": message["tool_call_id"] })
}

/// Every row of every table, as text, contains no `needle`.
async fn assert_nowhere_in_the_database(pool: &PgPool, needle: &str) {
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT quote_ident(tablename) FROM pg_tables WHERE schemaname = 'public'",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    assert!(tables.len() > 10, "{tables:?}");
    for table in tables {
        // The names come from the catalog, quoted.
        let hits: i64 = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT count(*) FROM {table} t WHERE t::text LIKE '%' || $1 || '%'"
        )))
        .bind(needle)
        .fetch_one(pool)
        .await
        .unwrap();
        assert_eq!(hits, 0, "the canary is in table {table}");
    }
    // Artifact bytes live in chunk rows (bytea): look at them as text too.
    let in_chunks: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM artifact_chunks WHERE position($1::bytea IN data) > 0",
    )
    .bind(needle.as_bytes())
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(in_chunks, 0, "the canary is in an artifact's bytes");
}

fn assert_not_in_logs(dir: &Path, needle: &str) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "log") {
            let text = std::fs::read_to_string(&path).unwrap();
            assert!(
                !text.contains(needle),
                "the canary is in {}",
                path.display()
            );
        }
    }
}

async fn transcript(client: &Client, task_id: &str, run_id: &str) -> RunTranscript {
    let path = format!("/v1/tasks/{task_id}/runs/{run_id}/transcript");
    let (status, body) = client.get(&path).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    record(&body)
}

/// The activity the run's stream (`projection=activity`) carries last, read to its end.
pub(crate) async fn activity(client: &Client, task_id: &str, run_id: &str) -> Vec<ActivityItem> {
    let stream = client.api.stream_run_activity(task_id, run_id, None);
    let mut stream = std::pin::pin!(stream);
    let read = tokio::time::timeout(WAIT, async {
        let mut last = None;
        while let Some(item) = stream.next().await {
            if let RunItem::Event(frame) = item.expect("a frame") {
                last = frame.activity.or(last);
            }
        }
        last
    });
    let last = read
        .await
        .expect("the stream ends after the run's last event");
    last.expect("a frame with the run's activity")
}

/// The multi-turn run below as a person reads it: its answer on the run, `runs show`, the
/// transcript (whole, in order, with the steps' own figures) and `runs logs`.
async fn read_as_a_conversation(stack: &Stack, run: &RunRecord, steps: &[StepRecord]) {
    let answer = "Done: notes.txt is tidy.";
    assert_eq!(run.answer.as_deref(), Some(answer));
    let shown = crate::cli::cli(&stack.client.base, &["runs", "show", &run.id]).await;
    let shown = crate::cli::stdout(&shown);
    assert!(shown.contains(&format!("\nanswer:\n{answer}\n")), "{shown}");

    let transcript = transcript(&stack.client, &run.task_id, &run.id).await;
    let events = stack.client.events(&run.task_id, &run.id).await;
    assert_eq!(transcript.sequence, events.last().unwrap().sequence);
    assert_eq!(transcript.answer.as_deref(), Some(answer));
    assert_eq!(transcript.turns.len(), 1);
    let turn = &transcript.turns[0];
    assert_eq!(
        (turn.id.as_str(), turn.status),
        (run.id.as_str(), TurnStatus::Succeeded)
    );
    let kinds: Vec<BlockKind> = turn.blocks.iter().map(|b| b.kind).collect();
    use BlockKind::{CoordinatorText, FileChange, OperationCell, UserMessage};
    assert_eq!(
        kinds,
        [
            UserMessage,
            CoordinatorText,
            OperationCell,
            OperationCell,
            FileChange,
            CoordinatorText
        ]
    );
    let blocks = &turn.blocks;
    assert_eq!(blocks[0].text.as_deref(), Some(PROMPT));
    let first = blocks[1].model_call.as_ref().unwrap();
    assert_eq!(blocks[1].text.as_deref(), Some("Let me look."));
    assert_eq!(blocks[1].id, steps[0].id);
    assert_eq!(
        (first.index, first.prompt_tokens, first.completion_tokens),
        (1, Some(100), Some(20))
    );
    assert_eq!(first.cost_micros_usd, Some(400));
    let took = (steps[0].finished_at.unwrap() - steps[0].started_at).num_milliseconds();
    assert_eq!(first.latency_ms, Some(took));
    assert_eq!(first.tool_calls, ["read_file", "file_write"]);
    let read = blocks[2].tool.as_ref().unwrap();
    assert_eq!(
        (read.name.as_str(), read.operation_kind),
        ("read_file", OperationKind::Read)
    );
    assert_eq!(read.arguments, r#"{"path":"notes.txt"}"#);
    assert!(read.is_error, "{read:?}");
    let write = blocks[3].tool.as_ref().unwrap();
    assert_eq!(
        (write.operation_kind, write.is_error),
        (OperationKind::Edit, false)
    );
    let change = blocks[4].file_change.as_ref().unwrap();
    assert_eq!(
        (change.path.as_deref(), change.status.as_str()),
        (Some("notes.txt"), "applied")
    );
    assert_eq!(blocks[5].text.as_deref(), Some(answer));

    // No runtime or workspace layer: its context is its task's.
    let context = stack
        .client
        .api
        .get_run_context(&run.task_id, &run.id)
        .await
        .unwrap()
        .data;
    assert_eq!(context.source, ContextSource::Task);
    assert_eq!(context.layers.len(), 1);
    assert_eq!(
        (context.layers[0].origin, context.layers[0].content.as_str()),
        (LayerOrigin::Task, "You are careful.")
    );
    assert_eq!(context.prompt.as_deref(), Some(PROMPT));

    // Its activity: each call and tool call, the file, the files changed, the answer, the end.
    let items = activity(&stack.client, &run.task_id, &run.id).await;
    let kinds: Vec<(ActivityKind, ActivityStatus)> =
        items.iter().map(|i| (i.kind, i.status)).collect();
    use ActivityStatus::{Completed, Failed};
    assert_eq!(
        kinds,
        [
            (ActivityKind::Thinking, Completed),
            (ActivityKind::ToolCall, Failed),
            (ActivityKind::ToolCall, Completed),
            (ActivityKind::Patch, Completed),
            (ActivityKind::ChangedFiles, Completed),
            (ActivityKind::FinalAnswer, Completed),
            (ActivityKind::RunResult, Completed),
        ],
        "{items:#?}"
    );
    assert_eq!(items[0].id, steps[0].id);
    assert_eq!(items[0].summary.as_deref(), Some("Let me look."));
    assert_eq!(items[1].title, "read_file: notes.txt");
    assert!(items[1].reason.is_some(), "{:?}", items[1]);
    assert_eq!(items[4].paths, ["notes.txt"]);
    assert_eq!(items[5].summary.as_deref(), Some(answer));
    assert_eq!(items[6].title, "run completed");

    let logs = crate::cli::cli(&stack.client.base, &["runs", "logs", &run.id]).await;
    let logs = crate::cli::stdout(&logs);
    let expected_lines = [
        "prompt:".to_string(),
        format!("    {PROMPT}"),
        format!(
            "model (call 1 · 100 in, 20 out · $0.0004 · {:.1}s):",
            took as f64 / 1000.0
        ),
        "    Let me look.".into(),
        "tool file_write: notes.txt (5 bytes) succeeded".into(),
        format!("file notes.txt applied (patch {})", change.patch_id),
        "answer:".into(),
    ];
    for line in expected_lines {
        assert!(logs.lines().any(|l| l.starts_with(&line)), "{line}\n{logs}");
    }
}

#[tokio::test]
async fn a_multi_turn_run_persists_every_call_and_result_and_completes() {
    let stack = Stack::start(
        "none",
        vec![
            Turn::text("Let me look.")
                .and_tool_call("call_1", "read_file", r#"{"path":"notes.txt"}"#)
                .and_tool_call(
                    "call_2",
                    "file_write",
                    r#"{"path":"notes.txt","content":"tidy\n"}"#,
                )
                .usage(100, 20, 40),
            Turn::text("Done: notes.txt is tidy.").usage(300, 10, 0),
        ],
    )
    .await;
    let (task_id, run_id) = stack.start_agent(agent()).await;
    let run = stack.client.wait_terminal(&task_id, &run_id, WAIT).await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    assert_eq!(run.model_call_count, 2);
    // Both calls recorded: none left in flight to count as abandoned.
    assert_eq!(run.abandoned_model_calls, 0, "{run:?}");
    assert_eq!(run.model.as_deref(), Some(MODEL));
    assert_eq!(run.provider.as_ref(), Some(&stack.provider_id));
    // 2 per prompt token, 10 per completion token: (200 + 200) + (600 + 100).
    assert_eq!(run.total_cost_micros_usd, 1_100);

    let steps = stack.steps(&task_id, &run_id).await;
    let names: Vec<&str> = steps.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        ["model_call", "tool_call", "tool_call", "model_call"]
    );
    assert!(steps.iter().all(|s| s.status == StepStatus::Completed));
    assert_eq!(steps[0].input, json!({ "index": 1 }));
    assert_eq!(output(&steps[0])["cost_micros_usd"], 400);
    assert_eq!(steps[1].input["name"], "read_file");
    assert_eq!(output(&steps[1])["result"]["is_error"], true);
    assert_eq!(
        output(&steps[2])["result"]["is_error"],
        false,
        "{:?}",
        steps[2]
    );

    let ledger: Vec<(i32, i64, i64, i64, Option<i64>, String)> = sqlx::query_as(
        "SELECT index, prompt_tokens, completion_tokens, cached_tokens, cost_micros_usd, model
         FROM model_calls WHERE run_id = $1 ORDER BY index",
    )
    .bind(&run_id)
    .fetch_all(&stack.pool)
    .await
    .unwrap();
    assert_eq!(
        ledger,
        [
            (1, 100, 20, 40, Some(400), MODEL.to_string()),
            (2, 300, 10, 0, Some(700), MODEL.to_string())
        ]
    );

    let events = stack.client.events(&task_id, &run_id).await;
    let completed = of_type(&events, EventType::ModelCallCompleted);
    assert_eq!(completed.len(), 2);
    // A tool call's step events name its tool, and so does the watch.
    let tools: Vec<&Value> = of_type(&events, EventType::StepFinished)
        .iter()
        .map(|e| &e.data["tool"])
        .collect();
    assert_eq!(
        tools,
        [
            &Value::Null,
            &json!("read_file"),
            &json!("file_write"),
            &Value::Null
        ]
    );
    let watched = crate::cli::cli(&stack.client.base, &["runs", "watch", &run_id]).await;
    let watched = crate::cli::stdout(&watched);
    for (index, tool) in [
        (steps[1].index, "read_file"),
        (steps[2].index, "file_write"),
    ] {
        let line = format!("step {index} tool_call {tool} completed");
        assert!(watched.lines().any(|l| l.starts_with(&line)), "{watched}");
    }
    // A replay prints the model's text from its calls' steps, times each call by its step,
    // and ends without an exit code the run has none of.
    for text in ["model: Let me look.", "model: Done: notes.txt is tidy."] {
        assert_eq!(count_lines(&watched, text), 1, "{watched}");
    }
    // Each call with its tokens and cost, each tool call with its arguments and result.
    let took = steps[0].finished_at.unwrap() - steps[0].started_at;
    let line = format!(
        "step {} model_call completed {:.1}s · 100 in, 20 out · $0.0004",
        steps[0].index,
        took.num_milliseconds() as f64 / 1000.0
    );
    assert_eq!(count_lines(&watched, &line), 1, "{line}\n{watched}");
    for line in [
        r#"    args: {"path":"notes.txt"}"#,
        "    result: notes.txt: no such file",
        r#"    args: {"path":"notes.txt","content":"tidy\n"}"#,
    ] {
        assert_eq!(count_lines(&watched, line), 1, "{line}\n{watched}");
    }
    let ended = watched.lines().last().unwrap_or_default();
    assert!(ended.starts_with("run finished in "), "{watched}");
    assert!(!ended.contains("exit code"), "{watched}");
    read_as_a_conversation(&stack, &run, &steps).await;
    assert_eq!(completed[1].data["index"], 2);
    assert_eq!(completed[1].data["usage"]["prompt_tokens"], 300);
    assert_eq!(completed[1].data["cost_micros_usd"], 700);

    // The conversation: the persisted one is what the model saw, turn by turn.
    let conversation = stack.conversation(&task_id, &run_id).await;
    let roles: Vec<&str> = conversation
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(
        roles,
        ["system", "user", "assistant", "tool", "tool", "assistant"]
    );
    let requests = stack.llm.requests();
    assert_eq!(requests.len(), 2);
    for (n, request) in requests.iter().enumerate() {
        let seen: Vec<Value> = request.messages().iter().map(wire_shape).collect();
        let persisted: Vec<Value> = conversation[..seen.len()].iter().map(wire_shape).collect();
        assert_eq!(seen, persisted, "call {}", n + 1);
    }
    assert_eq!(requests[1].messages().len(), 5);

    // The file_write left its patch artifact.
    let artifacts = stack.client.api.list_artifacts(&task_id, &run_id).await;
    let artifacts = artifacts.unwrap().data;
    let patch = artifacts
        .iter()
        .find(|a| a.kind == ArtifactKind::Patch)
        .unwrap_or_else(|| panic!("{artifacts:?}"));
    assert_eq!(patch.name, format!("patch-{}-1", steps[2].index));

    assert_nowhere_in_the_database(&stack.pool, CANARY).await;
    assert_not_in_logs(stack.dir.path(), CANARY);
}

#[tokio::test]
async fn gated_tool_calls_wait_without_a_lease_then_approve_reject_or_refuse() {
    let write = r#"{"path":"a.txt","content":"x"}"#;
    let stack = Stack::start(
        "file_write",
        vec![
            // Approve: the call runs without the model being asked again for it.
            Turn::tool_call("w1", "file_write", write),
            Turn::text("written"),
            // Reject: the run is cancelled.
            Turn::tool_call("w2", "file_write", write),
            // Reject and continue: the model reads the refusal.
            Turn::tool_call("w3", "file_write", write),
            Turn::text("understood, not writing"),
        ],
    )
    .await;

    let (task_id, run_id) = stack.start_agent(agent()).await;
    let approval = stack.pending_approval(&task_id).await;
    assert_eq!(approval.kind, "agent_loop_tool_call");
    assert!(
        approval.action_summary[0].contains("file_write"),
        "{approval:?}"
    );
    let run = stack.client.run(&task_id, &run_id).await;
    assert_eq!(run.status, RunStatus::AwaitingApproval);
    let steps = stack.steps(&task_id, &run_id).await;
    assert_eq!(approval.step_id.as_ref(), Some(&steps.last().unwrap().id));
    // No queue row: no lease, no worker slot while it waits.
    assert_eq!(stack.queue_rows(&run_id).await, 0);
    assert_eq!(stack.llm.requests().len(), 1);
    stack.decide(&task_id, &approval, "approve").await;
    let run = stack.client.wait_terminal(&task_id, &run_id, WAIT).await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    // One call for the gated response, one after the tool ran: none repeated.
    assert_eq!(stack.llm.requests().len(), 2);
    let names: Vec<String> = stack
        .steps(&task_id, &run_id)
        .await
        .into_iter()
        .map(|s| s.name)
        .collect();
    assert_eq!(names, ["model_call", "tool_call", "model_call"]);

    // Reject: cancelled.
    let (task_id, _) = stack.start_agent(agent()).await;
    let approval = stack.pending_approval(&task_id).await;
    let resolution = stack.decide(&task_id, &approval, "reject").await;
    assert_eq!(resolution.run.status, RunStatus::Cancelled);
    assert_eq!(
        resolution.run.last_error.as_deref(),
        Some("approval rejected")
    );

    // Reject and continue: the refusal is the tool result the model reads.
    let (task_id, run_id) = stack.start_agent(agent()).await;
    let approval = stack.pending_approval(&task_id).await;
    let approval_id = approval.id.as_str();
    let (status, _) = stack
        .resolve(
            &task_id,
            approval_id,
            json!({ "decision": "approve", "continue": true }),
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    let (status, body) = stack
        .resolve(
            &task_id,
            approval_id,
            json!({ "decision": "reject", "continue": true }),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let resolution: Resolution = support::record(&body);
    assert!(resolution.approval.continue_on_reject);
    let run = stack.client.wait_terminal(&task_id, &run_id, WAIT).await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    // The refusal is recorded as the policy's, in the run's events and the feed.
    let events = stack.client.events(&task_id, &run_id).await;
    let blocked = of_type(&events, EventType::PolicyToolBlocked);
    assert_eq!(blocked.len(), 1, "{events:?}");
    assert_eq!(blocked[0].data["policy"], "approval_rejected");
    assert!(blocked[0].data["step_id"].is_string(), "{:?}", blocked[0]);
    let requests = stack.llm.requests();
    let last = requests.last().unwrap().messages().last().unwrap().clone();
    assert_eq!(last["role"], "tool");
    assert_eq!(last["tool_call_id"], "w3");
    assert!(
        last["content"]
            .as_str()
            .unwrap()
            .to_lowercase()
            .contains("reject")
            || last["content"]
                .as_str()
                .unwrap()
                .to_lowercase()
                .contains("refus"),
        "{last}"
    );
    assert!(
        !stack
            .dir
            .path()
            .join("data")
            .join("workspaces")
            .join(&run_id)
            .join("a.txt")
            .exists()
    );
}

/// A call of a tool outside the task's list is the policy's refusal: the model reads it,
/// and the run's events and the feed say which policy, for which tool.
#[tokio::test]
async fn a_tool_outside_the_tasks_list_is_blocked_and_recorded_as_such() {
    let stack = Stack::start(
        "none",
        vec![
            Turn::tool_call("c1", "shell_exec", r#"{"command": "true"}"#),
            Turn::text("Understood."),
        ],
    )
    .await;
    let (task_id, run_id) = stack
        .start_agent(TaskDraft {
            tools: Some(vec!["list_dir".into()]),
            ..agent()
        })
        .await;
    let run = stack.client.wait_terminal(&task_id, &run_id, WAIT).await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    let events = stack.client.events(&task_id, &run_id).await;
    let blocked = of_type(&events, EventType::PolicyToolBlocked);
    assert_eq!(blocked.len(), 1, "{events:?}");
    assert_eq!(blocked[0].data["policy"], "tool_not_allowed");
    assert_eq!(blocked[0].data["tool"], "shell_exec");
    let reason = blocked[0].data["reason"].as_str().unwrap();
    assert!(reason.contains("not available in this run"), "{reason}");
    // In its activity the call is denied, with the reason, though its step completed.
    let items = activity(&stack.client, &task_id, &run_id).await;
    let call = items
        .iter()
        .find(|i| i.kind == ActivityKind::ToolCall)
        .unwrap();
    assert_eq!(call.status, ActivityStatus::Denied, "{items:#?}");
    assert_eq!(call.reason.as_deref(), Some(reason));
    let (status, feed) = stack
        .client
        .get("/v1/events?event_type=policy.tool_blocked")
        .await;
    assert_eq!(status, StatusCode::OK, "{feed}");
    assert_eq!(feed["data"].as_array().unwrap().len(), 1, "{feed}");
}

/// An operator changes the workspace's approval policy while a run waits for an approval
/// the process setting asked for: the next tool calls follow the new policy, with no
/// restart. The call it denies is refused as the policy's even though it was approved, a
/// write outside its write paths is refused, one inside them runs.
#[tokio::test]
async fn a_policy_change_applies_to_the_next_tool_call_without_a_restart() {
    let stack = Stack::start(
        "shell_exec",
        vec![
            Turn::tool_call("c1", "shell_exec", r#"{"command": "echo hi"}"#),
            Turn::tool_call("c2", "file_write", r#"{"path":"README.md","content":"x"}"#),
            Turn::tool_call("c3", "file_write", r#"{"path":"src/a.txt","content":"y"}"#),
            Turn::text("done"),
        ],
    )
    .await;
    let (task_id, run_id) = stack.start_agent(agent()).await;
    let approval = stack.pending_approval(&task_id).await;
    let allow = GateDecision::Allow;
    let policy = ApprovalPolicyRequest {
        gates: GateDecisions {
            shell_exec: GateDecision::Deny,
            git_exec: allow,
            file_write: allow,
            network_egress: allow,
            read_file: allow,
            all_tools: allow,
        },
        mcp_servers: Default::default(),
        allowed_write_paths: Some(vec!["src".into()]),
    };
    let set = stack.client.api.put_policy("default", &policy).send().await;
    assert_eq!(set.unwrap().data.source, PolicySource::Workspace);
    stack.decide(&task_id, &approval, "approve").await;
    let run = stack.client.wait_terminal(&task_id, &run_id, WAIT).await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    let events = stack.client.events(&task_id, &run_id).await;
    let blocked: Vec<(&str, &str, &str)> = of_type(&events, EventType::PolicyToolBlocked)
        .iter()
        .map(|e| {
            let data = &e.data;
            let field = |name: &str| data[name].as_str().unwrap_or_default();
            (field("tool"), field("policy"), field("reason"))
        })
        .collect();
    assert_eq!(blocked.len(), 2, "{blocked:?}");
    assert_eq!(blocked[0].0, "shell_exec");
    assert!(blocked[0].2.contains("denies shell_exec"), "{blocked:?}");
    assert_eq!(
        (blocked[1].0, blocked[1].1),
        ("file_write", "approval_policy")
    );
    assert!(blocked[1].2.contains("beneath: src"), "{blocked:?}");
    assert!(blocked.iter().all(|b| b.1 == "approval_policy"));
    // No approval for the writes: file_write is allowed, and the one inside ran.
    assert_eq!(stack.llm.requests().len(), 4);
    let patches = stack
        .client
        .api
        .list_patches(&task_id, &run_id)
        .send()
        .await;
    let paths: Vec<String> = patches.unwrap().data.into_iter().map(|p| p.path).collect();
    assert_eq!(paths, ["src/a.txt"]);
}

/// A tool called with `propose: true` leaves the files as they were; an operator applies
/// one proposal over the API (once: then it is applied, and a revert undoes it) and
/// discards the other, whose file never appears.
#[tokio::test]
async fn proposed_patches_wait_for_an_operator_to_apply_or_discard_them() {
    let diff =
        r#"{"patch": "--- /dev/null\n+++ b/extra.txt\n@@ -0,0 +1 @@\n+extra\n", "propose": true}"#;
    let stack = Stack::start(
        "none",
        vec![
            Turn::tool_call(
                "c1",
                "file_write",
                r#"{"path":"notes.txt","content":"one\n"}"#,
            ),
            Turn::tool_call(
                "c2",
                "file_edit",
                r#"{"path":"notes.txt","old_string":"one","new_string":"two","propose":true}"#,
            ),
            Turn::tool_call("c3", "apply_patch", diff),
            Turn::text("proposed"),
        ],
    )
    .await;
    let (task_id, run_id) = stack.start_agent(agent()).await;
    let run = stack.client.wait_terminal(&task_id, &run_id, WAIT).await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    let api = &stack.client.api;
    let patches = api.list_patches(&task_id, &run_id).await.unwrap().data;
    let shape: Vec<(&str, &str)> = patches
        .iter()
        .map(|p| (p.path.as_str(), p.status.as_str()))
        .collect();
    assert_eq!(
        shape,
        [
            ("notes.txt", "applied"),
            ("notes.txt", "proposed"),
            ("extra.txt", "proposed")
        ]
    );
    let workspace = stack.dir.path().join("data/workspaces").join(&run_id);
    let notes = || std::fs::read_to_string(workspace.join("notes.txt")).unwrap();
    assert_eq!(notes(), "one\n", "a proposal changes nothing");
    assert!(!workspace.join("extra.txt").exists());

    let (edit, extra) = (&patches[1].id, &patches[2].id);
    let applied = api
        .apply_patch(&task_id, &run_id, edit)
        .send()
        .await
        .unwrap();
    assert_eq!(applied.data.summary.status, "applied");
    assert_eq!(notes(), "two\n");
    let again = api
        .apply_patch(&task_id, &run_id, edit)
        .send_with_status()
        .await;
    let refusal = again.unwrap_err().to_string();
    assert!(refusal.contains("revert it"), "{refusal}");
    api.revert_patch(&task_id, &run_id, edit)
        .send()
        .await
        .unwrap();
    assert_eq!(
        notes(),
        "one\n",
        "an applied proposal reverts like any patch"
    );
    let discarded = api
        .discard_patch(&task_id, &run_id, extra)
        .send()
        .await
        .unwrap();
    assert_eq!(discarded.data.summary.status, "discarded");
    let late = api
        .apply_patch(&task_id, &run_id, extra)
        .send_with_status()
        .await;
    assert!(late.unwrap_err().to_string().contains("discarded"));
    assert!(!workspace.join("extra.txt").exists());
    let events = stack.client.events(&task_id, &run_id).await;
    assert_eq!(of_type(&events, EventType::ToolFileApplied).len(), 1);
    assert_eq!(of_type(&events, EventType::ToolFileDiscarded).len(), 1);
    assert_eq!(of_type(&events, EventType::ToolFileReverted).len(), 1);
}

/// `network_egress` gates an agent's `shell_exec` when its task has network (a command
/// can reach out as a request can), and not when it has none.
#[tokio::test]
async fn network_egress_gates_shell_exec_only_with_network() {
    let stack = Stack::start(
        "network_egress",
        vec![
            Turn::tool_call("c1", "shell_exec", r#"{"command": "true"}"#),
            Turn::text("Ran it offline."),
        ],
    )
    .await;
    let offline = TaskDraft {
        sandbox_network: Some(false),
        ..agent()
    };
    let (task_id, run_id) = stack.start_agent(offline).await;
    let run = stack.client.wait_terminal(&task_id, &run_id, WAIT).await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");

    stack.llm.push([Turn::tool_call(
        "c2",
        "shell_exec",
        r#"{"command": "true"}"#,
    )]);
    let (task_id, _) = stack.start_agent(agent()).await;
    let approval = stack.pending_approval(&task_id).await;
    assert_eq!(approval.kind, "agent_loop_tool_call");
    assert!(approval.action_summary.join("\n").contains("shell_exec"));
}

#[tokio::test]
async fn continue_is_refused_on_a_pre_execution_gate() {
    let stack = Stack::start("shell_exec", Vec::new()).await;
    let (task_id, _) = stack.client.run_shell("true").await;
    let approval = stack.pending_approval(&task_id).await;
    let (status, body) = stack
        .resolve(
            &task_id,
            &approval.id,
            json!({ "decision": "reject", "continue": true }),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
}

#[tokio::test]
async fn a_call_over_the_budget_is_not_made() {
    let stack = Stack::start(
        "none",
        vec![
            Turn::tool_call("c1", "list_dir", "{}").usage(400, 100, 0),
            Turn::text("never sent"),
        ],
    )
    .await;
    // The first call costs 800 + 1000: the second would go over 1,500.
    let (task_id, run_id) = stack
        .start_agent(TaskDraft {
            budget_micros_usd: Some(1_500),
            ..agent()
        })
        .await;
    let run = stack.client.wait_terminal(&task_id, &run_id, WAIT).await;
    assert_eq!(run.status, RunStatus::Failed, "{run:?}");
    let error = run.last_error.as_deref().unwrap();
    assert!(error.starts_with("budget_exceeded"), "{error}");
    assert!(error.contains("1500") && error.contains("1800"), "{error}");
    assert_eq!(stack.llm.requests().len(), 1);
    assert_eq!(run.model_call_count, 1);
}

#[tokio::test]
async fn a_429_with_retry_after_is_retried_within_the_attempt() {
    let stack = Stack::start(
        "none",
        vec![
            Turn::error(429, "slow down").retry_after("1"),
            Turn::text("hello"),
        ],
    )
    .await;
    let (task_id, run_id) = stack.start_agent(agent()).await;
    let run = stack.client.wait_terminal(&task_id, &run_id, WAIT).await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    assert_eq!(run.attempt, 1);
    assert_eq!(run.model_call_count, 1);
    assert_eq!(stack.llm.requests().len(), 2);
    let events = stack.client.events(&task_id, &run_id).await;
    let completed = of_type(&events, EventType::ModelCallCompleted)[0];
    assert_eq!(completed.data["retries"], 1);
}

/// The first preset's answer to every try of one call: 503, with `Retry-After: 0` so the
/// retries do not wait.
fn outage() -> Vec<Turn> {
    (0..5)
        .map(|_| Turn::error(503, "upstream is down").retry_after("0"))
        .collect()
}

#[tokio::test]
async fn an_unpinned_task_fails_over_to_the_next_chat_preset_and_a_pinned_one_never_does() {
    let stack = Stack::start("none", outage()).await;
    let c = &stack.client;
    let backup = FakeLlm::start(vec![Turn::text("answered by the backup")])
        .await
        .require_key(CANARY);
    let (status, preset) = c
        .post(
            "/v1/providers",
            json!({ "kind": "openai-compatible", "model": "backup-model",
                    "api": "openai-completions", "base_url": backup.openai_base(),
                    "api_key_ref": "env:FAKE_LLM_API_KEY", "enabled": true }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{preset}");
    let backup_id = support::record::<ProviderView>(&preset).id;

    // Pinned to the first preset: its outage fails the run, the backup is never asked.
    let pinned = TaskDraft {
        requested_provider: Some(stack.provider_id.clone()),
        ..agent()
    };
    let (task_id, run_id) = stack.start_agent(pinned).await;
    let run = stack.client.wait_terminal(&task_id, &run_id, WAIT).await;
    assert_eq!(run.status, RunStatus::Failed, "{run:?}");
    let error = run.last_error.clone().unwrap_or_default();
    assert!(error.starts_with("provider_unavailable"), "{error}");
    assert!(!error.contains("failing over"), "{error}");
    assert_eq!(
        stack.llm.requests().len(),
        5,
        "the first try and four retries"
    );
    assert!(
        backup.requests().is_empty(),
        "a pinned task never fails over"
    );

    // Unpinned: the same outage, then the call goes to the next enabled chat preset.
    stack.llm.push(outage());
    let (task_id, run_id) = stack.start_agent(agent()).await;
    let run = stack.client.wait_terminal(&task_id, &run_id, WAIT).await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    assert_eq!(stack.llm.requests().len(), 10);
    assert_eq!(backup.requests().len(), 1);
    assert_eq!(run.provider.as_deref(), Some(backup_id.as_str()));
    let events = stack.client.events(&task_id, &run_id).await;
    let completed = of_type(&events, EventType::ModelCallCompleted)[0];
    assert_eq!(completed.data["provider"], backup_id.as_str());
    assert_eq!(completed.data["model"], "backup-model");
    let failed_over = completed.data["failed_over"].as_array().unwrap();
    assert_eq!(failed_over.len(), 1, "{failed_over:?}");
    assert_eq!(failed_over[0]["provider"], stack.provider_id.as_str());
    assert_eq!(failed_over[0]["model"], MODEL);
    assert!(
        failed_over[0]["error"].as_str().unwrap().contains("503"),
        "{failed_over:?}"
    );
    let ledger: String = sqlx::query_scalar("SELECT provider FROM model_calls WHERE run_id = $1")
        .bind(&run_id)
        .fetch_one(&stack.pool)
        .await
        .unwrap();
    assert_eq!(ledger, backup_id);
    let conversation = stack.conversation(&task_id, &run_id).await;
    let last = conversation.last().unwrap();
    assert_eq!(last["content"], "answered by the backup");
    assert_nowhere_in_the_database(&stack.pool, CANARY).await;
}

#[tokio::test]
async fn a_worker_killed_mid_call_is_replaced_and_no_completed_call_is_repeated() {
    let release = tokio_util::sync::CancellationToken::new();
    let mut stack = Stack::start(
        "none",
        vec![
            Turn::tool_call("c1", "list_dir", "{}"),
            Turn::tool_call("c2", "list_dir", "{}"),
            Turn::text("third, held").hold(release.clone()),
            Turn::text("third, answered by the second worker"),
        ],
    )
    .await;
    let (task_id, run_id) = stack.start_agent(agent()).await;
    stack.llm.wait_for_requests(3, WAIT).await;
    // Calls 1 and 2 are persisted before call 3 starts.
    let persisted: i64 = sqlx::query_scalar("SELECT count(*) FROM model_calls WHERE run_id = $1")
        .bind(&run_id)
        .fetch_one(&stack.pool)
        .await
        .unwrap();
    assert_eq!(persisted, 2);
    let before = transcript(&stack.client, &task_id, &run_id).await;
    let path = format!("/v1/tasks/{task_id}/runs/{run_id}/stream?projection=transcript");
    let mut stream = support::SseReader::open(&stack.client, &path, None).await;
    stack.workers[0].kill9();
    stack.spawn_worker("worker-2");
    let run = stack.client.wait_terminal(&task_id, &run_id, WAIT).await;
    release.cancel();
    // The transcript's frames across the takeover, applied in order from the stream's
    // snapshot, make what a fresh read says (the stream ends after the run's last event).
    let mut followed: Option<RunTranscript> = None;
    while let Some(frame) = stream.next(WAIT).await {
        if frame.event.as_deref() != Some("transcript") {
            continue;
        }
        let change: TranscriptEvent = serde_json::from_value(frame.data).unwrap();
        match (&mut followed, change) {
            (None, TranscriptEvent::TranscriptSnapshot { transcript, .. }) => {
                followed = Some(transcript)
            }
            (Some(transcript), change) => transcript.apply(change),
            (None, change) => panic!("a change before the snapshot: {change:?}"),
        }
    }
    let followed = followed.expect("a snapshot");
    let fresh = transcript(&stack.client, &task_id, &run_id).await;
    let shape = |t: &RunTranscript| json!([t.sequence, t.answer, t.turns]);
    assert_eq!(shape(&followed), shape(&fresh));
    // The takeover's transcript carries on the one read before the kill: the blocks that
    // were complete then come back unchanged, and no model call appears twice.
    let after = transcript(&stack.client, &task_id, &run_id).await;
    let done = |t: &RunTranscript| -> Vec<Value> {
        let blocks = t.turns[0].blocks.iter();
        let done =
            blocks.filter(|b| b.status.is_none() || b.status == Some(BlockStatus::Succeeded));
        done.map(|b| serde_json::to_value(b).unwrap()).collect()
    };
    let (before, after) = (done(&before), done(&after));
    assert_eq!(
        before.len(),
        5,
        "the prompt, 2 calls and 2 tool calls: {before:?}"
    );
    assert_eq!(after[..before.len()], before[..]);
    let calls: Vec<&Value> = after
        .iter()
        .filter_map(|b| b.get("model_call"))
        .filter(|c| !c.is_null())
        .collect();
    let indexes: Vec<i64> = calls.iter().map(|c| c["index"].as_i64().unwrap()).collect();
    assert_eq!(indexes, [1, 2, 3]);
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    assert_eq!(run.model_call_count, 3);
    assert_eq!(stack.llm.completed(), 3);
    assert_eq!(
        stack.llm.requests().len(),
        4,
        "3 completed calls and the one in flight"
    );
    let indexes: Vec<i32> =
        sqlx::query_scalar("SELECT index FROM model_calls WHERE run_id = $1 ORDER BY index")
            .bind(&run_id)
            .fetch_all(&stack.pool)
            .await
            .unwrap();
    assert_eq!(indexes, [1, 2, 3]);
    let conversation = stack.conversation(&task_id, &run_id).await;
    assert_eq!(
        conversation.last().unwrap()["content"],
        "third, answered by the second worker"
    );
}

#[tokio::test]
async fn agent_tasks_are_validated_and_need_a_configured_model() {
    let stack = Stack::start("none", Vec::new()).await;
    let c = &stack.client;
    let cases = [
        (json!({ "execution_kind": "agent_loop" }), "prompt"),
        (
            json!({ "execution_kind": "agent_loop", "prompt": "x", "tools": ["rm_rf"] }),
            "rm_rf",
        ),
        (
            json!({ "execution_kind": "agent_loop", "prompt": "x", "tools": ["grep", "grep"] }),
            "twice",
        ),
        (
            json!({ "execution_kind": "agent_loop", "prompt": "x", "max_model_calls": 0 }),
            "max_model_calls",
        ),
        (
            json!({ "execution_kind": "agent_loop", "prompt": "x", "shell_command": "ls" }),
            "shell_command",
        ),
        (
            json!({ "execution_kind": "shell", "shell_command": "ls", "max_model_calls": 3 }),
            "max_model_calls",
        ),
        (
            json!({ "execution_kind": "agent_loop", "prompt": "x".repeat(64 * 1024 + 1) }),
            "prompt",
        ),
        (
            json!({ "execution_kind": "agent_loop", "prompt": "x", "reasoning_effort": "max" }),
            "reasoning_effort",
        ),
        (
            json!({ "execution_kind": "shell", "shell_command": "ls", "reasoning_effort": "low" }),
            "reasoning_effort",
        ),
        (
            json!({ "execution_kind": "agent_loop", "prompt": "x",
                    "workspace_system_prompt_policy": "sometimes" }),
            "workspace_system_prompt_policy",
        ),
    ];
    for (body, named) in cases {
        let (status, error) = c.post("/v1/tasks", body.clone()).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {error}");
        assert!(error.to_string().contains(named), "{body}: {error}");
    }

    let task = c
        .create_task(&TaskDraft {
            tools: Some(vec!["read_file".into()]),
            max_model_calls: Some(4),
            requested_model: Some("other".into()),
            ..support::agent_loop("hi")
        })
        .await;
    assert_eq!(task.tools, Some(vec!["read_file".to_string()]));
    assert_eq!(task.max_model_calls, Some(4));
    assert_eq!(task.shell_command, None);

    // A provider that does not exist, then a workspace with no chat preset at all.
    let missing = c
        .create_task(&TaskDraft {
            requested_provider: Some("provider_nope".into()),
            ..support::agent_loop("hi")
        })
        .await;
    let id = missing.id.as_str();
    let (status, body) = c.post(&format!("/v1/tasks/{id}/start"), json!({})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["type"], "model_not_configured");
    // A preset named explicitly and disabled: refused at admission, never run.
    let (status, disabled) = c
        .post(
            "/v1/providers",
            json!({ "kind": "openai-compatible", "model": MODEL, "api": "openai-completions",
                    "base_url": stack.llm.openai_base(), "enabled": false }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{disabled}");
    let pinned = c
        .create_task(&TaskDraft {
            requested_provider: Some(support::record::<ProviderView>(&disabled).id),
            ..support::agent_loop("hi")
        })
        .await;
    let id = pinned.id.as_str();
    let (status, body) = c.post(&format!("/v1/tasks/{id}/start"), json!({})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["type"], "provider_disabled");
    let runs: i64 = sqlx::query_scalar("SELECT count(*) FROM runs WHERE task_id = $1")
        .bind(id)
        .fetch_one(&stack.pool)
        .await
        .unwrap();
    assert_eq!(runs, 0, "a refused admission leaves no run");
    let (status, _) = c
        .delete(&format!("/v1/providers/{}", stack.provider_id))
        .await;
    assert!(status.is_success());
    let id = task.id.as_str();
    let (status, body) = c.post(&format!("/v1/tasks/{id}/start"), json!({})).await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
    assert_eq!(body["error"]["type"], "model_not_configured");
}

#[tokio::test]
async fn a_call_in_flight_streams_its_text_to_the_runs_stream_as_model_delta() {
    let release = tokio_util::sync::CancellationToken::new();
    let stack = Stack::start(
        "none",
        vec![Turn::text("Streaming hello from the model").hold(release.clone())],
    )
    .await;
    let (task_id, run_id) = stack.start_agent(agent()).await;
    let path = format!("/v1/tasks/{task_id}/runs/{run_id}/stream");
    let mut stream = support::SseReader::open(&stack.client, &path, None).await;
    // The fake holds the call after its first piece of text: the delta comes mid-call.
    let delta = loop {
        let event = stream
            .next(WAIT)
            .await
            .expect("a model.delta while the call is held");
        if event.event.as_deref() == Some("model.delta") {
            break event;
        }
    };
    // The stream is the run's: the data carries only the call's index and the text.
    assert_eq!(delta.id, None);
    assert_eq!(delta.data["model_call_index"], 1);
    assert!(
        !delta.data["text"].as_str().unwrap().is_empty(),
        "{:?}",
        delta.data
    );
    assert_eq!(stack.llm.completed(), 0);
    release.cancel();
    let run = stack.client.wait_terminal(&task_id, &run_id, WAIT).await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
}

#[tokio::test]
async fn cancelling_a_run_that_waits_for_a_tool_call_approval_cancels_the_approval() {
    let stack = Stack::start(
        "shell_exec",
        vec![Turn::tool_call(
            "s1",
            "shell_exec",
            r#"{"command":"echo hi"}"#,
        )],
    )
    .await;
    let (task_id, run_id) = stack.start_agent(agent()).await;
    let approval = stack.pending_approval(&task_id).await;
    // The approver reads the command itself, not its length.
    assert_eq!(
        approval.action_summary[0], "shell_exec: echo hi",
        "{approval:?}"
    );
    let cancel = format!("/v1/tasks/{task_id}/runs/{run_id}/cancel");
    let (status, body) = stack.client.post_empty(&cancel).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        support::record::<RunRecord>(&body).status,
        RunStatus::Cancelled
    );
    let approval = stack.client.api.get_approval(&task_id, &approval.id).await;
    let approval = approval.unwrap().data;
    assert_eq!(approval.status, ApprovalStatus::Cancelled);
    assert_eq!(approval.resolved_by.as_deref(), Some("system"));
    assert_eq!(stack.queue_rows(&run_id).await, 0);
}

#[tokio::test]
async fn the_default_policy_gates_http_request_so_nothing_is_posted_out_unapproved() {
    let listener = wiremock::MockServer::start().await;
    wiremock::Mock::given(wiremock::matchers::any())
        .respond_with(wiremock::ResponseTemplate::new(200))
        .expect(0)
        .mount(&listener)
        .await;
    let post = json!({ "method": "POST", "url": format!("{}/in?key=k-1", listener.uri()),
                       "body": "the notes the model just read" });
    let stack = Stack::start(
        // KEEL_APPROVAL_POLICIES' default.
        "shell_exec,git_exec,file_write",
        vec![Turn::tool_call("h1", "http_request", &post.to_string())],
    )
    .await;
    let (task_id, run_id) = stack.start_agent(agent()).await;
    let approval = stack.pending_approval(&task_id).await;
    assert_eq!(approval.kind, "agent_loop_tool_call");
    assert_eq!(
        approval.action_summary[0],
        format!("http_request: POST {}/in?…", listener.uri()),
        "{approval:?}"
    );
    stack.decide(&task_id, &approval, "reject").await;
    let run = stack.client.wait_terminal(&task_id, &run_id, WAIT).await;
    assert_eq!(run.status, RunStatus::Cancelled, "{run:?}");
    // `expect(0)` is checked when the listener drops; say it here too.
    assert!(listener.received_requests().await.unwrap().is_empty());
}

/// (role, text) of each message a request carried.
pub(crate) fn said(request: &support::llm::Request) -> Vec<(String, String)> {
    request
        .messages()
        .iter()
        .map(|m| {
            let text = m["content"].as_str().unwrap_or_default().to_string();
            (m["role"].as_str().unwrap_or_default().to_string(), text)
        })
        .collect()
}

fn turn(role: &str, text: &str) -> (String, String) {
    (role.to_string(), text.to_string())
}

#[tokio::test]
async fn continue_retry_from_model_call_and_resume_run_on_a_real_worker() {
    let stack = Stack::start("none", vec![Turn::text("First answer.")]).await;
    let (task_id, first) = stack.start_agent(agent()).await;
    let run = stack.client.wait_terminal(&task_id, &first, WAIT).await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    let runs = format!("/v1/tasks/{task_id}/runs");

    // Continue: the model sees the whole first conversation and the new user turn.
    stack.llm.push([Turn::text("Second answer.")]);
    let (status, body) = stack
        .client
        .post(
            &format!("{runs}/{first}/continue"),
            json!({ "prompt": "And the rest?" }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let continued: RunRecord = support::record(&body);
    assert_eq!(continued.lineage_kind.as_deref(), Some("continue"));
    let continued = continued.id;
    let run = stack.client.wait_terminal(&task_id, &continued, WAIT).await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    assert_eq!(run.model_call_count, 1);
    let asked = stack.llm.requests();
    let expected = vec![
        turn("system", "You are careful."),
        turn("user", "Tidy the notes."),
        turn("assistant", "First answer."),
        turn("user", "And the rest?"),
    ];
    assert_eq!(said(&asked[1]), expected);

    // Retry the continued run from its first call: the same conversation, asked again.
    stack.llm.push([Turn::text("Another second answer.")]);
    let (status, body) = stack
        .client
        .post(
            &format!("{runs}/{continued}/retry-from-model-call"),
            json!({ "model_call_index": 1, "reason": "try again" }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let branched = support::record::<RunRecord>(&body).id;
    let run = stack.client.wait_terminal(&task_id, &branched, WAIT).await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    let asked = stack.llm.requests();
    assert_eq!(asked.len(), 3);
    assert_eq!(said(&asked[2]), expected);
    let conversation = stack.conversation(&task_id, &branched).await;
    assert_eq!(
        conversation.last().unwrap()["content"],
        "Another second answer."
    );

    // Resuming a run whose model had the last word has nothing to ask: no call is made.
    let (status, body) = stack
        .client
        .post(&format!("{runs}/{first}/resume"), json!({}))
        .await;
    assert_eq!(status, StatusCode::CREATED, "{body}");
    let resumed = support::record::<RunRecord>(&body).id;
    let run = stack.client.wait_terminal(&task_id, &resumed, WAIT).await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    assert_eq!(run.model_call_count, 0);
    assert_eq!(stack.llm.requests().len(), 3);

    // Usage adds up to the calls made: one per run that called.
    let usage = stack.client.api.usage_summary(None).await.unwrap().data;
    assert_eq!(usage.totals.calls, 3, "{usage:?}");
}

#[tokio::test]
async fn an_anthropic_preset_runs_the_loop_over_the_messages_api() {
    let mut stack = Stack::start(
        "none",
        vec![
            Turn::tool_call("toolu_1", "list_dir", "{}").usage(50, 5, 10),
            Turn::text("The workspace is empty.").usage(80, 6, 0),
        ],
    )
    .await;
    let provider = stack.use_anthropic().await;
    let (task_id, run_id) = stack
        .start_agent(TaskDraft {
            requested_provider: Some(provider.clone()),
            tools: Some(vec!["list_dir".into()]),
            ..agent()
        })
        .await;
    let run = stack.client.wait_terminal(&task_id, &run_id, WAIT).await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    assert_eq!(run.provider, Some(provider));
    let asked = stack.llm.requests();
    assert_eq!(asked.len(), 2);
    assert!(
        asked
            .iter()
            .all(|r| r.protocol == support::llm::Protocol::Anthropic)
    );
    assert_eq!(asked[0].header("x-api-key"), Some(CANARY));
    assert_eq!(asked[0].body["system"], "You are careful.");
    // The second call carries the tool's result as a tool_result block of a user turn.
    let last = asked[1].messages().last().unwrap().clone();
    assert_eq!(last["role"], "user", "{last}");
    assert_eq!(last["content"][0]["type"], "tool_result", "{last}");
    assert_eq!(last["content"][0]["tool_use_id"], "toolu_1", "{last}");
    // Cached prompt tokens are recorded apart.
    assert_eq!(stack.cached_tokens(&run_id, 1).await, 10);
}

/// With a reasoning effort, an Anthropic preset thinks; the signed thinking block of the
/// turn that asked for a tool goes back with it on the next call, which here is made by a
/// new attempt (after an approval) from the rows the first one persisted. The fake refuses
/// a turn without it, as the API does.
#[tokio::test]
async fn an_anthropic_preset_thinks_and_its_signed_blocks_survive_a_new_attempt() {
    let mut stack = Stack::start(
        "all_tools",
        vec![
            Turn::tool_call("toolu_1", "list_dir", "{}").thinking("Look around first.", "sig-7"),
            Turn::text("The workspace is empty."),
        ],
    )
    .await;
    let provider = stack.use_anthropic().await;
    let (task_id, run_id) = stack
        .start_agent(TaskDraft {
            requested_provider: Some(provider),
            reasoning_effort: Some("medium".into()),
            tools: Some(vec!["list_dir".into()]),
            ..agent()
        })
        .await;
    let approval = stack.pending_approval(&task_id).await;
    stack.decide(&task_id, &approval, "approve").await;
    let run = stack.client.wait_terminal(&task_id, &run_id, WAIT).await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    let asked = stack.llm.requests();
    assert_eq!(asked.len(), 2);
    for request in &asked {
        assert_eq!(request.body["thinking"]["budget_tokens"], 8192);
    }
    let signed =
        json!({"type": "thinking", "thinking": "Look around first.", "signature": "sig-7"});
    let turn = &asked[1].messages()[1];
    assert_eq!(turn["role"], "assistant", "{turn}");
    assert_eq!(turn["content"][0], signed, "{turn}");
    let steps = stack.steps(&task_id, &run_id).await;
    let first_call = steps.iter().find(|s| s.name == "model_call").unwrap();
    let kept = &output(first_call)["response"]["message"]["thinking"];
    assert_eq!(kept, &json!([signed]));
    let answer = &output(steps.iter().rfind(|s| s.name == "model_call").unwrap());
    assert_eq!(
        answer["response"]["message"]["content"],
        "The workspace is empty."
    );
}

#[tokio::test]
async fn an_openai_responses_preset_runs_the_loop_with_tool_calls() {
    let mut stack = Stack::start(
        "none",
        vec![
            Turn::tool_call("call_1", "list_dir", "{}").usage(50, 5, 10),
            Turn::text("The workspace is empty.").usage(80, 6, 0),
        ],
    )
    .await;
    // The Responses API lives beside chat completions: `{base}/responses`.
    let base_url = stack.llm.openai_base();
    let provider = stack
        .use_preset("openai-compatible", "openai-responses", base_url)
        .await;
    let (task_id, run_id) = stack
        .start_agent(TaskDraft {
            requested_provider: Some(provider.clone()),
            tools: Some(vec!["list_dir".into()]),
            reasoning_effort: Some("high".into()),
            ..agent()
        })
        .await;
    let task = stack.client.api.get_task(&task_id).await.unwrap().data;
    assert_eq!(task.reasoning_effort.as_deref(), Some("high"));
    let run = stack.client.wait_terminal(&task_id, &run_id, WAIT).await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    assert_eq!(run.provider, Some(provider));
    assert_eq!(run.model_call_count, 2);
    let asked = stack.llm.requests();
    assert_eq!(asked.len(), 2);
    assert!(
        asked
            .iter()
            .all(|r| r.protocol == support::llm::Protocol::Responses)
    );
    let bearer = format!("Bearer {CANARY}");
    assert_eq!(asked[0].header("authorization"), Some(bearer.as_str()));
    assert_eq!(asked[0].body["instructions"], "You are careful.");
    assert_eq!(asked[0].body["tools"][0]["name"], "list_dir");
    assert_eq!(asked[0].body["reasoning"], json!({"effort": "high"}));
    // The second call carries the call and its result as input items.
    let input = asked[1].body["input"].as_array().unwrap().clone();
    let call = &input[input.len() - 2];
    assert_eq!(call["type"], "function_call", "{input:?}");
    assert_eq!(call["call_id"], "call_1");
    assert_eq!(call["name"], "list_dir");
    let result = &input[input.len() - 1];
    assert_eq!(result["type"], "function_call_output", "{input:?}");
    assert_eq!(result["call_id"], "call_1");
    let steps = stack.steps(&task_id, &run_id).await;
    let tool = steps.iter().find(|s| s.name == "tool_call").unwrap();
    assert_eq!(tool.status, StepStatus::Completed);
    assert_eq!(stack.cached_tokens(&run_id, 1).await, 10);
    let conversation = stack.conversation(&task_id, &run_id).await;
    assert_eq!(
        conversation.last().unwrap()["content"],
        "The workspace is empty."
    );
    assert_nowhere_in_the_database(&stack.pool, CANARY).await;
}

#[tokio::test]
async fn the_system_prompt_has_three_layers_and_the_first_attempt_keeps_them() {
    let roots = tempfile::tempdir().unwrap();
    support::let_the_sandbox_through(roots.path());
    let root = roots.path().to_str().unwrap().to_string();
    let stack = Stack::start_with(
        "none",
        vec![Turn::text("Done."), Turn::text("Done too.")],
        &[
            ("KEEL_WORKSPACE_ROOTS", root.as_str()),
            ("KEEL_AGENT_SYSTEM_PROMPT", "The operator's rules."),
        ],
    )
    .await;
    let project = roots.path().join("project");
    std::fs::create_dir(&project).unwrap();
    std::fs::write(
        project.join("AGENTS.md"),
        "Run the tests before you finish.",
    )
    .unwrap();
    let in_place = TaskDraft {
        workspace_mode: Some("in_place".into()),
        working_directory: Some(project.to_str().unwrap().into()),
        ..agent()
    };
    let (task_id, run_id) = stack.start_agent(in_place.clone()).await;
    let run = stack.client.wait_terminal(&task_id, &run_id, WAIT).await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    let asked = stack.llm.requests();
    assert_eq!(
        said(&asked[0]),
        [
            turn("system", "The operator's rules."),
            turn(
                "system",
                "Instructions from the workspace's AGENTS.md:\n\nRun the tests before you finish."
            ),
            turn("system", "You are careful."),
            turn("user", "Tidy the notes."),
        ]
    );
    // The run keeps what its first attempt composed: a takeover reads it, not the files.
    let base: Value = sqlx::query_scalar("SELECT conversation_base FROM runs WHERE id = $1")
        .bind(&run_id)
        .fetch_one(&stack.pool)
        .await
        .unwrap();
    assert_eq!(base.as_array().unwrap().len(), 4, "{base}");
    assert_eq!(base[1]["content"], asked[0].messages()[1]["content"]);
    // Its context says which layer is whose, as the model read them.
    let context = stack
        .client
        .api
        .get_run_context(&task_id, &run_id)
        .await
        .unwrap()
        .data;
    assert_eq!(context.source, ContextSource::Stored);
    let layers: Vec<(LayerOrigin, &str)> = context
        .layers
        .iter()
        .map(|l| (l.origin, l.content.as_str()))
        .collect();
    assert_eq!(
        layers,
        [
            (LayerOrigin::Runtime, "The operator's rules."),
            (
                LayerOrigin::Workspace,
                "Instructions from the workspace's AGENTS.md:\n\nRun the tests before you finish."
            ),
            (LayerOrigin::Task, "You are careful."),
        ]
    );
    assert_eq!(
        (context.prompt.as_deref(), context.carried_messages),
        (Some(PROMPT), 0)
    );
    let shown = crate::cli::cli(&stack.client.base, &["runs", "context", &run_id]).await;
    let shown = crate::cli::stdout(&shown);
    for line in [
        "source: stored",
        "layer 2 (workspace):",
        "layer 3 (task):",
        "prompt:",
    ] {
        assert!(shown.lines().any(|l| l == line), "{line}\n{shown}");
    }

    // A task that excludes the workspace's files gets the operator's layer and its own.
    let excluded = TaskDraft {
        workspace_system_prompt_policy: Some("exclude".into()),
        ..in_place
    };
    let (task_id, run_id) = stack.start_agent(excluded).await;
    let run = stack.client.wait_terminal(&task_id, &run_id, WAIT).await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    let asked = stack.llm.requests();
    assert_eq!(
        said(&asked[1]),
        [
            turn("system", "The operator's rules."),
            turn("system", "You are careful."),
            turn("user", "Tidy the notes."),
        ]
    );
    let task = stack.client.api.get_task(&task_id).await.unwrap().data;
    assert_eq!(
        task.workspace_system_prompt_policy.as_deref(),
        Some("exclude")
    );
}

#[tokio::test]
async fn a_cloned_repositorys_agents_md_joins_the_system_prompt() {
    let stack = Stack::start("none", vec![Turn::text("Done.")]).await;
    let origin = crate::repo_workspaces::repository();
    let url = crate::repo_workspaces::serve(origin.path()).await;
    let draft = TaskDraft {
        repo: Some(format!("{url}/repo.git")),
        ..agent()
    };
    let (task_id, run_id) = stack.start_agent(draft).await;
    let run = stack.client.wait_terminal(&task_id, &run_id, WAIT).await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");
    // The clone comes first, so the prompt layer reads the repository's file.
    assert_eq!(
        said(&stack.llm.requests()[0]),
        [
            turn(
                "system",
                "Instructions from the workspace's AGENTS.md:\n\nUse the Makefile."
            ),
            turn("system", "You are careful."),
            turn("user", "Tidy the notes."),
        ]
    );
    let steps = stack.steps(&task_id, &run_id).await;
    assert_eq!(steps[0].name, "workspace_clone", "{steps:?}");
}

#[tokio::test]
async fn a_coding_agent_works_in_its_repository_with_every_writer_gated() {
    let origin = crate::repo_workspaces::repository();
    let url = format!(
        "{}/repo.git",
        crate::repo_workspaces::serve(origin.path()).await
    );
    let edit = r#"{"path": "README.md", "old_string": "on main", "new_string": "edited"}"#;
    let script = vec![
        Turn::tool_call("c1", "read_file", r#"{"path": "README.md"}"#).and_tool_call(
            "c2",
            "git_status",
            "{}",
        ),
        Turn::tool_call("c3", "file_edit", edit),
        Turn::text("Edited the README."),
    ];
    // No approval policy gates anything here: the profile gates the writers itself.
    let stack = Stack::start("none", script).await;
    let draft = TaskDraft {
        execution_profile: Some("coding_agent".into()),
        repo: Some(url),
        ..support::agent_loop("Edit the README.")
    };
    let (task_id, run_id) = stack.start_agent(draft).await;
    let approval = stack.pending_approval(&task_id).await;
    assert_eq!(approval.action_summary.len(), 1, "{approval:?}");
    assert!(
        approval.action_summary[0].starts_with("file_edit: README.md"),
        "{approval:?}"
    );
    stack.decide(&task_id, &approval, "approve").await;
    let run = stack.client.wait_terminal(&task_id, &run_id, WAIT).await;
    assert_eq!(run.status, RunStatus::Completed, "{run:?}");

    // The profile's defaults, written into the task.
    let task = stack.client.api.get_task(&task_id).await.unwrap().data;
    assert_eq!(task.execution_profile.as_deref(), Some("coding_agent"));
    assert_eq!(task.workspace_mode, "persistent");
    assert_eq!(task.timeout_ms, Some(300_000));
    let prompt = task.system_prompt.unwrap_or_default();
    assert!(
        prompt.contains("Read a file before you change it"),
        "{prompt}"
    );
    // The reads ran ungated, in the clone, with the git tools on.
    let requests = stack.llm.requests();
    let read = said(&requests[1]);
    assert!(
        read.iter()
            .any(|(role, text)| role == "tool" && text.contains("on main")),
        "{read:?}"
    );
    let tools: Vec<String> = requests[0].body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap().to_string())
        .collect();
    assert!(tools.contains(&"git_diff".to_string()), "{tools:?}");
    let steps = stack.steps(&task_id, &run_id).await;
    assert_eq!(steps[0].name, "workspace_clone", "{steps:?}");

    // A coding agent needs a repository, and is an agent loop.
    for (draft, why) in [
        (
            TaskDraft {
                execution_profile: Some("coding_agent".into()),
                ..agent()
            },
            "needs a repo",
        ),
        (
            TaskDraft {
                execution_profile: Some("coding_agent".into()),
                repo: Some("/srv/repo".into()),
                ..support::shell("ls")
            },
            "only for execution_kind agent_loop",
        ),
        (
            TaskDraft {
                execution_profile: Some("reviewer".into()),
                ..agent()
            },
            "must be one of",
        ),
    ] {
        let (status, body) = stack.client.post("/v1/tasks", support::wire(&draft)).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");
        let message = body["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.starts_with("execution_profile:") && message.contains(why),
            "{body}"
        );
    }
}
