-- Approvals (human gates on runs), run lineage (resume) and budgets, the state-transition
-- audit trail, and the lease history behind GET /v1/runtime/leases.

ALTER TABLE tasks ADD COLUMN budget_micros_usd BIGINT NOT NULL DEFAULT 0 CHECK (budget_micros_usd >= 0);

ALTER TABLE runs
    ADD COLUMN resumed_from_run_id    TEXT REFERENCES runs (id) ON DELETE SET NULL,
    -- The run whose ephemeral workspace this run works in: itself, or for a resumed run
    -- the workspace of the run it resumes.
    ADD COLUMN workspace_run_id       TEXT,
    ADD COLUMN checkpoint             JSONB,
    ADD COLUMN prior_cost_micros_usd  BIGINT NOT NULL DEFAULT 0 CHECK (prior_cost_micros_usd >= 0),
    ADD COLUMN total_cost_micros_usd  BIGINT NOT NULL DEFAULT 0 CHECK (total_cost_micros_usd >= 0);

CREATE TABLE approvals (
    id                        TEXT PRIMARY KEY,
    task_id                   TEXT NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    run_id                    TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    kind                      TEXT NOT NULL CHECK (kind IN
                                  ('shell_command', 'git_exec', 'file_write', 'network_egress',
                                   'agent_loop_tool_call')),
    status                    TEXT NOT NULL CHECK (status IN
                                  ('pending', 'approved', 'rejected', 'cancelled', 'expired')),
    action_summary            TEXT[] NOT NULL,
    action_summary_incomplete BOOLEAN NOT NULL DEFAULT false,
    decision_note             TEXT,
    resolved_by               TEXT,
    created_at                TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at                TIMESTAMPTZ,
    resolved_at               TIMESTAMPTZ,
    UNIQUE (run_id, kind),
    CHECK ((status = 'pending') = (resolved_at IS NULL))
);
CREATE INDEX approvals_pending ON approvals (id) WHERE status = 'pending';
CREATE INDEX approvals_task ON approvals (task_id, id);

-- Every state change of a task, run or approval, written in the transaction that made it.
CREATE TABLE state_transitions (
    id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    entity_type TEXT NOT NULL CHECK (entity_type IN ('task', 'run', 'approval')),
    entity_id   TEXT NOT NULL,
    task_id     TEXT NOT NULL,
    from_status TEXT,
    to_status   TEXT NOT NULL,
    reason      TEXT,
    actor       TEXT NOT NULL,
    occurred_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
CREATE INDEX state_transitions_entity ON state_transitions (entity_type, entity_id, id);
CREATE INDEX state_transitions_task ON state_transitions (task_id);

-- Leases that ended (acked, nacked, released or taken over), for diagnostics. Live leases
-- are read from queue_jobs itself. Pruned by the maintenance loop.
CREATE TABLE lease_history (
    id            BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id        BIGINT NOT NULL,
    kind          TEXT NOT NULL,
    ref_id        TEXT NOT NULL,
    owner         TEXT NOT NULL,
    fencing_token BIGINT NOT NULL,
    claimed_at    TIMESTAMPTZ NOT NULL,
    expires_at    TIMESTAMPTZ NOT NULL,
    heartbeats    INTEGER NOT NULL,
    released_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    outcome       TEXT NOT NULL CHECK (outcome IN ('acked', 'retried', 'released', 'expired', 'withdrawn'))
);
CREATE INDEX lease_history_released ON lease_history (released_at);
