package activities

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/evolution"
	"github.com/flywheel-ai/flywheel/store"
)

// Reflector asks a reflecting model: the evolution activities call it to
// read failed sessions and propose a change.
type Reflector interface {
	Reflect(ctx context.Context, q ReflectQuery) (ReflectReply, error)
}

// ReflectQuery is one reflection: the reflecting deployment (Model), what
// it reflects on (Deployment, Layer, Tenant), and the request.
type ReflectQuery struct {
	Model      string
	Deployment string
	Layer      string
	Tenant     string
	evolution.Reflection
	MaxTokens int
}

// ReflectReply is the reflector's answer and what it cost.
type ReflectReply struct {
	Text                           string
	PromptTokens, CompletionTokens int
	// SessionID is the gateway session that recorded the call.
	SessionID string
}

// ReflectorEndUser is the end user of the reflector's sessions: the
// control plane, opted out of training.
const ReflectorEndUser = "flywheel-reflector"

// GatewayReflector reflects through Flywheel's own gateway, as any client
// would: each reflection is a session of the key's tenant (the operator),
// opted out of training, for the reflecting deployment, so its calls are
// routed, recorded, metered and rate-limited like any other, and never
// train anything.
type GatewayReflector struct {
	// URL is the gateway's base URL (http://host:port, without /v1).
	URL string
	// APIKey is an operator key of the gateway.
	APIKey string
	// HTTP is the client (nil: a client with a 5-minute timeout).
	HTTP *http.Client
}

// Reflect implements Reflector.
func (g *GatewayReflector) Reflect(ctx context.Context, q ReflectQuery) (ReflectReply, error) {
	meta, _ := json.Marshal(map[string]string{"reflects_on": q.Deployment, "layer": q.Layer, "for_tenant": q.Tenant})
	var sess struct {
		ID     string `json:"id"`
		APIKey string `json:"api_key"`
	}
	if err := g.post(ctx, "/v1/sessions", g.APIKey, map[string]any{
		"model": q.Model, "end_user": ReflectorEndUser, "opt_out": true, "metadata": json.RawMessage(meta),
	}, &sess); err != nil {
		return ReflectReply{}, fmt.Errorf("open the reflector's session: %w", err)
	}
	zero := 0.0
	var out struct {
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
		Usage struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	err := g.post(ctx, "/v1/chat/completions", sess.APIKey, map[string]any{
		"model": q.Model, "max_tokens": q.MaxTokens, "temperature": &zero,
		"messages": []map[string]string{{"role": "system", "content": q.System}, {"role": "user", "content": q.User}},
	}, &out)
	// The session ends whatever the call did, so its workflow closes.
	endErr := g.post(ctx, "/v1/sessions/"+url.PathEscape(sess.ID)+"/end", sess.APIKey, map[string]any{}, nil)
	if err != nil {
		return ReflectReply{SessionID: sess.ID}, fmt.Errorf("ask reflector %s: %w", q.Model, err)
	}
	if endErr != nil {
		return ReflectReply{SessionID: sess.ID}, fmt.Errorf("end the reflector's session: %w", endErr)
	}
	if len(out.Choices) == 0 {
		return ReflectReply{SessionID: sess.ID}, fmt.Errorf("reflector %s answered no choice", q.Model)
	}
	return ReflectReply{Text: out.Choices[0].Message.Content, PromptTokens: out.Usage.PromptTokens,
		CompletionTokens: out.Usage.CompletionTokens, SessionID: sess.ID}, nil
}

// gatewayError is the gateway's answer to a failed call.
type gatewayError struct {
	Status int
	Body   string
}

func (e *gatewayError) Error() string {
	return fmt.Sprintf("gateway answered %d: %s", e.Status, e.Body)
}

func (g *GatewayReflector) post(ctx context.Context, path, key string, body, out any) error {
	raw, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimSuffix(g.URL, "/")+path, bytes.NewReader(raw))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	c := g.HTTP
	if c == nil {
		c = &http.Client{Timeout: 5 * time.Minute}
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		return &gatewayError{Status: resp.StatusCode, Body: strings.TrimSpace(string(data))}
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(data, out)
}

// messageOverhead bounds the tokens a chat template adds around one
// message.
const messageOverhead = 32

// reflectionSpend is one decision's reflection budget and what it spent.
type reflectionSpend struct {
	settings deployment.Evolution
	spent    int
}

// reflect asks the deployment's reflector within the budgets: the call
// reserves, before it is sent, an upper bound of what it can cost (a
// token is at least a byte of the prompt, plus each message's template,
// plus the answer's max_tokens) against the tenant's day and the
// decision's remainder, then gives back what it did not use. ErrBudget
// when either budget cannot cover it.
func (e *Evolution) reflect(ctx context.Context, b *reflectionSpend, q ReflectQuery) (ReflectReply, error) {
	if e.Reflector == nil {
		return ReflectReply{}, errors.New("no reflector on this worker (it needs the gateway's URL and an operator key)")
	}
	q.Model, q.MaxTokens = b.settings.Reflector, b.settings.MaxTokens
	bound := len(q.System) + len(q.User) + 2*messageOverhead + q.MaxTokens
	if left := b.settings.DecisionTokens - b.spent; bound > left {
		return ReflectReply{}, fmt.Errorf("%w: this reflection may cost %d tokens, the decision has %d of its %d left",
			store.ErrBudget, bound, max(left, 0), b.settings.DecisionTokens)
	}
	payer := q.Tenant
	if payer == "" {
		payer = "*"
	}
	at := e.now()
	if _, err := store.ReserveReflection(ctx, e.DB, payer, at, bound, b.settings.DailyTokens); err != nil {
		return ReflectReply{}, err
	}
	r, err := e.Reflector.Reflect(ctx, q)
	used := r.PromptTokens + r.CompletionTokens
	if used == 0 || used > bound {
		// No usage reported (or more than the bound, which a server that
		// counts honestly cannot): the reservation stands.
		used = bound
	}
	if err == nil || r.SessionID != "" {
		b.spent += used
	} else {
		used = 0 // the call never reached a model
	}
	if rerr := store.ReleaseReflection(ctx, e.DB, payer, at, bound-used); rerr != nil && err == nil {
		err = rerr
	}
	return r, err
}
