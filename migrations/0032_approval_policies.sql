-- A workspace's approval policy, set by an operator: each gate's decision, per MCP server
-- too, and where file writers may write. A workspace without a row follows the process
-- setting (KEEL_APPROVAL_POLICIES). Admissions and agent tool calls read it each time, so a
-- change applies to the next of each without a restart.
CREATE TABLE approval_policies (
    workspace_id        TEXT PRIMARY KEY,
    shell_exec          TEXT NOT NULL CHECK (shell_exec IN ('allow', 'ask', 'deny')),
    git_exec            TEXT NOT NULL CHECK (git_exec IN ('allow', 'ask', 'deny')),
    file_write          TEXT NOT NULL CHECK (file_write IN ('allow', 'ask', 'deny')),
    network_egress      TEXT NOT NULL CHECK (network_egress IN ('allow', 'ask', 'deny')),
    read_file           TEXT NOT NULL CHECK (read_file IN ('allow', 'ask', 'deny')),
    all_tools           TEXT NOT NULL CHECK (all_tools IN ('allow', 'ask', 'deny')),
    -- server name -> decision
    mcp_servers         JSONB NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(mcp_servers) = 'object'),
    allowed_write_paths TEXT[] CHECK (cardinality(allowed_write_paths) <= 32),
    updated_at          TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_by          TEXT NOT NULL
);

-- Every change of a policy is in the audit trail, with its actor.
ALTER TABLE state_transitions
    DROP CONSTRAINT state_transitions_entity_type_check,
    ADD CONSTRAINT state_transitions_entity_type_check
        CHECK (entity_type IN ('task', 'run', 'approval', 'media_job', 'schedule',
                               'approval_policy'));
