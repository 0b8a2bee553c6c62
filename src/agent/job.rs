//! The attempt of an `agent_loop` run: the loop's plan rebuilt from the run's rows, its
//! model (the task's chat preset) and tools (the run's workspace), and [`AgentContext`] on
//! the run's fenced context. Each model response and tool result is one fenced transaction
//! before the loop goes on; the conversation is written with the attempt's end.

use std::path::Path;
use std::time::Duration;

use chrono::Utc;
use futures_util::future::BoxFuture;
use keel_workers::agent::instructions;
use keel_workers::agent::mcp::{McpTools, is_mcp_tool, server_of};
use keel_workers::agent::provider::{ChatClient, ChatModel, RetryPolicy};
use keel_workers::agent::run_loop::{
    self, AgentContext, AgentPlan, Answer, Budget, LoopOutcome, ModelCall, ToolDecision,
    ToolPolicy, Toolbox,
};
use keel_workers::agent::tools::{self, ToolEnv, WorkspaceTools};
use keel_workers::agent::{Message, ModelResponse, ToolCall, ToolResult, ToolSpec};
use keel_workers::{
    ArtifactHandle, ContextError, Outcome, OutputStream, RunContext, SandboxPolicy, StepHandle,
    StepResult,
};
use serde_json::{Value, json};
use sqlx::{PgConnection, PgPool};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::agent::mcp;
use crate::agent::model_calls;
use crate::agent::model_calls::NewModelCall;
use crate::agent::prices::PriceTable;
use crate::agent::store;
use crate::approvals;
use crate::approvals::{ActionSummary, ApprovalPolicy};
use crate::attempt;
use crate::attempt::Verdict;
use crate::db::StoreError;
use crate::domain::{EventType, Scope, new_id};
use crate::events;
use crate::events::NewEvent;
use crate::providers::chat::chat_config;
use crate::providers::secrets::SecretPolicy;
use crate::providers::{ProviderHosts, ProviderRecord};
use crate::queue::worker::Job;
use crate::runs;
use crate::runs::RunWithTask;
use crate::runs::job::{FencedContext, RunEnding, RunExecutor, RunJobs};
use crate::runs::lineage::Conversation;
use crate::runs::patches;
use crate::runs::steps;
use crate::runs::steps::{NewStep, StepRecord};
use crate::tasks;
use crate::tasks::{TaskRecord, TaskRecordExt};
use keel_api_types::{ExecutionProfile, GateDecision};
use keel_workers::agent::provider::ChatLimits;

/// How long live text is gathered before one notification carries it.
const DELTA_BATCH: Duration = Duration::from_millis(50);
/// `pg_notify` refuses payloads of 8000 bytes or more; the text is cut to stay below this.
const DELTA_PAYLOAD_MAX_BYTES: usize = 7_500;
/// The channel the API's event streams listen on for live text.
const DELTA_CHANNEL: &str = "keel_model_delta";

/// What an agent loop's attempts run with, beside what every run's attempt has
/// ([`RunJobs`]).
pub(crate) struct AgentJobs {
    /// The tools whose calls wait for an approval, and how long one stays actionable.
    pub(crate) approvals: ApprovalPolicy,
    pub(crate) approval_ttl: Option<Duration>,
    /// The cost of each model call (`KEEL_MODEL_PRICES`).
    pub(crate) prices: PriceTable,
    /// Which secret references a chat preset's API key may use.
    pub(crate) secrets: SecretPolicy,
    /// Which hosts a member's chat preset may still call.
    pub(crate) provider_hosts: ProviderHosts,
    /// How model calls are made (`KEEL_CHAT_*`); its private-address switch also lets
    /// `http_request` reach private addresses.
    pub(crate) chat: ChatLimits,
    /// The operator's system prompt (`KEEL_AGENT_SYSTEM_PROMPT`), the first layer.
    pub(crate) system_prompt: Option<String>,
    /// Longest call of an MCP server's tool (`KEEL_MCP_CALL_TIMEOUT_MS`).
    pub(crate) mcp_call_timeout: Duration,
    /// How long an attempt's MCP servers have to start (`KEEL_MCP_CONNECT_TIMEOUT_MS`).
    pub(crate) mcp_connect_timeout: Duration,
}

impl RunExecutor for AgentJobs {
    fn execute<'a>(
        &'a self,
        jobs: &'a RunJobs,
        job: Job,
        row: RunWithTask,
    ) -> BoxFuture<'a, Result<&'static str, StoreError>> {
        Box::pin(execute(jobs, self, job, row))
    }
}

/// Runs one attempt of an agent loop run that [`attempt::begin`] marked running.
async fn execute(
    jobs: &RunJobs,
    agent: &AgentJobs,
    job: Job,
    row: RunWithTask,
) -> Result<&'static str, StoreError> {
    let mut setup = match prepare(jobs, agent, &job.lease.scope(), &row).await? {
        Ok(setup) => setup,
        Err(error) => return jobs.fail(&job, &row, error).await,
    };
    let ctx = FencedAgent::new(jobs, agent, &job, &row, setup.last_step.take());
    // Runs within the task's hooks, after its repository's clone: a base composed here
    // reads the workspace as the clone left it, and MCP servers start in it.
    let outcome = jobs
        .around(&row, &ctx.run, attempt(agent, &ctx, &row.task, setup))
        .await;
    let verdict = verdict(jobs, agent, &ctx, outcome).await;
    drop(ctx);
    attempt::conclude(&jobs.pool, &job, &row, &(), verdict).await
}

/// The loop of one attempt: the conversation's base composed (or the stored one), the MCP
/// servers started in the workspace, then the model and its tools until the loop ends.
async fn attempt(
    agent: &AgentJobs,
    context: &FencedAgent,
    task: &TaskRecord,
    setup: Setup,
) -> LoopOutcome {
    let Setup {
        mut plan,
        model,
        tools,
        mcp,
        base,
        ..
    } = setup;
    let call_timeout = agent.mcp_call_timeout.min(tools.env.call_timeout);
    let limits = mcp::limits(call_timeout, agent.mcp_connect_timeout);
    let started = async {
        context.settle_abandoned().await?;
        let base = match base {
            Some(stored) => stored,
            None => {
                let (base, keep) = composed_base(agent, task, &tools.env.workspace).await;
                context.keep_base(keep.as_deref()).await?;
                base
            }
        };
        plan.messages.splice(0..0, base);
        let mcp = mcp::connect(context, mcp, &tools.env, limits).await?;
        plan.gated_tools.extend(mcp.gated());
        Ok::<_, ContextError>((
            plan,
            RunTools {
                workspace: tools,
                mcp,
            },
        ))
    };
    match started.await {
        Ok((plan, tools)) => {
            let outcome = run_loop::run(&plan, &model, &tools, context).await;
            tools.mcp.shut_down().await;
            outcome
        }
        Err(stopped) => stopped.into(),
    }
}

/// What the attempt's end makes of the run, with the conversation it left.
async fn verdict(
    jobs: &RunJobs,
    agent: &AgentJobs,
    ctx: &FencedAgent,
    outcome: LoopOutcome,
) -> Verdict<RunEnding> {
    let conversation =
        ctx.conversation
            .lock()
            .expect("not poisoned")
            .take()
            .map(|(bytes, answer)| Conversation {
                content: jobs.content.clone(),
                bytes,
                answer,
            });
    let last_step = ctx.last_step.lock().expect("not poisoned").take();
    match (outcome, last_step) {
        (LoopOutcome::Ended(outcome), _) => ctx.run.verdict(outcome, conversation).await,
        // The calls came from the model call step the approval covers.
        (
            LoopOutcome::AwaitingApproval {
                summary,
                incomplete,
            },
            Some(step_id),
        ) => {
            let summary = ActionSummary::of_lines(&summary, incomplete);
            let ttl = agent.approval_ttl;
            let waiting = ctx
                .run
                .awaiting_approval(summary, step_id, ttl, conversation);
            waiting.await
        }
        // Unanswered calls with no model call of this run behind them: a conversation it
        // inherited ended with them.
        (LoopOutcome::AwaitingApproval { .. }, None) => {
            let error = "an approval was asked for with no model call to cover".into();
            let failed = Outcome::Failed {
                exit_code: None,
                error,
            };
            ctx.run.verdict(failed, conversation).await
        }
    }
}

/// What an attempt runs with.
struct Setup {
    plan: AgentPlan,
    model: ChatModel,
    tools: WorkspaceTools,
    /// The task's MCP servers, to start once the workspace is ready.
    mcp: Vec<mcp::Planned>,
    last_step: Option<String>,
    /// The run's stored `conversation_base`; None: the attempt composes it
    /// ([`composed_base`]) once the workspace is ready.
    base: Option<Vec<Message>>,
}

/// The tools of the run's workspace the task allows, each call bounded by the run's
/// timeout.
fn workspace_tools(
    jobs: &RunJobs,
    agent: &AgentJobs,
    scope: &Scope,
    row: &RunWithTask,
    workspace: std::path::PathBuf,
) -> WorkspaceTools {
    let task = &row.task;
    WorkspaceTools {
        allowed: tools::allowed(task.tools.as_deref(), task.sandbox_read_only),
        env: ToolEnv {
            workspace,
            sandbox: task.sandbox(scope.workspace()),
            env: jobs.env(task, &row.run),
            call_timeout: jobs.timeout(task),
            max_output_bytes: tools::DEFAULT_MAX_OUTPUT_BYTES,
            allow_private_addresses: agent.chat.allow_private_addresses,
        },
    }
}

/// Builds the attempt from the rows; `Err(message)` fails the run (a preset that no longer
/// resolves, a secret that cannot be read, a workspace that cannot be used).
async fn prepare(
    jobs: &RunJobs,
    agent: &AgentJobs,
    scope: &Scope,
    row: &RunWithTask,
) -> Result<Result<Setup, String>, StoreError> {
    let (task, run) = (&row.task, &row.run);
    // Canonical as it comes: resolving it again here would follow a link planted since the
    // check (the sandbox opens it following none).
    let workspace = match jobs.workspace(task, run).await? {
        Ok(workspace) => workspace,
        Err(error) => return Ok(Err(error)),
    };
    let base = match &run.conversation_base {
        Some(stored) => match serde_json::from_value::<Vec<Message>>(stored.clone()) {
            Ok(base) => Some(base),
            Err(error) => return Ok(Err(format!("the run's conversation_base: {error}"))),
        },
        None => None,
    };
    let mut conn = jobs.pool.acquire().await?;
    let routes = match tasks::chat_routes(&mut conn, scope, task).await {
        Ok(routes) => routes,
        Err(StoreError::Unprocessable { code, message }) => {
            return Ok(Err(format!("{code}: {message}")));
        }
        Err(error) => return Err(error),
    };
    let model_name = routes[0].1.clone();
    let effort = task.reasoning_effort.as_deref();
    let (primary, fallbacks) = match clients(agent, routes, effort) {
        Ok(clients) => clients,
        Err(error) => return Ok(Err(error)),
    };
    let history = match history(&mut conn, scope, run).await? {
        Ok(history) => history,
        Err(error) => return Ok(Err(error)),
    };
    let prior_model_calls = store::prior_model_calls(&mut conn, scope, &run.id).await?;
    let approval = match &history.last_step {
        Some(step_id) => store::decision(&mut conn, scope, &run.id, step_id).await?,
        None => None,
    };
    drop(conn);
    let timeout = jobs.timeout(task);
    let tools = workspace_tools(jobs, agent, scope, row, workspace);
    let plan = AgentPlan {
        messages: history.messages,
        model_calls: history.model_calls,
        prior_model_calls,
        max_model_calls: task.max_model_calls.map(|n| n.max(0) as u32),
        gated_tools: gated_tools(task),
        approval,
        budget: Budget {
            limit_micros: task.budget_micros_usd,
            spent_micros: run.prior_cost_micros_usd + run.total_cost_micros_usd,
            input_micros_per_token: agent
                .prices
                .price(&model_name)
                .map(|p| p.input_usd_per_mtok),
        },
        deadline: Some(tokio::time::Instant::now() + timeout),
    };
    let servers = task
        .mcp_servers
        .as_ref()
        .map_or(&[][..], |s| s.0.as_slice());
    let rules = (&agent.secrets, &agent.provider_hosts);
    let mcp = mcp::plan(servers, row.written_by, scope.workspace(), rules);
    Ok(Ok(Setup {
        plan,
        model: ChatModel::new(primary, fallbacks, RetryPolicy::default()),
        tools,
        mcp,
        last_step: history.last_step,
        base,
    }))
}

/// The tools whose calls wait for an approval whatever the approval policy says: for a
/// `coding_agent` task, every tool that changes the workspace or runs a command. (The
/// policy's gates are read at each response: [`PolicyReader`].)
fn gated_tools(task: &TaskRecord) -> Vec<String> {
    match task.execution_profile.as_deref() == Some(ExecutionProfile::CodingAgent.as_str()) {
        true => tools::WRITERS.iter().map(|w| w.to_string()).collect(),
        false => Vec::new(),
    }
}

/// The call clients of a run's routes, each asking for the task's reasoning effort. The
/// first (the run's own preset) must resolve, or the run fails with why; a failover route
/// that does not (a secret no longer readable, a host no longer allowed) is left out, with
/// a warning.
fn clients(
    agent: &AgentJobs,
    routes: Vec<(ProviderRecord, String)>,
    reasoning_effort: Option<&str>,
) -> Result<(ChatClient, Vec<ChatClient>), String> {
    let client = |(preset, model): &(ProviderRecord, String)| {
        let mut config = chat_config(
            preset,
            Some(model),
            &agent.secrets,
            &agent.provider_hosts,
            &agent.chat,
        )
        .map_err(|unresolved| format!("{}: {}", unresolved.code, unresolved.message))?;
        config.reasoning_effort = reasoning_effort.map(str::to_string);
        ChatClient::new(config).map_err(|error| format!("provider_error: {error}"))
    };
    let mut routes = routes.iter();
    let primary = client(
        routes
            .next()
            .expect("chat_routes returns one route or more"),
    )?;
    let fallbacks = routes
        .filter_map(|route| {
            client(route)
                .inspect_err(|error| {
                    tracing::warn!(provider = %route.0.id, %error, "failover route left out");
                })
                .ok()
        })
        .collect();
    Ok((primary, fallbacks))
}

/// The conversation so far and what it was built from.
struct History {
    messages: Vec<Message>,
    /// This run's completed model calls.
    model_calls: u32,
    last_step: Option<String>,
}

/// Where a run's conversation starts when it has no base yet: the three system-prompt
/// layers (the operator's `KEEL_AGENT_SYSTEM_PROMPT`, the workspace's instruction files
/// unless the task excludes them, the task's `system_prompt`), then the task's prompt.
/// Returned a second time when the first two layers hold anything: the attempt then keeps
/// it as the run's base, so a takeover starts from the same words whatever the workspace
/// or the next worker's settings hold by then.
async fn composed_base(
    agent: &AgentJobs,
    task: &TaskRecord,
    workspace: &Path,
) -> (Vec<Message>, Option<Vec<Message>>) {
    let operator = agent.system_prompt.iter().map(|content| Message::System {
        content: content.clone(),
    });
    let workspace_layer = if task.workspace_system_prompt_policy.as_deref() == Some("exclude") {
        Vec::new()
    } else {
        let workspace = workspace.to_path_buf();
        tokio::task::spawn_blocking(move || instructions::workspace_layer(&workspace))
            .await
            .unwrap_or_default()
    };
    let layered = agent.system_prompt.is_some() || !workspace_layer.is_empty();
    let task_layer = task.system_prompt.iter().map(|content| Message::System {
        content: content.clone(),
    });
    let prompt = Message::User {
        content: task.prompt.clone().unwrap_or_default(),
    };
    let base: Vec<Message> = operator
        .chain(workspace_layer)
        .chain(task_layer)
        .chain(std::iter::once(prompt))
        .collect();
    let keep = layered.then(|| base.clone());
    (base, keep)
}

/// The conversation after its base: in step order, each completed model call's response
/// and each completed tool call's result.
async fn history(
    conn: &mut PgConnection,
    scope: &Scope,
    run: &crate::runs::RunRecord,
) -> Result<Result<History, String>, StoreError> {
    let mut messages = Vec::new();
    let rows = store::completed_calls(conn, scope, &run.id).await?;
    let (mut model_calls, mut last_step) = (0, None);
    for row in rows {
        let output = row.output.unwrap_or(Value::Null);
        let message = if row.name == "model_call" {
            model_calls += 1;
            last_step = Some(row.id.clone());
            serde_json::from_value::<ModelResponse>(output["response"].clone())
                .map(|response| response.message)
        } else {
            let text = |key: &str| row.input[key].as_str().unwrap_or_default().to_string();
            serde_json::from_value::<ToolResult>(output["result"].clone()).map(|result| {
                Message::Tool {
                    tool_call_id: text("tool_call_id"),
                    name: text("name"),
                    content: result.content,
                }
            })
        };
        match message {
            Ok(message) => messages.push(message),
            Err(error) => return Ok(Err(format!("step {}: {error}", row.id))),
        }
    }
    Ok(Ok(History {
        messages,
        model_calls,
        last_step,
    }))
}

/// The tools a run may call: the workspace's, then its MCP servers'.
struct RunTools {
    workspace: WorkspaceTools,
    mcp: McpTools,
}

impl Toolbox for RunTools {
    fn specs(&self) -> Vec<ToolSpec> {
        let mut specs = self.workspace.specs();
        specs.extend(self.mcp.specs());
        specs
    }

    fn summarize(&self, call: &ToolCall) -> String {
        match is_mcp_tool(&call.name) {
            true => McpTools::summarize(call),
            false => self.workspace.summarize(call),
        }
    }

    async fn call(
        &self,
        call: &ToolCall,
        write_paths: Option<&[String]>,
        cancel: &CancellationToken,
    ) -> ToolResult {
        match is_mcp_tool(&call.name) {
            true => self.mcp.call(call, cancel).await,
            false => self.workspace.call(call, write_paths, cancel).await,
        }
    }
}

/// [`AgentContext`] on the run's fenced context: its held rows are flushed before each
/// model call and tool result, which are then written in one fenced transaction each.
struct FencedAgent {
    run: FencedContext,
    prices: PriceTable,
    last_step: std::sync::Mutex<Option<String>>,
    /// The conversation as last saved, serialized, with the answer that ended it.
    conversation: std::sync::Mutex<Option<(Vec<u8>, Option<String>)>>,
    deltas: Deltas,
    policy: PolicyReader,
}

impl FencedAgent {
    /// The attempt's context: the run's fenced one, with the loop's own state.
    fn new(
        jobs: &RunJobs,
        agent: &AgentJobs,
        job: &Job,
        row: &RunWithTask,
        last_step: Option<String>,
    ) -> FencedAgent {
        let ids = (row.task.id.clone(), row.run.id.clone());
        FencedAgent {
            run: jobs.context(job, row),
            prices: agent.prices.clone(),
            last_step: std::sync::Mutex::new(last_step),
            conversation: std::sync::Mutex::new(None),
            deltas: Deltas::start(jobs.pool.clone(), job.lease.scope(), ids),
            policy: PolicyReader {
                pool: jobs.pool.clone(),
                default: agent.approvals.clone(),
                sandbox: row.task.sandbox(job.lease.scope().workspace()),
            },
        }
    }
}

/// Reads the approval policy in force in the run's workspace when a response's tool calls
/// are answered, so an operator's change applies from the next response on.
struct PolicyReader {
    pool: PgPool,
    /// The process setting, for a workspace without a policy of its own.
    default: ApprovalPolicy,
    sandbox: SandboxPolicy,
}

impl PolicyReader {
    async fn read(&self, scope: &Scope, calls: &[ToolCall]) -> Result<ToolPolicy, StoreError> {
        let mut conn = self.pool.acquire().await?;
        let policy = approvals::policy_in_force(&mut conn, scope, &self.default).await?;
        let decisions = calls
            .iter()
            .map(|call| {
                let (decision, gate) = match server_of(&call.name) {
                    Some((server, _)) => policy.mcp_decision(server, &self.sandbox),
                    None => policy.tool_decision(&call.name, &self.sandbox),
                };
                match decision {
                    GateDecision::Allow => ToolDecision::Allow,
                    GateDecision::Ask => ToolDecision::Ask,
                    GateDecision::Deny => ToolDecision::Deny(format!(
                        "this call is refused: the workspace's approval policy denies {gate}"
                    )),
                }
            })
            .collect();
        let write_paths = policy.write_paths().map(<[String]>::to_vec);
        Ok(ToolPolicy {
            decisions,
            write_paths,
        })
    }
}

impl FencedAgent {
    /// Writes the held rows first (their own transaction), then `write`, with the events
    /// it appends, in one fenced transaction.
    async fn persist(
        &self,
        write: impl AsyncFnOnce(&mut PgConnection) -> Result<(), StoreError>,
    ) -> Result<(), ContextError> {
        let shared = &self.run.shared;
        if shared.fence.interrupt.is_cancelled() {
            return Err(ContextError::Interrupted);
        }
        let mut held = shared.held.lock().await;
        if !held.is_empty() {
            shared.flush_with(&mut held, None).await?;
        }
        let mut tx = shared.fence.begin().await?;
        write(&mut tx)
            .await
            .map_err(|e| shared.fence.context_error(e))?;
        shared.fence.commit(tx).await
    }

    /// Counts the model call a previous attempt left in flight as abandoned, with a
    /// `model.call.abandoned` event, before this attempt makes it again.
    async fn settle_abandoned(&self) -> Result<(), ContextError> {
        let shared = &self.run.shared;
        let (task_id, run_id) = (shared.task_id.as_str(), shared.run_id.as_str());
        let scope = &shared.fence.scope;
        self.persist(async |conn: &mut PgConnection| {
            let Some(index) = model_calls::settle_abandoned(conn, scope, run_id).await? else {
                return Ok(());
            };
            let event = NewEvent::new(task_id, run_id, EventType::ModelCallAbandoned)
                .with(json!({ "index": index }));
            events::append(conn, scope, &[event]).await
        })
        .await
    }

    /// Keeps the conversation's start this attempt composed as the run's base, before its
    /// first model call.
    async fn keep_base(&self, base: Option<&[Message]>) -> Result<(), ContextError> {
        let Some(base) = base else { return Ok(()) };
        let shared = &self.run.shared;
        let (run_id, scope) = (shared.run_id.as_str(), &shared.fence.scope);
        let base = serde_json::to_value(base).expect("messages serialize");
        self.persist(async |conn: &mut PgConnection| {
            runs::keep_conversation_base(conn, scope, run_id, &base).await
        })
        .await
    }

    /// A step's events, about this run.
    fn step_events(&self, step: &StepRecord) -> [NewEvent<'_>; 2] {
        let shared = &self.run.shared;
        let about = |event: NewEvent<'_>| {
            NewEvent::new(&shared.task_id, &shared.run_id, event.event_type).with(event.data)
        };
        [
            about(steps::started_event(step)),
            about(steps::finished_event(step)),
        ]
    }
}

impl RunContext for FencedAgent {
    fn cancellation(&self) -> &CancellationToken {
        self.run.cancellation()
    }

    async fn clear_ahead(&self) -> Result<(), ContextError> {
        self.run.clear_ahead().await
    }

    async fn start_step(&self, name: &str, input: Value) -> Result<StepHandle, ContextError> {
        self.run.start_step(name, input).await
    }

    async fn finish_step(&self, step: &StepHandle, result: StepResult) -> Result<(), ContextError> {
        self.run.finish_step(step, result).await
    }

    async fn open_output(&self, stream: OutputStream) -> Result<ArtifactHandle, ContextError> {
        self.run.open_output(stream).await
    }

    async fn append_output(
        &self,
        artifact: &ArtifactHandle,
        bytes: &[u8],
    ) -> Result<(), ContextError> {
        self.run.append_output(artifact, bytes).await
    }

    async fn close_output(&self, artifact: &ArtifactHandle) -> Result<(), ContextError> {
        self.run.close_output(artifact).await
    }
}

impl AgentContext for FencedAgent {
    async fn tool_policy(&self, calls: &[ToolCall]) -> Result<ToolPolicy, ContextError> {
        let fence = &self.run.shared.fence;
        let read = self.policy.read(&fence.scope, calls).await;
        read.map_err(|e| fence.context_error(e))
    }

    async fn start_model_call(&self, index: u32) -> Result<(), ContextError> {
        let shared = &self.run.shared;
        let (run_id, scope) = (shared.run_id.as_str(), &shared.fence.scope);
        self.persist(async |conn: &mut PgConnection| {
            model_calls::start(conn, scope, run_id, index).await
        })
        .await
    }

    async fn record_model_call(&self, call: &ModelCall) -> Result<Option<i64>, ContextError> {
        let shared = &self.run.shared;
        let Answer {
            response,
            retries,
            route,
            failed_over,
        } = &call.answer;
        let model = match response.model.trim() {
            "" => route.model.as_str(),
            answered => answered,
        };
        let cost = self.prices.cost_micros(model, &response.usage);
        let step_id = new_id("step");
        let input = json!({ "index": call.index });
        let result = StepResult::Completed {
            output: json!({ "response": response, "cost_micros_usd": cost }),
        };
        let now = Utc::now();
        let started_at = now - chrono::Duration::from_std(call.duration).unwrap_or_default();
        let duration_ms = i64::try_from(call.duration.as_millis()).unwrap_or(i64::MAX);
        let (task_id, run_id) = (shared.task_id.as_str(), shared.run_id.as_str());
        let scope = &shared.fence.scope;
        self.persist(async |conn: &mut PgConnection| {
            let step = NewStep {
                id: &step_id,
                task_id,
                run_id,
                name: "model_call",
                input: &input,
                started_at,
                ended: Some((&result, now)),
            };
            let step = steps::insert(conn, scope, &step).await?;
            let ledger = NewModelCall {
                task_id,
                run_id,
                step_id: &step.id,
                index: call.index,
                provider: &route.provider,
                model,
                usage: &response.usage,
                cost_micros_usd: cost,
                duration_ms,
            };
            model_calls::insert(conn, scope, &ledger).await?;
            let data = json!({
                "index": call.index, "provider": route.provider, "model": model,
                "usage": response.usage, "cost_micros_usd": cost, "duration_ms": duration_ms,
                "retries": retries, "failed_over": failed_over,
            });
            let mut appended = Vec::from(self.step_events(&step));
            appended.push(NewEvent::new(task_id, run_id, EventType::ModelCallCompleted).with(data));
            events::append(conn, scope, &appended).await
        })
        .await?;
        *self.last_step.lock().expect("not poisoned") = Some(step_id);
        Ok(cost)
    }

    async fn record_tool_result(
        &self,
        call: &ToolCall,
        result: &ToolResult,
    ) -> Result<(), ContextError> {
        let shared = &self.run.shared;
        let input =
            json!({ "tool_call_id": call.id, "name": call.name, "arguments": call.arguments });
        let ended = StepResult::Completed {
            output: json!({ "result": result }),
        };
        let now = Utc::now();
        let (task_id, run_id) = (shared.task_id.as_str(), shared.run_id.as_str());
        let owner = shared.owner();
        let (scope, content) = (&shared.fence.scope, &shared.content);
        let step_id = new_id("step");
        self.persist(async |conn: &mut PgConnection| {
            let step = NewStep {
                id: &step_id,
                task_id,
                run_id,
                name: "tool_call",
                input: &input,
                started_at: now,
                ended: Some((&ended, now)),
            };
            let step = steps::insert(conn, scope, &step).await?;
            let mut appended = Vec::from(self.step_events(&step));
            if let Some(policy) = &result.blocked {
                let data = json!({ "step_id": step.id, "tool": call.name, "policy": policy,
                                   "reason": result.content });
                appended
                    .push(NewEvent::new(task_id, run_id, EventType::PolicyToolBlocked).with(data));
            }
            for (n, patch) in result.patches.iter().enumerate() {
                let name = format!("patch-{}-{}", step.index, n + 1);
                let record =
                    patches::insert_patch(conn, content, scope, owner, &name, patch).await?;
                appended.push(patches::created_event(owner, &record));
            }
            events::append(conn, scope, &appended).await
        })
        .await
    }

    async fn save_conversation(&self, messages: &[Message]) -> Result<(), ContextError> {
        let bytes = serde_json::to_vec(messages).expect("messages serialize");
        let answer = run_loop::final_answer(messages).map(str::to_owned);
        *self.conversation.lock().expect("not poisoned") = Some((bytes, answer));
        Ok(())
    }

    fn model_delta(&self, index: u32, text: &str) {
        self.deltas.send(index, text);
    }
}

/// Live text of the model calls: batched every [`DELTA_BATCH`] by a task of its own and
/// sent with `pg_notify` outside any transaction. Never blocks the loop; stops (dropping
/// what it has not sent) when the attempt ends.
struct Deltas {
    sender: mpsc::UnboundedSender<(u32, String)>,
    task: tokio::task::JoinHandle<()>,
}

impl Deltas {
    fn start(pool: PgPool, scope: Scope, (task_id, run_id): (String, String)) -> Deltas {
        let (sender, mut receiver) = mpsc::unbounded_channel::<(u32, String)>();
        let task = tokio::spawn(async move {
            while let Some(first) = receiver.recv().await {
                let mut batch = vec![first];
                let until = tokio::time::Instant::now() + DELTA_BATCH;
                while let Ok(Some(next)) = tokio::time::timeout_at(until, receiver.recv()).await {
                    match batch.last_mut() {
                        Some((index, text)) if *index == next.0 => text.push_str(&next.1),
                        _ => batch.push(next),
                    }
                }
                for (index, text) in batch {
                    for piece in pieces(&text) {
                        let payload = json!({
                            "workspace_id": scope.workspace(), "task_id": task_id,
                            "run_id": run_id, "model_call_index": index, "text": piece,
                        });
                        let sent = store::notify(&pool, DELTA_CHANNEL, &payload.to_string()).await;
                        if let Err(error) = sent {
                            tracing::debug!(%error, "a model delta was not delivered");
                        }
                    }
                }
            }
        });
        Deltas { sender, task }
    }

    fn send(&self, index: u32, text: &str) {
        // The receiver lives as long as the attempt; after it, text has nowhere to go.
        let _ = self.sender.send((index, text.to_string()));
    }
}

impl Drop for Deltas {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// `text` cut into pieces whose JSON-escaped form keeps a payload under
/// [`DELTA_PAYLOAD_MAX_BYTES`] (the ids and keys take well under 500 bytes).
fn pieces(text: &str) -> Vec<&str> {
    const MAX_ESCAPED: usize = DELTA_PAYLOAD_MAX_BYTES - 500;
    let mut pieces = Vec::new();
    let (mut start, mut size) = (0, 0);
    for (at, c) in text.char_indices() {
        let escaped = match c {
            '"' | '\\' | '\n' | '\r' | '\t' => 2,
            c if (c as u32) < 0x20 => 6,
            c => c.len_utf8(),
        };
        if size + escaped > MAX_ESCAPED {
            pieces.push(&text[start..at]);
            (start, size) = (at, 0);
        }
        size += escaped;
    }
    pieces.push(&text[start..]);
    pieces
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delta_pieces_keep_each_payload_under_the_limit() {
        let text = "\"é\n".repeat(5_000);
        let cut = pieces(&text);
        assert!(cut.len() > 1);
        assert_eq!(cut.concat(), text);
        for piece in cut {
            assert!(serde_json::to_string(piece).unwrap().len() < DELTA_PAYLOAD_MAX_BYTES - 400);
        }
        assert_eq!(pieces("hi"), ["hi"]);
    }
}
