package activities

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"go.temporal.io/sdk/temporal"

	"github.com/flywheel-ai/flywheel/artefact"
	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/evolution"
	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/store"
	"github.com/flywheel-ai/flywheel/trajectory"
)

// What a memory decision reads: at most this many tenants, the ones with
// the most failed sessions in the window, and a bounded sample of the live
// outcomes that count the items.
const (
	maxReflectedTenants  = 5
	maxOutcomeSessions   = 2000
	maxReplayedToolCalls = 8
)

// evolutionSettings are the deployment's evolution settings.
func (e *Evolution) evolutionSettings(ctx context.Context, dep string) (deployment.Evolution, error) {
	d, err := store.GetDeployment(ctx, e.DB, dep)
	if errors.Is(err, store.ErrNotFound) {
		return deployment.Evolution{}, temporal.NewNonRetryableApplicationError(fmt.Sprintf("deployment %q not found", dep), "BadInput", err)
	}
	if err != nil {
		return deployment.Evolution{}, err
	}
	s, err := d.Settings()
	switch {
	case errors.Is(err, deployment.ErrNotUpstream):
		// A deployment of another backend has no settings to name a
		// reflector in.
	case err != nil:
		return deployment.Evolution{}, temporal.NewNonRetryableApplicationError(err.Error(), "BadData", err)
	}
	return s.EvolutionOf(), nil
}

// proposePlaybook asks the reflector, for each tenant with failed
// sessions in the window, which lessons its sessions teach, and curates
// the deltas into the playbook. Every item's helpful and harmful counts
// are first recounted from live outcomes, so harmful items retire.
func (e *Evolution) proposePlaybook(ctx context.Context, in flow.ProposeArtefactInput, old artefact.Playbook, b *reflectionSpend) (artefact.Playbook, string, error) {
	pb, err := e.recount(ctx, in.Deployment, old)
	if err != nil {
		return pb, "", err
	}
	now := e.now()
	window := in.Window
	if window <= 0 {
		window = time.Hour
	}
	all, err := store.ReflectionSessions(ctx, e.DB, in.Deployment, "", now.Add(-window), now, b.settings.Sessions*maxReflectedTenants)
	if err != nil {
		return pb, "", err
	}
	failed := map[string]int{}
	for _, s := range all {
		// A decision about one tenant reads that tenant's sessions only.
		if s.Outcome < 0 && (in.Tenant == "" || s.Tenant == in.Tenant) {
			failed[s.Tenant]++
		}
	}
	tenants := make([]string, 0, len(failed))
	for t := range failed {
		tenants = append(tenants, t)
	}
	sort.Slice(tenants, func(i, j int) bool {
		if failed[tenants[i]] != failed[tenants[j]] {
			return failed[tenants[i]] > failed[tenants[j]]
		}
		return tenants[i] < tenants[j]
	})
	if len(tenants) > maxReflectedTenants {
		tenants = tenants[:maxReflectedTenants]
	}
	var notes []string
	for _, t := range tenants {
		sessions, err := store.ReflectionSessions(ctx, e.DB, in.Deployment, t, now.Add(-window), now, b.settings.Sessions)
		if err != nil {
			return pb, "", err
		}
		eps := e.episodes(sessions)
		var mine []artefact.PlaybookItem
		for _, it := range pb.Items {
			if it.Tenant == t {
				mine = append(mine, it)
			}
		}
		r, err := e.reflect(ctx, b, ReflectQuery{Deployment: in.Deployment, Layer: artefact.LayerPlaybook, Tenant: t,
			Reflection: evolution.MemoryReflection(mine, eps)})
		if errors.Is(err, store.ErrBudget) {
			notes = append(notes, fmt.Sprintf("tenant %s: %v", t, err))
			continue
		}
		if err != nil {
			return pb, "", err
		}
		deltas, err := evolution.ParseDeltas(r.Text)
		if err != nil {
			notes = append(notes, fmt.Sprintf("tenant %s: %v", t, err))
			continue
		}
		for i := range deltas {
			deltas[i].Content = e.redact(deltas[i].Content)
		}
		var c evolution.Curation
		pb, c = evolution.ApplyDeltas(pb, t, deltas, evolution.Cited(eps), b.settings.PlaybookMax)
		note := fmt.Sprintf("tenant %s: %d added, %d edited, %d retired from %d sessions", t, c.Added, c.Edited, c.Retired, len(eps))
		if len(c.Refused) > 0 {
			note += "; refused " + strings.Join(c.Refused, "; ")
		}
		notes = append(notes, note)
	}
	if len(tenants) == 0 {
		notes = append(notes, "no tenant had a failed, rewarded session in the window")
	}
	return pb, strings.Join(notes, "; "), nil
}

// episodes are sessions as the reflector reads them: redacted.
func (e *Evolution) episodes(sessions []store.SessionEvidence) []evolution.Episode {
	eps := make([]evolution.Episode, 0, len(sessions))
	for _, s := range sessions {
		ep := evolution.Episode{Session: s.SessionID, Outcome: s.Outcome, Prompt: e.redact(s.Prompt), Answer: e.redact(s.Answer)}
		for _, f := range s.Feedback {
			ep.Feedback = append(ep.Feedback, e.redact(f))
		}
		eps = append(eps, ep)
	}
	return eps
}

func (e *Evolution) redact(s string) string {
	if e.Redactor == nil {
		return s
	}
	out, _ := e.Redactor.Text(s)
	return out
}

// recount sets pb's helpful and harmful counts from the live outcomes of
// the sessions served under each playbook version, and retires the items
// they show harmful.
func (e *Evolution) recount(ctx context.Context, dep string, pb artefact.Playbook) (artefact.Playbook, error) {
	sessions, err := store.PlaybookSessions(ctx, e.DB, dep, maxOutcomeSessions)
	if err != nil {
		return pb, err
	}
	versions := map[int]map[string]bool{}
	var seen []evolution.ItemSession
	for _, s := range sessions {
		items := map[string]bool{}
		for _, v := range s.Versions {
			ids, ok := versions[v]
			if !ok {
				a, err := store.ArtefactVersion(ctx, e.DB, dep, artefact.LayerPlaybook, strconv.Itoa(v))
				if err != nil && !errors.Is(err, store.ErrNotFound) {
					return pb, err
				}
				ids = map[string]bool{}
				var set artefact.Set
				if err == nil && set.Decode(artefact.LayerPlaybook, a.Content) == nil {
					for _, it := range set.Playbook.Items {
						ids[it.Tenant+"\x00"+it.ID] = true
					}
				}
				versions[v] = ids
			}
			for k := range ids {
				if t, id, _ := strings.Cut(k, "\x00"); t == s.Tenant {
					items[id] = true
				}
			}
		}
		seen = append(seen, evolution.ItemSession{Tenant: s.Tenant, Items: items, Outcome: s.Outcome})
	}
	return evolution.CuratePlaybook(evolution.CountOutcomes(pb, seen), nil, 0), nil
}

// proposeToolSchema asks the reflector to rewrite the description and
// parameter docs of one tenant's failing tool, then replays the failed
// calls through the deployment's engine under the current and the
// rewritten schema: the rewrite is proposed only when more replayed calls
// pass arguments that the tool's JSON schema accepts and that differ from
// the ones that failed.
func (e *Evolution) proposeToolSchema(ctx context.Context, in flow.ProposeArtefactInput, f evolution.ToolFailure, cur artefact.ToolOverride, b *reflectionSpend) (*artefact.ToolOverride, string, error) {
	now := e.now()
	window := in.Window
	if window <= 0 {
		window = time.Hour
	}
	calls, err := store.FailedToolCalls(ctx, e.DB, in.Deployment, f.Tenant, f.Tool, now.Add(-window), now, maxReplayedToolCalls)
	if err != nil {
		return nil, "", err
	}
	var tool *inference.Tool
	var cases []evolution.ToolCase
	var replays []replayCase
	for _, c := range calls {
		req, err := trajectory.DecodeRequest(c.Request)
		if err != nil {
			continue
		}
		for _, t := range req.Tools {
			if t.Name == f.Tool && tool == nil {
				t := t
				tool = &t
			}
		}
		tc := evolution.ToolCase{Arguments: e.redact(c.Arguments), Error: e.redact(c.Error)}
		if !slices.Contains(cases, tc) {
			cases = append(cases, tc)
		}
		replays = append(replays, replayCase{request: req.Request, failed: c.Arguments})
	}
	if tool == nil {
		return nil, fmt.Sprintf("no failed call of %s with its schema in the window", f.Tool), nil
	}
	shown := *tool
	if cur.Description != "" {
		shown.Description = cur.Description
	}
	if len(cur.Parameters) > 0 {
		shown.Parameters = cur.Parameters
	}
	r, err := e.reflect(ctx, b, ReflectQuery{Deployment: in.Deployment, Layer: artefact.LayerToolSchema, Tenant: f.Tenant,
		Reflection: evolution.ToolReflection(shown, cases)})
	if errors.Is(err, store.ErrBudget) {
		return nil, err.Error(), nil
	}
	if err != nil {
		return nil, "", err
	}
	cand, err := evolution.ParseToolRewrite(r.Text, *tool)
	if err != nil {
		return nil, err.Error(), nil
	}
	cand.Description = e.redact(cand.Description)
	if !e.answers(ctx, in.Deployment) {
		return nil, "no engine on this worker serves the deployment to replay the failed calls on", nil
	}
	schema, err := compileSchema(tool.Parameters)
	if err != nil {
		return nil, fmt.Sprintf("the tool's own parameters are not a JSON schema: %v", err), nil
	}
	before, err := e.replay(ctx, in.Deployment, *tool, cur, replays, schema)
	if err != nil {
		return nil, "", err
	}
	after, err := e.replay(ctx, in.Deployment, *tool, cand, replays, schema)
	if err != nil {
		return nil, "", err
	}
	note := fmt.Sprintf("replayed %d failed calls of %s: %d valid under the rewrite, %d under the current schema", len(replays), f.Tool, after, before)
	if after <= before {
		return nil, note + "; the rewrite is not proposed", nil
	}
	cand.Sessions = evolution.JoinSessions(cur.Sessions, f.Sessions)
	return &cand, note, nil
}

type replayCase struct {
	request *inference.Request
	failed  string
}

func (e *Evolution) answers(ctx context.Context, dep string) bool {
	if e.Backend == nil {
		return false
	}
	if d, ok := e.Backend.(DeploymentEngines); ok {
		ok, err := d.Serves(ctx, dep)
		return ok && err == nil
	}
	return true
}

// replay asks the deployment's serving engine each failed call's request
// again, greedily, with tool under override, and counts the answers that
// call tool with arguments its schema accepts and unlike the failed ones.
func (e *Evolution) replay(ctx context.Context, dep string, tool inference.Tool, o artefact.ToolOverride, cases []replayCase, schema *jsonschema.Schema) (int, error) {
	ok := 0
	zero, seed := 0.0, int64(1)
	for _, c := range cases {
		tools := make([]inference.Tool, len(c.request.Tools))
		for i, t := range c.request.Tools {
			if t.Name == tool.Name {
				if o.Description != "" {
					t.Description = o.Description
				}
				if len(o.Parameters) > 0 {
					t.Parameters = o.Parameters
				}
			}
			tools[i] = t
		}
		heartbeat(ctx)
		resp, err := e.Backend.Complete(ctx, &inference.Request{Model: dep, Messages: c.request.Messages, Tools: tools,
			ToolChoice: c.request.ToolChoice, MaxTokens: 512, Temperature: &zero, Seed: &seed})
		if rejected(err) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("replay a failed call of %s: %w", tool.Name, err)
		}
		for _, call := range resp.Message.ToolCalls {
			if call.Name == tool.Name && validArguments(schema, call.Arguments) && !sameJSON(call.Arguments, c.failed) {
				ok++
				break
			}
		}
	}
	return ok, nil
}

func compileSchema(params json.RawMessage) (*jsonschema.Schema, error) {
	if len(params) == 0 {
		params = json.RawMessage(`{"type":"object"}`)
	}
	doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(params))
	if err != nil {
		return nil, err
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("tool.json", doc); err != nil {
		return nil, err
	}
	return c.Compile("tool.json")
}

func validArguments(s *jsonschema.Schema, args string) bool {
	v, err := jsonschema.UnmarshalJSON(strings.NewReader(args))
	return err == nil && s.Validate(v) == nil
}

func sameJSON(a, b string) bool {
	var x, y any
	if json.Unmarshal([]byte(a), &x) != nil || json.Unmarshal([]byte(b), &y) != nil {
		return strings.TrimSpace(a) == strings.TrimSpace(b)
	}
	ca, _ := json.Marshal(x)
	cb, _ := json.Marshal(y)
	return bytes.Equal(ca, cb)
}
