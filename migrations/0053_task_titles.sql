-- A task's title (seed 004): what lists show instead of a 32-character id. Given on
-- creation, or derived from what the task runs: its prompt's or command's first line,
-- white space folded, cut at 80 characters. Tasks from before titles get the same.
ALTER TABLE tasks ADD COLUMN title text;
UPDATE tasks SET title = left(btrim(regexp_replace(regexp_replace(split_part(btrim(coalesce(
    prompt, shell_command, 'git ' || git_command, file_operation || ' ' || file_path,
    execution_kind), E' \t\r\n'), E'\n', 1), '\s+', ' ', 'g'), '[[:cntrl:]]', '', 'g')), 80);
UPDATE tasks SET title = execution_kind WHERE title = '';
ALTER TABLE tasks ALTER COLUMN title SET NOT NULL;
ALTER TABLE tasks ADD CONSTRAINT tasks_title_shape
    CHECK (char_length(title) BETWEEN 1 AND 200 AND title !~ '[[:cntrl:]]');
