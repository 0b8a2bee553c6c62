//! Media jobs: image and video generation run by workers through the queue.
//!
//! The state machine: `queued → running → succeeded | failed | cancelled`; a job that ended
//! `failed` or `cancelled` may be run again (back to `queued`), and a running job whose
//! attempt was handed back or retried returns to `queued`. [`MediaJobStatus::can_become`]
//! is the one place that decides which transitions exist.

pub(crate) use keel_api_types::MediaJobStatus;
pub use keel_workers::media::{Operation, Vendor};

use crate::domain::Invalid;
use crate::providers::Api;

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
pub(crate) fn check_runnable(
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
pub(crate) fn parse_operation(value: &str) -> Result<Operation, Invalid> {
    Operation::parse(value).ok_or_else(|| {
        Invalid::new(
            "operation",
            format!(
                "unknown operation {value:?}; expected image_generate, image_edit or video_generate"
            ),
        )
    })
}
