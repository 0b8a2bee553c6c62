-- The task list filtered by an active status (`GET /v1/tasks?status=queued`, `running`,
-- `awaiting_approval`): a task with an active run has exactly one, and it is its latest,
-- so these entries are the page, in task order, however many finished tasks the
-- workspace holds. A finished run leaves the index, so it stays as small as the work in
-- flight.
CREATE INDEX runs_workspace_active_task ON runs (workspace_id, status, task_id)
    WHERE status IN ('queued', 'running', 'awaiting_approval');
