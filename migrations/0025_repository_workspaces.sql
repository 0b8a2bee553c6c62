-- A task whose ephemeral workspace starts as a clone of a repository: `repo` (a URL
-- without credentials, or an absolute path) and the branch to check out (NULL: the
-- repository's default).
ALTER TABLE tasks ADD COLUMN repo TEXT;
ALTER TABLE tasks ADD COLUMN base_branch TEXT;
ALTER TABLE tasks ADD CONSTRAINT tasks_base_branch_needs_repo
    CHECK (base_branch IS NULL OR repo IS NOT NULL);
ALTER TABLE tasks ADD CONSTRAINT tasks_repo_is_ephemeral
    CHECK (repo IS NULL OR workspace_mode = 'ephemeral');
