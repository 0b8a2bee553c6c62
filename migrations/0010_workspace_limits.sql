-- Per-workspace concurrency: the limit a workspace's leased jobs may not exceed (NULL: the
-- workers' default, KEEL_MAX_CONCURRENT_PER_WORKSPACE), set by an operator.
CREATE TABLE workspace_limits (
    workspace_id   TEXT PRIMARY KEY,
    max_concurrent INTEGER CHECK (max_concurrent >= 0),
    updated_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_by     TEXT NOT NULL
);

-- The fair claim reads each workspace's due jobs from the head of its own stretch of this
-- index, and finds the workspaces with due work by skipping through it: no workspace's
-- backlog lies in front of another's first job.
CREATE INDEX queue_jobs_workspace_due ON queue_jobs (kind, workspace_id, priority DESC, run_after, id)
    WHERE lease_owner IS NULL;
