package tinker

import (
	"bytes"
	"encoding/json"
	"errors"
	"math/rand/v2"
	"reflect"
	"testing"
	"testing/iotest"
)

// FuzzWireJSON holds the wire's codec to encoding/json on the types a
// train step sends and receives: for any body both accept it or both
// refuse it, and what they accept they read alike; what the codec writes
// encoding/json writes byte for byte.
func FuzzWireJSON(f *testing.F) {
	req, out := wireBatch(2, 4)
	for _, v := range []any{req, out} {
		js, err := json.Marshal(v)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(string(js))
	}
	for _, s := range []string{
		`{"model_id":"m","forward_backward_input":{"data":[{"loss_fn_inputs":{"x":{"data":[1e400]}}}]}}`,
		"{\"model_id\":\"m\xff\",\"seq_id\":1.0}",
		`{"MODEL_ID":"m","Forward_Backward_Input":{"LOSS_FN":"x"},"model_id":"n"}`,
		`{"model_id":"m","forward_backward_input":{"data":[{"model_input":{"chunks":[{"tokens":[1e2,9223372036854775808]}]}}]}}`,
		`{"model_id":"\ud800","forward_backward_input":{"data":[{"loss_fn_inputs":{"x":{"data":[null,-0,0.1e-400],"shape":[true]}}}]}}`,
		`{"loss_fn_outputs":[{"logprobs":{"data":[-1.5,01]}}],"metrics":{"loss:sum":"1"}}`,
		`{} x`, `null`, `[]`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		sameDecoding[ForwardBackwardRequest](t, body)
		sameDecoding[ForwardBackwardOutput](t, body)
	})
}

func sameDecoding[T any](t *testing.T, body string) {
	var std, wire T
	errStd, errWire := json.Unmarshal([]byte(body), &std), Unmarshal([]byte(body), &wire)
	if (errStd == nil) != (errWire == nil) {
		t.Fatalf("%T from %q: encoding/json says %v, the wire's codec %v", std, body, errStd, errWire)
	}
	if errStd != nil {
		return
	}
	if !reflect.DeepEqual(std, wire) {
		t.Fatalf("%T from %q: encoding/json reads %#v, the wire's codec %#v", std, body, std, wire)
	}
	a, errA := json.Marshal(wire)
	b, errB := Marshal(wire)
	if (errA == nil) != (errB == nil) || string(a) != string(b) {
		t.Fatalf("%T: encoding/json writes %s (%v), the wire's codec %s (%v)", wire, a, errA, b, errB)
	}
}

// wireBatch is a ppo minibatch of n datums of length l, as the train step
// sends it (the first two thirds of each masked), and its answer.
func wireBatch(n, l int) (ForwardBackwardRequest, ForwardBackwardOutput) {
	r := rand.New(rand.NewPCG(1, 2))
	var data []Datum
	var outs []map[string]TensorData
	for range n {
		ids, targets := make([]int, l), make([]int, l)
		w, lp, adv, got := make([]float64, l), make([]float64, l), make([]float64, l), make([]float64, l)
		for t := range l {
			ids[t], targets[t] = r.IntN(256), r.IntN(256)
			got[t] = float64(float32(-5 * r.Float64()))
			if 3*t >= 2*l {
				w[t] = float64(float32(1 / float64(n*l/3)))
				lp[t] = float64(float32(-3 * r.Float64()))
				adv[t] = float64(float32(r.NormFloat64()))
			}
		}
		data = append(data, Datum{ModelInput: Text(ids), LossFnInputs: map[string]TensorData{
			InputTargetTokens: Ints(targets), InputWeights: Floats(w), InputLogprobs: Floats(lp), InputAdvantages: Floats(adv)}})
		outs = append(outs, map[string]TensorData{OutputLogprobs: Floats(got), OutputLoss: Floats(got)})
	}
	seq := int64(3)
	return ForwardBackwardRequest{ModelID: "m", SeqID: &seq, ForwardBackwardInput: ForwardBackwardInput{Data: data, LossFn: LossPPO}},
		ForwardBackwardOutput{LossFnOutputType: "ppo", LossFnOutputs: outs, Metrics: map[string]float64{MetricLossSum: 1}}
}

// BenchmarkWireJSON: the codec against encoding/json on a demo-sized ppo
// minibatch (48 datums of 30 tokens), each way; compare the pairs'
// MB/s, which ran in the same process.
func BenchmarkWireJSON(b *testing.B) {
	req, out := wireBatch(48, 30)
	codecs := []struct {
		name      string
		marshal   func(any) ([]byte, error)
		unmarshal func([]byte, any) error
	}{{"encoding-json", json.Marshal, json.Unmarshal}, {"wire", Marshal, Unmarshal}}
	for _, c := range codecs {
		body, err := c.marshal(req)
		if err != nil {
			b.Fatal(err)
		}
		answer, err := c.marshal(out)
		if err != nil {
			b.Fatal(err)
		}
		b.Run("encode-request/"+c.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				_, _ = c.marshal(req)
			}
		})
		b.Run("decode-request/"+c.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				var v ForwardBackwardRequest
				_ = c.unmarshal(body, &v)
			}
		})
		b.Run("decode-answer/"+c.name, func(b *testing.B) {
			b.SetBytes(int64(len(answer)))
			for b.Loop() {
				var v ForwardBackwardOutput
				_ = c.unmarshal(answer, &v)
			}
		})
	}
}

// TestReadBody reads bodies of declared, unknown and wrongly declared
// sizes whole.
func TestReadBody(t *testing.T) {
	body := bytes.Repeat([]byte("0123456789"), 10_000)
	for _, size := range []int64{int64(len(body)), -1, 0, 10, int64(len(body)) * 2, 1 << 40} {
		got, err := ReadBody(iotest.HalfReader(bytes.NewReader(body)), size)
		if err != nil || !bytes.Equal(got, body) {
			t.Fatalf("size %d: read %d bytes of %d, error %v", size, len(got), len(body), err)
		}
	}
	if _, err := ReadBody(iotest.TimeoutReader(bytes.NewReader(body)), int64(len(body))); !errors.Is(err, iotest.ErrTimeout) {
		t.Fatalf("a failed read: error %v, want %v", err, iotest.ErrTimeout)
	}
}
