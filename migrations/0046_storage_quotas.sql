-- Byte quotas per run and per workspace (src/quotas.rs). What each run and each workspace
-- stores is counted here, by triggers, in the transaction that writes it: artifact bytes
-- (a run's and a media job's), steps' input and output, client events' data. A write that
-- would take a count over the quota its connection carries fails in that transaction with
-- SQLSTATE KQ001 and the message Keel reports (`storage_quota_exceeded: …`); each Keel
-- process sets its quotas on its own connections (`keel.run_max_stored_bytes`,
-- `keel.workspace_max_stored_bytes`; unset or empty: no quota), so a connection of another
-- client (a migration, psql) is never refused. A write that frees bytes never fails.
--
-- The counter rows are the lock that orders writers: a second writer of the same run or
-- workspace waits for the first to commit, then adds to what it stored, so concurrent
-- writers never take a count past its quota. Every writer locks the run's row before the
-- workspace's, so two never wait for each other.
CREATE TABLE run_storage (
    run_id       TEXT PRIMARY KEY REFERENCES runs (id) ON DELETE CASCADE,
    stored_bytes BIGINT NOT NULL CHECK (stored_bytes >= 0)
);

CREATE TABLE workspace_storage (
    workspace_id TEXT PRIMARY KEY,
    stored_bytes BIGINT NOT NULL CHECK (stored_bytes >= 0)
);

-- Adds `delta` to a counter (a row it creates for a first write) and refuses a growth past
-- `quota`; a release only updates (the run's row may be going with its run) and never goes
-- below zero. Returns nothing: the caller raises.
CREATE FUNCTION count_stored_bytes(subject text, delta bigint, quota bigint, what text)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    total bigint;
BEGIN
    IF delta < 0 THEN
        IF what = 'run' THEN
            -- Not for a run being deleted: its row goes with it, and updating a row this
            -- transaction wrote before makes PostgreSQL check its key again (and fail).
            UPDATE run_storage SET stored_bytes = greatest(stored_bytes + delta, 0)
            WHERE run_id = subject AND EXISTS (SELECT 1 FROM runs WHERE id = subject);
        ELSE
            UPDATE workspace_storage SET stored_bytes = greatest(stored_bytes + delta, 0)
            WHERE workspace_id = subject;
        END IF;
        RETURN;
    END IF;
    IF what = 'run' THEN
        INSERT INTO run_storage AS s (run_id, stored_bytes) VALUES (subject, delta)
        ON CONFLICT (run_id) DO UPDATE SET stored_bytes = s.stored_bytes + delta
        RETURNING s.stored_bytes INTO total;
    ELSE
        INSERT INTO workspace_storage AS s (workspace_id, stored_bytes) VALUES (subject, delta)
        ON CONFLICT (workspace_id) DO UPDATE SET stored_bytes = s.stored_bytes + delta
        RETURNING s.stored_bytes INTO total;
    END IF;
    IF total > quota THEN
        RAISE EXCEPTION 'storage_quota_exceeded: % % would store % bytes, over its quota of % bytes',
            what, subject, total, quota
            USING ERRCODE = 'KQ001';
    END IF;
END;
$$;

-- Counts `delta` bytes of `run` (none for a media job's) in `workspace`: the run first.
CREATE FUNCTION store_bytes(workspace text, run text, delta bigint) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF coalesce(delta, 0) = 0 THEN
        RETURN;
    END IF;
    IF run IS NOT NULL THEN
        PERFORM count_stored_bytes(run, delta,
            nullif(current_setting('keel.run_max_stored_bytes', true), '')::bigint, 'run');
    END IF;
    PERFORM count_stored_bytes(workspace, delta,
        nullif(current_setting('keel.workspace_max_stored_bytes', true), '')::bigint,
        'workspace');
END;
$$;

-- What a step stores: its input and output (its error is Keel's or bounded, and written
-- when a run fails, which must never be refused).
CREATE FUNCTION step_bytes(input jsonb, output jsonb) RETURNS bigint
LANGUAGE sql IMMUTABLE AS $$
    SELECT coalesce(octet_length(input::text), 0)::bigint + coalesce(octet_length(output::text), 0)
$$;

CREATE FUNCTION count_step_bytes() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM store_bytes(NEW.workspace_id, NEW.run_id, step_bytes(NEW.input, NEW.output));
    ELSIF TG_OP = 'UPDATE' THEN
        PERFORM store_bytes(NEW.workspace_id, NEW.run_id,
            step_bytes(NEW.input, NEW.output) - step_bytes(OLD.input, OLD.output));
    ELSE
        PERFORM store_bytes(OLD.workspace_id, OLD.run_id, -step_bytes(OLD.input, OLD.output));
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER steps_stored_bytes AFTER INSERT OR UPDATE OF input, output OR DELETE ON steps
    FOR EACH ROW EXECUTE FUNCTION count_step_bytes();

-- An artifact's bytes are counted as its size grows (every append updates it) and released
-- when it goes.
CREATE FUNCTION count_artifact_bytes() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' THEN
        PERFORM store_bytes(NEW.workspace_id, NEW.run_id, NEW.size_bytes - OLD.size_bytes);
    ELSE
        PERFORM store_bytes(OLD.workspace_id, OLD.run_id, -OLD.size_bytes);
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER artifacts_stored_bytes AFTER UPDATE OF size_bytes OR DELETE ON artifacts
    FOR EACH ROW EXECUTE FUNCTION count_artifact_bytes();

-- A client's events (`client.event`) carry what it chose to send; Keel's own events do not
-- count.
CREATE FUNCTION count_client_event_bytes() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        PERFORM store_bytes(NEW.workspace_id, NEW.run_id, octet_length(NEW.data::text));
    ELSE
        PERFORM store_bytes(OLD.workspace_id, OLD.run_id, -octet_length(OLD.data::text));
    END IF;
    RETURN NULL;
END;
$$;

CREATE TRIGGER client_events_stored_bytes AFTER INSERT ON run_events
    FOR EACH ROW WHEN (NEW.type = 'client.event') EXECUTE FUNCTION count_client_event_bytes();
CREATE TRIGGER client_events_released_bytes AFTER DELETE ON run_events
    FOR EACH ROW WHEN (OLD.type = 'client.event') EXECUTE FUNCTION count_client_event_bytes();

-- What is stored already.
WITH stored (workspace_id, run_id, bytes) AS (
    SELECT workspace_id, run_id, size_bytes FROM artifacts
    UNION ALL
    SELECT workspace_id, run_id, step_bytes(input, output) FROM steps
    UNION ALL
    SELECT workspace_id, run_id, octet_length(data::text) FROM run_events
    WHERE type = 'client.event'
),
by_run AS (
    INSERT INTO run_storage (run_id, stored_bytes)
    SELECT s.run_id, sum(s.bytes) FROM stored s
    WHERE EXISTS (SELECT 1 FROM runs r WHERE r.id = s.run_id)
    GROUP BY s.run_id
)
INSERT INTO workspace_storage (workspace_id, stored_bytes)
SELECT workspace_id, sum(bytes) FROM stored GROUP BY workspace_id;
