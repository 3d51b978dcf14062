package gateway

import (
	"bytes"
	"encoding/json"
	"net/http"

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

func bytesReader(b []byte) *bytes.Reader { return bytes.NewReader(b) }
