// Package trajectory turns captured interactions into ATDP steps: the one
// place that knows the stored request/response schema, how rewards bind to
// steps and merge, how returns are discounted, what is redacted and which
// steps may train. The export (GET /v1/trajectories, `flywheel export`),
// the session view and the session workflow's assembly all call Build, so
// what a user exports is what trains.
package trajectory

import (
	"encoding/json"
	"fmt"

	"github.com/flywheel-ai/flywheel/inference"
)

// StoredRequest is an interaction's request JSON as the gateway writes it:
// the neutral request the backend saw, with what the gateway added. (Rows
// captured before migration 00021 also hold the client's body as
// "client_request", which nothing reads.)
type StoredRequest struct {
	*inference.Request
	// InjectedSystem is the artefact text (playbook, harness) the gateway
	// put in front of the client's system prompt.
	InjectedSystem string            `json:"injected_system,omitempty"`
	ToolVersions   map[string]string `json:"tool_versions,omitempty"`
	// Artefacts names the artefact versions the call was served under
	// ("+harness:1+playbook:3", store.ArtefactSuffix): an artefact
	// release's canary compares its candidate's calls with the others'.
	Artefacts string `json:"artefacts,omitempty"`
	Protocol  string `json:"protocol"`
	EndUser   string `json:"end_user,omitempty"`
}

// StoredResponse is the part of an interaction's response JSON (an
// inference.Response without its token ids, which have their own columns)
// a step needs.
type StoredResponse struct {
	Message      inference.Message `json:"message"`
	FinishReason string            `json:"finish_reason"`
}

// DecodeRequest reads a stored request; an empty one is an empty request.
func DecodeRequest(raw []byte) (StoredRequest, error) {
	req := StoredRequest{Request: &inference.Request{}}
	if len(raw) == 0 {
		return req, nil
	}
	if err := json.Unmarshal(raw, &req); err != nil {
		return StoredRequest{Request: &inference.Request{}}, fmt.Errorf("decode stored request: %w", err)
	}
	if req.Request == nil {
		req.Request = &inference.Request{}
	}
	return req, nil
}

// DecodeResponse reads a stored response; an empty or null one is empty.
func DecodeResponse(raw []byte) (StoredResponse, error) {
	var resp StoredResponse
	if len(raw) == 0 || string(raw) == "null" {
		return resp, nil
	}
	if err := json.Unmarshal(raw, &resp); err != nil {
		return StoredResponse{}, fmt.Errorf("decode stored response: %w", err)
	}
	return resp, nil
}
