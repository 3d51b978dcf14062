package gateway

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.temporal.io/sdk/client"

	"github.com/flywheel-ai/flywheel/flow"
	"github.com/flywheel-ai/flywheel/store"
)

const (
	msgNoticeFailed    = "session notice failed; will retry"
	msgNoticeDropped   = "session notices dropped after too many pending; the workflow reconciles from Postgres"
	msgOutboxFailed    = "session outbox: could not record delivered notices; the reconciler may send them again"
	msgReconcileFailed = "session outbox: could not list sessions left unnotified; will retry"
	msgReconciled      = "session outbox: re-sent the notices of sessions whose workflow never started"
)

// Notifier tells SessionWorkflows what was committed. Notify never blocks
// the request path: notices are queued and delivered in the background.
// The events of one call are queued together: no delivery falls between
// them (a call that ends its session sends its step and its end as one).
type Notifier interface {
	Notify(session flow.SessionInput, evs ...flow.SessionEvent)
	// Start starts the session's workflow with its input (group, task)
	// before any event, for sessions created explicitly.
	Start(session flow.SessionInput)
	// Close flushes what it can within ctx.
	Close(ctx context.Context)
}

// SignalStarter is the part of the Temporal client the notifier needs.
type SignalStarter interface {
	SignalWithStartWorkflow(ctx context.Context, workflowID, signalName string, signalArg any,
		options client.StartWorkflowOptions, workflow any, workflowArgs ...any) (client.WorkflowRun, error)
}

// nopNotifier is used when no Temporal client is configured: the session
// workflow, once running, reconciles from Postgres.
type nopNotifier struct{}

func (nopNotifier) Notify(flow.SessionInput, ...flow.SessionEvent) {}
func (nopNotifier) Start(flow.SessionInput)                        {}
func (nopNotifier) Close(context.Context)                          {}

// maxPendingPerSession bounds memory when Temporal is down for long;
// maxPendingSessions bounds the sessions waiting, once an outbox holds
// their notices in Postgres (without one, a dropped notice would be lost).
const (
	maxPendingPerSession = 1000
	maxPendingSessions   = 50_000
)

// The reconciler re-sends, every reconcileEvery, the notices of up to
// reconcileBatch sessions that were left unnotified for longer than
// reconcileAge (or four notify intervals, if longer): long enough for the
// normal path to have delivered them.
const (
	reconcileEvery = 5 * time.Second
	reconcileAge   = 2 * time.Second
	reconcileBatch = 500
)

// noticeHold is how long a flush keeps back a batch that is about to be
// followed: the bare start of a session created explicitly (its first
// step usually comes within a second), and an end with no reward yet (the
// agent's reward usually follows its last call). Sent together, a short
// session costs its workflow one task instead of two or three, and no
// idle or grace timer: 10 history events instead of 15 to 21 in the demo,
// most of the Temporal server's work per session. The workflow's state is
// the same either way; only its start waits, at most this long.
const noticeHold = time.Second

// TemporalNotifier batches notices per session and delivers each batch
// with one SignalWithStartWorkflow (workflow id = session id), retrying
// failed batches on the next tick.
type TemporalNotifier struct {
	c        SignalStarter
	interval time.Duration
	logger   *slog.Logger
	metrics  *metrics

	mu      sync.Mutex
	pending map[string]*sessionQueue
	// outbox is the sessions table (nil: none): a session's notified_at
	// is set once a notice for it was delivered, and the reconciler
	// re-sends the notices of sessions left without one.
	outbox *pgxpool.Pool
	stop   chan struct{}
	done   chan struct{}
}

type sessionQueue struct {
	id     string // the session's workflow id
	input  flow.SessionInput
	events []flow.SessionEvent
	// queued is when the batch was opened; ended, when an end joined a
	// batch with no reward in it (zero: none, or a reward came since).
	queued, ended time.Time
}

// held says whether a flush at now keeps q back (noticeHold).
func (q *sessionQueue) held(now time.Time) bool {
	if len(q.events) == 0 {
		return now.Sub(q.queued) < noticeHold
	}
	return !q.ended.IsZero() && now.Sub(q.ended) < noticeHold
}

// UseOutbox makes db's sessions table the notices' outbox: delivered
// sessions are marked, and those a dead process or an unreachable Temporal
// left unmarked are notified again, so no committed session is left
// without its workflow.
func (n *TemporalNotifier) UseOutbox(db *pgxpool.Pool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.outbox = db
}

// NewTemporalNotifier starts the delivery loop.
func NewTemporalNotifier(c SignalStarter, interval time.Duration, logger *slog.Logger) *TemporalNotifier {
	n := &TemporalNotifier{c: c, interval: interval, logger: logger, pending: map[string]*sessionQueue{},
		stop: make(chan struct{}), done: make(chan struct{})}
	go n.loop()
	return n
}

// Start queues an empty batch: its SignalWithStart starts the workflow
// with session's input.
func (n *TemporalNotifier) Start(session flow.SessionInput) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.queue(session)
}

func (n *TemporalNotifier) queue(session flow.SessionInput) *sessionQueue {
	id := flow.SessionWorkflowID(session.TenantID, session.SessionID)
	q, ok := n.pending[id]
	if !ok {
		q = &sessionQueue{id: id, input: session, queued: time.Now()}
		n.pending[id] = q
	}
	return q
}

// Notify queues evs for their session, together.
func (n *TemporalNotifier) Notify(session flow.SessionInput, evs ...flow.SessionEvent) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for _, ev := range evs {
		n.notify(session, ev)
	}
}

func (n *TemporalNotifier) notify(session flow.SessionInput, ev flow.SessionEvent) {
	if n.outbox != nil && len(n.pending) >= maxPendingSessions {
		if _, ok := n.pending[flow.SessionWorkflowID(session.TenantID, session.SessionID)]; !ok {
			n.count("dropped") // the reconciler sends it from Postgres
			return
		}
	}
	q := n.queue(session)
	if len(q.events) >= maxPendingPerSession {
		n.logger.Warn(msgNoticeDropped, "session", session.SessionID, "dropped", len(q.events)-maxPendingPerSession+1)
		q.events = q.events[1:]
	}
	switch ev.Kind {
	case flow.EventEnd:
		if !slices.ContainsFunc(q.events, func(e flow.SessionEvent) bool { return e.Kind == flow.EventReward }) {
			q.ended = time.Now()
		}
	case flow.EventReward:
		q.ended = time.Time{}
	}
	q.events = append(q.events, ev)
}

func (n *TemporalNotifier) loop() {
	defer close(n.done)
	t := time.NewTicker(n.interval)
	defer t.Stop()
	var reconciled time.Time
	for {
		select {
		case <-n.stop:
			return
		case <-t.C:
			n.flush(context.Background(), false)
			if time.Since(reconciled) >= reconcileEvery {
				reconciled = time.Now()
				n.reconcile(context.Background())
			}
		}
	}
}

// reconcile queues a notice for every session the outbox says was never
// notified (an ended one also gets its end), for the next flush.
func (n *TemporalNotifier) reconcile(ctx context.Context) {
	n.mu.Lock()
	db := n.outbox
	n.mu.Unlock()
	if db == nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	left, err := store.Unnotified(ctx, db, max(reconcileAge, 4*n.interval), reconcileBatch)
	if err != nil {
		n.logger.Warn(msgReconcileFailed, "err", err)
		return
	}
	if len(left) == 0 {
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	for i := range left {
		s := &left[i]
		q := n.queue(sessionInput(s))
		if s.Status == "ended" {
			q.events = append(q.events, flow.SessionEvent{Kind: flow.EventEnd, At: time.Now()})
		}
		n.count("reconciled")
	}
	n.logger.Info(msgReconciled, "sessions", len(left))
}

// flush delivers every queued batch, a few sessions at a time; all
// false keeps back the batches noticeHold holds.
func (n *TemporalNotifier) flush(ctx context.Context, all bool) {
	n.mu.Lock()
	batch := n.pending
	n.pending = map[string]*sessionQueue{}
	if !all {
		now := time.Now()
		for id, q := range batch {
			if q.held(now) {
				n.pending[id] = q
				delete(batch, id)
			}
		}
	}
	n.mu.Unlock()
	if len(batch) == 0 {
		return
	}
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	var dmu sync.Mutex
	var tenants, ids []string
	for id, q := range batch {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			if err := n.deliver(ctx, q); err != nil {
				n.logger.Warn(msgNoticeFailed, "session", id, "events", len(q.events), "err", err)
				n.count("retry")
				n.requeue(q)
				return
			}
			n.count("delivered")
			dmu.Lock()
			tenants, ids = append(tenants, q.input.TenantID), append(ids, q.input.SessionID)
			dmu.Unlock()
		}()
	}
	wg.Wait()
	n.mu.Lock()
	db := n.outbox
	n.mu.Unlock()
	if db != nil {
		mctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := store.MarkNotified(mctx, db, tenants, ids); err != nil {
			n.logger.Warn(msgOutboxFailed, "sessions", len(ids), "err", err)
		}
	}
}

func (n *TemporalNotifier) count(outcome string) {
	if n.metrics != nil {
		n.metrics.notices.WithLabelValues(outcome).Inc()
	}
}

func (n *TemporalNotifier) deliver(ctx context.Context, q *sessionQueue) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	opts, input := flow.SessionStart(q.input)
	_, err := n.c.SignalWithStartWorkflow(ctx, q.id, flow.SessionEventsSignal,
		flow.SessionEvents{Events: q.events}, opts, flow.SessionWorkflowName, input)
	return err
}

// requeue puts a failed batch back in front of anything newer.
func (n *TemporalNotifier) requeue(q *sessionQueue) {
	n.mu.Lock()
	defer n.mu.Unlock()
	if cur, ok := n.pending[q.id]; ok {
		q.events = append(q.events, cur.events...)
	}
	if len(q.events) > maxPendingPerSession {
		q.events = q.events[len(q.events)-maxPendingPerSession:]
	}
	n.pending[q.id] = q
}

// Close stops the loop and makes one last delivery attempt within ctx.
func (n *TemporalNotifier) Close(ctx context.Context) {
	close(n.stop)
	<-n.done
	n.flush(ctx, true)
}
