package gateway

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"hash"

	"github.com/flywheel-ai/flywheel/inference"
)

// Conversation hashing for zero-change session stitching and prompt-id
// reuse. A conversation's hash covers each message's role, text, tool
// calls and tool-call id, in order, with tool arguments canonicalised
// (clients re-serialise the JSON they were given; key order and spacing
// may change, meaning may not).

// maxStitchCandidates bounds how many earlier assistant turns of a request
// are tried as continuation points.
const maxStitchCandidates = 8

type canonMessage struct {
	Role       string      `json:"r"`
	Content    string      `json:"c,omitempty"`
	ToolCalls  []canonCall `json:"t,omitempty"`
	ToolCallID string      `json:"i,omitempty"`
}

type canonCall struct {
	ID   string `json:"i"`
	Name string `json:"n"`
	Args string `json:"a"`
}

func canonArgs(s string) string {
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		return s
	}
	b, err := json.Marshal(v)
	if err != nil {
		return s
	}
	return string(b)
}

func writeMessage(h hash.Hash, m inference.Message) {
	cm := canonMessage{Role: m.Role, Content: m.Content, ToolCallID: m.ToolCallID}
	for _, tc := range m.ToolCalls {
		cm.ToolCalls = append(cm.ToolCalls, canonCall{ID: tc.ID, Name: tc.Name, Args: canonArgs(tc.Arguments)})
	}
	b, _ := json.Marshal(cm)
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(b)))
	h.Write(n[:])
	h.Write(b)
}

// continuationHash is the hash of msgs followed by reply: what a request
// continuing this conversation starts with.
func continuationHash(msgs []inference.Message, reply inference.Message) []byte {
	h := sha256.New()
	for _, m := range msgs {
		writeMessage(h, m)
	}
	writeMessage(h, reply)
	return h.Sum(nil)
}

// prefixHashes returns the hashes of msgs[:k] for each k where msgs[k-1]
// is an assistant message (a point where an earlier call's reply ended),
// longest first, at most maxStitchCandidates.
func prefixHashes(msgs []inference.Message) [][]byte {
	h := sha256.New()
	var out [][]byte
	for _, m := range msgs {
		writeMessage(h, m)
		if m.Role == inference.RoleAssistant {
			out = append(out, h.Sum(nil))
		}
	}
	for i, j := 0, len(out)-1; i < j; i, j = i+1, j-1 {
		out[i], out[j] = out[j], out[i]
	}
	if len(out) > maxStitchCandidates {
		out = out[:maxStitchCandidates]
	}
	return out
}
