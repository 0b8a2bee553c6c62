//! The header form of a remote identity, for proxies that cannot sign: the shared secret
//! in `X-Keel-Remote-Secret` vouches for `X-Keel-Actor-Id`, `X-Keel-Org-Id`,
//! `X-Keel-Runtime-Id` and the optional `X-Keel-Project-Id`. Without the secret, those
//! headers are whatever a client chose to send, and count for nothing.

use axum::http::HeaderMap;

use super::jwt::Rejected;
use super::token;
use crate::config::Redacted;
use crate::domain::identity::{IdentityForm, RemoteIdentity, checked_id, checked_org_id};

pub const SECRET_HEADER: &str = "x-keel-remote-secret";
const ACTOR_HEADER: &str = "x-keel-actor-id";
const ORG_HEADER: &str = "x-keel-org-id";
const RUNTIME_HEADER: &str = "x-keel-runtime-id";
const PROJECT_HEADER: &str = "x-keel-project-id";

const MAX_NAME_LEN: usize = 256;

/// The identity the headers vouch for, when the secret is right.
pub fn verify(
    headers: &HeaderMap,
    secret: &Redacted,
    runtime_id: &str,
) -> Result<RemoteIdentity, Rejected> {
    let presented = single(headers, SECRET_HEADER).ok_or("no remote secret")?;
    if !token::matches(presented, secret) {
        return Err("wrong remote secret");
    }
    let id = |name: &'static str| single(headers, name).and_then(checked_id);
    let runtime = id(RUNTIME_HEADER).ok_or("missing or invalid runtime id")?;
    if runtime != runtime_id {
        return Err("the runtime id names another runtime");
    }
    let project = match single(headers, PROJECT_HEADER).filter(|p| !p.is_empty()) {
        Some(project) => Some(checked_id(project).ok_or("invalid project id")?),
        None => None,
    };
    Ok(RemoteIdentity {
        actor_id: id(ACTOR_HEADER).ok_or("missing or invalid actor id")?,
        org_id: single(headers, ORG_HEADER)
            .and_then(checked_org_id)
            .ok_or("missing, invalid or reserved org id")?,
        runtime_id: runtime,
        project_id: project,
        name: None,
        form: IdentityForm::Headers,
    })
}

/// The header's value when it is sent exactly once: a repeated identity header is ambiguous.
pub fn single<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    let mut values = headers.get_all(name).iter();
    let value = values.next()?;
    values
        .next()
        .is_none()
        .then(|| value.to_str().ok())
        .flatten()
}

/// A display name: up to 256 characters, no control characters.
pub fn checked_name(value: &str) -> Option<String> {
    (value.chars().count() <= MAX_NAME_LEN && !value.chars().any(char::is_control))
        .then(|| value.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_have_no_control_characters() {
        assert!(checked_name("Ada Lovelace").is_some());
        assert!(checked_name("bad\nname").is_none());
    }
}
