-- Keel foundation: tasks, runs, steps, artifacts, events, the job queue and the worker registry.
-- Ids are text: a short type prefix and a time-ordered UUIDv7, so id order is creation order.

CREATE TABLE tasks (
    id                TEXT PRIMARY KEY,
    workspace_id      TEXT NOT NULL DEFAULT 'default',
    execution_kind    TEXT NOT NULL CHECK (execution_kind IN ('shell', 'git', 'file')),
    prompt            TEXT,
    shell_command     TEXT,
    git_command       TEXT,
    file_path         TEXT,
    file_content      TEXT,
    file_operation    TEXT CHECK (file_operation IN ('write', 'append', 'delete')),
    working_directory TEXT,
    workspace_mode    TEXT NOT NULL CHECK (workspace_mode IN ('ephemeral', 'in_place')),
    timeout_ms        BIGINT CHECK (timeout_ms > 0),
    priority          INTEGER NOT NULL DEFAULT 0,
    run_count         INTEGER NOT NULL DEFAULT 0,
    latest_run_id     TEXT,
    created_at        TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at        TIMESTAMPTZ NOT NULL DEFAULT now(),
    CHECK (execution_kind <> 'shell' OR shell_command IS NOT NULL),
    CHECK (execution_kind <> 'git' OR git_command IS NOT NULL),
    CHECK (execution_kind <> 'file' OR (file_path IS NOT NULL AND file_operation IS NOT NULL)),
    CHECK (workspace_mode <> 'in_place' OR working_directory IS NOT NULL)
);

CREATE TABLE runs (
    id                     TEXT PRIMARY KEY,
    task_id                TEXT NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    number                 INTEGER NOT NULL CHECK (number > 0),
    status                 TEXT NOT NULL CHECK (status IN
                               ('queued', 'running', 'awaiting_approval', 'completed', 'failed', 'cancelled')),
    attempt                INTEGER NOT NULL DEFAULT 0,
    worker_id              TEXT,
    exit_code              INTEGER,
    last_error             TEXT,
    retried_from_run_id    TEXT REFERENCES runs (id) ON DELETE SET NULL,
    idempotency_key        TEXT,
    idempotency_request    JSONB,
    created_at             TIMESTAMPTZ NOT NULL DEFAULT now(),
    started_at             TIMESTAMPTZ,
    finished_at            TIMESTAMPTZ,
    updated_at             TIMESTAMPTZ NOT NULL DEFAULT now(),
    UNIQUE (task_id, number),
    CHECK ((status IN ('completed', 'failed', 'cancelled')) = (finished_at IS NOT NULL))
);

-- The heart of "one active run per task": the database refuses a second non-terminal run.
CREATE UNIQUE INDEX runs_one_active_per_task ON runs (task_id)
    WHERE status IN ('queued', 'running', 'awaiting_approval');
CREATE UNIQUE INDEX runs_idempotency_key ON runs (task_id, idempotency_key)
    WHERE idempotency_key IS NOT NULL;
CREATE INDEX runs_active ON runs (id) WHERE status IN ('queued', 'running');

ALTER TABLE tasks ADD FOREIGN KEY (latest_run_id) REFERENCES runs (id) DEFERRABLE INITIALLY DEFERRED;

CREATE TABLE steps (
    id          TEXT PRIMARY KEY,
    run_id      TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    task_id     TEXT NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    index       INTEGER NOT NULL,
    name        TEXT NOT NULL,
    status      TEXT NOT NULL CHECK (status IN ('running', 'completed', 'failed', 'cancelled')),
    input       JSONB NOT NULL DEFAULT '{}',
    output      JSONB,
    error       TEXT,
    started_at  TIMESTAMPTZ NOT NULL DEFAULT now(),
    finished_at TIMESTAMPTZ,
    UNIQUE (run_id, index)
);

CREATE TABLE artifacts (
    id           TEXT PRIMARY KEY,
    run_id       TEXT NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    task_id      TEXT NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
    name         TEXT NOT NULL,
    kind         TEXT NOT NULL CHECK (kind IN ('stdout', 'stderr', 'file')),
    content_type TEXT NOT NULL,
    size_bytes   BIGINT NOT NULL DEFAULT 0 CHECK (size_bytes >= 0),
    truncated    BOOLEAN NOT NULL DEFAULT false,
    status       TEXT NOT NULL CHECK (status IN ('writing', 'complete')),
    storage      TEXT NOT NULL DEFAULT 'postgres',
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    UNIQUE (run_id, name)
);

-- The Postgres content store: artifact bytes in append-only chunks, so a log grows while
-- the run writes it and every API replica can read it.
CREATE TABLE artifact_chunks (
    artifact_id TEXT NOT NULL REFERENCES artifacts (id) ON DELETE CASCADE,
    offset_bytes BIGINT NOT NULL CHECK (offset_bytes >= 0),
    data        BYTEA NOT NULL,
    PRIMARY KEY (artifact_id, offset_bytes)
);

-- Append-only event log. `id` is the global cursor of the public feed: it is drawn while a
-- transaction-level advisory lock is held until commit, so ids become visible in order.
CREATE TABLE run_events (
    id          BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    event_id    TEXT NOT NULL UNIQUE,
    task_id     TEXT NOT NULL,
    run_id      TEXT NOT NULL,
    sequence    BIGINT NOT NULL CHECK (sequence > 0),
    type        TEXT NOT NULL,
    data        JSONB NOT NULL DEFAULT '{}',
    occurred_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    UNIQUE (run_id, sequence)
);
CREATE INDEX run_events_task ON run_events (task_id, id);

-- One queue for every job kind. A row lives only while its job is pending or leased: ack
-- deletes it, so the claim path never scans history (the domain rows keep that).
CREATE TABLE queue_jobs (
    id               BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind             TEXT NOT NULL,
    ref_id           TEXT NOT NULL,
    workspace_id     TEXT NOT NULL DEFAULT 'default',
    priority         INTEGER NOT NULL DEFAULT 0,
    run_after        TIMESTAMPTZ NOT NULL DEFAULT now(),
    attempts         INTEGER NOT NULL DEFAULT 0,
    max_attempts     INTEGER NOT NULL DEFAULT 5 CHECK (max_attempts > 0),
    lease_owner      TEXT,
    lease_expires_at TIMESTAMPTZ,
    claimed_at       TIMESTAMPTZ,
    heartbeats       INTEGER NOT NULL DEFAULT 0,
    fencing_token    BIGINT NOT NULL DEFAULT 0,
    last_error       TEXT,
    traceparent      TEXT,
    created_at       TIMESTAMPTZ NOT NULL DEFAULT now(),
    UNIQUE (kind, ref_id),
    CHECK ((lease_owner IS NULL) = (lease_expires_at IS NULL))
);
CREATE INDEX queue_jobs_due ON queue_jobs (priority DESC, run_after, id) WHERE lease_owner IS NULL;
CREATE INDEX queue_jobs_leased ON queue_jobs (lease_expires_at) WHERE lease_owner IS NOT NULL;

-- Live workers across every replica; a worker is alive while its heartbeat is fresh.
CREATE TABLE workers (
    id             TEXT PRIMARY KEY,
    hostname       TEXT NOT NULL,
    pid            INTEGER NOT NULL,
    kinds          TEXT[] NOT NULL,
    concurrency    INTEGER NOT NULL,
    started_at     TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_seen_at   TIMESTAMPTZ NOT NULL DEFAULT now()
);
