// Package migrations owns the SQL schema, embedded in the binary and applied
// with goose. A released file is never edited: add a new numbered file.
//
// goose was chosen over golang-migrate and tern because it keeps each
// migration's up and down in one plain SQL file, embeds through io/fs, runs
// each file in its own transaction, and takes a Postgres advisory lock so
// that a gateway and a worker starting together cannot both migrate.
package migrations

import (
	"context"
	"database/sql"
	"embed"
	"fmt"
	"io/fs"

	"github.com/jackc/pgx/v5/stdlib"
	"github.com/pressly/goose/v3"
	"github.com/pressly/goose/v3/lock"
)

//go:embed *.sql
var files embed.FS

// FS is the embedded migration files.
func FS() fs.FS { return files }

// Open opens a database/sql handle on url through pgx, for goose.
func Open(url string) (*sql.DB, error) {
	db, err := sql.Open("pgx", url)
	if err != nil {
		return nil, fmt.Errorf("open database: %w", err)
	}
	return db, nil
}

func provider(db *sql.DB) (*goose.Provider, error) {
	locker, err := lock.NewPostgresSessionLocker()
	if err != nil {
		return nil, fmt.Errorf("migration lock: %w", err)
	}
	p, err := goose.NewProvider(goose.DialectPostgres, db, files, goose.WithSessionLocker(locker))
	if err != nil {
		return nil, fmt.Errorf("load migrations: %w", err)
	}
	return p, nil
}

// Up applies every pending migration and returns how many ran.
func Up(ctx context.Context, db *sql.DB) (int, error) {
	p, err := provider(db)
	if err != nil {
		return 0, err
	}
	res, err := p.Up(ctx)
	if err != nil {
		return len(res), fmt.Errorf("migrate up: %w", err)
	}
	return len(res), nil
}

// DownTo rolls back to version (0 removes everything).
func DownTo(ctx context.Context, db *sql.DB, version int64) (int, error) {
	p, err := provider(db)
	if err != nil {
		return 0, err
	}
	res, err := p.DownTo(ctx, version)
	if err != nil {
		return len(res), fmt.Errorf("migrate down: %w", err)
	}
	return len(res), nil
}

// Version reports the applied version and the newest one embedded.
func Version(ctx context.Context, db *sql.DB) (current, latest int64, err error) {
	p, err := provider(db)
	if err != nil {
		return 0, 0, err
	}
	if current, err = p.GetDBVersion(ctx); err != nil {
		return 0, 0, fmt.Errorf("read schema version: %w", err)
	}
	srcs := p.ListSources()
	if len(srcs) > 0 {
		latest = srcs[len(srcs)-1].Version
	}
	return current, latest, nil
}

// Ensure the pgx driver is linked for sql.Open("pgx", …).
var _ = stdlib.GetDefaultDriver
