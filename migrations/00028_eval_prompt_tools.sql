-- A suite prompt may offer the model tools and be a conversation with
-- tool calls and results in it, so a tool-using agent's versions are
-- judged on what it does: tools holds the offered functions in OpenAI's
-- chat-completions form (NULL: none), and the rule 'tool_call' passes an
-- answer that calls the expected tool with the expected arguments.

-- +goose Up
ALTER TABLE eval_prompts ADD COLUMN tools jsonb;
ALTER TABLE eval_prompts DROP CONSTRAINT eval_prompts_match_check;
ALTER TABLE eval_prompts ADD CONSTRAINT eval_prompts_match_check CHECK (match IN ('', 'exact', 'contains', 'refusal', 'tool_call'));

-- +goose Down
-- A prompt judged on its tools means nothing without them.
DELETE FROM eval_prompts WHERE match = 'tool_call' OR tools IS NOT NULL;
ALTER TABLE eval_prompts DROP CONSTRAINT eval_prompts_match_check;
ALTER TABLE eval_prompts ADD CONSTRAINT eval_prompts_match_check CHECK (match IN ('', 'exact', 'contains', 'refusal'));
ALTER TABLE eval_prompts DROP COLUMN tools;
