package fakeskyrl

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// The request types of types.RequestType the fake serves.
const (
	typeCreateModel           = "create_model"
	typeForwardBackward       = "forward_backward"
	typeForward               = "forward"
	typeOptimStep             = "optim_step"
	typeSaveWeightsForSampler = "save_weights_for_sampler"
	typeSaveWeights           = "save_weights"
	typeLoadWeights           = "load_weights"
	typeUnloadModel           = "unload_model"
)

// future is a FutureDB row: a request the engine completes later.
type future struct {
	id      int64
	typ     string
	modelID string
	// data is the request's input as JSON, what create_future compares
	// when a seq_id comes back.
	data []byte
	done chan struct{}
	// Set once, before done is closed.
	failed bool
	result []byte
}

type seqKey struct {
	modelID string
	seqID   int64
}

// errSeqReused is create_future's 409.
const errSeqReused = "Training request sequence number was reused"

// newFutureLocked is create_future: it returns the future already recorded
// for (model_id, seq_id) when the same request comes back, "" and a new
// future otherwise, or errSeqReused. The new future's job is queued on
// the model's worker. s.mu must be held.
func (s *Server) newFutureLocked(typ string, m *modelRecord, seqID *int64, input any, run jobFunc) (*future, string) {
	data, err := json.Marshal(input)
	if err != nil {
		// The inputs are the fake's own structs.
		panic("fakeskyrl: encode request data: " + err.Error())
	}
	if seqID != nil {
		if old, ok := s.seqs[seqKey{m.id, *seqID}]; ok {
			if old.typ != typ || !bytes.Equal(old.data, data) {
				return nil, errSeqReused
			}
			return old, ""
		}
	}
	s.nextRequestID++
	f := &future{id: s.nextRequestID, typ: typ, modelID: m.id, data: data, done: make(chan struct{})}
	s.futures[f.id] = f
	if seqID != nil {
		s.seqs[seqKey{m.id, *seqID}] = f
	}
	if typ != typeCreateModel {
		m.priorRequests++
	}
	m.worker.push(job{future: f, run: run})
	return f, ""
}

// complete stores a future's result (or error) and wakes its waiters.
func (s *Server) complete(f *future, result any, jobErr error) {
	var body []byte
	if jobErr == nil {
		var err error
		if body, err = json.Marshal(result); err != nil {
			jobErr = err
		}
	}
	if jobErr != nil {
		body, _ = json.Marshal(errorResponse{Error: jobErr.Error(), Status: "failed"})
	}
	s.mu.Lock()
	f.failed, f.result = jobErr != nil, body
	s.mu.Unlock()
	close(f.done)
}

func answerFuture(w http.ResponseWriter, f *future) {
	id := strconv.FormatInt(f.id, 10)
	writeJSON(w, http.StatusOK, futureResponse{FutureID: id, Status: "pending", RequestID: id})
}

// retrieveFuture waits up to Config.RetrieveWait for a result: 200 with
// the stored JSON, 400 with a failed request's error, 404 for an unknown
// id, 408 when the wait runs out.
func (s *Server) retrieveFuture(w http.ResponseWriter, r *http.Request) {
	c := &checker{prefix: []any{"body"}}
	var req retrieveFutureRequest
	raw := decodeBody(r, &req, c)
	if raw != nil && req.RequestID == nil {
		c.missing(raw, "request_id")
	}
	if len(c.errs) > 0 {
		writeValidation(w, c.errs)
		return
	}
	id, err := strconv.ParseInt(strings.TrimSpace(*req.RequestID), 10, 64)
	if err != nil {
		// int(request.request_id) raises, and FastAPI answers 500.
		writeInternal(w)
		return
	}
	s.mu.Lock()
	f, ok := s.futures[id]
	s.mu.Unlock()
	if !ok {
		writeDetail(w, http.StatusNotFound, "Future not found")
		return
	}
	timer := time.NewTimer(s.cfg.RetrieveWait)
	defer timer.Stop()
	select {
	case <-f.done:
	case <-timer.C:
		writeDetail(w, http.StatusRequestTimeout, "Timeout waiting for result")
		return
	case <-r.Context().Done():
		return
	}
	s.mu.Lock()
	failed, result := f.failed, f.result
	s.mu.Unlock()
	if failed {
		var e errorResponse
		if err := json.Unmarshal(result, &e); err != nil {
			writeDetail(w, http.StatusInternalServerError, "Unknown error")
			return
		}
		writeDetail(w, http.StatusBadRequest, e.Error)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusOK)
	_, _ = w.Write(result)
}
