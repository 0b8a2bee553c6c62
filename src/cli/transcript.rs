//! An agent loop run's transcript as a person reads it: the prompt, each model call's
//! words with its tokens, cost and time, each tool call with its arguments and result
//! (indented, a few lines of each), approvals with the command that decides them, the file
//! changes, then the answer. `keel runs transcript` and `keel runs logs` of an agent run;
//! `keel runs context`, the prompt layers it started from.

use keel_client::{BlockKind, RunContextPacket, RunTranscript, TranscriptBlock};

use crate::cli::output::{call_figures, seconds};

/// The most lines of a tool call's arguments or result printed; the step has them whole.
const SHOWN_LINES: usize = 6;

/// The transcript's lines.
pub(crate) fn lines(transcript: &RunTranscript) -> Vec<String> {
    let mut lines = Vec::new();
    for block in transcript.turns.iter().flat_map(|turn| &turn.blocks) {
        block_lines(block, &mut lines);
    }
    if let Some(answer) = &transcript.answer {
        lines.push("answer:".into());
        indented(answer, usize::MAX, &mut lines);
    }
    lines
}

/// A run's context: where it was read from, each layer under its origin, the prompt.
pub(crate) fn context_lines(context: &RunContextPacket) -> Vec<String> {
    let mut lines = vec![format!("source: {}", context.source)];
    for (n, layer) in context.layers.iter().enumerate() {
        lines.push(format!("layer {} ({}):", n + 1, layer.origin));
        indented(&layer.content, usize::MAX, &mut lines);
    }
    if context.carried_messages > 0 {
        lines.push(format!("carried messages: {}", context.carried_messages));
    }
    if let Some(prompt) = &context.prompt {
        lines.push("prompt:".into());
        indented(prompt, usize::MAX, &mut lines);
    }
    lines
}

fn block_lines(block: &TranscriptBlock, lines: &mut Vec<String>) {
    let text = block.text.as_deref().unwrap_or_default();
    match block.kind {
        BlockKind::UserMessage => {
            lines.push("prompt:".into());
            indented(text, usize::MAX, lines);
        }
        BlockKind::RawDetailRef => lines.push(text.to_string()),
        BlockKind::CoordinatorText => {
            let facts = block.model_call.as_ref().map(|call| {
                let (prompt, completion) = (call.prompt_tokens, call.completion_tokens);
                let figures = call_figures(prompt, completion, call.cost_micros_usd);
                format!("call {} · {figures}{}", call.index, took(call.latency_ms))
            });
            lines.push(format!("model ({}):", facts.unwrap_or_default()));
            indented(text, usize::MAX, lines);
        }
        BlockKind::OperationCell => {
            let Some(tool) = &block.tool else { return };
            let status = if tool.is_error {
                "failed"
            } else {
                status(block)
            };
            lines.push(format!("tool {text} {status}{}", took(tool.latency_ms)));
            lines.push("  arguments:".into());
            indented(&tool.arguments, SHOWN_LINES, lines);
            if let Some(result) = &tool.result {
                lines.push("  result:".into());
                indented(result, SHOWN_LINES, lines);
            }
        }
        BlockKind::Approval => {
            let Some(approval) = &block.approval else {
                return;
            };
            let by = approval
                .resolved_by
                .as_deref()
                .map(|by| format!(" by {by}"));
            lines.push(format!(
                "approval {} {}{}",
                approval.approval_id,
                approval.status,
                by.unwrap_or_default()
            ));
            for action in &approval.action_summary {
                lines.push(format!("    {action}"));
            }
            if let Some(command) = &approval.decide_with {
                lines.push(format!("  decide: {command}"));
            }
        }
        BlockKind::FileChange => {
            let Some(change) = &block.file_change else {
                return;
            };
            let path = change.path.as_deref().unwrap_or("(files of the patch)");
            let id = &change.patch_id;
            lines.push(format!("file {path} {} (patch {id})", change.status));
        }
    }
}

fn status(block: &TranscriptBlock) -> &'static str {
    block.status.map_or("", |status| status.as_str())
}

fn took(latency_ms: Option<i64>) -> String {
    latency_ms.map_or(String::new(), |ms| {
        format!(" · {}", seconds(chrono::TimeDelta::milliseconds(ms)))
    })
}

/// `text` under its heading, indented; past `most` lines, how many more there are.
fn indented(text: &str, most: usize, lines: &mut Vec<String>) {
    let all: Vec<&str> = text.trim_end_matches('\n').split('\n').collect();
    lines.extend(all.iter().take(most).map(|line| format!("    {line}")));
    if all.len() > most {
        lines.push(format!("    … {} more lines", all.len() - most));
    }
}
