-- The profile an agent loop task was created with: its defaults are written into the
-- task's own fields; what stays is what the worker applies at each attempt (a coding
-- agent's writers wait for an approval).
ALTER TABLE tasks ADD COLUMN execution_profile TEXT
    CHECK (execution_profile IN ('coding_agent'));
ALTER TABLE tasks ADD CONSTRAINT tasks_execution_profile_agent_loop
    CHECK (execution_profile IS NULL OR execution_kind = 'agent_loop');
