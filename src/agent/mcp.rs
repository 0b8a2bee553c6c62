//! A run's MCP servers as its worker reaches them: the task's servers with their secrets
//! and hosts checked against what the task's writer may name and reach, and the secrets
//! resolved ([`plan`]), then started or reached inside the attempt, all at once under one
//! deadline, each recorded as an `mcp_server` step with the tools it offers or why it
//! offers none ([`connect`]). Whether a stdio server may start at all was decided at the
//! run's admission: its approval gates (`approvals::ApprovalPolicy::gates_for_mcp_servers`).

use keel_api_types::{MAX_MCP_TOOLS_PER_SERVER, McpApprovalPolicy, McpServer, McpTransport};
use keel_workers::agent::mcp::{Limits, McpTools, Server, ServerConfig, Transport};
use keel_workers::agent::tools::{DEFAULT_MAX_OUTPUT_BYTES, ToolEnv};
use keel_workers::{ContextError, RunContext, StepResult};
use serde_json::json;
use std::time::Duration;

use crate::domain::Role;
use crate::providers::ProviderHosts;
use crate::providers::secrets::SecretPolicy;
use crate::tasks::{check_mcp_server_host, resolve_secret};

/// A server as the attempt will treat it: to be reached, or not, with why.
pub(crate) enum Planned {
    Reach(ServerConfig),
    /// Its policy blocks it: no step, and calls of its tools are refused.
    Blocked(String),
    /// A secret it needs does not resolve: a failed step, and calls answer why.
    Unresolved {
        name: String,
        why: String,
    },
}

/// The task's servers, with every secret checked against what the task's writer may name
/// in `workspace` and every http server's host against what it may reach (the grants and
/// the host list may have narrowed since it was written), and the secrets resolved.
pub(crate) fn plan(
    servers: &[McpServer],
    written_by: Role,
    workspace: &str,
    (policy, hosts): (&SecretPolicy, &ProviderHosts),
) -> Vec<Planned> {
    servers
        .iter()
        .map(|server| {
            let policy_of = server
                .approval_policy
                .as_deref()
                .and_then(McpApprovalPolicy::parse);
            if policy_of == Some(McpApprovalPolicy::Block) {
                return Planned::Blocked(server.name.clone());
            }
            match resolve(server, written_by, workspace, (policy, hosts)) {
                Ok(transport) => Planned::Reach(ServerConfig {
                    name: server.name.clone(),
                    transport,
                    allowed_tools: server.tools.clone(),
                    gated: policy_of == Some(McpApprovalPolicy::RequireApproval),
                }),
                Err(why) => Planned::Unresolved {
                    name: server.name.clone(),
                    why,
                },
            }
        })
        .collect()
}

fn resolve(
    server: &McpServer,
    written_by: Role,
    workspace: &str,
    (policy, hosts): (&SecretPolicy, &ProviderHosts),
) -> Result<Transport, String> {
    let resolved = |field: &str, named: &std::collections::BTreeMap<String, String>| {
        named
            .iter()
            .map(|(key, reference)| {
                let value = resolve_secret(reference, policy, written_by, workspace)
                    .map_err(|why| format!("{field}.{key}: {why}"))?;
                Ok((key.clone(), value.expose().to_string()))
            })
            .collect::<Result<Vec<_>, String>>()
    };
    match server.transport.as_deref().and_then(McpTransport::parse) {
        Some(McpTransport::Stdio) => Ok(Transport::Stdio {
            command: server.command.clone().unwrap_or_default(),
            args: server.args.clone(),
            env: resolved("env", &server.env)?,
        }),
        _ => {
            let url = server.url.clone().unwrap_or_default();
            if !written_by.is_runtime_operator() {
                check_mcp_server_host(&url, hosts)?;
            }
            Ok(Transport::Http {
                url,
                headers: resolved("headers", &server.headers)?,
            })
        }
    }
}

/// Starts or reaches the planned servers, all at once under one deadline, recording an
/// `mcp_server` step for each: the tools it offers, or why it offers none. Every step is
/// started before any server, so each spans its server's whole start. Only a lost lease
/// or a cancelled run stops it.
pub(crate) async fn connect(
    ctx: &impl RunContext,
    planned: Vec<Planned>,
    env: &ToolEnv,
    limits: Limits,
) -> Result<McpTools, ContextError> {
    // In the task's order: a server's place, filled once it is reached.
    let mut servers = Vec::with_capacity(planned.len());
    let (mut steps, mut configs) = (Vec::new(), Vec::new());
    for server in planned {
        match server {
            Planned::Blocked(name) => servers.push(Some(Server::blocked(name))),
            Planned::Unresolved { name, why } => {
                let step = ctx
                    .start_step("mcp_server", json!({ "server": name }))
                    .await?;
                ctx.finish_step(&step, StepResult::Failed { error: why.clone() })
                    .await?;
                servers.push(Some(Server::unavailable(name, why)));
            }
            Planned::Reach(config) => {
                let step = ctx.start_step("mcp_server", described(&config)).await?;
                steps.push((servers.len(), step));
                configs.push(config);
                servers.push(None);
            }
        }
    }
    if !configs.is_empty() {
        ctx.clear_ahead().await?;
    }
    let reached = Server::connect_all(&configs, env, &limits).await;
    for ((place, step), server) in steps.into_iter().zip(reached) {
        let result = match server.error() {
            Some(error) => StepResult::Failed {
                error: error.to_string(),
            },
            None => StepResult::Completed {
                output: json!({ "tools": server.aliases() }),
            },
        };
        ctx.finish_step(&step, result).await?;
        servers[place] = Some(server);
    }
    let servers = servers.into_iter().flatten().collect();
    Ok(McpTools::new(servers, limits, DEFAULT_MAX_OUTPUT_BYTES))
}

/// A step's input: the server as the task names it, the names of its variables but never
/// their values.
fn described(config: &ServerConfig) -> serde_json::Value {
    match &config.transport {
        Transport::Stdio { command, args, env } => json!({
            "server": config.name, "transport": "stdio", "command": command, "args": args,
            "env": env.iter().map(|(key, _)| key).collect::<Vec<_>>(),
        }),
        Transport::Http { url, headers } => json!({
            "server": config.name, "transport": "http", "url": url,
            "headers": headers.iter().map(|(key, _)| key).collect::<Vec<_>>(),
        }),
    }
}

/// What the worker allows each server: [`MAX_MCP_TOOLS_PER_SERVER`] tools, and calls of
/// `call_timeout` at most; and all of them together `connect_timeout` to start.
pub(crate) fn limits(call_timeout: Duration, connect_timeout: Duration) -> Limits {
    Limits {
        max_tools: MAX_MCP_TOOLS_PER_SERVER,
        call_timeout,
        connect_timeout,
    }
}
