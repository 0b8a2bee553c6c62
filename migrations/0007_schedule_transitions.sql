-- Schedules join the audit trail: created, enabled or disabled, spent, deleted.
ALTER TABLE state_transitions
    DROP CONSTRAINT state_transitions_entity_type_check,
    ADD CONSTRAINT state_transitions_entity_type_check
        CHECK (entity_type IN ('task', 'run', 'approval', 'media_job', 'schedule'));
