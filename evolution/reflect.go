package evolution

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/flywheel-ai/flywheel/artefact"
	"github.com/flywheel-ai/flywheel/inference"
)

// The reflector reads what happened and proposes a change; what it may
// propose, and how a proposal is merged, is decided here, so the merge is
// deterministic whatever the model answers. Its text arrives redacted.

// Episode is one rewarded session as the reflector reads it.
type Episode struct {
	Session  string
	Outcome  float64
	Prompt   string
	Answer   string
	Feedback []string
}

// Delta is one change the reflector proposes to a tenant's playbook: add
// an item, edit one (by id), or retire one; each cites the sessions it
// rests on.
type Delta struct {
	Op       string   `json:"op"`
	ID       string   `json:"id,omitempty"`
	Content  string   `json:"content,omitempty"`
	Sessions []string `json:"sessions"`
}

// Delta operations.
const (
	DeltaAdd    = "add"
	DeltaEdit   = "edit"
	DeltaRetire = "retire"
)

// MaxItemBytes bounds one playbook item's text.
const MaxItemBytes = 400

// Reflection is a request for the reflector: a system prompt and the
// evidence.
type Reflection struct {
	System, User string
}

// MemoryReflection asks for playbook deltas from one tenant's episodes,
// given the tenant's current items.
func MemoryReflection(items []artefact.PlaybookItem, eps []Episode) Reflection {
	var b strings.Builder
	b.WriteString("Current playbook items:\n")
	if len(items) == 0 {
		b.WriteString("(none)\n")
	}
	for _, it := range items {
		fmt.Fprintf(&b, "- id %s (helpful %d, harmful %d): %s\n", it.ID, it.Helpful, it.Harmful, it.Content)
	}
	b.WriteString("\nRewarded sessions (outcome below 0 failed):\n")
	for _, e := range eps {
		fmt.Fprintf(&b, "\n[session %s] outcome %+.2f\nuser: %s\nagent: %s\n", e.Session, e.Outcome, clip(e.Prompt, 600), clip(e.Answer, 600))
		for _, f := range e.Feedback {
			fmt.Fprintf(&b, "feedback: %s\n", clip(f, 400))
		}
	}
	return Reflection{System: memorySystem, User: b.String()}
}

const memorySystem = `You are the reflector of an AI agent. Read the agent's rewarded sessions and their feedback, work out why the failed ones failed and what the successful ones did right, and propose changes to the agent's playbook: short, general, actionable lessons it will read before every answer.
Reply with one JSON object and nothing else:
{"deltas": [{"op": "add", "content": "lesson", "sessions": ["session ids it rests on"]},
            {"op": "edit", "id": "existing item id", "content": "better wording", "sessions": [...]},
            {"op": "retire", "id": "existing item id", "sessions": [...]}]}
Propose at most 5 deltas. Every delta cites at least one session above. A lesson states what to do, in at most 300 characters; it never quotes names, numbers, addresses or other personal data from the sessions. Propose no delta when the sessions teach nothing new.`

// ParseDeltas reads the reflector's reply.
func ParseDeltas(reply string) ([]Delta, error) {
	var v struct {
		Deltas []Delta `json:"deltas"`
	}
	if err := decodeReply(reply, &v); err != nil {
		return nil, err
	}
	return v.Deltas, nil
}

// Curation says what merging a reflection's deltas did, and why any was
// refused.
type Curation struct {
	Added, Edited, Retired int
	Refused                []string
}

// ApplyDeltas merges deltas into tenant's part of old: a delta must cite
// at least one session of cited (the evidence the reflector was shown),
// and an edit or retirement must name an item of tenant; an added or
// edited item's content is at most MaxItemBytes. The result is curated
// (CuratePlaybook: duplicates merge, harmful items retire, max per tenant).
// Other tenants' items are untouched.
func ApplyDeltas(old artefact.Playbook, tenant string, deltas []Delta, cited map[string]bool, max int) (artefact.Playbook, Curation) {
	var c Curation
	items := append([]artefact.PlaybookItem(nil), old.Items...)
	index := func(id string) int {
		for i, it := range items {
			if it.Tenant == tenant && it.ID == id {
				return i
			}
		}
		return -1
	}
	var add []artefact.PlaybookItem
	for k, d := range deltas {
		var sessions []string
		for _, s := range d.Sessions {
			if cited[s] {
				sessions = append(sessions, s)
			}
		}
		refuse := func(why string) { c.Refused = append(c.Refused, fmt.Sprintf("delta %d (%s): %s", k+1, d.Op, why)) }
		content := strings.Join(strings.Fields(d.Content), " ")
		switch {
		case len(sessions) == 0:
			refuse("cites none of the sessions it was shown")
			continue
		case d.Op != DeltaRetire && (content == "" || len(content) > MaxItemBytes):
			refuse(fmt.Sprintf("content must be 1 to %d bytes", MaxItemBytes))
			continue
		}
		switch d.Op {
		case DeltaAdd:
			add = append(add, artefact.PlaybookItem{ID: ItemID(tenant, content), Content: content, Tenant: tenant, Sessions: sessions})
			c.Added++
		case DeltaEdit:
			i := index(d.ID)
			if i < 0 {
				refuse(fmt.Sprintf("no item %q of this tenant", d.ID))
				continue
			}
			items[i].Content, items[i].Sessions = content, JoinSessions(items[i].Sessions, sessions)
			c.Edited++
		case DeltaRetire:
			i := index(d.ID)
			if i < 0 {
				refuse(fmt.Sprintf("no item %q of this tenant", d.ID))
				continue
			}
			items = append(items[:i], items[i+1:]...)
			c.Retired++
		default:
			refuse("op is not add, edit or retire")
		}
	}
	return CuratePlaybook(artefact.Playbook{Items: items}, add, max), c
}

// ItemID is the id of tenant's item with content: stable, so the same
// lesson proposed twice is one item.
func ItemID(tenant, content string) string {
	sum := sha256.Sum256([]byte(tenant + "\x00" + strings.ToLower(strings.Join(strings.Fields(content), " "))))
	return "p" + hex.EncodeToString(sum[:4])
}

// ItemSession is a rewarded session of a tenant and the items it was
// shown.
type ItemSession struct {
	Tenant  string
	Items   map[string]bool
	Outcome float64
}

// CountOutcomes sets every item's helpful and harmful counts from live
// outcomes: the rewarded sessions of its tenant that were shown it and
// succeeded (outcome above 0) or failed (below 0).
func CountOutcomes(pb artefact.Playbook, sessions []ItemSession) artefact.Playbook {
	out := artefact.Playbook{Items: append([]artefact.PlaybookItem(nil), pb.Items...)}
	for i := range out.Items {
		it := &out.Items[i]
		it.Helpful, it.Harmful = 0, 0
		for _, s := range sessions {
			if s.Tenant != it.Tenant || !s.Items[it.ID] {
				continue
			}
			switch {
			case s.Outcome > 0:
				it.Helpful++
			case s.Outcome < 0:
				it.Harmful++
			}
		}
	}
	return out
}

// ToolCase is one failed call of a tool: the arguments the model passed
// and what the tool answered.
type ToolCase struct {
	Arguments string
	Error     string
}

// ToolReflection asks for a better description and parameter docs of
// tool, from the calls that failed.
func ToolReflection(tool inference.Tool, cases []ToolCase) Reflection {
	var b strings.Builder
	params := string(tool.Parameters)
	if params == "" {
		params = "{}"
	}
	fmt.Fprintf(&b, "Tool %q\ndescription: %s\nparameters (JSON schema): %s\n\nFailed calls:\n", tool.Name, tool.Description, clip(params, 4000))
	for _, c := range cases {
		fmt.Fprintf(&b, "- arguments %s\n  tool answered: %s\n", clip(c.Arguments, 400), clip(c.Error, 400))
	}
	return Reflection{System: toolSystem, User: b.String()}
}

const toolSystem = `You are the reflector of an AI agent. The agent's calls of one tool keep failing. Read the tool's schema and the failed calls, work out what the model misunderstood, and rewrite the tool's description and the descriptions of its parameters so that a model reading them passes valid arguments.
Reply with one JSON object and nothing else:
{"description": "the new tool description", "parameters": {the same JSON schema with better "description" fields}}
Change only descriptions: keep every property name, type, enum, format and the required list as they are. Quote no data from the failed calls.`

// ParseToolRewrite reads the reflector's rewrite of tool: a new
// description, and parameters that differ from tool's only in their
// descriptions (nil parameters keep tool's).
func ParseToolRewrite(reply string, tool inference.Tool) (artefact.ToolOverride, error) {
	var v struct {
		Description string          `json:"description"`
		Parameters  json.RawMessage `json:"parameters"`
	}
	if err := decodeReply(reply, &v); err != nil {
		return artefact.ToolOverride{}, err
	}
	d := strings.TrimSpace(v.Description)
	if d == "" || len(d) > 2000 {
		return artefact.ToolOverride{}, errors.New("the rewrite's description must be 1 to 2000 bytes")
	}
	o := artefact.ToolOverride{Description: d}
	if len(v.Parameters) == 0 || bytes.Equal(bytes.TrimSpace(v.Parameters), []byte("null")) {
		return o, nil
	}
	if len(tool.Parameters) == 0 {
		return artefact.ToolOverride{}, errors.New("the rewrite adds parameters to a tool that has none")
	}
	same, err := sameBesidesDescriptions(tool.Parameters, v.Parameters)
	if err != nil {
		return artefact.ToolOverride{}, err
	}
	if !same {
		return artefact.ToolOverride{}, errors.New("the rewrite changes the parameters' schema beyond their descriptions")
	}
	o.Parameters = v.Parameters
	return o, nil
}

// sameBesidesDescriptions reports whether two JSON schemas are equal once
// every "description" is removed.
func sameBesidesDescriptions(a, b json.RawMessage) (bool, error) {
	var x, y any
	if err := json.Unmarshal(a, &x); err != nil {
		return false, fmt.Errorf("the tool's parameters: %w", err)
	}
	if err := json.Unmarshal(b, &y); err != nil {
		return false, fmt.Errorf("the rewrite's parameters: %w", err)
	}
	ca, _ := json.Marshal(dropDescriptions(x))
	cb, _ := json.Marshal(dropDescriptions(y))
	return bytes.Equal(ca, cb), nil
}

func dropDescriptions(v any) any {
	switch t := v.(type) {
	case map[string]any:
		out := make(map[string]any, len(t))
		for k, e := range t {
			if k != "description" {
				out[k] = dropDescriptions(e)
			}
		}
		return out
	case []any:
		out := make([]any, len(t))
		for i, e := range t {
			out[i] = dropDescriptions(e)
		}
		return out
	}
	return v
}

// decodeReply decodes the JSON object in a model's reply: the whole text,
// or the first {...} in it (a model may wrap it in a code fence).
func decodeReply(reply string, v any) error {
	s := strings.TrimSpace(reply)
	if i, j := strings.Index(s, "{"), strings.LastIndex(s, "}"); i >= 0 && j > i {
		s = s[i : j+1]
	}
	if err := json.Unmarshal([]byte(s), v); err != nil {
		return fmt.Errorf("the reflector's reply is not the JSON object asked for: %w (reply %q)", err, clip(reply, 200))
	}
	return nil
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	cut := n
	for cut > 0 && !utf8Start(s[cut]) {
		cut--
	}
	return s[:cut] + "…"
}

func utf8Start(b byte) bool { return b&0xC0 != 0x80 }

// Cited is the set of eps's sessions: what a reflection's deltas may cite.
func Cited(eps []Episode) map[string]bool {
	out := make(map[string]bool, len(eps))
	for _, e := range eps {
		out[e.Session] = true
	}
	return out
}
