// Package atdpparquet writes ATDP steps as Parquet, for pandas, DuckDB,
// Polars and Hugging Face datasets: one row per step. The columns a
// training or analysis job reads most (ids, tokens, log-probs, rewards,
// eligibility) are typed columns. The nested parts (observation, tool
// calls, reward values, redactions) are JSON text columns holding exactly
// what the JSONL export holds, so no information is lost.
//
//	column              Parquet type           Arrow type
//	step_id             STRING                 utf8
//	trajectory_id       STRING                 utf8
//	session_id          STRING                 utf8
//	tenant              STRING                 utf8
//	step_index          INT32                  int32
//	parent_step_id      STRING                 utf8     "" for a first step
//	completion_id       STRING                 utf8
//	model               STRING                 utf8
//	model_version       STRING                 utf8
//	created_at          STRING                 utf8     RFC 3339, as in the JSONL
//	observation         STRING (JSON)          utf8     {messages, tools, context, memory}
//	action_content      STRING                 utf8
//	action_tool_calls   STRING (JSON)          utf8     [] when none
//	reasoning           STRING                 utf8
//	prompt_ids          LIST<INT32>            list<int32>
//	completion_ids      LIST<INT32>            list<int32>
//	logprobs            LIST<DOUBLE>           list<double>
//	versions            LIST<STRING>           list<utf8>
//	finish_reason       STRING                 utf8
//	latency_ms          DOUBLE                 double
//	error               STRING                 utf8
//	reward_values       STRING (JSON)          utf8     [{value, source, at}]
//	reward_merged       DOUBLE, optional       double   null: no reward yet
//	reward_return       DOUBLE, optional       double
//	prompt_tokens       INT32                  int32
//	completion_tokens   INT32                  int32
//	redactions          STRING (JSON)          utf8
//	opted_out           BOOLEAN                bool
//	trainable           BOOLEAN                bool
//	ineligible_reason   STRING                 utf8
//	tool_versions       STRING (JSON)          utf8     {} when none
//
// The file's key-value metadata holds "atdp.version".
package atdpparquet

import (
	"encoding/json"
	"fmt"
	"io"

	"github.com/parquet-go/parquet-go"

	"github.com/flywheel-ai/flywheel/atdp"
)

// Row is one step as stored; its tags are the schema above. JSON columns
// hold the step's own JSON for those parts.
type Row struct {
	StepID          string    `parquet:"step_id"`
	TrajectoryID    string    `parquet:"trajectory_id"`
	SessionID       string    `parquet:"session_id"`
	Tenant          string    `parquet:"tenant"`
	StepIndex       int32     `parquet:"step_index"`
	ParentStepID    string    `parquet:"parent_step_id"`
	CompletionID    string    `parquet:"completion_id"`
	Model           string    `parquet:"model"`
	ModelVersion    string    `parquet:"model_version"`
	CreatedAt       string    `parquet:"created_at"`
	Observation     string    `parquet:"observation"`
	ActionContent   string    `parquet:"action_content"`
	ActionToolCalls string    `parquet:"action_tool_calls"`
	Reasoning       string    `parquet:"reasoning"`
	PromptIDs       []int32   `parquet:"prompt_ids,list"`
	CompletionIDs   []int32   `parquet:"completion_ids,list"`
	Logprobs        []float64 `parquet:"logprobs,list"`
	Versions        []string  `parquet:"versions,list"`
	FinishReason    string    `parquet:"finish_reason"`
	LatencyMS       float64   `parquet:"latency_ms"`
	Error           string    `parquet:"error"`
	RewardValues    string    `parquet:"reward_values"`
	RewardMerged    *float64  `parquet:"reward_merged,optional"`
	RewardReturn    *float64  `parquet:"reward_return,optional"`
	PromptTokens    int32     `parquet:"prompt_tokens"`
	CompletionTok   int32     `parquet:"completion_tokens"`
	Redactions      string    `parquet:"redactions"`
	OptedOut        bool      `parquet:"opted_out"`
	Trainable       bool      `parquet:"trainable"`
	Reason          string    `parquet:"ineligible_reason"`
	ToolVersions    string    `parquet:"tool_versions"`
}

// Writer writes steps to a Parquet stream; Close writes the footer.
type Writer struct {
	w *parquet.GenericWriter[Row]
}

// NewWriter starts a Parquet file on out.
func NewWriter(out io.Writer) *Writer {
	return &Writer{w: parquet.NewGenericWriter[Row](out,
		parquet.Compression(&parquet.Zstd), parquet.KeyValueMetadata("atdp.version", atdp.Version))}
}

// Write adds steps as rows.
func (w *Writer) Write(steps ...*atdp.Step) error {
	rows := make([]Row, len(steps))
	for i, s := range steps {
		r, err := toRow(s)
		if err != nil {
			return err
		}
		rows[i] = r
	}
	_, err := w.w.Write(rows)
	return err
}

// Flush ends the current Row group, so what was written so far reaches
// out (a stream sends it on).
func (w *Writer) Flush() error { return w.w.Flush() }

// Close writes the footer; the file is complete only then.
func (w *Writer) Close() error { return w.w.Close() }

// Read reads a file Writer wrote.
func Read(r io.ReaderAt, size int64) ([]Row, error) {
	return parquet.Read[Row](r, size)
}

func toRow(s *atdp.Step) (Row, error) {
	js := func(v any, empty string) (string, error) {
		b, err := json.Marshal(v)
		if err != nil {
			return "", err
		}
		if string(b) == "null" {
			return empty, nil
		}
		return string(b), nil
	}
	m := s.Metadata
	r := Row{
		StepID: m.StepID, TrajectoryID: m.TrajectoryID, SessionID: m.SessionID, Tenant: m.Tenant, StepIndex: int32(m.StepIndex),
		ParentStepID: m.ParentStepID, CompletionID: m.CompletionID, Model: m.Model, ModelVersion: m.ModelVersion, CreatedAt: m.CreatedAt,
		ActionContent: s.Action.Message.Content, Reasoning: s.InternalState.Reasoning,
		PromptIDs: ints32(s.Action.Tokens.PromptIDs), CompletionIDs: ints32(s.Action.Tokens.CompletionIDs),
		Logprobs: orEmpty(s.Action.Tokens.Logprobs), Versions: orEmpty(s.Action.Tokens.Versions),
		FinishReason: s.Result.FinishReason, LatencyMS: s.Result.LatencyMS, Error: s.Result.Error,
		RewardMerged: s.Reward.Merged, RewardReturn: s.Reward.Return,
		PromptTokens: int32(m.Usage.PromptTokens), CompletionTok: int32(m.Usage.CompletionTokens),
		OptedOut: m.Consent.OptOut, Trainable: m.Eligibility.Trainable, Reason: m.Eligibility.Reason,
	}
	var err error
	for _, f := range []struct {
		dst   *string
		v     any
		empty string
	}{
		{&r.Observation, s.Observation, "{}"}, {&r.ActionToolCalls, s.Action.Message.ToolCalls, "[]"},
		{&r.RewardValues, s.Reward.Values, "[]"}, {&r.Redactions, m.Redactions, "[]"}, {&r.ToolVersions, m.ToolVersions, "{}"},
	} {
		if *f.dst, err = js(f.v, f.empty); err != nil {
			return Row{}, fmt.Errorf("step %s: %w", m.StepID, err)
		}
	}
	return r, nil
}

func ints32(xs []int) []int32 {
	out := make([]int32, len(xs))
	for i, x := range xs {
		out[i] = int32(x)
	}
	return out
}

func orEmpty[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
