-- External work (issue 18): per-item workspaces and the workflow's hooks.

-- The workflow's hooks a task imported from external work runs around each attempt
-- (before_run, after_run, timeout_ms), stored at import so workers need not read the
-- workflow again. NULL for every other task.
ALTER TABLE tasks ADD COLUMN hooks JSONB
    CHECK (hooks IS NULL OR jsonb_typeof(hooks) = 'object');

-- workspace_path: the item's directory `<workspace.root>/<sanitized identifier>`, set when
-- its preparation begins and cleared once a terminal version had it removed.
-- hook_output: what after_create and before_remove printed, by hook name (they run with no
-- run to hold an artifact).
ALTER TABLE external_work_items
    ADD COLUMN workspace_path TEXT,
    ADD COLUMN hook_output JSONB
        CHECK (hook_output IS NULL OR jsonb_typeof(hook_output) = 'object');
CREATE INDEX external_work_items_workspaces
    ON external_work_items (workspace_id, source_id, identifier) WHERE workspace_path IS NOT NULL;
