//! The narrow interface between an executor and the runtime.

use std::future::Future;

use tokio_util::sync::CancellationToken;

/// Why a context call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ContextError {
    /// The run was cancelled or this worker lost its lease: stop at once, write nothing.
    #[error("the attempt was interrupted")]
    Interrupted,
    /// The runtime could not record the write (for example its database is unreachable).
    #[error("runtime error: {0}")]
    Runtime(String),
    /// The runtime refused the write for good (a byte quota is spent): the attempt fails
    /// with this error, which names its cause (`storage_quota_exceeded: …`).
    #[error("{0}")]
    Refused(String),
}

/// Which output stream an artifact captures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputStream {
    Stdout,
    Stderr,
}

impl OutputStream {
    pub fn name(self) -> &'static str {
        match self {
            OutputStream::Stdout => "stdout",
            OutputStream::Stderr => "stderr",
        }
    }
}

/// A step the executor opened; pass it back to finish the step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepHandle(pub String);

/// An output artifact the executor opened; bytes are appended to it while the run executes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArtifactHandle(pub String);

/// How a step ended.
#[derive(Debug, Clone, PartialEq)]
pub enum StepResult {
    Completed { output: serde_json::Value },
    Failed { error: String },
}

/// Everything an executor may ask of the runtime. Every call is fenced by the worker's
/// lease: once the lease is lost or the run cancelled, calls fail with
/// [`ContextError::Interrupted`] and [`RunContext::cancellation`] fires.
pub trait RunContext: Send + Sync {
    /// Fires when the run is cancelled or the lease is lost.
    fn cancellation(&self) -> &CancellationToken;

    /// Before an external effect that cannot be undone (starting a process, a model call,
    /// a tool call): Ok while this worker's lease is safely ahead of its local deadline
    /// (renewed first when near); `Interrupted` when it is not, and the call must not start.
    fn clear_ahead(&self) -> impl Future<Output = Result<(), ContextError>> + Send;

    fn start_step(
        &self,
        name: &str,
        input: serde_json::Value,
    ) -> impl Future<Output = Result<StepHandle, ContextError>> + Send;

    fn finish_step(
        &self,
        step: &StepHandle,
        result: StepResult,
    ) -> impl Future<Output = Result<(), ContextError>> + Send;

    fn open_output(
        &self,
        stream: OutputStream,
    ) -> impl Future<Output = Result<ArtifactHandle, ContextError>> + Send;

    fn append_output(
        &self,
        artifact: &ArtifactHandle,
        bytes: &[u8],
    ) -> impl Future<Output = Result<(), ContextError>> + Send;

    fn close_output(
        &self,
        artifact: &ArtifactHandle,
    ) -> impl Future<Output = Result<(), ContextError>> + Send;
}
