-- Indexes of the workspace-wide reads (issue 33): each list pages by id inside one
-- workspace, so each filter gets an index in id order and a page reads only its own rows,
-- however long the history grows.

-- GET /v1/runs: all runs, by status, by task (a task's runs by status filter the task's).
CREATE INDEX runs_workspace ON runs (workspace_id, id);
CREATE INDEX runs_workspace_status ON runs (workspace_id, status, id);
CREATE INDEX runs_workspace_task ON runs (workspace_id, task_id, id);

-- GET /v1/approvals?run_id=
CREATE INDEX approvals_run ON approvals (workspace_id, run_id, id);

-- GET /v1/tasks/{task_id}/artifacts (a media job's artifacts have no task).
CREATE INDEX artifacts_task ON artifacts (workspace_id, task_id, id) WHERE task_id IS NOT NULL;
