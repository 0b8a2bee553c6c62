-- Workspaces (tenants): every tenant row names its workspace, and the database keeps a
-- child in its parent's workspace. Rows written before workspaces existed move into
-- `default`, the workspace of local mode. The defaults are dropped at the end, so an
-- insert that forgets the workspace fails here rather than landing in `default`.
--
-- Parents get `UNIQUE (id, workspace_id)` so children can reference the pair; each
-- child's single-column key to its parent is replaced by the composite one (same
-- cascade). List indexes lead with workspace_id, so one workspace's page is an index scan.

-- Tasks (workspace_id since 0001) and runs.
ALTER TABLE tasks ADD CONSTRAINT tasks_id_workspace UNIQUE (id, workspace_id);
CREATE INDEX tasks_workspace ON tasks (workspace_id, id);

ALTER TABLE runs ADD COLUMN workspace_id TEXT;
UPDATE runs r SET workspace_id = t.workspace_id FROM tasks t WHERE t.id = r.task_id;
ALTER TABLE runs
    ALTER COLUMN workspace_id SET NOT NULL,
    ADD CONSTRAINT runs_id_workspace UNIQUE (id, workspace_id),
    DROP CONSTRAINT runs_task_id_fkey,
    ADD CONSTRAINT runs_task_workspace FOREIGN KEY (task_id, workspace_id)
        REFERENCES tasks (id, workspace_id) ON DELETE CASCADE;

ALTER TABLE tasks
    DROP CONSTRAINT tasks_latest_run_id_fkey,
    ADD CONSTRAINT tasks_latest_run_workspace FOREIGN KEY (latest_run_id, workspace_id)
        REFERENCES runs (id, workspace_id) DEFERRABLE INITIALLY DEFERRED;

-- Steps and approvals belong to a run.
ALTER TABLE steps ADD COLUMN workspace_id TEXT;
UPDATE steps s SET workspace_id = r.workspace_id FROM runs r WHERE r.id = s.run_id;
ALTER TABLE steps
    ALTER COLUMN workspace_id SET NOT NULL,
    DROP CONSTRAINT steps_run_id_fkey,
    ADD CONSTRAINT steps_run_workspace FOREIGN KEY (run_id, workspace_id)
        REFERENCES runs (id, workspace_id) ON DELETE CASCADE;

ALTER TABLE approvals ADD COLUMN workspace_id TEXT;
UPDATE approvals a SET workspace_id = r.workspace_id FROM runs r WHERE r.id = a.run_id;
ALTER TABLE approvals
    ALTER COLUMN workspace_id SET NOT NULL,
    DROP CONSTRAINT approvals_run_id_fkey,
    ADD CONSTRAINT approvals_run_workspace FOREIGN KEY (run_id, workspace_id)
        REFERENCES runs (id, workspace_id) ON DELETE CASCADE;
DROP INDEX approvals_pending;
DROP INDEX approvals_task;
CREATE INDEX approvals_pending ON approvals (workspace_id, id) WHERE status = 'pending';
CREATE INDEX approvals_workspace ON approvals (workspace_id, id);
CREATE INDEX approvals_task ON approvals (workspace_id, task_id, id);

-- Schedules belong to a task, occurrences to a schedule.
ALTER TABLE task_schedules ADD COLUMN workspace_id TEXT;
UPDATE task_schedules s SET workspace_id = t.workspace_id FROM tasks t WHERE t.id = s.task_id;
ALTER TABLE task_schedules
    ALTER COLUMN workspace_id SET NOT NULL,
    ADD CONSTRAINT task_schedules_id_workspace UNIQUE (id, workspace_id),
    DROP CONSTRAINT task_schedules_task_id_fkey,
    ADD CONSTRAINT task_schedules_task_workspace FOREIGN KEY (task_id, workspace_id)
        REFERENCES tasks (id, workspace_id) ON DELETE CASCADE;
CREATE INDEX task_schedules_workspace ON task_schedules (workspace_id, id);

ALTER TABLE schedule_occurrences ADD COLUMN workspace_id TEXT;
UPDATE schedule_occurrences o SET workspace_id = s.workspace_id
    FROM task_schedules s WHERE s.id = o.schedule_id;
ALTER TABLE schedule_occurrences
    ALTER COLUMN workspace_id SET NOT NULL,
    DROP CONSTRAINT schedule_occurrences_schedule_id_fkey,
    ADD CONSTRAINT schedule_occurrences_schedule_workspace FOREIGN KEY (schedule_id, workspace_id)
        REFERENCES task_schedules (id, workspace_id) ON DELETE CASCADE;

-- Provider presets, and the media jobs that run against them.
ALTER TABLE providers ADD COLUMN workspace_id TEXT NOT NULL DEFAULT 'default';
ALTER TABLE providers
    ALTER COLUMN workspace_id DROP DEFAULT,
    ADD CONSTRAINT providers_id_workspace UNIQUE (id, workspace_id);
CREATE INDEX providers_workspace ON providers (workspace_id, id);

ALTER TABLE media_jobs ADD COLUMN workspace_id TEXT;
UPDATE media_jobs m SET workspace_id = p.workspace_id FROM providers p WHERE p.id = m.provider_id;
ALTER TABLE media_jobs
    ALTER COLUMN workspace_id SET NOT NULL,
    ADD CONSTRAINT media_jobs_id_workspace UNIQUE (id, workspace_id),
    DROP CONSTRAINT media_jobs_provider_id_fkey,
    ADD CONSTRAINT media_jobs_provider_workspace FOREIGN KEY (provider_id, workspace_id)
        REFERENCES providers (id, workspace_id) ON DELETE RESTRICT;
DROP INDEX media_jobs_status;
DROP INDEX media_jobs_provider;
CREATE INDEX media_jobs_workspace ON media_jobs (workspace_id, id);
CREATE INDEX media_jobs_status ON media_jobs (workspace_id, status, id);
CREATE INDEX media_jobs_provider ON media_jobs (workspace_id, provider_id, id);

-- Artifacts belong to a run or to a media job.
ALTER TABLE artifacts ADD COLUMN workspace_id TEXT;
UPDATE artifacts a SET workspace_id = COALESCE(
    (SELECT r.workspace_id FROM runs r WHERE r.id = a.run_id),
    (SELECT m.workspace_id FROM media_jobs m WHERE m.id = a.media_job_id));
ALTER TABLE artifacts
    ALTER COLUMN workspace_id SET NOT NULL,
    DROP CONSTRAINT artifacts_run_id_fkey,
    DROP CONSTRAINT artifacts_media_job_id_fkey,
    ADD CONSTRAINT artifacts_run_workspace FOREIGN KEY (run_id, workspace_id)
        REFERENCES runs (id, workspace_id) ON DELETE CASCADE,
    ADD CONSTRAINT artifacts_media_job_workspace FOREIGN KEY (media_job_id, workspace_id)
        REFERENCES media_jobs (id, workspace_id) ON DELETE CASCADE;

-- Events have no key to their subject (task deletion removes them itself, and the append
-- path stays free of key checks); the store writes the workspace of the request or job.
ALTER TABLE run_events ADD COLUMN workspace_id TEXT;
UPDATE run_events e SET workspace_id = COALESCE(
    (SELECT r.workspace_id FROM runs r WHERE r.id = e.run_id),
    (SELECT m.workspace_id FROM media_jobs m WHERE m.id = e.media_job_id),
    'default');
ALTER TABLE run_events ALTER COLUMN workspace_id SET NOT NULL;
-- The scoped public feed: one workspace's events in global order.
CREATE INDEX run_events_feed ON run_events (workspace_id, id);

-- The audit trail outlives what it describes, so it has no keys either.
ALTER TABLE state_transitions ADD COLUMN workspace_id TEXT;
UPDATE state_transitions s SET workspace_id = COALESCE(
    (SELECT t.workspace_id FROM tasks t WHERE t.id = s.task_id),
    (SELECT m.workspace_id FROM media_jobs m
      WHERE s.entity_type = 'media_job' AND m.id = s.entity_id),
    'default');
ALTER TABLE state_transitions ALTER COLUMN workspace_id SET NOT NULL;
DROP INDEX state_transitions_entity;
CREATE INDEX state_transitions_entity ON state_transitions (workspace_id, entity_type, entity_id, id);
CREATE INDEX state_transitions_workspace ON state_transitions (workspace_id, id);

-- Ended leases, as GET /v1/runtime/leases shows them; copied from queue_jobs.
ALTER TABLE lease_history ADD COLUMN workspace_id TEXT;
UPDATE lease_history h SET workspace_id = COALESCE(
    (SELECT r.workspace_id FROM runs r WHERE h.kind = 'run' AND r.id = h.ref_id),
    (SELECT m.workspace_id FROM media_jobs m WHERE h.kind = 'media' AND m.id = h.ref_id),
    'default');
ALTER TABLE lease_history ALTER COLUMN workspace_id SET NOT NULL;
CREATE INDEX lease_history_workspace ON lease_history (workspace_id, id);

-- Queue rows take the workspace of their domain row. No index is added to queue_jobs:
-- every index is more work on the claim path.
ALTER TABLE queue_jobs ALTER COLUMN workspace_id DROP DEFAULT;
ALTER TABLE tasks ALTER COLUMN workspace_id DROP DEFAULT;
