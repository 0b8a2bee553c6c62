//! Media jobs: image and video generation. Their state machine: `queued → running →
//! succeeded | failed | cancelled`; a job that ended `failed` or `cancelled` may be run
//! again (back to `queued`), and a running job whose attempt was handed back or retried
//! returns to `queued`. [`MediaJobStatus::can_become`] is the one place that decides which
//! transitions exist.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::MediaOperation;
use crate::schema::JsonObject;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
// A text column; an unknown value is a decode error, never a panic.
#[cfg_attr(feature = "sqlx", derive(sqlx::Type))]
#[cfg_attr(feature = "sqlx", sqlx(type_name = "text", rename_all = "snake_case"))]
pub enum MediaJobStatus {
    Queued,
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

impl std::fmt::Display for MediaJobStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
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

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[cfg_attr(feature = "sqlx", derive(sqlx::FromRow))]
pub struct MediaJobRecord {
    #[schema(example = "media_job_0190...")]
    pub id: String,
    /// The provider preset the job runs against.
    pub provider_id: String,
    #[schema(value_type = MediaOperation)]
    pub operation: String,
    pub prompt: String,
    #[schema(value_type = Object)]
    pub input: serde_json::Value,
    pub status: MediaJobStatus,
    /// The vendor's id of the generation task (video jobs), once submitted.
    pub vendor_task_id: Option<String>,
    /// Attempts started so far.
    pub attempt: i32,
    pub worker_id: Option<String>,
    /// Why the last attempt failed: `auth_failed`, `rate_limited`, `invalid_request`,
    /// `provider_unavailable`, `timeout`, `download_too_large`, `download_refused`,
    /// `provider_error`, `secret_missing`, `secret_store_unavailable`, `secret_not_allowed`,
    /// `secret_not_granted`, `provider_host_not_allowed`, `gave_up`.
    pub last_error_code: Option<String>,
    pub last_error: Option<String>,
    /// The job's artifacts, in creation order.
    pub artifact_ids: Vec<String>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub started_at: Option<DateTime<Utc>>,
    pub finished_at: Option<DateTime<Utc>>,
}

impl MediaJobRecord {
    pub fn status(&self) -> MediaJobStatus {
        self.status
    }
}

/// A media job to create; it is not run until `POST /media-jobs/{id}/run`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MediaJobDraft {
    /// The id of an enabled provider preset with `api: "media-job"`.
    #[schema(example = "provider_0190...")]
    pub provider_id: String,
    /// The preset must be enabled, speak `media-job` and list the operation in its
    /// capabilities (422 `provider_disabled` or `unsupported_capability` otherwise).
    #[schema(value_type = MediaOperation, example = "image_generate")]
    pub operation: String,
    /// Not blank, at most 32 KiB of UTF-8.
    #[schema(
        example = "A lighthouse at dusk, watercolour",
        pattern = "^[^\\u0000]*[^\\s\\u0000][^\\u0000]*$",
        max_length = 32768
    )]
    pub prompt: String,
    /// Vendor options (`size`, `n`, `image` for edits, …).
    #[serde(default = "empty_object")]
    #[schema(value_type = JsonObject)]
    pub input: serde_json::Value,
}

fn empty_object() -> serde_json::Value {
    serde_json::json!({})
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
