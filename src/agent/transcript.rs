//! An agent loop run read as its transcript ([`RunTranscript`]): the prompt, then the
//! run's steps in order (each model call's text with its figures, each tool call with its
//! arguments and an abridged result, the file changes it made), each approval after the
//! model call it covers. Built from persisted rows alone, in one snapshot: what an attempt
//! lost with its worker was never written, so a takeover reads like a run that never
//! stopped.

use chrono::{DateTime, Utc};
use keel_api_types::{
    ApprovalFacts, ApprovalRecord, BlockKind, BlockStatus, ErrorCode, FileChangeFacts,
    ModelCallFacts, OperationKind, RawDetailRef, RunStatus, RunTranscript, StepStatus, ToolFacts,
    TranscriptBlock, TranscriptTurn, TurnStatus, cut_chars,
};
use keel_workers::agent::mcp::server_of;
use keel_workers::agent::tools::{summarize, written_paths};
use keel_workers::agent::{Message, ToolCall};
use serde_json::Value;
use sqlx::{PgConnection, PgPool, Postgres, Transaction};

use crate::approvals::{self, ApprovalFilter, OLDEST_FIRST};
use crate::db::{Result, StoreError};
use crate::domain::Scope;
use crate::events;
use crate::runs::patches::{self, PatchRow};
use crate::runs::steps::{self, StepRecord};
use crate::runs::{self, RunRecord};
use crate::tasks::{self, TaskRecord};

/// The longest a tool call's arguments or result is inline; the step has it whole.
const INLINE_CHARS: usize = 2_000;
/// The most steps, approvals and patches one read shows; past them a run is read through
/// its lists.
pub(super) const MOST_ROWS: i64 = 2_000;

/// The transcript of `run_id`, of an agent loop task, as `conn` reads it
/// ([`read_snapshot`] reads it in one snapshot).
async fn read(
    conn: &mut PgConnection,
    scope: &Scope,
    task_id: &str,
    run_id: &str,
) -> Result<RunTranscript> {
    let (task, run) = agent_run(conn, scope, task_id, run_id).await?;
    of_run(conn, scope, &task, run).await
}

/// The transcript of `run`, of the agent loop task `task`.
pub(super) async fn of_run(
    conn: &mut PgConnection,
    scope: &Scope,
    task: &TaskRecord,
    run: RunRecord,
) -> Result<RunTranscript> {
    let run_id = run.id.as_str();
    let sequence = events::last_sequence_of_run(conn, scope, run_id).await?;
    let steps = steps::list(conn, scope, run_id, 0, MOST_ROWS).await?;
    let filter = ApprovalFilter {
        task_id: Some(&task.id),
        run_id: Some(run_id),
        status: None,
    };
    let approvals = approvals::list(conn, scope, filter, OLDEST_FIRST, MOST_ROWS).await?;
    let patches = patches::list(conn, scope, run_id, None, MOST_ROWS).await?;
    let rows = Rows {
        steps,
        approvals,
        patches,
    };
    Ok(transcript(task, run, rows, sequence))
}

/// The task and run of an agent loop run; another kind's is refused (422): only an agent
/// loop has a transcript or a context.
pub(crate) async fn agent_run(
    conn: &mut PgConnection,
    scope: &Scope,
    task_id: &str,
    run_id: &str,
) -> Result<(TaskRecord, RunRecord)> {
    let task = tasks::get(conn, scope, task_id).await?;
    let run = runs::get(conn, scope, task_id, run_id).await?;
    if task.execution_kind != "agent_loop" {
        let kind = &task.execution_kind;
        return Err(StoreError::Unprocessable {
            code: ErrorCode::UnsupportedCapability,
            message: format!(
                "run {run_id} is a {kind} run: only an agent loop's has a transcript and a \
                 context; its output is its stdout and stderr (keel runs logs {run_id})"
            ),
        });
    }
    Ok((task, run))
}

/// [`read`] in a transaction of its own, one snapshot (repeatable read): the steps,
/// approvals and patches agree with `sequence`.
pub async fn read_snapshot(
    pool: &PgPool,
    scope: &Scope,
    task_id: &str,
    run_id: &str,
) -> Result<RunTranscript> {
    let mut tx = begin_snapshot(pool).await?;
    let transcript = read(&mut tx, scope, task_id, run_id).await?;
    tx.commit().await?;
    Ok(transcript)
}

/// A read-only transaction whose reads all see one snapshot (repeatable read).
pub(super) async fn begin_snapshot(pool: &PgPool) -> Result<Transaction<'static, Postgres>> {
    let mut tx = pool.begin().await?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        .execute(&mut *tx)
        .await?;
    Ok(tx)
}

/// What a transcript is made of.
struct Rows {
    steps: Vec<StepRecord>,
    approvals: Vec<ApprovalRecord>,
    patches: Vec<PatchRow>,
}

fn transcript(task: &TaskRecord, run: RunRecord, rows: Rows, sequence: i64) -> RunTranscript {
    let mut blocks = Vec::new();
    if let Some(source) = &run.resumed_from_run_id {
        blocks.push(carried_on(source, &run));
    }
    blocks.push(prompt(task, &run));
    for step in &rows.steps {
        match step.name.as_str() {
            "model_call" => {
                blocks.push(model_call(step));
                let covers = |a: &&ApprovalRecord| a.step_id.as_deref() == Some(&step.id);
                blocks.extend(rows.approvals.iter().filter(covers).map(approval));
            }
            "tool_call" => {
                let (block, call) = tool_call(step);
                blocks.push(block);
                let paths = written_paths(&call);
                let prefix = format!("patch-{}-", step.index);
                for patch in &rows.patches {
                    // The n-th patch of a call (`patch-INDEX-n`) is its n-th file.
                    let Some(n) = patch.name.strip_prefix(&prefix) else {
                        continue;
                    };
                    let nth = n
                        .parse::<usize>()
                        .ok()
                        .and_then(|n| paths.get(n.checked_sub(1)?));
                    blocks.push(file_change(patch, nth.cloned()));
                }
            }
            // Setup and hooks are the runtime's, not the conversation's: the steps list
            // has them.
            _ => {}
        }
    }
    let uncovered =
        |a: &&ApprovalRecord| !rows.steps.iter().any(|s| Some(&s.id) == a.step_id.as_ref());
    blocks.extend(rows.approvals.iter().filter(uncovered).map(approval));
    let turn = TranscriptTurn {
        id: run.id.clone(),
        status: turn_status(run.status),
        blocks,
        created_at: run.created_at,
        updated_at: run.updated_at,
    };
    RunTranscript {
        schema_version: 1,
        task_id: run.task_id,
        run_id: run.id,
        answer: run.answer,
        sequence,
        generated_at: Utc::now(),
        turns: vec![turn],
    }
}

fn turn_status(status: RunStatus) -> TurnStatus {
    match status {
        RunStatus::Queued => TurnStatus::Open,
        RunStatus::Running => TurnStatus::Running,
        RunStatus::AwaitingApproval => TurnStatus::WaitingForApproval,
        RunStatus::Completed => TurnStatus::Succeeded,
        RunStatus::Failed => TurnStatus::Failed,
        RunStatus::Cancelled => TurnStatus::Cancelled,
    }
}

fn step_status(status: StepStatus) -> BlockStatus {
    match status {
        StepStatus::Running => BlockStatus::Running,
        StepStatus::Completed => BlockStatus::Succeeded,
        StepStatus::Failed => BlockStatus::Failed,
        StepStatus::Cancelled => BlockStatus::Cancelled,
    }
}

/// A block of `kind` with its times; the caller sets what it carries.
fn block(id: &str, kind: BlockKind, at: (DateTime<Utc>, DateTime<Utc>)) -> TranscriptBlock {
    TranscriptBlock {
        id: id.to_string(),
        kind,
        status: None,
        text: None,
        model_call: None,
        tool: None,
        approval: None,
        file_change: None,
        raw_detail_ref: None,
        created_at: at.0,
        updated_at: at.1,
    }
}

pub(super) fn reference(kind: &str, id: &str) -> Option<RawDetailRef> {
    Some(RawDetailRef {
        kind: kind.to_string(),
        id: id.to_string(),
    })
}

/// A resumed, continued or retried-from-a-call run starts from its source's conversation:
/// the transcript points there rather than repeating it.
fn carried_on(source: &str, run: &RunRecord) -> TranscriptBlock {
    let mut block = block(
        "lineage",
        BlockKind::RawDetailRef,
        (run.created_at, run.created_at),
    );
    let how = run.lineage_kind.as_deref().unwrap_or("resume");
    block.text = Some(format!(
        "Carries on the conversation of run {source} ({how})."
    ));
    block.raw_detail_ref = reference("run", source);
    block
}

/// The words the run started from: the last person's message of its stored base (a
/// continuation's), or the task's prompt.
fn prompt(task: &TaskRecord, run: &RunRecord) -> TranscriptBlock {
    let base = run
        .conversation_base
        .clone()
        .map(serde_json::from_value::<Vec<Message>>);
    let asked = base.and_then(|messages| {
        messages
            .ok()?
            .into_iter()
            .rev()
            .find_map(|message| match message {
                Message::User { content } => Some(content),
                _ => None,
            })
    });
    let mut block = block(
        "prompt",
        BlockKind::UserMessage,
        (run.created_at, run.created_at),
    );
    block.text = asked.or_else(|| task.prompt.clone());
    block
}

fn latency_ms(step: &StepRecord) -> Option<i64> {
    step.finished_at
        .map(|end| (end - step.started_at).num_milliseconds().max(0))
}

fn times(step: &StepRecord) -> (DateTime<Utc>, DateTime<Utc>) {
    (step.started_at, step.finished_at.unwrap_or(step.started_at))
}

fn model_call(step: &StepRecord) -> TranscriptBlock {
    let output = step.output.as_ref().unwrap_or(&Value::Null);
    let response = &output["response"];
    let message = &response["message"];
    let usage = &response["usage"];
    let tool_calls = message["tool_calls"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut block = block(&step.id, BlockKind::CoordinatorText, times(step));
    block.status = Some(step_status(step.status));
    block.text = Some(message["content"].as_str().unwrap_or_default().to_string());
    block.model_call = Some(ModelCallFacts {
        index: step.input["index"].as_i64().unwrap_or_default(),
        model: response["model"].as_str().map(str::to_string),
        prompt_tokens: usage["prompt_tokens"].as_i64(),
        completion_tokens: usage["completion_tokens"].as_i64(),
        cost_micros_usd: output["cost_micros_usd"].as_i64(),
        latency_ms: latency_ms(step),
        tool_calls: tool_calls
            .iter()
            .filter_map(|call| call["name"].as_str().map(str::to_string))
            .collect(),
    });
    block.raw_detail_ref = reference("workflow_step", &step.id);
    block
}

/// The block of a tool call's step, and the call it made.
fn tool_call(step: &StepRecord) -> (TranscriptBlock, ToolCall) {
    let text = |key: &str| step.input[key].as_str().unwrap_or_default().to_string();
    let call = ToolCall {
        id: text("tool_call_id"),
        name: text("name"),
        arguments: text("arguments"),
    };
    let result = step.output.as_ref().map(|output| &output["result"]);
    let content = match (result, &step.error) {
        (_, Some(error)) => Some(error.as_str()),
        (Some(result), None) => result["content"].as_str(),
        (None, None) => None,
    };
    let (arguments, cut_arguments) = abridged(&call.arguments);
    let (result_text, cut_result) = content.map(abridged).unzip();
    let is_error = step.status == StepStatus::Failed
        || result.is_some_and(|r| r["is_error"].as_bool() == Some(true));
    let mut block = block(&step.id, BlockKind::OperationCell, times(step));
    block.status = Some(step_status(step.status));
    block.text = Some(summarize(&call));
    block.tool = Some(ToolFacts {
        server: server_of(&call.name).map(|(server, _)| server.to_string()),
        operation_kind: operation_kind(&call.name),
        arguments,
        result: result_text,
        is_error,
        blocked: result.and_then(|r| r["blocked"].as_str().map(str::to_string)),
        abridged: cut_arguments || cut_result == Some(true),
        latency_ms: latency_ms(step),
        name: call.name.clone(),
    });
    block.raw_detail_ref = reference("workflow_step", &step.id);
    (block, call)
}

/// What a workspace tool does; an MCP server's tools are `other`.
fn operation_kind(tool: &str) -> OperationKind {
    match tool {
        "read_file" | "list_dir" | "git_status" | "git_diff" | "http_request" => {
            OperationKind::Read
        }
        "file_write" | "file_edit" | "apply_patch" => OperationKind::Edit,
        "shell_exec" => OperationKind::RunCommand,
        "grep" | "glob" => OperationKind::Search,
        _ => OperationKind::Other,
    }
}

/// `text` cut to [`INLINE_CHARS`] characters, and whether it was.
fn abridged(text: &str) -> (String, bool) {
    cut_chars(text, INLINE_CHARS)
}

pub(super) fn approval(approval: &ApprovalRecord) -> TranscriptBlock {
    let at = (
        approval.created_at,
        approval.resolved_at.unwrap_or(approval.created_at),
    );
    let status = approval.status.as_str();
    let pending = status == "pending";
    let mut block = block(&approval.id, BlockKind::Approval, at);
    block.status = Some(match status {
        "pending" => BlockStatus::WaitingForApproval,
        "approved" => BlockStatus::Succeeded,
        "rejected" => BlockStatus::Blocked,
        _ => BlockStatus::Cancelled,
    });
    block.approval = Some(ApprovalFacts {
        approval_id: approval.id.clone(),
        status: status.to_string(),
        action_summary: approval.action_summary.clone(),
        resolved_by: approval.resolved_by.clone(),
        decision_note: approval.decision_note.clone(),
        decide_with: pending.then(|| {
            let id = &approval.id;
            format!("keel approvals approve {id} (or keel approvals reject {id})")
        }),
    });
    block.raw_detail_ref = reference("approval", &approval.id);
    block
}

/// A patch a tool call made, of the file `path` its arguments named.
fn file_change(patch: &PatchRow, path: Option<String>) -> TranscriptBlock {
    let mut block = block(
        &patch.id,
        BlockKind::FileChange,
        (patch.created_at, patch.created_at),
    );
    block.status = Some(BlockStatus::Succeeded);
    block.file_change = Some(FileChangeFacts {
        patch_id: patch.id.clone(),
        path,
        status: patch.patch_status.clone(),
    });
    block.raw_detail_ref = reference("artifact", &patch.id);
    block
}
