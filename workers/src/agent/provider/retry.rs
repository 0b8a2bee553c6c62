//! Retries of transient provider failures inside one attempt: exponential backoff with
//! jitter, the provider's `Retry-After` honoured (capped), and cancellation at any point.

use std::hash::{BuildHasher, RandomState};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::ChatClient;
use crate::agent::run_loop::{Answer, FailedRoute, Model, Route};
use crate::agent::{Message, ModelResponse, ProviderError, ToolSpec};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Retries after the first try; 0: none.
    pub max_retries: u32,
    /// The first backoff; each retry doubles it.
    pub base_delay: Duration,
    /// The longest wait, backoff or `Retry-After`.
    pub max_delay: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_retries: 4,
            base_delay: Duration::from_millis(500),
            max_delay: Duration::from_secs(30),
        }
    }
}

impl RetryPolicy {
    /// The wait before retry number `retry + 1`: the provider's word when it gave one,
    /// else the doubled backoff with "equal jitter" (half fixed, half random) so callers
    /// hit by the same outage do not come back in step.
    fn delay(&self, retry: u32, retry_after: Option<Duration>) -> Duration {
        if let Some(after) = retry_after {
            return after.min(self.max_delay);
        }
        let backoff = self
            .base_delay
            .saturating_mul(2u32.saturating_pow(retry))
            .min(self.max_delay);
        backoff / 2 + backoff.mul_f64(jitter() / 2.0)
    }
}

/// A number in [0, 1): the standard library's randomly keyed hasher is random enough for
/// spreading retries, and saves a dependency.
fn jitter() -> f64 {
    let bits = RandomState::new().hash_one(std::time::Instant::now());
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

/// Calls [`ChatClient::complete`], retrying transient failures per `policy`; stops with
/// [`ProviderError::Interrupted`] as soon as `cancel` fires, mid-stream or mid-wait.
/// Returns the response and the number of retries. A retried call streams its text again
/// from the start, so `on_delta` may see a failed try's partial text before the retry's.
pub async fn complete_with_retry(
    client: &ChatClient,
    messages: &[Message],
    tools: &[ToolSpec],
    on_delta: &mut (dyn FnMut(&str) + Send),
    policy: &RetryPolicy,
    cancel: &CancellationToken,
) -> Result<(ModelResponse, u32), ProviderError> {
    let mut retries = 0;
    loop {
        let outcome = tokio::select! {
            biased;
            () = cancel.cancelled() => return Err(ProviderError::Interrupted),
            outcome = client.complete(messages, tools, on_delta) => outcome,
        };
        let retry_after = match outcome {
            Ok(response) => return Ok((response, retries)),
            Err(ProviderError::Transient {
                message,
                retry_after,
            }) if retries < policy.max_retries => {
                tracing::warn!(
                    provider = %client.config().provider,
                    retry = retries + 1,
                    %message,
                    "transient provider failure; retrying"
                );
                retry_after
            }
            Err(error) => return Err(error),
        };
        let delay = policy.delay(retries, retry_after);
        tokio::select! {
            biased;
            () = cancel.cancelled() => return Err(ProviderError::Interrupted),
            () = tokio::time::sleep(delay) => {}
        }
        retries += 1;
    }
}

/// The loop's [`Model`]: the run's routes (chat presets), in order, each tried with the
/// retry policy. A route that stays unavailable through its retries (a connection that
/// fails, a 5xx, a timeout, a 429) hands the call to the next one; a refusal (any other
/// 4xx, an answer that cannot be read) or an interruption ends it at once, since another
/// provider would not change it. A task pinned to a preset has that route alone.
#[derive(Debug, Clone)]
pub struct ChatModel {
    /// Never empty: the first is the run's own preset.
    routes: Vec<ChatClient>,
    pub policy: RetryPolicy,
}

impl ChatModel {
    /// A model over `primary`, then `fallbacks` in order.
    pub fn new(primary: ChatClient, fallbacks: Vec<ChatClient>, policy: RetryPolicy) -> Self {
        let routes = std::iter::once(primary).chain(fallbacks).collect();
        ChatModel { routes, policy }
    }
}

impl Model for ChatModel {
    async fn complete(
        &self,
        messages: &[Message],
        tools: &[ToolSpec],
        on_delta: &mut (dyn FnMut(&str) + Send),
        cancel: &CancellationToken,
    ) -> Result<Answer, ProviderError> {
        let mut failed_over = Vec::new();
        for (n, client) in self.routes.iter().enumerate() {
            let config = client.config();
            let route = Route {
                provider: config.provider.clone(),
                model: config.model.clone(),
            };
            match complete_with_retry(client, messages, tools, on_delta, &self.policy, cancel).await
            {
                Ok((response, retries)) => {
                    return Ok(Answer {
                        response,
                        retries,
                        route,
                        failed_over,
                    });
                }
                Err(ProviderError::Transient { message, .. }) if n + 1 < self.routes.len() => {
                    tracing::warn!(provider = %route.provider, %message,
                                   "provider unavailable through its retries; failing over");
                    failed_over.push(FailedRoute {
                        provider: route.provider,
                        model: route.model,
                        error: message,
                    });
                }
                Err(ProviderError::Transient {
                    message,
                    retry_after,
                }) if !failed_over.is_empty() => {
                    let tried: Vec<&str> =
                        failed_over.iter().map(|f| f.provider.as_str()).collect();
                    let message =
                        format!("{message} (after failing over from {})", tried.join(", "));
                    return Err(ProviderError::Transient {
                        message,
                        retry_after,
                    });
                }
                Err(error) => return Err(error),
            }
        }
        unreachable!("a model has at least one route")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_with_jitter_and_retry_after_is_capped() {
        let policy = RetryPolicy {
            max_retries: 5,
            base_delay: Duration::from_millis(100),
            max_delay: Duration::from_secs(1),
        };
        for retry in 0..5 {
            let full = (Duration::from_millis(100) * 2u32.pow(retry)).min(policy.max_delay);
            let delay = policy.delay(retry, None);
            assert!(delay >= full / 2 && delay <= full, "{retry}: {delay:?}");
        }
        let long = Some(Duration::from_secs(120));
        assert_eq!(policy.delay(0, long), Duration::from_secs(1));
        let short = Some(Duration::from_millis(250));
        assert_eq!(policy.delay(3, short), Duration::from_millis(250));
    }
}
