//! MCP servers as tools of the loop, through the official SDK (`rmcp`). Each server of a
//! run is started once per attempt, in the run's sandbox like any process a run starts
//! ([`crate::process::start_with`]: a clean environment, its own containment, killed
//! when the attempt ends). The servers of an attempt start together, under one deadline
//! ([`Server::connect_all`]), and their tools are listed then and offered to the model as
//! `mcp__<server>__<tool>` with the server's own JSON schemas. A call goes to its server
//! with a timeout and comes back as a bounded result. A server that cannot be started or
//! listed is kept with the reason, and every call of one of its tools answers that reason
//! as a tool error: the model reads it, the worker goes on.

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use keel_api_types::MAX_TOOL_NAME;
use reqwest13::header::{HeaderName, HeaderValue};
use rmcp::model::CallToolRequestParams;
use rmcp::service::{RoleClient, RunningService, ServiceExt};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use serde_json::Value;
use tokio::io::AsyncReadExt;
use tokio_util::sync::CancellationToken;

use super::tools::{ToolEnv, bound, clean};
use super::{ToolCall, ToolResult, ToolSpec};
use crate::media::egress::{check_url, describe, guarded_13};
use crate::process::{start_with, thousands};
use crate::sandbox::Containment;

/// How much of a server's stderr is kept for the message when it fails.
const STDERR_TAIL_BYTES: usize = 2048;
/// How long a server that failed to start has to finish writing its stderr.
const STDERR_DRAIN: Duration = Duration::from_secs(2);
/// Every alias starts so.
const PREFIX: &str = "mcp__";

/// One MCP server of a run, with its secrets resolved.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    pub name: String,
    pub transport: Transport,
    /// The server's tools the model may call (None: all it offers).
    pub allowed_tools: Option<Vec<String>>,
    /// Every call waits for an approval (`require_approval`).
    pub gated: bool,
}

/// How a server is reached.
#[derive(Clone)]
pub enum Transport {
    /// A program started in the run's workspace and sandbox.
    Stdio {
        command: String,
        args: Vec<String>,
        env: Vec<(String, String)>,
    },
    /// A streamable-HTTP endpoint, reached from the worker like `http_request`.
    Http {
        url: String,
        headers: Vec<(String, String)>,
    },
}

impl std::fmt::Debug for Transport {
    /// Without the environment's values: they are secrets.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Transport::Stdio { command, args, env } => f
                .debug_struct("Stdio")
                .field("command", command)
                .field("args", args)
                .field("env", &env.iter().map(|(k, _)| k).collect::<Vec<_>>())
                .finish(),
            Transport::Http { url, headers } => f
                .debug_struct("Http")
                .field("url", url)
                .field(
                    "headers",
                    &headers.iter().map(|(k, _)| k).collect::<Vec<_>>(),
                )
                .finish(),
        }
    }
}

/// What the run's tools may take from its servers.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Most tools one server may offer (after its allowlist).
    pub max_tools: usize,
    /// How long one call may take.
    pub call_timeout: Duration,
    /// How long the servers have, all of them together, to start and list their tools.
    pub connect_timeout: Duration,
}

/// A server as this attempt reached it: its tools, or why there are none.
pub struct Server {
    pub name: String,
    gated: bool,
    /// Its policy blocks it: calls of its tools are the policy's refusals.
    blocked: bool,
    state: Result<Live, String>,
}

/// A server that answered: the session, the tools offered, and the processes behind it.
struct Live {
    session: Session,
    tools: Vec<rmcp::model::Tool>,
    containment: Option<Containment>,
    stderr: Stderr,
}

impl Server {
    /// Starts (or reaches) every server at once and lists their tools, all within
    /// `limits.connect_timeout` from now: an attempt waits on its slowest server for one
    /// deadline, not on each in turn. Never fails: a server that does not come up is kept
    /// with the reason. The servers come back in the order given.
    pub async fn connect_all(
        configs: &[ServerConfig],
        env: &ToolEnv,
        limits: &Limits,
    ) -> Vec<Server> {
        let deadline = tokio::time::Instant::now() + limits.connect_timeout;
        let spawning = tokio::sync::Mutex::new(());
        let connecting = configs.iter().map(|config| {
            let live = live(config, env, limits, &spawning);
            Server::connect(config, live, limits, deadline)
        });
        futures_util::future::join_all(connecting).await
    }

    /// The server `live` reaches by `deadline`, or why not.
    async fn connect(
        config: &ServerConfig,
        live: impl Future<Output = Result<Live, String>>,
        limits: &Limits,
        deadline: tokio::time::Instant,
    ) -> Server {
        let reached = tokio::time::timeout_at(deadline, live).await;
        let state = reached.unwrap_or_else(|_| {
            Err(format!(
                "did not start and list its tools within {} s",
                limits.connect_timeout.as_secs_f64()
            ))
        });
        Server {
            name: config.name.clone(),
            gated: config.gated,
            blocked: false,
            state,
        }
    }

    /// A server this attempt does not reach (a secret it needs does not resolve): calls
    /// of its tools answer `why`.
    pub fn unavailable(name: String, why: String) -> Server {
        Server {
            name,
            gated: false,
            blocked: false,
            state: Err(why),
        }
    }

    /// A server its policy blocks: never started, and every call of its tools refused as
    /// the policy's.
    pub fn blocked(name: String) -> Server {
        Server {
            name,
            gated: false,
            blocked: true,
            state: Err("its approval_policy is block".to_string()),
        }
    }

    /// The names the model calls this server's tools by (none when it is down).
    pub fn aliases(&self) -> Vec<String> {
        match &self.state {
            Ok(live) => live
                .tools
                .iter()
                .map(|t| alias(&self.name, &t.name))
                .collect(),
            Err(_) => Vec::new(),
        }
    }

    /// Why the server offers no tools, when it does not.
    pub fn error(&self) -> Option<&str> {
        self.state.as_ref().err().map(String::as_str)
    }

    /// Ends the session and kills every process behind it.
    async fn shut_down(self) {
        if let Ok(mut live) = self.state {
            let _ = live.session.close().await;
            if let Some(containment) = live.containment.as_mut() {
                containment.end().await;
            }
        }
    }
}

/// Starts (or reaches) a server and lists its tools; `spawning` is held while a stdio
/// server's process starts.
async fn live(
    config: &ServerConfig,
    env: &ToolEnv,
    limits: &Limits,
    spawning: &tokio::sync::Mutex<()>,
) -> Result<Live, String> {
    let (session, containment, stderr) = match &config.transport {
        Transport::Stdio {
            command,
            args,
            env: vars,
        } => stdio(command, args, vars, env, spawning).await?,
        Transport::Http { url, headers } => (http(url, headers, env).await?, None, no_stderr()),
    };
    let offered = match session.list_all_tools().await {
        Ok(tools) => tools,
        Err(error) => {
            return Err(with_stderr(
                format!("did not list its tools: {error}"),
                &stderr,
            ));
        }
    };
    let tools = offered_tools(
        &config.name,
        offered,
        config.allowed_tools.as_deref(),
        limits,
    )?;
    Ok(Live {
        session,
        tools,
        containment,
        stderr,
    })
}

type Session = RunningService<RoleClient, ()>;
type Stderr = Arc<Mutex<Vec<u8>>>;

fn no_stderr() -> Stderr {
    Arc::new(Mutex::new(Vec::new()))
}

/// Starts a stdio server in the run's sandbox and initializes a session over its pipes.
/// Processes start one at a time (`spawning`): each takes the workspace over for its own
/// uid (`isolated`), and two such walks of one tree at once would leave it half one's, half
/// the other's. Only the initialization runs alongside the other servers'.
async fn stdio(
    command: &str,
    args: &[String],
    vars: &[(String, String)],
    env: &ToolEnv,
    spawning: &tokio::sync::Mutex<()>,
) -> Result<(Session, Option<Containment>, Stderr), String> {
    let argv: Vec<String> = std::iter::once(command.to_string())
        .chain(args.iter().cloned())
        .collect();
    let spawned = spawning.lock().await;
    let started = start_with(
        &argv,
        &env.workspace,
        vars,
        &env.sandbox,
        Stdio::piped(),
        None,
    );
    let (mut child, containment) = started.await?;
    drop(spawned);
    let stdin = child.stdin.take().expect("stdin is piped");
    let stdout = child.stdout.take().expect("stdout is piped");
    let (stderr, reading) = keep_tail(child.stderr.take().expect("stderr is piped"));
    // The session owns the pipes; the child is reaped by the containment's end.
    tokio::spawn(async move {
        let _ = child.wait().await;
    });
    match ().serve((stdout, stdin)).await {
        Ok(session) => Ok((session, Some(containment), stderr)),
        Err(error) => {
            // A server that failed to start closed stdout, and its stderr ends with why
            // (bwrap's "execvp … No such file"): the message waits for it, briefly.
            let _ = tokio::time::timeout(STDERR_DRAIN, reading).await;
            Err(with_stderr(format!("did not initialize: {error}"), &stderr))
        }
    }
}

/// Initializes a session with a streamable-HTTP server: only when the run has the network,
/// and (unless private addresses are allowed) only at a public address, checked as for
/// `http_request`; never following a redirect.
async fn http(url: &str, headers: &[(String, String)], env: &ToolEnv) -> Result<Session, String> {
    if !env.sandbox.network {
        return Err("is refused: this run has no network (sandbox_network false)".into());
    }
    let parsed = url::Url::parse(url).map_err(|e| format!("url is not a URL: {e}"))?;
    check_url(&parsed, env.allow_private_addresses).map_err(|why| format!("is refused: {why}"))?;
    let mut custom = std::collections::HashMap::new();
    for (name, value) in headers {
        let name = HeaderName::from_bytes(name.as_bytes())
            .map_err(|_| format!("header {name:?} is not a header name"))?;
        // The value is not echoed: it is a secret.
        let value = HeaderValue::from_str(value)
            .map_err(|_| format!("the value of header {name} is not a header value"))?;
        custom.insert(name, value);
    }
    let client = http_client(env.allow_private_addresses)?;
    let config = StreamableHttpClientTransportConfig::with_uri(url).custom_headers(custom);
    let transport = StreamableHttpClientTransport::with_client(client, config);
    ().serve(transport)
        .await
        .map_err(|error| format!("did not initialize: {}", describe(&error)))
}

/// The MCP SDK's HTTP client: rustls on ring with webpki's roots, as the 0.12 clients.
fn http_client(allow_private: bool) -> Result<reqwest13::Client, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("cannot configure TLS: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let builder = reqwest13::Client::builder().tls_backend_preconfigured(tls);
    guarded_13(builder, allow_private)
        .build()
        .map_err(|e| format!("cannot build the HTTP client: {e}"))
}

/// The tools a run may call: those the allowlist names (each must exist), at most
/// `limits.max_tools`, each with a name the model APIs take.
fn offered_tools(
    server: &str,
    offered: Vec<rmcp::model::Tool>,
    allowed: Option<&[String]>,
    limits: &Limits,
) -> Result<Vec<rmcp::model::Tool>, String> {
    if let Some(allowed) = allowed
        && let Some(missing) = allowed
            .iter()
            .find(|n| !offered.iter().any(|t| t.name == **n))
    {
        return Err(format!("offers no tool {missing:?} (named in its tools)"));
    }
    let tools: Vec<_> = offered
        .into_iter()
        .filter(|t| allowed.is_none_or(|a| a.iter().any(|n| *n == t.name)))
        .collect();
    if tools.len() > limits.max_tools {
        return Err(format!(
            "offers {} tools, more than the {} a server may; name the ones the run needs in \
             its tools",
            tools.len(),
            limits.max_tools
        ));
    }
    if let Some(bad) = tools
        .iter()
        .find(|t| !is_tool_name(&alias(server, &t.name)))
    {
        return Err(format!(
            "offers a tool named {:?}, which makes no tool name the model APIs take; leave \
             it out with the server's tools",
            bad.name
        ));
    }
    Ok(tools)
}

/// `why`, with the end of what the server wrote on stderr, when it wrote anything.
fn with_stderr(why: String, stderr: &Mutex<Vec<u8>>) -> String {
    let tail = String::from_utf8_lossy(&stderr.lock().expect("not poisoned")).into_owned();
    match tail.trim() {
        "" => why,
        tail => format!("{why}; its stderr ends: {tail}"),
    }
}

/// Reads a server's stderr to its end, keeping the last [`STDERR_TAIL_BYTES`]: a pipe
/// nobody reads would stop the server once full. The task ends at the stream's end.
fn keep_tail(mut stderr: tokio::process::ChildStderr) -> (Stderr, tokio::task::JoinHandle<()>) {
    let tail = Arc::new(Mutex::new(Vec::new()));
    let kept = tail.clone();
    let reading = tokio::spawn(async move {
        let mut buffer = [0u8; 4096];
        while let Ok(n) = stderr.read(&mut buffer).await {
            if n == 0 {
                break;
            }
            let mut tail = kept.lock().expect("not poisoned");
            tail.extend_from_slice(&buffer[..n]);
            let excess = tail.len().saturating_sub(STDERR_TAIL_BYTES);
            tail.drain(..excess);
        }
    });
    (tail, reading)
}

/// The name the model calls a server's tool by.
pub fn alias(server: &str, tool: &str) -> String {
    format!("{PREFIX}{server}__{tool}")
}

/// A tool name every model API takes: letters, digits, `_` and `-`, at most
/// [`MAX_TOOL_NAME`] (the contract's `MCP_TOOL_NAME` pattern and bound).
pub fn is_tool_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_TOOL_NAME
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// Whether a tool name is an MCP server's.
pub fn is_mcp_tool(name: &str) -> bool {
    name.starts_with(PREFIX)
}

/// The server an alias (`mcp__<server>__<tool>`) names, and the tool's own name: server
/// names never hold `__`.
pub fn server_of(name: &str) -> Option<(&str, &str)> {
    name.strip_prefix(PREFIX)?.split_once("__")
}

/// The run's servers, as the loop's tools see them.
pub struct McpTools {
    servers: Vec<Server>,
    limits: Limits,
    max_output_bytes: usize,
}

impl McpTools {
    pub fn new(servers: Vec<Server>, limits: Limits, max_output_bytes: usize) -> McpTools {
        McpTools {
            servers,
            limits,
            max_output_bytes,
        }
    }

    pub fn servers(&self) -> &[Server] {
        &self.servers
    }

    /// What the model is told about the servers' tools, server by server.
    pub fn specs(&self) -> Vec<ToolSpec> {
        let live = self
            .servers
            .iter()
            .filter_map(|s| Some((s, s.state.as_ref().ok()?)));
        live.flat_map(|(server, live)| {
            live.tools.iter().map(|tool| ToolSpec {
                name: alias(&server.name, &tool.name),
                description: tool
                    .description
                    .as_deref()
                    .unwrap_or(tool.title.as_deref().unwrap_or_default())
                    .to_string(),
                parameters: Value::Object((*tool.input_schema).clone()),
            })
        })
        .collect()
    }

    /// The aliases whose calls wait for an approval whatever the approval policy says:
    /// those of servers the task marked `require_approval`.
    pub fn gated(&self) -> Vec<String> {
        let gated = self.servers.iter().filter(|s| s.gated);
        gated.flat_map(Server::aliases).collect()
    }

    /// A one-line description of a call for an approval: the tool and the size of its
    /// arguments, which are not shown (they may carry anything).
    pub fn summarize(call: &ToolCall) -> String {
        let size = thousands(call.arguments.len() as u64);
        format!("{}: {size} bytes of arguments", clean(&call.name, 100))
    }

    /// Calls a server's tool; every failure (an unknown tool, a server that is down, bad
    /// arguments, a protocol error, the timeout) is a result with `is_error`.
    pub async fn call(&self, call: &ToolCall, cancel: &CancellationToken) -> ToolResult {
        if let Some(blocked) = self.blocked_server(&call.name) {
            let message = format!(
                "MCP server {:?} is blocked by its approval_policy",
                blocked.name
            );
            return ToolResult::blocked("mcp_server_blocked", message);
        }
        let (content, is_error) = match self.dispatch(call, cancel).await {
            Ok(done) => done,
            Err(message) => (message, true),
        };
        ToolResult {
            content: bound(content, self.max_output_bytes),
            is_error,
            patches: Vec::new(),
            blocked: None,
        }
    }

    async fn dispatch(
        &self,
        call: &ToolCall,
        cancel: &CancellationToken,
    ) -> Result<(String, bool), String> {
        let (server, tool) = self.find(&call.name)?;
        let live = server
            .state
            .as_ref()
            .map_err(|why| format!("MCP server {:?} is not available: {why}", server.name))?;
        let arguments = match call.arguments.trim() {
            "" => serde_json::Map::new(),
            text => match serde_json::from_str(text) {
                Ok(Value::Object(map)) => map,
                Ok(_) => return Err("the arguments must be a JSON object".into()),
                Err(e) => return Err(format!("the arguments are not valid JSON: {e}")),
            },
        };
        let params = CallToolRequestParams::new(tool.to_string()).with_arguments(arguments);
        let timeout = self.limits.call_timeout;
        let answered = tokio::select! {
            answered = tokio::time::timeout(timeout, live.session.call_tool(params)) => answered,
            _ = cancel.cancelled() => return Err("the tool call was cancelled".into()),
        };
        match answered {
            Err(_) => Err(format!(
                "MCP server {:?} did not answer within {} s",
                server.name,
                timeout.as_secs_f64()
            )),
            Ok(Err(error)) => Err(with_stderr(
                format!("MCP server {:?}: {error}", server.name),
                &live.stderr,
            )),
            Ok(Ok(result)) => {
                let result = serde_json::to_value(&result).unwrap_or(Value::Null);
                let is_error = result["isError"].as_bool().unwrap_or(false);
                Ok((render(&result), is_error))
            }
        }
    }

    /// The blocked server a call's alias names, if it names one.
    fn blocked_server(&self, name: &str) -> Option<&Server> {
        let (server, _) = server_of(name)?;
        self.servers.iter().find(|s| s.name == server && s.blocked)
    }

    /// The server and the server's own tool name an alias stands for.
    fn find<'a>(&'a self, name: &'a str) -> Result<(&'a Server, &'a str), String> {
        let unknown = || format!("there is no MCP tool {name:?}");
        let (server, tool) = server_of(name).ok_or_else(unknown)?;
        let server = self
            .servers
            .iter()
            .find(|s| s.name == server)
            .ok_or_else(unknown)?;
        if let Ok(live) = &server.state
            && !live.tools.iter().any(|t| t.name == tool)
        {
            return Err(format!(
                "MCP server {:?} offers this run no tool {tool:?}; its tools are: {}",
                server.name,
                server.aliases().join(", ")
            ));
        }
        Ok((server, tool))
    }

    /// Ends every server's session and processes.
    pub async fn shut_down(self) {
        for server in self.servers {
            server.shut_down().await;
        }
    }
}

/// A tool result as the model reads it: its text, and a line for each block that is not
/// text (an image, a resource); structured content when there is no text at all.
fn render(result: &Value) -> String {
    let blocks = result["content"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default();
    let mut parts: Vec<String> = blocks.iter().map(block).collect();
    if parts.is_empty()
        && let Some(structured) = result.get("structuredContent")
    {
        parts.push(structured.to_string());
    }
    parts.join("\n")
}

fn block(block: &Value) -> String {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    let size = |v: &Value| v.as_str().map_or(0, str::len);
    match block["type"].as_str().unwrap_or_default() {
        "text" => text(&block["text"]),
        kind @ ("image" | "audio") => format!(
            "[{kind}: {}, {} bytes of base64]",
            text(&block["mimeType"]),
            size(&block["data"])
        ),
        "resource" => {
            let resource = &block["resource"];
            match resource.get("text") {
                Some(body) => text(body),
                None => format!(
                    "[resource {}: {} bytes of base64]",
                    text(&resource["uri"]),
                    size(&resource["blob"])
                ),
            }
        }
        "resource_link" => format!(
            "[resource link {}: {}]",
            text(&block["uri"]),
            text(&block["name"])
        ),
        other => format!("[a {other:?} block]"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_result_is_rendered_as_text_with_a_line_per_other_block() {
        let result = json!({"content": [
            {"type": "text", "text": "the time is 12:00"},
            {"type": "image", "mimeType": "image/png", "data": "aGVsbG8="},
            {"type": "resource", "resource": {"uri": "demo://a", "text": "inline"}},
            {"type": "resource", "resource": {"uri": "demo://b", "blob": "AAAA"}},
            {"type": "resource_link", "uri": "demo://c", "name": "c"}
        ]});
        assert_eq!(
            render(&result),
            "the time is 12:00\n[image: image/png, 8 bytes of base64]\ninline\n\
             [resource demo://b: 4 bytes of base64]\n[resource link demo://c: c]"
        );
        let structured = json!({"content": [], "structuredContent": {"t": 21}});
        assert_eq!(render(&structured), r#"{"t":21}"#);
    }

    fn tool_env(network: bool, allow_private_addresses: bool) -> ToolEnv {
        ToolEnv {
            workspace: std::env::temp_dir(),
            sandbox: crate::SandboxPolicy {
                network,
                read_only: false,
                workspace_id: None,
            },
            env: Vec::new(),
            call_timeout: Duration::from_secs(5),
            max_output_bytes: 1024,
            allow_private_addresses,
        }
    }

    #[tokio::test]
    async fn an_http_server_needs_the_network_and_a_public_address() {
        let url = "http://127.0.0.1:9/mcp";
        let offline = http(url, &[], &tool_env(false, true)).await.err().unwrap();
        assert!(offline.contains("no network"), "{offline}");
        let private = http(url, &[], &tool_env(true, false)).await.err().unwrap();
        assert!(
            private.contains("127.0.0.1 is not a public address"),
            "{private}"
        );
        let header = [("bad header".to_string(), "v".to_string())];
        let named = http(url, &header, &tool_env(true, true))
            .await
            .err()
            .unwrap();
        assert!(named.contains("is not a header name"), "{named}");
    }

    #[test]
    fn the_http_client_builds_with_its_tls_and_resolver() {
        assert!(http_client(false).is_ok());
        assert!(http_client(true).is_ok());
    }

    #[test]
    fn aliases_name_a_server_and_its_tool() {
        assert_eq!(
            alias("time", "get_current_time"),
            "mcp__time__get_current_time"
        );
        assert!(is_tool_name(&alias("everything", "get-sum")));
        assert!(!is_tool_name(&alias("x", "a.b")));
        assert!(is_mcp_tool("mcp__x__y") && !is_mcp_tool("read_file"));
    }
}
