package store

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"fmt"
	"math/big"
	"regexp"
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

// CreateKey issues a tenant API key and stores only its hash. sessionID is
// empty for a tenant key; otherwise the key is bound to that session.
func CreateKey(ctx context.Context, db DBTX, tenantID, sessionID, name string) (string, error) {
	key, err := NewKey()
	if err != nil {
		return "", err
	}
	kind := "tenant"
	var sid *string
	if sessionID != "" {
		kind, sid = "session", &sessionID
	}
	_, err = db.Exec(ctx, `INSERT INTO api_keys (tenant_id, key_hash, prefix, kind, session_id, name)
		VALUES ($1, $2, $3, $4, $5, $6)`, tenantID, HashKey(key), key[:len(KeyPrefix)+6], kind, sid, name)
	if err != nil {
		return "", fmt.Errorf("store api key: %w", err)
	}
	return key, nil
}

// KeyOwner is who an API key belongs to.
type KeyOwner struct {
	TenantID string
	// SessionID is set for a per-session key.
	SessionID string
}

// LookupKey finds the live key's owner, or ErrNotFound.
func LookupKey(ctx context.Context, db DBTX, key string) (KeyOwner, error) {
	var o KeyOwner
	var sid *string
	err := db.QueryRow(ctx, `SELECT tenant_id, session_id FROM api_keys
		WHERE key_hash = $1 AND revoked_at IS NULL`, HashKey(key)).Scan(&o.TenantID, &sid)
	if err != nil {
		return KeyOwner{}, notFound(err)
	}
	if sid != nil {
		o.SessionID = *sid
	}
	return o, nil
}
