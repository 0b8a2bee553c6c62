//! The `media` job: one attempt of a media job against its vendor. Like `run` jobs, every
//! write happens in a transaction fenced by the job's lease. The vendor's task id is
//! committed before polling starts, so a worker that takes over a crashed worker's video
//! job resumes polling that task and never submits the generation again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use keel_workers::media::{
    self, MediaArtifactKind, MediaContext, MediaErrorCode, MediaLimits, MediaOutcome, MediaSpec,
    Operation, Vendor,
};
use keel_workers::{ArtifactHandle, ContextError};
use sqlx::{PgConnection, PgPool};
use tokio_util::sync::CancellationToken;

use super::fence::{self, DomainRow, Fence};
use crate::domain::media::MediaJobStatus;
use crate::domain::provider::ProviderHosts;
use crate::domain::secret::{SecretPolicy, Unresolved};
use crate::domain::{Actor, EventType, Scope};
use crate::queue::worker::{Job, JobHandler};
use crate::queue::{self, Lease};
use crate::store::content::ContentStore;
use crate::store::events::{self, NewEvent, Subject};
use crate::store::media_jobs::{self, Change, MediaJobRecord};
use crate::store::{StoreError, artifacts, providers};
use crate::telemetry::metrics;

/// Bytes gathered before one artifact write: a download arrives in small chunks, and one
/// transaction per chunk would cost a round trip per few kilobytes.
const WRITE_BUFFER_BYTES: usize = 1024 * 1024;

pub struct MediaJobs {
    pub pool: PgPool,
    pub limits: MediaLimits,
    pub content: ContentStore,
    /// Checked again at each resolution: a preset stored under a wider policy must not leak.
    pub secrets: SecretPolicy,
    /// Checked again at each resolution, like the secrets.
    pub hosts: ProviderHosts,
}

impl JobHandler for MediaJobs {
    fn kind(&self) -> &'static str {
        media_jobs::KIND
    }

    fn run(self: Arc<Self>, job: Job) -> BoxFuture<'static, ()> {
        let span = tracing::info_span!(
            "media_job",
            media_job_id = %job.lease.ref_id,
            attempt = job.lease.attempts,
            outcome = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
        );
        let ref_id = job.lease.ref_id.clone();
        super::observe(media_jobs::KIND, ref_id, span, async move {
            self.execute(job).await
        })
    }
}

/// How an attempt ended, as the job records it.
enum Ending<'a> {
    Succeeded,
    Failed { code: &'a str, message: &'a str },
}

impl DomainRow for MediaJobRecord {
    fn lock(
        conn: &mut PgConnection,
        scope: &Scope,
        id: &str,
    ) -> impl Future<Output = Result<Self, StoreError>> + Send {
        media_jobs::lock(conn, scope, id)
    }

    fn has_ended(&self) -> bool {
        self.status().is_terminal()
    }
}

impl MediaJobs {
    async fn execute(&self, job: Job) -> Result<&'static str, StoreError> {
        let lease = &job.lease;
        let Some(record) = self.begin(lease).await? else {
            return Ok("skipped");
        };
        let spec = match self.spec(&lease.scope(), &record).await? {
            Ok(spec) => spec,
            Err(unresolved) => {
                let ending = Ending::Failed {
                    code: unresolved.code,
                    message: &unresolved.message,
                };
                self.end(lease, ending).await?;
                return Ok("failed");
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
        match media::execute(&spec, &ctx).await {
            MediaOutcome::Interrupted if job.is_released() => {
                self.hand_back(lease).await?;
                Ok("released")
            }
            MediaOutcome::Interrupted => {
                // A cancel that found the job row locked left it to this worker.
                match fence::lock_unless_ended::<MediaJobRecord>(&self.pool, lease).await {
                    Ok(_) | Err(StoreError::LeaseLost) => Ok("interrupted"),
                    Err(error) => Err(error),
                }
            }
            MediaOutcome::Succeeded => {
                self.end(lease, Ending::Succeeded).await?;
                Ok("completed")
            }
            MediaOutcome::Failed { code, message } => {
                let ending = Ending::Failed {
                    code: code.as_str(),
                    message: &message,
                };
                self.end(lease, ending).await?;
                Ok("failed")
            }
            MediaOutcome::Retry {
                code,
                message,
                after,
            } => {
                self.retry(lease, code, &message, after).await?;
                Ok("retried")
            }
        }
    }

    /// Marks the job running for this attempt. A job still `running` was held by a worker
    /// whose lease expired: it goes back to `queued` first, so the audit trail shows the
    /// takeover. Returns None when there is nothing to run.
    async fn begin(&self, lease: &Lease) -> Result<Option<MediaJobRecord>, StoreError> {
        let Some((mut tx, record)) =
            fence::lock_unless_ended::<MediaJobRecord>(&self.pool, lease).await?
        else {
            return Ok(None);
        };
        let (scope, actor) = (lease.scope(), worker(lease));
        if record.status() == MediaJobStatus::Running {
            disconnect(&mut tx, &scope, &record.id, "worker_lease_expired", &actor).await?;
            metrics::reclaimed(&lease.kind);
        }
        if lease.attempts > lease.max_attempts {
            let message = format!("gave up after {} attempts", lease.max_attempts);
            fail_and_ack(&mut tx, lease, &record.id, "gave_up", &message).await?;
            tx.commit().await?;
            return Ok(None);
        }
        let change = Change {
            worker_id: Some(&lease.owner),
            ..Change::default()
        };
        let running = MediaJobStatus::Running;
        let record = media_jobs::transition(
            &mut tx,
            &scope,
            &record.id,
            running,
            change,
            &actor,
            Some("claimed"),
        )
        .await?;
        let data = serde_json::json!({
            "attempt": record.attempt,
            "worker_id": lease.owner,
            "resumes_vendor_task": record.vendor_task_id.is_some(),
        });
        let event = NewEvent::media_job(&record.id, EventType::MediaJobStarted).with(data);
        events::append(&mut tx, &scope, &[event]).await?;
        tx.commit().await?;
        Ok(Some(record))
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
            code: "invalid_request",
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
                code: "provider_host_not_allowed",
                message,
            }));
        }
        let Some(key) = preset.api_key() else {
            return Ok(Err(Unresolved {
                code: "secret_missing",
                message: format!("provider {} names no api_key_ref", preset.id),
            }));
        };
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

    /// Records the attempt's end and acks the job, in one fenced transaction.
    async fn end(&self, lease: &Lease, ending: Ending<'_>) -> Result<(), StoreError> {
        let mut tx = queue::begin_fenced(&self.pool, lease).await?;
        match ending {
            Ending::Succeeded => {
                let succeeded = MediaJobStatus::Succeeded;
                let (actor, reason) = (worker(lease), Some("generated"));
                let record = media_jobs::transition(
                    &mut tx,
                    &lease.scope(),
                    &lease.ref_id,
                    succeeded,
                    Change::default(),
                    &actor,
                    reason,
                )
                .await?;
                queue::complete(&mut tx, lease).await?;
                let data = serde_json::json!({ "artifact_ids": record.artifact_ids });
                let event =
                    NewEvent::media_job(&lease.ref_id, EventType::MediaJobSucceeded).with(data);
                events::append(&mut tx, &lease.scope(), &[event]).await?;
            }
            Ending::Failed { code, message } => {
                fail_and_ack(&mut tx, lease, &lease.ref_id, code, message).await?;
            }
        }
        tx.commit().await?;
        Ok(())
    }

    /// A transient vendor failure: back to `queued` with the vendor's delay (or backoff),
    /// or failed for good at the attempt limit.
    async fn retry(
        &self,
        lease: &Lease,
        code: MediaErrorCode,
        message: &str,
        after: Option<Duration>,
    ) -> Result<(), StoreError> {
        if lease.attempts >= lease.max_attempts {
            let message = format!("gave up after {} attempts: {message}", lease.attempts);
            let ending = Ending::Failed {
                code: code.as_str(),
                message: &message,
            };
            return self.end(lease, ending).await;
        }
        let mut tx = queue::begin_fenced(&self.pool, lease).await?;
        let change = Change {
            error: Some((code.as_str(), message)),
            ..Change::default()
        };
        let (scope, queued) = (lease.scope(), MediaJobStatus::Queued);
        media_jobs::transition(
            &mut tx,
            &scope,
            &lease.ref_id,
            queued,
            change,
            &worker(lease),
            Some(message),
        )
        .await?;
        let delay = after.unwrap_or_else(|| queue::backoff(lease.attempts));
        queue::retry(&mut tx, lease, message, delay, true).await?;
        let data = serde_json::json!({ "reason": "retry", "error_code": code.as_str(),
                                       "error": message, "retry_in_ms": delay.as_millis() as u64 });
        let event = NewEvent::media_job(&lease.ref_id, EventType::MediaJobQueued).with(data);
        events::append(&mut tx, &scope, &[event]).await?;
        tx.commit().await?;
        Ok(())
    }

    /// Gives the job back at shutdown, without penalty; the vendor task id stays, so the
    /// next worker resumes it.
    async fn hand_back(&self, lease: &Lease) -> Result<(), StoreError> {
        let mut tx = queue::begin_fenced(&self.pool, lease).await?;
        queue::retry(&mut tx, lease, "worker shut down", Duration::ZERO, false).await?;
        let (scope, actor) = (lease.scope(), worker(lease));
        disconnect(&mut tx, &scope, &lease.ref_id, "worker_shutdown", &actor).await?;
        tx.commit().await?;
        Ok(())
    }
}

fn worker(lease: &Lease) -> Actor {
    Actor::Worker(lease.owner.clone())
}

/// Puts a running job whose worker is gone back to `queued`.
pub async fn disconnect(
    conn: &mut PgConnection,
    scope: &Scope,
    id: &str,
    reason: &str,
    actor: &Actor,
) -> Result<(), StoreError> {
    let (queued, change) = (MediaJobStatus::Queued, Change::default());
    media_jobs::transition(conn, scope, id, queued, change, actor, Some(reason)).await?;
    let data = serde_json::json!({ "reason": reason });
    let event = NewEvent::media_job(id, EventType::MediaJobQueued).with(data);
    events::append(conn, scope, &[event]).await
}

async fn fail_and_ack(
    conn: &mut PgConnection,
    lease: &Lease,
    id: &str,
    code: &str,
    message: &str,
) -> Result<(), StoreError> {
    let change = Change {
        error: Some((code, message)),
        ..Change::default()
    };
    let (scope, failed) = (lease.scope(), MediaJobStatus::Failed);
    let actor = worker(lease);
    media_jobs::transition(conn, &scope, id, failed, change, &actor, Some(message)).await?;
    queue::complete(conn, lease).await?;
    let data = serde_json::json!({ "error_code": code, "error": message });
    let event = NewEvent::media_job(id, EventType::MediaJobFailed).with(data);
    events::append(conn, &scope, &[event]).await
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

    fn vendor_task(&self) -> Option<String> {
        self.vendor_task.clone()
    }

    async fn save_vendor_task(&self, task_id: &str) -> Result<(), ContextError> {
        let mut tx = self.fence.begin().await?;
        media_jobs::save_vendor_task(&mut tx, &self.fence.scope, &self.media_job_id, task_id)
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
