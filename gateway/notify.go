package gateway

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"go.temporal.io/sdk/client"

	"github.com/flywheel-ai/flywheel/workflows"
)

const (
	msgNoticeFailed  = "session notice failed; will retry"
	msgNoticeDropped = "session notices dropped after too many pending; the workflow reconciles from Postgres"
)

// Notifier tells SessionWorkflows what was committed. Notify never blocks
// the request path: notices are queued and delivered in the background.
type Notifier interface {
	Notify(session workflows.SessionInput, ev workflows.SessionEvent)
	// Start starts the session's workflow with its input (group, task)
	// before any event, for sessions created explicitly.
	Start(session workflows.SessionInput)
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

func (nopNotifier) Notify(workflows.SessionInput, workflows.SessionEvent) {}
func (nopNotifier) Start(workflows.SessionInput)                          {}
func (nopNotifier) Close(context.Context)                                 {}

// maxPendingPerSession bounds memory when Temporal is down for long.
const maxPendingPerSession = 1000

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
	stop    chan struct{}
	done    chan struct{}
}

type sessionQueue struct {
	id     string // the session's workflow id
	input  workflows.SessionInput
	events []workflows.SessionEvent
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
func (n *TemporalNotifier) Start(session workflows.SessionInput) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.queue(session)
}

func (n *TemporalNotifier) queue(session workflows.SessionInput) *sessionQueue {
	id := workflows.SessionWorkflowID(session.TenantID, session.SessionID)
	q, ok := n.pending[id]
	if !ok {
		q = &sessionQueue{id: id, input: session}
		n.pending[id] = q
	}
	return q
}

// Notify queues ev for its session.
func (n *TemporalNotifier) Notify(session workflows.SessionInput, ev workflows.SessionEvent) {
	n.mu.Lock()
	defer n.mu.Unlock()
	q := n.queue(session)
	if len(q.events) >= maxPendingPerSession {
		n.logger.Warn(msgNoticeDropped, "session", session.SessionID, "dropped", len(q.events)-maxPendingPerSession+1)
		q.events = q.events[1:]
	}
	q.events = append(q.events, ev)
}

func (n *TemporalNotifier) loop() {
	defer close(n.done)
	t := time.NewTicker(n.interval)
	defer t.Stop()
	for {
		select {
		case <-n.stop:
			return
		case <-t.C:
			n.flush(context.Background())
		}
	}
}

// flush delivers every queued batch, a few sessions at a time.
func (n *TemporalNotifier) flush(ctx context.Context) {
	n.mu.Lock()
	batch := n.pending
	n.pending = map[string]*sessionQueue{}
	n.mu.Unlock()
	if len(batch) == 0 {
		return
	}
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
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
		}()
	}
	wg.Wait()
}

func (n *TemporalNotifier) count(outcome string) {
	if n.metrics != nil {
		n.metrics.notices.WithLabelValues(outcome).Inc()
	}
}

func (n *TemporalNotifier) deliver(ctx context.Context, q *sessionQueue) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := n.c.SignalWithStartWorkflow(ctx, q.id, workflows.SessionEventsSignal,
		workflows.SessionEvents{Events: q.events},
		client.StartWorkflowOptions{ID: q.id, TaskQueue: workflows.SessionTaskQueue},
		workflows.SessionWorkflowName, q.input)
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
	n.flush(ctx)
}
