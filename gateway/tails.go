package gateway

import (
	"container/list"
	"reflect"
	"sync"

	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/store"
)

// An agent resends its whole conversation on every turn. Capture stores a
// turn as the suffix beyond the last turn this gateway committed for the
// session (store.Prefix), so a session's storage grows with its new
// messages and tokens only. tails remembers those last turns, bounded in
// bytes; a session it no longer holds (evicted, or served by another
// gateway or process) has its next turn stored whole, which is always
// correct.

// defaultTailBytes bounds the remembered turns: about 1,000 sessions of a
// 30 kB conversation each.
const defaultTailBytes = 64 << 20

type tailKey struct{ tenant, session string }

// tail is a committed turn: its conversation (the request's messages as
// stored, then the reply) and its token ids (prompt, then completion).
type tail struct {
	key      tailKey
	id       int64
	messages []inference.Message
	ids      []int32
	bytes    int
}

type tails struct {
	mu    sync.Mutex
	max   int
	bytes int
	lru   *list.List // of *tail, most recent first
	byKey map[tailKey]*list.Element
}

func newTails(maxBytes int) *tails {
	return &tails{max: maxBytes, lru: list.New(), byKey: map[tailKey]*list.Element{}}
}

func (t *tails) get(k tailKey) *tail {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.byKey[k]
	if !ok {
		return nil
	}
	t.lru.MoveToFront(e)
	return e.Value.(*tail)
}

// put remembers tl as its session's last turn, evicting the least recently
// used sessions beyond the bound.
func (t *tails) put(tl *tail) {
	tl.bytes = 4*len(tl.ids) + 64
	for _, m := range tl.messages {
		tl.bytes += len(m.Content) + len(m.Reasoning) + 64
		for _, c := range m.ToolCalls {
			tl.bytes += len(c.Arguments) + len(c.Name) + len(c.ID)
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	t.removeLocked(tl.key)
	if tl.bytes > t.max {
		return
	}
	t.byKey[tl.key] = t.lru.PushFront(tl)
	t.bytes += tl.bytes
	for t.bytes > t.max {
		t.removeLocked(t.lru.Back().Value.(*tail).key)
	}
}

func (t *tails) forget(k tailKey) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.removeLocked(k)
}

func (t *tails) removeLocked(k tailKey) {
	if e, ok := t.byKey[k]; ok {
		t.bytes -= e.Value.(*tail).bytes
		t.lru.Remove(e)
		delete(t.byKey, k)
	}
}

// suffix is what a turn stores given its session's last turn prev (nil:
// none): the messages and prompt ids beyond the prefix they share, and
// that prefix. Messages are shared only when equal in every field, so the
// stored prefix rebuilds them exactly.
func suffix(prev *tail, messages []inference.Message, prompt []int32) ([]inference.Message, []int32, store.Prefix) {
	if prev == nil {
		return messages, prompt, store.Prefix{}
	}
	m := 0
	for m < len(messages) && m < len(prev.messages) && reflect.DeepEqual(messages[m], prev.messages[m]) {
		m++
	}
	k := 0
	for k < len(prompt) && k < len(prev.ids) && prompt[k] == prev.ids[k] {
		k++
	}
	if m == 0 && k == 0 {
		return messages, prompt, store.Prefix{}
	}
	return messages[m:], prompt[k:], store.Prefix{ID: prev.id, Messages: m, Tokens: k}
}
