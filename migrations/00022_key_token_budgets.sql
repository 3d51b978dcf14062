-- A tenant key may have a token budget: at most token_budget prompt and
-- completion tokens per budget_period (a UTC day or month), counted from
-- usage_daily, which the capture statement keeps. 0: no budget. Session
-- keys spend their parent's budget, as their usage is accounted to it.

-- +goose Up
ALTER TABLE api_keys
    ADD COLUMN token_budget bigint NOT NULL DEFAULT 0 CHECK (token_budget >= 0),
    ADD COLUMN budget_period text NOT NULL DEFAULT 'day' CHECK (budget_period IN ('day', 'month'));

-- +goose Down
ALTER TABLE api_keys DROP COLUMN budget_period, DROP COLUMN token_budget;
