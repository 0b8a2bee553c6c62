//! Lineage of agent loop runs: continue (one more user turn), retry from a model call, and
//! the conversation a resume hydrates. Each reads the finished source run's
//! `agent_conversation` artifact, builds the new run's `conversation_base` from it, and
//! admits the run through the same transaction as start, retry and resume
//! ([`crate::api::admission::admit`]), which keeps one active run per task and the workspace scope.
//!
//! The checks here run before that transaction; they are stable because a finished run never
//! changes again (its conversation, status and model call count are final), and the
//! admission re-checks under the task's lock that the source is finished.

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use futures_util::StreamExt;
use keel_api_types::{ContinueRequest, RetryFromModelCallRequest, StartRequest};
use keel_workers::agent::Message;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::api::admission::{Admitted201, admit};
use crate::api::extract::ApiJson;
use crate::api::{ApiError, AppState, ObjectEnvelope};
use crate::artifacts::ArtifactRecord;
use crate::domain::Caller;
use crate::runs::lineage;
use crate::runs::lineage::CONVERSATION_ARTIFACT;
use crate::runs::{Origin, RunRecord};
use crate::{runs, tasks};

/// The longest follow-up prompt, as for a task's prompt.
const MAX_PROMPT_BYTES: usize = 64 * 1024;

type Result<T> = std::result::Result<T, ApiError>;

pub(crate) fn router() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(continue_run))
        .routes(routes!(retry_from_model_call))
}

/// Continues a finished agent loop run: a new run (`lineage_kind` `continue`) in its
/// workspace, with its cost, whose conversation is the source's plus the user turn `prompt`.
#[utoipa::path(post, path = "/tasks/{task_id}/runs/{run_id}/continue", tag = "runs",
    request_body = ContinueRequest,
    params(("task_id" = String, Path), ("run_id" = String, Path), ("Idempotency-Key" = Option<String>, Header, pattern = "^[!-~]{1,255}$")),
    responses((status = 201, description = "The new run", body = ObjectEnvelope<RunRecord>),
              (status = 200, description = "A replayed request's run", body = ObjectEnvelope<RunRecord>),
              (status = 400, description = "Not an agent loop task, an empty prompt, or no readable conversation"),
              (status = 409, description = "The source run is still active")))]
async fn continue_run(
    State(state): State<AppState>,
    caller: Caller,
    Path((task_id, run_id)): Path<(String, String)>,
    headers: HeaderMap,
    ApiJson(request): ApiJson<ContinueRequest>,
) -> Result<Admitted201> {
    let prompt = request.prompt;
    if prompt.trim().is_empty() {
        return Err(ApiError::invalid("prompt must not be empty"));
    }
    if prompt.len() > MAX_PROMPT_BYTES {
        return Err(ApiError::invalid(format!(
            "prompt must be at most {MAX_PROMPT_BYTES} bytes"
        )));
    }
    let source = finished_agent_run(&state, &caller, &task_id, &run_id).await?;
    let conversation = required_conversation(&state, &caller, &source).await?;
    let base = continued(conversation, prompt.clone());
    let origin = Origin::Continue { run_id, prompt };
    let request = StartRequest::default();
    admit(
        &state,
        &caller,
        &task_id,
        origin,
        &headers,
        request,
        Some(json(&base)),
    )
    .await
}

/// Retries a finished agent loop run from its `model_call_index`-th model call: a new run
/// (`lineage_kind` `retry_from_model_call`) in its workspace, with its cost, whose
/// conversation is the source's cut immediately before that call's response, so the model
/// answers it again. The new run's model call and step indices restart at 1.
#[utoipa::path(post, path = "/tasks/{task_id}/runs/{run_id}/retry-from-model-call", tag = "runs",
    request_body = RetryFromModelCallRequest,
    params(("task_id" = String, Path), ("run_id" = String, Path), ("Idempotency-Key" = Option<String>, Header, pattern = "^[!-~]{1,255}$")),
    responses((status = 201, description = "The new run", body = ObjectEnvelope<RunRecord>),
              (status = 200, description = "A replayed request's run", body = ObjectEnvelope<RunRecord>),
              (status = 400, description = "Not an agent loop task, an index outside [1, model_call_count], or no readable conversation"),
              (status = 409, description = "The source run is still active")))]
async fn retry_from_model_call(
    State(state): State<AppState>,
    caller: Caller,
    Path((task_id, run_id)): Path<(String, String)>,
    headers: HeaderMap,
    ApiJson(request): ApiJson<RetryFromModelCallRequest>,
) -> Result<Admitted201> {
    let source = finished_agent_run(&state, &caller, &task_id, &run_id).await?;
    let count = source.model_call_count;
    let index = i32::try_from(request.model_call_index)
        .ok()
        .filter(|n| (1..=count).contains(n))
        .ok_or_else(|| {
            ApiError::invalid(format!(
                "model_call_index must be between 1 and the run's model_call_count ({count}), \
                 not {}",
                request.model_call_index
            ))
        })?;
    let conversation = required_conversation(&state, &caller, &source).await?;
    let base = truncated_before(conversation, source.conversation_base.as_ref(), index)
        .ok_or_else(|| {
            ApiError::invalid(format!(
                "run {}'s agent_conversation artifact does not hold its model call {index}",
                source.id
            ))
        })?;
    let origin = Origin::RetryFromModelCall { run_id, index };
    let request = StartRequest {
        reason: request.reason,
        budget_micros_usd: None,
    };
    admit(
        &state,
        &caller,
        &task_id,
        origin,
        &headers,
        request,
        Some(json(&base)),
    )
    .await
}

/// The conversation a resume of `run_id` starts from: for a finished agent loop run, its
/// `agent_conversation` artifact, or (when it saved none) the conversation it started from
/// itself. None for other tasks, and for a run that is not finished (the admission refuses
/// to resume it).
pub(super) async fn resume_base(
    state: &AppState,
    caller: &Caller,
    task_id: &str,
    run_id: &str,
) -> Result<Option<serde_json::Value>> {
    let mut conn = state.pool.acquire().await?;
    let task = tasks::get(&mut conn, &caller.scope, task_id).await?;
    let source = runs::get(&mut conn, &caller.scope, task_id, run_id).await?;
    drop(conn);
    if !task.is_agent_loop() || !source.status().is_terminal() {
        return Ok(None);
    }
    Ok(match conversation(state, caller, &source).await? {
        Some(conversation) => Some(json(&conversation)),
        None => source.conversation_base,
    })
}

/// The source run of continue or retry-from-model-call: a finished run of an agent loop
/// task in the caller's workspace.
async fn finished_agent_run(
    state: &AppState,
    caller: &Caller,
    task_id: &str,
    run_id: &str,
) -> Result<RunRecord> {
    let mut conn = state.pool.acquire().await?;
    let task = tasks::get(&mut conn, &caller.scope, task_id).await?;
    // Both exist in the caller's workspace before anything about them is said.
    let source = runs::get(&mut conn, &caller.scope, task_id, run_id).await?;
    if !task.is_agent_loop() {
        return Err(ApiError::invalid(format!(
            "task {task_id} is a {} task; only agent_loop runs can be continued or retried \
             from a model call",
            task.execution_kind
        )));
    }
    if !source.status().is_terminal() {
        return Err(ApiError::Conflict(format!(
            "run {run_id} is {}; only a finished run can be continued or retried from a \
             model call",
            source.status
        )));
    }
    Ok(source)
}

/// The source run's conversation, which continue and retry-from-model-call need.
async fn required_conversation(
    state: &AppState,
    caller: &Caller,
    source: &RunRecord,
) -> Result<Vec<Message>> {
    conversation(state, caller, source).await?.ok_or_else(|| {
        ApiError::invalid(format!(
            "run {} has no {CONVERSATION_ARTIFACT} artifact to start from",
            source.id
        ))
    })
}

/// The run's saved conversation; None when it saved none, 400 when it is unreadable.
async fn conversation(
    state: &AppState,
    caller: &Caller,
    run: &RunRecord,
) -> Result<Option<Vec<Message>>> {
    let artifact = {
        let mut conn = state.pool.acquire().await?;
        lineage::conversation_artifact(&mut conn, &caller.scope, &run.id).await?
    };
    match artifact {
        None => Ok(None),
        Some(artifact) => read_conversation(state, &artifact).await.map(Some),
    }
}

async fn read_conversation(state: &AppState, artifact: &ArtifactRecord) -> Result<Vec<Message>> {
    let unreadable = |why: String| {
        ApiError::invalid(format!(
            "run {}'s {CONVERSATION_ARTIFACT} artifact is not a readable conversation: {why}",
            artifact.run_id.as_deref().unwrap_or_default()
        ))
    };
    if artifact.truncated {
        return Err(unreadable("it was truncated".into()));
    }
    let mut bytes = Vec::new();
    let mut chunks = Box::pin(
        state
            .content
            .stream(state.pool.clone(), artifact.id.clone()),
    );
    while let Some(chunk) = chunks.next().await {
        bytes.extend_from_slice(&chunk?);
    }
    serde_json::from_slice(&bytes).map_err(|e| unreadable(e.to_string()))
}

/// The conversation with the user's next turn appended.
fn continued(mut conversation: Vec<Message>, prompt: String) -> Vec<Message> {
    conversation.push(Message::User { content: prompt });
    conversation
}

/// The conversation cut immediately before the run's own `index`-th (1-based) assistant
/// response. The run's responses follow the assistant messages of the conversation it
/// started from (`base`), which are inherited and not addressable. None when the
/// conversation holds fewer responses.
fn truncated_before(
    mut conversation: Vec<Message>,
    base: Option<&serde_json::Value>,
    index: i32,
) -> Option<Vec<Message>> {
    let inherited = base
        .and_then(serde_json::Value::as_array)
        .map_or(0, |messages| {
            messages.iter().filter(|m| m["role"] == "assistant").count()
        });
    let own = usize::try_from(index).ok()?.checked_sub(1)?;
    let cut = conversation
        .iter()
        .enumerate()
        .filter(|(_, m)| matches!(m, Message::Assistant { .. }))
        .nth(inherited + own)
        .map(|(position, _)| position)?;
    conversation.truncate(cut);
    Some(conversation)
}

fn json(conversation: &[Message]) -> serde_json::Value {
    serde_json::to_value(conversation).expect("messages serialize")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(text: &str) -> Message {
        Message::User {
            content: text.into(),
        }
    }

    fn assistant(text: &str) -> Message {
        Message::Assistant {
            content: Some(text.into()),
            tool_calls: Vec::new(),
            thinking: Vec::new(),
        }
    }

    fn tool(id: &str) -> Message {
        Message::Tool {
            tool_call_id: id.into(),
            name: "read_file".into(),
            content: "bytes".into(),
        }
    }

    #[test]
    fn continue_appends_the_user_turn() {
        let base = vec![user("hi"), assistant("a1")];
        let next = continued(base.clone(), "more".into());
        assert_eq!(next[..2], base[..]);
        assert_eq!(next[2], user("more"));
    }

    #[test]
    fn truncation_cuts_before_the_runs_own_nth_response() {
        let conversation = vec![user("p"), assistant("a1"), tool("t1"), assistant("a2")];
        let cut = truncated_before(conversation.clone(), None, 1).unwrap();
        assert_eq!(cut, vec![user("p")]);
        let cut = truncated_before(conversation.clone(), None, 2).unwrap();
        assert_eq!(cut, conversation[..3]);
        assert_eq!(truncated_before(conversation.clone(), None, 3), None);
        assert_eq!(truncated_before(conversation, None, 0), None);
    }

    #[test]
    fn inherited_responses_are_not_addressable() {
        // A continued run: its base holds the source's response a1 and the new user turn.
        let base = vec![user("p"), assistant("a1"), user("more")];
        let mut conversation = base.clone();
        conversation.push(assistant("b1"));
        let base = serde_json::to_value(&base).unwrap();
        let cut = truncated_before(conversation, Some(&base), 1).unwrap();
        assert_eq!(cut, vec![user("p"), assistant("a1"), user("more")]);
    }
}
