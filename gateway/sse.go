package gateway

import (
	"encoding/json"
	"net/http"
	"unicode/utf8"

	"github.com/gin-gonic/gin"
)

// sseWriter writes server-sent events and flushes each one. Write errors
// mean the client went away; they are returned so generation stops.
type sseWriter struct {
	c       *gin.Context
	started bool
}

func (w *sseWriter) start() {
	if w.started {
		return
	}
	w.started = true
	h := w.c.Writer.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("Connection", "keep-alive")
	h.Set("X-Accel-Buffering", "no")
	w.c.Status(http.StatusOK)
}

// event writes one event; name "" writes a data-only event (OpenAI).
func (w *sseWriter) event(name string, v any) error {
	w.start()
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	buf := make([]byte, 0, len(b)+len(name)+16)
	if name != "" {
		buf = append(buf, "event: "...)
		buf = append(buf, name...)
		buf = append(buf, '\n')
	}
	buf = append(buf, "data: "...)
	buf = append(buf, b...)
	buf = append(buf, "\n\n"...)
	if _, err := w.c.Writer.Write(buf); err != nil {
		return err
	}
	w.c.Writer.Flush()
	return nil
}

func (w *sseWriter) raw(s string) error {
	w.start()
	if _, err := w.c.Writer.WriteString(s); err != nil {
		return err
	}
	w.c.Writer.Flush()
	return nil
}

// utf8Carry holds back an incomplete UTF-8 sequence at the end of a
// streamed increment until the next one completes it, so no character is
// split across two events (each would be mangled on its own).
type utf8Carry struct{ pending string }

func (u *utf8Carry) next(s string) string {
	s = u.pending + s
	cut := len(s)
	for i := len(s) - 1; i >= 0 && i >= len(s)-utf8.UTFMax; i-- {
		if utf8.RuneStart(s[i]) {
			if !utf8.FullRuneInString(s[i:]) {
				cut = i
			}
			break
		}
	}
	u.pending = s[cut:]
	return validUTF8(s[:cut])
}

func (u *utf8Carry) flush() string {
	p := u.pending
	u.pending = ""
	return validUTF8(p)
}
