//! MCP servers an agent loop task reaches: how a task names one, and the limits on them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::openapi::schema::{
    AdditionalProperties, AllOfBuilder, ArrayBuilder, ObjectBuilder, OneOfBuilder, Schema,
    SchemaType, Type,
};
use utoipa::openapi::{Ref, RefOr};
use utoipa::{PartialSchema, ToSchema};

use crate::schema::{
    ENV_NAME, HEADER_NAME, HTTP_URL, NO_NUL, NOT_BLANK, one_of_strings, secret_ref, string,
    string_map,
};

/// Most MCP servers one task names.
pub const MAX_MCP_SERVERS: usize = 8;
/// Most tools one server may offer a run (after its `tools` allowlist).
pub const MAX_MCP_TOOLS_PER_SERVER: usize = 64;
/// Longest server name: `mcp__<server>__<tool>` must stay within the 64 characters the
/// model APIs allow a tool name.
pub const MAX_MCP_SERVER_NAME: usize = 20;
/// A server's name: lower-case letters and digits in words joined by one `_` or `-` (the
/// alias `mcp__<server>__<tool>` then splits at its `__` in one way only).
pub const MCP_SERVER_NAME: &str = "^[a-z0-9]+([_-][a-z0-9]+)*$";
/// An allowlisted tool's name: what the model APIs take in a tool name (letters, digits,
/// `_` and `-`); `mcp__<server>__<tool>` must also stay within 64 characters.
pub const MCP_TOOL_NAME: &str = "^[A-Za-z0-9_-]+$";
/// Longest tool name a model API takes.
pub const MAX_TOOL_NAME: usize = 64;
/// Most arguments of a stdio server, and the longest one and the longest command (bytes).
pub const MAX_MCP_ARGS: usize = 64;
pub const MAX_MCP_ARG_BYTES: usize = 4096;
/// Most environment variables or headers of one server.
pub const MAX_MCP_NAMED_SECRETS: usize = 32;

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
///
/// Its schema is hand-written ([`mcp_server_schema`]): the closed object and, as a `oneOf`,
/// the two transports with the fields each takes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServer {
    /// The name the server's tools are called by, `mcp__<name>__<tool>`: lower-case
    /// letters and digits in words joined by one `_` or `-`, at most 20 characters, unique
    /// per task.
    pub name: String,
    /// `stdio` or `http` (absent: from `command` or `url`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
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
    pub approval_policy: Option<String>,
    /// The server's tools the model may call, by the server's own names (absent: all it
    /// offers, at most 64).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<String>>,
}

impl PartialSchema for McpServer {
    fn schema() -> RefOr<Schema> {
        mcp_server_schema()
    }
}

impl ToSchema for McpServer {
    fn name() -> std::borrow::Cow<'static, str> {
        std::borrow::Cow::Borrowed("McpServer")
    }

    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        for (name, schema) in [
            (McpTransport::name(), McpTransport::schema()),
            (McpApprovalPolicy::name(), McpApprovalPolicy::schema()),
        ] {
            schemas.push((name.into_owned(), schema));
        }
    }
}

/// The closed object of every field, and a `oneOf` of the transports: `command` (stdio,
/// with `args` and `env`, no `headers`) or `url` (http, with `headers`, no `args` or
/// `env`), `transport` matching when given.
fn mcp_server_schema() -> RefOr<Schema> {
    let nullable_ref = |name: &str| -> RefOr<Schema> {
        OneOfBuilder::new()
            .item(ObjectBuilder::new().schema_type(Type::Null))
            .item(Ref::from_schema_name(name))
            .into()
    };
    let secrets = |key: &str, what: &str| {
        string_map(
            false,
            key,
            secret_ref(false).description(Some(
                "A secret reference: `env:NAME`, `file:/absolute/path` or `keychain:NAME`, \
                 allowed by the operator's secret policy (422 otherwise).",
            )),
            Some(MAX_MCP_NAMED_SECRETS),
        )
        .description(Some(what))
    };
    let tools = ArrayBuilder::new()
        .schema_type(SchemaType::from_iter([Type::Array, Type::Null]))
        .items(string(
            false,
            MCP_TOOL_NAME,
            Some(MAX_TOOL_NAME - "mcp____".len() - 1),
        ))
        .min_items(Some(1))
        .max_items(Some(MAX_MCP_TOOLS_PER_SERVER))
        .unique_items(true)
        .description(Some(
            "The server's tools the model may call, by the server's own names: 1 to 64, each \
             once, of letters, digits, `_` and `-`, with `mcp__<server>__<tool>` at most 64 \
             characters (422 otherwise); absent: all it offers, at most 64.",
        ));
    let object = ObjectBuilder::new()
        .schema_type(Type::Object)
        .additional_properties(Some(AdditionalProperties::<Schema>::FreeForm(false)))
        .property(
            "name",
            string(false, MCP_SERVER_NAME, Some(MAX_MCP_SERVER_NAME)).description(Some(
                "The name the server's tools are called by, `mcp__<name>__<tool>`: lower-case \
                 letters and digits in words joined by one `_` or `-`, at most 20 characters, \
                 unique per task (422 for a name given twice).",
            )),
        )
        .required("name")
        .property("transport", nullable_ref(&McpTransport::name()))
        .property(
            "command",
            string(true, NOT_BLANK, Some(MAX_MCP_ARG_BYTES)).description(Some(
                "stdio: the program, started in the run's workspace and sandbox with a clean \
                 environment (a name is looked up on the sandbox's `PATH`).",
            )),
        )
        .property(
            "args",
            ArrayBuilder::new()
                .items(string(false, NO_NUL, Some(MAX_MCP_ARG_BYTES)))
                .max_items(Some(MAX_MCP_ARGS))
                .description(Some("stdio: the program's arguments.")),
        )
        .property(
            "env",
            secrets(
                ENV_NAME,
                "stdio: environment variables of the server, by name, each a secret reference.",
            ),
        )
        .property(
            "url",
            string(true, HTTP_URL, None).description(Some(
                "http: the server's streamable-HTTP endpoint (`https://`, or `http://`), \
                 without credentials.",
            )),
        )
        .property(
            "headers",
            secrets(
                HEADER_NAME,
                "http: request headers, by name, each value a secret reference \
                 (`Authorization` whole: `Bearer …` is the secret's value).",
            ),
        )
        .property("approval_policy", nullable_ref(&McpApprovalPolicy::name()))
        .property("tools", tools);
    let empty_map = || ObjectBuilder::new().max_properties(Some(0));
    let stdio = ObjectBuilder::new()
        .description(Some("stdio: `command`, no `url` or `headers`."))
        .property("command", ObjectBuilder::new().schema_type(Type::String))
        .required("command")
        .property(
            "transport",
            one_of_strings(true, &[McpTransport::Stdio.as_str()]),
        )
        .property("headers", empty_map());
    let http = ObjectBuilder::new()
        .description(Some("http: `url`, no `command`, `args` or `env`."))
        .property("url", ObjectBuilder::new().schema_type(Type::String))
        .required("url")
        .property(
            "transport",
            one_of_strings(true, &[McpTransport::Http.as_str()]),
        )
        .property("args", ArrayBuilder::new().max_items(Some(0)))
        .property("env", empty_map());
    AllOfBuilder::new()
        .description(Some(
            "One MCP server of an agent loop task: exactly one of `command` (stdio) or `url` \
             (http), `transport` matching it when given.",
        ))
        .item(object)
        .item(OneOfBuilder::new().item(stdio).item(http))
        .into()
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
