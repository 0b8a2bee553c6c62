//! Media jobs: image and video generation run by workers through the queue.
//!
//! The state machine: `queued → running → succeeded | failed | cancelled`; a job that ended
//! `failed` or `cancelled` may be run again (back to `queued`), and a running job whose
//! attempt was handed back or retried returns to `queued`. [`MediaJobStatus::can_become`]
//! is the one place that decides which transitions exist.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::Invalid;
use super::provider::Api;

pub use keel_workers::media::{Operation, Vendor};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum MediaJobStatus {
    Queued,
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

impl MediaJobStatus {
    pub const ALL: [MediaJobStatus; 5] = [
        MediaJobStatus::Queued,
        MediaJobStatus::Running,
        MediaJobStatus::Succeeded,
        MediaJobStatus::Failed,
        MediaJobStatus::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            MediaJobStatus::Queued => "queued",
            MediaJobStatus::Running => "running",
            MediaJobStatus::Succeeded => "succeeded",
            MediaJobStatus::Failed => "failed",
            MediaJobStatus::Cancelled => "cancelled",
        }
    }

    pub fn parse(value: &str) -> Option<MediaJobStatus> {
        MediaJobStatus::ALL
            .into_iter()
            .find(|s| s.as_str() == value)
    }

    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            MediaJobStatus::Succeeded | MediaJobStatus::Failed | MediaJobStatus::Cancelled
        )
    }

    /// Whether `POST /media-jobs/{id}/run` may (re)start a job in this state. A queued
    /// job is enqueued again, which is a no-op if its queue row already exists.
    pub fn is_runnable(self) -> bool {
        matches!(
            self,
            MediaJobStatus::Queued | MediaJobStatus::Failed | MediaJobStatus::Cancelled
        )
    }

    /// Whether a job in this state may move to `next`.
    pub fn can_become(self, next: MediaJobStatus) -> bool {
        use MediaJobStatus::*;
        match (self, next) {
            // Queued → Failed: the job used up its attempts before one could start.
            (Queued, Running | Cancelled | Failed) => true,
            // Running → Queued: the attempt was retried or handed back at shutdown.
            (Running, Queued | Succeeded | Failed | Cancelled) => true,
            (Failed | Cancelled, Queued) => true,
            _ => false,
        }
    }

    /// Every state from which `next` may be reached: the guard of a status update.
    pub fn sources_of(next: MediaJobStatus) -> Vec<&'static str> {
        MediaJobStatus::ALL
            .into_iter()
            .filter(|s| s.can_become(next))
            .map(MediaJobStatus::as_str)
            .collect()
    }
}

/// Why a media job cannot be created against a provider preset.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unrunnable {
    #[error("provider {0} is disabled")]
    Disabled(String),
    #[error("provider {provider} has api {api}, not media-job; it cannot run {operation}")]
    UnsupportedCapability {
        provider: String,
        api: String,
        operation: &'static str,
    },
    #[error("provider {provider} does not list {operation} in its capabilities")]
    OperationNotListed {
        provider: String,
        operation: &'static str,
    },
}

/// What a preset must offer to run `operation` (seed 000, "Create Media Job").
pub fn check_runnable(
    provider_id: &str,
    api: Api,
    enabled: bool,
    capabilities: &[String],
    operation: Operation,
) -> Result<(), Unrunnable> {
    if api != Api::MediaJob {
        return Err(Unrunnable::UnsupportedCapability {
            provider: provider_id.to_string(),
            api: api.as_str().to_string(),
            operation: operation.as_str(),
        });
    }
    if !capabilities.iter().any(|c| c == operation.as_str()) {
        return Err(Unrunnable::OperationNotListed {
            provider: provider_id.to_string(),
            operation: operation.as_str(),
        });
    }
    if !enabled {
        return Err(Unrunnable::Disabled(provider_id.to_string()));
    }
    Ok(())
}

/// Parses an operation named in a request.
pub fn parse_operation(value: &str) -> Result<Operation, Invalid> {
    Operation::parse(value).ok_or_else(|| {
        Invalid::new(
            "operation",
            format!(
                "unknown operation {value:?}; expected image_generate, image_edit or video_generate"
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::MediaJobStatus::{self, *};

    #[test]
    fn succeeded_is_final_and_failures_can_run_again() {
        for to in MediaJobStatus::ALL {
            assert!(!Succeeded.can_become(to));
        }
        assert!(Failed.can_become(Queued) && Cancelled.can_become(Queued));
        assert!(!Failed.can_become(Running), "a rerun is queued first");
    }

    #[test]
    fn runnable_states_match_the_api() {
        let runnable: Vec<_> = MediaJobStatus::ALL
            .into_iter()
            .filter(|s| s.is_runnable())
            .collect();
        assert_eq!(runnable, [Queued, Failed, Cancelled]);
    }
}
