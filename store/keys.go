package store

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/big"
	"regexp"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// KeyPrefix starts every API key Flywheel issues.
const KeyPrefix = "fw-"

var tenantName = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,62}$`)

// ValidTenantName reports whether name can name a tenant.
func ValidTenantName(name string) error {
	if !tenantName.MatchString(name) {
		return fmt.Errorf("tenant name %q: use 1-63 lowercase letters, digits, '-' or '_', starting with a letter or digit", name)
	}
	return nil
}

// EnsureTenant creates the tenant name (its id is the name) if it is new.
func EnsureTenant(ctx context.Context, db DBTX, name string) error {
	if err := ValidTenantName(name); err != nil {
		return err
	}
	_, err := db.Exec(ctx, `INSERT INTO tenants (id, name) VALUES ($1, $1) ON CONFLICT (id) DO NOTHING`, name)
	if err != nil {
		return fmt.Errorf("ensure tenant: %w", err)
	}
	return nil
}

// HashKey is the stored form of an API key.
func HashKey(key string) []byte {
	h := sha256.Sum256([]byte(key))
	return h[:]
}

// NewKey returns a fresh random API key (about 190 bits of entropy).
func NewKey() (string, error) {
	const alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
	b := make([]byte, 32)
	for i := range b {
		n, err := rand.Int(rand.Reader, big.NewInt(int64(len(alphabet))))
		if err != nil {
			return "", fmt.Errorf("random key: %w", err)
		}
		b[i] = alphabet[n.Int64()]
	}
	return KeyPrefix + string(b), nil
}

// KeySpec is what an issued key may do.
type KeySpec struct {
	TenantID string
	// SessionID binds the key to one session; empty for a tenant key.
	SessionID string
	Name      string
	// Models limits the key to these model names; empty allows all.
	Models []string
	// ExpiresAt ends the key; zero never expires.
	ExpiresAt time.Time
	// ParentID is the key that issued this one (a session key's tenant
	// key): revoking the parent revokes it too.
	ParentID int64
	// RotatedFrom is the key this one replaces.
	RotatedFrom int64
	// TokenBudget caps the prompt and completion tokens the key (and the
	// session keys it issues) may use per BudgetPeriod ("day" or "month",
	// in UTC; default "day"); 0 is no budget.
	TokenBudget  int64
	BudgetPeriod string
	// TPM is the key's own tokens-per-minute rate limit (0: none); nil
	// leaves it to the gateway's rate_limit_tpm.
	TPM *int64
	// Labels are the operators' free labels of the key (ValidKeyMeta
	// bounds them with the name); nil: none.
	Labels map[string]string
}

// Bounds of a key's metadata, in characters.
const (
	MaxKeyName       = 128
	MaxKeyLabels     = 16
	MaxKeyLabelKey   = 64
	MaxKeyLabelValue = 256
)

// ValidKeyMeta checks a key's name and labels: at most MaxKeyLabels labels,
// each key 1..MaxKeyLabelKey characters and each value up to
// MaxKeyLabelValue, the name up to MaxKeyName, none with control
// characters (they are printed in listings).
func ValidKeyMeta(name string, labels map[string]string) error {
	if err := validMetaText("name", name, 0, MaxKeyName); err != nil {
		return err
	}
	if len(labels) > MaxKeyLabels {
		return fmt.Errorf("labels: at most %d labels, got %d", MaxKeyLabels, len(labels))
	}
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	slices.Sort(keys) // the same label is named first every time
	for _, k := range keys {
		if err := validMetaText("label key", k, 1, MaxKeyLabelKey); err != nil {
			return fmt.Errorf("labels: %w", err)
		}
		if err := validMetaText(fmt.Sprintf("label %q", k), labels[k], 0, MaxKeyLabelValue); err != nil {
			return fmt.Errorf("labels: %w", err)
		}
	}
	return nil
}

func validMetaText(what, s string, minLen, maxLen int) error {
	n := utf8.RuneCountInString(s)
	switch {
	case !utf8.ValidString(s):
		return fmt.Errorf("%s: not valid UTF-8", what)
	case n < minLen || n > maxLen:
		return fmt.Errorf("%s %q: want %d..%d characters, got %d", what, truncate(s, 80), minLen, maxLen, n)
	case strings.ContainsFunc(s, unicode.IsControl):
		return fmt.Errorf("%s %q: control characters are not allowed", what, truncate(s, 80))
	}
	return nil
}

// truncate shortens s to at most n characters for an error message.
func truncate(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	return string([]rune(s)[:n]) + "…"
}

// Budget periods.
const (
	BudgetDay   = "day"
	BudgetMonth = "month"
)

// ValidBudget checks a token budget and its period ("" is a day).
func ValidBudget(budget int64, period string) error {
	if budget < 0 {
		return fmt.Errorf("token_budget: want 0 (none) or a positive number of tokens, got %d", budget)
	}
	if period != "" && period != BudgetDay && period != BudgetMonth {
		return fmt.Errorf("budget_period: want %q or %q, got %q", BudgetDay, BudgetMonth, period)
	}
	return nil
}

// ValidTPM checks a key's tokens-per-minute limit (nil: the gateway's).
func ValidTPM(tpm *int64) error {
	if tpm != nil && *tpm < 0 {
		return fmt.Errorf("tpm: want 0 (no token rate limit) or a positive number of tokens per minute, got %d", *tpm)
	}
	return nil
}

// BudgetWindow is the period of a budget that holds now: its first UTC day
// and the moment it renews.
func BudgetWindow(period string, now time.Time) (from, renews time.Time) {
	now = now.UTC()
	if period == BudgetMonth {
		from = time.Date(now.Year(), now.Month(), 1, 0, 0, 0, 0, time.UTC)
		return from, from.AddDate(0, 1, 0)
	}
	from = time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, time.UTC)
	return from, from.AddDate(0, 0, 1)
}

// TokensUsed is the prompt and completion tokens accounted to a key since
// the UTC day from.
func TokensUsed(ctx context.Context, db DBTX, keyID int64, from time.Time) (int64, error) {
	var n int64
	err := db.QueryRow(ctx, `SELECT coalesce(sum(prompt_tokens + completion_tokens), 0)::bigint FROM usage_daily
		WHERE key_id = $1 AND day >= $2::date`, keyID, from).Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("tokens used by key %d: %w", keyID, err)
	}
	return n, nil
}

// Key is a stored key, without its secret.
type Key struct {
	ID          int64      `json:"id"`
	TenantID    string     `json:"tenant"`
	Kind        string     `json:"kind"`
	SessionID   string     `json:"session_id,omitempty"`
	Name        string     `json:"name"`
	Prefix      string     `json:"prefix"`
	Models      []string   `json:"models"`
	CreatedAt   time.Time  `json:"created_at"`
	ExpiresAt   *time.Time `json:"expires_at,omitempty"`
	RevokedAt   *time.Time `json:"revoked_at,omitempty"`
	ParentID    int64      `json:"parent_id,omitempty"`
	RotatedFrom int64      `json:"rotated_from,omitempty"`
	// TokenBudget per BudgetPeriod; both omitted when the key has none.
	TokenBudget  int64  `json:"token_budget,omitempty"`
	BudgetPeriod string `json:"budget_period,omitempty"`
	// TPM is the key's tokens-per-minute limit; omitted when the
	// gateway's rate_limit_tpm applies.
	TPM *int64 `json:"tpm,omitempty"`
	// Labels are the key's free labels ({} when none).
	Labels map[string]string `json:"labels"`
}

// Live reports whether the key still authenticates at now.
func (k Key) Live(now time.Time) bool {
	return k.RevokedAt == nil && (k.ExpiresAt == nil || now.Before(*k.ExpiresAt))
}

// ErrKeyNotLive is returned for an operation that needs a live key.
var ErrKeyNotLive = errors.New("the key is revoked or expired")

const keyColumns = `id, tenant_id, kind, coalesce(session_id, ''), name, prefix, models, created_at,
	expires_at, revoked_at, coalesce(parent_id, 0), coalesce(rotated_from, 0), token_budget, budget_period, tpm, labels`

func scanKey(row pgx.Row) (Key, error) {
	var k Key
	err := row.Scan(&k.ID, &k.TenantID, &k.Kind, &k.SessionID, &k.Name, &k.Prefix, &k.Models, &k.CreatedAt,
		&k.ExpiresAt, &k.RevokedAt, &k.ParentID, &k.RotatedFrom, &k.TokenBudget, &k.BudgetPeriod, &k.TPM, &k.Labels)
	if k.TokenBudget == 0 {
		k.BudgetPeriod = ""
	}
	return k, err
}

// IssueKey stores a new key for spec and returns its plaintext, shown
// once: only its hash is kept.
func IssueKey(ctx context.Context, db DBTX, spec KeySpec) (string, Key, error) {
	key, err := NewKey()
	if err != nil {
		return "", Key{}, err
	}
	kind := "tenant"
	var sid *string
	if spec.SessionID != "" {
		kind, sid = "session", &spec.SessionID
	}
	var expires *time.Time
	if !spec.ExpiresAt.IsZero() {
		expires = &spec.ExpiresAt
	}
	models := spec.Models
	if models == nil {
		models = []string{}
	}
	if err := ValidBudget(spec.TokenBudget, spec.BudgetPeriod); err != nil {
		return "", Key{}, err
	}
	if err := ValidTPM(spec.TPM); err != nil {
		return "", Key{}, err
	}
	if err := ValidKeyMeta(spec.Name, spec.Labels); err != nil {
		return "", Key{}, err
	}
	labels := spec.Labels
	if labels == nil {
		labels = map[string]string{}
	}
	period := spec.BudgetPeriod
	if period == "" {
		period = BudgetDay
	}
	k, err := scanKey(db.QueryRow(ctx, `INSERT INTO api_keys
		(tenant_id, key_hash, prefix, kind, session_id, name, models, expires_at, parent_id, rotated_from, token_budget, budget_period, tpm, labels)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, nullif($9, 0::bigint), nullif($10, 0::bigint), $11, $12, $13, $14)
		RETURNING `+keyColumns, spec.TenantID, HashKey(key), key[:len(KeyPrefix)+6], kind, sid, spec.Name,
		models, expires, spec.ParentID, spec.RotatedFrom, spec.TokenBudget, period, spec.TPM, labels))
	if err != nil {
		return "", Key{}, fmt.Errorf("store api key: %w", err)
	}
	return key, k, nil
}

// CreateKey issues a tenant API key with no limits. sessionID is empty
// for a tenant key; otherwise the key is bound to that session.
func CreateKey(ctx context.Context, db DBTX, tenantID, sessionID, name string) (string, error) {
	key, _, err := IssueKey(ctx, db, KeySpec{TenantID: tenantID, SessionID: sessionID, Name: name})
	return key, err
}

// KeyFilter selects keys to list.
type KeyFilter struct {
	// TenantID limits the list to one tenant; empty lists all.
	TenantID string
	// All includes revoked and expired keys.
	All bool
	// Sessions includes per-session keys.
	Sessions bool
}

// ListKeys lists keys, newest first.
func ListKeys(ctx context.Context, db DBTX, f KeyFilter) ([]Key, error) {
	rows, err := db.Query(ctx, `SELECT `+keyColumns+` FROM api_keys
		WHERE ($1 = '' OR tenant_id = $1)
		  AND ($2 OR (revoked_at IS NULL AND (expires_at IS NULL OR expires_at > now())))
		  AND ($3 OR kind = 'tenant')
		ORDER BY id DESC`, f.TenantID, f.All, f.Sessions)
	if err != nil {
		return nil, fmt.Errorf("list keys: %w", err)
	}
	keys, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Key, error) { return scanKey(r) })
	if err != nil {
		return nil, fmt.Errorf("list keys: %w", err)
	}
	return keys, nil
}

// GetKey reads one key, or ErrNotFound.
func GetKey(ctx context.Context, db DBTX, id int64) (Key, error) {
	k, err := scanKey(db.QueryRow(ctx, `SELECT `+keyColumns+` FROM api_keys WHERE id = $1`, id))
	return k, notFound(err)
}

// RevokeKey revokes the key and the session keys it issued, and returns
// it; revoking a revoked key keeps its first revocation time.
func RevokeKey(ctx context.Context, db DBTX, id int64) (Key, error) {
	_, err := db.Exec(ctx, `UPDATE api_keys SET revoked_at = coalesce(revoked_at, now())
		WHERE id = $1 OR parent_id = $1`, id)
	if err != nil {
		return Key{}, fmt.Errorf("revoke key: %w", err)
	}
	return GetKey(ctx, db, id)
}

// RotateKey issues a key that replaces id, with the same tenant, name,
// labels, models and expiry, and lets id live for grace more (zero revokes it
// now). Session keys the old key issued keep working: they end with
// their session. A revoked or expired key cannot rotate (ErrKeyNotLive).
func RotateKey(ctx context.Context, db Beginner, id int64, grace time.Duration) (string, Key, error) {
	var plain string
	var fresh Key
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		old, err := scanKey(tx.QueryRow(ctx, `SELECT `+keyColumns+` FROM api_keys WHERE id = $1 FOR UPDATE`, id))
		if err != nil {
			return notFound(err)
		}
		var now time.Time
		if err := tx.QueryRow(ctx, `SELECT now()`).Scan(&now); err != nil {
			return err
		}
		if !old.Live(now) {
			return ErrKeyNotLive
		}
		spec := KeySpec{TenantID: old.TenantID, SessionID: old.SessionID, Name: old.Name, Models: old.Models,
			ParentID: old.ParentID, RotatedFrom: old.ID, TokenBudget: old.TokenBudget, BudgetPeriod: old.BudgetPeriod, TPM: old.TPM, Labels: old.Labels}
		if old.ExpiresAt != nil {
			spec.ExpiresAt = *old.ExpiresAt
		}
		if plain, fresh, err = IssueKey(ctx, tx, spec); err != nil {
			return err
		}
		if grace <= 0 {
			_, err = tx.Exec(ctx, `UPDATE api_keys SET revoked_at = now() WHERE id = $1`, id)
		} else {
			_, err = tx.Exec(ctx, `UPDATE api_keys SET expires_at = least(coalesce(expires_at, 'infinity'), now() + $2 * interval '1 microsecond')
				WHERE id = $1`, id, grace.Microseconds())
		}
		return err
	})
	if err != nil {
		return "", Key{}, err
	}
	return plain, fresh, nil
}

// KeyOwner is who an API key belongs to and what it may do.
type KeyOwner struct {
	TenantID string
	// SessionID is set for a per-session key.
	SessionID string
	KeyID     int64
	// ParentID is the tenant key that issued a session key (0: none).
	ParentID int64
	// Models the key may use; empty allows every model.
	Models []string
	// ExpiresAt is zero for a key that does not expire.
	ExpiresAt time.Time
	// TokenBudget and BudgetPeriod are the budget of the key calls are
	// accounted to (AccountTo); 0: none.
	TokenBudget  int64
	BudgetPeriod string
	// TPM is the tokens-per-minute limit of the key calls are accounted
	// to; nil: the gateway's rate_limit_tpm.
	TPM *int64
}

// AccountTo is the tenant key the owner's calls are accounted to: a
// session key's parent, or the key itself.
func (o KeyOwner) AccountTo() int64 {
	if o.ParentID != 0 {
		return o.ParentID
	}
	return o.KeyID
}

// Allows reports whether the key may use model.
func (o KeyOwner) Allows(model string) bool {
	return len(o.Models) == 0 || slices.Contains(o.Models, model)
}

// LookupKey finds the live key's owner, or ErrNotFound for an unknown,
// revoked or expired key.
func LookupKey(ctx context.Context, db DBTX, key string) (KeyOwner, error) {
	return LookupKeyHash(ctx, db, HashKey(key))
}

// LookupKeyHash is LookupKey by the key's hash (HashKey), for who holds
// the hash of a key it verified once and not the key itself.
func LookupKeyHash(ctx context.Context, db DBTX, hash []byte) (KeyOwner, error) {
	var o KeyOwner
	var expires *time.Time
	err := db.QueryRow(ctx, `SELECT k.tenant_id, coalesce(k.session_id, ''), k.id, coalesce(k.parent_id, 0), k.models, k.expires_at,
			coalesce(p.token_budget, k.token_budget), coalesce(p.budget_period, k.budget_period),
			CASE WHEN p.id IS NULL THEN k.tpm ELSE p.tpm END
		FROM api_keys k LEFT JOIN api_keys p ON p.id = k.parent_id
		WHERE k.key_hash = $1 AND k.revoked_at IS NULL AND (k.expires_at IS NULL OR k.expires_at > now())`,
		hash).Scan(&o.TenantID, &o.SessionID, &o.KeyID, &o.ParentID, &o.Models, &expires, &o.TokenBudget, &o.BudgetPeriod, &o.TPM)
	if err != nil {
		return KeyOwner{}, notFound(err)
	}
	if expires != nil {
		o.ExpiresAt = *expires
	}
	return o, nil
}
