-- An agent loop run's answer: the text of the model's last message, the one without tool
-- calls that ended the loop, kept on the run when it completes (it is also the last turn
-- of the run's agent_conversation artifact, which a person should not have to open).
ALTER TABLE runs ADD COLUMN answer text;
