package tinker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Client drives one Tinker service. Every call retries what may pass on a
// later try (a connection error, 408, 409, 429, 5xx) with exponential
// backoff and jitter, honouring Retry-After, as Tinker's own SDK does; an
// answer that will not change is an *APIError with Retryable false.
type Client struct {
	// BaseURL is the service root, e.g. https://tinker.example.com (the
	// routes add /api/v1/...).
	BaseURL string
	// APIKey goes in the X-API-Key header (empty: none).
	APIKey string
	// HTTP defaults to a client without an overall timeout: retrieve_future
	// long-polls, and each poll is bounded by PollTimeout.
	HTTP *http.Client
	// Retry bounds the retries of one call.
	Retry RetryPolicy
	// PollTimeout bounds one retrieve_future request (default 60 s; the
	// server answers 408 sooner when it holds a poll for less).
	PollTimeout time.Duration
	// OnWait is called while a call waits (each poll, each backoff): an
	// activity heartbeats from it. Nil: nothing.
	OnWait func()
	// sleep is time.Sleep with ctx; tests replace it.
	sleep func(ctx context.Context, d time.Duration) error
}

// RetryPolicy is the backoff of retried calls: Initial, doubling up to Max,
// each wait drawn uniformly from its upper half (jitter), until MaxElapsed
// has passed since the call began.
type RetryPolicy struct {
	Initial    time.Duration
	Max        time.Duration
	MaxElapsed time.Duration
}

func (p RetryPolicy) withDefaults() RetryPolicy {
	if p.Initial <= 0 {
		p.Initial = 500 * time.Millisecond
	}
	if p.Max <= 0 {
		p.Max = 10 * time.Second
	}
	if p.MaxElapsed <= 0 {
		p.MaxElapsed = 10 * time.Minute
	}
	return p
}

// New is a client of the service at baseURL.
func New(baseURL, apiKey string) *Client {
	return &Client{BaseURL: strings.TrimRight(baseURL, "/"), APIKey: apiKey}
}

// APIError is an answer the service gave, or the last one of a call whose
// retries ran out.
type APIError struct {
	// Op is the route, RequestID the future where one was being read.
	Op        string
	RequestID string
	Status    int
	Detail    string
	// Retryable is true for an answer that may change on a later try of
	// the whole operation (the service was overloaded or failed on its
	// side), false for one that will not (the request is wrong).
	Retryable bool
}

func (e *APIError) Error() string {
	s := fmt.Sprintf("tinker %s", e.Op)
	if e.RequestID != "" {
		s += " (request " + e.RequestID + ")"
	}
	if e.Status != 0 {
		s += fmt.Sprintf(": HTTP %d", e.Status)
	}
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

// retryableStatus is what Tinker's SDK retries.
func retryableStatus(code int) bool {
	return code == http.StatusRequestTimeout || code == http.StatusConflict || code == http.StatusTooManyRequests || code >= 500
}

// post sends in to path and decodes the 2xx answer into out, retrying.
func (c *Client) post(ctx context.Context, path string, in, out any) error {
	body, err := Marshal(in)
	if err != nil {
		return fmt.Errorf("tinker %s: encode: %w", path, err)
	}
	return c.call(ctx, http.MethodPost, path, body, out)
}

// get reads path into out, retrying.
func (c *Client) get(ctx context.Context, path string, out any) error {
	return c.call(ctx, http.MethodGet, path, nil, out)
}

func (c *Client) call(ctx context.Context, method, path string, body []byte, out any) error {
	p := c.Retry.withDefaults()
	start := time.Now()
	for try := 0; ; try++ {
		status, data, hdr, err := c.roundTrip(ctx, method, path, body, 0)
		if err == nil && status/100 == 2 {
			if out == nil {
				return nil
			}
			if err := Unmarshal(data, out); err != nil {
				return &APIError{Op: path, Status: status, Detail: "undecodable answer: " + err.Error(), Retryable: true}
			}
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		last := &APIError{Op: path, Status: status, Retryable: true}
		if err != nil {
			last.Detail = err.Error()
		} else {
			last.Detail = detailText(data)
			if !retryableStatus(status) {
				last.Retryable = false
				return last
			}
		}
		wait := backoff(p, try, hdr)
		if time.Since(start)+wait > p.MaxElapsed {
			last.Detail += fmt.Sprintf(" (gave up after %d tries in %s)", try+1, time.Since(start).Round(time.Millisecond))
			return last
		}
		if err := c.wait(ctx, wait); err != nil {
			return err
		}
	}
}

// roundTrip makes one request; timeout > 0 bounds it.
func (c *Client) roundTrip(ctx context.Context, method, path string, body []byte, timeout time.Duration) (int, []byte, http.Header, error) {
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.BaseURL+path, rd)
	if err != nil {
		return 0, nil, nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	if c.APIKey != "" {
		req.Header.Set("X-API-Key", c.APIKey)
	}
	resp, err := c.httpClient().Do(req)
	if err != nil {
		return 0, nil, nil, err
	}
	defer resp.Body.Close()
	data, err := ReadBody(io.LimitReader(resp.Body, 1<<30), resp.ContentLength)
	if err != nil {
		return 0, nil, nil, err
	}
	return resp.StatusCode, data, resp.Header, nil
}

func (c *Client) httpClient() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return http.DefaultClient
}

// backoff is the wait before try+1: Retry-After when the server gave one
// (capped at Max), else Initial·2^try capped at Max, drawn from its upper
// half.
func backoff(p RetryPolicy, try int, hdr http.Header) time.Duration {
	if hdr != nil {
		if s, err := strconv.ParseFloat(hdr.Get("Retry-After"), 64); err == nil && s >= 0 {
			return min(time.Duration(s*float64(time.Second)), p.Max)
		}
	}
	d := p.Initial
	for i := 0; i < try && d < p.Max; i++ {
		d *= 2
	}
	d = min(d, p.Max)
	return d/2 + time.Duration(rand.Int64N(int64(d/2)+1))
}

// wait sleeps d unless ctx ends first, telling OnWait.
func (c *Client) wait(ctx context.Context, d time.Duration) error {
	if c.OnWait != nil {
		c.OnWait()
	}
	if c.sleep != nil {
		return c.sleep(ctx, d)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}

// Await long-polls retrieve_future until requestID has a result and
// decodes it into out. 408, a try_again body and a poll that timed out
// mean "ask again"; a failed request is an *APIError naming it.
func (c *Client) Await(ctx context.Context, op, requestID string, out any) error {
	body, _ := Marshal(RetrieveFutureRequest{RequestID: requestID})
	p := c.Retry.withDefaults()
	poll := c.PollTimeout
	if poll <= 0 {
		poll = 60 * time.Second
	}
	start, errs, tryAgain := time.Now(), 0, 0
	for {
		if c.OnWait != nil {
			c.OnWait()
		}
		status, data, hdr, err := c.roundTrip(ctx, http.MethodPost, PathRetrieveFuture, body, poll)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		fail := &APIError{Op: op, RequestID: requestID, Status: status, Retryable: true}
		switch {
		case err != nil && errors.Is(err, context.DeadlineExceeded), status == http.StatusRequestTimeout:
			errs = 0 // the poll waited its time: ask again at once
			continue
		case err != nil:
			fail.Detail = err.Error()
		case status == http.StatusOK:
			var probe struct {
				Type     string `json:"type"`
				Error    string `json:"error"`
				Category string `json:"category"`
			}
			if Unmarshal(data, &probe) == nil {
				if probe.Type == TypeTryAgain {
					tryAgain++
					if err := c.wait(ctx, min(time.Duration(tryAgain)*100*time.Millisecond, time.Second)); err != nil {
						return err
					}
					continue
				}
				if probe.Error != "" {
					fail.Detail, fail.Retryable = probe.Error, probe.Category == "server"
					return fail
				}
			}
			if out == nil {
				return nil
			}
			if err := Unmarshal(data, out); err != nil {
				fail.Detail = "undecodable result: " + err.Error()
				return fail
			}
			return nil
		case status == http.StatusNotFound:
			// The service no longer knows the request (it restarted):
			// the operation must start again.
			fail.Detail = detailText(data)
			return fail
		case !retryableStatus(status):
			fail.Detail, fail.Retryable = detailText(data), false
			return fail
		default:
			fail.Detail = detailText(data)
		}
		wait := backoff(p, errs, hdr)
		errs++
		if time.Since(start)+wait > p.MaxElapsed {
			return fail
		}
		if err := c.wait(ctx, wait); err != nil {
			return err
		}
	}
}

// Pending is a request the service has queued: its result is read by
// Await. The service runs a model's requests in the order it queued them,
// so a caller may queue the next before it awaits this one, as Tinker's
// own SDK does (its *_async calls): the upload of one request and the
// download of another's result then overlap the service's compute.
type Pending[T any] struct {
	c      *Client
	op, id string
	// check, when set, refuses a result that does not answer the request
	// or fills in what the service may leave out.
	check func(*T) error
}

// Await long-polls the result (see Client.Await) and checks it.
func (p Pending[T]) Await(ctx context.Context) (T, error) {
	var out T
	if err := p.c.Await(ctx, p.op, p.id, &out); err != nil {
		return out, err
	}
	if p.check != nil {
		return out, p.check(&out)
	}
	return out, nil
}

// enqueue posts an asynchronous request and returns its future.
func enqueue[T any](ctx context.Context, c *Client, path string, in any, check func(*T) error) (Pending[T], error) {
	var f FutureResponse
	if err := c.post(ctx, path, in, &f); err != nil {
		return Pending[T]{}, err
	}
	if f.RequestID == "" {
		return Pending[T]{}, &APIError{Op: path, Detail: "the answer names no request_id", Retryable: true}
	}
	return Pending[T]{c: c, op: path, id: f.RequestID, check: check}, nil
}

// await reads a queued request's result, or returns the error of queueing
// it: await(ctx)(c.XAsync(…)) is the blocking call.
func await[T any](ctx context.Context) func(Pending[T], error) (T, error) {
	return func(p Pending[T], err error) (T, error) {
		if err != nil {
			var zero T
			return zero, err
		}
		return p.Await(ctx)
	}
}

// Healthz reports whether the service answers.
func (c *Client) Healthz(ctx context.Context) error {
	return c.get(ctx, PathHealthz, nil)
}

// CreateSession opens a session tagged with tags.
func (c *Client) CreateSession(ctx context.Context, tags []string) (string, error) {
	var out CreateSessionResponse
	err := c.post(ctx, PathCreateSession, CreateSessionRequest{Tags: append([]string{}, tags...), SDKVersion: SDKVersion, Type: "create_session"}, &out)
	if err == nil && out.SessionID == "" {
		err = &APIError{Op: PathCreateSession, Detail: "the answer names no session_id", Retryable: true}
	}
	return out.SessionID, err
}

// SDKVersion is what this client reports as its SDK version.
const SDKVersion = "flywheel-tinker-go/1"

// CreateModel creates a trainable model and waits until it exists.
func (c *Client) CreateModel(ctx context.Context, session, baseModel string, lora LoraConfig) (string, error) {
	var out CreateModelResponse
	if err := c.post(ctx, PathCreateModel, CreateModelRequest{SessionID: session, BaseModel: baseModel, LoraConfig: lora}, &out); err != nil {
		return "", err
	}
	if out.ModelID == "" {
		return "", &APIError{Op: PathCreateModel, Detail: "the answer names no model_id", Retryable: true}
	}
	if out.RequestID != "" {
		if err := c.Await(ctx, PathCreateModel, out.RequestID, nil); err != nil {
			return "", err
		}
	}
	return out.ModelID, nil
}

// UnloadModel frees a model (its saved checkpoints stay).
func (c *Client) UnloadModel(ctx context.Context, model string) error {
	var out UnloadModelResponse
	if err := c.post(ctx, PathUnloadModel, UnloadModelRequest{ModelID: model}, &out); err != nil {
		return err
	}
	if out.RequestID == "" {
		return nil
	}
	return c.Await(ctx, PathUnloadModel, out.RequestID, nil)
}

// QueueUnload queues an unload_model behind the model's queued requests
// and returns without reading its result: the service frees the model
// once they have run.
func (c *Client) QueueUnload(ctx context.Context, model string) error {
	return c.post(ctx, PathUnloadModel, UnloadModelRequest{ModelID: model}, nil)
}

// Forward computes per-token log-probs and losses without a gradient.
func (c *Client) Forward(ctx context.Context, model string, in ForwardBackwardInput, seq int64) (ForwardBackwardOutput, error) {
	return await[ForwardBackwardOutput](ctx)(c.ForwardAsync(ctx, model, in, seq))
}

// ForwardAsync queues a forward and returns its future.
func (c *Client) ForwardAsync(ctx context.Context, model string, in ForwardBackwardInput, seq int64) (Pending[ForwardBackwardOutput], error) {
	return enqueue(ctx, c, PathForward, ForwardRequest{ModelID: model, ForwardInput: in, SeqID: &seq}, checkOutputs(PathForward, in))
}

// ForwardBackward accumulates the loss's gradient on model.
func (c *Client) ForwardBackward(ctx context.Context, model string, in ForwardBackwardInput, seq int64) (ForwardBackwardOutput, error) {
	return await[ForwardBackwardOutput](ctx)(c.ForwardBackwardAsync(ctx, model, in, seq))
}

// ForwardBackwardAsync queues a forward_backward and returns its future.
func (c *Client) ForwardBackwardAsync(ctx context.Context, model string, in ForwardBackwardInput, seq int64) (Pending[ForwardBackwardOutput], error) {
	return enqueue(ctx, c, PathForwardBackward, ForwardBackwardRequest{ModelID: model, ForwardBackwardInput: in, SeqID: &seq},
		checkOutputs(PathForwardBackward, in))
}

// checkOutputs refuses a result that does not answer every datum.
func checkOutputs(op string, in ForwardBackwardInput) func(*ForwardBackwardOutput) error {
	return func(out *ForwardBackwardOutput) error {
		if len(out.LossFnOutputs) != len(in.Data) {
			return &APIError{Op: op, Detail: fmt.Sprintf("%d loss_fn_outputs for %d datums", len(out.LossFnOutputs), len(in.Data)), Retryable: true}
		}
		return nil
	}
}

// LossSum is the summed loss of a forward(_backward) result: Tinker's
// loss:sum metric, else the sum of the elementwise losses (SkyRL tx).
func (o ForwardBackwardOutput) LossSum() float64 {
	if v, ok := o.Metrics[MetricLossSum]; ok {
		return v
	}
	var s float64
	for _, out := range o.LossFnOutputs {
		for _, v := range out[OutputLoss].Data {
			s += v
		}
	}
	return s
}

// OptimStep applies the accumulated gradient.
func (c *Client) OptimStep(ctx context.Context, model string, adam AdamParams, seq int64) (OptimStepResponse, error) {
	return await[OptimStepResponse](ctx)(c.OptimStepAsync(ctx, model, adam, seq))
}

// OptimStepAsync queues an optim_step and returns its future.
func (c *Client) OptimStepAsync(ctx context.Context, model string, adam AdamParams, seq int64) (Pending[OptimStepResponse], error) {
	return enqueue[OptimStepResponse](ctx, c, PathOptimStep, OptimStepRequest{ModelID: model, AdamParams: adam, SeqID: &seq}, nil)
}

// SaveWeights saves the training state (weights and optimizer) as name and
// returns its tinker:// path.
func (c *Client) SaveWeights(ctx context.Context, model, name string, seq int64) (string, error) {
	out, err := await[SaveWeightsResponse](ctx)(c.SaveWeightsAsync(ctx, model, name, seq))
	return out.Path, err
}

// SaveWeightsAsync queues a save_weights; its result's Path is the
// state's tinker:// path.
func (c *Client) SaveWeightsAsync(ctx context.Context, model, name string, seq int64) (Pending[SaveWeightsResponse], error) {
	return enqueue(ctx, c, PathSaveWeights, SaveWeightsRequest{ModelID: model, Path: name, SeqID: &seq}, func(out *SaveWeightsResponse) error {
		if out.Path == "" {
			out.Path = Path{Model: model, Kind: KindWeights, Name: name}.String()
		}
		return nil
	})
}

// LoadWeights loads a saved training state into model, which must be new.
func (c *Client) LoadWeights(ctx context.Context, model, path string, optimizer bool, seq int64) error {
	_, err := await[json.RawMessage](ctx)(c.LoadWeightsAsync(ctx, model, path, optimizer, seq))
	return err
}

// LoadWeightsAsync queues a load_weights and returns its future.
func (c *Client) LoadWeightsAsync(ctx context.Context, model, path string, optimizer bool, seq int64) (Pending[json.RawMessage], error) {
	return enqueue[json.RawMessage](ctx, c, PathLoadWeights, LoadWeightsRequest{ModelID: model, Path: path, Optimizer: optimizer, SeqID: &seq}, nil)
}

// SaveWeightsForSampler saves the weights a server samples from as name.
func (c *Client) SaveWeightsForSampler(ctx context.Context, model, name string, seq int64) (string, error) {
	out, err := await[SaveWeightsForSamplerResponse](ctx)(c.SaveWeightsForSamplerAsync(ctx, model, name, seq))
	return out.Path, err
}

// SaveWeightsForSamplerAsync queues a save_weights_for_sampler; its
// result's Path is the weights' tinker:// path.
func (c *Client) SaveWeightsForSamplerAsync(ctx context.Context, model, name string, seq int64) (Pending[SaveWeightsForSamplerResponse], error) {
	return enqueue(ctx, c, PathSaveWeightsForSampler, SaveWeightsForSamplerRequest{ModelID: model, Path: name, SeqID: &seq},
		func(out *SaveWeightsForSamplerResponse) error {
			if out.Path == "" {
				out.Path = Path{Model: model, Name: name}.String()
			}
			return nil
		})
}

// DeleteCheckpoint deletes the checkpoint at a tinker:// path, as
// Tinker's DELETE /api/v1/training_runs/{run}/checkpoints/{kind}/{name}: a
// training state (…/weights/<name>) or sampler weights (…/sampler_weights/
// <name>, or SkyRL's …/<name>). One already gone is not an error.
func (c *Client) DeleteCheckpoint(ctx context.Context, path string) error {
	p, err := ParsePath(path)
	if err != nil {
		return err
	}
	kind := p.Kind
	if kind == "" {
		kind = KindSamplerWeights
	}
	if kind != KindWeights && kind != KindSamplerWeights {
		return fmt.Errorf("%q names no checkpoint: its kind is neither %s nor %s", path, KindWeights, KindSamplerWeights)
	}
	err = c.call(ctx, http.MethodDelete, PathTrainingRuns+"/"+url.PathEscape(p.Model)+"/checkpoints/"+kind+"/"+url.PathEscape(p.Name), nil, nil)
	var ae *APIError
	if errors.As(err, &ae) && ae.Status == http.StatusNotFound {
		return nil
	}
	return err
}

// Checkpoints lists a model's finished checkpoints.
func (c *Client) Checkpoints(ctx context.Context, model string) ([]Checkpoint, error) {
	var out ListCheckpointsResponse
	err := c.get(ctx, PathTrainingRuns+"/"+url.PathEscape(model)+"/checkpoints", &out)
	return out.Checkpoints, err
}
