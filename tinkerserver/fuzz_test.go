package tinkerserver

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/tinker"
)

// FuzzForwardBackwardBody: whatever the body, the answer is a 2xx or a
// 4xx, and an accepted request's future succeeds or fails with 400, never
// a 5xx.
func FuzzForwardBackwardBody(f *testing.F) {
	h := newHarness(f, Config{})
	model := h.model(h.session(), tinker.LoraConfig{Rank: 2})
	seed := func(v any) {
		js, err := json.Marshal(v)
		require.NoError(f, err)
		f.Add(string(js))
	}
	seed(fbRequest(model, nil))
	bad := fbRequest(model, nil)
	bad.ForwardBackwardInput.LossFn = tinker.LossPPO
	bad.ForwardBackwardInput.LossFnConfig = map[string]float64{tinker.ClipLow: 2}
	seed(bad)
	f.Add(`{"model_id":"` + model + `","forward_backward_input":{"loss_fn":"cross_entropy","data":[{"model_input":{"chunks":[{"tokens":[1,-5]}]},"loss_fn_inputs":{"target_tokens":{"data":[-5,1e300]}}}]}}`)
	f.Add(`{"model_id":"` + model + `","forward_backward_input":{"loss_fn":"importance_sampling","data":[{"model_input":{"chunks":[]},"loss_fn_inputs":{"target_tokens":{"data":[]}}}]}}`)
	f.Add(`[]`)
	f.Fuzz(func(t *testing.T, body string) {
		h.t = t
		status, resp := h.post(tinker.PathForwardBackward, body, nil)
		require.True(t, status == http.StatusOK || status/100 == 4, "status %d: %s", status, resp)
		if status != http.StatusOK {
			return
		}
		var fut tinker.FutureResponse
		require.NoError(t, json.Unmarshal(resp, &fut))
		status, resp = h.retrieve(fut.RequestID, nil)
		require.True(t, status == http.StatusOK || status == http.StatusBadRequest, "status %d: %s", status, resp)
	})
}
