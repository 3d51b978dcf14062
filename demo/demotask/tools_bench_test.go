package demotask

import (
	"context"
	"fmt"
	"runtime"
	"testing"

	"github.com/flywheel-ai/flywheel/trainer"
)

// BenchmarkToolsPacking measures what prefix-tree packing saves on the
// tools task's training batches: GRPO groups of eight sessions of one
// request, each session's call and answer a sample, so a session's two
// samples share the call's whole sequence and a group's sessions share the
// tools and the request. It reports the speed-up of a train step of the
// tools base's shape (median of alternated steps, one core) beside the
// theoretical one (sample tokens over packed tokens).
//
//	go test -run '^$' -bench ToolsPacking ./demo/demotask/
func BenchmarkToolsPacking(b *testing.B) {
	gen, err := NewGenerator(ToolsTask, 7, nil)
	if err != nil {
		b.Fatal(err)
	}
	batch := &trainer.Batch{}
	var seqs [][]int
	for g := 0; g < 18; g++ { // a demo step: 288 samples
		p := gen.Next()
		for j := 0; j < 8; j++ {
			ss, err := toolsSamples(p, gen.RandomTool())
			if err != nil {
				b.Fatal(err)
			}
			for _, s := range ss {
				n := len(s.TokenIDs)
				s.GroupID, s.SessionID = fmt.Sprint(g), fmt.Sprint(g, "/", j)
				s.Logprobs, s.Versions, s.Reward = make([]float32, n), make([]int64, n), float64(j%2)
				batch.Samples = append(batch.Samples, s)
				seqs = append(seqs, s.TokenIDs)
			}
		}
	}
	m, err := trainer.NewModel(BaseFor(ToolsTask).WithDefaults().Model, 1)
	if err != nil {
		b.Fatal(err)
	}
	pk, err := trainer.BuildPack(seqs, true)
	if err != nil {
		b.Fatal(err)
	}
	trainer.SetParallelism(1)
	defer trainer.SetParallelism(runtime.GOMAXPROCS(0))
	b.ResetTimer()
	for range b.N {
		speedup, err := trainer.PackingSpeedup(context.Background(), m, batch, 3)
		if err != nil {
			b.Fatal(err)
		}
		b.ReportMetric(speedup, "speedup")
	}
	b.ReportMetric(float64(pk.NumSampleTokens())/float64(pk.NumNodes()), "theoretical")
}
