-- External actions (issue 18): a comment, a label change or a pull-request review proposed
-- on an external work item, gated by an `external_action` approval, and sent to the
-- tracker by an `external_action` queue job only after the approval. The row keeps exactly
-- what will be sent and the target as it was at the proposal, so the job can refuse a
-- target that changed since. No token is ever stored: the job resolves it at use.

CREATE TABLE external_actions (
    id                 TEXT PRIMARY KEY,
    workspace_id       TEXT NOT NULL,
    item_id            TEXT NOT NULL REFERENCES external_work_items (id) ON DELETE CASCADE,
    -- The item's subject's task and the run the approval is attached to (the proposing
    -- run, or the subject's current run): its artifacts carry the tracker's answer.
    task_id            TEXT NOT NULL,
    run_id             TEXT NOT NULL,
    kind               TEXT NOT NULL CHECK (kind IN ('comment', 'labels', 'review')),
    -- What was proposed, as the request had it.
    proposal           JSONB NOT NULL,
    -- The exact calls the job makes: [{method, path, body}], path relative to the
    -- tracker's endpoint, bodies with the action's hidden marker.
    calls              JSONB NOT NULL CHECK (jsonb_typeof(calls) = 'array'),
    -- The target at the proposal: {idempotency_key, state, updated_at, head_sha}.
    target             JSONB NOT NULL,
    status             TEXT NOT NULL CHECK (status IN ('pending_approval', 'approved', 'sending',
                                                       'sent', 'stale_target', 'failed',
                                                       'rejected')),
    proposed_by        TEXT NOT NULL,
    proposed_by_run_id TEXT,
    -- The tracker's answer, short ({http_status, id, url}); in full in the artifact.
    response           JSONB,
    artifact_id        TEXT,
    last_error_code    TEXT,
    last_error         TEXT,
    created_at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    decided_at         TIMESTAMPTZ,
    sending_at         TIMESTAMPTZ,
    finished_at        TIMESTAMPTZ,
    updated_at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT external_actions_run FOREIGN KEY (run_id, workspace_id)
        REFERENCES runs (id, workspace_id) ON DELETE CASCADE,
    CONSTRAINT external_actions_id_workspace UNIQUE (id, workspace_id),
    CHECK ((status IN ('sent', 'stale_target', 'failed', 'rejected')) = (finished_at IS NOT NULL))
);
CREATE INDEX external_actions_item ON external_actions (workspace_id, item_id, id);

-- The approval of an action: attached to the action's task and run (so the existing
-- approve/reject API serves it), but it never holds or moves that run.
ALTER TABLE approvals
    DROP CONSTRAINT approvals_kind_check,
    ADD CONSTRAINT approvals_kind_check CHECK (kind IN
        ('shell_command', 'git_exec', 'file_write', 'network_egress', 'agent_loop_tool_call',
         'external_action')),
    ADD COLUMN external_action_id TEXT,
    ADD CONSTRAINT approvals_external_action FOREIGN KEY (external_action_id, workspace_id)
        REFERENCES external_actions (id, workspace_id) ON DELETE CASCADE,
    ADD CONSTRAINT approvals_external_action_link
        CHECK ((kind = 'external_action') = (external_action_id IS NOT NULL));
DROP INDEX approvals_one_gate_per_kind;
CREATE UNIQUE INDEX approvals_one_gate_per_kind ON approvals (run_id, kind)
    WHERE kind NOT IN ('agent_loop_tool_call', 'external_action');
CREATE UNIQUE INDEX approvals_one_per_external_action ON approvals (external_action_id)
    WHERE external_action_id IS NOT NULL;
