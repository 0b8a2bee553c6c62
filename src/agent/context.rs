//! The prompt layers an agent loop run started from ([`RunContextPacket`]): the base the
//! run kept when it started (its runtime and workspace layers, or the conversation it
//! carries on), else the task's own system prompt and prompt, which were all it had.

use keel_api_types::{ContextLayer, ContextSource, LayerOrigin, RunContextPacket};
use keel_workers::agent::Message;
use keel_workers::agent::instructions::is_workspace_layer;
use sqlx::PgConnection;

use crate::agent::transcript::agent_run;
use crate::db::{Result, StoreError};
use crate::domain::Scope;
use crate::runs::RunRecord;
use crate::tasks::TaskRecord;

/// The context of `run_id`, of an agent loop task.
pub async fn read(
    conn: &mut PgConnection,
    scope: &Scope,
    task_id: &str,
    run_id: &str,
) -> Result<RunContextPacket> {
    let (task, run) = agent_run(conn, scope, task_id, run_id).await?;
    let stored = match &run.conversation_base {
        Some(base) => Some(
            serde_json::from_value::<Vec<Message>>(base.clone())
                .map_err(|e| StoreError::Database(sqlx::Error::Decode(Box::new(e))))?,
        ),
        None => None,
    };
    Ok(match stored {
        Some(base) => from_base(&task, &run, base),
        None => from_task(&task, &run),
    })
}

/// The stored base: its system messages are the layers, its last person's message the
/// prompt, and the rest the turns it carries.
fn from_base(task: &TaskRecord, run: &RunRecord, base: Vec<Message>) -> RunContextPacket {
    let mut layers = Vec::new();
    let mut rest = Vec::new();
    for message in base {
        match message {
            Message::System { content } => layers.push(ContextLayer {
                origin: origin_of(task, &content),
                content,
            }),
            other => rest.push(other),
        }
    }
    let prompt = rest.iter().rposition(|m| matches!(m, Message::User { .. }));
    let prompt = prompt.and_then(|at| match rest.remove(at) {
        Message::User { content } => Some(content),
        _ => None,
    });
    packet(run, ContextSource::Stored, layers, prompt, rest.len())
}

/// Which layer a stored system message is.
fn origin_of(task: &TaskRecord, content: &str) -> LayerOrigin {
    if is_workspace_layer(content) {
        LayerOrigin::Workspace
    } else if task.system_prompt.as_deref() == Some(content) {
        LayerOrigin::Task
    } else {
        LayerOrigin::Runtime
    }
}

/// No stored base: the task's system prompt and prompt (a run not started yet may still
/// gain runtime and workspace layers when it starts).
fn from_task(task: &TaskRecord, run: &RunRecord) -> RunContextPacket {
    let layers = task.system_prompt.iter().map(|content| ContextLayer {
        origin: LayerOrigin::Task,
        content: content.clone(),
    });
    let source = match run.started_at {
        Some(_) => ContextSource::Task,
        None => ContextSource::NotStarted,
    };
    packet(run, source, layers.collect(), task.prompt.clone(), 0)
}

fn packet(
    run: &RunRecord,
    source: ContextSource,
    layers: Vec<ContextLayer>,
    prompt: Option<String>,
    carried_messages: usize,
) -> RunContextPacket {
    RunContextPacket {
        task_id: run.task_id.clone(),
        run_id: run.id.clone(),
        source,
        layers,
        prompt,
        carried_messages,
    }
}
