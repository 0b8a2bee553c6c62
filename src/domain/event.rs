//! Event types recorded in a run's append-only log.

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
    GapRunDisconnected,
    RunResumedFromEvent,
    ApprovalRequested,
    ApprovalResolved,
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
            EventType::GapRunDisconnected => "gap.run_disconnected",
            EventType::RunResumedFromEvent => "run.resumed_from_event",
            EventType::ApprovalRequested => "approval.requested",
            EventType::ApprovalResolved => "approval.resolved",
        }
    }
}
