package responses

import (
	"sort"
	"strings"

	"github.com/flywheel-ai/flywheel/inference"
)

// Stream events, as the Responses API names them (each is also the SSE
// event's name).
const (
	EventCreated        = "response.created"
	EventInProgress     = "response.in_progress"
	EventCompleted      = "response.completed"
	EventIncomplete     = "response.incomplete"
	EventFailed         = "response.failed"
	EventError          = "error"
	EventItemAdded      = "response.output_item.added"
	EventItemDone       = "response.output_item.done"
	EventPartAdded      = "response.content_part.added"
	EventPartDone       = "response.content_part.done"
	EventTextDelta      = "response.output_text.delta"
	EventTextDone       = "response.output_text.done"
	EventReasoningDelta = "response.reasoning_text.delta"
	EventReasoningDone  = "response.reasoning_text.done"
	EventArgsDelta      = "response.function_call_arguments.delta"
	EventArgsDone       = "response.function_call_arguments.done"
)

// Streamer turns a generation's increments into Responses stream events:
// each output item is added when its first increment arrives and done
// when the next item starts or the generation ends, so a client sees the
// same items, with the same ids, as the final response holds.
type Streamer struct {
	// Emit writes one event; its error (the client went away) is returned
	// to the generation, which stops.
	Emit func(name string, event map[string]any) error
	// IDs are the items' ids; set IDs.New before the first event.
	IDs IDs

	seq   int
	items []*streamItem // in the order they were added
	open  *streamItem
}

type streamItem struct {
	kind  string // "reasoning", "message" or "function_call"
	id    string
	index int // output_index
	// call is the backend's index of a function call.
	call         int
	callID, name string
	text         strings.Builder
	logprobs     []Logprob
	done         bool
}

func (s *Streamer) emit(name string, ev map[string]any) error {
	ev["type"] = name
	ev["sequence_number"] = s.seq
	s.seq++
	return s.Emit(name, ev)
}

// Start announces the response (in progress, no output yet).
func (s *Streamer) Start(env Response) error {
	env.Status, env.Output = StatusInProgress, []Item{}
	if err := s.emit(EventCreated, map[string]any{"response": env}); err != nil {
		return err
	}
	return s.emit(EventInProgress, map[string]any{"response": env})
}

// item returns the open item of kind (for a function call, the one with
// that backend index), adding it, and finishing the open one, if needed.
func (s *Streamer) item(kind string, call int, d inference.ToolCallDelta) (*streamItem, error) {
	if o := s.open; o != nil && o.kind == kind && (kind != "function_call" || o.call == call) {
		return o, nil
	}
	if kind == "function_call" {
		for _, it := range s.items {
			if it.kind == kind && it.call == call && !it.done {
				return it, nil
			}
		}
	}
	if s.open != nil {
		if err := s.finishItem(s.open, nil); err != nil {
			return nil, err
		}
	}
	it := &streamItem{kind: kind, index: len(s.items), call: call, callID: d.ID, name: d.Name}
	var added Item
	switch kind {
	case "reasoning":
		it.id = s.IDs.get(&s.IDs.Reasoning, "rs_")
		added = ReasoningItem(it.id, "", StatusInProgress)
	case "message":
		it.id = s.IDs.get(&s.IDs.Message, "msg_")
		added = MessageItem(it.id, "", nil, StatusInProgress)
	default:
		n := 0
		for _, o := range s.items {
			if o.kind == kind {
				n++
			}
		}
		for len(s.IDs.Calls) <= n {
			s.IDs.Calls = append(s.IDs.Calls, "")
		}
		it.id = s.IDs.get(&s.IDs.Calls[n], "fc_")
		if it.callID == "" {
			// The client answers the call by this id: it needs it now.
			it.callID = s.IDs.New("call_")
		}
		added = CallItem(it.id, it.callID, d.Name, "", StatusInProgress)
	}
	s.items = append(s.items, it)
	s.open = it
	if err := s.emit(EventItemAdded, map[string]any{"output_index": it.index, "item": added}); err != nil {
		return nil, err
	}
	switch kind {
	case "reasoning":
		return it, s.emit(EventPartAdded, map[string]any{"item_id": it.id, "output_index": it.index, "content_index": 0,
			"part": Part{Type: "reasoning_text"}})
	case "message":
		return it, s.emit(EventPartAdded, map[string]any{"item_id": it.id, "output_index": it.index, "content_index": 0,
			"part": TextPart("", nil)})
	}
	return it, nil
}

// Delta streams one increment of the generation. logprobs are its text's
// (nil when not asked for).
func (s *Streamer) Delta(d inference.Delta, logprobs []Logprob) error {
	if d.Reasoning != "" {
		it, err := s.item("reasoning", 0, inference.ToolCallDelta{})
		if err != nil {
			return err
		}
		it.text.WriteString(d.Reasoning)
		if err := s.emit(EventReasoningDelta, map[string]any{"item_id": it.id, "output_index": it.index, "content_index": 0,
			"delta": d.Reasoning}); err != nil {
			return err
		}
	}
	if d.Text != "" {
		it, err := s.item("message", 0, inference.ToolCallDelta{})
		if err != nil {
			return err
		}
		it.text.WriteString(d.Text)
		it.logprobs = append(it.logprobs, logprobs...)
		if logprobs == nil {
			logprobs = []Logprob{}
		}
		if err := s.emit(EventTextDelta, map[string]any{"item_id": it.id, "output_index": it.index, "content_index": 0,
			"delta": d.Text, "logprobs": logprobs}); err != nil {
			return err
		}
	}
	for _, tc := range d.ToolCalls {
		it, err := s.item("function_call", tc.Index, tc)
		if err != nil {
			return err
		}
		if it.callID == "" {
			it.callID = tc.ID
		}
		if it.name == "" {
			it.name = tc.Name
		}
		if tc.Arguments == "" {
			continue
		}
		it.text.WriteString(tc.Arguments)
		if err := s.emit(EventArgsDelta, map[string]any{"item_id": it.id, "output_index": it.index, "delta": tc.Arguments}); err != nil {
			return err
		}
	}
	return nil
}

// CallIDs are the call ids the client was shown, in the order the calls
// were streamed: a backend's calls that came without one keep these.
func (s *Streamer) CallIDs() []string {
	var out []string
	for _, it := range s.items {
		if it.kind == "function_call" {
			out = append(out, it.callID)
		}
	}
	return out
}

// finishItem sends an item's done events, with final in place of what was
// streamed when the generation has ended.
func (s *Streamer) finishItem(it *streamItem, final *Item) error {
	if it.done {
		return nil
	}
	it.done = true
	if s.open == it {
		s.open = nil
	}
	var done Item
	switch it.kind {
	case "reasoning":
		done = ReasoningItem(it.id, it.text.String(), StatusCompleted)
	case "message":
		done = MessageItem(it.id, it.text.String(), it.logprobs, StatusCompleted)
	default:
		done = CallItem(it.id, it.callID, it.name, it.text.String(), StatusCompleted)
	}
	if final != nil {
		done = *final
	}
	at := map[string]any{"item_id": it.id, "output_index": it.index}
	with := func(kv ...any) map[string]any {
		m := make(map[string]any, len(at)+len(kv)/2)
		for k, v := range at {
			m[k] = v
		}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i].(string)] = kv[i+1]
		}
		return m
	}
	var err error
	switch it.kind {
	case "reasoning":
		part := done.Content[0]
		if err = s.emit(EventReasoningDone, with("content_index", 0, "text", part.Text)); err == nil {
			err = s.emit(EventPartDone, with("content_index", 0, "part", part))
		}
	case "message":
		part := done.Content[0]
		if err = s.emit(EventTextDone, with("content_index", 0, "text", part.Text, "logprobs", *part.Logprobs)); err == nil {
			err = s.emit(EventPartDone, with("content_index", 0, "part", part))
		}
	default:
		err = s.emit(EventArgsDone, with("name", done.Name, "arguments", *done.Arguments))
	}
	if err != nil {
		return err
	}
	return s.emit(EventItemDone, map[string]any{"output_index": it.index, "item": done})
}

// Finish ends the stream with the final response (from Response.Finish
// with this Streamer's IDs): items not streamed yet (a backend that holds
// back its tool calls) are streamed whole, every item is done, and the
// output is in the order the items were added.
func (s *Streamer) Finish(final *Response) error {
	byID := map[string]int{}
	for i, it := range final.Output {
		byID[it.ID] = i
	}
	for _, it := range s.items {
		if i, ok := byID[it.id]; ok {
			if err := s.finishItem(it, &final.Output[i]); err != nil {
				return err
			}
		} else if err := s.finishItem(it, nil); err != nil {
			return err
		}
	}
	streamed := map[string]int{}
	for _, it := range s.items {
		streamed[it.id] = it.index
	}
	for i := range final.Output {
		o := final.Output[i]
		if _, ok := streamed[o.ID]; ok {
			continue
		}
		it := &streamItem{kind: o.Type, id: o.ID, index: len(s.items), callID: o.CallID, name: o.Name}
		s.items = append(s.items, it)
		streamed[o.ID] = it.index
		var added Item
		switch o.Type {
		case "reasoning":
			added = ReasoningItem(o.ID, "", StatusInProgress)
		case "message":
			added = MessageItem(o.ID, "", nil, StatusInProgress)
		default:
			added = CallItem(o.ID, o.CallID, o.Name, "", StatusInProgress)
		}
		if err := s.emit(EventItemAdded, map[string]any{"output_index": it.index, "item": added}); err != nil {
			return err
		}
		var err error
		switch o.Type {
		case "reasoning":
			if err = s.emit(EventPartAdded, map[string]any{"item_id": o.ID, "output_index": it.index, "content_index": 0,
				"part": Part{Type: "reasoning_text"}}); err == nil {
				err = s.emit(EventReasoningDelta, map[string]any{"item_id": o.ID, "output_index": it.index, "content_index": 0,
					"delta": o.Content[0].Text})
			}
		case "message":
			if err = s.emit(EventPartAdded, map[string]any{"item_id": o.ID, "output_index": it.index, "content_index": 0,
				"part": TextPart("", nil)}); err == nil && o.Content[0].Text != "" {
				err = s.emit(EventTextDelta, map[string]any{"item_id": o.ID, "output_index": it.index, "content_index": 0,
					"delta": o.Content[0].Text, "logprobs": *o.Content[0].Logprobs})
			}
		default:
			err = s.emit(EventArgsDelta, map[string]any{"item_id": o.ID, "output_index": it.index, "delta": *o.Arguments})
		}
		if err != nil {
			return err
		}
		if err := s.finishItem(it, &final.Output[i]); err != nil {
			return err
		}
	}
	sort.SliceStable(final.Output, func(a, b int) bool { return streamed[final.Output[a].ID] < streamed[final.Output[b].ID] })
	name := EventCompleted
	if final.Status == StatusIncomplete {
		name = EventIncomplete
	}
	return s.emit(name, map[string]any{"response": final})
}

// Fail ends the stream with an error event and the failed response.
func (s *Streamer) Fail(env Response, code, message string) error {
	if err := s.emit(EventError, map[string]any{"code": code, "message": message, "param": nil}); err != nil {
		return err
	}
	env.Status, env.Error = StatusFailed, &Error{Code: code, Message: message}
	if env.Output == nil {
		env.Output = []Item{}
	}
	return s.emit(EventFailed, map[string]any{"response": env})
}
