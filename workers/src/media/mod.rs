//! Media vendor executors: one attempt of an image or video job against OpenAI Images,
//! Seedream or Seedance. Like the other executors they reach the runtime only through a
//! narrow context ([`MediaContext`]); results become artifacts, never database rows.

mod api;
mod artifacts;
mod download;
pub(crate) mod egress;
mod images;
mod input;
mod openai;
mod output;
mod seedance;
mod seedream;

use std::fmt;
use std::future::Future;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::{ArtifactHandle, ContextError};

/// The vendor protocol a provider preset speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Vendor {
    OpenAiImages,
    Seedream,
    Seedance,
}

impl Vendor {
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "openai-images" => Some(Vendor::OpenAiImages),
            "seedream" => Some(Vendor::Seedream),
            "seedance" => Some(Vendor::Seedance),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Vendor::OpenAiImages => "openai-images",
            Vendor::Seedream => "seedream",
            Vendor::Seedance => "seedance",
        }
    }

    pub fn supports(self, op: Operation) -> bool {
        matches!(
            (self, op),
            (Vendor::OpenAiImages, Operation::ImageGenerate)
                | (
                    Vendor::Seedream,
                    Operation::ImageGenerate | Operation::ImageEdit
                )
                | (Vendor::Seedance, Operation::VideoGenerate)
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Operation {
    ImageGenerate,
    ImageEdit,
    VideoGenerate,
}

impl Operation {
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "image_generate" => Some(Operation::ImageGenerate),
            "image_edit" => Some(Operation::ImageEdit),
            "video_generate" => Some(Operation::VideoGenerate),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Operation::ImageGenerate => "image_generate",
            Operation::ImageEdit => "image_edit",
            Operation::VideoGenerate => "video_generate",
        }
    }
}

/// A secret value. It has no `Serialize` and prints as `[redacted]`, so it cannot leak
/// through logs, errors or job records by accident; [`Secret::expose`] is the only way in.
#[derive(Clone)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: String) -> Self {
        Secret(value)
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

#[derive(Debug, Clone)]
pub struct MediaLimits {
    /// For each vendor API call (submit, poll, generate).
    pub request_timeout: Duration,
    /// For each media download, headers and body together.
    pub download_timeout: Duration,
    pub download_max_bytes: u64,
    pub poll_interval: Duration,
    /// How long one attempt polls a vendor task before giving up.
    pub poll_timeout: Duration,
    /// Lets vendor calls and downloads reach private and loopback addresses: for tests and
    /// on-premise relays.
    pub allow_private_addresses: bool,
    /// Largest vendor API response body read (JSON; inline base64 images count).
    pub response_max_bytes: u64,
    /// Most results one job may keep.
    pub max_outputs: usize,
    /// Most bytes one job's results may add up to.
    pub outputs_max_bytes: u64,
}

impl Default for MediaLimits {
    fn default() -> Self {
        MediaLimits {
            request_timeout: Duration::from_secs(120),
            download_timeout: Duration::from_secs(300),
            download_max_bytes: 512 * 1024 * 1024,
            poll_interval: Duration::from_secs(5),
            poll_timeout: Duration::from_secs(30 * 60),
            allow_private_addresses: false,
            response_max_bytes: 16 * 1024 * 1024,
            max_outputs: 16,
            outputs_max_bytes: 2 * 1024 * 1024 * 1024,
        }
    }
}

/// One attempt's inputs, resolved by the runtime from the job and its provider preset.
#[derive(Debug, Clone)]
pub struct MediaSpec {
    pub vendor: Vendor,
    pub operation: Operation,
    pub base_url: String,
    pub model: String,
    pub api_key: Secret,
    /// Plain extra headers from the preset, sent to the vendor API only.
    pub headers: Vec<(String, String)>,
    /// Resolved secret headers, sent to the vendor API only.
    pub secret_headers: Vec<(String, Secret)>,
    pub prompt: String,
    pub input: serde_json::Value,
    pub limits: MediaLimits,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MediaArtifactKind {
    Image,
    Video,
    Metadata,
}

impl MediaArtifactKind {
    pub fn as_str(self) -> &'static str {
        match self {
            MediaArtifactKind::Image => "image",
            MediaArtifactKind::Video => "video",
            MediaArtifactKind::Metadata => "metadata",
        }
    }
}

/// Everything a media executor may ask of the runtime. Calls are fenced by the worker's
/// lease like [`crate::RunContext`]'s: once it is lost they fail with
/// [`ContextError::Interrupted`] and the token fires.
pub trait MediaContext: Send + Sync {
    /// Fires when the job is cancelled or the lease is lost.
    fn cancellation(&self) -> &CancellationToken;

    /// Before a vendor submission (which is paid for): Ok while this worker's lease is
    /// safely ahead of its local deadline; `Interrupted` when it is not.
    fn clear_ahead(&self) -> impl Future<Output = Result<(), ContextError>> + Send;

    /// The vendor task id a previous attempt saved, so this one resumes instead of paying
    /// for a second generation.
    fn vendor_task(&self) -> Option<String>;

    /// Records the vendor task id durably; called before polling starts.
    fn save_vendor_task(
        &self,
        task_id: &str,
    ) -> impl Future<Output = Result<(), ContextError>> + Send;

    fn progress(
        &self,
        data: serde_json::Value,
    ) -> impl Future<Output = Result<(), ContextError>> + Send;

    fn open_artifact(
        &self,
        name: &str,
        kind: MediaArtifactKind,
        content_type: &str,
    ) -> impl Future<Output = Result<ArtifactHandle, ContextError>> + Send;

    fn append_artifact(
        &self,
        artifact: &ArtifactHandle,
        bytes: &[u8],
    ) -> impl Future<Output = Result<(), ContextError>> + Send;

    fn close_artifact(
        &self,
        artifact: &ArtifactHandle,
    ) -> impl Future<Output = Result<(), ContextError>> + Send;
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MediaErrorCode {
    AuthFailed,
    RateLimited,
    InvalidRequest,
    ProviderUnavailable,
    Timeout,
    DownloadTooLarge,
    DownloadRefused,
    /// A vendor API call would have reached a non-public address.
    AddressRefused,
    ResponseTooLarge,
    TooManyOutputs,
    OutputsTooLarge,
    /// The runtime refused to store more: the workspace's byte quota is spent.
    StorageQuotaExceeded,
    ProviderError,
}

impl MediaErrorCode {
    pub fn as_str(self) -> &'static str {
        match self {
            MediaErrorCode::AuthFailed => "auth_failed",
            MediaErrorCode::RateLimited => "rate_limited",
            MediaErrorCode::InvalidRequest => "invalid_request",
            MediaErrorCode::ProviderUnavailable => "provider_unavailable",
            MediaErrorCode::Timeout => "timeout",
            MediaErrorCode::DownloadTooLarge => "download_too_large",
            MediaErrorCode::DownloadRefused => "download_refused",
            MediaErrorCode::AddressRefused => "address_refused",
            MediaErrorCode::ResponseTooLarge => "response_too_large",
            MediaErrorCode::TooManyOutputs => "too_many_outputs",
            MediaErrorCode::OutputsTooLarge => "outputs_too_large",
            MediaErrorCode::StorageQuotaExceeded => "storage_quota_exceeded",
            MediaErrorCode::ProviderError => "provider_error",
        }
    }
}

/// How an attempt ended. The runtime turns it into the job's state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MediaOutcome {
    Succeeded,
    /// Permanent: trying again would fail the same way.
    Failed {
        code: MediaErrorCode,
        message: String,
    },
    /// Transient: try again, no sooner than `after` when the vendor said so.
    Retry {
        code: MediaErrorCode,
        message: String,
        after: Option<Duration>,
    },
    /// The job was cancelled or the lease lost: the runtime must write nothing more.
    Interrupted,
}

impl MediaOutcome {
    fn failed(code: MediaErrorCode, message: impl Into<String>) -> Self {
        MediaOutcome::Failed {
            code,
            message: message.into(),
        }
    }

    fn retry(code: MediaErrorCode, message: impl Into<String>) -> Self {
        MediaOutcome::Retry {
            code,
            message: message.into(),
            after: None,
        }
    }
}

impl From<ContextError> for MediaOutcome {
    fn from(error: ContextError) -> Self {
        match error {
            ContextError::Interrupted => MediaOutcome::Interrupted,
            // The runtime's store failed under us; the vendor is fine, so try again later.
            ContextError::Runtime(message) => MediaOutcome::retry(
                MediaErrorCode::ProviderUnavailable,
                format!("the runtime could not record the attempt: {message}"),
            ),
            ContextError::Refused(message) => {
                MediaOutcome::failed(MediaErrorCode::StorageQuotaExceeded, message)
            }
        }
    }
}

/// Inside the executors an early `Err` is the attempt's final outcome.
type Step<T> = Result<T, MediaOutcome>;

/// Runs one attempt to its end.
pub async fn execute(spec: &MediaSpec, ctx: &impl MediaContext) -> MediaOutcome {
    let outcome = if !spec.vendor.supports(spec.operation) {
        MediaOutcome::failed(
            MediaErrorCode::InvalidRequest,
            format!(
                "{} does not support {}",
                spec.vendor.as_str(),
                spec.operation.as_str()
            ),
        )
    } else {
        let result = match spec.vendor {
            Vendor::OpenAiImages | Vendor::Seedream => images::run(spec, ctx).await,
            Vendor::Seedance => seedance::run(spec, ctx).await,
        };
        result.err().unwrap_or(MediaOutcome::Succeeded)
    };
    scrub(spec, outcome)
}

const MAX_MESSAGE_CHARS: usize = 500;

/// Vendors echo credentials back in error bodies (OpenAI quotes the key it rejected), so
/// every message is scrubbed of the spec's secrets on the way out, whatever produced it.
fn scrub(spec: &MediaSpec, outcome: MediaOutcome) -> MediaOutcome {
    let clean = |message: String| {
        let secrets = std::iter::once(&spec.api_key)
            .chain(spec.secret_headers.iter().map(|(_, value)| value))
            .map(Secret::expose)
            .filter(|value| !value.is_empty());
        let mut message = secrets.fold(message, |text, secret| text.replace(secret, "[redacted]"));
        if let Some((index, _)) = message.char_indices().nth(MAX_MESSAGE_CHARS) {
            message.truncate(index);
            message.push('…');
        }
        message
    };
    match outcome {
        MediaOutcome::Failed { code, message } => MediaOutcome::Failed {
            code,
            message: clean(message),
        },
        MediaOutcome::Retry {
            code,
            message,
            after,
        } => MediaOutcome::Retry {
            code,
            message: clean(message),
            after,
        },
        other => other,
    }
}

/// Awaits `future` unless the job is cancelled first.
async fn cancellable<T>(ctx: &impl MediaContext, future: impl Future<Output = T>) -> Step<T> {
    tokio::select! {
        biased;
        () = ctx.cancellation().cancelled() => Err(MediaOutcome::Interrupted),
        value = future => Ok(value),
    }
}

#[cfg(test)]
mod tests;
