-- The branch a repository task's completed runs commit and push their workspace's changes
-- to (never the branch they start from).
ALTER TABLE tasks ADD COLUMN push_branch TEXT;
ALTER TABLE tasks ADD CONSTRAINT tasks_push_branch_needs_repo
    CHECK (push_branch IS NULL OR repo IS NOT NULL);
ALTER TABLE tasks ADD CONSTRAINT tasks_push_branch_is_not_the_base
    CHECK (push_branch IS DISTINCT FROM base_branch OR push_branch IS NULL);
