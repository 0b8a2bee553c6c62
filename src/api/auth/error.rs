//! Why authentication says no: [`Rejected`] when a request's credentials prove nobody, and
//! [`SettingsError`] when the configuration would start a runtime it should not.

use std::net::SocketAddr;

/// Why a token was refused, for the log; the client hears only "unauthorized".
pub(super) type Rejected = &'static str;

#[derive(Debug, thiserror::Error)]
pub enum SettingsError {
    #[error(
        "refusing to listen on {0} without authentication: anyone who reaches the port could \
         run commands. Set KEEL_RUNTIME_TOKEN (--runtime-token), or KEEL_REMOTE_MODE=1 with \
         an identity verifier, or listen on a loopback address"
    )]
    Unprotected(SocketAddr),
    #[error("{0}")]
    Invalid(String),
}
