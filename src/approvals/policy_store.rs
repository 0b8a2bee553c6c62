//! Workspace approval policies: in force at each admission and at each response's tool
//! calls, so a change applies to the next of each without a restart; set and reset by
//! operators, every change in the audit trail with its actor.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use sqlx::PgConnection;
use sqlx::types::Json;

use keel_api_types::{ApprovalPolicyRecord, EntityType, GateDecision, GateDecisions, PolicySource};

use super::ApprovalPolicy;
use crate::db::Result;
use crate::domain::{Actor, Scope};
use crate::events::transitions::{self, Transition};

/// A stored policy row.
struct Row {
    shell_exec: GateDecision,
    git_exec: GateDecision,
    file_write: GateDecision,
    network_egress: GateDecision,
    read_file: GateDecision,
    all_tools: GateDecision,
    mcp_servers: Json<BTreeMap<String, GateDecision>>,
    allowed_write_paths: Option<Vec<String>>,
    updated_at: chrono::DateTime<chrono::Utc>,
    updated_by: String,
    revision: i64,
}

impl Row {
    fn policy(&self) -> ApprovalPolicy {
        let gates = GateDecisions {
            shell_exec: self.shell_exec,
            git_exec: self.git_exec,
            file_write: self.file_write,
            network_egress: self.network_egress,
            read_file: self.read_file,
            all_tools: self.all_tools,
        };
        let servers = self.mcp_servers.0.clone();
        ApprovalPolicy::of_workspace(gates, servers, self.allowed_write_paths.clone())
    }
}

async fn row(conn: &mut PgConnection, scope: &Scope) -> Result<Option<Row>> {
    Ok(sqlx::query_as!(
        Row,
        r#"SELECT shell_exec AS "shell_exec: GateDecision", git_exec AS "git_exec: GateDecision",
                  file_write AS "file_write: GateDecision",
                  network_egress AS "network_egress: GateDecision",
                  read_file AS "read_file: GateDecision", all_tools AS "all_tools: GateDecision",
                  mcp_servers AS "mcp_servers: Json<BTreeMap<String, GateDecision>>",
                  allowed_write_paths, updated_at, updated_by, revision
           FROM approval_policies WHERE workspace_id = $1"#,
        scope.workspace(),
    )
    .fetch_optional(conn)
    .await?)
}

/// The policy in force in the workspace: its own, or `default` (the process setting).
pub(crate) async fn in_force(
    conn: &mut PgConnection,
    scope: &Scope,
    default: &ApprovalPolicy,
) -> Result<ApprovalPolicy> {
    Ok(row(conn, scope)
        .await?
        .map_or_else(|| default.clone(), |row| row.policy()))
}

/// The policy in force in a workspace, and the revision of the row it comes from (None:
/// the workspace has none, the process setting applies).
#[derive(Debug, Clone)]
pub(crate) struct InForce {
    pub(crate) policy: Arc<ApprovalPolicy>,
    pub(crate) revision: Option<i64>,
}

/// The policies in force that this process read, per workspace. An admission decides by
/// the one kept and checks, in the statement that admits the run, that its revision is
/// still the workspace's (`runs::insert`); when it is not, or when the kept one refuses the
/// run, the policy is read again ([`Policies::read`]). A change made anywhere applies to
/// the next admission all the same, and an admission costs no read of its own.
#[derive(Debug, Default)]
pub struct Policies(Mutex<HashMap<String, InForce>>);

impl Policies {
    /// At most this many workspaces' policies are kept; past it, all are read again.
    const CAPACITY: usize = 10_000;

    /// The policy kept for the workspace, or [`Policies::read`]'s.
    pub(crate) async fn in_force(
        &self,
        conn: &mut PgConnection,
        scope: &Scope,
        default: &ApprovalPolicy,
    ) -> Result<InForce> {
        if let Some(kept) = self.kept().get(scope.workspace()) {
            return Ok(kept.clone());
        }
        self.read(conn, scope, default).await
    }

    /// The policy in force in the workspace, read, and kept in place of the one before.
    pub(crate) async fn read(
        &self,
        conn: &mut PgConnection,
        scope: &Scope,
        default: &ApprovalPolicy,
    ) -> Result<InForce> {
        let row = row(conn, scope).await?;
        let in_force = InForce {
            policy: Arc::new(row.as_ref().map_or_else(|| default.clone(), Row::policy)),
            revision: row.map(|row| row.revision),
        };
        let mut kept = self.kept();
        if kept.len() >= Self::CAPACITY {
            kept.clear();
        }
        kept.insert(scope.workspace().to_string(), in_force.clone());
        Ok(in_force)
    }

    fn kept(&self) -> std::sync::MutexGuard<'_, HashMap<String, InForce>> {
        // A panic while the map was held leaves nothing half-written in it.
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The policy in force, as the API shows it.
pub(crate) async fn show(
    conn: &mut PgConnection,
    scope: &Scope,
    default: &ApprovalPolicy,
) -> Result<ApprovalPolicyRecord> {
    let row = row(conn, scope).await?;
    Ok(record(scope, default, row.as_ref()))
}

fn record(scope: &Scope, default: &ApprovalPolicy, row: Option<&Row>) -> ApprovalPolicyRecord {
    let policy = row.map_or_else(|| default.clone(), Row::policy);
    ApprovalPolicyRecord {
        workspace_id: scope.workspace().to_string(),
        source: match row {
            Some(_) => PolicySource::Workspace,
            None => PolicySource::Default,
        },
        gates: policy.gates(),
        mcp_servers: policy.mcp_servers().clone(),
        allowed_write_paths: policy.write_paths().map(<[String]>::to_vec),
        updated_at: row.map(|r| r.updated_at),
        updated_by: row.map(|r| r.updated_by.clone()),
    }
}

/// Sets the workspace's policy (None: back to the process setting), in the caller's
/// transaction, with the change in the audit trail: from what was in force to what is.
pub(crate) async fn set(
    conn: &mut PgConnection,
    scope: &Scope,
    policy: Option<&ApprovalPolicy>,
    default: &ApprovalPolicy,
    actor: &Actor,
) -> Result<ApprovalPolicyRecord> {
    // Changes of one workspace's policy queue up (a row lock cannot hold a row that does
    // not exist yet), so each audit record's "from" is what the change replaced.
    sqlx::query!(
        "SELECT pg_advisory_xact_lock(hashtextextended('approval_policy:' || $1, 0))",
        scope.workspace()
    )
    .execute(&mut *conn)
    .await?;
    let before = row(conn, scope).await?;
    let was = before.as_ref().map_or_else(|| default.clone(), Row::policy);
    let after = match policy {
        Some(policy) => Some(upsert(conn, scope, policy, actor).await?),
        None => {
            sqlx::query!(
                "DELETE FROM approval_policies WHERE workspace_id = $1",
                scope.workspace()
            )
            .execute(&mut *conn)
            .await?;
            None
        }
    };
    let now = after.as_ref().map_or_else(|| default.clone(), Row::policy);
    let (from, to) = (was.to_string(), now.to_string());
    let reason = match after {
        Some(_) => "set by an operator",
        None => "reset to the process setting (KEEL_APPROVAL_POLICIES)",
    };
    let change = Transition {
        entity_type: EntityType::ApprovalPolicy.as_str(),
        entity_id: scope.workspace(),
        task_id: None,
        from: Some(&from),
        to: &to,
        reason: Some(reason),
    };
    transitions::record(conn, scope, change, actor).await?;
    Ok(record(scope, default, after.as_ref()))
}

async fn upsert(
    conn: &mut PgConnection,
    scope: &Scope,
    policy: &ApprovalPolicy,
    actor: &Actor,
) -> Result<Row> {
    let g = policy.gates();
    Ok(sqlx::query_as!(
        Row,
        r#"INSERT INTO approval_policies (workspace_id, shell_exec, git_exec, file_write,
               network_egress, read_file, all_tools, mcp_servers, allowed_write_paths, updated_by)
           VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
           ON CONFLICT (workspace_id) DO UPDATE
           SET shell_exec = EXCLUDED.shell_exec, git_exec = EXCLUDED.git_exec,
               file_write = EXCLUDED.file_write, network_egress = EXCLUDED.network_egress,
               read_file = EXCLUDED.read_file, all_tools = EXCLUDED.all_tools,
               mcp_servers = EXCLUDED.mcp_servers,
               allowed_write_paths = EXCLUDED.allowed_write_paths,
               updated_by = EXCLUDED.updated_by, updated_at = now(),
               revision = nextval('approval_policy_revisions')
           RETURNING shell_exec AS "shell_exec: GateDecision", git_exec AS "git_exec: GateDecision",
                     file_write AS "file_write: GateDecision",
                     network_egress AS "network_egress: GateDecision",
                     read_file AS "read_file: GateDecision", all_tools AS "all_tools: GateDecision",
                     mcp_servers AS "mcp_servers: Json<BTreeMap<String, GateDecision>>",
                     allowed_write_paths, updated_at, updated_by, revision"#,
        scope.workspace(),
        g.shell_exec.as_str(),
        g.git_exec.as_str(),
        g.file_write.as_str(),
        g.network_egress.as_str(),
        g.read_file.as_str(),
        g.all_tools.as_str(),
        Json(policy.mcp_servers()) as _,
        policy.write_paths().map(<[String]>::to_vec) as Option<Vec<String>>,
        actor.to_string(),
    )
    .fetch_one(conn)
    .await?)
}
