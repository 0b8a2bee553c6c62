//! A task's `mcp_servers`: checked once at creation (names, one transport each, a secret
//! reference for every environment value and header, the limits) and stored as written,
//! with the transport and approval policy filled in. Who may name which secret, and reach
//! which host, is checked at creation against the writer's role ([`check_secrets`],
//! [`check_hosts`]), and again by the worker before each attempt resolves them: the grants
//! and the host list may have narrowed in between. Who may name which program as a stdio
//! server ([`StdioCommands`]) is checked at creation and again at each run's admission, for
//! the same reason.

use keel_api_types::{
    MAX_MCP_ARG_BYTES as MAX_ARG_BYTES, MAX_MCP_ARGS as MAX_ARGS,
    MAX_MCP_NAMED_SECRETS as MAX_NAMED_SECRETS, MAX_MCP_SERVER_NAME, MAX_MCP_SERVERS,
    MAX_MCP_TOOLS_PER_SERVER, MAX_TOOL_NAME, McpApprovalPolicy, McpServer, McpTransport,
};

use keel_workers::agent::mcp::{alias, is_tool_name};

use crate::domain::{Invalid, Role};
use crate::providers::ProviderHosts;
use crate::providers::secrets::{SecretPolicy, SecretRef, is_env_name};

/// The servers checked and normalized: `transport` and `approval_policy` always set.
pub(crate) fn parse_mcp_servers(servers: &[McpServer]) -> Result<Vec<McpServer>, Invalid> {
    if servers.len() > MAX_MCP_SERVERS {
        return Err(invalid(format!(
            "names {} servers; a task may name at most {MAX_MCP_SERVERS}",
            servers.len()
        )));
    }
    let mut parsed: Vec<McpServer> = Vec::with_capacity(servers.len());
    for (i, server) in servers.iter().enumerate() {
        let server = parse_server(server)
            .map_err(|why| invalid(format!("server {i} ({:?}): {why}", server.name)))?;
        if parsed.iter().any(|p| p.name == server.name) {
            return Err(invalid(format!("names server {:?} twice", server.name)));
        }
        parsed.push(server);
    }
    Ok(parsed)
}

fn invalid(message: String) -> Invalid {
    Invalid::new("mcp_servers", message)
}

fn parse_server(server: &McpServer) -> Result<McpServer, String> {
    check_name(&server.name)?;
    let transport = match (&server.command, &server.url) {
        (Some(_), None) => McpTransport::Stdio,
        (None, Some(_)) => McpTransport::Http,
        _ => return Err("needs exactly one of command (stdio) or url (http)".into()),
    };
    if let Some(named) = server.transport.as_deref()
        && McpTransport::parse(named) != Some(transport)
    {
        return Err(format!(
            "transport {named:?} does not match its {} (expected {transport})",
            if transport == McpTransport::Stdio {
                "command"
            } else {
                "url"
            }
        ));
    }
    match transport {
        McpTransport::Stdio => check_stdio(server)?,
        McpTransport::Http => check_http(server)?,
    }
    let policy = match server.approval_policy.as_deref() {
        None => McpApprovalPolicy::Auto,
        Some(named) => McpApprovalPolicy::parse(named).ok_or_else(|| {
            format!(
                "unknown approval_policy {named:?} (expected {})",
                McpApprovalPolicy::names()
            )
        })?,
    };
    if let Some(tools) = &server.tools {
        check_allowlist(&server.name, tools)?;
    }
    Ok(McpServer {
        transport: Some(transport.as_str().into()),
        approval_policy: Some(policy.as_str().into()),
        ..server.clone()
    })
}

/// Lower-case words joined by one `_` or `-`: the alias `mcp__<server>__<tool>` then
/// splits at its `__` in one way only.
pub(crate) fn check_name(name: &str) -> Result<(), String> {
    if name.len() > MAX_MCP_SERVER_NAME || !crate::domain::is_word_name(name, &['_', '-']) {
        return Err(format!(
            "name must be 1 to {MAX_MCP_SERVER_NAME} lower-case letters and digits, in words \
             joined by one '_' or '-'"
        ));
    }
    Ok(())
}

fn check_stdio(server: &McpServer) -> Result<(), String> {
    let command = server.command.as_deref().unwrap_or_default();
    if command.trim().is_empty() || command.contains('\0') || command.len() > MAX_ARG_BYTES {
        return Err("command must be a program name or path, without NUL".into());
    }
    if server.args.len() > MAX_ARGS
        || server
            .args
            .iter()
            .any(|a| a.contains('\0') || a.len() > MAX_ARG_BYTES)
    {
        return Err(format!(
            "args: at most {MAX_ARGS}, each at most {MAX_ARG_BYTES} bytes, without NUL"
        ));
    }
    if !server.headers.is_empty() {
        return Err("headers are for an http server; a stdio server takes env".into());
    }
    check_named_secrets("env", &server.env, is_env_name)
}

fn check_http(server: &McpServer) -> Result<(), String> {
    if !server.args.is_empty() || !server.env.is_empty() {
        return Err("args and env are for a stdio server; an http server takes headers".into());
    }
    let text = server.url.as_deref().unwrap_or_default();
    let url = reqwest::Url::parse(text).map_err(|e| format!("url is not a URL: {e}"))?;
    if !matches!(url.scheme(), "https" | "http") || url.host().is_none() {
        return Err("url must be an https:// or http:// URL with a host".into());
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(
            "url must not carry credentials: they would be stored with the task and shown in \
             its responses; name a secret in headers"
                .into(),
        );
    }
    let header_name = |name: &str| reqwest::header::HeaderName::from_bytes(name.as_bytes()).is_ok();
    check_named_secrets("headers", &server.headers, header_name)
}

/// Each key a valid name, each value a secret reference.
fn check_named_secrets(
    field: &str,
    named: &std::collections::BTreeMap<String, String>,
    valid_name: impl Fn(&str) -> bool,
) -> Result<(), String> {
    if named.len() > MAX_NAMED_SECRETS {
        return Err(format!("{field}: at most {MAX_NAMED_SECRETS} entries"));
    }
    for (name, value) in named {
        if !valid_name(name) {
            return Err(format!("{field}: {name:?} is not a valid name"));
        }
        SecretRef::parse(value).map_err(|why| format!("{field}.{name} {why}"))?;
    }
    Ok(())
}

fn check_allowlist(server: &str, tools: &[String]) -> Result<(), String> {
    if tools.is_empty() || tools.len() > MAX_MCP_TOOLS_PER_SERVER {
        return Err(format!(
            "tools must list 1 to {MAX_MCP_TOOLS_PER_SERVER} tools (absent: all the server offers)"
        ));
    }
    for (i, tool) in tools.iter().enumerate() {
        if !is_tool_name(&alias(server, tool)) {
            return Err(format!(
                "tools: {tool:?} makes no tool name the model APIs take (letters, digits, '_' \
                 and '-', and mcp__{server}__<tool> at most {MAX_TOOL_NAME} characters)"
            ));
        }
        if tools[..i].contains(tool) {
            return Err(format!("tools lists {tool:?} twice"));
        }
    }
    Ok(())
}

/// Whether the worker starts this server as a program of the run: a stdio server its
/// `approval_policy` does not block.
pub(crate) fn starts_a_process(server: &McpServer) -> bool {
    let policy = server.approval_policy.as_deref();
    is_stdio(server) && policy != Some(McpApprovalPolicy::Block.as_str())
}

/// Whether the server is a program (`transport` is filled in when a task is written).
fn is_stdio(server: &McpServer) -> bool {
    server.transport.as_deref().and_then(McpTransport::parse) == Some(McpTransport::Stdio)
}

/// The programs a member's task may name as stdio MCP servers (`KEEL_MCP_STDIO_COMMANDS`),
/// each exactly as a server's `command` names it. A stdio server is a process the worker
/// starts for the task, with the arguments its writer chose: in remote mode it is an
/// operator's to name, unless the deployment lists its program for members too.
#[derive(Debug, Clone, Default)]
pub struct StdioCommands(Vec<String>);

impl StdioCommands {
    pub fn new(commands: &[String]) -> StdioCommands {
        let listed = commands.iter().map(|c| c.trim()).filter(|c| !c.is_empty());
        StdioCommands(listed.map(str::to_string).collect())
    }

    /// Refuses (with the reason) a stdio server whose program a task written by `writer`
    /// may not name: an operator's task (the org's or the runtime operator's) names any.
    pub(crate) fn check(&self, servers: &[McpServer], writer: Role) -> Result<(), String> {
        if writer >= Role::Operator {
            return Ok(());
        }
        let unlisted = servers.iter().filter(|s| is_stdio(s)).find(|server| {
            let command = server.command.as_deref().unwrap_or_default();
            !self.0.iter().any(|listed| listed == command)
        });
        match unlisted {
            None => Ok(()),
            Some(server) => Err(format!(
                "only an operator may name {:?} as the command of a stdio MCP server (server \
                 {:?}): the deployment's KEEL_MCP_STDIO_COMMANDS does not list it for members",
                server.command.as_deref().unwrap_or_default(),
                server.name
            )),
        }
    }
}

/// Every secret the servers name, with where: `env.NAME` or `headers.Name` of a server.
fn secret_refs(servers: &[McpServer]) -> Vec<(String, SecretRef)> {
    servers
        .iter()
        .flat_map(|server| {
            let env = server.env.iter().map(move |(k, v)| (server, "env", k, v));
            let headers = server
                .headers
                .iter()
                .map(move |(k, v)| (server, "headers", k, v));
            env.chain(headers)
        })
        .filter_map(|(server, field, key, value)| {
            let secret = SecretRef::parse(value).ok()?;
            Some((format!("{}: {field}.{key}", server.name), secret))
        })
        .collect()
}

/// Whether a task written by `writer` in `workspace` may name these servers' secrets: the
/// runtime operator any the policy allows, a tenant only those granted to its workspace.
pub(crate) fn check_secrets(
    servers: &[McpServer],
    policy: &SecretPolicy,
    writer: Role,
    workspace: &str,
) -> Result<(), String> {
    for (place, secret) in secret_refs(servers) {
        policy
            .check_for(writer, workspace, &secret)
            .map_err(|why| format!("server {place}: {why}"))?;
    }
    Ok(())
}

/// Whether a task written by `writer` may have its worker reach these http servers: the
/// runtime operator at any host, a tenant only at one `KEEL_PROVIDER_HOSTS` lists (the
/// worker, not the run's sandbox, connects, with the headers' secrets).
pub(crate) fn check_hosts(
    servers: &[McpServer],
    hosts: &ProviderHosts,
    writer: Role,
) -> Result<(), String> {
    if writer.is_runtime_operator() {
        return Ok(());
    }
    for server in servers {
        if let Some(url) = &server.url {
            check_host(url, hosts).map_err(|why| format!("server {}: {why}", server.name))?;
        }
    }
    Ok(())
}

/// Whether a tenant's http server at `url` may be reached: its host listed.
pub(crate) fn check_host(url: &str, hosts: &ProviderHosts) -> Result<(), String> {
    hosts.check_listed("an MCP server", url)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stdio(name: &str) -> McpServer {
        McpServer {
            name: name.into(),
            transport: None,
            command: Some("mcp-server-time".into()),
            args: Vec::new(),
            env: Default::default(),
            url: None,
            headers: Default::default(),
            approval_policy: None,
            tools: None,
        }
    }

    fn refused(servers: &[McpServer]) -> String {
        parse_mcp_servers(servers).unwrap_err().message
    }

    #[test]
    fn a_server_is_normalized_with_its_transport_and_policy() {
        let parsed = parse_mcp_servers(&[stdio("time")]).unwrap();
        assert_eq!(parsed[0].transport.as_deref(), Some("stdio"));
        assert_eq!(parsed[0].approval_policy.as_deref(), Some("auto"));
        let http = McpServer {
            command: None,
            url: Some("https://mcp.example.com/mcp".into()),
            headers: [("Authorization".to_string(), "env:MCP_TOKEN".to_string())].into(),
            ..stdio("remote")
        };
        assert_eq!(
            parse_mcp_servers(&[http]).unwrap()[0].transport.as_deref(),
            Some("http")
        );
    }

    #[test]
    fn names_transports_secrets_and_limits_are_checked() {
        for bad in ["", "Time", "a__b", "_a", "a-", "twenty-one-characters"] {
            assert!(refused(&[stdio(bad)]).contains("name must be"), "{bad}");
        }
        assert!(refused(&[stdio("a"), stdio("a")]).contains("twice"));
        let nine: Vec<_> = (0..9).map(|i| stdio(&format!("s{i}"))).collect();
        assert!(refused(&nine).contains("at most 8"));
        let both = McpServer {
            url: Some("https://x.example".into()),
            ..stdio("x")
        };
        assert!(refused(&[both]).contains("exactly one"));
        let mismatch = McpServer {
            transport: Some("http".into()),
            ..stdio("x")
        };
        assert!(refused(&[mismatch]).contains("does not match"));
        let raw = McpServer {
            env: [("KEY".to_string(), "sk-raw".to_string())].into(),
            ..stdio("x")
        };
        assert!(refused(&[raw]).contains("secret reference"));
        let bad_env = McpServer {
            env: [("1X".to_string(), "env:A_TOKEN".to_string())].into(),
            ..stdio("x")
        };
        assert!(refused(&[bad_env]).contains("not a valid name"));
        let creds = McpServer {
            command: None,
            url: Some("https://user:pw@mcp.example.com/".into()),
            ..stdio("x")
        };
        assert!(refused(&[creds]).contains("credentials"));
        let policy = McpServer {
            approval_policy: Some("sometimes".into()),
            ..stdio("x")
        };
        assert!(refused(&[policy]).contains("approval_policy"));
        let tools = McpServer {
            tools: Some(vec!["a.b".into()]),
            ..stdio("x")
        };
        assert!(refused(&[tools]).contains("no tool name"));
        let long = McpServer {
            tools: Some(vec!["t".repeat(60)]),
            ..stdio("x")
        };
        assert!(refused(&[long]).contains("at most 64"));
    }

    #[test]
    fn a_member_names_only_listed_programs_as_stdio_servers() {
        let listed = StdioCommands::new(&[" mcp-server-time".into(), String::new()]);
        let servers = |command: &str| {
            parse_mcp_servers(&[McpServer {
                command: Some(command.into()),
                ..stdio("x")
            }])
            .unwrap()
        };
        assert!(
            listed
                .check(&servers("mcp-server-time"), Role::Member)
                .is_ok()
        );
        let refused = listed.check(&servers("/bin/sh"), Role::Member).unwrap_err();
        assert!(
            refused.contains("\"/bin/sh\"") && refused.contains("KEEL_MCP_STDIO_COMMANDS"),
            "{refused}"
        );
        for operator in [Role::Operator, Role::RuntimeOperator] {
            assert!(listed.check(&servers("/bin/sh"), operator).is_ok());
        }
        let nothing = StdioCommands::default();
        assert!(
            nothing
                .check(&servers("mcp-server-time"), Role::Member)
                .is_err()
        );
        // An http server is no program.
        let http = McpServer {
            command: None,
            url: Some("https://mcp.example.com/mcp".into()),
            ..stdio("remote")
        };
        let http = parse_mcp_servers(&[http]).unwrap();
        assert!(nothing.check(&http, Role::Member).is_ok());
        assert!(!starts_a_process(&http[0]));
        assert!(starts_a_process(&servers("x")[0]));
        let blocked = McpServer {
            approval_policy: Some("block".into()),
            ..stdio("x")
        };
        assert!(!starts_a_process(
            &parse_mcp_servers(&[blocked]).unwrap()[0]
        ));
    }

    #[test]
    fn a_tenant_reaches_only_listed_hosts() {
        let at = |url: &str| McpServer {
            command: None,
            url: Some(url.into()),
            ..stdio("remote")
        };
        let listed = ProviderHosts::new(["mcp.example.com".to_string()]);
        let none = ProviderHosts::default();
        let public = [at("https://mcp.example.com/mcp")];
        for tenant in [Role::Member, Role::Operator] {
            assert!(check_hosts(&public, &listed, tenant).is_ok());
            let refused = check_hosts(&public, &none, tenant).unwrap_err();
            assert!(refused.contains("KEEL_PROVIDER_HOSTS"), "{refused}");
            let plain = [at("http://mcp.example.com/mcp")];
            assert!(check_hosts(&plain, &listed, tenant).is_err(), "https only");
        }
        assert!(check_hosts(&public, &none, Role::RuntimeOperator).is_ok());
        // A stdio server is reached by no one but the sandbox that runs it.
        assert!(check_hosts(&[stdio("time")], &none, Role::Member).is_ok());
    }

    #[test]
    fn a_tenant_names_only_granted_secrets() {
        let policy = SecretPolicy::new(vec!["*_TOKEN".into()], Vec::new())
            .with_grants(&["org_a=env:ORG_A_*".into()])
            .unwrap();
        let with = |secret: &str| McpServer {
            env: [("TOKEN".to_string(), secret.to_string())].into(),
            ..stdio("x")
        };
        let granted = [with("env:ORG_A_TOKEN")];
        assert!(check_secrets(&granted, &policy, Role::Member, "org_a").is_ok());
        assert!(check_secrets(&granted, &policy, Role::Member, "org_b").is_err());
        let operators = [with("env:GITHUB_TOKEN")];
        assert!(check_secrets(&operators, &policy, Role::Member, "org_a").is_err());
        assert!(check_secrets(&operators, &policy, Role::Operator, "org_a").is_err());
        assert!(check_secrets(&operators, &policy, Role::RuntimeOperator, "org_a").is_ok());
        let reserved = [with("env:DATABASE_URL")];
        let refused =
            check_secrets(&reserved, &policy, Role::RuntimeOperator, "org_a").unwrap_err();
        assert!(refused.contains("x: env.TOKEN"), "{refused}");
    }
}
