package fakesglang

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/flywheel-ai/flywheel/internal/fakevllm"
)

// The native generation contract, as SGLang's http_server and io_struct
// define it (see the package comment). The fake's model is the vLLM
// fake's: its chat template ("role:content\n" per message) in a byte
// tokenizer, and an echo of the last user message.

// tokenizeRequest is SGLang's TokenizeRequest: exactly one of prompt or
// messages.
type tokenizeRequest struct {
	Prompt   *string         `json:"prompt"`
	Messages json.RawMessage `json:"messages"`
}

// tokenize is POST /v1/tokenize (and /tokenize): {"tokens", "count",
// "max_model_len"}.
func (f *Fake) tokenize(w http.ResponseWriter, r *http.Request) {
	raw, _ := io.ReadAll(r.Body)
	f.record(&f.tokenizes, raw)
	var req tokenizeRequest
	if err := json.Unmarshal(raw, &req); err != nil {
		badRequest(w, "body is not JSON: "+err.Error())
		return
	}
	if f.PromptOnlyTokenize && req.Prompt == nil {
		// An SGLang from before /v1/tokenize took messages: prompt is a
		// required field, and FastAPI's validation error is a 400.
		badRequest(w, "1 validation error for TokenizeRequest\nprompt\n  Field required")
		return
	}
	if (req.Prompt == nil) == (len(req.Messages) == 0) {
		badRequest(w, "Exactly one of 'prompt' or 'messages' must be provided.")
		return
	}
	var ids []int
	if req.Prompt != nil {
		ids = bytesOf(*req.Prompt)
	} else {
		var err error
		if ids, err = fakevllm.PromptIDs(req.Messages); err != nil {
			badRequest(w, "messages: "+err.Error())
			return
		}
	}
	writeJSON(w, 200, map[string]any{"tokens": ids, "count": len(ids), "max_model_len": maxModelLen})
}

const maxModelLen = 32768

// badRequest is SGLang's answer to a request that fails validation.
func badRequest(w http.ResponseWriter, msg string) {
	writeJSON(w, 400, map[string]any{"object": "error", "message": msg, "type": "Bad Request", "param": nil, "code": 400})
}

// generateRequest is the part of GenerateReqInput the fake reads.
type generateRequest struct {
	Text                 *string                    `json:"text"`
	InputIDs             json.RawMessage            `json:"input_ids"`
	SamplingParams       map[string]json.RawMessage `json:"sampling_params"`
	ReturnLogprob        bool                       `json:"return_logprob"`
	TopLogprobsNum       int                        `json:"top_logprobs_num"`
	ReturnTextInLogprobs bool                       `json:"return_text_in_logprobs"`
	Stream               bool                       `json:"stream"`
}

// defaultMaxNewTokens is SamplingParams' default when the request leaves
// max_new_tokens out (null means no limit but the context).
const defaultMaxNewTokens = 128

// generate is POST /generate.
func (f *Fake) generate(w http.ResponseWriter, r *http.Request) {
	raw, _ := io.ReadAll(r.Body)
	f.record(&f.generates, raw)
	var req generateRequest
	if err := json.Unmarshal(raw, &req); err != nil {
		badRequest(w, "body is not JSON: "+err.Error())
		return
	}
	var ids []int
	if len(req.InputIDs) > 0 && json.Unmarshal(req.InputIDs, &ids) != nil {
		writeJSON(w, 400, errorBody("the fake takes one prompt: input_ids must be a list of ints"))
		return
	}
	if (req.Text == nil) == (len(ids) == 0) {
		writeJSON(w, 400, errorBody("Either text, input_ids or input_embeds should be provided."))
		return
	}
	if f.FailNextGenerate.Load() > 0 && f.FailNextGenerate.Add(-1) >= 0 {
		st := f.FailStatus
		if st == 0 {
			st = 500
		}
		writeJSON(w, st, errorBody("fake: injected failure"))
		return
	}
	if req.Text != nil {
		ids = bytesOf(*req.Text)
	}
	out := bytesOf(reply(ids))
	limit, finish := len(out), map[string]any{"type": "stop", "matched": eosID}
	n := defaultMaxNewTokens
	if m, ok := req.SamplingParams["max_new_tokens"]; ok && json.Unmarshal(m, &n) != nil {
		badRequest(w, "sampling_params.max_new_tokens: want an int or null")
		return
	} else if ok && string(m) == "null" {
		n = len(out)
	}
	if n < len(out) {
		limit, finish = n, map[string]any{"type": "length", "length": n}
	}
	out = out[:limit]
	_, version := f.Weights()
	if version == "" {
		version = "default"
	}
	g := answer{req: &req, prompt: len(ids), out: out, version: version, id: fmt.Sprintf("fake-%d", f.generated.Add(1))}
	if !req.Stream {
		time.Sleep(f.Latency)
		writeJSON(w, 200, g.chunk(0, len(out), finish))
		return
	}
	f.stream(w, &g, finish)
}

// eosID is the fake tokenizer's end of sequence, which SGLang reports as
// the matched stop and leaves out of the text.
const eosID = 0

// errorBody is /generate's error answer (_create_error_response).
func errorBody(msg string) map[string]any {
	return map[string]any{"error": map[string]any{"message": msg}}
}

// reply is the fake model: an echo of the last user message the prompt
// ids spell.
func reply(ids []int) string {
	prompt := make([]byte, len(ids))
	for i, id := range ids {
		prompt[i] = byte(id)
	}
	s := string(prompt)
	if i := strings.LastIndex(s, "user:"); i >= 0 {
		s = s[i+len("user:"):]
	}
	return "echo: " + strings.TrimSuffix(s, "\n")
}

func bytesOf(s string) []int {
	out := make([]int, len(s))
	for i := range len(s) {
		out[i] = int(s[i])
	}
	return out
}

// answer builds /generate's output objects.
type answer struct {
	req     *generateRequest
	prompt  int
	out     []int
	version string
	id      string
}

// logprob is the fake's logprob of the i-th sampled token.
func logprob(i int) float64 { return -0.01 - 0.1*float64(i%5) }

func (a *answer) triple(lp float64, id int) []any {
	var text any
	if a.req.ReturnTextInLogprobs {
		text = string(rune(id))
	}
	return []any{lp, id, text}
}

// chunk is the output for sampled tokens [lo, hi), with finish (nil while
// running) and the counts so far.
func (a *answer) chunk(lo, hi int, finish map[string]any) map[string]any {
	meta := map[string]any{"id": a.id, "finish_reason": finish, "prompt_tokens": a.prompt, "completion_tokens": hi,
		"cached_tokens": 0, "weight_version": a.version, "e2e_latency": 0.01}
	if finish == nil {
		meta["finish_reason"] = nil
	}
	if a.req.ReturnLogprob {
		lps, tops := []any{}, []any{}
		for i := lo; i < hi; i++ {
			lps = append(lps, a.triple(logprob(i), a.out[i]))
			var top []any
			for j := range a.req.TopLogprobsNum {
				top = append(top, a.triple(logprob(i)-float64(j), a.out[i]+j))
			}
			tops = append(tops, top)
		}
		meta["output_token_logprobs"] = lps
		meta["input_token_logprobs"] = []any{}
		if a.req.TopLogprobsNum > 0 {
			meta["output_top_logprobs"] = tops
		}
	}
	text := make([]byte, 0, hi-lo)
	for _, id := range a.out[lo:hi] {
		text = append(text, byte(id))
	}
	return map[string]any{"text": string(text), "output_ids": a.out[lo:hi], "meta_info": meta}
}

// stream sends the answer as SGLang streams it: by default each chunk
// holds everything so far (text, output_ids, output logprobs);
// IncrementalStreaming sends only what is new.
func (f *Fake) stream(w http.ResponseWriter, a *answer, finish map[string]any) {
	send, done := fakevllm.EventStream(w)
	const per = 4 // tokens per chunk
	chunks := max(1, (len(a.out)+per-1)/per)
	step := f.Latency / time.Duration(chunks)
	for c := range chunks {
		if f.ErrorChunkAfter > 0 && c >= f.ErrorChunkAfter {
			// A ValueError once the stream started.
			send(errorBody("fake: generation failed"))
			break
		}
		time.Sleep(step)
		hi := min((c+1)*per, len(a.out))
		lo := 0
		if f.IncrementalStreaming {
			lo = c * per
		}
		var fin map[string]any
		if c == chunks-1 {
			fin = finish
		}
		send(a.chunk(lo, hi, fin))
	}
	done()
}
