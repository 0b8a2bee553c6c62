//! The runtime side of an attempt's [`RunContext`]: steps and artifacts held back and
//! written, fenced, with the next durable write.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};

use keel_workers::hooks::HookRun;
use keel_workers::{
    ArtifactHandle, ContextError, OutputStream, RunContext, StepHandle, StepResult,
};
use sqlx::PgConnection;
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use crate::artifacts;
use crate::artifacts::content::ContentStore;
use crate::artifacts::{NewArtifact, Upserted};
use crate::attempt::fence::Fence;
use crate::db::StoreError;
use crate::domain::{Scope, new_id};
use crate::events;
use crate::events::{NewEvent, Subject};
use crate::runs::steps;
use crate::runs::steps::{NewStep, StepRecord};

/// The longest a step or artifact row is held back before it is written on its own.
const HOLD_LIMIT: Duration = Duration::from_millis(200);

/// The runtime side of [`RunContext`]. Steps and artifacts are held back ([`Held`]) and
/// written, fenced, with the next write that must be durable: an output append, the end
/// of the attempt, or a flush [`HOLD_LIMIT`] after the first held row. A crash before
/// then loses only rows of an attempt that will run again.
pub(crate) struct FencedContext {
    pub(crate) shared: Arc<Shared>,
}

pub(crate) struct Shared {
    pub(crate) fence: Fence,
    pub(crate) task_id: String,
    pub(crate) run_id: String,
    pub(super) artifact_max_bytes: i64,
    pub(crate) content: ContentStore,
    /// Held across a flush's transaction, so rows are written once and in order.
    pub(crate) held: Mutex<Held>,
}

/// Rows the executor reported and the database does not have yet, in the order reported.
#[derive(Default)]
pub(crate) struct Held {
    writes: Vec<HeldWrite>,
    /// Artifact handles to the ids of their rows (a takeover reopens an older row).
    artifact_ids: HashMap<String, String>,
    /// Whether a flush after [`HOLD_LIMIT`] is on its way.
    flush_due: bool,
}

enum HeldWrite {
    Step {
        id: String,
        name: String,
        input: serde_json::Value,
        started_at: DateTime<Utc>,
        /// Set when the step ended before it was written: one insert, both events.
        ended: Option<(StepResult, DateTime<Utc>)>,
    },
    /// Where a step's end goes in the event order; `folded` when [`HeldWrite::Step`] has it.
    EndStep {
        id: String,
        result: StepResult,
        at: DateTime<Utc>,
        folded: bool,
    },
    Artifact {
        handle: String,
        name: &'static str,
        closed: bool,
    },
    /// `folded` when the [`HeldWrite::Artifact`] is written closed.
    Close { handle: String, folded: bool },
}

/// What a flush wrote, in order, for its events.
#[derive(Default)]
pub(super) struct Written {
    steps: Vec<StepRecord>,
    artifacts: Vec<Upserted>,
    order: Vec<Slot>,
}

enum Slot {
    StepStarted(usize),
    StepEnded(usize),
    ArtifactCreated(usize),
}

impl Written {
    pub(super) fn events<'a>(&'a self, owner: Subject<'a>) -> Vec<NewEvent<'a>> {
        self.order
            .iter()
            .filter_map(|slot| match *slot {
                Slot::StepStarted(i) => Some(steps::started_event(&self.steps[i])),
                Slot::StepEnded(i) => Some(steps::finished_event(&self.steps[i])),
                Slot::ArtifactCreated(i) => artifacts::created_event(owner, &self.artifacts[i]),
            })
            .collect()
    }

    fn step_index(&self, id: &str) -> Option<usize> {
        self.steps.iter().rposition(|s| s.id == id)
    }
}

impl Held {
    pub(crate) fn is_empty(&self) -> bool {
        self.writes.is_empty()
    }

    fn hold(&mut self, write: HeldWrite) {
        self.writes.push(write);
    }

    /// Ends a step: folded into its held insert when it has not been written yet.
    fn end_step(&mut self, id: &str, result: StepResult) {
        let at = Utc::now();
        let held = self.writes.iter_mut().find_map(|w| match w {
            HeldWrite::Step {
                id: held, ended, ..
            } if held == id => Some(ended),
            _ => None,
        });
        let folded = match held {
            Some(ended) => {
                *ended = Some((result.clone(), at));
                true
            }
            None => false,
        };
        self.hold(HeldWrite::EndStep {
            id: id.to_string(),
            result,
            at,
            folded,
        });
    }

    fn close(&mut self, handle: &str) {
        let held = self.writes.iter_mut().find_map(|w| match w {
            HeldWrite::Artifact {
                handle: h, closed, ..
            } if h == handle => Some(closed),
            _ => None,
        });
        let folded = held.map(|closed| *closed = true).is_some();
        self.hold(HeldWrite::Close {
            handle: handle.to_string(),
            folded,
        });
    }

    /// The id of the row an artifact handle stands for.
    fn artifact_id<'a>(&'a self, handle: &'a str) -> &'a str {
        self.artifact_ids.get(handle).map_or(handle, String::as_str)
    }

    /// The steps and artifacts these writes create: an artifact name once (a name opened
    /// again in the same batch is reopened after the first is written).
    fn new_rows<'a>(
        &'a self,
        owner: Subject<'a>,
        (task_id, run_id): (&'a str, &'a str),
    ) -> (Vec<NewStep<'a>>, Vec<NewArtifact<'a>>) {
        let mut new_steps = Vec::new();
        let (mut new_artifacts, mut names) = (Vec::new(), Vec::new());
        for write in &self.writes {
            match write {
                HeldWrite::Step {
                    id,
                    name,
                    input,
                    started_at,
                    ended,
                } => new_steps.push(NewStep {
                    id,
                    task_id,
                    run_id,
                    name,
                    input,
                    started_at: *started_at,
                    ended: ended.as_ref().map(|(result, at)| (result, *at)),
                }),
                HeldWrite::Artifact { name, .. } if names.contains(name) => {}
                HeldWrite::Artifact {
                    handle,
                    name,
                    closed,
                } => {
                    names.push(*name);
                    new_artifacts.push(output_artifact(owner, handle, name, *closed));
                }
                HeldWrite::EndStep { .. } | HeldWrite::Close { .. } => {}
            }
        }
        (new_steps, new_artifacts)
    }

    /// Writes the held rows in the caller's transaction, recording what it wrote in
    /// `written`; the rows stay held until the caller commits and clears them.
    pub(super) async fn write(
        &self,
        conn: &mut PgConnection,
        scope: &Scope,
        (task_id, run_id): (&str, &str),
        written: &mut Written,
    ) -> Result<HashMap<String, String>, StoreError> {
        let owner = Subject::Run { task_id, run_id };
        // The new rows in one statement, then the rest in order: ends and closes of rows
        // written before.
        let (new_steps, new_artifacts) = self.new_rows(owner, (task_id, run_id));
        let (steps, artifacts) = if new_steps.is_empty() && new_artifacts.is_empty() {
            (Vec::new(), Vec::new())
        } else {
            steps::write(conn, scope, &new_steps, &new_artifacts).await?
        };
        let (mut steps, mut artifacts) = (steps.into_iter(), artifacts.into_iter());
        let mut ids = self.artifact_ids.clone();
        let mut first_of = Vec::new();
        for write in &self.writes {
            match write {
                HeldWrite::Step { .. } => {
                    let step = steps.next().ok_or(StoreError::NotFound("step"))?;
                    written.steps.push(step);
                    written
                        .order
                        .push(Slot::StepStarted(written.steps.len() - 1));
                }
                HeldWrite::EndStep {
                    id,
                    result,
                    at,
                    folded,
                } => {
                    let index = match (folded, written.step_index(id)) {
                        (true, Some(index)) => index,
                        _ => {
                            written
                                .steps
                                .push(steps::end(conn, scope, id, result, *at).await?);
                            written.steps.len() - 1
                        }
                    };
                    written.order.push(Slot::StepEnded(index));
                }
                HeldWrite::Artifact {
                    handle,
                    name,
                    closed,
                } => {
                    let upserted = if first_of.contains(name) {
                        let artifact = output_artifact(owner, handle, name, *closed);
                        artifacts::upsert(conn, scope, &artifact).await?
                    } else {
                        first_of.push(*name);
                        artifacts.next().ok_or(StoreError::NotFound("artifact"))?
                    };
                    ids.insert(handle.clone(), upserted.artifact.id.clone());
                    written.artifacts.push(upserted);
                    written
                        .order
                        .push(Slot::ArtifactCreated(written.artifacts.len() - 1));
                }
                HeldWrite::Close { folded: true, .. } => {}
                HeldWrite::Close { handle, .. } => {
                    let id = ids.get(handle).map_or(handle.as_str(), String::as_str);
                    artifacts::close(conn, scope, id).await?;
                }
            }
        }
        Ok(ids)
    }
}

/// A step's output stream as the artifact it is written to.
fn output_artifact<'a>(
    owner: Subject<'a>,
    handle: &'a str,
    name: &'static str,
    closed: bool,
) -> NewArtifact<'a> {
    NewArtifact {
        id: handle,
        owner,
        name,
        kind: name,
        content_type: "text/plain",
        closed,
    }
}

impl Shared {
    pub(crate) fn owner(&self) -> Subject<'_> {
        Subject::Run {
            task_id: &self.task_id,
            run_id: &self.run_id,
        }
    }

    /// Writes the held rows, then `then` (a durable write that needs them), in one fenced
    /// transaction with their events.
    pub(crate) async fn flush_with(
        &self,
        held: &mut Held,
        then: Option<(&str, &[u8])>,
    ) -> Result<(), ContextError> {
        let mut tx = self.fence.begin().await?;
        let scope = &self.fence.scope;
        let mut written = Written::default();
        let ids = held
            .write(&mut tx, scope, (&self.task_id, &self.run_id), &mut written)
            .await
            .map_err(|e| self.fence.context_error(e))?;
        events::append(&mut tx, scope, &written.events(self.owner()))
            .await
            .map_err(|e| self.fence.context_error(e))?;
        if let Some((handle, bytes)) = then {
            let id = ids.get(handle).map_or(handle, String::as_str);
            self.content
                .append(&mut tx, scope, id, bytes, self.artifact_max_bytes)
                .await
                .map_err(|e| self.fence.context_error(e))?;
        }
        self.fence.commit(tx).await?;
        held.writes.clear();
        held.artifact_ids = ids;
        Ok(())
    }

    /// Holds a row, and makes sure it is written within [`HOLD_LIMIT`].
    async fn hold(self: &Arc<Self>, update: impl FnOnce(&mut Held)) -> Result<(), ContextError> {
        if self.fence.interrupt.is_cancelled() {
            return Err(ContextError::Interrupted);
        }
        let mut held = self.held.lock().await;
        update(&mut held);
        if !held.flush_due {
            held.flush_due = true;
            let shared = self.clone();
            tokio::spawn(async move {
                tokio::time::sleep(HOLD_LIMIT).await;
                let mut held = shared.held.lock().await;
                held.flush_due = false;
                if held.writes.is_empty() || shared.fence.interrupt.is_cancelled() {
                    return;
                }
                // A failure leaves the rows held for the next durable write, which then
                // reports it.
                if let Err(error) = shared.flush_with(&mut held, None).await {
                    tracing::warn!(%error, "writing a run's held steps and artifacts failed");
                }
            });
        }
        Ok(())
    }
}

impl RunContext for FencedContext {
    fn cancellation(&self) -> &CancellationToken {
        &self.shared.fence.interrupt
    }

    async fn clear_ahead(&self) -> Result<(), ContextError> {
        self.shared.fence.clear_ahead().await
    }

    async fn start_step(
        &self,
        name: &str,
        input: serde_json::Value,
    ) -> Result<StepHandle, ContextError> {
        let id = new_id("step");
        let step = HeldWrite::Step {
            id: id.clone(),
            name: name.to_string(),
            input,
            started_at: Utc::now(),
            ended: None,
        };
        self.shared.hold(|held| held.hold(step)).await?;
        Ok(StepHandle(id))
    }

    async fn finish_step(&self, step: &StepHandle, result: StepResult) -> Result<(), ContextError> {
        self.shared
            .hold(|held| held.end_step(&step.0, result))
            .await
    }

    async fn open_output(&self, stream: OutputStream) -> Result<ArtifactHandle, ContextError> {
        let handle = new_id("art");
        let artifact = HeldWrite::Artifact {
            handle: handle.clone(),
            name: stream.name(),
            closed: false,
        };
        self.shared.hold(|held| held.hold(artifact)).await?;
        Ok(ArtifactHandle(handle))
    }

    async fn append_output(
        &self,
        artifact: &ArtifactHandle,
        bytes: &[u8],
    ) -> Result<(), ContextError> {
        let shared = &self.shared;
        if shared.fence.interrupt.is_cancelled() {
            return Err(ContextError::Interrupted);
        }
        let mut held = shared.held.lock().await;
        if !held.writes.is_empty() {
            return shared
                .flush_with(&mut held, Some((&artifact.0, bytes)))
                .await;
        }
        let id = held.artifact_id(&artifact.0).to_string();
        drop(held);
        let mut tx = shared.fence.begin().await?;
        shared
            .content
            .append(
                &mut tx,
                &shared.fence.scope,
                &id,
                bytes,
                shared.artifact_max_bytes,
            )
            .await
            .map_err(|e| shared.fence.context_error(e))?;
        shared.fence.commit(tx).await
    }

    async fn close_output(&self, artifact: &ArtifactHandle) -> Result<(), ContextError> {
        self.shared.hold(|held| held.close(&artifact.0)).await
    }
}

impl Shared {
    /// A hook's stdout and stderr as two closed artifacts of the run (`<hook>.stdout` of
    /// kind `stdout`, `<hook>.stderr` of kind `stderr`), in one fenced transaction.
    pub(super) async fn record_hook(&self, ran: &HookRun) -> Result<(), ContextError> {
        let mut tx = self.fence.begin().await?;
        let scope = &self.fence.scope;
        let streams = [("stdout", &ran.stdout), ("stderr", &ran.stderr)];
        for (stream, text) in streams {
            let name = format!("{}.{stream}", ran.hook);
            let written = async {
                let content_type = "text/plain; charset=utf-8";
                let owner = self.owner();
                let artifact =
                    artifacts::open(&mut tx, scope, owner, &name, stream, content_type).await?;
                let bytes = text.as_bytes();
                self.content
                    .append(&mut tx, scope, &artifact.id, bytes, self.artifact_max_bytes)
                    .await?;
                artifacts::close(&mut tx, scope, &artifact.id).await
            };
            written.await.map_err(|e| self.fence.context_error(e))?;
        }
        self.fence.commit(tx).await
    }
}
