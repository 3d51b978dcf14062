package modelserver

import (
	"encoding/json"
	"net/http"

	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/protocol/openai"
)

// tokenizeRequest is vLLM's TokenizeChatRequest or, without messages,
// its TokenizeCompletionRequest (a prompt).
type tokenizeRequest struct {
	Model    string        `json:"model"`
	Prompt   *string       `json:"prompt"`
	Messages []chatMessage `json:"messages"`
	Tools    []openai.Tool `json:"tools"`
	// ToolChoice is not vLLM's, but the policy's template names a required
	// or chosen tool, so a count that must match a completion needs it.
	ToolChoice          json.RawMessage `json:"tool_choice"`
	AddGenerationPrompt *bool           `json:"add_generation_prompt"`
}

type tokenizeResponse struct {
	Count       int   `json:"count"`
	MaxModelLen int   `json:"max_model_len"`
	Tokens      []int `json:"tokens"`
}

// handleTokenize is POST /tokenize: the ids a completion of the same
// messages conditions on (what Engine.CountTokens counts), or a prompt's.
func (s *Server) handleTokenize(w http.ResponseWriter, r *http.Request) {
	var req tokenizeRequest
	if !readJSON(w, r, &req, errBadRequest, "invalid request") {
		return
	}
	_, maxLen, ok := s.resolve(req.Model)
	if !ok {
		modelNotFound(w, req.Model)
		return
	}
	var ids []int
	switch {
	case req.Messages != nil:
		var err error
		if ids, err = s.chatTokens(&req); err != nil {
			writeError(w, http.StatusBadRequest, errBadRequest, err.Error())
			return
		}
	case req.Prompt != nil:
		ids = s.engine.Encode(*req.Prompt)
	default:
		writeError(w, http.StatusBadRequest, errBadRequest, "either messages or prompt is required")
		return
	}
	writeJSON(w, http.StatusOK, tokenizeResponse{Count: len(ids), MaxModelLen: maxLen, Tokens: ids})
}

func (s *Server) chatTokens(req *tokenizeRequest) ([]int, error) {
	msgs, err := messages(req.Messages)
	if err != nil {
		return nil, err
	}
	tls, err := tools(req.Tools)
	if err != nil {
		return nil, err
	}
	choice, err := toolChoice(req.ToolChoice)
	if err != nil {
		return nil, err
	}
	withGenerationPrompt := req.AddGenerationPrompt == nil || *req.AddGenerationPrompt
	return s.engine.PromptTokens(&inference.Request{Messages: msgs, Tools: tls, ToolChoice: choice}, withGenerationPrompt)
}
