-- An agent loop task's MCP servers (a JSON array, secret references as written), and who
-- wrote the task: a member's task may name only the secrets granted to its workspace, and
-- a worker checks the grants again before each attempt resolves them (as for presets,
-- migration 0019). Tasks written before this migration count as a member's.
ALTER TABLE tasks ADD COLUMN mcp_servers JSONB;
ALTER TABLE tasks ADD CONSTRAINT tasks_mcp_servers_agent_loop
    CHECK (mcp_servers IS NULL
           OR (execution_kind = 'agent_loop' AND jsonb_typeof(mcp_servers) = 'array'));
ALTER TABLE tasks ADD COLUMN written_by_role TEXT NOT NULL DEFAULT 'member'
    CHECK (written_by_role IN ('member', 'operator'));
