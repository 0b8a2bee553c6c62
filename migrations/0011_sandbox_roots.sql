-- An in_place task may narrow the operator's workspace roots (KEEL_WORKSPACE_ROOTS) to one
-- directory beneath them; its working directory must then lie beneath that one.
ALTER TABLE tasks ADD COLUMN sandbox_allowed_root TEXT;

-- When the retention sweep removed the run's ephemeral workspace (NULL: not yet, or it has
-- none of its own). Resuming a run whose workspace is gone is refused.
ALTER TABLE runs ADD COLUMN workspace_removed_at TIMESTAMPTZ;

-- The sweep reads finished runs whose workspace is still there, oldest end first.
CREATE INDEX runs_workspace_retention ON runs (finished_at)
    WHERE finished_at IS NOT NULL AND workspace_removed_at IS NULL;
