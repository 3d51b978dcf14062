package parquetbatch

import (
	"context"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/apache/arrow-go/v18/arrow"
	"github.com/apache/arrow-go/v18/arrow/array"
	"github.com/apache/arrow-go/v18/arrow/memory"
	"github.com/apache/arrow-go/v18/parquet"
	"github.com/apache/arrow-go/v18/parquet/file"
	"github.com/apache/arrow-go/v18/parquet/pqarrow"
)

// sampleRows covers empty lists, unicode strings and extreme values.
func sampleRows() []Row {
	return []Row{
		{
			SampleID: 1, TenantID: "acme", SessionID: "sess-1", TaskID: "task-1", GroupID: "g1",
			PromptIDs:     []int32{101, 102, 103},
			CompletionIDs: []int32{7, 8, 9, 10},
			LossMask:      []uint8{0, 1, 1, 0},
			Logprobs:      []float32{-0.5, -1.25, 0, float32(math.Inf(-1))},
			Versions:      []int64{3, 3, 4, 4},
			Advantage:     0.75, Reward: 1,
		},
		{
			SampleID: math.MinInt64, TenantID: "テナント", SessionID: "séssion 🚀", TaskID: "задача", GroupID: "",
			PromptIDs:     []int32{math.MaxInt32, math.MinInt32},
			CompletionIDs: []int32{},
			LossMask:      []uint8{},
			Logprobs:      []float32{},
			Versions:      []int64{},
			Advantage:     -math.MaxFloat64, Reward: math.SmallestNonzeroFloat64,
		},
		{
			SampleID: math.MaxInt64, TenantID: "", SessionID: "", TaskID: "", GroupID: "g\x00z",
			PromptIDs:     []int32{},
			CompletionIDs: []int32{0},
			LossMask:      []uint8{1},
			Logprobs:      []float32{-math.MaxFloat32},
			Versions:      []int64{math.MaxInt64},
			Advantage:     0, Reward: -2.5,
		},
	}
}

func randomRows(n int) []Row {
	rng := rand.New(rand.NewPCG(1, 2))
	rows := make([]Row, n)
	for i := range rows {
		p, c := rng.IntN(50), rng.IntN(200)
		r := Row{
			SampleID:      int64(i) * 7919,
			TenantID:      "tenant-" + string(rune('a'+rng.IntN(26))),
			SessionID:     "session-" + string(rune('α'+rng.IntN(20))),
			TaskID:        "task",
			PromptIDs:     make([]int32, p),
			CompletionIDs: make([]int32, c),
			LossMask:      make([]uint8, c),
			Logprobs:      make([]float32, c),
			Versions:      make([]int64, c),
			Advantage:     rng.NormFloat64(),
			Reward:        rng.Float64(),
		}
		if i%3 == 0 {
			r.GroupID = "group-" + string(rune('0'+i%10))
		}
		for j := range r.PromptIDs {
			r.PromptIDs[j] = rng.Int32()
		}
		for j := range c {
			r.CompletionIDs[j] = rng.Int32N(150000)
			r.LossMask[j] = uint8(rng.IntN(2))
			r.Logprobs[j] = -rng.Float32() * 10
			r.Versions[j] = int64(100 + rng.IntN(3))
		}
		rows[i] = r
	}
	return rows
}

// TestArrowReadsWrite reads a file Write wrote with arrow-go, an independent
// Parquet implementation, and checks its schema, metadata and every value.
func TestArrowReadsWrite(t *testing.T) {
	path := filepath.Join(t.TempDir(), "batch.parquet")
	rows := sampleRows()
	meta := map[string]string{"run": "run-42", "note": "ünïcode ✓"}
	if err := Write(path, meta, rows); err != nil {
		t.Fatal(err)
	}

	pr, err := file.OpenParquetFile(path, false)
	if err != nil {
		t.Fatal(err)
	}
	defer pr.Close()

	kv := pr.MetaData().KeyValueMetadata()
	for k, want := range map[string]string{"flywheel.protocol": Protocol, "run": "run-42", "note": "ünïcode ✓"} {
		if got := kv.FindValue(k); got == nil || *got != want {
			t.Errorf("metadata %q = %v, want %q", k, got, want)
		}
	}
	if kv.Len() != 3 {
		t.Errorf("metadata has %d keys %v, want 3", kv.Len(), kv.Keys())
	}

	// Physical and logical Parquet types, as arrow-go sees them.
	wantLeaves := []struct{ path, physical, logical string }{
		{"sample_id", "INT64", "Int(bitWidth=64, isSigned=true)"},
		{"tenant_id", "BYTE_ARRAY", "String"},
		{"session_id", "BYTE_ARRAY", "String"},
		{"task_id", "BYTE_ARRAY", "String"},
		{"group_id", "BYTE_ARRAY", "String"},
		{"prompt_ids.list.element", "INT32", "Int(bitWidth=32, isSigned=true)"},
		{"completion_ids.list.element", "INT32", "Int(bitWidth=32, isSigned=true)"},
		{"loss_mask.list.element", "INT32", "Int(bitWidth=8, isSigned=false)"},
		{"logprobs.list.element", "FLOAT", "None"},
		{"versions.list.element", "INT64", "Int(bitWidth=64, isSigned=true)"},
		{"advantage", "DOUBLE", "None"},
		{"reward", "DOUBLE", "None"},
	}
	sc := pr.MetaData().Schema
	if sc.NumColumns() != len(wantLeaves) {
		t.Fatalf("%d leaf columns, want %d", sc.NumColumns(), len(wantLeaves))
	}
	for i, w := range wantLeaves {
		c := sc.Column(i)
		got := struct{ path, physical, logical string }{c.Path(), c.PhysicalType().String(), c.LogicalType().String()}
		if got != w {
			t.Errorf("leaf %d = %+v, want %+v", i, got, w)
		}
		t.Logf("leaf %-28s %-10s %s (max def %d, max rep %d)", c.Path(), got.physical, got.logical, c.MaxDefinitionLevel(), c.MaxRepetitionLevel())
	}
	for i := range sc.Root().NumFields() {
		f := sc.Root().Field(i)
		if r := f.RepetitionType(); r != parquet.Repetitions.Required {
			t.Errorf("column %s is %s, want required", f.Name(), r)
		}
		if i >= 5 && i <= 9 {
			if lt := f.LogicalType().String(); lt != "List" {
				t.Errorf("column %s logical type %s, want List", f.Name(), lt)
			}
		}
	}

	fr, err := pqarrow.NewFileReader(pr, pqarrow.ArrowReadProperties{}, memory.DefaultAllocator)
	if err != nil {
		t.Fatal(err)
	}
	as, err := fr.Schema()
	if err != nil {
		t.Fatal(err)
	}
	list := func(dt arrow.DataType) arrow.DataType {
		return arrow.ListOfField(arrow.Field{Name: "element", Type: dt})
	}
	wantFields := []arrow.Field{
		{Name: "sample_id", Type: arrow.PrimitiveTypes.Int64},
		{Name: "tenant_id", Type: arrow.BinaryTypes.String},
		{Name: "session_id", Type: arrow.BinaryTypes.String},
		{Name: "task_id", Type: arrow.BinaryTypes.String},
		{Name: "group_id", Type: arrow.BinaryTypes.String},
		{Name: "prompt_ids", Type: list(arrow.PrimitiveTypes.Int32)},
		{Name: "completion_ids", Type: list(arrow.PrimitiveTypes.Int32)},
		{Name: "loss_mask", Type: list(arrow.PrimitiveTypes.Uint8)},
		{Name: "logprobs", Type: list(arrow.PrimitiveTypes.Float32)},
		{Name: "versions", Type: list(arrow.PrimitiveTypes.Int64)},
		{Name: "advantage", Type: arrow.PrimitiveTypes.Float64},
		{Name: "reward", Type: arrow.PrimitiveTypes.Float64},
	}
	if as.NumFields() != len(wantFields) {
		t.Fatalf("arrow schema has %d fields, want %d:\n%v", as.NumFields(), len(wantFields), as)
	}
	for i, w := range wantFields {
		f := as.Field(i)
		if f.Name != w.Name || f.Nullable || !arrow.TypeEqual(f.Type, w.Type) {
			t.Errorf("arrow field %d = %s: %s (nullable %v), want %s: %s (not null)", i, f.Name, f.Type, f.Nullable, w.Name, w.Type)
		}
	}
	t.Logf("arrow schema:\n%v", as)

	tbl, err := fr.ReadTable(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer tbl.Release()
	if got := fromArrow(t, tbl); !reflect.DeepEqual(got, rows) {
		t.Errorf("arrow read\n%+v\nwant\n%+v", got, rows)
	}
}

// fromArrow converts a table with the protocol's schema back to rows.
func fromArrow(t *testing.T, tbl arrow.Table) []Row {
	t.Helper()
	cols := make([]arrow.Array, tbl.NumCols())
	for i := range cols {
		ch := tbl.Column(i).Data()
		if len(ch.Chunks()) != 1 {
			t.Fatalf("column %d has %d chunks", i, len(ch.Chunks()))
		}
		cols[i] = ch.Chunk(0)
		if n := cols[i].NullN(); n != 0 {
			t.Errorf("column %s has %d nulls", tbl.Schema().Field(i).Name, n)
		}
	}
	str := func(c, i int) string { return cols[c].(*array.String).Value(i) }
	f64 := func(c, i int) float64 { return cols[c].(*array.Float64).Value(i) }
	values := func(c, i int) arrow.Array {
		l := cols[c].(*array.List)
		if l.IsNull(i) {
			t.Errorf("column %s row %d: null list", tbl.Schema().Field(c).Name, i)
		}
		start, end := l.ValueOffsets(i)
		return array.NewSlice(l.ListValues(), start, end)
	}
	rows := make([]Row, tbl.NumRows())
	for i := range rows {
		rows[i] = Row{
			SampleID:      cols[0].(*array.Int64).Value(i),
			TenantID:      str(1, i),
			SessionID:     str(2, i),
			TaskID:        str(3, i),
			GroupID:       str(4, i),
			PromptIDs:     append([]int32{}, values(5, i).(*array.Int32).Int32Values()...),
			CompletionIDs: append([]int32{}, values(6, i).(*array.Int32).Int32Values()...),
			LossMask:      append([]uint8{}, values(7, i).(*array.Uint8).Uint8Values()...),
			Logprobs:      append([]float32{}, values(8, i).(*array.Float32).Float32Values()...),
			Versions:      append([]int64{}, values(9, i).(*array.Int64).Int64Values()...),
			Advantage:     f64(10, i),
			Reward:        f64(11, i),
		}
	}
	return rows
}

// writeArrow writes the JSON rows jsonRows with arrow-go, as pyarrow would:
// nullable columns and elements. drop names a column to leave out.
func writeArrow(t *testing.T, path string, meta map[string]string, jsonRows, drop string) {
	t.Helper()
	nullList := func(dt arrow.DataType) arrow.DataType { return arrow.ListOf(dt) }
	fields := []arrow.Field{
		{Name: "sample_id", Type: arrow.PrimitiveTypes.Int64, Nullable: true},
		{Name: "tenant_id", Type: arrow.BinaryTypes.String, Nullable: true},
		{Name: "session_id", Type: arrow.BinaryTypes.String, Nullable: true},
		{Name: "task_id", Type: arrow.BinaryTypes.String, Nullable: true},
		{Name: "group_id", Type: arrow.BinaryTypes.String, Nullable: true},
		{Name: "prompt_ids", Type: nullList(arrow.PrimitiveTypes.Int32), Nullable: true},
		{Name: "completion_ids", Type: nullList(arrow.PrimitiveTypes.Int32), Nullable: true},
		{Name: "loss_mask", Type: nullList(arrow.PrimitiveTypes.Uint8), Nullable: true},
		{Name: "logprobs", Type: nullList(arrow.PrimitiveTypes.Float32), Nullable: true},
		{Name: "versions", Type: nullList(arrow.PrimitiveTypes.Int64), Nullable: true},
		{Name: "advantage", Type: arrow.PrimitiveTypes.Float64, Nullable: true},
		{Name: "reward", Type: arrow.PrimitiveTypes.Float64, Nullable: true},
	}
	fields = slices.DeleteFunc(fields, func(f arrow.Field) bool { return f.Name == drop })
	sc := arrow.NewSchema(fields, nil)
	rec, _, err := array.RecordFromJSON(memory.DefaultAllocator, sc, strings.NewReader(jsonRows))
	if err != nil {
		t.Fatal(err)
	}
	defer rec.Release()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w, err := pqarrow.NewFileWriter(sc, f, nil, pqarrow.DefaultWriterProps())
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range meta {
		if err := w.AppendKeyValueMetadata(k, v); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Write(rec); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
}

const arrowRows = `[
	{"sample_id": 5, "tenant_id": "t", "session_id": "s", "task_id": "k", "group_id": "g",
	 "prompt_ids": [1, 2], "completion_ids": [3, 4], "loss_mask": [1, 0], "logprobs": [-0.5, -2],
	 "versions": [9, 9], "advantage": 0.5, "reward": 1},
	{"sample_id": 6, "tenant_id": "t", "session_id": "s", "task_id": "k", "group_id": null,
	 "prompt_ids": [], "completion_ids": [], "loss_mask": [], "logprobs": [],
	 "versions": null, "advantage": -0.5, "reward": 0}
]`

// TestReadArrowWritten reads a file written by arrow-go with nullable columns,
// as pyarrow writes by default.
func TestReadArrowWritten(t *testing.T) {
	path := filepath.Join(t.TempDir(), "arrow.parquet")
	writeArrow(t, path, map[string]string{"flywheel.protocol": Protocol, "run": "r"}, arrowRows, "")
	meta, rows, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if meta["flywheel.protocol"] != Protocol || meta["run"] != "r" {
		t.Errorf("metadata %v", meta)
	}
	want := []Row{
		{SampleID: 5, TenantID: "t", SessionID: "s", TaskID: "k", GroupID: "g",
			PromptIDs: []int32{1, 2}, CompletionIDs: []int32{3, 4}, LossMask: []uint8{1, 0}, Logprobs: []float32{-0.5, -2},
			Versions: []int64{9, 9}, Advantage: 0.5, Reward: 1},
		{SampleID: 6, TenantID: "t", SessionID: "s", TaskID: "k",
			PromptIDs: []int32{}, CompletionIDs: []int32{}, LossMask: []uint8{}, Logprobs: []float32{},
			Versions: []int64{}, Advantage: -0.5},
	}
	if !reflect.DeepEqual(rows, want) {
		t.Errorf("read\n%+v\nwant\n%+v", rows, want)
	}
}

func TestReadRejects(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.parquet")
	if err := Write(good, nil, randomRows(20)); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(good)
	if err != nil {
		t.Fatal(err)
	}

	write := func(name string, b []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	arrowFile := func(name string, meta map[string]string, rows, drop string) string {
		p := filepath.Join(dir, name)
		writeArrow(t, p, meta, rows, drop)
		return p
	}
	proto := map[string]string{"flywheel.protocol": Protocol}
	misaligned := strings.Replace(arrowRows, `"logprobs": [-0.5, -2]`, `"logprobs": [-0.5]`, 1)
	corrupt := append([]byte{}, data...)
	for i := 4; i < len(corrupt)/2; i++ {
		corrupt[i] ^= 0x5a
	}

	cases := []struct{ name, path, want string }{
		{"missing file", filepath.Join(dir, "nope.parquet"), "no such file"},
		{"empty", write("empty", nil), "not a Parquet file"},
		{"garbage", write("garbage", []byte(strings.Repeat("not parquet at all ", 50))), "not a Parquet file"},
		{"corrupt pages", write("corrupt", corrupt), "parquetbatch: read"},
		{"wrong protocol", arrowFile("v0.parquet", map[string]string{"flywheel.protocol": "flywheel.train/v0"}, arrowRows, ""), `flywheel.protocol is "flywheel.train/v0"`},
		{"no protocol", arrowFile("noproto.parquet", nil, arrowRows, ""), "no flywheel.protocol metadata"},
		{"missing column", arrowFile("nocol.parquet", proto, arrowRows, "logprobs"), `missing column "logprobs"`},
		{"misaligned row", arrowFile("misaligned.parquet", proto, misaligned, ""), "row 0: sample 5: logprobs has 1 entries, want len(completion_ids) = 2"},
	}
	for _, c := range cases {
		_, rows, err := Read(c.path)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got error %v, want one containing %q", c.name, err, c.want)
		}
		if rows != nil {
			t.Errorf("%s: got %d rows with the error", c.name, len(rows))
		}
	}
	trunc := filepath.Join(dir, "trunc")
	for n := 1; n < len(data); n += 1 + n/4 {
		write("trunc", data[:n])
		if _, rows, err := Read(trunc); err == nil || rows != nil {
			t.Errorf("truncated to %d of %d bytes: got %d rows, error %v", n, len(data), len(rows), err)
		}
		// The same with the footer's length and magic put back.
		write("trunc", append(data[:n:n], data[len(data)-8:]...))
		if _, rows, err := Read(trunc); err == nil || rows != nil {
			t.Errorf("truncated to %d of %d bytes plus footer: got %d rows, error %v", n, len(data), len(rows), err)
		}
	}

	// Flipped bytes anywhere give an error or, where they only hit
	// statistics or padding, valid rows; Read never panics.
	rng := rand.New(rand.NewPCG(3, 4))
	for range 300 {
		b := append([]byte{}, data...)
		i := rng.IntN(len(b))
		b[i] ^= byte(1 + rng.IntN(255))
		write("flip", b)
		_, rows, err := Read(filepath.Join(dir, "flip"))
		if err == nil && len(rows) != 20 {
			t.Errorf("byte %d flipped: %d rows, no error", i, len(rows))
		}
	}
}

func TestWriteRejectsMisaligned(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "sub")
	path := filepath.Join(dir, "batch.parquet")
	rows := sampleRows()
	rows[2].Versions = nil
	err := Write(path, nil, rows)
	if err == nil || !strings.Contains(err.Error(), "row 2: sample 9223372036854775807: versions has 0 entries, want len(completion_ids) = 1") {
		t.Fatalf("Write: %v", err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("Write of an invalid batch left %s behind: %v", dir, err)
	}

	if err := Write(path, map[string]string{"flywheel.protocol": "other"}, sampleRows()); err == nil {
		t.Error("Write with a conflicting flywheel.protocol metadata succeeded")
	}
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Errorf("file left behind: %v", err)
	}
}

func TestRoundTrip(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "b")
	path := filepath.Join(dir, "batch.parquet")
	// An existing file is replaced.
	if err := Write(path, map[string]string{"old": "1"}, sampleRows()); err != nil {
		t.Fatal(err)
	}
	rows := randomRows(1000)
	meta := map[string]string{"step": "17", "flywheel.protocol": Protocol}
	if err := Write(path, meta, rows); err != nil {
		t.Fatal(err)
	}
	gotMeta, got, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(gotMeta, meta) {
		t.Errorf("metadata %v, want %v", gotMeta, meta)
	}
	if len(got) != len(rows) {
		t.Fatalf("read %d rows, want %d", len(got), len(rows))
	}
	for i := range rows {
		if !reflect.DeepEqual(got[i], rows[i]) {
			t.Fatalf("row %d:\n%+v\nwant\n%+v", i, got[i], rows[i])
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 {
		t.Errorf("directory holds %d entries, want only the batch", len(entries))
	}

	// Nil slices are written as empty lists and read back as empty slices.
	if err := Write(path, nil, []Row{{SampleID: 1}}); err != nil {
		t.Fatal(err)
	}
	_, got, err = Read(path)
	if err != nil {
		t.Fatal(err)
	}
	want := []Row{{SampleID: 1, PromptIDs: []int32{}, CompletionIDs: []int32{}, LossMask: []uint8{}, Logprobs: []float32{}, Versions: []int64{}}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("nil slices read back as %+v", got)
	}
}
