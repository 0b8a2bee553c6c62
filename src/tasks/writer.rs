//! Who wrote a task, which decides the secrets it may name (its MCP servers' environment
//! and headers, its repository's credential): an operator any reference the secret policy
//! allows, a member only those granted to its workspace (`KEEL_SECRET_GRANTS`). Checked
//! when the task is created, and again by the worker before each attempt resolves them:
//! the grants may have narrowed in between. It decides the programs the task may start as
//! stdio MCP servers too: an operator any, a member those `KEEL_MCP_STDIO_COMMANDS` lists;
//! checked when the task is created and again at each run's admission.

use keel_workers::media::Secret;

use crate::domain::{Invalid, Role};
use crate::providers::secrets::{SecretPolicy, SecretRef};

/// Whether a task written by `writer` in `workspace` may name `secret`.
pub(crate) fn check_secret(
    secret: &SecretRef,
    policy: &SecretPolicy,
    writer: Role,
    workspace: &str,
) -> Result<(), String> {
    match writer {
        Role::Operator => policy.check(secret),
        Role::Member => policy.check_granted(workspace, secret),
    }
}

/// The value of a reference a task written by `writer` in `workspace` names, checked
/// against what that writer may name now, before anything is read. Never logged.
pub(crate) fn resolve_secret(
    reference: &str,
    policy: &SecretPolicy,
    writer: Role,
    workspace: &str,
) -> Result<Secret, String> {
    let secret = SecretRef::parse(reference)?;
    check_secret(&secret, policy, writer, workspace)?;
    secret
        .resolve(policy)
        .map_err(|unresolved| unresolved.to_string())
}

impl super::NewTask {
    /// Records who writes the task, refusing a secret that writer may not name.
    pub(crate) fn written_as(
        &mut self,
        writer: Role,
        policy: &SecretPolicy,
        workspace: &str,
    ) -> Result<(), Invalid> {
        if let super::TaskExecution::AgentLoop(agent) = &self.execution
            && let Some(servers) = &agent.mcp_servers
        {
            super::mcp::check_secrets(servers, policy, writer, workspace)
                .map_err(|why| Invalid::new("mcp_servers", why))?;
        }
        if let Some(credential) = self.repo.as_ref().and_then(|r| r.credential.as_ref()) {
            check_secret(credential, policy, writer, workspace)
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
