-- Appends events of one workspace's subjects in one call (events::append): the subjects'
-- append locks, then one INSERT that numbers the events on from each subject's last one.
-- A function so that the two are one round trip and the INSERT still reads after the
-- locks are held: a VOLATILE function takes a fresh snapshot for each statement in it
-- (READ COMMITTED), so the INSERT sees every event of a transaction a lock waited for.
-- Returns how many events it appended. A generic plan: a custom one, which knows the
-- arrays' lengths, always looked cheaper to PostgreSQL and was made at nearly every call,
-- for the same walk (one probe of each subject's last event).
CREATE OR REPLACE FUNCTION append_events(lock_class integer, event_ids text[], task_ids text[],
                                         run_ids text[], media_job_ids text[], types text[],
                                         data jsonb[], workspace text) RETURNS bigint
LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    appended bigint;
BEGIN
    -- Sorted keys, so two transactions locking the same subjects take them in one order
    -- (the locks are taken after the sort: a volatile call in a select list is).
    PERFORM pg_advisory_xact_lock(lock_class, key)
    FROM (SELECT DISTINCT hashtext(COALESCE(s.run_id, s.media_job_id)) AS key
          FROM unnest(run_ids, media_job_ids) AS s (run_id, media_job_id)) AS keys
    ORDER BY key;
    -- Each event numbers on from its subject's last committed one (`nth` counts the call's
    -- events per subject) and takes the greater of this transaction's id and that event's
    -- `feed_xid`. Ids are drawn in the call's order, so a subject's events order by id too.
    WITH new AS (
        SELECT n.*, row_number() OVER (PARTITION BY n.run_id, n.media_job_id ORDER BY n.ord) AS nth
        FROM unnest(event_ids, task_ids, run_ids, media_job_ids, types, data)
             WITH ORDINALITY AS n (event_id, task_id, run_id, media_job_id, type, data, ord)
    )
    INSERT INTO run_events (event_id, task_id, run_id, media_job_id, sequence, feed_xid,
                            type, data, workspace_id)
    SELECT new.event_id, new.task_id, new.run_id, new.media_job_id,
           COALESCE(last.sequence, 0) + new.nth,
           GREATEST(pg_current_xact_id(), last.feed_xid),
           new.type, new.data, workspace
    FROM new
    LEFT JOIN LATERAL (
        (SELECT e.sequence, e.feed_xid FROM run_events e
         WHERE e.run_id = new.run_id ORDER BY e.sequence DESC LIMIT 1)
        UNION ALL
        (SELECT e.sequence, e.feed_xid FROM run_events e
         WHERE e.media_job_id = new.media_job_id ORDER BY e.sequence DESC LIMIT 1)
    ) AS last ON true
    ORDER BY new.ord;
    GET DIAGNOSTICS appended = ROW_COUNT;
    RETURN appended;
END;
$$;
