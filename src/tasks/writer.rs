//! Who wrote a task, which decides the secrets it may name (its MCP servers' environment
//! and headers, its repository's credential) and the hosts its MCP servers may be reached
//! at: the runtime operator any reference the secret policy allows and any host, a tenant
//! (a member or the org's operator) only the secrets granted to its workspace
//! (`KEEL_SECRET_GRANTS`) and the hosts in `KEEL_PROVIDER_HOSTS`. Checked when the task is
//! created, and again by the worker before each attempt resolves them: the grants and the
//! host list may have narrowed in between. It decides the programs the task may start as
//! stdio MCP servers too: an operator (the org's or the runtime operator) any, a member
//! those `KEEL_MCP_STDIO_COMMANDS` lists; checked when the task is created and again at
//! each run's admission.

use keel_workers::media::Secret;

use crate::domain::{Invalid, Role};
use crate::providers::ProviderHosts;
use crate::providers::secrets::{SecretPolicy, SecretRef};

/// The value of a reference a task written by `writer` in `workspace` names, checked
/// against what that writer may name now, before anything is read. Never logged.
pub(crate) fn resolve_secret(
    reference: &str,
    policy: &SecretPolicy,
    writer: Role,
    workspace: &str,
) -> Result<Secret, String> {
    let secret = SecretRef::parse(reference)?;
    policy.check_for(writer, workspace, &secret)?;
    secret
        .resolve(policy)
        .map_err(|unresolved| unresolved.to_string())
}

impl super::NewTask {
    /// Records who writes the task, refusing a secret that writer may not name and an MCP
    /// server at a host it may not reach.
    pub(crate) fn written_as(
        &mut self,
        writer: Role,
        (secrets, hosts): (&SecretPolicy, &ProviderHosts),
        workspace: &str,
    ) -> Result<(), Invalid> {
        if let super::TaskExecution::AgentLoop(agent) = &self.execution
            && let Some(servers) = &agent.mcp_servers
        {
            super::mcp::check_secrets(servers, secrets, writer, workspace)
                .and_then(|()| super::mcp::check_hosts(servers, hosts, writer))
                .map_err(|why| Invalid::new("mcp_servers", why))?;
        }
        if let Some(credential) = self.repo.as_ref().and_then(|r| r.credential.as_ref()) {
            secrets
                .check_for(writer, workspace, credential)
                .map_err(|why| Invalid::new("repo_credential", why))?;
        }
        self.written_by = writer;
        Ok(())
    }

    /// Refuses (with the reason) a stdio MCP server whose program the task's writer
    /// ([`Self::written_as`]) may not name.
    pub(crate) fn check_commands(&self, commands: &super::StdioCommands) -> Result<(), String> {
        let super::TaskExecution::AgentLoop(agent) = &self.execution else {
            return Ok(());
        };
        let servers = agent.mcp_servers.as_deref().unwrap_or_default();
        commands.check(servers, self.written_by)
    }
}
