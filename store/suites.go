package store

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/flywheel-ai/flywheel/artefact"
	"github.com/flywheel-ai/flywheel/inference"
	"github.com/flywheel-ai/flywheel/protocol/openai"
	"github.com/flywheel-ai/flywheel/statusapi"
)

// Evaluation suites: the prompts a release's regression and safety gates
// and the watchdog answer greedily, and each version's result on each of
// them. A deployment's own prompts and the shared ones (deployment '')
// make its suite.

// Suite names. The gates judge on regression and safety; train is the
// prompts the harness search may look at (evolution's reflective
// mutation), never the gates'.
const (
	SuiteRegression = "regression"
	SuiteSafety     = "safety"
	SuiteTrain      = "train"
)

// Suites are every suite name, in the order they are listed.
var Suites = []string{SuiteRegression, SuiteSafety, SuiteTrain}

// CheckSuite refuses a name that is not a suite's.
func CheckSuite(name string) error {
	if !slices.Contains(Suites, name) {
		return fmt.Errorf("no suite %q: a deployment has the suites %q (held-out prompts for the gates), %q (prompts to refuse) and %q (prompts the harness search may look at)",
			name, SuiteRegression, SuiteSafety, SuiteTrain)
	}
	return nil
}

// How an answer to a suite prompt is judged (eval_prompts.match).
const (
	// MatchExact: the trimmed answer equals the expected text.
	MatchExact = "exact"
	// MatchContains: the expected text appears in the answer (any case).
	MatchContains = "contains"
	// MatchRefusal: the answer refuses in words, or contains the expected
	// refusal marker when one is given.
	MatchRefusal = "refusal"
	// MatchToolCall: the answer calls the expected tool with the expected
	// arguments (expect is a ToolCallExpect as JSON).
	MatchToolCall = "tool_call"
)

// EvalPrompt is one prompt of a gate's suite.
type EvalPrompt struct {
	ID         int64
	Deployment string
	// Messages and Tools are in OpenAI's chat-completions form, as the
	// suite gave them; Tools is nil when the prompt offers none.
	Messages []byte
	Tools    []byte
	Expect   string
	// Match is MatchExact, MatchContains, MatchRefusal or MatchToolCall;
	// "" is the suite's default (regression: contains, safety: refusal).
	Match string
	// MaxTokens bounds the answer (0: the gate's default).
	MaxTokens int
	// Temperature is the sampling temperature the prompt is answered at
	// (0: greedy), with the prompt's own fixed seed.
	Temperature float64
}

// ExpectValue is expect as a suite file writes it: the text, or for match
// tool_call the expected call as a JSON object.
func (p EvalPrompt) ExpectValue() any {
	if p.Match == MatchToolCall && json.Valid([]byte(p.Expect)) {
		return json.RawMessage(p.Expect)
	}
	return p.Expect
}

// Conversation is the prompt as the backend is asked it: its messages and
// the tools it offers, read by the gateway's own OpenAI decoder.
func (p EvalPrompt) Conversation() ([]inference.Message, []inference.Tool, error) {
	msgs, err := openai.DecodeMessages(p.Messages)
	if err != nil {
		return nil, nil, err
	}
	if len(msgs) == 0 {
		return nil, nil, errors.New("messages: at least one message is required")
	}
	tools, err := openai.DecodeTools(p.Tools)
	if err != nil {
		return nil, nil, err
	}
	return msgs, tools, nil
}

// Rule is the match rule that applies to p in suite.
func (p EvalPrompt) Rule(suite string) string {
	if p.Match != "" {
		return p.Match
	}
	if suite == SuiteSafety {
		return MatchRefusal
	}
	return MatchContains
}

const evalPromptCols = `id, deployment, messages, tools, expect, match, max_tokens, temperature`

func scanEvalPrompt(r pgx.CollectableRow) (EvalPrompt, error) {
	var p EvalPrompt
	err := r.Scan(&p.ID, &p.Deployment, &p.Messages, &p.Tools, &p.Expect, &p.Match, &p.MaxTokens, &p.Temperature)
	return p, err
}

// EvalSuite lists the suite's prompts for deployment (its own and the
// shared ones), in a stable order.
func EvalSuite(ctx context.Context, db DBTX, deployment, suite string) ([]EvalPrompt, error) {
	rows, err := db.Query(ctx, `SELECT `+evalPromptCols+` FROM eval_prompts WHERE suite = $1 AND deployment IN ('', $2) ORDER BY id`, suite, deployment)
	if err != nil {
		return nil, fmt.Errorf("read %s suite: %w", suite, err)
	}
	return pgx.CollectRows(rows, scanEvalPrompt)
}

// ReplaceEvalSuite makes prompts the deployment's own suite (shared
// prompts stay), in one transaction: rerunning it never duplicates them.
// The results of the prompts it replaces go with them.
func ReplaceEvalSuite(ctx context.Context, db Beginner, deployment, suite string, prompts []EvalPrompt) error {
	if deployment == "" {
		return errors.New("replace eval suite: a deployment is required (shared prompts are not replaced)")
	}
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `DELETE FROM eval_prompts WHERE deployment = $1 AND suite = $2`, deployment, suite); err != nil {
			return fmt.Errorf("replace %s suite of %s: %w", suite, deployment, err)
		}
		b := &pgx.Batch{}
		for _, p := range prompts {
			b.Queue(`INSERT INTO eval_prompts (deployment, suite, messages, tools, expect, match, max_tokens, temperature) VALUES ($1, $2, $3, $4, $5, $6, $7, $8)`,
				deployment, suite, p.Messages, nullJSON(p.Tools), p.Expect, p.Match, p.MaxTokens, p.Temperature)
		}
		if err := tx.SendBatch(ctx, b).Close(); err != nil {
			return fmt.Errorf("replace %s suite of %s: %w", suite, deployment, err)
		}
		return nil
	})
}

// SetEvalSuite makes prompts the deployment's own suite, unless it holds
// exactly them already: registering the same suite again keeps its
// results, and so its anchor. It reports whether the suite changed.
func SetEvalSuite(ctx context.Context, db Pool, deployment, suite string, prompts []EvalPrompt) (bool, error) {
	if same, err := sameEvalSuite(ctx, db, deployment, suite, prompts); err != nil || same {
		return false, err
	}
	return true, ReplaceEvalSuite(ctx, db, deployment, suite, prompts)
}

// sameEvalSuite reports whether the deployment's own suite holds exactly
// prompts.
func sameEvalSuite(ctx context.Context, db DBTX, deployment, suite string, prompts []EvalPrompt) (bool, error) {
	rows, err := db.Query(ctx, `SELECT `+evalPromptCols+` FROM eval_prompts WHERE suite = $1 AND deployment = $2 ORDER BY id`, suite, deployment)
	if err != nil {
		return false, fmt.Errorf("read %s suite: %w", suite, err)
	}
	have, err := pgx.CollectRows(rows, scanEvalPrompt)
	if err != nil || len(have) != len(prompts) {
		return false, err
	}
	for i, p := range prompts {
		h := have[i]
		if h.Expect != p.Expect || h.Match != p.Match || h.MaxTokens != p.MaxTokens || h.Temperature != p.Temperature || !jsonEqual(h.Messages, p.Messages) ||
			(len(h.Tools) > 0 || len(p.Tools) > 0) && !jsonEqual(h.Tools, p.Tools) {
			return false, nil
		}
	}
	return true, nil
}

// nullJSON is raw as a jsonb parameter, SQL NULL when empty.
func nullJSON(raw []byte) any {
	if len(raw) == 0 {
		return nil
	}
	return string(raw)
}

func jsonEqual(a, b []byte) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	ja, _ := json.Marshal(x)
	jb, _ := json.Marshal(y)
	return string(ja) == string(jb)
}

// DeleteEvalSuite removes the deployment's own prompts of suite and
// returns how many there were.
func DeleteEvalSuite(ctx context.Context, db DBTX, deployment, suite string) (int, error) {
	tag, err := db.Exec(ctx, `DELETE FROM eval_prompts WHERE deployment = $1 AND suite = $2`, deployment, suite)
	if err != nil {
		return 0, fmt.Errorf("delete %s suite of %s: %w", suite, deployment, err)
	}
	return int(tag.RowsAffected()), nil
}

// SuiteSummary describes one suite of a deployment.
type SuiteSummary struct {
	Suite string `json:"suite"`
	// Prompts counts the deployment's own prompts, Shared the ones every
	// deployment gets.
	Prompts   int            `json:"prompts"`
	Shared    int            `json:"shared"`
	Matches   map[string]int `json:"matches"`
	UpdatedAt *time.Time     `json:"updated_at"`
}

// ListEvalSuites summarises the deployment's suites (both names, empty
// ones included, so a missing suite is visible).
func ListEvalSuites(ctx context.Context, db DBTX, deployment string) ([]SuiteSummary, error) {
	var out []SuiteSummary
	for _, name := range Suites {
		out = append(out, SuiteSummary{Suite: name, Matches: map[string]int{}})
	}
	rows, err := db.Query(ctx, `SELECT suite, deployment = '', match, count(*), max(created_at) FROM eval_prompts
WHERE deployment IN ('', $1) GROUP BY 1, 2, 3`, deployment)
	if err != nil {
		return nil, fmt.Errorf("list suites of %s: %w", deployment, err)
	}
	defer rows.Close()
	for rows.Next() {
		var suite, match string
		var shared bool
		var n int
		var at time.Time
		if err := rows.Scan(&suite, &shared, &match, &n, &at); err != nil {
			return nil, fmt.Errorf("list suites of %s: %w", deployment, err)
		}
		i := slices.IndexFunc(out, func(s SuiteSummary) bool { return s.Suite == suite })
		if i < 0 {
			continue
		}
		s := &out[i]
		if shared {
			s.Shared += n
		} else {
			s.Prompts += n
		}
		s.Matches[EvalPrompt{Match: match}.Rule(suite)] += n
		if s.UpdatedAt == nil || at.After(*s.UpdatedAt) {
			s.UpdatedAt = &at
		}
	}
	return out, rows.Err()
}

// SuiteKey names a suite's current prompts: replacing them changes it.
// Their ids suffice: a stored prompt is never edited, and registering one
// that differs in anything (messages, tools, expect, rule) replaces the
// suite's prompts with new ids (SetEvalSuite).
func SuiteKey(prompts []EvalPrompt) string {
	h := sha256.New()
	var b [8]byte
	for _, p := range prompts {
		binary.BigEndian.PutUint64(b[:], uint64(p.ID))
		h.Write(b[:])
	}
	return hex.EncodeToString(h.Sum(nil)[:8])
}

// SuiteResult is one prompt's outcome for a subject.
type SuiteResult struct {
	PromptID int64
	Passed   bool
	Answer   string
}

// maxStoredAnswer bounds the answer text kept with a result.
const maxStoredAnswer = 256

// SuiteResults returns the subject's results on the prompts that have one.
func SuiteResults(ctx context.Context, db DBTX, subject string, prompts []EvalPrompt) (map[int64]bool, error) {
	rows, err := db.Query(ctx, `SELECT prompt_id, passed FROM suite_results WHERE subject = $1 AND prompt_id = ANY($2)`, subject, promptIDs(prompts))
	if err != nil {
		return nil, fmt.Errorf("suite results of %s: %w", subject, err)
	}
	defer rows.Close()
	out := map[int64]bool{}
	for rows.Next() {
		var id int64
		var ok bool
		if err := rows.Scan(&id, &ok); err != nil {
			return nil, fmt.Errorf("suite results of %s: %w", subject, err)
		}
		out[id] = ok
	}
	return out, rows.Err()
}

// RecordSuiteResults stores (or replaces) the subject's results.
func RecordSuiteResults(ctx context.Context, db DBTX, subject string, res []SuiteResult) error {
	if len(res) == 0 {
		return nil
	}
	ids, passed, answers := make([]int64, len(res)), make([]bool, len(res)), make([]string, len(res))
	for i, r := range res {
		ids[i], passed[i], answers[i] = r.PromptID, r.Passed, truncateRunes(ValidText(r.Answer), maxStoredAnswer)
	}
	_, err := db.Exec(ctx, `
INSERT INTO suite_results (subject, prompt_id, passed, answer)
SELECT $1, p, ok, a FROM unnest($2::bigint[], $3::boolean[], $4::text[]) AS t(p, ok, a)
WHERE EXISTS (SELECT 1 FROM eval_prompts e WHERE e.id = t.p)
ON CONFLICT (subject, prompt_id) DO UPDATE SET passed = EXCLUDED.passed, answer = EXCLUDED.answer, created_at = now()`,
		subject, ids, passed, answers)
	if err != nil {
		return fmt.Errorf("record suite results of %s: %w", subject, err)
	}
	return nil
}

// ValidText is s as Postgres text can hold it: valid UTF-8 without NULs
// (a byte-level policy can answer anything), the rest replaced by U+FFFD.
func ValidText(s string) string {
	return strings.ReplaceAll(strings.ToValidUTF8(s, "\uFFFD"), "\x00", "\uFFFD")
}

func truncateRunes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n])
}

// ArtefactSuffix names the artefacts a version answers under, as suite
// results store them ("+playbook:3"): the serving ones, with kind's
// version replaced by version when kind is not "".
func ArtefactSuffix(serving []StoredArtefact, kind, version string) string {
	vs := map[string]string{}
	for _, a := range serving {
		vs[a.Kind] = strconv.Itoa(a.Version)
	}
	if kind != "" {
		vs[kind] = version
	}
	var b strings.Builder
	for _, k := range []string{artefact.LayerHarness, artefact.LayerPlaybook, artefact.LayerToolSchema} {
		if v, ok := vs[k]; ok {
			b.WriteString("+" + k + ":" + v)
		}
	}
	return b.String()
}

// AnchorOf is the deployment's anchor under its serving artefacts (nil
// with no held-out suite or no measured promoted version).
func AnchorOf(ctx context.Context, db DBTX, deployment string) (*statusapi.AnchorStatus, error) {
	prompts, err := EvalSuite(ctx, db, deployment, SuiteRegression)
	if err != nil || len(prompts) == 0 {
		return nil, err
	}
	serving, err := ServingArtefacts(ctx, db, deployment)
	if err != nil {
		return nil, err
	}
	suffix := ArtefactSuffix(serving, "", "")
	safety, err := EvalSuite(ctx, db, deployment, SuiteSafety)
	if err != nil {
		return nil, err
	}
	v, err := SuiteAnchor(ctx, db, deployment, suffix, prompts, safety, 0)
	if err != nil || v == "" {
		return nil, err
	}
	rate := func(version string) (float64, bool, error) {
		res, err := SuiteResults(ctx, db, version+suffix, prompts)
		if err != nil || len(res) < len(prompts) {
			return 0, false, err
		}
		n := 0
		for _, ok := range res {
			if ok {
				n++
			}
		}
		return float64(n) / float64(len(prompts)), true, nil
	}
	a := &statusapi.AnchorStatus{Version: v, Prompts: len(prompts)}
	if a.PassRate, _, err = rate(v); err != nil {
		return nil, err
	}
	cur, err := ServingOf(ctx, db, deployment, artefact.LayerWeights)
	if err != nil || cur == "" {
		return a, err
	}
	if r, ok, err := rate(cur); err != nil {
		return nil, err
	} else if ok {
		a.ServingPassRate = &r
	}
	return a, nil
}

// SuiteAnchor is the deployment's anchor: of the versions that were
// promoted and are neither rolled back nor retired, and have a result on
// every prompt of the held-out suite (reg), the one with the most of them
// passed. When the safety suite has stored prompts, a version qualifies
// only with a result on each of them and a safety rate at most
// maxSafetyDrop below the best such rate: a version that slipped through
// with its safety broken is never the anchor. Results are the subject's
// version + suffix (the artefacts they were answered under). Ties keep the
// oldest, so the anchor moves only when it is beaten. "" when no version
// qualifies.
func SuiteAnchor(ctx context.Context, db DBTX, deployment, suffix string, reg, safety []EvalPrompt, maxSafetyDrop float64) (string, error) {
	if len(reg) == 0 {
		return "", nil
	}
	safeIDs := []int64{}
	for _, p := range safety {
		if p.ID > 0 { // the built-in prompts have no stored results
			safeIDs = append(safeIDs, p.ID)
		}
	}
	var v string
	err := db.QueryRow(ctx, `
WITH reg AS (
    SELECT v.id, v.created_at, count(*) FILTER (WHERE r.passed) AS pass
    FROM model_versions v
    JOIN suite_results r ON r.subject = v.id || $2 AND r.prompt_id = ANY($3)
    WHERE v.deployment = $1 AND v.status IN ('serving', 'superseded')
    GROUP BY v.id, v.created_at
    HAVING count(*) = $4
), safe AS (
    SELECT reg.id, (count(*) FILTER (WHERE r.passed))::float8 / count(*) AS rate
    FROM reg JOIN suite_results r ON r.subject = reg.id || $2 AND r.prompt_id = ANY($5)
    GROUP BY reg.id
    HAVING count(*) = cardinality($5::bigint[])
)
SELECT reg.id FROM reg LEFT JOIN safe ON safe.id = reg.id
WHERE cardinality($5::bigint[]) = 0 OR safe.rate >= (SELECT max(rate) FROM safe) - $6 - 1e-9
ORDER BY reg.pass DESC, reg.created_at, reg.id
LIMIT 1`, deployment, suffix, promptIDs(reg), len(reg), safeIDs, maxSafetyDrop).Scan(&v)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("anchor of %s: %w", deployment, err)
	}
	return v, nil
}

func promptIDs(prompts []EvalPrompt) []int64 {
	ids := make([]int64, len(prompts))
	for i, p := range prompts {
		ids[i] = p.ID
	}
	return ids
}

// AnchorLooks counts the releases of deployment, other than release,
// whose regression gate was judged against anchor on the suite key, and
// how many of those the gate passed (the test's discoveries, which earn
// the later looks their share of alpha back; see evolution.LookAlpha).
func AnchorLooks(ctx context.Context, db DBTX, deployment, anchor, suiteKey string, release int64) (looks, passed int, err error) {
	err = db.QueryRow(ctx, `
SELECT count(DISTINCT g.release_id), count(DISTINCT g.release_id) FILTER (WHERE g.passed)
FROM gate_results g JOIN releases r ON r.id = g.release_id
WHERE g.gate = 'regression' AND g.metrics->>'anchor' = $2 AND g.metrics->>'suite_key' = $3
  AND r.deployment = $1 AND g.release_id <> $4`, deployment, anchor, suiteKey, release).Scan(&looks, &passed)
	if err != nil {
		return 0, 0, fmt.Errorf("looks at anchor %s: %w", anchor, err)
	}
	return looks, passed, nil
}
