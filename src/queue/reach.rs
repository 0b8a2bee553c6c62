//! Whether the database could be reached, and waiting for it while it cannot: a failover,
//! a restart or a cut connection fails statements that succeed again on a fresh connection
//! a few seconds later, which a starting process rides out rather than exits on.

use std::fmt::Display;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How long a process starting up keeps retrying while the database cannot be reached: a
/// promotion or a restart takes seconds; longer is an outage its supervisor should see.
pub const STARTUP_PATIENCE: Duration = Duration::from_secs(60);

const FIRST_PAUSE: Duration = Duration::from_millis(100);
const LONGEST_PAUSE: Duration = Duration::from_secs(2);

/// Whether `error` says the database could not be reached or ended the session (class 08:
/// connection exceptions; 57P01-57P03: the server is shutting down, crashed or cannot take
/// connections yet): the same statements may succeed on a fresh connection.
pub(crate) fn unreachable(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::PoolTimedOut | sqlx::Error::Io(_) => true,
        sqlx::Error::Database(e) => e
            .code()
            .is_some_and(|code| code.starts_with("08") || code.starts_with("57P")),
        _ => false,
    }
}

/// Runs `attempt` until it succeeds or fails for another reason than `is_unreachable`
/// says, pausing between tries (100 ms, doubling to 2 s); once `patience` has passed or
/// `stop` fired, the last error is the answer. `attempt` must be safe to repeat: a try
/// whose commit was acknowledged to no one may have happened.
pub(crate) async fn retry_while_unreachable<T, E, Try>(
    what: &str,
    patience: Duration,
    stop: &CancellationToken,
    is_unreachable: impl Fn(&E) -> bool,
    mut attempt: impl FnMut() -> Try,
) -> Result<T, E>
where
    E: Display,
    Try: Future<Output = Result<T, E>>,
{
    let give_up = Instant::now() + patience;
    let mut pause = FIRST_PAUSE;
    loop {
        let error = match attempt().await {
            Ok(done) => return Ok(done),
            Err(error) if is_unreachable(&error) => error,
            Err(error) => return Err(error),
        };
        if Instant::now() + pause > give_up || stop.is_cancelled() {
            return Err(error);
        }
        tracing::warn!(%error, ?pause, "{what}: the database cannot be reached; trying again");
        tokio::select! {
            _ = stop.cancelled() => return Err(error),
            _ = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(LONGEST_PAUSE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    fn cut() -> sqlx::Error {
        sqlx::Error::Io(std::io::Error::from(std::io::ErrorKind::UnexpectedEof))
    }

    /// Fails with `errors` in turn, then succeeds; counts the tries.
    async fn retried(errors: Vec<sqlx::Error>, patience: Duration) -> (Result<(), String>, u32) {
        let tries = Cell::new(0);
        let errors = std::cell::RefCell::new(errors.into_iter());
        let answer = retry_while_unreachable(
            "test",
            patience,
            &CancellationToken::new(),
            unreachable,
            || async {
                tries.set(tries.get() + 1);
                errors.borrow_mut().next().map_or(Ok(()), Err)
            },
        )
        .await;
        (answer.map_err(|e| e.to_string()), tries.get())
    }

    #[tokio::test(start_paused = true)]
    async fn a_cut_connection_is_tried_again_until_it_succeeds() {
        let (answer, tries) = retried(vec![cut(), cut(), cut()], STARTUP_PATIENCE).await;
        assert_eq!(answer, Ok(()));
        assert_eq!(tries, 4);
    }

    #[tokio::test(start_paused = true)]
    async fn another_error_is_the_answer_at_once() {
        let (answer, tries) =
            retried(vec![sqlx::Error::RowNotFound, cut()], STARTUP_PATIENCE).await;
        assert!(answer.unwrap_err().contains("no rows"));
        assert_eq!(tries, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn patience_bounds_the_wait() {
        let started = Instant::now();
        let (answer, tries) =
            retried((0..100).map(|_| cut()).collect(), Duration::from_secs(5)).await;
        assert!(answer.is_err());
        // 0.1 + 0.2 + 0.4 + 0.8 + 1.6 s of pauses fit in 5 s; the next 2 s does not.
        assert_eq!(tries, 6);
        assert!(started.elapsed() <= Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn stopping_ends_the_wait() {
        let stop = CancellationToken::new();
        stop.cancel();
        let answer: Result<(), sqlx::Error> =
            retry_while_unreachable("test", STARTUP_PATIENCE, &stop, unreachable, || async {
                Err(cut())
            })
            .await;
        assert!(answer.is_err());
    }

    #[test]
    fn only_connection_errors_are_unreachable() {
        assert!(unreachable(&cut()));
        assert!(unreachable(&sqlx::Error::PoolTimedOut));
        assert!(!unreachable(&sqlx::Error::RowNotFound));
    }
}
