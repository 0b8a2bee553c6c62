//! Event types recorded in the append-only log of runs and media jobs.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    RunCreated,
    RunQueued,
    RunStarted,
    RunFinished,
    RunFailed,
    RunCancelled,
    StepStarted,
    StepFinished,
    StepFailed,
    ArtifactCreated,
    /// A patch artifact's file was restored to its `before` through the API.
    ToolFileReverted,
    /// An agent loop's model call completed and was persisted (usage and cost).
    ModelCallCompleted,
    GapRunDisconnected,
    RunResumedFromEvent,
    ApprovalRequested,
    ApprovalResolved,
    MediaJobQueued,
    MediaJobStarted,
    MediaJobProgress,
    MediaJobSucceeded,
    MediaJobFailed,
    MediaJobCancelled,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::RunCreated => "run.created",
            EventType::RunQueued => "run.queued",
            EventType::RunStarted => "run.started",
            EventType::RunFinished => "run.finished",
            EventType::RunFailed => "run.failed",
            EventType::RunCancelled => "run.cancelled",
            EventType::StepStarted => "step.started",
            EventType::StepFinished => "step.finished",
            EventType::StepFailed => "step.failed",
            EventType::ArtifactCreated => "artifact.created",
            EventType::ToolFileReverted => "tool.file.reverted",
            EventType::ModelCallCompleted => "model.call.completed",
            EventType::GapRunDisconnected => "gap.run_disconnected",
            EventType::RunResumedFromEvent => "run.resumed_from_event",
            EventType::ApprovalRequested => "approval.requested",
            EventType::ApprovalResolved => "approval.resolved",
            EventType::MediaJobQueued => "media_job.queued",
            EventType::MediaJobStarted => "media_job.started",
            EventType::MediaJobProgress => "media_job.progress",
            EventType::MediaJobSucceeded => "media_job.succeeded",
            EventType::MediaJobFailed => "media_job.failed",
            EventType::MediaJobCancelled => "media_job.cancelled",
        }
    }
}
