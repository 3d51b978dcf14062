package modelserver_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/deployment"
	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/inference/weightsync"
	"github.com/flywheel-ai/flywheel/modelserver"
	"github.com/flywheel-ai/flywheel/upstream"
)

// TestNoFailedRequestDuringSwaps: while requests run against every served
// version, weight sync loads v3, the route moves to it and v1 is unloaded;
// no request fails, and a stream caught mid-generation by the unload
// finishes on v1's weights. KeepLoaded 2 also makes the engine evict and
// reload versions as they are asked for.
func TestNoFailedRequestDuringSwaps(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, modelserver.Config{KeepLoaded: 2})
	ws := e.weightsync(t)
	m1, p1 := e.checkpoint(t, 1, 11)
	_, p2 := e.checkpoint(t, 2, 12)
	_, p3 := e.checkpoint(t, 3, 13)
	v1, v2, v3 := served+"@v1", served+"@v2", served+"@v3"
	_, err := weightsync.Sync(ctx, ws, served+"@", map[string]string{v1: p1, v2: p2}, v2, true)
	require.NoError(t, err)

	// A stream on v1 whose client stops reading after its first tokens:
	// generation waits inside the engine, on v1's weights, across the unload.
	want := direct(t, m1, greedy("hi", ""))
	require.Greater(t, len(want.CompletionTokenIDs), 3, "the paused stream is mid-generation")
	paused, pausedDone := pausedStream(e, v1)

	var (
		routeMu  sync.RWMutex
		routes   = []string{v1, v2}
		stop     = make(chan struct{})
		wg       sync.WaitGroup
		failures atomic.Int64
		firstErr atomic.Value
		mu       sync.Mutex
		answered = map[string]int{}
	)
	fail := func(err error) {
		failures.Add(1)
		firstErr.CompareAndSwap(nil, err)
	}
	count := func(name string) int {
		mu.Lock()
		defer mu.Unlock()
		return answered[name]
	}
	for w := range 4 {
		b, err := upstream.New(upstream.Config{BaseURL: e.http.URL + "/v1", Model: served, Dialect: deployment.DialectVLLM, VersionsByName: true})
		require.NoError(t, err)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				// A route is read under the lock and held until the server
				// has started the request, as a gateway holds a version
				// until its request is admitted; an unload follows the
				// route change, never precedes it.
				routeMu.RLock()
				name := routes[(w+i)%len(routes)]
				var once sync.Once
				admitted := func() { once.Do(routeMu.RUnlock) }
				req := greedy(fmt.Sprintf("q%d", i), name)
				resp, err := b.Stream(ctx, req, func(inference.Delta) error { admitted(); return nil })
				admitted()
				if err == nil && resp.ModelVersion != name {
					err = fmt.Errorf("asked %s, answered by %s", name, resp.ModelVersion)
				}
				if err != nil {
					fail(err)
					continue
				}
				mu.Lock()
				answered[name]++
				mu.Unlock()
				if resp, err := b.Complete(ctx, greedy("base", "")); err != nil || resp.ModelVersion != served {
					fail(fmt.Errorf("base: %v %v", err, resp))
				}
			}
		}()
	}
	require.Eventually(t, func() bool { return count(v1) >= 5 && count(v2) >= 5 }, 30*time.Second, 5*time.Millisecond)

	rep, err := weightsync.Sync(ctx, ws, served+"@", map[string]string{v1: p1, v2: p2, v3: p3}, v3, true)
	require.NoError(t, err)
	require.Equal(t, []string{v3}, rep.Loaded)
	routeMu.Lock()
	routes = []string{v2, v3}
	routeMu.Unlock()
	rep, err = weightsync.Sync(ctx, ws, served+"@", map[string]string{v2: p2, v3: p3}, v3, true)
	require.NoError(t, err)
	require.Equal(t, []string{v1}, rep.Unloaded)

	close(paused.release)
	<-pausedDone
	ids, lps := streamed(t, paused.Body.String())
	require.Equal(t, want.CompletionTokenIDs, ids, "the paused stream finished on v1's weights")
	require.Equal(t, want.Logprobs, lps)

	require.Eventually(t, func() bool { return count(v3) >= 10 }, 30*time.Second, 5*time.Millisecond)
	close(stop)
	wg.Wait()
	require.Zero(t, failures.Load(), "first failure: %v", firstErr.Load())
	status, _ := e.post(t, "/v1/chat/completions", map[string]any{"model": v1, "messages": []map[string]string{{"role": "user", "content": "hi"}}})
	require.Equal(t, http.StatusNotFound, status, "v1 is gone for new requests")
}

// pausedStream starts a stream on version whose client stops reading
// after its third write; it waits there until paused.release is closed,
// and done is closed once the stream has finished.
func pausedStream(e *env, version string) (paused *pausingWriter, done chan struct{}) {
	paused = &pausingWriter{ResponseRecorder: httptest.NewRecorder(), at: 3, blocked: make(chan struct{}), release: make(chan struct{})}
	done = make(chan struct{})
	go func() {
		defer close(done)
		body := fmt.Sprintf(`{"model":%q,"messages":[{"role":"user","content":"hi"}],"max_tokens":16,"temperature":0,"stream":true,"logprobs":true,"return_token_ids":true}`, version)
		e.srv.ServeHTTP(paused, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body)))
	}()
	<-paused.blocked
	return paused, done
}

// pausingWriter blocks its at-th write until release: a client that stops
// reading, which holds the stream (and its generation) mid-way.
type pausingWriter struct {
	*httptest.ResponseRecorder
	at      int
	writes  int
	blocked chan struct{}
	release chan struct{}
}

func (w *pausingWriter) Write(b []byte) (int, error) {
	w.writes++
	if w.writes == w.at {
		close(w.blocked)
		<-w.release
	}
	return w.ResponseRecorder.Write(b)
}

// sseData is the data payloads of an SSE answer, each chunk's JSON, and
// whether it ended with [DONE].
func sseData(r io.Reader) (chunks []string, done bool) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		switch {
		case !ok:
		case data == "[DONE]":
			done = true
		default:
			chunks = append(chunks, data)
		}
	}
	return chunks, done
}

// streamed collects the token ids and logprobs of an SSE answer.
func streamed(t *testing.T, body string) ([]int, []float32) {
	t.Helper()
	var ids []int
	var lps []float32
	chunks, done := sseData(strings.NewReader(body))
	for _, data := range chunks {
		var c struct {
			Choices []struct {
				TokenIDs []int `json:"token_ids"`
				Logprobs *struct {
					Content []struct {
						Logprob float32 `json:"logprob"`
					} `json:"content"`
				} `json:"logprobs"`
			} `json:"choices"`
		}
		require.NoError(t, json.Unmarshal([]byte(data), &c))
		for _, ch := range c.Choices {
			ids = append(ids, ch.TokenIDs...)
			if ch.Logprobs != nil {
				for _, lp := range ch.Logprobs.Content {
					lps = append(lps, lp.Logprob)
				}
			}
		}
	}
	require.True(t, done, "the stream ended with [DONE]")
	return ids, lps
}
