//! One-time console sign-in codes. `keel console`, which holds the runtime token, asks for
//! one and prints a link that carries it in its fragment (never sent to a server, so never
//! in an access log); the console's page trades it, once, for a session cookie. A person on
//! the host signs in with a click, and neither the token nor a reusable secret is ever in
//! a URL, a log or the browser's history. Codes live in this process's memory: one works
//! on the API process that issued it, for a few minutes, and not after a restart.

use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::api::auth::token;
use crate::config::Redacted;

/// How long a code waits for its sign-in (seconds).
const TTL_SECS: i64 = 300;
/// Most codes waiting at once: the oldest gives way, so asking again and again cannot
/// grow the process's memory.
const MAX_WAITING: usize = 16;

#[derive(Default)]
pub(super) struct SignInCodes {
    /// Oldest first.
    waiting: Mutex<Vec<Waiting>>,
}

struct Waiting {
    code: Redacted,
    /// Unix seconds.
    expires: i64,
}

impl SignInCodes {
    /// A new code (128 random bits, hex) and the time it expires at (Unix seconds).
    pub(super) fn issue(&self, now: i64) -> (Redacted, i64) {
        let mut bytes = [0u8; 16];
        getrandom::fill(&mut bytes).expect("the operating system's random source");
        let Ok(code) = hex::encode(bytes).parse::<Redacted>();
        let expires = now + TTL_SECS;
        let mut waiting = self.waiting();
        waiting.retain(|w| w.expires > now);
        if waiting.len() >= MAX_WAITING {
            waiting.remove(0);
        }
        waiting.push(Waiting {
            code: code.clone(),
            expires,
        });
        (code, expires)
    }

    /// Whether `presented` is a code issued here that has not expired by `now`. A code
    /// presented is used up, live or not.
    pub(super) fn redeem(&self, presented: &str, now: i64) -> bool {
        let mut waiting = self.waiting();
        let found = waiting
            .iter()
            .position(|w| token::matches(presented, &w.code));
        found.is_some_and(|i| waiting.remove(i).expires > now)
    }

    /// The list, also after a panic elsewhere held the lock (it is never left half-changed).
    fn waiting(&self) -> MutexGuard<'_, Vec<Waiting>> {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_800_000_000;

    #[test]
    fn a_code_signs_in_once_before_it_expires() {
        let codes = SignInCodes::default();
        let (code, expires) = codes.issue(NOW);
        assert_eq!((code.expose().len(), expires), (32, NOW + TTL_SECS));
        assert!(!codes.redeem("not-a-code-of-this-process", NOW));
        assert!(codes.redeem(code.expose(), NOW + 1));
        assert!(!codes.redeem(code.expose(), NOW + 2));

        let (late, expires) = codes.issue(NOW);
        assert!(!codes.redeem(late.expose(), expires));
        let (other, _) = codes.issue(NOW);
        assert_ne!(other.expose(), late.expose());
    }

    #[test]
    fn the_oldest_waiting_code_gives_way() {
        let codes = SignInCodes::default();
        let (first, _) = codes.issue(NOW);
        let (second, _) = codes.issue(NOW);
        for _ in 2..MAX_WAITING {
            codes.issue(NOW);
        }
        codes.issue(NOW);
        assert!(!codes.redeem(first.expose(), NOW));
        assert!(codes.redeem(second.expose(), NOW));
    }
}
