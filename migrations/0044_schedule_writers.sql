-- A schedule's last writer requests the runs it dispatches (runs.requested_by), so the
-- requester check stops them approving their own work in two steps. For schedules written
-- before, the best record is the audit trail: the last person whose change of the
-- schedule it holds (a creation always is; a replacement that kept the schedule's state is
-- not). None found, the runs stay requested by `system`.
ALTER TABLE task_schedules ADD COLUMN written_by TEXT;
UPDATE task_schedules s SET written_by = (
    SELECT t.actor FROM state_transitions t
    WHERE t.entity_type = 'schedule' AND t.entity_id = s.id
      AND t.actor <> 'system' AND t.actor NOT LIKE 'worker:%'
    ORDER BY t.id DESC LIMIT 1
);
