package testenv

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io/fs"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/flywheel-ai/flywheel/migrations"
)

var templateOnce sync.Map // template name → *sync.Once

// DatabaseURL creates an empty database for t (dropped at cleanup) and
// returns its URL. migrated=true clones it from a template with every
// migration applied, which takes milliseconds instead of a full migrate.
func DatabaseURL(t testing.TB, migrated bool) string {
	t.Helper()
	admin := Need(t, "FLYWHEEL_TEST_DATABASE_URL")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, admin)
	require.NoError(t, err, "connect to the test cluster")
	defer conn.Close(ctx)

	template := "template0"
	if migrated {
		template = ensureTemplate(t, ctx, conn, admin)
	}
	name := fmt.Sprintf("t_%d_%s", time.Now().UnixNano(), sanitize(t.Name()))
	if len(name) > 63 {
		name = name[:63]
	}
	_, err = conn.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE %s", pgx.Identifier{name}.Sanitize(), pgx.Identifier{template}.Sanitize()))
	require.NoError(t, err, "create test database")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := pgx.Connect(ctx, admin)
		if err != nil {
			t.Logf("drop test database %s: %v", name, err)
			return
		}
		defer c.Close(ctx)
		if _, err := c.Exec(ctx, fmt.Sprintf("DROP DATABASE IF EXISTS %s WITH (FORCE)", pgx.Identifier{name}.Sanitize())); err != nil {
			t.Logf("drop test database %s: %v", name, err)
		}
	})
	return withDatabase(admin, name)
}

// Pool is DatabaseURL(t, true) opened as a pool closed at cleanup.
func Pool(t testing.TB) *pgxpool.Pool {
	t.Helper()
	url := DatabaseURL(t, true)
	pool, err := pgxpool.New(context.Background(), url)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// ensureTemplate makes (once per process, and only when the migrations
// changed) a database with every migration applied, named after their hash.
func ensureTemplate(t testing.TB, ctx context.Context, conn *pgx.Conn, admin string) string {
	t.Helper()
	name := "tmpl_" + migrationsHash(t)
	onceAny, _ := templateOnce.LoadOrStore(name, &sync.Once{})
	var setupErr error
	onceAny.(*sync.Once).Do(func() {
		// Several test binaries may race: the advisory lock serialises them.
		if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock(7345001)"); err != nil {
			setupErr = err
			return
		}
		defer conn.Exec(ctx, "SELECT pg_advisory_unlock(7345001)") //nolint:errcheck
		var exists bool
		if err := conn.QueryRow(ctx, "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
			setupErr = err
			return
		}
		if exists {
			return
		}
		building := name + "_building"
		if _, err := conn.Exec(ctx, fmt.Sprintf("DROP DATABASE IF EXISTS %s", building)); err != nil {
			setupErr = err
			return
		}
		if _, err := conn.Exec(ctx, fmt.Sprintf("CREATE DATABASE %s TEMPLATE template0", building)); err != nil {
			setupErr = err
			return
		}
		db, err := migrations.Open(withDatabase(admin, building))
		if err != nil {
			setupErr = err
			return
		}
		_, err = migrations.Up(ctx, db)
		db.Close()
		if err != nil {
			setupErr = err
			return
		}
		_, setupErr = conn.Exec(ctx, fmt.Sprintf("ALTER DATABASE %s RENAME TO %s", building, name))
	})
	require.NoError(t, setupErr, "build migrated template database")
	return name
}

func migrationsHash(t testing.TB) string {
	h := sha256.New()
	err := fs.WalkDir(migrations.FS(), ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := fs.ReadFile(migrations.FS(), path)
		h.Write([]byte(path))
		h.Write(b)
		return err
	})
	require.NoError(t, err)
	return hex.EncodeToString(h.Sum(nil))[:16]
}

func withDatabase(url, name string) string {
	base, query, _ := strings.Cut(url, "?")
	i := strings.LastIndex(base, "/")
	out := base[:i+1] + name
	if query != "" {
		out += "?" + query
	}
	return out
}

func sanitize(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	return b.String()
}
