//! The header form of a remote identity, for proxies that cannot sign: the shared secret
//! in `X-Keel-Remote-Secret` vouches for `X-Keel-Actor-Id`, `X-Keel-Org-Id`,
//! `X-Keel-Runtime-Id` and the optional `X-Keel-Project-Id`. Without the secret, those
//! headers are whatever a client chose to send, and count for nothing. `X-Keel-Role`
//! counts only when the operator says the proxy sets it (`KEEL_REMOTE_ROLE_HEADER`);
//! otherwise every caller of this form is a member.

use axum::http::HeaderMap;

use crate::api::auth::error::Rejected;
use crate::api::auth::token;
use crate::api::auth::values::single;
use crate::config::Redacted;
use crate::domain::Role;
use crate::domain::identity::{IdentityForm, RemoteIdentity, checked_id, checked_org_id};

pub(crate) const SECRET_HEADER: &str = "x-keel-remote-secret";
const ACTOR_HEADER: &str = "x-keel-actor-id";
const ORG_HEADER: &str = "x-keel-org-id";
const RUNTIME_HEADER: &str = "x-keel-runtime-id";
const PROJECT_HEADER: &str = "x-keel-project-id";
const ROLE_HEADER: &str = "x-keel-role";

/// The identity the headers vouch for, when the secret is right, and its role: the
/// `X-Keel-Role` header's when `role_header` is on, else member.
pub(crate) fn verify(
    headers: &HeaderMap,
    secret: &Redacted,
    runtime_id: &str,
    role_header: bool,
) -> Result<(RemoteIdentity, Role), Rejected> {
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
    let role = match role_header {
        true if headers.contains_key(ROLE_HEADER) => {
            Role::parse(single(headers, ROLE_HEADER)).ok_or("invalid role header")?
        }
        _ => Role::Member,
    };
    let identity = RemoteIdentity {
        actor_id: id(ACTOR_HEADER).ok_or("missing or invalid actor id")?,
        org_id: single(headers, ORG_HEADER)
            .and_then(checked_org_id)
            .ok_or("missing, invalid or reserved org id")?,
        runtime_id: runtime,
        project_id: project,
        name: None,
        form: IdentityForm::Headers,
    };
    Ok((identity, role))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_role_header_counts_only_when_the_operator_says_the_proxy_sets_it() {
        let secret: Redacted = "a-shared-secret-of-16".parse().unwrap();
        let mut headers = HeaderMap::new();
        for (name, value) in [
            (SECRET_HEADER, "a-shared-secret-of-16"),
            (ACTOR_HEADER, "alice"),
            (ORG_HEADER, "org_a"),
            (RUNTIME_HEADER, "rt"),
            (ROLE_HEADER, "operator"),
        ] {
            headers.insert(name, value.parse().unwrap());
        }
        let role = |headers: &HeaderMap, counted| verify(headers, &secret, "rt", counted);
        assert_eq!(role(&headers, false).unwrap().1, Role::Member);
        assert_eq!(role(&headers, true).unwrap().1, Role::Operator);
        headers.insert(ROLE_HEADER, "runtime_operator".parse().unwrap());
        assert_eq!(role(&headers, false).unwrap().1, Role::Member);
        assert_eq!(role(&headers, true).unwrap().1, Role::RuntimeOperator);
        headers.insert(ROLE_HEADER, "root".parse().unwrap());
        assert!(role(&headers, true).is_err());
        headers.remove(ROLE_HEADER);
        assert_eq!(role(&headers, true).unwrap().1, Role::Member);
    }
}
