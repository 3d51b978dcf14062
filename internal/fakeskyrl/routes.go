package fakeskyrl

import (
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
)

const errModelNotFound = "Model not found"

func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

func (s *Server) serverCapabilities(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, serverCapabilities{SupportedModels: []supportedModel{{ModelName: s.cfg.BaseModel}}})
}

// clientConfig is SkyRL's stub of the SDK's handshake.
func (s *Server) clientConfig(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]bool{"pjwt_auth_enabled": false})
}

// telemetry acknowledges and drops the SDK's events, as SkyRL does.
func (s *Server) telemetry(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "accepted"})
}

func (s *Server) createSession(w http.ResponseWriter, r *http.Request) {
	c := &checker{prefix: []any{"body"}}
	var req createSessionRequest
	if raw := decodeBody(r, &req, c); raw != nil {
		if req.Tags == nil {
			c.missing(raw, "tags")
		}
		if req.SDKVersion == nil {
			c.missing(raw, "sdk_version")
		}
	}
	if len(c.errs) > 0 {
		writeValidation(w, c.errs)
		return
	}
	id := newID("session")
	s.mu.Lock()
	s.sessions[id] = true
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, createSessionResponse{Type: "create_session", SessionID: id})
}

func (s *Server) sessionHeartbeat(w http.ResponseWriter, r *http.Request) {
	c := &checker{prefix: []any{"body"}}
	var req sessionHeartbeatRequest
	if raw := decodeBody(r, &req, c); raw != nil && req.SessionID == nil {
		c.missing(raw, "session_id")
	}
	if len(c.errs) > 0 {
		writeValidation(w, c.errs)
		return
	}
	s.mu.Lock()
	ok := s.sessions[*req.SessionID]
	s.mu.Unlock()
	if !ok {
		writeDetail(w, http.StatusNotFound, "Session not found")
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"type": "session_heartbeat"})
}

func (s *Server) createModel(w http.ResponseWriter, r *http.Request) {
	c := &checker{prefix: []any{"body"}}
	var req createModelRequest
	if raw := decodeBody(r, &req, c); raw != nil {
		if req.SessionID == nil {
			c.missing(raw, "session_id")
		}
		if req.BaseModel == nil {
			c.missing(raw, "base_model")
		}
		if req.LoraConfig == nil {
			c.missing(raw, "lora_config")
		} else if req.LoraConfig.Rank == nil {
			c.missing(raw["lora_config"], "lora_config", "rank")
		}
	}
	if len(c.errs) > 0 {
		writeValidation(w, c.errs)
		return
	}
	role := "policy"
	if req.ModelRole != nil {
		role = *req.ModelRole
	}
	seed := rand.Int64N(1 << 31)
	if req.LoraConfig.Seed != nil {
		seed = *req.LoraConfig.Seed
	}

	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.sessions[*req.SessionID] {
		writeDetail(w, http.StatusNotFound, "Session not found")
		return
	}
	m := &modelRecord{
		id:        newID("model"),
		sessionID: *req.SessionID,
		baseModel: *req.BaseModel,
		loraIn:    *req.LoraConfig,
		lora:      loraConfig{Rank: *req.LoraConfig.Rank, Alpha: loraAlpha, Seed: seed, TrainAttn: true, TrainMLP: true},
		status:    "created",
		worker:    newWorker(),
	}
	s.models[m.id] = m
	go s.run(s.ctx, m.worker)
	input := map[string]any{"lora_config": m.lora, "model_role": role}
	f, _ := s.newFutureLocked(typeCreateModel, m, nil, input, s.createModelJob(m, role))
	writeJSON(w, http.StatusOK, createModelResponse{
		ModelID:    m.id,
		BaseModel:  m.baseModel,
		LoraConfig: m.loraIn,
		Status:     "created",
		RequestID:  strconv.FormatInt(f.id, 10),
	})
}

// decodeModelID decodes a body whose one required field is model_id.
func decodeModelID(w http.ResponseWriter, r *http.Request) (string, bool) {
	c := &checker{prefix: []any{"body"}}
	var req modelIDRequest
	if raw := decodeBody(r, &req, c); raw != nil && req.ModelID == nil {
		c.missing(raw, "model_id")
	}
	if len(c.errs) > 0 {
		writeValidation(w, c.errs)
		return "", false
	}
	return *req.ModelID, true
}

func (s *Server) unloadModel(w http.ResponseWriter, r *http.Request) {
	modelID, ok := decodeModelID(w, r)
	if !ok {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.models[modelID]
	if !ok {
		writeDetail(w, http.StatusNotFound, errModelNotFound)
		return
	}
	m.status = "unloading"
	f, _ := s.newFutureLocked(typeUnloadModel, m, nil, struct{}{}, s.unloadModelJob(m))
	writeJSON(w, http.StatusOK, unloadModelResponse{RequestID: strconv.FormatInt(f.id, 10), ModelID: m.id})
}

func (s *Server) getInfo(w http.ResponseWriter, r *http.Request) {
	modelID, ok := decodeModelID(w, r)
	if !ok {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.models[modelID]
	if !ok {
		writeDetail(w, http.StatusNotFound, errModelNotFound)
		return
	}
	rank := m.lora.Rank
	writeJSON(w, http.StatusOK, modelInfoResponse{
		ModelID:   m.id,
		Status:    m.status,
		ModelData: modelData{BaseModel: m.baseModel, LoraConfig: loraConfigIn{Rank: &rank}, ModelName: m.baseModel},
	})
}

// forwardBackward validates its body itself, as SkyRL does to accept
// proto bodies, so its 422 locations carry no "body" prefix.
func (s *Server) forwardBackward(w http.ResponseWriter, r *http.Request) {
	c := &checker{}
	var req forwardBackwardRequest
	raw := decodeBody(r, &req, c)
	if raw != nil && req.ModelID == nil {
		c.missing(raw, "model_id")
	}
	var in *passInput
	var inErr error
	if raw != nil {
		in, inErr = checkPassInput(c, req.ForwardBackwardInput, raw, "forward_backward_input")
	}
	if len(c.errs) > 0 {
		writeValidation(w, c.errs)
		return
	}
	s.submitPass(w, typeForwardBackward, *req.ModelID, req.SeqID, in, inErr)
}

func (s *Server) forward(w http.ResponseWriter, r *http.Request) {
	c := &checker{prefix: []any{"body"}}
	var req forwardRequest
	raw := decodeBody(r, &req, c)
	if raw != nil && req.ModelID == nil {
		c.missing(raw, "model_id")
	}
	var in *passInput
	var inErr error
	if raw != nil {
		in, inErr = checkPassInput(c, req.ForwardInput, raw, "forward_input")
	}
	if len(c.errs) > 0 {
		writeValidation(w, c.errs)
		return
	}
	s.submitPass(w, typeForward, *req.ModelID, req.SeqID, in, inErr)
}

func (s *Server) submitPass(w http.ResponseWriter, typ, modelID string, seqID *int64, in *passInput, inErr error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.models[modelID]
	if !ok {
		writeDetail(w, http.StatusNotFound, errModelNotFound)
		return
	}
	if inErr != nil {
		writeInternal(w)
		return
	}
	f, reused := s.newFutureLocked(typ, m, seqID, in, s.passJob(m.id, in, typ == typeForwardBackward))
	if reused != "" {
		writeDetail(w, http.StatusConflict, reused)
		return
	}
	answerFuture(w, f)
}

func (s *Server) optimStep(w http.ResponseWriter, r *http.Request) {
	c := &checker{prefix: []any{"body"}}
	var req optimStepRequest
	var params adamParams
	if raw := decodeBody(r, &req, c); raw != nil {
		if req.ModelID == nil {
			c.missing(raw, "model_id")
		}
		params = checkAdamParams(c, req.AdamParams, raw, "adam_params")
	}
	if len(c.errs) > 0 {
		writeValidation(w, c.errs)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.models[*req.ModelID]
	if !ok {
		writeDetail(w, http.StatusNotFound, errModelNotFound)
		return
	}
	f, reused := s.newFutureLocked(typeOptimStep, m, req.SeqID, optimInput{AdamParams: params}, s.optimStepJob(m, params))
	if reused != "" {
		writeDetail(w, http.StatusConflict, reused)
		return
	}
	answerFuture(w, f)
}

func (s *Server) saveWeights(w http.ResponseWriter, r *http.Request) {
	c := &checker{prefix: []any{"body"}}
	var req saveWeightsRequest
	if raw := decodeBody(r, &req, c); raw != nil {
		if req.ModelID == nil {
			c.missing(raw, "model_id")
		}
		if req.Path == nil {
			c.missing(raw, "path")
		} else {
			c.idField(*req.Path, "path")
		}
	}
	if len(c.errs) > 0 {
		writeValidation(w, c.errs)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.models[*req.ModelID]
	if !ok {
		// create_checkpoint's own message, not get_model's.
		writeDetail(w, http.StatusNotFound, fmt.Sprintf("Model '%s' not found", *req.ModelID))
		return
	}
	ck, status, detail := s.createCheckpointLocked(m.id, *req.Path, checkpointTraining)
	if status != 0 {
		writeDetail(w, status, detail)
		return
	}
	f, _ := s.newFutureLocked(typeSaveWeights, m, nil, map[string]string{"path": ck.id}, s.saveWeightsJob(m, ck))
	answerFuture(w, f)
}

func (s *Server) saveWeightsForSampler(w http.ResponseWriter, r *http.Request) {
	c := &checker{prefix: []any{"body"}}
	var req saveWeightsForSamplerRequest
	if raw := decodeBody(r, &req, c); raw != nil {
		if req.ModelID == nil {
			c.missing(raw, "model_id")
		}
		if req.Path != nil {
			c.idField(*req.Path, "path")
		}
		if len(c.errs) == 0 && (req.Path == nil || *req.Path == "") && (req.SamplingSessionSeqID == nil || req.SeqID == nil) {
			c.add("value_error", "Value error, Either 'path' or both 'sampling_session_seq_id' and 'seq_id' must be provided", raw)
		}
	}
	if len(c.errs) > 0 {
		writeValidation(w, c.errs)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.models[*req.ModelID]
	if !ok {
		writeDetail(w, http.StatusNotFound, errModelNotFound)
		return
	}
	var name string
	if req.Path != nil && *req.Path != "" {
		name = *req.Path
	} else {
		name = fmt.Sprintf("ss%d_seq%d", *req.SamplingSessionSeqID, *req.SeqID)
	}
	transient := req.SamplingSessionSeqID != nil && req.SeqID != nil
	var samplingSessionID *string
	if transient {
		id := newID("sampling")
		samplingSessionID = &id
	}
	ck, status, detail := s.createCheckpointLocked(m.id, name, checkpointSampler)
	if status != 0 {
		writeDetail(w, status, detail)
		return
	}
	input := map[string]any{
		"path": name, "sampling_session_seq_id": req.SamplingSessionSeqID, "seq_id": req.SeqID,
		"sampling_session_id": samplingSessionID,
	}
	f, _ := s.newFutureLocked(typeSaveWeightsForSampler, m, nil, input,
		s.saveWeightsForSamplerJob(m, ck, transient, samplingSessionID))
	answerFuture(w, f)
}

// loadWeights is permitted only as a model's first request after
// create_model, and only from a completed training checkpoint.
func (s *Server) loadWeights(w http.ResponseWriter, r *http.Request) {
	c := &checker{prefix: []any{"body"}}
	var req loadWeightsRequest
	if raw := decodeBody(r, &req, c); raw != nil {
		if req.ModelID == nil {
			c.missing(raw, "model_id")
		}
		if req.Path == nil {
			c.missing(raw, "path")
		}
	}
	if len(c.errs) > 0 {
		writeValidation(w, c.errs)
		return
	}
	optimizer := req.Optimizer == nil || *req.Optimizer

	s.mu.Lock()
	defer s.mu.Unlock()
	m, ok := s.models[*req.ModelID]
	if !ok {
		writeDetail(w, http.StatusNotFound, errModelNotFound)
		return
	}
	if m.priorRequests > 0 {
		seq := int64(m.priorRequests + 1)
		if req.SeqID != nil {
			seq = *req.SeqID
		}
		writeDetail(w, http.StatusBadRequest, fmt.Sprintf("LoadWeights is not permitted with seq_id %d", seq))
		return
	}
	p, ok := parseTinkerPath(*req.Path)
	if !ok || p.kind != "weights" || p.primary == "" || p.secondary == "" {
		writeDetail(w, http.StatusBadRequest, "request.path must be in format tinker://source_model_id/weights/checkpoint_id")
		return
	}
	source := checkpointKey{modelID: p.primary, id: p.secondary, typ: checkpointTraining}
	if _, status, detail := s.validateCheckpointLocked(source); status != 0 {
		writeDetail(w, status, detail)
		return
	}
	input := map[string]any{"source_model_id": source.modelID, "checkpoint_id": source.id, "load_optimizer": optimizer}
	f, _ := s.newFutureLocked(typeLoadWeights, m, nil, input, s.loadWeightsJob(m, source, optimizer))
	answerFuture(w, f)
}
