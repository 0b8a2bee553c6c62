-- A persistent workspace: one directory per task under the worker's data directory, kept
-- across its runs (the one-active-run index keeps two runs out of it at once); it can
-- start as a clone of the task's repository, like an ephemeral one.
ALTER TABLE tasks DROP CONSTRAINT tasks_workspace_mode_check;
ALTER TABLE tasks ADD CONSTRAINT tasks_workspace_mode_check
    CHECK (workspace_mode IN ('ephemeral', 'persistent', 'in_place'));
ALTER TABLE tasks DROP CONSTRAINT tasks_repo_is_ephemeral;
ALTER TABLE tasks ADD CONSTRAINT tasks_repo_is_keels
    CHECK (repo IS NULL OR workspace_mode IN ('ephemeral', 'persistent'));
