package gatewaybench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/flywheel-ai/flywheel/internal/fakevllm"
	"github.com/flywheel-ai/flywheel/internal/proccpu"
	"github.com/flywheel-ai/flywheel/store"
	"github.com/flywheel-ai/flywheel/trajectory"
)

// GrowthConfig sizes `flywheel bench session-growth`: one agent session
// of Turns turns through a real gateway (in process, on loopback) in front
// of the vLLM-dialect fake, each turn adding TurnKB of tool output to the
// conversation the agent resends whole.
type GrowthConfig struct {
	// Pool is a migrated database the benchmark may write to.
	Pool   *pgxpool.Pool
	Turns  int // default 50
	TurnKB int // default 30
	Out    io.Writer
}

// GrowthTurn is one turn's figures. Bytes are logical (JSON compacted,
// token ids and logprobs 4 bytes each); disk bytes are Postgres's
// pg_column_size, after its lz4 compression.
type GrowthTurn struct {
	Turn int `json:"turn"`
	// StoredBytes and DiskBytes are what this turn's row stores.
	StoredBytes int64 `json:"stored_bytes"`
	DiskBytes   int64 `json:"disk_bytes"`
	// UniqueBytes is the session so far stored once: this turn's whole
	// row (the conversation, its token ids, the reply) and every earlier
	// turn's logprobs.
	UniqueBytes int64 `json:"unique_bytes"`
	// Ratio and DiskRatio are the session's stored bytes so far ÷ UniqueBytes.
	Ratio     float64 `json:"ratio"`
	DiskRatio float64 `json:"disk_ratio"`
	// CommitMS is the turn's capture transaction, as the gateway's
	// flywheel_gateway_capture_commit_seconds measures it (wall time).
	CommitMS float64 `json:"commit_ms"`
	// PostgresCPUMS is the CPU all local postgres processes spent during
	// the turn (/proc/PID/schedstat; -1 where Postgres is not local).
	PostgresCPUMS float64 `json:"postgres_cpu_ms"`
}

// GrowthResult is the benchmark's figures; the JSON is its last line.
type GrowthResult struct {
	Turns  int `json:"turns"`
	TurnKB int `json:"turn_kb"`
	// Ratio and DiskRatio are the whole session's stored ÷ unique bytes.
	Ratio     float64 `json:"ratio"`
	DiskRatio float64 `json:"disk_ratio"`
	// AssembledRatio is the session's ATDP steps (what assembly writes to
	// atdp_steps, each step with its whole observation, as exported) ÷
	// unique bytes.
	AssembledRatio float64 `json:"assembled_ratio"`
	// CommitFirstMS and CommitLastMS are the median capture commit of the
	// first and the last fifth of the turns; CommitGrowth their ratio (1:
	// flat in the turn number).
	CommitFirstMS float64 `json:"commit_first_ms"`
	CommitLastMS  float64 `json:"commit_last_ms"`
	CommitGrowth  float64 `json:"commit_growth"`
	// PostgresCPUFirstMS, PostgresCPULastMS and PostgresCPUGrowth are the
	// same for Postgres's CPU per turn (0 where it is not local).
	PostgresCPUFirstMS float64      `json:"postgres_cpu_first_ms"`
	PostgresCPULastMS  float64      `json:"postgres_cpu_last_ms"`
	PostgresCPUGrowth  float64      `json:"postgres_cpu_growth"`
	PerTurn            []GrowthTurn `json:"per_turn"`
}

// RunGrowth measures what a long agent session stores, turn by turn.
func RunGrowth(ctx context.Context, gc GrowthConfig) (*GrowthResult, error) {
	if gc.Turns <= 0 {
		gc.Turns = 50
	}
	if gc.TurnKB <= 0 {
		gc.TurnKB = 30
	}
	logf := func(format string, args ...any) { fmt.Fprintf(gc.Out, format+"\n", args...) }
	if err := store.EnsureTenant(ctx, gc.Pool, "bench"); err != nil {
		return nil, err
	}
	// The upstream is the named fake of vLLM's HTTP dialect, as in `bench
	// gateway`: the policy's model server cannot take a 1.5 MB conversation
	// (its context is 256 tokens), and a real vLLM needs a GPU.
	upURL, stopUp, err := serveLocal("upstream", &fakevllm.Fixture{})
	if err != nil {
		return nil, err
	}
	defer stopUp()
	srv, gwURL, key, stopGW, err := benchGateway(ctx, gc.Pool, upURL, "flywheel bench session-growth")
	if err != nil {
		return nil, err
	}
	defer stopGW()

	session := fmt.Sprintf("growth-%d", time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(1, 2))
	messages := []map[string]any{
		{"role": "system", "content": "You are a coding agent. Run tools, read their output, fix the build."},
		{"role": "user", "content": "The build of service-api fails; find out why and fix it."},
	}
	res := &GrowthResult{Turns: gc.Turns, TurnKB: gc.TurnKB}
	var tally sessionTally
	for turn := 1; turn <= gc.Turns; turn++ {
		if turn > 1 {
			messages = append(messages, map[string]any{"role": "user", "content": toolOutput(rng, turn, gc.TurnKB<<10)})
		}
		body, _ := json.Marshal(map[string]any{"model": "fixture-model", "messages": messages, "max_tokens": 48})
		t, reply, completionID, err := timedTurn(ctx, srv, gwURL, key, session, body)
		if err != nil {
			return nil, fmt.Errorf("turn %d: %w", turn, err)
		}
		t.Turn = turn
		messages = append(messages, map[string]any{"role": "assistant", "content": reply})
		if err := tally.add(ctx, gc.Pool, completionID, &t); err != nil {
			return nil, fmt.Errorf("turn %d: %w", turn, err)
		}
		res.PerTurn = append(res.PerTurn, t)
		if turn == 1 || turn%10 == 0 {
			logf("turn %2d: row %7d B (%6d B on disk), session stored %8d B for %8d B unique: ratio %.2f (on disk %.2f); capture commit %.2f ms, Postgres CPU %.2f ms",
				turn, t.StoredBytes, t.DiskBytes, tally.stored, t.UniqueBytes, t.Ratio, t.DiskRatio, t.CommitMS, t.PostgresCPUMS)
		}
	}
	last := res.PerTurn[len(res.PerTurn)-1]
	res.Ratio, res.DiskRatio = last.Ratio, last.DiskRatio
	if res.AssembledRatio, err = assembledBytes(ctx, gc.Pool, srv, session); err != nil {
		return nil, err
	}
	res.AssembledRatio /= float64(last.UniqueBytes)
	res.summarizeTimes()
	logf("%d turns of %d kB: stored ÷ unique %.2f (on disk %.2f), its ATDP steps ÷ unique %.1f; medians of the first and last fifth: capture commit %.2f → %.2f ms (×%.2f), Postgres CPU %.2f → %.2f ms (×%.2f)",
		gc.Turns, gc.TurnKB, res.Ratio, res.DiskRatio, res.AssembledRatio, res.CommitFirstMS, res.CommitLastMS, res.CommitGrowth,
		res.PostgresCPUFirstMS, res.PostgresCPULastMS, res.PostgresCPUGrowth)
	return res, nil
}

// timedTurn sends one turn of the session and measures its capture commit
// and the CPU local Postgres spent meanwhile. It returns the turn's
// figures so far, the reply's text and its completion id.
func timedTurn(ctx context.Context, srv *benchServer, gwURL, key, session string, body []byte) (GrowthTurn, string, string, error) {
	before := captureSnapshot(srv.reg)
	pgBefore, pgBeforeOK := proccpu.Named("postgres")
	reply, completionID, err := growthTurn(ctx, gwURL, key, session, body)
	if err != nil {
		return GrowthTurn{}, "", "", err
	}
	pgAfter, pgAfterOK := proccpu.Named("postgres")
	_, commit := captureSnapshot(srv.reg).since(before)
	t := GrowthTurn{CommitMS: commit, PostgresCPUMS: -1}
	if pgBeforeOK && pgAfterOK {
		t.PostgresCPUMS = float64(pgAfter-pgBefore) / 1e6
	}
	return t, reply, completionID, nil
}

// sessionTally is what the session has stored so far, turn by turn.
type sessionTally struct {
	stored, disk int64
	// logprobs counts the earlier turns' logprobs, which only their own
	// rows hold.
	logprobs int64
}

// add reads the row the turn with completionID stored, fills t's bytes
// and ratios from it and adds it to the tally.
func (s *sessionTally) add(ctx context.Context, pool *pgxpool.Pool, completionID string, t *GrowthTurn) error {
	var tenant string
	var req, resp []byte
	var nIDs, nLogprobs int64
	if err := pool.QueryRow(ctx, `SELECT tenant_id, request::text, coalesce(response::text, ''),
		coalesce(cardinality(prompt_token_ids), 0) + coalesce(cardinality(completion_token_ids), 0), coalesce(cardinality(logprobs), 0),
		pg_column_size(request) + coalesce(pg_column_size(response), 0) + coalesce(pg_column_size(prompt_token_ids), 0)
			+ coalesce(pg_column_size(completion_token_ids), 0) + coalesce(pg_column_size(logprobs), 0)
		FROM interactions WHERE completion_id = $1`, completionID).Scan(&tenant, &req, &resp, &nIDs, &nLogprobs, &t.DiskBytes); err != nil {
		return fmt.Errorf("read its row: %w", err)
	}
	t.StoredBytes = compactLen(req) + compactLen(resp) + 4*(nIDs+nLogprobs)
	whole, err := store.InteractionByCompletion(ctx, pool, tenant, completionID)
	if err != nil {
		return fmt.Errorf("read it whole: %w", err)
	}
	t.UniqueBytes = compactLen(whole.Request) + compactLen(whole.Response) +
		4*int64(len(whole.PromptTokenIDs)+len(whole.CompletionTokenIDs)+len(whole.Logprobs)) + 4*s.logprobs
	s.logprobs += int64(len(whole.Logprobs))
	s.stored, s.disk = s.stored+t.StoredBytes, s.disk+t.DiskBytes
	t.Ratio, t.DiskRatio = float64(s.stored)/float64(t.UniqueBytes), float64(s.disk)/float64(t.UniqueBytes)
	return nil
}

// summarizeTimes sets the medians of the capture commit and Postgres's CPU
// over the first and the last fifth of the turns, and their growth.
func (res *GrowthResult) summarizeTimes() {
	fifth := max(1, res.Turns/5)
	firstLast := func(f func(GrowthTurn) float64) (first, last, growth float64) {
		pick := func(ts []GrowthTurn) []float64 {
			out := make([]float64, len(ts))
			for i, t := range ts {
				out[i] = max(0, f(t))
			}
			return out
		}
		first, last = median(pick(res.PerTurn[:fifth])), median(pick(res.PerTurn[len(res.PerTurn)-fifth:]))
		if first > 0 {
			growth = last / first
		}
		return first, last, growth
	}
	res.CommitFirstMS, res.CommitLastMS, res.CommitGrowth = firstLast(func(t GrowthTurn) float64 { return t.CommitMS })
	res.PostgresCPUFirstMS, res.PostgresCPULastMS, res.PostgresCPUGrowth = firstLast(func(t GrowthTurn) float64 { return t.PostgresCPUMS })
}

// assembledBytes is the size of the session's ATDP steps as assembly
// builds them.
func assembledBytes(ctx context.Context, pool *pgxpool.Pool, srv *benchServer, session string) (float64, error) {
	rules, err := trajectory.NewRules(srv.cfg, nil)
	if err != nil {
		return 0, err
	}
	info, err := store.SessionForAssembly(ctx, pool, "bench", session)
	if err != nil {
		return 0, err
	}
	rows, err := store.SessionInteractions(ctx, pool, "bench", session)
	if err != nil {
		return 0, err
	}
	steps, _, err := trajectory.Build(info, rows, nil, rules, nil)
	if err != nil {
		return 0, err
	}
	var n float64
	for _, st := range steps {
		b, err := json.Marshal(st.ATDP)
		if err != nil {
			return 0, err
		}
		n += float64(len(b))
	}
	return n, nil
}

// growthTurn sends one turn of the session and returns the reply's text
// and its completion id.
func growthTurn(ctx context.Context, gwURL, key, session string, body []byte) (string, string, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, gwURL+"/v1/chat/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("X-Session-Id", session)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", "", err
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return "", "", fmt.Errorf("status %d: %s", resp.StatusCode, raw)
	}
	var out struct {
		ID      string `json:"id"`
		Choices []struct {
			Message struct {
				Content string `json:"content"`
			} `json:"message"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(raw, &out); err != nil || len(out.Choices) == 0 {
		return "", "", fmt.Errorf("undecodable answer: %s", raw)
	}
	return out.Choices[0].Message.Content, out.ID, nil
}

// toolOutput is about n bytes of a build log: varied enough that
// compression does not make duplicates cheap.
func toolOutput(rng *rand.Rand, turn, n int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "$ make test # attempt %d\n", turn)
	for b.Len() < n {
		fmt.Fprintf(&b, "internal/pkg%02d/file_%03d.go:%d:%d: undefined: sym_%08x (in call to handler_%04x)\n",
			rng.IntN(40), rng.IntN(500), rng.IntN(900)+1, rng.IntN(80)+1, rng.Uint32(), rng.IntN(1<<16))
	}
	return b.String()
}

func compactLen(raw []byte) int64 {
	if len(raw) == 0 {
		return 0
	}
	var b bytes.Buffer
	if json.Compact(&b, raw) != nil {
		return int64(len(raw))
	}
	return int64(b.Len())
}
