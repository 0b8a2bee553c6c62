-- Media jobs (image and video generation through the queue) and the provider presets
-- they run against. Presets hold only secret *references* (`env:NAME`, `file:/path`,
-- `keychain:NAME`); the values are resolved by the worker at execution time and never
-- stored.

CREATE TABLE providers (
    id                 TEXT PRIMARY KEY,
    kind               TEXT NOT NULL CHECK (kind ~ '^[a-z0-9][a-z0-9-]*$'),
    display_name       TEXT NOT NULL,
    provider_id        TEXT NOT NULL,
    model              TEXT NOT NULL,
    api                TEXT NOT NULL CHECK (api IN ('media-job', 'openai-completions',
                                                     'openai-responses', 'anthropic-messages')),
    base_url           TEXT NOT NULL,
    api_key_ref        TEXT CHECK (api_key_ref ~ '^(env|file|keychain):.+'),
    headers            JSONB NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(headers) = 'object'),
    secret_header_refs JSONB NOT NULL DEFAULT '{}'
                       CHECK (jsonb_typeof(secret_header_refs) = 'object'),
    capabilities       TEXT[] NOT NULL DEFAULT '{}',
    input              TEXT[] NOT NULL DEFAULT '{}',
    compat             JSONB NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(compat) = 'object'),
    enabled            BOOLEAN NOT NULL DEFAULT false,
    last_check         JSONB,
    created_at         TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at         TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE media_jobs (
    id              TEXT PRIMARY KEY,
    -- A preset with jobs cannot be deleted: the jobs name what they ran against.
    provider_id     TEXT NOT NULL REFERENCES providers (id) ON DELETE RESTRICT,
    operation       TEXT NOT NULL CHECK (operation IN ('image_generate', 'image_edit',
                                                       'video_generate')),
    prompt          TEXT NOT NULL,
    input           JSONB NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(input) = 'object'),
    status          TEXT NOT NULL CHECK (status IN ('queued', 'running', 'succeeded',
                                                    'failed', 'cancelled')),
    -- The vendor's id of a submitted generation task (Seedance), stored before polling
    -- starts, so a worker that takes over resumes polling instead of submitting again.
    -- Cleared when the job is run again after it ended.
    vendor_task_id  TEXT,
    attempt         INTEGER NOT NULL DEFAULT 0 CHECK (attempt >= 0),
    worker_id       TEXT,
    last_error_code TEXT,
    last_error      TEXT,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    started_at      TIMESTAMPTZ,
    finished_at     TIMESTAMPTZ,
    CHECK ((status IN ('succeeded', 'failed', 'cancelled')) = (finished_at IS NOT NULL))
);
CREATE INDEX media_jobs_status ON media_jobs (status, id);
CREATE INDEX media_jobs_provider ON media_jobs (provider_id, id);

-- Artifacts and events belong to a run or to a media job, never both.
ALTER TABLE artifacts
    ALTER COLUMN run_id DROP NOT NULL,
    ALTER COLUMN task_id DROP NOT NULL,
    ADD COLUMN media_job_id TEXT REFERENCES media_jobs (id) ON DELETE CASCADE,
    DROP CONSTRAINT artifacts_kind_check,
    ADD CONSTRAINT artifacts_kind_check
        CHECK (kind IN ('stdout', 'stderr', 'file', 'image', 'video', 'metadata')),
    ADD CONSTRAINT artifacts_one_owner
        CHECK ((run_id IS NOT NULL AND task_id IS NOT NULL) <> (media_job_id IS NOT NULL)),
    ADD CONSTRAINT artifacts_media_job_name UNIQUE (media_job_id, name);

ALTER TABLE run_events
    ALTER COLUMN run_id DROP NOT NULL,
    ALTER COLUMN task_id DROP NOT NULL,
    ADD COLUMN media_job_id TEXT,
    ADD CONSTRAINT run_events_one_subject
        CHECK ((run_id IS NOT NULL AND task_id IS NOT NULL) <> (media_job_id IS NOT NULL)),
    ADD CONSTRAINT run_events_media_job_sequence UNIQUE (media_job_id, sequence);

ALTER TABLE state_transitions
    ALTER COLUMN task_id DROP NOT NULL,
    DROP CONSTRAINT state_transitions_entity_type_check,
    ADD CONSTRAINT state_transitions_entity_type_check
        CHECK (entity_type IN ('task', 'run', 'approval', 'media_job'));
