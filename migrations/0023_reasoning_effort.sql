-- An agent loop task's reasoning effort, passed to the chat APIs that take one (OpenAI's
-- `reasoning_effort` and Responses' `reasoning.effort`). NULL: the provider's default.
ALTER TABLE tasks ADD COLUMN reasoning_effort TEXT
    CHECK (reasoning_effort IN ('minimal', 'low', 'medium', 'high'));
