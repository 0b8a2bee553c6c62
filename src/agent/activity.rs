//! A run's activity ([`ActivityItem`]s, `projection=activity` on its stream): an agent
//! loop's from its transcript, any other run's from its steps, each ended run's result
//! last. Read in one snapshot, like the transcript it comes from.

use chrono::{DateTime, Utc};
use keel_api_types::{
    ACTIVITY_SUMMARY_CHARS, ActivityItem, ActivityKind, ActivityStatus, ApprovalRecord, BlockKind,
    BlockStatus, RunRecord, RunStatus, RunTranscript, StepRecord, StepStatus, TranscriptBlock,
    cut_chars,
};
use serde_json::Value;
use sqlx::PgPool;

use super::transcript::{self, reference};
use crate::approvals::{self, ApprovalFilter, OLDEST_FIRST};
use crate::db::Result;
use crate::domain::Scope;
use crate::runs::{self, steps};
use crate::tasks;

/// The most characters of a title's detail (a command, a path, an action).
const TITLE_DETAIL_CHARS: usize = 120;

/// The activity of `run_id` as one snapshot reads it.
pub async fn read_snapshot(
    pool: &PgPool,
    scope: &Scope,
    task_id: &str,
    run_id: &str,
) -> Result<Vec<ActivityItem>> {
    let mut tx = transcript::begin_snapshot(pool).await?;
    let task = tasks::get(&mut tx, scope, task_id).await?;
    let run = runs::get(&mut tx, scope, task_id, run_id).await?;
    let mut items = match task.execution_kind.as_str() {
        "agent_loop" => {
            let read = transcript::of_run(&mut tx, scope, &task, run.clone()).await?;
            of_transcript(&read, run.answer.is_some())
        }
        _ => {
            let steps = steps::list(&mut tx, scope, run_id, 0, transcript::MOST_ROWS).await?;
            let filter = ApprovalFilter {
                task_id: Some(task_id),
                run_id: Some(run_id),
                status: None,
            };
            let approvals =
                approvals::list(&mut tx, scope, filter, OLDEST_FIRST, transcript::MOST_ROWS);
            of_steps(&steps, &approvals.await?)
        }
    };
    tx.commit().await?;
    items.extend(result(&run));
    Ok(items)
}

fn item(
    id: &str,
    kind: ActivityKind,
    status: ActivityStatus,
    title: String,
    at: DateTime<Utc>,
) -> ActivityItem {
    ActivityItem {
        id: id.to_string(),
        kind,
        status,
        title,
        summary: None,
        reason: None,
        approval_id: None,
        needs_action: false,
        paths: Vec::new(),
        raw_detail_ref: None,
        at,
    }
}

/// The item of a transcript block, pointing where the block does.
fn of_block(
    block: &TranscriptBlock,
    kind: ActivityKind,
    status: ActivityStatus,
    title: String,
) -> ActivityItem {
    ActivityItem {
        raw_detail_ref: block.raw_detail_ref.clone(),
        ..item(&block.id, kind, status, title, block.updated_at)
    }
}

fn summary(text: &str) -> Option<String> {
    Some(cut_chars(text.trim(), ACTIVITY_SUMMARY_CHARS).0).filter(|s| !s.is_empty())
}

/// An agent loop's items, in its transcript's order; `answered`: its last model call's
/// text is the run's answer.
fn of_transcript(transcript: &RunTranscript, answered: bool) -> Vec<ActivityItem> {
    let blocks: Vec<&TranscriptBlock> = transcript.turns.iter().flat_map(|t| &t.blocks).collect();
    let last_call = blocks
        .iter()
        .rposition(|b| b.kind == BlockKind::CoordinatorText);
    let mut items = Vec::new();
    let mut changed: Vec<String> = Vec::new();
    for (position, block) in blocks.iter().enumerate() {
        let item = match block.kind {
            BlockKind::CoordinatorText => thinking(block, answered && Some(position) == last_call),
            BlockKind::OperationCell => tool_call(block),
            BlockKind::Approval => approval(block),
            BlockKind::FileChange => {
                let item = patch(block);
                if item.status == ActivityStatus::Completed {
                    let new = item.paths.iter().filter(|p| !changed.contains(p)).cloned();
                    changed.extend(new.collect::<Vec<_>>());
                }
                item
            }
            BlockKind::UserMessage | BlockKind::RawDetailRef => continue,
        };
        items.push(item);
    }
    if let Some(last) = items.iter().rfind(|i| i.kind == ActivityKind::Patch) {
        let title = format!("{} file(s) changed", changed.len());
        let (kind, status) = (ActivityKind::ChangedFiles, ActivityStatus::Completed);
        let mut files = item("changed_files", kind, status, title, last.at);
        files.paths = changed;
        // Before the answer, as a review reads them: what changed, then what was said.
        let answer = items
            .iter()
            .position(|i| i.kind == ActivityKind::FinalAnswer);
        items.insert(answer.unwrap_or(items.len()), files);
    }
    items
}

fn block_status(status: Option<BlockStatus>) -> ActivityStatus {
    match status {
        Some(BlockStatus::Running) => ActivityStatus::Running,
        Some(BlockStatus::WaitingForApproval) => ActivityStatus::Waiting,
        Some(BlockStatus::Blocked) => ActivityStatus::Denied,
        Some(BlockStatus::Failed) => ActivityStatus::Failed,
        Some(BlockStatus::Cancelled) => ActivityStatus::Cancelled,
        Some(BlockStatus::Succeeded) | None => ActivityStatus::Completed,
    }
}

fn thinking(block: &TranscriptBlock, answer: bool) -> ActivityItem {
    let call = block.model_call.as_ref();
    let index = call.map_or(0, |c| c.index);
    let model = call
        .and_then(|c| c.model.as_deref())
        .map(|m| format!(" · {m}"));
    let title = format!("model call {index}{}", model.unwrap_or_default());
    let kind = match answer {
        true => ActivityKind::FinalAnswer,
        false => ActivityKind::Thinking,
    };
    let mut item = of_block(block, kind, block_status(block.status), title);
    let asked = call
        .filter(|c| !c.tool_calls.is_empty())
        .map(|c| format!("asked for {}", c.tool_calls.join(", ")));
    item.summary = block.text.as_deref().and_then(summary).or(asked);
    item
}

fn tool_call(block: &TranscriptBlock) -> ActivityItem {
    let tool = block.tool.as_ref();
    let name = tool.map(|t| t.name.clone()).unwrap_or_default();
    let title = block.text.clone().unwrap_or(name);
    let result = tool.and_then(|t| t.result.as_deref()).and_then(summary);
    let status = match tool {
        Some(t) if t.blocked.is_some() => ActivityStatus::Denied,
        Some(t) if t.is_error && block.status == Some(BlockStatus::Succeeded) => {
            ActivityStatus::Failed
        }
        _ => block_status(block.status),
    };
    let mut item = of_block(block, ActivityKind::ToolCall, status, title);
    match status {
        ActivityStatus::Denied | ActivityStatus::Failed => item.reason = result,
        _ => item.summary = result,
    }
    item
}

fn approval(block: &TranscriptBlock) -> ActivityItem {
    let status = block_status(block.status);
    let facts = block.approval.as_ref();
    // The summary's first line says what is asked; the rest (the command, the settings)
    // is the summary's.
    let first = facts.and_then(|f| f.action_summary.first());
    let asked = first.map_or("", |line| line.trim().trim_end_matches(':'));
    let title = format!("approval: {}", cut_chars(asked, TITLE_DETAIL_CHARS).0);
    let mut item = of_block(block, ActivityKind::Approval, status, title);
    item.approval_id = facts.map(|f| f.approval_id.clone());
    item.needs_action = facts.is_some_and(|f| f.status == "pending");
    item.summary = facts.and_then(|f| summary(&f.action_summary.join("\n")));
    item.reason = facts.and_then(|f| f.decision_note.clone());
    item
}

fn patch(block: &TranscriptBlock) -> ActivityItem {
    let change = block.file_change.as_ref();
    let path = change.and_then(|c| c.path.clone());
    let state = change.map_or("applied", |c| c.status.as_str());
    let status = match state {
        "applied" => ActivityStatus::Completed,
        "proposed" => ActivityStatus::Waiting,
        _ => ActivityStatus::Cancelled,
    };
    let title = format!("{} {state}", path.as_deref().unwrap_or("a file"));
    let mut item = of_block(block, ActivityKind::Patch, status, title);
    item.needs_action = state == "proposed";
    item.paths = path.into_iter().collect();
    item
}

/// A run of another kind's items: its steps and the approvals it waited on, in the order
/// they started.
fn of_steps(steps: &[StepRecord], approvals: &[ApprovalRecord]) -> Vec<ActivityItem> {
    let steps = steps.iter().map(|s| (s.started_at, step(s)));
    let approvals = approvals.iter().map(|a| {
        let block = transcript::approval(a);
        (a.created_at, approval(&block))
    });
    let mut items: Vec<_> = steps.chain(approvals).collect();
    items.sort_by_key(|(started, _)| *started);
    items.into_iter().map(|(_, item)| item).collect()
}

/// A step of a run of another kind: its name and what it ran or wrote.
fn step(step: &StepRecord) -> ActivityItem {
    let argv = step.input["argv"].as_array().map(|argv| {
        let words: Vec<&str> = argv.iter().filter_map(Value::as_str).collect();
        words.join(" ")
    });
    let detail = argv.or_else(|| step.input["path"].as_str().map(str::to_string));
    let title = match detail {
        Some(detail) => format!(
            "{}: {}",
            step.name,
            cut_chars(&detail, TITLE_DETAIL_CHARS).0
        ),
        None => step.name.clone(),
    };
    let status = match step.status {
        StepStatus::Running => ActivityStatus::Running,
        StepStatus::Completed => ActivityStatus::Completed,
        StepStatus::Failed => ActivityStatus::Failed,
        StepStatus::Cancelled => ActivityStatus::Cancelled,
    };
    let at = step.finished_at.unwrap_or(step.started_at);
    let mut item = item(&step.id, ActivityKind::Step, status, title, at);
    item.reason = step.error.as_deref().and_then(summary);
    item.raw_detail_ref = reference("workflow_step", &step.id);
    item
}

/// How an ended run ended; nothing while it goes on.
fn result(run: &RunRecord) -> Option<ActivityItem> {
    let status = match run.status() {
        RunStatus::Completed => ActivityStatus::Completed,
        RunStatus::Failed => ActivityStatus::Failed,
        RunStatus::Cancelled => ActivityStatus::Cancelled,
        _ => return None,
    };
    let code = run
        .terminal_code
        .map_or(run.status().as_str(), |c| c.as_str());
    let at = run.finished_at.unwrap_or(run.updated_at);
    let title = format!("run {code}");
    let mut item = item("run_result", ActivityKind::RunResult, status, title, at);
    item.summary = run.exit_code.map(|code| format!("exit code {code}"));
    item.reason = run.last_error.as_deref().and_then(summary);
    item.raw_detail_ref = reference("run", &run.id);
    Some(item)
}
