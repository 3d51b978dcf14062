// Package capture is the gateway's group commit: request handlers submit
// interaction rows and wait; a few background goroutines insert everything
// queued in one statement and release every waiter when it commits. So a
// 2xx still means "in Postgres", while one WAL flush serves a whole batch.
package capture

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/flywheel-ai/flywheel/store"
)

const (
	msgCaptureBatchFailed = "capture batch failed; retrying rows one by one"
	msgCaptureRowFailed   = "capture row failed"
)

// ErrClosed is returned for rows submitted after shutdown began.
var ErrClosed = errors.New("capture is shut down")

// Options configure a Committer.
type Options struct {
	// MaxBatch bounds the rows of one transaction.
	MaxBatch int
	// Wait is how long a transaction waits for more rows after its first
	// (0: it takes what is queued and goes).
	Wait   time.Duration
	Logger *slog.Logger
	// Batch observes the rows of each transaction, Commit its seconds
	// (nil: not observed).
	Batch, Commit prometheus.Observer
}

// Committer is the group commit.
type Committer struct {
	pool     *pgxpool.Pool
	in       chan *pendingRow
	maxBatch int
	wait     time.Duration
	logger   *slog.Logger
	batch    prometheus.Observer
	commitS  prometheus.Observer

	mu     sync.RWMutex
	closed bool
	wg     sync.WaitGroup
}

type pendingRow struct {
	row  *store.NewInteraction
	done chan captureResult
}

type captureResult struct {
	store.Captured
	err error
}

// workers is how many transactions may be in flight at once: a
// second one fills while the first flushes, which halves the queueing
// delay at no cost in batch size.
const workers = 2

// New opens the committer's own connections next to db's: one
// per worker, so capture never queues behind other queries for a
// connection, and each running the capture statement with a generic plan.
// The statement's plan does not depend on its values (arrays unnested and
// joined on the session id), but Postgres would otherwise re-plan it on
// every call: about 70 µs of server CPU per commit, measured.
func New(ctx context.Context, db *pgxpool.Pool, o Options) (*Committer, error) {
	cfg := db.Config().Copy()
	cfg.MaxConns, cfg.MinConns = workers, workers
	cfg.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_generic_plan"
	cfg.ConnConfig.RuntimeParams["application_name"] = "flywheel-capture"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("capture connections: %w", err)
	}
	if o.Batch == nil {
		o.Batch = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "unobserved"})
	}
	if o.Commit == nil {
		o.Commit = prometheus.NewHistogram(prometheus.HistogramOpts{Name: "unobserved"})
	}
	c := &Committer{pool: pool, in: make(chan *pendingRow, o.MaxBatch*4), maxBatch: o.MaxBatch, wait: o.Wait, logger: o.Logger,
		batch: o.Batch, commitS: o.Commit}
	for range workers {
		c.wg.Add(1)
		go c.run()
	}
	return c, nil
}

// Submit queues row and waits until its batch commits. A cancelled ctx
// stops the wait, not the commit: the row may still land.
func (c *Committer) Submit(ctx context.Context, row *store.NewInteraction) (store.Captured, error) {
	p := &pendingRow{row: row, done: make(chan captureResult, 1)}
	c.mu.RLock()
	if c.closed {
		c.mu.RUnlock()
		return store.Captured{}, ErrClosed
	}
	select {
	case c.in <- p:
		c.mu.RUnlock()
	case <-ctx.Done():
		c.mu.RUnlock()
		return store.Captured{}, ctx.Err()
	}
	select {
	case r := <-p.done:
		return r.Captured, r.err
	case <-ctx.Done():
		return store.Captured{}, ctx.Err()
	}
}

// Close stops accepting rows, commits what is queued and returns.
func (c *Committer) Close() {
	c.mu.Lock()
	if !c.closed {
		c.closed = true
		close(c.in)
	}
	c.mu.Unlock()
	c.wg.Wait()
	c.pool.Close()
}

func (c *Committer) run() {
	defer c.wg.Done()
	batch := make([]*pendingRow, 0, c.maxBatch)
	for first := range c.in {
		batch = append(batch[:0], first)
		var timeout <-chan time.Time
		if c.wait > 0 {
			timeout = time.After(c.wait)
		}
	fill:
		for len(batch) < c.maxBatch {
			if timeout == nil {
				select {
				case p, ok := <-c.in:
					if !ok {
						break fill
					}
					batch = append(batch, p)
				default:
					break fill
				}
				continue
			}
			select {
			case p, ok := <-c.in:
				if !ok {
					break fill
				}
				batch = append(batch, p)
			case <-timeout:
				break fill
			}
		}
		c.commit(batch)
	}
}

// commit writes batch in one transaction; if the transaction fails as a
// whole (one poisonous row), each row is retried alone so the others land.
func (c *Committer) commit(batch []*pendingRow) {
	start := time.Now()
	rows := make([]*store.NewInteraction, len(batch))
	for i, p := range batch {
		rows[i] = p.row
	}
	// Commits outlive the requests that asked for them: a client going
	// away must not roll back what other waiters were promised.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// One statement in autocommit is its own transaction: Postgres
	// commits it (WAL flushed, synchronous_commit on) before it reports
	// ReadyForQuery, which pgx waits for, so this is as durable as
	// BEGIN/INSERT/COMMIT with one round trip instead of three.
	out, rowErrs, err := store.InsertInteractions(ctx, c.pool, rows)
	c.batch.Observe(float64(len(batch)))
	c.commitS.Observe(time.Since(start).Seconds())
	if err == nil {
		for i, p := range batch {
			p.done <- captureResult{Captured: out[i], err: rowErrs[i]}
		}
		return
	}
	if len(batch) > 1 {
		c.logger.Warn(msgCaptureBatchFailed, "rows", len(batch), "err", err)
	}
	for _, p := range batch {
		r, err := store.InsertInteraction(ctx, c.pool, p.row)
		if err != nil && !errors.Is(err, store.ErrSessionClosed) {
			c.logger.Error(msgCaptureRowFailed, "session", p.row.SessionID, "err", err)
			err = fmt.Errorf("capture: %w", err)
		}
		p.done <- captureResult{Captured: r, err: err}
	}
}
