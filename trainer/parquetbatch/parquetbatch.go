// Package parquetbatch is the Parquet file format of Flywheel's external-trainer
// protocol "flywheel.train/v1": one file holds a batch of training samples,
// written by the Go control plane and read by any GPU trainer (pyarrow/pandas,
// verl, TRL) or by the Go trainer.
//
// This comment is the reference for the format.
//
// # Key-value metadata
//
// The file's key-value metadata always contains "flywheel.protocol" =
// "flywheel.train/v1" (see [Protocol]). Readers refuse files where it is
// missing or different. Any other keys are free-form strings chosen by the
// writer (for example a run id or the policy version the batch trains).
//
// # Schema
//
// One Parquet row per sample. The columns, in this order, are:
//
//	column          Parquet type                            Arrow type
//	sample_id       INT64                                   int64
//	tenant_id       BYTE_ARRAY (STRING)                     utf8
//	session_id      BYTE_ARRAY (STRING)                     utf8
//	task_id         BYTE_ARRAY (STRING)                     utf8
//	group_id        BYTE_ARRAY (STRING)                     utf8    "" = no GRPO group
//	prompt_ids      LIST of INT32                           list<int32>
//	completion_ids  LIST of INT32                           list<int32>
//	loss_mask       LIST of INT32 annotated INT(8, false)   list<uint8>    0 or 1 per completion token
//	logprobs        LIST of FLOAT                           list<float>    behaviour-policy log-prob per completion token
//	versions        LIST of INT64                           list<int64>    policy version that sampled each completion token
//	advantage       DOUBLE                                  double
//	reward          DOUBLE                                  double
//
// Lists use the standard three-level LIST encoding:
//
//	required group prompt_ids (LIST) {
//	  repeated group list {
//	    required int32 element;
//	  }
//	}
//
// loss_mask, logprobs and versions are token-aligned: each has exactly
// len(completion_ids) entries.
//
// # Nullability
//
// [Write] makes every column, every list and every list element required
// (non-nullable): there are no nulls in a file it writes. An empty (or nil)
// Go slice is written as an empty list, never as null, and [Read] returns an
// empty, non-nil slice for an empty list. [Read] also accepts files whose
// columns, lists or elements are nullable, as pyarrow writes by default; a
// null value reads as its Go zero value and a null list as an empty one.
//
// # Files
//
// [Write] replaces the destination atomically: it writes a temporary file in
// the same directory, fsyncs it and renames it over the destination, so a
// reader never sees a partial batch. Column data is zstd compressed.
package parquetbatch

import (
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"

	"github.com/parquet-go/parquet-go"
)

// Protocol is the value of the file's "flywheel.protocol" key-value metadata.
const Protocol = "flywheel.train/v1"

// protocolKey is the key-value metadata key that holds [Protocol].
const protocolKey = "flywheel.protocol"

// Row is one sample. Token-aligned columns (LossMask, Logprobs, Versions)
// have one entry per completion token. The comment on each field names its
// Parquet column.
type Row struct {
	SampleID      int64     // sample_id
	TenantID      string    // tenant_id
	SessionID     string    // session_id
	TaskID        string    // task_id
	GroupID       string    // group_id; "" = no GRPO group
	PromptIDs     []int32   // prompt_ids
	CompletionIDs []int32   // completion_ids
	LossMask      []uint8   // loss_mask: 1 = train on the token, 0 = not
	Logprobs      []float32 // logprobs: behaviour-policy log-prob of each completion token
	Versions      []int64   // versions: policy version that sampled each completion token
	Advantage     float64   // advantage
	Reward        float64   // reward
}

// record is Row as stored: its struct tags define the file's schema.
// parquet-go always maps a Go []uint8 to BYTE_ARRAY, so the loss mask is held
// as []int32 and annotated as an unsigned 8-bit integer.
type record struct {
	SampleID      int64     `parquet:"sample_id"`
	TenantID      string    `parquet:"tenant_id"`
	SessionID     string    `parquet:"session_id"`
	TaskID        string    `parquet:"task_id"`
	GroupID       string    `parquet:"group_id"`
	PromptIDs     []int32   `parquet:"prompt_ids,list"`
	CompletionIDs []int32   `parquet:"completion_ids,list"`
	LossMask      []int32   `parquet:"loss_mask,list" parquet-element:",uint(8)"`
	Logprobs      []float32 `parquet:"logprobs,list"`
	Versions      []int64   `parquet:"versions,list"`
	Advantage     float64   `parquet:"advantage"`
	Reward        float64   `parquet:"reward"`
}

// schema is the Parquet schema Write writes.
var schema = parquet.SchemaOf(record{})

func toRecord(r Row) record {
	mask := make([]int32, len(r.LossMask))
	for i, m := range r.LossMask {
		mask[i] = int32(m)
	}
	return record{
		SampleID: r.SampleID, TenantID: r.TenantID, SessionID: r.SessionID, TaskID: r.TaskID, GroupID: r.GroupID,
		PromptIDs: r.PromptIDs, CompletionIDs: r.CompletionIDs, LossMask: mask, Logprobs: r.Logprobs, Versions: r.Versions,
		Advantage: r.Advantage, Reward: r.Reward,
	}
}

func fromRecord(r record) (Row, error) {
	mask := make([]uint8, len(r.LossMask))
	for i, m := range r.LossMask {
		if m < 0 || m > math.MaxUint8 {
			return Row{}, fmt.Errorf("sample %d: loss_mask[%d] = %d does not fit in uint8", r.SampleID, i, m)
		}
		mask[i] = uint8(m)
	}
	return Row{
		SampleID: r.SampleID, TenantID: r.TenantID, SessionID: r.SessionID, TaskID: r.TaskID, GroupID: r.GroupID,
		PromptIDs: orEmpty(r.PromptIDs), CompletionIDs: orEmpty(r.CompletionIDs), LossMask: mask,
		Logprobs: orEmpty(r.Logprobs), Versions: orEmpty(r.Versions),
		Advantage: r.Advantage, Reward: r.Reward,
	}, nil
}

// orEmpty returns s, or an empty slice if s is nil.
func orEmpty[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

// shapes returns the shape of each top-level column of s: the physical type
// of its leaf, as "list<TYPE>" for a list, or "group" for a column with
// several leaves (a struct or map).
func shapes(s *parquet.Schema) map[string]string {
	m := make(map[string]string)
	for _, path := range s.Columns() {
		leaf, _ := s.Lookup(path...)
		shape := leaf.Node.Type().Kind().String()
		for range leaf.MaxRepetitionLevel {
			shape = "list<" + shape + ">"
		}
		if _, dup := m[path[0]]; dup {
			shape = "group"
		}
		m[path[0]] = shape
	}
	return m
}

// checkSchema reports the first column of Row's schema that s lacks or has
// with another type. Extra columns and nullability are allowed.
func checkSchema(s *parquet.Schema) error {
	have, want := shapes(s), shapes(schema)
	for _, f := range schema.Fields() {
		h, ok := have[f.Name()]
		if !ok {
			return fmt.Errorf("missing column %q", f.Name())
		}
		if w := want[f.Name()]; h != w {
			return fmt.Errorf("column %q is %s, want %s", f.Name(), h, w)
		}
	}
	return nil
}

// Validate checks that the token-aligned lists of r have one entry per
// completion token.
func (r Row) Validate() error {
	n := len(r.CompletionIDs)
	for _, c := range []struct {
		name string
		len  int
	}{
		{"loss_mask", len(r.LossMask)},
		{"logprobs", len(r.Logprobs)},
		{"versions", len(r.Versions)},
	} {
		if c.len != n {
			return fmt.Errorf("sample %d: %s has %d entries, want len(completion_ids) = %d", r.SampleID, c.name, c.len, n)
		}
	}
	return nil
}

// Write writes rows to path atomically (a temporary file in the same
// directory, fsync, rename), zstd compressed, with the key-value metadata
// meta plus "flywheel.protocol" = [Protocol]. It creates the parent directory
// if missing. It validates every row first and writes nothing if one is
// invalid.
func Write(path string, meta map[string]string, rows []Row) (err error) {
	for i, r := range rows {
		if err := r.Validate(); err != nil {
			return fmt.Errorf("parquetbatch: write %s: row %d: %w", path, i, err)
		}
	}
	if v, ok := meta[protocolKey]; ok && v != Protocol {
		return fmt.Errorf("parquetbatch: write %s: metadata %s = %q, want %q", path, protocolKey, v, Protocol)
	}

	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("parquetbatch: write %s: %w", path, err)
	}
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("parquetbatch: write %s: %w", path, err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()

	opts := []parquet.WriterOption{parquet.Compression(&parquet.Zstd), parquet.KeyValueMetadata(protocolKey, Protocol)}
	keys := make([]string, 0, len(meta))
	for k := range meta {
		if k != protocolKey {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		opts = append(opts, parquet.KeyValueMetadata(k, meta[k]))
	}

	recs := make([]record, len(rows))
	for i, r := range rows {
		recs[i] = toRecord(r)
	}
	w := parquet.NewGenericWriter[record](tmp, opts...)
	if _, err := w.Write(recs); err != nil {
		return fmt.Errorf("parquetbatch: write %s: %w", path, err)
	}
	if err := w.Close(); err != nil {
		return fmt.Errorf("parquetbatch: write %s: %w", path, err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("parquetbatch: write %s: %w", path, err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("parquetbatch: write %s: %w", path, err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("parquetbatch: write %s: %w", path, err)
	}
	// Make the rename durable; not every file system supports syncing a
	// directory, so a failure here is not reported.
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}

// Read reads a file [Write] wrote (or any file with the same column names and
// types), returning its key-value metadata (including "flywheel.protocol") and
// rows. It refuses a file whose flywheel.protocol metadata is missing or not
// [Protocol], a file missing a column, and a file with a row whose
// token-aligned lists do not have len(CompletionIDs) entries.
func Read(path string) (meta map[string]string, rows []Row, err error) {
	defer func() {
		// parquet-go may panic on a corrupt file; report that as an error.
		if p := recover(); p != nil {
			meta, rows, err = nil, nil, fmt.Errorf("parquetbatch: read %s: corrupt file: %v", path, p)
		}
	}()

	f, err := os.Open(path)
	if err != nil {
		return nil, nil, fmt.Errorf("parquetbatch: read %s: %w", path, err)
	}
	defer f.Close()
	info, err := f.Stat()
	if err != nil {
		return nil, nil, fmt.Errorf("parquetbatch: read %s: %w", path, err)
	}
	pf, err := parquet.OpenFile(f, info.Size())
	if err != nil {
		return nil, nil, fmt.Errorf("parquetbatch: read %s: not a Parquet file: %w", path, err)
	}

	meta = make(map[string]string)
	for _, kv := range pf.Metadata().KeyValueMetadata {
		meta[kv.Key] = kv.Value
	}
	switch v, ok := meta[protocolKey]; {
	case !ok:
		return nil, nil, fmt.Errorf("parquetbatch: read %s: no %s metadata, want %q", path, protocolKey, Protocol)
	case v != Protocol:
		return nil, nil, fmt.Errorf("parquetbatch: read %s: %s is %q, want %q", path, protocolKey, v, Protocol)
	}
	if err := checkSchema(pf.Schema()); err != nil {
		return nil, nil, fmt.Errorf("parquetbatch: read %s: %w", path, err)
	}

	r := parquet.NewGenericReader[record](pf)
	defer r.Close()
	recs := make([]record, pf.NumRows())
	n := 0
	for n < len(recs) {
		m, err := r.Read(recs[n:])
		n += m
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, nil, fmt.Errorf("parquetbatch: read %s: %w", path, err)
		}
		if m == 0 {
			break
		}
	}
	if n != len(recs) {
		return nil, nil, fmt.Errorf("parquetbatch: read %s: read %d rows, footer says %d", path, n, len(recs))
	}
	rows = make([]Row, n)
	for i, rec := range recs {
		if rows[i], err = fromRecord(rec); err == nil {
			err = rows[i].Validate()
		}
		if err != nil {
			return nil, nil, fmt.Errorf("parquetbatch: read %s: row %d: %w", path, i, err)
		}
	}
	return meta, rows, nil
}
