-- A suite prompt may be answered at a temperature, as the agents it
-- stands for sample: a version whose greedy answer is right but whose
-- sampled ones break is judged on what users get. 0 is greedy. The gate
-- samples with a fixed seed, so a version's result is still a fact about
-- it, and two versions draw the same random numbers.

-- +goose Up
ALTER TABLE eval_prompts ADD COLUMN temperature double precision NOT NULL DEFAULT 0
    CHECK (temperature >= 0 AND temperature <= 2);

-- +goose Down
ALTER TABLE eval_prompts DROP COLUMN temperature;
