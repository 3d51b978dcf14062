package upstream

import (
	"context"
	"net/http"

	"github.com/flywheel-ai/flywheel/inference"
)

// Fallback tries backends in order, moving on when one fails in a way
// another might not (429, 5xx, unreachable, timeout).
type Fallback []inference.Backend

// Complete implements inference.Backend.
func (f Fallback) Complete(ctx context.Context, req *inference.Request) (*inference.Response, error) {
	var err error
	for _, b := range f {
		var resp *inference.Response
		resp, err = b.Complete(ctx, req)
		if err == nil || !Retryable(err) {
			return resp, err
		}
	}
	return nil, err
}

// CountTokens implements inference.Counter with the first backend, which
// serves the model the fallbacks stand in for.
func (f Fallback) CountTokens(ctx context.Context, req *inference.Request) (int, error) {
	if c, ok := f[0].(inference.Counter); ok {
		return c.CountTokens(ctx, req)
	}
	return 0, &inference.Error{Status: http.StatusNotImplemented, Message: "this model's backend cannot count tokens"}
}

// Stream implements inference.Backend; it falls back only while nothing
// has been emitted.
func (f Fallback) Stream(ctx context.Context, req *inference.Request, emit func(inference.Delta) error) (*inference.Response, error) {
	var err error
	for _, b := range f {
		emitted := false
		var resp *inference.Response
		resp, err = b.Stream(ctx, req, func(d inference.Delta) error { emitted = true; return emit(d) })
		if err == nil || emitted || !Retryable(err) {
			return resp, err
		}
	}
	return nil, err
}
