-- The credential a repository workspace's clone sends: a secret reference (never a value),
-- resolved by the worker for the clone alone.
ALTER TABLE tasks ADD COLUMN repo_credential TEXT;
ALTER TABLE tasks ADD CONSTRAINT tasks_repo_credential_needs_repo
    CHECK (repo_credential IS NULL OR repo IS NOT NULL);
