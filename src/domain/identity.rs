//! Who is asking, and which workspace (tenant) they act in. The API's auth layer makes a
//! [`Caller`] for every request; the store takes its [`Scope`] on every query that reads
//! or changes a workspace's rows, so one workspace can never see another's.

use super::Actor;

/// The workspace of local mode, and of every row written before workspaces existed.
pub const DEFAULT_WORKSPACE: &str = "default";

/// The actor id of a request in local mode.
pub const LOCAL_ACTOR: &str = "local";

/// Longest id accepted: ids become workspace ids and log fields.
const MAX_ID_LEN: usize = 128;

/// An id safe as a workspace id and a log field: 1 to 128 printable ASCII characters, no
/// spaces.
pub fn checked_id(value: &str) -> Option<String> {
    (!value.is_empty() && value.len() <= MAX_ID_LEN && value.bytes().all(|b| b.is_ascii_graphic()))
        .then(|| value.to_string())
}

/// An org id a remote identity may name: a [`checked_id`] other than
/// [`DEFAULT_WORKSPACE`], which is local mode's workspace (and every row's from before
/// workspaces): an org of that name would see them all.
pub fn checked_org_id(value: &str) -> Option<String> {
    checked_id(value).filter(|id| id != DEFAULT_WORKSPACE)
}

/// The tenant a store query is confined to.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Scope {
    workspace: String,
}

impl Scope {
    pub fn new(workspace: impl Into<String>) -> Self {
        Scope {
            workspace: workspace.into(),
        }
    }

    /// The one workspace of local mode.
    pub fn local() -> Self {
        Scope::new(DEFAULT_WORKSPACE)
    }

    pub fn workspace(&self) -> &str {
        &self.workspace
    }
}

pub use keel_api_types::{IdentityForm, RemoteIdentity};

/// The caller of one API request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub actor_id: String,
    pub scope: Scope,
    /// Present in remote mode.
    pub remote: Option<RemoteIdentity>,
}

impl Caller {
    /// A request in local mode: the `local` actor in the default workspace.
    pub fn local() -> Self {
        Caller {
            actor_id: LOCAL_ACTOR.into(),
            scope: Scope::local(),
            remote: None,
        }
    }

    /// A request vouched for by a trusted proxy: the org is the workspace.
    pub fn remote(identity: RemoteIdentity) -> Self {
        Caller {
            actor_id: identity.actor_id.clone(),
            scope: Scope::new(identity.org_id.clone()),
            remote: Some(identity),
        }
    }

    /// Whether the caller operates the runtime rather than using one workspace of it: the
    /// local caller (who could stop the process or read its database anyway). Remote
    /// callers act only inside their own workspace.
    pub fn is_operator(&self) -> bool {
        self.remote.is_none()
    }

    /// The actor the audit trail records for this caller's changes.
    pub fn actor(&self) -> Actor {
        Actor::Person(self.actor_id.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_bounded_printable_and_non_empty() {
        assert_eq!(checked_id("org_1").as_deref(), Some("org_1"));
        assert!(checked_id("").is_none());
        assert!(checked_id("a b").is_none());
        assert!(checked_id("a\u{0}").is_none());
        assert!(checked_id("é").is_none());
        assert!(checked_id(&"a".repeat(129)).is_none());
        assert_eq!(checked_org_id("org_1").as_deref(), Some("org_1"));
        assert!(checked_org_id(DEFAULT_WORKSPACE).is_none());
    }
}
