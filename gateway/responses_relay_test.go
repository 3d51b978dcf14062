package gateway_test

import (
	"context"
	"encoding/json"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"
	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/atdp"
	"github.com/flywheel-ai/flywheel/internal/fakeresponses"
)

// gptDeployment registers deployment "gpt" on a fake of OpenAI's
// Responses API that wants the key the deployment names in api_key_env.
func gptDeployment(t *testing.T, e *env) *fakeresponses.Fake {
	t.Helper()
	t.Setenv("FLYWHEEL_TEST_OPENAI_KEY", "sk-openai-gateway")
	fake := &fakeresponses.Fake{Key: "sk-openai-gateway"}
	srv := httptest.NewServer(fake)
	t.Cleanup(srv.Close)
	st, out := e.doJSON("POST", "/admin/v1/deployments", e.cfg.AdminKey, map[string]any{"name": "gpt",
		"upstream": map[string]any{"base_url": srv.URL + "/v1", "model": "gpt-5-mini", "dialect": "openai", "responses": true,
			"api_key_env": "FLYWHEEL_TEST_OPENAI_KEY", "retries": 0}})
	require.Equal(t, 201, st, out)
	return fake
}

var sseDottedName = regexp.MustCompile(`(?m)^event: ([\w.]+)$`)

func eventNames(raw []byte) []string {
	var names []string
	for _, m := range sseDottedName.FindAllStringSubmatch(string(raw), -1) {
		names = append(names, m[1])
	}
	return names
}

// TestResponsesDeploymentRelaysTheBody: a Responses call on a deployment
// whose OpenAI server speaks the API reaches /v1/responses as the client
// sent it but for the model (hosted tools, reasoning, include, an image
// included) with the deployment's key; the answer and its id are the
// server's; the stream's events come back in the server's order; a chain
// by previous_response_id is the server's conversation and the gateway's
// one session; GET and DELETE reach the server; the steps are captured
// and will not train, a hosted model giving no token ids.
func TestResponsesDeploymentRelaysTheBody(t *testing.T) {
	e := newEnv(t, envOpts{})
	fake := gptDeployment(t, e)
	body := `{"model":"gpt","instructions":"be brief","store":true,` +
		`"reasoning":{"effort":"low","summary":"auto"},"include":["reasoning.encrypted_content","web_search_call.action.sources"],` +
		`"tools":[{"type":"web_search"}],` +
		`"input":[{"role":"user","content":[{"type":"input_image","image_url":"data:image/png;base64,iVBORw0KGgo="},` +
		`{"type":"input_text","text":"what is this?"}]}]}`
	st, _, raw := e.do("POST", "/v1/responses", e.keyA, body, "X-Session-Id", "gpt-1")
	require.Equal(t, 200, st, string(raw))
	got := fake.Requests()
	require.Len(t, got, 1)
	require.Equal(t, "/v1/responses", got[0].Path)
	require.Equal(t, strings.Replace(body, `"model":"gpt"`, `"model":"gpt-5-mini"`, 1), string(got[0].Body))
	require.Equal(t, "Bearer sk-openai-gateway", got[0].Header.Get("Authorization"), "the deployment's key, not the client's")

	var resp map[string]any
	require.NoError(t, json.Unmarshal(raw, &resp))
	id := resp["id"].(string)
	require.Equal(t, "resp_fake000001", id, "the server's id: the response lives there")
	require.Equal(t, "gpt-5-mini-2025-01-01", resp["model"])
	row := e.captured(id)
	require.Equal(t, "ok", row.Status)
	require.Equal(t, "responses", row.Protocol)
	require.Empty(t, row.CompletionIDs)
	require.Contains(t, string(row.Request), `[input_image]\nwhat is this?`, "the image is recorded as its placeholder")
	require.Contains(t, string(row.Response), `"content": "echo: what is this?"`)

	// Streamed: the server's events in its order, the call captured.
	stream := strings.Replace(body, `"store":true,`, `"store":true,"stream":true,`, 1)
	st, _, raw = e.do("POST", "/v1/responses", e.keyA, stream, "X-Session-Id", "gpt-1")
	require.Equal(t, 200, st, string(raw))
	require.Equal(t, []string{"response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
		"response.output_text.delta", "response.output_text.delta", "response.output_text.delta", "response.output_text.delta",
		"response.output_text.done", "response.content_part.done", "response.output_item.done", "response.completed"}, eventNames(raw))
	require.Equal(t, strings.Replace(stream, `"model":"gpt"`, `"model":"gpt-5-mini"`, 1), string(fake.Requests()[1].Body))
	require.True(t, e.captured("resp_fake000002").Stream)

	// With the SDK: a chain the server resolves, in one session.
	ctx := context.Background()
	c := e.openai(e.keyA)
	first, err := c.Responses.New(ctx, responses.ResponseNewParams{Model: "gpt",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("hello")}})
	require.NoError(t, err)
	require.Equal(t, "echo: hello", first.OutputText())
	second, err := c.Responses.New(ctx, responses.ResponseNewParams{Model: "gpt", PreviousResponseID: openai.String(first.ID),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("again")}})
	require.NoError(t, err)
	require.Equal(t, "echo: again (turn 2)", second.OutputText(), "the server saw the whole conversation")
	require.Contains(t, string(fake.Requests()[3].Body), `"previous_response_id":"`+first.ID+`"`)
	require.Equal(t, e.captured(first.ID).SessionID, e.captured(second.ID).SessionID, "a chain is one session")

	streamed := c.Responses.NewStreaming(ctx, responses.ResponseNewParams{Model: "gpt", PreviousResponseID: openai.String(second.ID),
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("streamed")}})
	var kinds []string
	var final responses.Response
	for streamed.Next() {
		ev := streamed.Current()
		kinds = append(kinds, ev.Type)
		if ev.Type == "response.completed" {
			final = ev.Response
		}
	}
	require.NoError(t, streamed.Err())
	require.Equal(t, "response.created", kinds[0])
	require.Equal(t, "response.completed", kinds[len(kinds)-1])
	require.Equal(t, "echo: streamed (turn 3)", final.OutputText())
	require.Equal(t, e.captured(first.ID).SessionID, e.captured(final.ID).SessionID)

	// GET and DELETE reach the server; another tenant reaches nothing.
	read, err := c.Responses.Get(ctx, second.ID, responses.ResponseGetParams{})
	require.NoError(t, err)
	require.Equal(t, "echo: again (turn 2)", read.OutputText())
	st, _ = e.doJSON("GET", "/v1/responses/"+second.ID, e.keyB, nil)
	require.Equal(t, 404, st)
	st, _ = e.doJSON("POST", "/v1/responses", e.keyB, map[string]any{"model": "gpt", "input": "x", "previous_response_id": second.ID})
	require.Equal(t, 404, st, "another tenant cannot continue the response at the server")
	require.NoError(t, c.Responses.Delete(ctx, second.ID))
	require.False(t, fake.Stored(second.ID))
	_, err = c.Responses.Get(ctx, second.ID, responses.ResponseGetParams{})
	var apiErr *openai.Error
	require.ErrorAs(t, err, &apiErr)
	require.Equal(t, 404, apiErr.StatusCode)

	st, _ = e.doJSON("POST", "/v1/feedback", e.keyA, map[string]any{"completion_id": id, "value": 1})
	require.Equal(t, 201, st)
	st, view := e.doJSON("GET", "/v1/sessions/gpt-1", e.keyA, nil)
	require.Equal(t, 200, st, view)
	steps := view["steps"].([]any)
	require.Len(t, steps, 2)
	step := steps[0].(map[string]any)
	require.Equal(t, false, step["will_train"], step)
	require.Equal(t, atdp.ReasonZeroTrainableTokens, step["reason"], "a hosted model's step has no ids, as the openai dialect's")
}

// TestResponsesDeploymentErrors: the server's errors reach the client in
// OpenAI's shape with the status and retry-after its SDK acts on; a
// refused deployment key is a 502, not the client's 401; a stream that
// breaks off or fails ends with an error event and is captured as an
// error.
func TestResponsesDeploymentErrors(t *testing.T) {
	e := newEnv(t, envOpts{})
	fake := gptDeployment(t, e)
	body := `{"model":"gpt","input":"hello world"}`
	for _, tc := range []struct {
		fail         fakeresponses.Failure
		status       int
		kind         string
		retryAfter   string
		messageParts string
	}{
		{fakeresponses.Failure{Status: 400, Type: "invalid_request_error", Message: "Unsupported parameter: 'temperature'"}, 400, "invalid_request_error", "", "Unsupported parameter"},
		{fakeresponses.Failure{Status: 401, Type: "invalid_request_error", Code: "invalid_api_key", Message: "Incorrect API key provided."}, 502, "server_error", "", "deployment's credentials"},
		{fakeresponses.Failure{Status: 429, Type: "rate_limit_error", Code: "rate_limit_exceeded", Message: "slow down", RetryAfter: "7"}, 429, "rate_limit_error", "7", "slow down"},
		{fakeresponses.Failure{Status: 500, Type: "server_error", Message: "The server had an error"}, 500, "server_error", "", "The server had an error"},
		{fakeresponses.Failure{Status: 503, Type: "server_error", Message: "overloaded"}, 503, "service_unavailable", "", "overloaded"},
	} {
		fake.Fail(tc.fail)
		st, hdr, raw := e.do("POST", "/v1/responses", e.keyA, body)
		require.Equal(t, tc.status, st, string(raw))
		require.Equal(t, tc.retryAfter, hdr.Get("Retry-After"), tc.fail.Message)
		var out struct {
			Error struct{ Type, Message string }
		}
		require.NoError(t, json.Unmarshal(raw, &out), string(raw))
		require.Equal(t, tc.kind, out.Error.Type, string(raw))
		require.Contains(t, out.Error.Message, tc.messageParts)
	}

	c := e.openai(e.keyA)
	fake.Fail(fakeresponses.Failure{Status: 429, Type: "rate_limit_error", Message: "slow down", RetryAfter: "2"})
	_, err := c.Responses.New(context.Background(), responses.ResponseNewParams{Model: "gpt",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("x")}})
	var apiErr *openai.Error
	require.ErrorAs(t, err, &apiErr)
	require.Equal(t, 429, apiErr.StatusCode)
	require.Equal(t, "rate_limit_error", apiErr.Type)

	calls := len(fake.Requests())
	st, _ := e.doJSON("POST", "/v1/responses", e.keyA, map[string]any{"model": "gpt", "input": "x", "previous_response_id": "resp_unknown"})
	require.Equal(t, 404, st)
	own, err := c.Responses.New(context.Background(), responses.ResponseNewParams{Model: fixtureModel,
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String("x")}})
	require.NoError(t, err)
	st, out := e.doJSON("POST", "/v1/responses", e.keyA, map[string]any{"model": "gpt", "input": "x", "previous_response_id": own.ID})
	require.Equal(t, 400, st, out)
	require.Contains(t, out["error"].(map[string]any)["message"], "answered by the gateway")
	require.Len(t, fake.Requests(), calls, "an id the server does not hold is not sent on")

	fake.Fail(fakeresponses.Failure{Status: 429, Type: "rate_limit_error", Message: "slow down", RetryAfter: "3"})
	st, hdr, raw := e.do("POST", "/v1/responses", e.keyA, `{"model":"gpt","input":"x","stream":true}`)
	require.Equal(t, 429, st, "a stream refused before its first event is an HTTP error")
	require.Equal(t, "3", hdr.Get("Retry-After"), string(raw))

	for name, set := range map[string]func(){"cut": func() { fake.Break(5, 0) }, "error event": func() { fake.Break(0, 5) }} {
		set()
		st, _, raw := e.do("POST", "/v1/responses", e.keyA, `{"model":"gpt","input":"hello world","stream":true}`)
		require.Equal(t, 200, st, name)
		text := string(raw)
		names := eventNames(raw)
		require.Equal(t, "error", names[len(names)-1], "%s: %s", name, text)
		require.NotContains(t, text, "response.completed", name)
		start := strings.Index(text, "data: ") + len("data: ")
		var ev struct{ Response struct{ ID string } }
		require.NoError(t, json.Unmarshal([]byte(text[start:strings.Index(text[start:], "\n")+start]), &ev), name)
		row := e.captured(ev.Response.ID)
		require.Equal(t, "upstream_error", row.Status, name)
		require.Contains(t, string(row.Response), "echo:", "%s: what came before the break is kept", name)
	}
}

// TestResponsesDeploymentAppliesArtefacts: the serving harness goes in
// front of a relayed body's instructions and the tenant's tool-schema
// override into its function tool, every other byte as sent.
func TestResponsesDeploymentAppliesArtefacts(t *testing.T) {
	e := newEnv(t, envOpts{})
	fake := gptDeployment(t, e)
	_, err := e.pool.Exec(context.Background(), `INSERT INTO artefacts (deployment, kind, version, content, status) VALUES
		('gpt', 'harness', 1, '{"system_prompt":"serving harness"}', 'serving'),
		('gpt', 'tool_schema', 2, '{"tenants":{"acme":{"search":{"description":"Search the web."}}}}', 'serving')`)
	require.NoError(t, err)
	body := `{"model":"gpt","instructions":"be brief","tools":[{"type":"function","name":"search","description":"old","parameters":{"type":"object"}},{"type":"web_search"}],"input":"hi"}`
	st, _, raw := e.do("POST", "/v1/responses", e.keyA, body)
	require.Equal(t, 200, st, string(raw))
	require.Equal(t, `{"model":"gpt-5-mini","instructions":"serving harness\n\nbe brief","tools":[{"type":"function","name":"search","description":"Search the web.","parameters":{"type":"object"}},{"type":"web_search"}],"input":"hi"}`,
		string(fake.Requests()[0].Body))
	var resp struct{ ID string }
	require.NoError(t, json.Unmarshal(raw, &resp))
	row := e.captured(resp.ID)
	require.Contains(t, string(row.Request), `"injected_system": "serving harness"`)
	require.Contains(t, string(row.Request), `"search": "2"`, "the tool's version")
}
