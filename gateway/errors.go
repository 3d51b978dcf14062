package gateway

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"

	"github.com/flywheel-ai/flywheel/inference"
)

// Protocols the gateway speaks; errors take the caller's protocol's shape.
const (
	protoOpenAI    = "openai"
	protoAnthropic = "anthropic"
	// protoResponses is OpenAI's Responses API; its errors are OpenAI's.
	protoResponses = "responses"
)

// ctxProtocol is the gin context key naming the protocol of the route.
const ctxProtocol = "flywheel.protocol"

// apiError is an error meant for the client: a status, a message, and for
// 429 / 503 how long to wait.
type apiError struct {
	Status     int
	Message    string
	RetryAfter time.Duration
	// Code, when set, is OpenAI's error code for the error
	// ("insufficient_quota" for a spent token budget), and its type too
	// unless Type says otherwise.
	Code string
	// Type is OpenAI's error type where it is neither Code nor the
	// status's (a missing model is an invalid_request_error).
	Type string
}

func (e *apiError) Error() string { return fmt.Sprintf("%d: %s", e.Status, e.Message) }

func errf(status int, format string, args ...any) *apiError {
	return &apiError{Status: status, Message: fmt.Sprintf(format, args...)}
}

// asAPIError maps any error to what the client sees: backend errors keep
// their status; anything else is a 500 that hides internals.
func asAPIError(err error) *apiError {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae
	}
	var ie *inference.Error
	if errors.As(err, &ie) {
		st := ie.Status
		if st < 400 || st > 599 {
			st = http.StatusBadGateway
		}
		return &apiError{Status: st, Message: ie.Message, RetryAfter: ie.RetryAfter}
	}
	return &apiError{Status: http.StatusInternalServerError, Message: "internal error"}
}

// openAIErrorType and anthropicErrorType name a status in each protocol's
// vocabulary.
func openAIErrorType(status int) string {
	switch status {
	case 400, 409, 413, 422:
		return "invalid_request_error"
	case 401:
		return "authentication_error"
	case 403:
		return "permission_error"
	case 404:
		return "not_found_error"
	case 429:
		return "rate_limit_error"
	case 503:
		return "service_unavailable"
	default:
		return "server_error"
	}
}

func anthropicErrorType(status int) string {
	switch status {
	case 400, 409, 422:
		return "invalid_request_error"
	case 401:
		return "authentication_error"
	case 403:
		return "permission_error"
	case 404:
		return "not_found_error"
	case 413:
		return "request_too_large"
	case 429:
		return "rate_limit_error"
	case 503, 529:
		return "overloaded_error"
	default:
		return "api_error"
	}
}

// errorBody is the protocol's error JSON.
func errorBody(protocol string, e *apiError) any {
	if protocol == protoAnthropic {
		return gin.H{"type": "error", "error": gin.H{"type": anthropicErrorType(e.Status), "message": e.Message}}
	}
	if e.Code != "" {
		typ := e.Type
		if typ == "" {
			typ = e.Code
		}
		return gin.H{"error": gin.H{"message": e.Message, "type": typ, "param": nil, "code": e.Code}}
	}
	return gin.H{"error": gin.H{"message": e.Message, "type": openAIErrorType(e.Status), "param": nil, "code": nil}}
}

// abort answers err in the route's protocol and stops the handler chain.
// It is the one way errors leave the gateway.
func abort(c *gin.Context, err error) {
	e := asAPIError(err)
	if e.Status == http.StatusInternalServerError {
		_ = c.Error(err) // logged by the access log with the request id
	}
	if e.RetryAfter > 0 {
		secs := int((e.RetryAfter + time.Second - 1) / time.Second)
		c.Header("Retry-After", strconv.Itoa(secs))
	}
	c.AbortWithStatusJSON(e.Status, errorBody(c.GetString(ctxProtocol), e))
}
