-- Tracker actions as seed 000's lifecycle (issue 48): an approved action waits for an
-- explicit execute (unless its workflow sets `actions.execute_on_approval`), a pending or
-- approved one may be cancelled, and a pull request may be opened from a run's pushed
-- branch.
ALTER TABLE external_actions
    DROP CONSTRAINT external_actions_kind_check,
    ADD CONSTRAINT external_actions_kind_check
        CHECK (kind IN ('comment', 'labels', 'review', 'pull_request')),
    DROP CONSTRAINT external_actions_status_check,
    ADD CONSTRAINT external_actions_status_check
        CHECK (status IN ('pending_approval', 'approved', 'sending', 'sent', 'stale_target',
                          'failed', 'rejected', 'cancelled')),
    DROP CONSTRAINT external_actions_check,
    ADD CONSTRAINT external_actions_finished
        CHECK ((status IN ('sent', 'stale_target', 'failed', 'rejected', 'cancelled'))
               = (finished_at IS NOT NULL)),
    -- When and by whom its sending was asked for: set once, and only on an approved action.
    ADD COLUMN execute_requested_at TIMESTAMPTZ,
    ADD COLUMN execute_requested_by TEXT,
    ADD CONSTRAINT external_actions_executed_once_approved
        CHECK (execute_requested_at IS NULL OR status NOT IN ('pending_approval', 'rejected')),
    ADD COLUMN cancelled_by TEXT,
    ADD COLUMN cancel_reason TEXT,
    ADD CONSTRAINT external_actions_cancel_reason
        CHECK ((status = 'cancelled') = (cancelled_by IS NOT NULL));

-- Actions approved before this migration were queued at their approval.
UPDATE external_actions SET execute_requested_at = decided_at, execute_requested_by = 'approval'
WHERE status IN ('approved', 'sending', 'sent', 'stale_target', 'failed');

-- Every action of a workspace, by status (`GET /v1/external-work/actions`).
CREATE INDEX external_actions_workspace ON external_actions (workspace_id, id);
-- Every item of a workspace, across its sources (`GET /v1/external-work/items`).
CREATE INDEX external_work_items_workspace ON external_work_items (workspace_id, id);
