//! A workspace's approval policy: what each gate decides (allow, ask for an approval, or
//! deny), per MCP server too, and where file writers may write. The process setting
//! (`KEEL_APPROVAL_POLICIES`) is the default for workspaces that have none.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;
use utoipa::openapi::schema::{AdditionalProperties, ArrayBuilder, ObjectBuilder};
use utoipa::openapi::{RefOr, Schema};

use crate::schema::string;
use crate::{MAX_MCP_SERVER_NAME, MCP_SERVER_NAME};

closed_set! {
    /// What a gate decides: `allow` (no approval), `ask` (an operator approves first) or
    /// `deny` (refused: a run at admission with 403, a tool call with `policy.tool_blocked`).
    GateDecision {
        Allow = "allow",
        Ask = "ask",
        Deny = "deny",
    }
}

impl GateDecision {
    /// The stricter of two decisions: deny over ask over allow.
    pub fn strictest(self, other: GateDecision) -> GateDecision {
        let rank = |d: GateDecision| match d {
            GateDecision::Allow => 0,
            GateDecision::Ask => 1,
            GateDecision::Deny => 2,
        };
        if rank(other) > rank(self) {
            other
        } else {
            self
        }
    }
}

/// Each gate's decision. A gate covers a task kind at admission and the agent tools that do
/// the same mid-loop; `all_tools` applies to every task and tool, on top of the others.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GateDecisions {
    /// Shell tasks, and `shell_exec` and `http_request` calls.
    pub shell_exec: GateDecision,
    /// Git tasks (and a `push_branch`), and `git_status` / `git_diff` calls.
    pub git_exec: GateDecision,
    /// File tasks, and `file_write` / `file_edit` / `apply_patch` calls.
    pub file_write: GateDecision,
    /// What can reach the network when the task has it: shell tasks, hooks, a remote
    /// repository's clone and push, `shell_exec`, `http_request` and MCP tool calls.
    pub network_egress: GateDecision,
    /// `read_file`, `list_dir`, `grep` and `glob` calls.
    pub read_file: GateDecision,
    /// Every task and every tool call.
    pub all_tools: GateDecision,
}

/// Most MCP servers a policy names, and most write paths it lists.
pub const MAX_POLICY_MCP_SERVERS: usize = 32;
pub const MAX_WRITE_PATHS: usize = 32;
pub const MAX_WRITE_PATH_CHARS: usize = 256;

/// A workspace-relative path: segments separated by `/`, none empty, none `..`, no NUL.
pub const WRITE_PATH: &str = concat!(
    r"^(\.|\.\.[^/\u0000]+|\.[^./\u0000][^/\u0000]*|[^./\u0000][^/\u0000]*)",
    r"(/(\.|\.\.[^/\u0000]+|\.[^./\u0000][^/\u0000]*|[^./\u0000][^/\u0000]*))*$"
);

/// Whether `path` is a write path as [`WRITE_PATH`] states it.
pub fn is_write_path(path: &str) -> bool {
    !path.is_empty()
        && path.chars().count() <= MAX_WRITE_PATH_CHARS
        && !path.contains('\0')
        && path.split('/').all(|s| !s.is_empty() && s != "..")
}

/// A write path in its normal form: `.` segments dropped (`./src` is `src`), the whole
/// workspace as `.`.
pub fn normal_write_path(path: &str) -> String {
    let kept: Vec<&str> = path
        .split('/')
        .filter(|s| !s.is_empty() && *s != ".")
        .collect();
    match kept.is_empty() {
        true => ".".to_string(),
        false => kept.join("/"),
    }
}

/// Whether a workspace-relative path (normal, as a resolved path is) lies beneath one of
/// `write_paths` (normal too); None allows every path.
pub fn is_beneath_write_paths(write_paths: Option<&[String]>, path: &str) -> bool {
    let Some(paths) = write_paths else {
        return true;
    };
    paths.iter().any(|scope| {
        scope == "."
            || path == scope
            || path
                .strip_prefix(scope.as_str())
                .is_some_and(|rest| rest.starts_with('/'))
    })
}

/// The policy in force for a workspace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[schema(example = json!({
    "workspace_id": "acme", "source": "workspace",
    "gates": { "shell_exec": "ask", "git_exec": "ask", "file_write": "allow",
               "network_egress": "ask", "read_file": "allow", "all_tools": "allow" },
    "mcp_servers": { "github": "deny" }, "allowed_write_paths": ["src", "docs"],
    "updated_at": "2026-12-04T10:00:00Z", "updated_by": "alice"
}))]
pub struct ApprovalPolicyRecord {
    pub workspace_id: String,
    /// `workspace`: an operator set it; `default`: the process setting
    /// (`KEEL_APPROVAL_POLICIES`) applies.
    pub source: PolicySource,
    pub gates: GateDecisions,
    /// Per MCP server name: on top of the gates and of the server's own `approval_policy`
    /// on the task (the strictest applies).
    pub mcp_servers: BTreeMap<String, GateDecision>,
    /// Where file writers may write, relative to the run's workspace (a directory covers
    /// what is beneath it); a write elsewhere is denied. Null: anywhere in the workspace.
    pub allowed_write_paths: Option<Vec<String>>,
    pub updated_at: Option<DateTime<Utc>>,
    pub updated_by: Option<String>,
}

closed_set! {
    /// Where a workspace's policy comes from.
    PolicySource {
        Workspace = "workspace",
        Default = "default",
    }
}

/// A workspace's new policy, whole: every gate is named, so nothing changes by omission.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(example = json!({
    "gates": { "shell_exec": "ask", "git_exec": "ask", "file_write": "allow",
               "network_egress": "ask", "read_file": "allow", "all_tools": "allow" },
    "mcp_servers": { "github": "deny" }, "allowed_write_paths": ["src", "docs"]
}))]
pub struct ApprovalPolicyRequest {
    pub gates: GateDecisions,
    #[serde(default)]
    #[schema(schema_with = mcp_servers_schema)]
    pub mcp_servers: BTreeMap<String, GateDecision>,
    #[serde(default)]
    #[schema(schema_with = write_paths_schema)]
    pub allowed_write_paths: Option<Vec<String>>,
}

fn mcp_servers_schema() -> ObjectBuilder {
    let decision: RefOr<Schema> = RefOr::Ref(utoipa::openapi::Ref::from_schema_name(
        <GateDecision as utoipa::ToSchema>::name(),
    ));
    ObjectBuilder::new()
        .schema_type(utoipa::openapi::schema::Type::Object)
        .property_names(Some(string(
            false,
            MCP_SERVER_NAME,
            Some(MAX_MCP_SERVER_NAME),
        )))
        .additional_properties(Some(AdditionalProperties::RefOr(decision)))
        .max_properties(Some(MAX_POLICY_MCP_SERVERS))
        .description(Some(
            "MCP server name (as a task's `mcp_servers` names it) → decision for its tools.",
        ))
}

fn write_paths_schema() -> ArrayBuilder {
    ArrayBuilder::new()
        .schema_type(utoipa::openapi::schema::SchemaType::from_iter([
            utoipa::openapi::schema::Type::Array,
            utoipa::openapi::schema::Type::Null,
        ]))
        .items(string(false, WRITE_PATH, Some(MAX_WRITE_PATH_CHARS)))
        .max_items(Some(MAX_WRITE_PATHS))
        .description(Some(
            "Workspace-relative paths file writers may write beneath (`.` is the whole \
             workspace); null or absent: anywhere. Checked on the resolved path, so a \
             symbolic link does not lead around it.",
        ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_paths_are_relative_and_never_climb() {
        let pattern = regex_lite(WRITE_PATH);
        for good in [".", "src", "src/lib", "./src", ".github", "...", "a b/c"] {
            assert!(is_write_path(good), "{good}");
            assert!(pattern(good), "{good}");
        }
        for bad in ["", "/etc", "..", "src/../..", "src/", "a//b", "a\0b"] {
            assert!(!is_write_path(bad), "{bad:?}");
            assert!(!pattern(bad), "{bad:?}");
        }
    }

    /// The schema's pattern, matched the way JSON Schema validators do (anchored here).
    fn regex_lite(pattern: &str) -> impl Fn(&str) -> bool {
        let re = regex::Regex::new(pattern).expect("the pattern compiles");
        move |s| re.is_match(s)
    }

    #[test]
    fn write_paths_cover_what_is_beneath_them() {
        assert_eq!(normal_write_path("./src/"), "src");
        assert_eq!(normal_write_path("."), ".");
        let paths = ["src".to_string(), "docs/api.md".to_string()];
        let beneath = |p: &str| is_beneath_write_paths(Some(&paths), p);
        assert!(beneath("src") && beneath("src/a/b.rs") && beneath("docs/api.md"));
        assert!(!beneath("srcs/a") && !beneath("docs") && !beneath("README.md"));
        assert!(is_beneath_write_paths(Some(&[".".to_string()]), "x"));
        assert!(is_beneath_write_paths(None, "x"));
        assert!(!is_beneath_write_paths(Some(&[]), "x"));
    }

    #[test]
    fn the_strictest_decision_wins() {
        use GateDecision::*;
        assert_eq!(Allow.strictest(Ask), Ask);
        assert_eq!(Deny.strictest(Ask), Deny);
        assert_eq!(Ask.strictest(Allow), Ask);
    }
}
