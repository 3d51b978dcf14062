package evolution

import (
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/flywheel-ai/flywheel/inference"
)

// Artefact kinds (artefacts.kind).
const (
	KindPlaybook   = "playbook"
	KindHarness    = "harness"
	KindToolSchema = "tool_schema"
)

// Playbook is the memory layer: itemised lessons the gateway injects into a
// deployment's system prompt.
type Playbook struct {
	Items []PlaybookItem `json:"items"`
}

// PlaybookItem is one lesson with how often it helped or hurt.
type PlaybookItem struct {
	ID      string `json:"id"`
	Content string `json:"content"`
	Helpful int    `json:"helpful"`
	Harmful int    `json:"harmful"`
}

// Harness is the system-prompt layer: text placed before the client's own
// system prompt. The JSON field is the one the gateway's router reads.
type Harness struct {
	System string `json:"system_prompt"`
}

// ToolSchema overrides tool descriptions (and optionally parameters) by
// tool name.
type ToolSchema struct {
	Tools map[string]ToolOverride `json:"tools"`
}

// ToolOverride replaces what is set.
type ToolOverride struct {
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
}

// ArtefactSet is the artefacts that apply to one request; nil: none.
type ArtefactSet struct {
	Playbook   *Playbook
	Harness    *Harness
	ToolSchema *ToolSchema
}

// Decode parses content of kind into the set; on error the set is left
// as it was.
func (s *ArtefactSet) Decode(kind string, content []byte) error {
	var err error
	switch kind {
	case KindPlaybook:
		var v Playbook
		if err = json.Unmarshal(content, &v); err == nil {
			s.Playbook = &v
		}
	case KindHarness:
		var v Harness
		if err = json.Unmarshal(content, &v); err == nil {
			s.Harness = &v
		}
	case KindToolSchema:
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

// Apply returns the request's messages and tools with the set applied: the
// harness and the playbook become one system message in front (merged into
// the client's first system message if it has one), and tool overrides
// replace descriptions. The inputs are not modified.
func (s ArtefactSet) Apply(msgs []inference.Message, tools []inference.Tool) ([]inference.Message, []inference.Tool) {
	var parts []string
	if s.Harness != nil && strings.TrimSpace(s.Harness.System) != "" {
		parts = append(parts, strings.TrimSpace(s.Harness.System))
	}
	if s.Playbook != nil && len(s.Playbook.Items) > 0 {
		var b strings.Builder
		b.WriteString(PlaybookHeader)
		for _, it := range s.Playbook.Items {
			fmt.Fprintf(&b, "\n- [%s] %s", it.ID, it.Content)
		}
		parts = append(parts, b.String())
	}
	out := append([]inference.Message(nil), msgs...)
	if len(parts) > 0 {
		prefix := strings.Join(parts, "\n\n")
		if len(out) > 0 && out[0].Role == inference.RoleSystem {
			out[0].Content = prefix + "\n\n" + out[0].Content
		} else {
			out = append([]inference.Message{{Role: inference.RoleSystem, Content: prefix}}, out...)
		}
	}
	outTools := append([]inference.Tool(nil), tools...)
	if s.ToolSchema != nil {
		for i, t := range outTools {
			if o, ok := s.ToolSchema.Tools[t.Name]; ok {
				if o.Description != "" {
					outTools[i].Description = o.Description
				}
				if len(o.Parameters) > 0 {
					outTools[i].Parameters = o.Parameters
				}
			}
		}
	}
	return out, outTools
}

// CuratePlaybook merges new lessons into a playbook deterministically:
// items with the same normalised content merge (counts add up), items that
// hurt more than they helped are dropped, and the rest are kept up to max,
// most helpful first (ties by id).
func CuratePlaybook(old Playbook, add []PlaybookItem, max int) Playbook {
	byKey := map[string]*PlaybookItem{}
	var order []string
	for _, it := range append(append([]PlaybookItem(nil), old.Items...), add...) {
		k := strings.Join(strings.Fields(strings.ToLower(it.Content)), " ")
		if k == "" {
			continue
		}
		if cur, ok := byKey[k]; ok {
			cur.Helpful += it.Helpful
			cur.Harmful += it.Harmful
			continue
		}
		c := it
		byKey[k] = &c
		order = append(order, k)
	}
	var items []PlaybookItem
	for _, k := range order {
		if it := byKey[k]; it.Harmful <= it.Helpful {
			items = append(items, *it)
		}
	}
	sort.SliceStable(items, func(i, j int) bool {
		if items[i].Helpful-items[i].Harmful != items[j].Helpful-items[j].Harmful {
			return items[i].Helpful-items[i].Harmful > items[j].Helpful-items[j].Harmful
		}
		return items[i].ID < items[j].ID
	})
	if max > 0 && len(items) > max {
		items = items[:max]
	}
	return Playbook{Items: items}
}
