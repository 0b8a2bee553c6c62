//! How an attempt of any kind is observed: its outcome on the job's span and in the job
//! metrics, and a runtime failure logged (its lease then expires and the job runs again).

use std::future::Future;
use std::time::Instant;

use futures_util::FutureExt;
use futures_util::future::BoxFuture;
use tracing::Instrument;

use crate::db::StoreError;
use crate::telemetry::metrics;

/// Runs `attempt`, one attempt of `job` (a queue [`Job`](crate::queue::Job) of `kind`),
/// through [`observe`] inside a span named `name` that carries the job's row id as `id`,
/// its attempt number and the fields `observe` records: every kind's handler the same way.
macro_rules! observed {
    ($kind:expr, $name:literal, $id:ident, $job:ident, $attempt:expr) => {{
        let span = tracing::info_span!(
            $name,
            $id = %$job.lease.ref_id,
            attempt = $job.lease.attempts,
            outcome = tracing::field::Empty,
            otel.status_code = tracing::field::Empty,
        );
        let ref_id = $job.lease.ref_id.clone();
        $crate::attempt::observe($kind.as_str(), ref_id, span, $attempt)
    }};
}
pub(crate) use observed;

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
