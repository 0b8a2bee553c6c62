//! MCP servers an agent loop task reaches: how a task names one, and the limits on them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Most MCP servers one task names.
pub const MAX_MCP_SERVERS: usize = 8;
/// Most tools one server may offer a run (after its `tools` allowlist).
pub const MAX_MCP_TOOLS_PER_SERVER: usize = 64;
/// Longest server name: `mcp__<server>__<tool>` must stay within the 64 characters the
/// model APIs allow a tool name.
pub const MAX_MCP_SERVER_NAME: usize = 20;

closed_set! {
    /// How an MCP server's tool calls are gated: `auto` (as the run's approval policies
    /// say for built-in tools), `require_approval` (every call waits for an operator), or
    /// `block` (the server is not started and its tools are not offered).
    McpApprovalPolicy {
        Auto = "auto",
        RequireApproval = "require_approval",
        Block = "block",
    }
}

closed_set! {
    /// How Keel reaches an MCP server: a process it starts in the run's sandbox and speaks
    /// to over stdin and stdout, or a streamable-HTTP endpoint.
    McpTransport {
        Stdio = "stdio",
        Http = "http",
    }
}

/// One MCP server of an agent loop task. Exactly one of `command` (stdio) or `url` (http);
/// `transport`, when given, must match it. Values of `env` and `headers` are secret
/// references (`env:NAME`, `file:/path`), resolved by the worker at each attempt and never
/// stored or shown resolved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct McpServer {
    /// The name the server's tools are called by, `mcp__<name>__<tool>`: lower-case
    /// letters and digits in words joined by one `_` or `-`, at most 20 characters, unique
    /// per task.
    #[schema(pattern = "^[a-z0-9]+([_-][a-z0-9]+)*$", max_length = 20)]
    pub name: String,
    /// `stdio` or `http` (absent: from `command` or `url`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<McpTransport>)]
    pub transport: Option<String>,
    /// stdio: the program, started in the run's workspace and sandbox with a clean
    /// environment (a name is looked up on the sandbox's `PATH`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    /// stdio: the program's arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// stdio: environment variables of the server, each a secret reference.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// http: the server's streamable-HTTP endpoint (`https://`, or `http://`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// http: request headers, each value a secret reference (`Authorization` whole:
    /// `Bearer …` is the secret's value).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// `auto` (absent: the same), `require_approval` or `block`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<McpApprovalPolicy>)]
    pub approval_policy: Option<String>,
    /// The server's tools the model may call, by the server's own names (absent: all it
    /// offers, at most 64).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(max_items = 64)]
    pub tools: Option<Vec<String>>,
}

/// A task's MCP servers as stored and shown: a JSON array.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct McpServers(pub Vec<McpServer>);

#[cfg(feature = "sqlx")]
impl sqlx::Type<sqlx::Postgres> for McpServers {
    fn type_info() -> sqlx::postgres::PgTypeInfo {
        <sqlx::types::Json<Vec<McpServer>> as sqlx::Type<sqlx::Postgres>>::type_info()
    }

    fn compatible(ty: &sqlx::postgres::PgTypeInfo) -> bool {
        <sqlx::types::Json<Vec<McpServer>> as sqlx::Type<sqlx::Postgres>>::compatible(ty)
    }
}

#[cfg(feature = "sqlx")]
impl<'r> sqlx::Decode<'r, sqlx::Postgres> for McpServers {
    fn decode(value: sqlx::postgres::PgValueRef<'r>) -> Result<Self, sqlx::error::BoxDynError> {
        let servers =
            <sqlx::types::Json<Vec<McpServer>> as sqlx::Decode<sqlx::Postgres>>::decode(value)?;
        Ok(McpServers(servers.0))
    }
}
