//! `keel workspace …`: a workspace's limits and its approval policy, read and set
//! (`api/workspaces.rs`).

use clap::Subcommand;
use keel_client::{
    ApprovalPolicyRecord, ApprovalPolicyRequest, Call, Client, Error, GateDecision, LimitsRequest,
    ObjectEnvelope, WorkspaceLimits,
};

use crate::cli::output;
use crate::cli::output::{Format, Table, or_dash, time};

#[derive(Debug, Subcommand)]
pub(crate) enum WorkspaceCommand {
    /// The limits of your workspace, or of WORKSPACE_ID (an operator's read).
    Show { workspace_id: Option<String> },
    /// Sets a workspace's limits (an operator's write).
    SetLimits {
        workspace_id: String,
        /// Most jobs it runs at once (0 pauses it).
        #[arg(long, required_unless_present = "default")]
        max_concurrent: Option<u32>,
        /// Back to the workers' `KEEL_MAX_CONCURRENT_PER_WORKSPACE`.
        #[arg(long, conflicts_with = "max_concurrent")]
        default: bool,
    },
    /// A workspace's approval policy: its own, or the process setting (an operator's read).
    Policy { workspace_id: String },
    /// Changes a workspace's approval policy (an operator's write): what is not named keeps
    /// its value in the policy in force.
    SetPolicy {
        workspace_id: String,
        /// GATE=DECISION, repeatable: shell_exec, git_exec, file_write, network_egress,
        /// read_file or all_tools = allow, ask or deny.
        #[arg(long = "gate", value_name = "GATE=DECISION")]
        gates: Vec<String>,
        /// SERVER=DECISION for an MCP server's tools, repeatable.
        #[arg(long = "mcp", value_name = "SERVER=DECISION")]
        mcp_servers: Vec<String>,
        /// Where file writers may write (workspace-relative), repeatable; replaces the list.
        #[arg(long = "write-path", value_name = "PATH")]
        write_paths: Vec<String>,
        /// File writers may write anywhere in the workspace again.
        #[arg(long, conflicts_with = "write_paths")]
        write_anywhere: bool,
    },
    /// Removes a workspace's own approval policy: the process setting applies again.
    ResetPolicy { workspace_id: String },
}

pub(super) async fn run(
    client: &Client,
    format: Format,
    command: WorkspaceCommand,
) -> Result<(), Error> {
    let limits = |l: &ObjectEnvelope<WorkspaceLimits>| {
        let l = &l.data;
        Table::fields(&[
            ("workspace", l.workspace_id.clone()),
            ("max concurrent", or_dash(l.max_concurrent)),
            ("updated", or_dash(l.updated_at.as_ref().map(time))),
            ("updated by", or_dash(l.updated_by.as_ref())),
        ])
    };
    let call = match command {
        WorkspaceCommand::Show { workspace_id: None } => client.own_limits(),
        WorkspaceCommand::Show {
            workspace_id: Some(id),
        } => client.get_limits(&id),
        WorkspaceCommand::SetLimits {
            workspace_id,
            max_concurrent,
            default: _,
        } => client.put_limits(&workspace_id, &LimitsRequest { max_concurrent }),
        WorkspaceCommand::Policy { workspace_id } => {
            return show_policy(format, client.get_policy(&workspace_id)).await;
        }
        WorkspaceCommand::SetPolicy {
            workspace_id,
            gates,
            mcp_servers,
            write_paths,
            write_anywhere,
        } => {
            let current = client.get_policy(&workspace_id).send().await?.data;
            let request =
                policy_change(current, &gates, &mcp_servers, write_paths, write_anywhere)?;
            return show_policy(format, client.put_policy(&workspace_id, &request)).await;
        }
        WorkspaceCommand::ResetPolicy { workspace_id } => {
            return show_policy(format, client.delete_policy(&workspace_id)).await;
        }
    };
    output::show(format, call, limits).await.map(drop)
}

async fn show_policy(
    format: Format,
    call: Call<'_, ObjectEnvelope<ApprovalPolicyRecord>>,
) -> Result<(), Error> {
    output::show(format, call, |p| {
        let p = &p.data;
        let g = &p.gates;
        let servers: Vec<String> = p
            .mcp_servers
            .iter()
            .map(|(s, d)| format!("{s}={d}"))
            .collect();
        Table::fields(&[
            ("workspace", p.workspace_id.clone()),
            ("source", p.source.to_string()),
            ("shell_exec", g.shell_exec.to_string()),
            ("git_exec", g.git_exec.to_string()),
            ("file_write", g.file_write.to_string()),
            ("network_egress", g.network_egress.to_string()),
            ("read_file", g.read_file.to_string()),
            ("all_tools", g.all_tools.to_string()),
            (
                "mcp servers",
                or_dash((!servers.is_empty()).then(|| servers.join(", "))),
            ),
            (
                "write paths",
                or_dash(p.allowed_write_paths.as_ref().map(|w| w.join(", "))),
            ),
            ("updated", or_dash(p.updated_at.as_ref().map(time))),
            ("updated by", or_dash(p.updated_by.as_ref())),
        ])
    })
    .await
    .map(drop)
}

/// The policy in force with the command's changes: `--gate` and `--mcp` pairs, and the
/// write paths replaced or lifted.
fn policy_change(
    current: ApprovalPolicyRecord,
    gates: &[String],
    mcp_servers: &[String],
    write_paths: Vec<String>,
    write_anywhere: bool,
) -> Result<ApprovalPolicyRequest, Error> {
    let mut request = ApprovalPolicyRequest {
        gates: current.gates,
        mcp_servers: current.mcp_servers,
        allowed_write_paths: current.allowed_write_paths,
    };
    for pair in gates {
        let (gate, decision) = decision_pair("--gate", pair)?;
        let g = &mut request.gates;
        let slot = match gate {
            "shell_exec" => &mut g.shell_exec,
            "git_exec" => &mut g.git_exec,
            "file_write" => &mut g.file_write,
            "network_egress" => &mut g.network_egress,
            "read_file" => &mut g.read_file,
            "all_tools" => &mut g.all_tools,
            other => {
                return Err(Error::Usage(format!(
                    "--gate {other}: the gates are shell_exec, git_exec, file_write, \
                     network_egress, read_file and all_tools"
                )));
            }
        };
        *slot = decision;
    }
    for pair in mcp_servers {
        let (server, decision) = decision_pair("--mcp", pair)?;
        request.mcp_servers.insert(server.to_string(), decision);
    }
    if write_anywhere {
        request.allowed_write_paths = None;
    } else if !write_paths.is_empty() {
        request.allowed_write_paths = Some(write_paths);
    }
    Ok(request)
}

/// `NAME=DECISION`, read.
fn decision_pair<'a>(option: &str, pair: &'a str) -> Result<(&'a str, GateDecision), Error> {
    let usage = |what: String| Error::Usage(format!("{option} {pair}: {what}"));
    let (name, decision) = pair
        .split_once('=')
        .ok_or_else(|| usage("expected NAME=DECISION".into()))?;
    let decision = GateDecision::parse(decision)
        .ok_or_else(|| usage(format!("the decision is {}", GateDecision::names())))?;
    Ok((name, decision))
}
