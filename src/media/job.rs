//! The `media` job: one attempt of a media job against its vendor. Like `run` jobs, every
//! write happens in a transaction fenced by the job's lease. The vendor's task id is
//! committed before polling starts, so a worker that takes over a crashed worker's video
//! job resumes polling that task and never submits the generation again.

use keel_api_types::ErrorCode;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use keel_workers::media::{
    self, MediaArtifactKind, MediaContext, MediaLimits, MediaOutcome, MediaSpec, Operation, Vendor,
};
use keel_workers::{ArtifactHandle, ContextError};
use sqlx::{PgConnection, PgPool};
use tokio_util::sync::CancellationToken;

use crate::artifacts::content::ContentStore;
use crate::attempt;
use crate::attempt::JobKind;
use crate::attempt::fence::{DomainRow, Fence};
use crate::attempt::{Attempted, Failure, Verdict};
use crate::db::StoreError;
use crate::domain::{Actor, EventType, Scope};
use crate::events;
use crate::events::{NewEvent, Subject};
use crate::media::MediaJobStatus;
use crate::media::{Change, MediaJobRecord};
use crate::providers::ProviderHosts;
use crate::providers::secrets::{SecretPolicy, Unresolved};
use crate::queue::worker::{Job, JobHandler};
use crate::queue::{self, Disposition, Lease};
use crate::{artifacts, providers};

/// Bytes gathered before one artifact write: a download arrives in small chunks, and one
/// transaction per chunk would cost a round trip per few kilobytes.
const WRITE_BUFFER_BYTES: usize = 1024 * 1024;

pub(crate) struct MediaJobs {
    pub(crate) pool: PgPool,
    pub(crate) limits: MediaLimits,
    pub(crate) content: ContentStore,
    /// Checked again at each resolution: a preset stored under a wider policy must not leak.
    pub(crate) secrets: SecretPolicy,
    /// Checked again at each resolution, like the secrets.
    pub(crate) hosts: ProviderHosts,
}

impl JobHandler for MediaJobs {
    fn kind(&self) -> &'static str {
        JobKind::Media.as_str()
    }

    fn run(self: Arc<Self>, job: Job) -> BoxFuture<'static, ()> {
        crate::attempt::observed!(JobKind::Media, "media_job", media_job_id, job, async move {
            self.execute(job).await
        })
    }
}

impl DomainRow for MediaJobRecord {
    async fn lock(conn: &mut PgConnection, lease: &Lease) -> Result<Option<Self>, StoreError> {
        queue::fence(conn, lease).await?;
        let scope = lease.scope();
        crate::media::lock(conn, &scope, &lease.ref_id)
            .await
            .map(Some)
    }

    fn has_ended(&self) -> bool {
        self.status().is_terminal()
    }
}

/// How an attempt that ran to its end leaves the job.
pub(crate) enum MediaEnding {
    Succeeded,
    Failed { code: String, message: String },
}

impl Attempted for MediaJobRecord {
    type Ending = MediaEnding;
    type Context = ();

    fn is_running(&self) -> bool {
        self.status() == MediaJobStatus::Running
    }

    fn gave_up(&self, _: &(), message: String, failure: Option<&Failure>) -> Option<MediaEnding> {
        let code = failure.map_or("gave_up", |f| f.code).to_string();
        Some(MediaEnding::Failed { code, message })
    }

    fn label(ending: &MediaEnding) -> &'static str {
        match ending {
            MediaEnding::Succeeded => "completed",
            MediaEnding::Failed { .. } => "failed",
        }
    }

    async fn requeue_lost<'r>(
        &'r self,
        conn: &mut PgConnection,
        scope: &Scope,
        reason: &'static str,
        actor: &Actor,
    ) -> Result<(Self, Vec<NewEvent<'r>>), StoreError> {
        let (record, event) =
            crate::media::requeue_lost(conn, scope, &self.id, reason, actor).await?;
        Ok((record, vec![event]))
    }

    async fn read_lost(conn: &mut PgConnection, lease: &Lease) -> Result<Option<Self>, StoreError> {
        let scope = lease.scope();
        crate::media::lock(conn, &scope, &lease.ref_id)
            .await
            .map(Some)
    }

    async fn start<'r>(
        &'r self,
        conn: &mut PgConnection,
        lease: &Lease,
    ) -> Result<(Self, Vec<NewEvent<'r>>), StoreError> {
        let change = Change {
            worker_id: Some(&lease.owner),
            ..Change::default()
        };
        let (scope, actor) = (lease.scope(), attempt::worker(lease));
        let (running, claimed) = (MediaJobStatus::Running, Some("claimed"));
        let record =
            crate::media::transition(conn, &scope, &self.id, running, change, &actor, claimed)
                .await?;
        let data = serde_json::json!({
            "attempt": record.attempt,
            "worker_id": lease.owner,
            "resumes_vendor_task": record.vendor_task_id.is_some(),
        });
        let event = NewEvent::media_job(&self.id, EventType::MediaJobStarted).with(data);
        Ok((record, vec![event]))
    }

    fn disposition(_: &MediaEnding) -> Disposition {
        Disposition::Complete
    }

    async fn end<'r>(
        &'r self,
        conn: &mut PgConnection,
        lease: &Lease,
        ending: &'r mut MediaEnding,
    ) -> Result<Vec<NewEvent<'r>>, StoreError> {
        let (scope, actor) = (lease.scope(), attempt::worker(lease));
        let event = match ending {
            MediaEnding::Succeeded => {
                let (succeeded, reason) = (MediaJobStatus::Succeeded, Some("generated"));
                let change = Change::default();
                let record = crate::media::transition(
                    conn, &scope, &self.id, succeeded, change, &actor, reason,
                )
                .await?;
                let data = serde_json::json!({ "artifact_ids": record.artifact_ids });
                NewEvent::media_job(&self.id, EventType::MediaJobSucceeded).with(data)
            }
            MediaEnding::Failed { code, message } => {
                let change = Change {
                    error: Some((code, message)),
                    ..Change::default()
                };
                let (failed, reason) = (MediaJobStatus::Failed, Some(message.as_str()));
                crate::media::transition(conn, &scope, &self.id, failed, change, &actor, reason)
                    .await?;
                let data = serde_json::json!({ "error_code": code, "error": message });
                NewEvent::media_job(&self.id, EventType::MediaJobFailed).with(data)
            }
        };
        Ok(vec![event])
    }

    async fn requeue<'r>(
        &'r self,
        conn: &mut PgConnection,
        lease: &Lease,
        failure: &'r Failure,
        delay: Duration,
    ) -> Result<Vec<NewEvent<'r>>, StoreError> {
        let (code, message) = (failure.code, failure.message.as_str());
        let change = Change {
            error: Some((code, message)),
            ..Change::default()
        };
        let (scope, actor) = (lease.scope(), attempt::worker(lease));
        let (queued, reason) = (MediaJobStatus::Queued, Some(message));
        crate::media::transition(conn, &scope, &self.id, queued, change, &actor, reason).await?;
        let data = serde_json::json!({ "reason": "retry", "error_code": code,
                                       "error": message, "retry_in_ms": delay.as_millis() as u64 });
        Ok(vec![
            NewEvent::media_job(&self.id, EventType::MediaJobQueued).with(data),
        ])
    }
}

impl MediaJobs {
    async fn execute(&self, job: Job) -> Result<&'static str, StoreError> {
        let lease = &job.lease;
        let Some(record) = attempt::begin::<MediaJobRecord>(&self.pool, lease, &()).await? else {
            return Ok("skipped");
        };
        let spec = match self.spec(&lease.scope(), &record).await? {
            Ok(spec) => spec,
            Err(unresolved) => {
                let ending = MediaEnding::Failed {
                    code: unresolved.code.to_string(),
                    message: unresolved.message,
                };
                return attempt::conclude(&self.pool, &job, &record, &(), Verdict::Ended(ending))
                    .await;
            }
        };
        let ctx = FencedMediaContext {
            fence: Fence::new(&self.pool, &job),
            media_job_id: record.id.clone(),
            vendor_task: record.vendor_task_id.clone(),
            max_bytes: i64::try_from(self.limits.download_max_bytes).unwrap_or(i64::MAX),
            buffers: Mutex::default(),
            content: self.content.clone(),
        };
        let verdict = match media::execute(&spec, &ctx).await {
            MediaOutcome::Interrupted => Verdict::Interrupted,
            MediaOutcome::Succeeded => Verdict::Ended(MediaEnding::Succeeded),
            MediaOutcome::Failed { code, message } => Verdict::Ended(MediaEnding::Failed {
                code: code.as_str().to_string(),
                message,
            }),
            MediaOutcome::Retry {
                code,
                message,
                after,
            } => Verdict::Retry(Failure {
                code: code.as_str(),
                message,
                after,
            }),
        };
        attempt::conclude(&self.pool, &job, &record, &(), verdict).await
    }

    /// The attempt's inputs: the preset's fields and its secrets, resolved here, now.
    async fn spec(
        &self,
        scope: &Scope,
        record: &MediaJobRecord,
    ) -> Result<Result<MediaSpec, Unresolved>, StoreError> {
        let mut conn = self.pool.acquire().await?;
        let preset = providers::get(&mut conn, scope, &record.provider_id).await?;
        let unusable = |message: String| Unresolved {
            code: ErrorCode::InvalidRequest,
            message,
        };
        let Some(vendor) = Vendor::parse(&preset.kind) else {
            return Ok(Err(unusable(format!(
                "provider kind {} is not a media vendor",
                preset.kind
            ))));
        };
        let operation = Operation::parse(&record.operation).expect("the table's check constraint");
        if let Err(message) = self.hosts.check(vendor, &preset.base_url) {
            return Ok(Err(Unresolved {
                code: ErrorCode::ProviderHostNotAllowed,
                message,
            }));
        }
        let Some(key) = preset.api_key() else {
            return Ok(Err(Unresolved {
                code: ErrorCode::SecretMissing,
                message: format!("provider {} names no api_key_ref", preset.id),
            }));
        };
        if let Err(unresolved) = preset.check_use(&self.secrets, &self.hosts) {
            return Ok(Err(unresolved));
        }
        let api_key = match key.resolve(&self.secrets) {
            Ok(secret) => secret,
            Err(unresolved) => return Ok(Err(unresolved)),
        };
        let mut secret_headers = Vec::new();
        for (name, secret) in preset.secret_headers() {
            match secret.resolve(&self.secrets) {
                Ok(value) => secret_headers.push((name, value)),
                Err(unresolved) => return Ok(Err(unresolved)),
            }
        }
        Ok(Ok(MediaSpec {
            vendor,
            operation,
            base_url: preset.base_url.clone(),
            model: preset.model.clone(),
            api_key,
            headers: preset.headers.0.clone().into_iter().collect(),
            secret_headers,
            prompt: record.prompt.clone(),
            input: record.input.clone(),
            limits: self.limits.clone(),
        }))
    }
}

/// The runtime side of [`MediaContext`]: each write is one fenced transaction; artifact
/// bytes are gathered per artifact and written in [`WRITE_BUFFER_BYTES`] pieces.
struct FencedMediaContext {
    fence: Fence,
    media_job_id: String,
    vendor_task: Option<String>,
    max_bytes: i64,
    buffers: Mutex<HashMap<String, Vec<u8>>>,
    content: ContentStore,
}

impl FencedMediaContext {
    async fn write_chunk(&self, artifact_id: &str, bytes: &[u8]) -> Result<(), ContextError> {
        let mut tx = self.fence.begin().await?;
        self.content
            .append(
                &mut tx,
                &self.fence.scope,
                artifact_id,
                bytes,
                self.max_bytes,
            )
            .await
            .map_err(|e| self.fence.context_error(e))?;
        self.fence.commit(tx).await
    }

    async fn flush(&self, artifact_id: &str) -> Result<(), ContextError> {
        let pending = self.buffers.lock().unwrap().remove(artifact_id);
        match pending {
            Some(bytes) if !bytes.is_empty() => self.write_chunk(artifact_id, &bytes).await,
            _ => Ok(()),
        }
    }

    fn subject(&self) -> Subject<'_> {
        Subject::MediaJob(&self.media_job_id)
    }
}

impl MediaContext for FencedMediaContext {
    fn cancellation(&self) -> &CancellationToken {
        &self.fence.interrupt
    }

    async fn clear_ahead(&self) -> Result<(), ContextError> {
        self.fence.clear_ahead().await
    }

    fn vendor_task(&self) -> Option<String> {
        self.vendor_task.clone()
    }

    async fn save_vendor_task(&self, task_id: &str) -> Result<(), ContextError> {
        let mut tx = self.fence.begin().await?;
        crate::media::save_vendor_task(&mut tx, &self.fence.scope, &self.media_job_id, task_id)
            .await
            .map_err(|e| self.fence.context_error(e))?;
        self.fence.commit(tx).await
    }

    async fn progress(&self, data: serde_json::Value) -> Result<(), ContextError> {
        let mut tx = self.fence.begin().await?;
        let event = NewEvent::media_job(&self.media_job_id, EventType::MediaJobProgress).with(data);
        events::append(&mut tx, &self.fence.scope, &[event])
            .await
            .map_err(|e| self.fence.context_error(e))?;
        self.fence.commit(tx).await
    }

    async fn open_artifact(
        &self,
        name: &str,
        kind: MediaArtifactKind,
        content_type: &str,
    ) -> Result<ArtifactHandle, ContextError> {
        let mut tx = self.fence.begin().await?;
        let scope = &self.fence.scope;
        let artifact = artifacts::open(
            &mut tx,
            scope,
            self.subject(),
            name,
            kind.as_str(),
            content_type,
        )
        .await
        .map_err(|e| self.fence.context_error(e))?;
        self.fence.commit(tx).await?;
        Ok(ArtifactHandle(artifact.id))
    }

    async fn append_artifact(
        &self,
        artifact: &ArtifactHandle,
        bytes: &[u8],
    ) -> Result<(), ContextError> {
        let full = {
            let mut buffers = self.buffers.lock().unwrap();
            let buffer = buffers.entry(artifact.0.clone()).or_default();
            buffer.extend_from_slice(bytes);
            buffer.len() >= WRITE_BUFFER_BYTES
        };
        if full {
            self.flush(&artifact.0).await?;
        }
        Ok(())
    }

    async fn close_artifact(&self, artifact: &ArtifactHandle) -> Result<(), ContextError> {
        self.flush(&artifact.0).await?;
        let mut tx = self.fence.begin().await?;
        artifacts::close(&mut tx, &self.fence.scope, &artifact.0)
            .await
            .map_err(|e| self.fence.context_error(e))?;
        self.fence.commit(tx).await
    }
}
