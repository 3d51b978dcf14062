package store

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"sort"

	"github.com/jackc/pgx/v5"
)

// A captured row may be stored as the suffix of an earlier row of its
// session (Prefix, migration 00021). Every reader of interactions gets
// whole rows back: this file rebuilds them, and is the one place that
// knows how a suffix is stored. The gateway decides what to store as a
// suffix (gateway/tails.go).

// turn points at one read row's fields, so that rows of any reader's type
// are rebuilt in place. Every pointer is set.
type turn struct {
	id                 int64
	prefix             Prefix
	request, response  *[]byte
	prompt, completion *[]int32
}

// conversation is a row's whole conversation (its request's messages, then
// its reply when it has one) and its token ids (prompt, then completion):
// what a later row's prefix counts into.
type conversation struct {
	messages []json.RawMessage
	ids      []int32
}

// expand rebuilds, in place, every row of turns stored as a suffix. The
// rows they continue are read from db when turns does not hold them.
func expand(ctx context.Context, db DBTX, turns []turn) error {
	have := make(map[int64]bool, len(turns))
	for _, t := range turns {
		have[t.id] = true
	}
	var missing []int64
	for _, t := range turns {
		if t.prefix.ID != 0 && !have[t.prefix.ID] {
			missing = append(missing, t.prefix.ID)
		}
	}
	if len(missing) > 0 {
		more, err := loadChains(ctx, db, missing)
		if err != nil {
			return err
		}
		for _, t := range more {
			if !have[t.id] {
				turns, have[t.id] = append(turns, t), true
			}
		}
	}
	return expandLoaded(turns)
}

// expandLoaded rebuilds the suffix rows of turns, which holds every row
// they continue. A row continues only an earlier row (a smaller id).
func expandLoaded(turns []turn) error {
	referenced := map[int64]bool{}
	for _, t := range turns {
		if t.prefix.ID != 0 {
			referenced[t.prefix.ID] = true
		}
	}
	if len(referenced) == 0 {
		return nil
	}
	sort.Slice(turns, func(i, j int) bool { return turns[i].id < turns[j].id })
	done := make(map[int64]conversation, len(referenced))
	for _, t := range turns {
		var msgs []json.RawMessage
		var fields map[string]json.RawMessage
		if t.prefix.ID != 0 || referenced[t.id] {
			var err error
			if fields, msgs, err = requestMessages(*t.request); err != nil {
				return fmt.Errorf("interaction %d: %w", t.id, err)
			}
		}
		if t.prefix.ID != 0 {
			base, ok := done[t.prefix.ID]
			switch {
			case !ok:
				return fmt.Errorf("interaction %d continues interaction %d, which is gone", t.id, t.prefix.ID)
			case t.prefix.Messages > len(base.messages) || t.prefix.Tokens > len(base.ids):
				return fmt.Errorf("interaction %d continues %d messages and %d tokens of interaction %d, which has %d and %d",
					t.id, t.prefix.Messages, t.prefix.Tokens, t.prefix.ID, len(base.messages), len(base.ids))
			}
			msgs = append(append(make([]json.RawMessage, 0, t.prefix.Messages+len(msgs)), base.messages[:t.prefix.Messages]...), msgs...)
			fields["messages"] = jsonArray(msgs)
			req, err := json.Marshal(fields)
			if err != nil {
				return fmt.Errorf("interaction %d: rebuild request: %w", t.id, err)
			}
			*t.request = req
			*t.prompt = append(append(make([]int32, 0, t.prefix.Tokens+len(*t.prompt)), base.ids[:t.prefix.Tokens]...), *t.prompt...)
		}
		if referenced[t.id] {
			c := conversation{messages: msgs}
			if reply, err := responseMessage(*t.response); err != nil {
				return fmt.Errorf("interaction %d: %w", t.id, err)
			} else if reply != nil {
				c.messages = append(c.messages[:len(c.messages):len(c.messages)], reply)
			}
			c.ids = append(append(make([]int32, 0, len(*t.prompt)+len(*t.completion)), *t.prompt...), *t.completion...)
			done[t.id] = c
		}
	}
	return nil
}

// jsonArray writes elems as one JSON array.
func jsonArray(elems []json.RawMessage) json.RawMessage {
	var b bytes.Buffer
	b.WriteByte('[')
	for i, e := range elems {
		if i > 0 {
			b.WriteByte(',')
		}
		b.Write(e)
	}
	b.WriteByte(']')
	return b.Bytes()
}

// requestMessages splits a stored request into its fields and messages.
func requestMessages(raw []byte) (map[string]json.RawMessage, []json.RawMessage, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return nil, nil, fmt.Errorf("decode stored request: %w", err)
	}
	var msgs []json.RawMessage
	if m, ok := fields["messages"]; ok && string(m) != "null" {
		if err := json.Unmarshal(m, &msgs); err != nil {
			return nil, nil, fmt.Errorf("decode stored messages: %w", err)
		}
	}
	return fields, msgs, nil
}

// responseMessage is a stored response's reply message (nil: none).
func responseMessage(raw []byte) (json.RawMessage, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var resp struct {
		Message json.RawMessage `json:"message"`
	}
	if err := json.Unmarshal(raw, &resp); err != nil {
		return nil, fmt.Errorf("decode stored response: %w", err)
	}
	if len(resp.Message) == 0 || string(resp.Message) == "null" {
		return nil, nil
	}
	return resp.Message, nil
}

// loadChains reads the rows named by ids and every row they continue,
// transitively.
func loadChains(ctx context.Context, db DBTX, ids []int64) ([]turn, error) {
	rows, err := db.Query(ctx, `
WITH RECURSIVE chain(id, prefix_id) AS (
    SELECT id, prefix_id FROM interactions WHERE id = ANY($1)
    UNION
    SELECT p.id, p.prefix_id FROM interactions p JOIN chain c ON p.id = c.prefix_id
)
SELECT i.id, coalesce(i.prefix_id, 0), i.prefix_messages, i.prefix_tokens, i.request, coalesce(i.response, 'null'::jsonb),
       coalesce(i.prompt_token_ids, '{}'), coalesce(i.completion_token_ids, '{}')
FROM interactions i WHERE i.id IN (SELECT id FROM chain)`, ids)
	if err != nil {
		return nil, fmt.Errorf("read continued interactions: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (turn, error) {
		t := turn{request: new([]byte), response: new([]byte), prompt: new([]int32), completion: new([]int32)}
		err := r.Scan(&t.id, &t.prefix.ID, &t.prefix.Messages, &t.prefix.Tokens, t.request, t.response, t.prompt, t.completion)
		return t, err
	})
	if err != nil {
		return nil, fmt.Errorf("read continued interactions: %w", err)
	}
	return out, nil
}
