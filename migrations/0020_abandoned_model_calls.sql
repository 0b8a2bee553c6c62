-- An agent loop's model call in flight: set (fenced) before the call starts, cleared by the
-- statement that records it. An attempt that finds it set was preceded by one that stopped
-- (its lease's local deadline passed, it was killed) with the call unrecorded: the call is
-- counted as abandoned (the provider may have billed it) and is the only one a successor
-- repeats.
ALTER TABLE runs
    ADD COLUMN model_call_in_flight INTEGER CHECK (model_call_in_flight >= 1),
    ADD COLUMN abandoned_model_calls INTEGER NOT NULL DEFAULT 0
        CHECK (abandoned_model_calls >= 0);
