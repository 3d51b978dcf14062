package atdp

import (
	"bufio"
	"bytes"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/santhosh-tekuri/jsonschema/v6"
)

// SchemaJSON is the JSON Schema of one step (draft 2020-12).
//
//go:embed atdp.schema.json
var SchemaJSON []byte

// SchemaURL names the schema resource.
const SchemaURL = "https://flywheel.dev/schemas/atdp/v1/step.json"

// MaxLineBytes bounds one JSONL line so a hostile file cannot exhaust memory.
const MaxLineBytes = 64 << 20

var (
	schemaOnce sync.Once
	schema     *jsonschema.Schema
	schemaErr  error
)

// Schema returns the compiled schema.
func Schema() (*jsonschema.Schema, error) {
	schemaOnce.Do(func() {
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(SchemaJSON))
		if err != nil {
			schemaErr = fmt.Errorf("parse atdp schema: %w", err)
			return
		}
		c := jsonschema.NewCompiler()
		c.AssertFormat()
		if err := c.AddResource(SchemaURL, doc); err != nil {
			schemaErr = fmt.Errorf("add atdp schema: %w", err)
			return
		}
		schema, schemaErr = c.Compile(SchemaURL)
		if schemaErr != nil {
			schemaErr = fmt.Errorf("compile atdp schema: %w", schemaErr)
		}
	})
	return schema, schemaErr
}

// ValidateJSON checks one encoded step against the schema.
func ValidateJSON(raw []byte) error {
	sch, err := Schema()
	if err != nil {
		return err
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		return fmt.Errorf("atdp: not JSON: %w", err)
	}
	if err := sch.Validate(inst); err != nil {
		return fmt.Errorf("atdp: schema: %w", err)
	}
	return nil
}

// Validate checks s against the schema (by encoding it) and the invariants
// the schema cannot express.
func (s *Step) Validate() error {
	c := *s
	c.Normalize()
	raw, err := json.Marshal(&c)
	if err != nil {
		return fmt.Errorf("atdp: encode: %w", err)
	}
	if err := ValidateJSON(raw); err != nil {
		return err
	}
	return s.checkInvariants()
}

// Normalize fills the version and turns nil lists the schema requires into
// empty ones, so a step built in Go encodes to a valid document.
func (s *Step) Normalize() {
	if s.ATDPVersion == "" {
		s.ATDPVersion = Version
	}
	if s.Observation.Messages == nil {
		s.Observation.Messages = []Message{}
	}
	t := &s.Action.Tokens
	if t.PromptIDs == nil {
		t.PromptIDs = []int{}
	}
	if t.CompletionIDs == nil {
		t.CompletionIDs = []int{}
	}
	if t.Logprobs == nil {
		t.Logprobs = []float64{}
	}
	if t.Versions == nil {
		t.Versions = []string{}
	}
	if s.Reward.Values == nil {
		s.Reward.Values = []RewardValue{}
	}
	if s.Metadata.Redactions == nil {
		s.Metadata.Redactions = []Redaction{}
	}
	if s.Metadata.Consent.Basis == "" {
		s.Metadata.Consent.Basis = "tenant_default"
	}
}

func (s *Step) checkInvariants() error {
	t := s.Action.Tokens
	if len(t.Logprobs) != 0 && len(t.Logprobs) != len(t.CompletionIDs) {
		return fmt.Errorf("atdp: %d logprobs for %d completion ids", len(t.Logprobs), len(t.CompletionIDs))
	}
	if len(t.Versions) > 1 && len(t.Versions) != len(t.CompletionIDs) {
		return fmt.Errorf("atdp: %d versions for %d completion ids (want 1 or one per token)", len(t.Versions), len(t.CompletionIDs))
	}
	if !s.Metadata.Eligibility.Trainable && s.Metadata.Eligibility.Reason == "" {
		return errors.New("atdp: an untrainable step must say why")
	}
	return nil
}

// Decode reads one step: valid JSON, valid against the schema, no unknown
// fields, invariants held.
func Decode(raw []byte) (*Step, error) {
	if err := ValidateJSON(raw); err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var s Step
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("atdp: decode: %w", err)
	}
	if dec.More() {
		return nil, errors.New("atdp: trailing data after the step")
	}
	if err := s.checkInvariants(); err != nil {
		return nil, err
	}
	return &s, nil
}

// Reader decodes a JSONL stream of steps.
type Reader struct {
	sc   *bufio.Scanner
	line int
}

// NewReader reads JSONL from r.
func NewReader(r io.Reader) *Reader {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), MaxLineBytes)
	return &Reader{sc: sc}
}

// Next returns the next step, or io.EOF after the last one. Blank lines are
// skipped; an error names the line.
func (r *Reader) Next() (*Step, error) {
	for r.sc.Scan() {
		r.line++
		b := bytes.TrimSpace(r.sc.Bytes())
		if len(b) == 0 {
			continue
		}
		s, err := Decode(b)
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", r.line, err)
		}
		return s, nil
	}
	if err := r.sc.Err(); err != nil {
		return nil, fmt.Errorf("line %d: %w", r.line+1, err)
	}
	return nil, io.EOF
}
