package upstream

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"

	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/inference"
)

// SGLang's OpenAI chat endpoint returns the sampled tokens' text and
// logprobs but not their ids, nor the prompt's (ids there are recent,
// non-streaming first, and still changing). Its native API has carried
// them for years, and it is what RL frameworks on SGLang (slime, AReaL,
// verl) generate through:
//
//  1. POST /v1/tokenize {"model", "messages", "tools"} renders the chat
//     template exactly as /v1/chat/completions does and answers
//     {"tokens", "count", "max_model_len"} (TokenizeRequest in
//     entrypoints/openai/protocol.py);
//  2. POST /generate with GenerateReqInput (managers/io_struct.py):
//     {"input_ids", "sampling_params", "return_logprob": true,
//     "top_logprobs_num", "return_text_in_logprobs", "stream"}. It answers
//     {"text", "output_ids", "meta_info"}, where meta_info holds
//     "finish_reason" ({"type": "stop"|"length"|"abort", …} or null),
//     "prompt_tokens", "completion_tokens", "weight_version" and
//     "output_token_logprobs": one [logprob, token_id, text] per sampled
//     token ("output_top_logprobs": a list of those per position). With
//     "stream": true it sends SSE "data:" lines, each with the text,
//     output_ids and output logprobs so far (or only the new ones under
//     --incremental-streaming-output), then "data: [DONE]"; a failure
//     after the stream started is a {"error": {"message"}} line before
//     [DONE] (entrypoints/http_server.py, managers/tokenizer_manager.py).
//
// So the prompt ids stored are the input_ids the engine generated from,
// and the completion ids and logprobs are the engine's own. SGLang takes
// logprobs after temperature unless SGLANG_RETURN_ORIGINAL_LOGPROB is set
// on the server, which Flywheel's deployments should leave unset.
//
// /generate returns raw text: SGLang's tool-call and reasoning parsers run
// only behind its chat endpoint. A request that offers tools therefore
// goes to /v1/chat/completions, answers without ids, and its sample does
// not train (zero_trainable_tokens), as does every request on a server
// whose /v1/tokenize does not take messages.

// errNoChatTokens means the server cannot give this request's prompt ids
// (its /v1/tokenize takes only a prompt, or it has none): the call goes
// to the chat endpoint instead.
var errNoChatTokens = errors.New("upstream: the server cannot tokenize this chat")

// native reports whether req goes through SGLang's /generate.
func (b *Backend) native(req *inference.Request) bool {
	return b.cfg.Dialect == deployment.DialectSGLang && len(req.Tools) == 0
}

// generateRequest is SGLang's GenerateReqInput, as far as Flywheel sets it.
type generateRequest struct {
	InputIDs       []int          `json:"input_ids"`
	SamplingParams samplingParams `json:"sampling_params"`
	ReturnLogprob  bool           `json:"return_logprob"`
	TopLogprobsNum int            `json:"top_logprobs_num,omitempty"`
	// ReturnTextInLogprobs gives each logprob its token's text, which the
	// client's logprobs carry.
	ReturnTextInLogprobs bool `json:"return_text_in_logprobs"`
	Stream               bool `json:"stream,omitempty"`
}

// samplingParams are SGLang's SamplingParams, named as its chat endpoint
// fills them from an OpenAI request (ChatCompletionRequest.to_sampling_params).
type samplingParams struct {
	// MaxNewTokens is always sent: null is "until the context is full", as
	// on the chat endpoint; omitted, /generate would stop at 128.
	MaxNewTokens     *int               `json:"max_new_tokens"`
	Temperature      *float64           `json:"temperature,omitempty"`
	TopP             *float64           `json:"top_p,omitempty"`
	Stop             []string           `json:"stop,omitempty"`
	FrequencyPenalty *float64           `json:"frequency_penalty,omitempty"`
	PresencePenalty  *float64           `json:"presence_penalty,omitempty"`
	LogitBias        map[string]float64 `json:"logit_bias,omitempty"`
	SamplingSeed     *int64             `json:"sampling_seed,omitempty"`
	// JSONSchema constrains the output to a JSON schema, given as text.
	JSONSchema string `json:"json_schema,omitempty"`
}

// generateCall tokenizes req's prompt and encodes its /generate body.
func (b *Backend) generateCall(ctx context.Context, req *inference.Request, stream bool) (ids []int, body []byte, err error) {
	if ids, err = b.promptIDs(ctx, req); err != nil {
		return nil, nil, err
	}
	g := generateRequest{InputIDs: ids, ReturnLogprob: true, TopLogprobsNum: req.TopLogprobs, ReturnTextInLogprobs: true, Stream: stream,
		SamplingParams: samplingParams{Temperature: req.Temperature, TopP: req.TopP, Stop: req.Stop,
			FrequencyPenalty: req.FrequencyPenalty, PresencePenalty: req.PresencePenalty, LogitBias: req.LogitBias, SamplingSeed: req.Seed}}
	if req.MaxTokens > 0 {
		g.SamplingParams.MaxNewTokens = &req.MaxTokens
	}
	if g.SamplingParams.JSONSchema, err = jsonSchema(req.ResponseFormat); err != nil {
		return nil, nil, err
	}
	if body, err = json.Marshal(g); err != nil {
		return nil, nil, fmt.Errorf("upstream: encode request: %w", err)
	}
	return ids, body, nil
}

// jsonSchema turns OpenAI's response_format into SGLang's json_schema
// sampling parameter, as its chat endpoint does.
func jsonSchema(format json.RawMessage) (string, error) {
	if len(format) == 0 {
		return "", nil
	}
	var f struct {
		Type       string `json:"type"`
		JSONSchema struct {
			Schema json.RawMessage `json:"schema"`
		} `json:"json_schema"`
	}
	if err := json.Unmarshal(format, &f); err != nil {
		return "", &inference.Error{Status: http.StatusBadRequest, Message: "response_format: " + err.Error()}
	}
	switch f.Type {
	case "json_object":
		return `{"type": "object"}`, nil
	case "json_schema":
		if len(f.JSONSchema.Schema) == 0 {
			return "", &inference.Error{Status: http.StatusBadRequest, Message: "response_format: json_schema.schema is required"}
		}
		return string(f.JSONSchema.Schema), nil
	}
	return "", nil
}

// generateOutput is one /generate answer or stream chunk.
type generateOutput struct {
	Error    *wireError `json:"error"`
	Text     *string    `json:"text"`
	MetaInfo struct {
		FinishReason *struct {
			Type    string `json:"type"`
			Message string `json:"message"`
			// Matched is the stop string (or token id) that ended it.
			Matched json.RawMessage `json:"matched"`
		} `json:"finish_reason"`
		PromptTokens        int              `json:"prompt_tokens"`
		CompletionTokens    int              `json:"completion_tokens"`
		WeightVersion       string           `json:"weight_version"`
		OutputTokenLogprobs []tokenLogprob   `json:"output_token_logprobs"`
		OutputTopLogprobs   [][]tokenLogprob `json:"output_top_logprobs"`
	} `json:"meta_info"`
}

// tokenLogprob is SGLang's [logprob, token_id, text] triple; the logprob
// is null where it is -inf (orjson writes no infinities), the text null
// without return_text_in_logprobs.
type tokenLogprob struct {
	Logprob float32
	ID      int
	Text    string
}

// minLogprob stands for -inf, as vLLM clamps it.
const minLogprob = -9999

func (t *tokenLogprob) UnmarshalJSON(b []byte) error {
	var raw []json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	if len(raw) < 2 {
		return fmt.Errorf("token logprob %s: want [logprob, token_id, text]", b)
	}
	var lp *float64
	if err := json.Unmarshal(raw[0], &lp); err != nil {
		return fmt.Errorf("token logprob: %w", err)
	}
	t.Logprob = minLogprob
	if lp != nil && *lp > minLogprob {
		t.Logprob = float32(*lp)
	}
	if err := json.Unmarshal(raw[1], &t.ID); err != nil || t.ID < 0 {
		return fmt.Errorf("token logprob %s: bad token id", b)
	}
	if len(raw) > 2 {
		var text *string
		if err := json.Unmarshal(raw[2], &text); err != nil {
			return fmt.Errorf("token logprob: %w", err)
		}
		if text != nil {
			t.Text = *text
		}
	}
	return nil
}

// finish maps SGLang's finish reason; "abort" is a failure (the engine
// dropped the request), null means still running.
func (g *generateOutput) finish() (string, error) {
	fr := g.MetaInfo.FinishReason
	if fr == nil {
		return "", nil
	}
	if fr.Type == "abort" {
		msg := "upstream aborted the generation"
		if fr.Message != "" {
			msg += ": " + fr.Message
		}
		return "", &inference.Error{Status: http.StatusBadGateway, Message: msg}
	}
	return fr.Type, nil
}

// matched is the stop string that ended the generation ("" for none, or
// a stop token).
func (g *generateOutput) matched() string {
	var s string
	if fr := g.MetaInfo.FinishReason; fr != nil && json.Unmarshal(fr.Matched, &s) == nil {
		return s
	}
	return ""
}

// addTokens appends sampled tokens to resp and d (when not nil).
func addTokens(resp *inference.Response, d *inference.Delta, lps []tokenLogprob, top [][]tokenLogprob) {
	for i, lp := range lps {
		resp.CompletionTokenIDs = append(resp.CompletionTokenIDs, lp.ID)
		resp.Logprobs = append(resp.Logprobs, lp.Logprob)
		resp.CompletionTokens = append(resp.CompletionTokens, lp.Text)
		if d != nil {
			d.TokenIDs = append(d.TokenIDs, lp.ID)
			d.Logprobs = append(d.Logprobs, lp.Logprob)
			d.Tokens = append(d.Tokens, lp.Text)
		}
		if i < len(top) && len(top[i]) > 0 {
			alts := make([]inference.TopLogprob, len(top[i]))
			for j, t := range top[i] {
				alts[j] = inference.TopLogprob{TokenID: t.ID, Token: t.Text, Logprob: t.Logprob}
			}
			resp.TopLogprobs = append(resp.TopLogprobs, alts)
		}
	}
}

// promptIDs asks the server for req's prompt ids; errNoChatTokens when it
// cannot tokenize a chat (an SGLang whose /v1/tokenize takes only a
// prompt answers 400, one without the route 404).
func (b *Backend) promptIDs(ctx context.Context, req *inference.Request) ([]int, error) {
	ids, err := b.tokenize(ctx, req)
	var st statusError
	if errors.As(err, &st) && (st == http.StatusBadRequest || st == http.StatusNotFound || st == http.StatusUnprocessableEntity) {
		return nil, fmt.Errorf("%w: %w", errNoChatTokens, err)
	}
	if err == nil && len(ids) == 0 {
		return nil, &inference.Error{Status: http.StatusBadGateway, Message: "upstream tokenized the prompt to nothing"}
	}
	return ids, err
}

// generate runs one non-streaming generation through /generate.
func (b *Backend) generate(ctx context.Context, req *inference.Request) (*inference.Response, error) {
	ids, body, err := b.generateCall(ctx, req, false)
	if err != nil {
		return nil, err
	}
	var resp *inference.Response
	err = b.retry(ctx, func(ctx context.Context) error {
		httpResp, err := b.postTo(ctx, b.generateURL(), body)
		if err != nil {
			return err
		}
		defer httpResp.Body.Close()
		var g generateOutput
		if err := json.NewDecoder(io.LimitReader(httpResp.Body, maxResponseBytes)).Decode(&g); err != nil || g.Text == nil {
			return &inference.Error{Status: http.StatusBadGateway, Message: "upstream sent an unreadable /generate answer", Err: err}
		}
		if g.Error != nil {
			return &inference.Error{Status: http.StatusBadGateway, Message: "upstream failed: " + g.Error.Message}
		}
		finish, err := g.finish()
		if err != nil {
			return err
		}
		resp = b.generated(ids, &g)
		resp.FinishReason, resp.StopSequence = finish, g.matched()
		resp.Message.Content = *g.Text
		addTokens(resp, nil, g.MetaInfo.OutputTokenLogprobs, g.MetaInfo.OutputTopLogprobs)
		return nil
	})
	return resp, err
}

// generated starts the response to a /generate call on prompt ids.
func (b *Backend) generated(ids []int, g *generateOutput) *inference.Response {
	resp := &inference.Response{PromptTokenIDs: ids, ModelVersion: b.version(""),
		Usage: inference.Usage{PromptTokens: g.MetaInfo.PromptTokens, CompletionTokens: g.MetaInfo.CompletionTokens}}
	resp.Message.Role = inference.RoleAssistant
	return resp
}

// generateURL is /generate at the server's root, beside /v1.
func (b *Backend) generateURL() string {
	return strings.TrimSuffix(b.cfg.BaseURL, "/v1") + "/generate"
}

// streamGenerate runs one streaming generation through /generate.
func (b *Backend) streamGenerate(ctx context.Context, req *inference.Request, emit func(inference.Delta) error) (*inference.Response, error) {
	ids, body, err := b.generateCall(ctx, req, true)
	if err != nil {
		return nil, err
	}
	return b.streamFrom(ctx, b.generateURL(), body, func(r io.Reader, emit func(inference.Delta) error) (*inference.Response, error) {
		return b.readGenerateStream(r, ids, emit)
	}, emit)
}

// readGenerateStream reads /generate's SSE. Each chunk carries either
// everything so far (SGLang's default) or only what is new
// (--incremental-streaming-output); meta_info.completion_tokens, the
// running total in both, tells which.
func (b *Backend) readGenerateStream(r io.Reader, ids []int, emit func(inference.Delta) error) (*inference.Response, error) {
	resp := &inference.Response{PromptTokenIDs: ids, ModelVersion: b.version("")}
	resp.Message.Role = inference.RoleAssistant
	var text strings.Builder
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	for sc.Scan() {
		data, ok := bytes.CutPrefix(sc.Bytes(), []byte("data:"))
		if !ok {
			continue
		}
		data = bytes.TrimSpace(data)
		if string(data) == "[DONE]" {
			resp.Message.Content = text.String()
			return resp, nil
		}
		var g generateOutput
		if err := json.Unmarshal(data, &g); err != nil {
			return resp, &inference.Error{Status: http.StatusBadGateway, Message: "upstream sent an unreadable stream chunk", Err: err}
		}
		if g.Error != nil {
			resp.Message.Content = text.String()
			return resp, &inference.Error{Status: http.StatusBadGateway, Message: "upstream stream failed: " + g.Error.Message}
		}
		finish, err := g.finish()
		if err != nil {
			resp.Message.Content = text.String()
			return resp, err
		}
		n, lps, top := len(resp.CompletionTokenIDs), g.MetaInfo.OutputTokenLogprobs, g.MetaInfo.OutputTopLogprobs
		cumulative := n > 0 && len(lps) == g.MetaInfo.CompletionTokens && len(lps) >= n
		var d inference.Delta
		switch {
		case cumulative:
			lps, top = lps[n:], top[min(n, len(top)):]
			if g.Text != nil {
				fresh, ok := strings.CutPrefix(*g.Text, text.String())
				if !ok {
					return resp, &inference.Error{Status: http.StatusBadGateway, Message: "upstream stream rewrote text it had sent"}
				}
				d.Text = fresh
			}
		case len(lps) == g.MetaInfo.CompletionTokens-n:
			if g.Text != nil {
				d.Text = *g.Text
			}
		default:
			return resp, &inference.Error{Status: http.StatusBadGateway, Message: fmt.Sprintf(
				"upstream stream chunk has %d token logprobs after %d tokens, at %d in all", len(lps), n, g.MetaInfo.CompletionTokens)}
		}
		addTokens(resp, &d, lps, top)
		text.WriteString(d.Text)
		resp.Usage = inference.Usage{PromptTokens: g.MetaInfo.PromptTokens, CompletionTokens: g.MetaInfo.CompletionTokens}
		if finish != "" {
			resp.FinishReason, resp.StopSequence = finish, g.matched()
		}
		if d.Text != "" || len(d.TokenIDs) > 0 {
			if err := emit(d); err != nil {
				resp.Message.Content = text.String()
				return resp, err
			}
		}
	}
	resp.Message.Content = text.String()
	if err := sc.Err(); err != nil {
		return resp, &inference.Error{Status: http.StatusBadGateway, Message: "upstream stream broke", Err: err}
	}
	return resp, &inference.Error{Status: http.StatusBadGateway, Message: "upstream stream ended without [DONE]"}
}
