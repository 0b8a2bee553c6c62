-- Whether an agent loop task's runs read the workspace's instruction files (AGENTS.md,
-- CLAUDE.md) into their system prompt: 'include' or 'exclude'; NULL is 'include'.
ALTER TABLE tasks ADD COLUMN workspace_system_prompt_policy TEXT
    CHECK (workspace_system_prompt_policy IN ('include', 'exclude'));
