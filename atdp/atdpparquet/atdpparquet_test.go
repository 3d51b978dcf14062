package atdpparquet

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/arrow-go/v18/parquet/file"
	"github.com/apache/arrow-go/v18/parquet/pqarrow"
	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/atdp"
)

func steps() []*atdp.Step {
	r, ret := 0.5, 0.75
	conf := 0.9
	return []*atdp.Step{{
		ATDPVersion: atdp.Version,
		Observation: atdp.Observation{Messages: []atdp.Message{{Role: "user", Content: "count to três"}},
			Tools: []atdp.Tool{{Name: "ls", Version: "2"}}},
		InternalState: atdp.InternalState{Reasoning: "think", Confidence: &conf},
		Action: atdp.Action{Message: atdp.Message{Role: "assistant", Content: "1 2 3",
			ToolCalls: []atdp.ToolCall{{ID: "c1", Name: "ls", Arguments: `{"dir":"."}`}}},
			Tokens: atdp.Tokens{PromptIDs: []int{1, 2, 3}, CompletionIDs: []int{4, 5}, Logprobs: []float64{-0.5, -1.25}, Versions: []string{"d@v1", "d@v1"}}},
		Result: atdp.Result{FinishReason: "stop", LatencyMS: 12.5},
		Reward: atdp.Reward{Values: []atdp.RewardValue{{Value: 0.5, Source: "user", At: "2026-12-04T00:00:00Z"}}, Merged: &r, Return: &ret},
		Metadata: atdp.Metadata{TrajectoryID: "7", SessionID: "s", StepID: "41", StepIndex: 0, Tenant: "acme", Model: "d", ModelVersion: "d@v1",
			ToolVersions: map[string]string{"ls": "2"}, Usage: atdp.Usage{PromptTokens: 3, CompletionTokens: 2},
			Redactions:  []atdp.Redaction{{Kind: "email", Field: "observation.messages[0].content", Count: 1}},
			Eligibility: atdp.Eligibility{Trainable: true}, CreatedAt: "2026-12-04T00:00:01Z"},
	}, {
		ATDPVersion: atdp.Version,
		Result:      atdp.Result{FinishReason: "error", Error: "upstream 503"},
		Metadata: atdp.Metadata{TrajectoryID: "7", SessionID: "s", StepID: "42", StepIndex: 1, ParentStepID: "41", Tenant: "acme",
			Consent: atdp.Consent{OptOut: true, Basis: "session"}, Eligibility: atdp.Eligibility{Reason: atdp.ReasonUpstreamError}},
	}}
}

// TestArrowReadsTheExport reads the Parquet export with arrow-go, the
// Apache implementation pandas and DuckDB users get through pyarrow: the
// typed columns have their types and values, the JSON columns hold the
// step's own JSON, and a step with no reward has nulls, not zeros.
func TestArrowReadsTheExport(t *testing.T) {
	var buf bytes.Buffer
	w := NewWriter(&buf)
	require.NoError(t, w.Write(steps()...))
	require.NoError(t, w.Close())

	pf, err := file.NewParquetReader(bytes.NewReader(buf.Bytes()))
	require.NoError(t, err)
	require.Equal(t, atdp.Version, *pf.MetaData().KeyValueMetadata().FindValue("atdp.version"))
	fr, err := pqarrow.NewFileReader(pf, pqarrow.ArrowReadProperties{}, memory.DefaultAllocator)
	require.NoError(t, err)
	tbl, err := fr.ReadTable(context.Background())
	require.NoError(t, err)
	defer tbl.Release()
	require.EqualValues(t, 2, tbl.NumRows())
	col := func(name string) arrow.Array {
		idx := tbl.Schema().FieldIndices(name)
		require.Len(t, idx, 1, name)
		return tbl.Column(idx[0]).Data().Chunk(0)
	}
	types := map[string]arrow.DataType{
		"step_id": arrow.BinaryTypes.String, "step_index": arrow.PrimitiveTypes.Int32, "latency_ms": arrow.PrimitiveTypes.Float64,
		"reward_merged": arrow.PrimitiveTypes.Float64, "trainable": arrow.FixedWidthTypes.Boolean,
		"prompt_ids":  arrow.ListOfField(arrow.Field{Name: "element", Type: arrow.PrimitiveTypes.Int32}),
		"logprobs":    arrow.ListOfField(arrow.Field{Name: "element", Type: arrow.PrimitiveTypes.Float64}),
		"versions":    arrow.ListOfField(arrow.Field{Name: "element", Type: arrow.BinaryTypes.String}),
		"observation": arrow.BinaryTypes.String,
	}
	for name, want := range types {
		require.True(t, arrow.TypeEqual(col(name).DataType(), want), "%s is %s, want %s", name, col(name).DataType(), want)
	}
	require.Equal(t, "41", col("step_id").(*array.String).Value(0))
	require.Equal(t, "41", col("parent_step_id").(*array.String).Value(1))
	merged := col("reward_merged").(*array.Float64)
	require.Equal(t, 0.5, merged.Value(0))
	require.True(t, merged.IsNull(1), "no reward is null, not 0")
	require.True(t, col("reward_return").IsNull(1))
	require.Equal(t, 0.75, col("reward_return").(*array.Float64).Value(0))
	lp := col("logprobs").(*array.List)
	s, e := lp.ValueOffsets(0)
	require.Equal(t, []float64{-0.5, -1.25}, array.NewSlice(lp.ListValues(), s, e).(*array.Float64).Float64Values())
	s, e = lp.ValueOffsets(1)
	require.Equal(t, s, e, "no tokens is an empty list")
	require.Equal(t, []bool{true, false}, []bool{col("trainable").(*array.Boolean).Value(0), col("trainable").(*array.Boolean).Value(1)})
	require.Equal(t, "upstream_error", col("ineligible_reason").(*array.String).Value(1))
	require.True(t, col("opted_out").(*array.Boolean).Value(1))

	var obs atdp.Observation
	require.NoError(t, json.Unmarshal([]byte(col("observation").(*array.String).Value(0)), &obs))
	require.Equal(t, steps()[0].Observation, obs)
	var calls []atdp.ToolCall
	require.NoError(t, json.Unmarshal([]byte(col("action_tool_calls").(*array.String).Value(0)), &calls))
	require.Equal(t, steps()[0].Action.Message.ToolCalls, calls)
	require.Equal(t, "[]", col("action_tool_calls").(*array.String).Value(1))
	require.Equal(t, `{"ls":"2"}`, col("tool_versions").(*array.String).Value(0))

	rows, err := Read(bytes.NewReader(buf.Bytes()), int64(buf.Len()))
	require.NoError(t, err)
	require.Len(t, rows, 2)
	require.Equal(t, []int32{4, 5}, rows[0].CompletionIDs)
}
