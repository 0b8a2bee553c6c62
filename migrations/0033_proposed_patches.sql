-- A tool called with `propose: true` leaves its change as a proposal: the file stays as it
-- was until an operator applies it (or discards it).
ALTER TABLE artifacts
    DROP CONSTRAINT artifacts_patch_status_check,
    ADD CONSTRAINT artifacts_patch_status_check
        CHECK (patch_status IN ('applied', 'reverted', 'proposed', 'discarded'));
