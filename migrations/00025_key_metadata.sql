-- A key carries metadata for its operators: the name it has had since the
-- first schema, and now free labels (team, environment, cost centre), a
-- JSON object of string values. The gateway bounds them (store.ValidKeyMeta);
-- the check keeps the column an object whatever writes it. Keys issued
-- before have none.

-- +goose Up
ALTER TABLE api_keys ADD COLUMN labels jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(labels) = 'object');

-- +goose Down
ALTER TABLE api_keys DROP COLUMN labels;
