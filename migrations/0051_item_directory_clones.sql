-- An external work item's own directory (an in_place task Keel made under the workflow's
-- workspace.root, its hooks stored, none maybe) may start as a clone of the task's
-- repository, as Symphony's after_create hook clones into an issue's workspace. A directory
-- a request names still may not: hooks never come from a request.
ALTER TABLE tasks DROP CONSTRAINT tasks_repo_is_keels;
ALTER TABLE tasks ADD CONSTRAINT tasks_repo_is_keels
    CHECK (repo IS NULL OR workspace_mode IN ('ephemeral', 'persistent') OR hooks IS NOT NULL);
