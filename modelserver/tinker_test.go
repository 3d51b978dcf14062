package modelserver_test

import (
	"context"
	"net/http"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/modelserver"
	"github.com/flywheel-ai/flywheel/trainer"
)

// TestServesWhatTheTinkerTrainerSaves: a version saved by the embedded
// trainer of the Tinker API is a directory, a PEFT LoRA adapter of the base
// or its full weights; the server loads either by its version's name and
// answers with the weights the learner holds.
func TestServesWhatTheTinkerTrainerSaves(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, modelserver.Config{})
	b := e.backend(t)
	for i, lora := range []trainer.LoRAConfig{{Rank: 2, Attn: true, MLP: true, Unembed: true}, {Rank: 0}} {
		l, err := trainer.NewLearner(e.base, lora)
		require.NoError(t, err)
		ids := trainer.Tokenizer{}.Encode("hello there")
		d := trainer.TokenDatum{Input: ids[:len(ids)-1], Targets: ids[1:]}
		for range 3 {
			_, err = l.ForwardBackward(ctx, []trainer.TokenDatum{d}, trainer.Loss{Fn: trainer.LossFnCrossEntropy})
			require.NoError(t, err)
			_, err = l.OptimStep(trainer.AdamStep{LR: 0.05, Beta1: 0.9, Beta2: 0.99, Eps: 1e-8})
			require.NoError(t, err)
		}
		dir := filepath.Join(t.TempDir(), "v")
		require.NoError(t, l.WritePEFT(dir, served))
		name := served + "@v" + []string{"5", "6"}[i]
		status, body := e.post(t, "/v1/load_lora_adapter", map[string]string{"lora_name": name, "lora_path": dir})
		require.Equal(t, http.StatusOK, status, "%v", body)
		resp, err := b.Complete(ctx, greedy("hi", name))
		require.NoError(t, err)
		want := direct(t, l.Merged(), greedy("hi", ""))
		require.Equal(t, want.CompletionTokenIDs, resp.CompletionTokenIDs, "rank %d", lora.Rank)
		require.InDeltaSlice(t, want.Logprobs, resp.Logprobs, 1e-4, "rank %d", lora.Rank)
	}
}
