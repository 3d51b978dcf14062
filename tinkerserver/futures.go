package tinkerserver

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/flywheel-ai/flywheel/tinker"
)

// Request types, as SkyRL tx names them; a seq_id reused for another type
// is a conflict.
const (
	reqCreateModel     = "create_model"
	reqUnloadModel     = "unload_model"
	reqForward         = "forward"
	reqForwardBackward = "forward_backward"
	reqOptimStep       = "optim_step"
	reqSaveWeights     = "save_weights"
	reqLoadWeights     = "load_weights"
	reqSaveForSampler  = "save_weights_for_sampler"
)

// future is one asynchronous request's result.
type future struct {
	id, model, kind string
	// data is the request as stored for deduplication: a retry must send
	// the same.
	data []byte
	done chan struct{}
	// Set once before done closes.
	value    any    // the result, until its first retrieval encodes it
	failure  string // non-empty: the request failed (answered 400)
	finished time.Time
	// The result's JSON, encoded once, by the first retrieval.
	encode sync.Once
	result []byte
}

type seqKey struct {
	model string
	seq   int64
}

// futureStore holds futures until FutureTTL after they finish.
type futureStore struct {
	ttl       time.Duration
	mu        sync.Mutex
	byID      map[string]*future
	bySeq     map[seqKey]*future
	lastPrune time.Time
}

func newFutureStore(ttl time.Duration) *futureStore {
	return &futureStore{ttl: ttl, byID: map[string]*future{}, bySeq: map[seqKey]*future{}, lastPrune: time.Now()}
}

// errSeqReused is SkyRL's 409 for a seq_id sent again with another body.
var errSeqReused = errors.New("Training request sequence number was reused")

// lookupSeq returns the future already recorded for (model, seq), nil if
// none, or errSeqReused when that one was another request.
func (fs *futureStore) lookupSeq(model string, seq *int64, kind string, data []byte) (*future, error) {
	if seq == nil {
		return nil, nil
	}
	fs.mu.Lock()
	defer fs.mu.Unlock()
	f, ok := fs.bySeq[seqKey{model, *seq}]
	if !ok {
		return nil, nil
	}
	if f.kind != kind || !bytes.Equal(f.data, data) {
		return nil, errSeqReused
	}
	return f, nil
}

// add records a new future (and its seq_id, when there is one).
func (fs *futureStore) add(f *future, seq *int64) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.pruneLocked()
	fs.byID[f.id] = f
	if seq != nil {
		fs.bySeq[seqKey{f.model, *seq}] = f
	}
}

func (fs *futureStore) get(id string) *future {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	return fs.byID[id]
}

// pruneLocked forgets futures finished more than ttl ago, at most once per
// tenth of ttl.
func (fs *futureStore) pruneLocked() {
	now := time.Now()
	if now.Sub(fs.lastPrune) < fs.ttl/10 {
		return
	}
	fs.lastPrune = now
	for id, f := range fs.byID {
		select {
		case <-f.done:
			if now.Sub(f.finished) > fs.ttl {
				delete(fs.byID, id)
			}
		default:
		}
	}
	for k, f := range fs.bySeq {
		if _, ok := fs.byID[f.id]; !ok {
			delete(fs.bySeq, k)
		}
	}
}

// finish stores a result or a failure and wakes the waiters. The result
// is encoded by the retrieval that answers it, on its HTTP goroutine, so
// the model's worker goes on to its next request meanwhile.
func (f *future) finish(result any, err error) {
	if err != nil {
		f.failure = err.Error()
	} else {
		f.value = result
	}
	f.finished = time.Now()
	close(f.done)
}

// answer is the finished future's JSON, or why it failed (a result that
// does not encode, such as a NaN, fails the request).
func (f *future) answer() ([]byte, string) {
	f.encode.Do(func() {
		if f.failure != "" {
			return
		}
		var err error
		if f.result, err = tinker.Marshal(f.value); err != nil {
			f.result, f.failure = nil, "encode result: "+err.Error()
		}
		f.value = nil
	})
	return f.result, f.failure
}

// answerFuture is SkyRL's answer to an accepted request.
func answerFuture(c *gin.Context, f *future) {
	c.JSON(http.StatusOK, tinker.FutureResponse{FutureID: f.id, Status: "pending", RequestID: f.id})
}

// retrieveFuture waits up to RetrieveWait for the future's result.
func (s *Server) retrieveFuture(c *gin.Context) {
	var req tinker.RetrieveFutureRequest
	if !decode(c, &req, func(ch *checker) { ch.required(req.RequestID, "request_id") }) {
		return
	}
	f := s.futures.get(req.RequestID)
	if f == nil {
		abort(c, http.StatusNotFound, "Future not found")
		return
	}
	ctx, cancel := context.WithTimeout(c.Request.Context(), s.cfg.RetrieveWait)
	defer cancel()
	select {
	case <-f.done:
	case <-ctx.Done():
		abort(c, http.StatusRequestTimeout, "Timeout waiting for result")
		return
	}
	body, failure := f.answer()
	if failure != "" {
		abort(c, http.StatusBadRequest, failure)
		return
	}
	// With its length declared, the answer is not chunked.
	c.Header("Content-Length", strconv.Itoa(len(body)))
	c.Data(http.StatusOK, "application/json", body)
}
