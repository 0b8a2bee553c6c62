//! Who is asking, and which workspace (tenant) they act in. The API's auth layer makes a
//! [`Caller`] for every request; the store takes its [`Scope`] on every query that reads
//! or changes a workspace's rows, so one workspace can never see another's.

use crate::domain::Actor;

/// The workspace of local mode, and of every row written before workspaces existed.
pub(crate) const DEFAULT_WORKSPACE: &str = "default";

/// The actor id of a request in local mode.
pub(crate) const LOCAL_ACTOR: &str = "local";

/// Longest id accepted: ids become workspace ids and log fields.
const MAX_ID_LEN: usize = 128;

/// An id safe as a workspace id and a log field: 1 to 128 printable ASCII characters, no
/// spaces.
pub(crate) fn checked_id(value: &str) -> Option<String> {
    (!value.is_empty() && value.len() <= MAX_ID_LEN && value.bytes().all(|b| b.is_ascii_graphic()))
        .then(|| value.to_string())
}

/// An org id a remote identity may name: a [`checked_id`] other than
/// [`DEFAULT_WORKSPACE`], which is local mode's workspace (and every row's from before
/// workspaces): an org of that name would see them all.
pub(crate) fn checked_org_id(value: &str) -> Option<String> {
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

    pub(crate) fn workspace(&self) -> &str {
        &self.workspace
    }

    /// The workspace id as one directory name, under which every directory Keel makes for
    /// the workspace lives (and beneath which its remote callers' `in_place` directories
    /// must lie): letters, digits, `_`, `-` and `.` as they are, every other byte `%XX`,
    /// and the dots of `.` and `..` too, so two workspaces never share a name and none
    /// names a root or its parent.
    pub(crate) fn directory_name(&self) -> String {
        let kept = |b: u8| b.is_ascii_alphanumeric() || b"_-.".contains(&b);
        let name: String = self
            .workspace
            .bytes()
            .map(|b| match kept(b) {
                true => char::from(b).to_string(),
                false => format!("%{b:02X}"),
            })
            .collect();
        match name.as_str() {
            "." | ".." => name.replace('.', "%2E"),
            _ => name,
        }
    }
}

pub(crate) use keel_api_types::{IdentityForm, RemoteIdentity};

/// What a caller may do, in three levels: each may what the one before it may.
///
/// - A member works in its workspace: tasks, runs, schedules, presets, sources and MCP
///   servers naming only the secrets its workspace was granted and aimed only at allowed
///   hosts, sources without hooks or roots.
/// - An operator runs its org (a tenant): it also resolves approvals and applies patches
///   of other people's requests, sets its workspace's limits and approval policy, and
///   registers sources with hooks or `workspace.root`. Within its grants, as a member: the
///   runtime's secrets and its hosts are not the tenant's.
/// - The runtime operator is the deployment's own: the local caller, and a remote identity
///   the signer marks `runtime_operator`. Only it names secrets not granted to the
///   workspace, and aims presets, sources and MCP servers at hosts off the allowlist.
///
/// Ordered by level, so "at least the role that wrote it" is a comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum Role {
    #[default]
    Member,
    Operator,
    RuntimeOperator,
}

impl Role {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Role::Member => "member",
            Role::Operator => "operator",
            Role::RuntimeOperator => "runtime_operator",
        }
    }

    /// The role a `role` claim or `X-Keel-Role` header names (or a row stores); absent
    /// means member.
    pub(crate) fn parse(value: Option<&str>) -> Option<Role> {
        match value {
            None | Some("member") => Some(Role::Member),
            Some("operator") => Some(Role::Operator),
            Some("runtime_operator") => Some(Role::RuntimeOperator),
            Some(_) => None,
        }
    }

    /// The role a stored `written_by_role` names; a value this build does not know counts
    /// as a member's, which holds the row to the most rules.
    pub(crate) fn stored(value: &str) -> Role {
        Role::parse(Some(value)).unwrap_or(Role::Member)
    }

    /// Whether this role may name any secret the secret policy allows and aim at any host:
    /// the deployment's own operator only.
    pub(crate) fn is_runtime_operator(self) -> bool {
        self == Role::RuntimeOperator
    }
}

/// The caller of one API request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub(crate) actor_id: String,
    pub scope: Scope,
    /// Present in remote mode.
    pub(crate) remote: Option<RemoteIdentity>,
    /// The local caller is always the runtime operator; a remote one is what its identity
    /// says.
    pub(crate) role: Role,
}

impl Caller {
    /// A request in local mode: the `local` actor in the default workspace.
    pub fn local() -> Self {
        Caller {
            actor_id: LOCAL_ACTOR.into(),
            scope: Scope::local(),
            remote: None,
            role: Role::RuntimeOperator,
        }
    }

    /// A request vouched for by a trusted proxy: the org is the workspace.
    pub(crate) fn remote(identity: RemoteIdentity, role: Role) -> Self {
        Caller {
            actor_id: identity.actor_id.clone(),
            scope: Scope::new(identity.org_id.clone()),
            remote: Some(identity),
            role,
        }
    }

    /// Whether the caller may do what only operators do (see [`Role`]): the local caller
    /// (who could stop the process or read its database anyway), and remote callers whose
    /// identity carries the operator or the runtime operator role.
    pub(crate) fn is_operator(&self) -> bool {
        self.role >= Role::Operator
    }

    /// Whether the caller is on the runtime's own machine (local mode): only it may name
    /// the host's files (a source's `workflow_path`).
    pub(crate) fn is_local(&self) -> bool {
        self.remote.is_none()
    }

    /// Refuses (with the reason) what only an operator may do.
    pub(crate) fn require_operator(&self, what: &str) -> Result<(), String> {
        if self.is_operator() {
            return Ok(());
        }
        Err(format!(
            "only an operator may {what}; this identity's role is {}",
            self.role.as_str()
        ))
    }

    /// Who the caller is from one request to the next, for what is counted per identity
    /// (requests against the rate limit, open streams): its workspace and actor.
    pub(crate) fn identity(&self) -> (String, String) {
        (self.scope.workspace().to_string(), self.actor_id.clone())
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
    fn directory_names_are_one_component_and_never_shared() {
        let name = |id: &str| Scope::new(id).directory_name();
        assert_eq!(name("org_a"), "org_a");
        assert_eq!(name("org/a"), "org%2Fa");
        assert_ne!(name("org/a"), name("org_a"));
        assert_ne!(name("org%2Fa"), name("org/a"));
        assert_eq!(name(".."), "%2E%2E");
        assert_eq!(name("."), "%2E");
        assert_eq!(name("a..b"), "a..b");
        assert!(!name("../x").contains('/'));
    }

    #[test]
    fn roles_parse_and_rank_by_level() {
        assert_eq!(Role::parse(None), Some(Role::Member));
        for role in [Role::Member, Role::Operator, Role::RuntimeOperator] {
            assert_eq!(Role::parse(Some(role.as_str())), Some(role));
        }
        assert_eq!(Role::parse(Some("root")), None);
        assert_eq!(Role::stored("root"), Role::Member);
        assert!(Role::Member < Role::Operator && Role::Operator < Role::RuntimeOperator);
        assert!(Caller::local().role.is_runtime_operator());
        assert!(!Role::Operator.is_runtime_operator());
    }

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
