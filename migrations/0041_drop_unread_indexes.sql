-- Two indexes no statement reads, which every run paid entries in (the runs figure's WAL
-- records by relation, docs/benchmarks.md):
--
-- - an event's `event_id` is a UUIDv7 made by the process that appends it (`new_id`),
--   unique by construction, and nothing looks an event up by it (streams, pages and
--   retention go by id, run and sequence, or feed position): 11 entries a shell run;
-- - `state_transitions (task_id)`: the audit trail is read by workspace, entity and id
--   (a task's own changes are its entity's), and no foreign key needs it (a task's
--   transitions outlive the task): 7 entries a shell run.
ALTER TABLE run_events DROP CONSTRAINT IF EXISTS run_events_event_id_key;
DROP INDEX IF EXISTS state_transitions_task;
