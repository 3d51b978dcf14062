package upstream

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/internal/fakevllm"
)

// vllmBody is a non-streaming answer the way vLLM writes it with
// logprobs, return_token_ids and return_tokens_as_token_ids.
func vllmBody(tokens int) string {
	var lps, ids []string
	for i := range tokens {
		lps = append(lps, fmt.Sprintf(`{"token":"token_id:%d","logprob":%g,"bytes":[116,111],"top_logprobs":[]}`, 1000+i, -0.01-float64(i%7)*0.37))
		ids = append(ids, fmt.Sprint(1000+i))
	}
	return `{"id":"chatcmpl-9","object":"chat.completion","created":1732000000,"model":"Qwen/Qwen2.5-7B-Instruct",` +
		`"choices":[{"index":0,"message":{"role":"assistant","content":"Line one\n\"quoted\" \u00e9 caf\u00e9 \ud83d\ude00 tab\t.","reasoning_content":null,"tool_calls":[]},` +
		`"logprobs":{"content":[` + strings.Join(lps, ",") + `]},"finish_reason":"stop","stop_reason":null,"token_ids":[` + strings.Join(ids, ",") + `]}],` +
		`"service_tier":null,"system_fingerprint":null,"usage":{"prompt_tokens":12,"total_tokens":` + fmt.Sprint(12+tokens) + `,"completion_tokens":` + fmt.Sprint(tokens) + `,"prompt_tokens_details":null},` +
		`"prompt_logprobs":null,"prompt_token_ids":[1,2,3,4,5,6,7,8,9,10,11,12],"kv_transfer_params":null}`
}

// decodeCases are answers the fast decoder must either decode exactly as
// encoding/json does or hand to it.
var decodeCases = []string{
	vllmBody(0),
	vllmBody(5),
	"  " + vllmBody(3) + "\n",
	`{"model":"m","choices":[{"delta":{"content":"a"},"token_ids":[1],"logprobs":{"content":[{"token":"a","logprob":-0.5}]}}]}`,
	`{"model":"m","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":0}}`,
	`{"model":"m","choices":null,"usage":null,"prompt_token_ids":null}`,
	`{"choices":[{"message":{"content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"f","arguments":"{}"}}]},"finish_reason":"tool_calls"}]}`,
	`{"choices":[{"logprobs":{"content":[{"token":"x","logprob":-1,"top_logprobs":[{"token":"x","logprob":-1},{"token":"y","logprob":-2}]}]}}]}`,
	`{"model":"a","model":"b","choices":[]}`,
	`{"Model":"upper","choices":[]}`,
	`{"MODEL":"m","Choices":[{"Message":{"Content":"c"}}]}`,
	`{"mod\u0065l":"escaped key","choices":[]}`,
	`{"model":"m","choices":[{"token_ids":[1.0,2]}]}`,
	`{"model":"m","choices":[{"token_ids":[1e2]}]}`,
	`{"model":"m","choices":[{"token_ids":[99999999999999999999]}]}`,
	`{"model":"m","choices":[{"token_ids":[01]}]}`,
	`{"model":"m","choices":[{"logprobs":{"content":[{"logprob":1e999}]}}]}`,
	`{"model":"m","choices":[{"logprobs":{"content":[{"logprob":-0}]}}]}`,
	`{"model":"m","choices":[{"logprobs":{"content":[{"logprob":"-1"}]}}]}`,
	`{"model":null,"choices":[{"message":null}]}`,
	`{"model":"bad \x01 control","choices":[]}`,
	"{\"model\":\"invalid \xff utf8\",\"choices\":[]}",
	`{"model":"lone \ud800 surrogate","choices":[]}`,
	`{"model":"m","choices":[]} trailing`,
	`{"model":"m","choices":[],}`,
	`{"model":"m" "choices":[]}`,
	`{"model":"m","choices":[{"index":0,"extra":{"deep":[1,true,false,null,"s",{"a":[]}]}}]}`,
	`{"model":"m","choices":[{"index":0}],"usage":{"prompt_tokens":1,"prompt_tokens":2}}`,
	`[1,2,3]`,
	`null`,
	``,
	`{"model":"m","choices":[{"message":{"content":"\/\b\f\n\r\t\\\"\u0000"}}]}`,
	`{"model":"m","choices":[{"message":{"content":"x"}}],"unknown":tru}`,
	`{"model":"m","choices":[{"finish_reason":null,"message":{"content":"x","reasoning_content":"r"}}]}`,
	`{"model":"m","choices":[{"message":{"content":"a"},"finish_reason":"stop","stop_reason":"END"}]}`,
	`{"model":"m","choices":[{"message":{"content":"a"},"finish_reason":"stop","stop_reason":128001}]}`,
	`{"model":"m","choices":[{"message":{"content":"a"},"finish_reason":"stop","stop_reason":null}]}`,
}

// checkSameAsJSON holds the fast decoder to json.Unmarshal: whenever it
// accepts an input, json accepts it too and decodes the same value.
func checkSameAsJSON(t *testing.T, in []byte) {
	t.Helper()
	var fast wireResponse
	d := fastDecoder{buf: in}
	fastErr := d.response(&fast)
	var ref wireResponse
	refErr := json.Unmarshal(in, &ref)
	if fastErr == nil {
		require.NoError(t, refErr, "fast decoder accepted what encoding/json refuses: %q", in)
		require.Equal(t, ref, fast, "input %q", in)
	}
	// The wrappers are always json's answer, fast path or not.
	var got wireResponse
	require.Equal(t, refErr == nil, unmarshalWire(in, &got) == nil, "input %q", in)
	if refErr == nil {
		require.Equal(t, ref, got, "input %q", in)
	}
	var viaDecoder wireResponse
	decErr := json.NewDecoder(bytes.NewReader(in)).Decode(&viaDecoder)
	got = wireResponse{}
	require.Equal(t, decErr == nil, decodeWire(in, &got) == nil, "input %q", in)
	if decErr == nil {
		require.Equal(t, viaDecoder, got, "input %q", in)
	}
}

func TestDecodeWireMatchesEncodingJSON(t *testing.T) {
	for _, in := range decodeCases {
		checkSameAsJSON(t, []byte(in))
	}
}

// The fast path must actually serve the answers vLLM and the fixture
// send; otherwise every call silently pays for reflection again.
func TestDecodeWireFastPathTakesVLLMAnswers(t *testing.T) {
	for _, in := range []string{vllmBody(0), vllmBody(40), decodeCases[3], decodeCases[4], decodeCases[31]} {
		var w wireResponse
		d := fastDecoder{buf: []byte(in)}
		require.NoError(t, d.response(&w), "input %q", in)
	}
	var w wireResponse
	require.NoError(t, decodeWire([]byte(vllmBody(40)), &w))
	require.Equal(t, "Line one\n\"quoted\" é café 😀 tab\t.", *w.Choices[0].Message.Content)
	require.Len(t, w.Choices[0].TokenIDs, 40)
	require.Len(t, w.Choices[0].Logprobs.Content, 40)
	require.Equal(t, "token_id:1039", w.Choices[0].Logprobs.Content[39].Token)
	require.Equal(t, 40, w.Usage.CompletionTokens)
}

// The fixture that tests and `flywheel bench gateway` run must take the
// fast path too, or the benchmark measures the fallback.
func TestDecodeWireFastPathTakesFixtureAnswers(t *testing.T) {
	srv := httptest.NewServer(&fakevllm.Fixture{})
	defer srv.Close()
	b, err := New(Config{BaseURL: srv.URL + "/v1", Model: "fixture-model", Dialect: deployment.DialectVLLM})
	require.NoError(t, err)
	body, err := json.Marshal(b.wire(&inference.Request{Messages: []inference.Message{{Role: "user", Content: "héllo \"there\"\n"}}}, false))
	require.NoError(t, err)
	resp, err := http.Post(srv.URL+"/v1/chat/completions", "application/json", bytes.NewReader(body))
	require.NoError(t, err)
	defer resp.Body.Close()
	answer, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	var w wireResponse
	d := fastDecoder{buf: answer}
	require.NoError(t, d.response(&w), "answer %s", answer)
	checkSameAsJSON(t, answer)
	require.Len(t, w.Choices[0].Logprobs.Content, len(w.Choices[0].TokenIDs))
}

// Inputs the fast decoder declines still decode, through encoding/json.
func TestDecodeWireFallsBackForToolCalls(t *testing.T) {
	var w wireResponse
	require.NoError(t, decodeWire([]byte(decodeCases[6]), &w))
	require.Len(t, w.Choices[0].Message.ToolCalls, 1)
	require.Equal(t, "f", w.Choices[0].Message.ToolCalls[0].Function.Name)
	require.Error(t, decodeWire([]byte(`{"model":`), &w))
}

func FuzzDecodeWire(f *testing.F) {
	for _, in := range decodeCases {
		f.Add([]byte(in))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		checkSameAsJSON(t, in)
	})
}

func BenchmarkDecodeWire(b *testing.B) {
	body := []byte(vllmBody(32))
	b.Run("fast", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var w wireResponse
			if err := decodeWire(body, &w); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("encoding_json", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			var w wireResponse
			if err := json.NewDecoder(bytes.NewReader(body)).Decode(&w); err != nil {
				b.Fatal(err)
			}
		}
	})
}
