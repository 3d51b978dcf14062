// Package artefact is the stored form of the layers a deployment evolves
// besides its weights: the playbook, the harness and the tool schema, as
// the artefacts table holds them (kind, JSON content). It reads a set,
// applies it to a request, and removes what forgotten sessions taught it.
// It decides nothing: which artefact to write or release is evolution's,
// and storing it is store's; both import this package, never each other.
package artefact

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/flywheel-ai/flywheel/inference"
)

// The layers a deployment evolves, each named once: releases.layer holds
// these words, and every layer but the weights is also an artefact kind
// (artefacts.kind). The evolution decision that changes the playbook has
// its own stored word ("memory"); evolution.DecisionLayer maps it.
const (
	LayerWeights    = "weights"
	LayerPlaybook   = "playbook"
	LayerHarness    = "harness"
	LayerToolSchema = "tool_schema"
)

// Playbook is the memory layer: itemised lessons the gateway injects into
// the system prompt. A lesson quotes user text, so it is shown only to the
// requests of the tenant whose sessions taught it.
type Playbook struct {
	Items []PlaybookItem `json:"items"`
}

// PlaybookItem is one lesson with how often it helped or hurt.
type PlaybookItem struct {
	ID      string `json:"id"`
	Content string `json:"content"`
	Helpful int    `json:"helpful"`
	Harmful int    `json:"harmful"`
	// Tenant is whose sessions taught it; an item without one (written
	// before lessons were scoped to tenants) is shown to no one.
	Tenant string `json:"tenant"`
	// Sessions are the tenant's sessions it was learnt from: forgetting
	// one of them removes the item.
	Sessions []string `json:"sessions,omitempty"`
}

// Harness is the system-prompt layer: text placed before the client's own
// system prompt. It is written from aggregate evidence (rates, never user
// text), so it applies to every tenant. The JSON field is the one the
// gateway has always read.
type Harness struct {
	System string `json:"system_prompt"`
}

// ToolSchema overrides tool descriptions (and optionally parameters) by
// tenant and tool name. An override is written from one tenant's tool
// results (tool names and outputs are that tenant's text), so it applies
// only to that tenant's requests.
type ToolSchema struct {
	Tenants map[string]map[string]ToolOverride `json:"tenants"`
}

// ToolOverride replaces what is set.
type ToolOverride struct {
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
	// Sessions are the sessions whose tool results it quotes.
	Sessions []string `json:"sessions,omitempty"`
}

// AllTenants views a set as the union of every tenant's part: how the
// release gates, which answer suite prompts of no tenant, judge a
// candidate. Tenant names never take this form.
const AllTenants = "*"

// Set is a deployment's artefacts; nil: none.
type Set struct {
	Playbook   *Playbook
	Harness    *Harness
	ToolSchema *ToolSchema
}

// Decode parses content of kind into the set; on error the set is left
// as it was.
func (s *Set) Decode(kind string, content []byte) error {
	var err error
	switch kind {
	case LayerPlaybook:
		var v Playbook
		if err = json.Unmarshal(content, &v); err == nil {
			s.Playbook = &v
		}
	case LayerHarness:
		var v Harness
		if err = json.Unmarshal(content, &v); err == nil {
			s.Harness = &v
		}
	case LayerToolSchema:
		var v ToolSchema
		if err = json.Unmarshal(content, &v); err == nil {
			s.ToolSchema = &v
		}
	default:
		return fmt.Errorf("artefact kind %q is not playbook, harness or tool_schema", kind)
	}
	if err != nil {
		return fmt.Errorf("decode %s artefact: %w", kind, err)
	}
	return nil
}

// PlaybookHeader opens the injected playbook block.
const PlaybookHeader = "Playbook (lessons from earlier sessions):"

// System is the text the set puts in front of a tenant's system prompt:
// the harness, then the tenant's playbook lessons.
func (s Set) System(tenant string) string {
	var parts []string
	if s.Harness != nil && strings.TrimSpace(s.Harness.System) != "" {
		parts = append(parts, strings.TrimSpace(s.Harness.System))
	}
	if s.Playbook != nil {
		var b strings.Builder
		for _, it := range s.Playbook.Items {
			if it.Tenant != "" && (it.Tenant == tenant || tenant == AllTenants) {
				fmt.Fprintf(&b, "\n- [%s] %s", it.ID, it.Content)
			}
		}
		if b.Len() > 0 {
			parts = append(parts, PlaybookHeader+b.String())
		}
	}
	return strings.Join(parts, "\n\n")
}

// InjectSystem returns msgs with system in front: merged into the first
// message when that is a system message, else as a new one. msgs is not
// modified.
func InjectSystem(msgs []inference.Message, system string) []inference.Message {
	if system == "" {
		return msgs
	}
	out := make([]inference.Message, 0, len(msgs)+1)
	if len(msgs) > 0 && msgs[0].Role == inference.RoleSystem {
		first := msgs[0]
		first.Content = system + "\n\n" + first.Content
		return append(append(out, first), msgs[1:]...)
	}
	return append(append(out, inference.Message{Role: inference.RoleSystem, Content: system}), msgs...)
}

// Tools returns tools with the tenant's overrides applied and the names of
// the tools it changed. tools is not modified.
func (s Set) Tools(tenant string, tools []inference.Tool) ([]inference.Tool, []string) {
	if s.ToolSchema == nil || len(tools) == 0 {
		return tools, nil
	}
	overrides := s.ToolSchema.Tenants[tenant]
	if tenant == AllTenants {
		overrides = map[string]ToolOverride{}
		names := make([]string, 0, len(s.ToolSchema.Tenants))
		for t := range s.ToolSchema.Tenants {
			names = append(names, t)
		}
		sort.Strings(names)
		for _, t := range names {
			for tool, o := range s.ToolSchema.Tenants[t] {
				if _, ok := overrides[tool]; !ok {
					overrides[tool] = o
				}
			}
		}
	}
	if len(overrides) == 0 {
		return tools, nil
	}
	out := append([]inference.Tool(nil), tools...)
	var changed []string
	for i, t := range out {
		o, ok := overrides[t.Name]
		if !ok {
			continue
		}
		if o.Description != "" {
			out[i].Description = o.Description
		}
		if len(o.Parameters) > 0 && json.Valid(o.Parameters) {
			out[i].Parameters = o.Parameters
		}
		changed = append(changed, t.Name)
	}
	return out, changed
}

// Apply returns a tenant's request messages and tools with the set
// applied: the harness and the tenant's playbook become one system message
// in front, and the tenant's tool overrides replace descriptions. The
// inputs are not modified.
func (s Set) Apply(tenant string, msgs []inference.Message, tools []inference.Tool) ([]inference.Message, []inference.Tool) {
	out, _ := s.Tools(tenant, tools)
	return InjectSystem(msgs, s.System(tenant)), out
}

// Forget removes what tenant's forgotten sessions taught the set's
// playbook and tool schema, and reports which kinds changed.
func (s *Set) Forget(tenant string, sessions []string) []string {
	gone := map[string]bool{}
	for _, id := range sessions {
		gone[id] = true
	}
	taught := func(from []string) bool {
		for _, id := range from {
			if gone[id] {
				return true
			}
		}
		return false
	}
	var changed []string
	if s.Playbook != nil {
		items := make([]PlaybookItem, 0, len(s.Playbook.Items))
		for _, it := range s.Playbook.Items {
			if it.Tenant != tenant || !taught(it.Sessions) {
				items = append(items, it)
			}
		}
		if len(items) < len(s.Playbook.Items) {
			s.Playbook = &Playbook{Items: items}
			changed = append(changed, LayerPlaybook)
		}
	}
	if s.ToolSchema != nil {
		mine, kept := s.ToolSchema.Tenants[tenant], map[string]ToolOverride{}
		for tool, o := range mine {
			if !taught(o.Sessions) {
				kept[tool] = o
			}
		}
		if len(kept) < len(mine) {
			ts := ToolSchema{Tenants: map[string]map[string]ToolOverride{}}
			for t, o := range s.ToolSchema.Tenants {
				ts.Tenants[t] = o
			}
			if len(kept) == 0 {
				delete(ts.Tenants, tenant)
			} else {
				ts.Tenants[tenant] = kept
			}
			s.ToolSchema = &ts
			changed = append(changed, LayerToolSchema)
		}
	}
	return changed
}
