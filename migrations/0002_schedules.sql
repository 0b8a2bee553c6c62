-- Schedules: at most one per task, `once` or five-field `cron` in an IANA zone, and their
-- durable trigger history. A schedule never queues work itself: each firing claims an
-- occurrence, then creates a run through the same admission path as a manual start.

CREATE TABLE task_schedules (
    id              TEXT PRIMARY KEY,
    task_id         TEXT NOT NULL UNIQUE REFERENCES tasks (id) ON DELETE CASCADE,
    kind            TEXT NOT NULL CHECK (kind IN ('once', 'cron')),
    timezone        TEXT NOT NULL,
    run_at          TIMESTAMPTZ,
    cron_expression TEXT,
    enabled         BOOLEAN NOT NULL,
    -- Derived from the definition; NULL exactly while the schedule is paused or spent.
    next_run_at     TIMESTAMPTZ,
    -- Bumped by every edit and every dispatch, so neither applies a stale next_run_at.
    revision        BIGINT NOT NULL DEFAULT 1 CHECK (revision > 0),
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    CHECK ((kind = 'once') = (run_at IS NOT NULL)),
    CHECK ((kind = 'cron') = (cron_expression IS NOT NULL)),
    CHECK (enabled = (next_run_at IS NOT NULL))
);
CREATE INDEX task_schedules_due ON task_schedules (next_run_at) WHERE enabled;

-- One row per firing. The unique key is what makes dispatch safe on many replicas: a time
-- is recorded once, however many dispatchers see it due.
CREATE TABLE schedule_occurrences (
    id            TEXT PRIMARY KEY,
    schedule_id   TEXT NOT NULL REFERENCES task_schedules (id) ON DELETE CASCADE,
    -- No foreign key: the task is reached through the schedule (which cascades), and a key
    -- here would make every claim lock the task row, against the lock order (see
    -- src/scheduler/schedules.rs).
    task_id       TEXT NOT NULL,
    scheduled_for TIMESTAMPTZ NOT NULL,
    status        TEXT NOT NULL CHECK (status IN ('claimed', 'started', 'skipped', 'failed')),
    -- The claim: who may resolve it (a fresh token per claim and takeover) and since when,
    -- so a claim whose dispatcher died is taken over after a bounded time.
    claim_token   TEXT,
    claimed_at    TIMESTAMPTZ NOT NULL,
    run_id        TEXT,
    error         TEXT,
    completed_at  TIMESTAMPTZ,
    UNIQUE (schedule_id, scheduled_for),
    CHECK ((status = 'claimed') = (claim_token IS NOT NULL)),
    CHECK ((status = 'claimed') = (completed_at IS NULL)),
    CHECK ((status = 'started') = (run_id IS NOT NULL))
);
CREATE INDEX schedule_occurrences_claimed ON schedule_occurrences (claimed_at)
    WHERE status = 'claimed';

-- Provenance of a scheduled run. Plain columns, not keys: a run's history stays as it was
-- when its schedule is later replaced or removed.
ALTER TABLE runs
    ADD COLUMN schedule_id            TEXT,
    ADD COLUMN schedule_occurrence_id TEXT,
    ADD COLUMN scheduled_for          TIMESTAMPTZ,
    ADD CHECK ((schedule_id IS NULL) = (schedule_occurrence_id IS NULL)
           AND (schedule_id IS NULL) = (scheduled_for IS NULL));
-- The last line of defence against a duplicate: one run per occurrence, whatever the code does.
CREATE UNIQUE INDEX runs_one_per_occurrence ON runs (schedule_occurrence_id)
    WHERE schedule_occurrence_id IS NOT NULL;
