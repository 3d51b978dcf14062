package deployment

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestTrainerDefaultsThenValidation(t *testing.T) {
	s, err := Parse(json.RawMessage(`{"base_url":"http://vllm:8000/v1","base_model":"Qwen/Qwen3-8B",
		"trainer":{"kind":"tinker","url":"https://tinker.example.com","api_key_env":"TINKER_API_KEY"}}`))
	require.NoError(t, err)
	tr, ok := s.TrainerOf()
	require.True(t, ok)
	require.Equal(t, TinkerQueue, tr.Queue)
	require.Equal(t, "Qwen/Qwen3-8B", tr.BaseModel, "the deployment's base model")
	require.Equal(t, 32, tr.LoRA.Rank)
	require.True(t, *tr.LoRA.Attn && *tr.LoRA.MLP && !*tr.LoRA.Unembed)
	require.Equal(t, LossPPO, tr.Loss)
	require.Equal(t, 1e-4, tr.Adam.LR)

	q, ok := Settings{BaseURL: "http://x/v1", TrainerQueue: "gpu-trainers"}.TrainerOf()
	require.True(t, ok)
	require.Equal(t, Trainer{Kind: TrainerTemporal, Queue: "gpu-trainers"}, q)
	_, ok = Settings{BaseURL: "http://x/v1"}.TrainerOf()
	require.False(t, ok)
}

func TestTrainerErrorsNameTheField(t *testing.T) {
	for raw, want := range map[string]string{
		`{"kind":"gpu"}`: `trainer.kind "gpu": want "tinker" or "temporal"`,
		`{"kind":"tinker","url":"tinker.example.com","base_model":"m"}`:                             "trainer.url",
		`{"kind":"tinker","url":"http://t"}`:                                                        "trainer.base_model",
		`{"kind":"tinker","url":"http://t","base_model":"m","loss":"dpo"}`:                          `trainer.loss "dpo"`,
		`{"kind":"tinker","url":"http://t","base_model":"m","lora":{"rank":-2}}`:                    "trainer.lora.rank -2",
		`{"kind":"tinker","url":"http://t","base_model":"m","lora":{"rank":8,"full_weights":true}}`: "trainer.lora.rank 8: full_weights",
		`{"kind":"tinker","url":"http://t","base_model":"m","adam":{"lr":2}}`:                       "trainer.adam.lr 2",
		`{"kind":"tinker","url":"http://t","base_model":"m","adam":{"beta2":1}}`:                    "trainer.adam.beta1",
		`{"kind":"tinker","url":"http://t","base_model":"m","api_key_env":"not a var"}`:             "trainer.api_key_env",
		`{"kind":"tinker","url":"http://t","base_model":"m","mini_batches":-1}`:                     "trainer.mini_batches -1",
		`{"kind":"tinker","url":"http://t","base_model":"m","advantage":{"negative_weight":1.5}}`:   "trainer.advantage.negative_weight 1.5",
		`{"kind":"temporal"}`: "trainer.queue",
		`{"kind":"tinker","url":"http://t","base_model":"m","lora":{"rnk":8}}`: `unknown field "rnk"`,
	} {
		_, err := Parse(json.RawMessage(`{"base_url":"http://vllm:8000/v1","trainer":` + raw + `}`))
		require.ErrorContains(t, err, want, raw)
	}
	_, err := Parse(json.RawMessage(`{"base_url":"http://v/v1","trainer_queue":"q","trainer":{"kind":"temporal","queue":"q"}}`))
	require.ErrorContains(t, err, "set trainer.queue instead")
}
