-- Evolution's cheap layers learn from why sessions failed, not only that
-- they did. A reward may carry the feedback text that explains it (a
-- grader's reason, a user's complaint); the reflector reads it. A tenant's
-- reflection tokens are counted per UTC day, so a decision never spends
-- beyond the tenant's daily budget: a call reserves its upper bound before
-- it is sent and gives back what it did not use. Deployment-wide layers
-- (the harness) are charged to the tenant '*'. A deployment's 'train'
-- suite holds the prompts the harness search may look at, apart from the
-- gates' suites.

-- +goose Up
ALTER TABLE rewards ADD COLUMN feedback text NOT NULL DEFAULT '' CHECK (length(feedback) <= 4000);
CREATE TABLE reflection_spend (
    tenant_id text   NOT NULL,
    day       date   NOT NULL,
    tokens    bigint NOT NULL DEFAULT 0 CHECK (tokens >= 0),
    PRIMARY KEY (tenant_id, day)
);
ALTER TABLE eval_prompts DROP CONSTRAINT eval_prompts_suite_check;
ALTER TABLE eval_prompts ADD CONSTRAINT eval_prompts_suite_check CHECK (suite IN ('safety', 'regression', 'train'));

-- +goose Down
DELETE FROM eval_prompts WHERE suite = 'train';
ALTER TABLE eval_prompts DROP CONSTRAINT eval_prompts_suite_check;
ALTER TABLE eval_prompts ADD CONSTRAINT eval_prompts_suite_check CHECK (suite IN ('safety', 'regression'));
DROP TABLE reflection_spend;
ALTER TABLE rewards DROP COLUMN feedback;
