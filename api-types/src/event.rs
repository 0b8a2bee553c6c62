//! The events of runs and media jobs, as lists and streams deliver them.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "sqlx", derive(sqlx::FromRow))]
#[schema(example = json!({
    "schema_version": 1, "event_id": "evt_01a22b05d3bb7c6d8e9f0a1b2c3d4e5f",
    "task_id": "task_01a22b05c3e1734c9d7a0f2b6e41d890",
    "run_id": "run_01a22b05d1f27a6b8c9e0d1f2a3b4c5d", "media_job_id": null, "sequence": 3,
    "cursor": "918273-1207", "occurred_at": "2026-11-30T09:01:12Z", "type": "run.finished",
    "data": { "status": "completed", "exit_code": 0 }
}))]
pub struct EventRecord {
    pub schema_version: i32,
    pub event_id: String,
    /// The run's task and the run (null on a media job's events).
    pub task_id: Option<String>,
    pub run_id: Option<String>,
    /// The media job (null on a run's events).
    pub media_job_id: Option<String>,
    /// The event's position among its run's (or media job's) events.
    pub sequence: i64,
    /// The event's position in the public feed: an opaque string, the feed's `after`
    /// parameter and its stream's SSE id.
    #[schema(pattern = "^[0-9]+-[0-9]+$")]
    pub cursor: String,
    pub occurred_at: DateTime<Utc>,
    #[serde(rename = "type")]
    #[cfg_attr(feature = "sqlx", sqlx(rename = "type"))]
    pub event_type: EventType,
    pub data: serde_json::Value,
}

/// The types of the events recorded in the append-only log of runs and media jobs. Their
/// wire names are dotted (`run.finished`), which serde's renames cannot derive, so the
/// serde, schema and column impls below all read the one table in [`EventType::as_str`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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
    /// A proposed patch's `after` was written to its file through the API.
    ToolFileApplied,
    /// A proposed patch was discarded through the API; its file was never touched.
    ToolFileDiscarded,
    /// What a client-orchestrated run's client recorded (`data.kind`, `data.data`).
    ClientEvent,
    /// A task's status (its latest run's) changed: `data.status`, `data.run_id`. It comes
    /// just before the run event that changed it, in the same transaction.
    TaskUpdated,
    /// An agent loop's model call completed and was persisted (usage and cost).
    ModelCallCompleted,
    /// An agent loop attempt stopped with a model call in flight, never recorded; the next
    /// attempt counts it (`abandoned_model_calls`) and makes it again.
    ModelCallAbandoned,
    /// An agent loop's tool call a policy refused (`data.policy`: which; `data.tool`,
    /// `data.step_id`, `data.reason`): the model read the refusal as the call's result.
    PolicyToolBlocked,
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
            EventType::ToolFileApplied => "tool.file.applied",
            EventType::ToolFileDiscarded => "tool.file.discarded",
            EventType::ClientEvent => "client.event",
            EventType::TaskUpdated => "task.updated",
            EventType::ModelCallCompleted => "model.call.completed",
            EventType::ModelCallAbandoned => "model.call.abandoned",
            EventType::PolicyToolBlocked => "policy.tool_blocked",
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

    pub const ALL: [EventType; 28] = [
        EventType::RunCreated,
        EventType::RunQueued,
        EventType::RunStarted,
        EventType::RunFinished,
        EventType::RunFailed,
        EventType::RunCancelled,
        EventType::StepStarted,
        EventType::StepFinished,
        EventType::StepFailed,
        EventType::ArtifactCreated,
        EventType::ToolFileReverted,
        EventType::ToolFileApplied,
        EventType::ToolFileDiscarded,
        EventType::ClientEvent,
        EventType::TaskUpdated,
        EventType::ModelCallCompleted,
        EventType::ModelCallAbandoned,
        EventType::PolicyToolBlocked,
        EventType::GapRunDisconnected,
        EventType::RunResumedFromEvent,
        EventType::ApprovalRequested,
        EventType::ApprovalResolved,
        EventType::MediaJobQueued,
        EventType::MediaJobStarted,
        EventType::MediaJobProgress,
        EventType::MediaJobSucceeded,
        EventType::MediaJobFailed,
        EventType::MediaJobCancelled,
    ];

    pub fn parse(value: &str) -> Option<EventType> {
        EventType::ALL.into_iter().find(|t| t.as_str() == value)
    }
}

impl std::fmt::Display for EventType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for EventType {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for EventType {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = std::borrow::Cow::<str>::deserialize(deserializer)?;
        EventType::parse(&name)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown event type '{name}'")))
    }
}

impl utoipa::PartialSchema for EventType {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        let names: Vec<&str> = EventType::ALL.iter().map(|t| t.as_str()).collect();
        crate::schema::one_of_strings(false, &names)
            .description(Some("What happened: the event's type."))
            .into()
    }
}

impl ToSchema for EventType {
    fn name() -> std::borrow::Cow<'static, str> {
        std::borrow::Cow::Borrowed("EventType")
    }
}

#[cfg(feature = "sqlx")]
mod event_type_column {
    use sqlx::postgres::{PgTypeInfo, PgValueRef};
    use sqlx::{Decode, Postgres, Type};

    use super::EventType;

    /// A text column holding [`EventType::as_str`]; another value is a decode error.
    impl Type<Postgres> for EventType {
        fn type_info() -> PgTypeInfo {
            <&str as Type<Postgres>>::type_info()
        }

        fn compatible(ty: &PgTypeInfo) -> bool {
            <&str as Type<Postgres>>::compatible(ty)
        }
    }

    impl<'r> Decode<'r, Postgres> for EventType {
        fn decode(value: PgValueRef<'r>) -> Result<Self, sqlx::error::BoxDynError> {
            let name = <&str as Decode<Postgres>>::decode(value)?;
            EventType::parse(name).ok_or_else(|| format!("unknown event type '{name}'").into())
        }
    }
}

/// Most steps and artifacts a run stream's [`RunState`] carries: the run's last ones.
pub const RUN_STATE_ITEMS: i64 = 20;

/// A run's state as a stream frame carries it (`projection=state`): read from committed
/// rows once the frame's event was read, so it holds at least what that event recorded.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RunState {
    pub run: crate::RunRecord,
    /// The run's last steps (at most 20), in their order.
    pub steps: Vec<crate::StepRecord>,
    /// The run's last artifacts (at most 20), oldest first; their content is read apart.
    pub artifacts: Vec<crate::ArtifactRecord>,
    /// The run's pending approvals (at most 20), oldest first.
    pub pending_approvals: Vec<crate::ApprovalRecord>,
}

/// A run stream's frame with `projection=state` or `activity`: the event, and on the last
/// frame of each burst of events read together, the run's state or activity after them.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct ProjectedEvent {
    #[serde(flatten)]
    pub event: EventRecord,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<RunState>,
    /// With `projection=activity`, on the last frame of each burst: the run's activity
    /// after it, whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activity: Option<Vec<crate::ActivityItem>>,
}

/// How an active run is doing, sent on its stream every `heartbeat_s` seconds when asked
/// (SSE event `run.heartbeat`, no id: it is not persisted and a reconnect does not replay
/// it).
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct RunHeartbeat {
    pub run_id: String,
    pub status: crate::RunStatus,
    pub attempt: i32,
    /// Since the run's current attempt started; null while it is queued.
    pub elapsed_ms: Option<i64>,
    /// The run's latest step.
    pub step: Option<HeartbeatStep>,
    pub model_calls: i32,
    pub cost_micros_usd: i64,
    /// The task's budget (null: none).
    pub budget_micros_usd: Option<i64>,
    pub at: DateTime<Utc>,
}

/// The step a heartbeat names: its index, name, the tool a tool call calls, and status.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
pub struct HeartbeatStep {
    pub index: i32,
    pub name: String,
    pub tool: Option<String>,
    pub status: crate::StepStatus,
}
