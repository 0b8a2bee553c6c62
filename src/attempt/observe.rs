//! How an attempt of any kind is observed: its outcome on the job's span and in the job
//! metrics, and a runtime failure logged (its lease then expires and the job runs again).

use std::future::Future;
use std::time::Instant;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use tracing::Instrument;

use crate::db::StoreError;
use crate::telemetry::metrics;

/// Runs one attempt of a job inside `span` (which declares `outcome` and
/// `otel.status_code`): records how it ended on the span and in the job metrics, and logs
/// a runtime failure, after which the lease expires and the job is retried.
pub(crate) fn observe(
    kind: &'static str,
    ref_id: String,
    span: tracing::Span,
    attempt: impl Future<Output = Result<&'static str, StoreError>> + Send + 'static,
) -> BoxFuture<'static, ()> {
    async move {
        let started = Instant::now();
        let outcome = match attempt.await {
            Ok(outcome) => outcome,
            Err(StoreError::LeaseLost) => {
                tracing::info!(kind, %ref_id, "lease lost; the job is left to its new owner");
                "lease_lost"
            }
            Err(error) => {
                tracing::error!(kind, %ref_id, %error, "job failed; its lease will expire and it will be retried");
                tracing::Span::current().record("otel.status_code", "error");
                "error"
            }
        };
        tracing::Span::current().record("outcome", outcome);
        metrics::job_finished(kind, outcome, started.elapsed());
    }
    .instrument(span)
    .boxed()
}
