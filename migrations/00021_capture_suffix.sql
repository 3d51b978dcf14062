-- Capture grows with new tokens only. An agent resends its whole
-- conversation on every turn, so storing each request whole stores a
-- 50-turn session's first turn 50 times. A row may now continue an earlier
-- row of its own session (prefix_id): its request's messages are those
-- after the first prefix_messages of that row's conversation (its
-- messages, then its reply), and its prompt token ids those after the
-- first prefix_tokens of that row's prompt then completion ids. The store
-- rebuilds the whole request when it reads a row (store.expand); rows with
-- no prefix_id are whole, as every row was before.
--
-- prefix_id is not a foreign key: the row it names is in the same session,
-- and sessions lose their interactions only all at once (forget).

-- +goose Up
ALTER TABLE interactions
    ADD COLUMN prefix_id bigint,
    ADD COLUMN prefix_messages int NOT NULL DEFAULT 0,
    ADD COLUMN prefix_tokens int NOT NULL DEFAULT 0;

-- +goose Down
-- Rows stored as a suffix cannot be read whole without these columns:
-- refuse to lose them.
-- +goose StatementBegin
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM interactions WHERE prefix_id IS NOT NULL) THEN
        RAISE EXCEPTION 'interactions stored as suffixes exist; a down migration would lose their conversations';
    END IF;
END
$$;
-- +goose StatementEnd
ALTER TABLE interactions DROP COLUMN prefix_id, DROP COLUMN prefix_messages, DROP COLUMN prefix_tokens;
