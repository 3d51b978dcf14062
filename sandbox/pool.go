package sandbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// pool keeps started sandboxes of one image ready, so Acquire is a
// channel receive instead of a ~1 s create+start. It keeps ahead of
// demand: a released sandbox is reset (tens of milliseconds) and goes back
// to the ready queue, which holds up to as many as were ever held at once
// (at least size), so under steady load rollouts take recycled sandboxes;
// creates top the queue up to size in the background through the
// manager's bounded provisioning slots.
type pool struct {
	img   Image
	size  int
	ready chan *Sandbox
	wake  chan struct{}

	mu       sync.Mutex
	inflight int
	lastErr  error
	backoff  time.Duration
	// held is how many of its sandboxes are acquired or being acquired
	// now, peak the most ever at once: how many the ready queue keeps
	// when they come back.
	held, peak int
	// recycled and removed count releases that went back to the queue and
	// those that did not (no room, or the reset failed).
	recycled, removed int
}

// maxPoolReady bounds a pool's ready queue, whatever its peak.
const maxPoolReady = 256

// StartPool keeps size warm sandboxes of img. Calling it again for the same
// image changes nothing. Pools stop with Close.
func (m *Manager) StartPool(img Image, size int) error {
	if size <= 0 {
		return errors.New("sandbox pool: size must be positive")
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.ctx.Err() != nil {
		return errors.New("sandbox pool: manager closed")
	}
	if _, ok := m.pools[img.Ref]; ok {
		return nil
	}
	if size > maxPoolReady {
		return fmt.Errorf("sandbox pool: size %d is over %d", size, maxPoolReady)
	}
	p := &pool{img: img, size: size, ready: make(chan *Sandbox, maxPoolReady), wake: make(chan struct{}, 1)}
	m.pools[img.Ref] = p
	m.wg.Go(func() { m.refillLoop(p) })
	p.poke()
	return nil
}

// PoolStats says how full a pool is, how many of its sandboxes are held
// (and the most at once), and how many releases were recycled or removed.
type PoolStats struct {
	Ready, Provisioning, Size int
	Held, Peak                int
	Recycled, Removed         int
	LastError                 error
}

// PoolStats reports the pool for img; zero if there is none.
func (m *Manager) PoolStats(img Image) PoolStats {
	m.mu.Lock()
	p := m.pools[img.Ref]
	m.mu.Unlock()
	if p == nil {
		return PoolStats{}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return PoolStats{Ready: len(p.ready), Provisioning: p.inflight, Size: p.size, Held: p.held, Peak: p.peak,
		Recycled: p.recycled, Removed: p.removed, LastError: p.lastErr}
}

// Acquire returns a started sandbox of img: a warm one when its pool has
// one, else a freshly created one. The caller owns it and must Release it.
func (m *Manager) Acquire(ctx context.Context, img Image) (*Sandbox, error) {
	m.mu.Lock()
	p := m.pools[img.Ref]
	m.mu.Unlock()
	if p != nil {
		defer p.poke()
		// Demand counts from the request, not from the hand-over: a
		// request that waits for a create is demand the queue should
		// have met.
		p.mu.Lock()
		p.held++
		p.peak = max(p.peak, p.held)
		p.mu.Unlock()
		for {
			select {
			case sb := <-p.ready:
				if sb.alive() {
					sb.pool = p
					return sb, nil
				}
				m.log.Warn("discarding dead warm sandbox", "container", short(sb.ID))
				go m.removeContainer(sb.ID)
				m.mu.Lock()
				delete(m.live, sb.ID)
				m.mu.Unlock()
				continue
			default:
			}
			break
		}
	}
	sb, err := m.Create(ctx, img)
	if p != nil {
		if err != nil {
			p.mu.Lock()
			p.held--
			p.mu.Unlock()
		} else {
			sb.pool = p
		}
	}
	return sb, err
}

// recycle resets a released sandbox of p and puts it back in the ready
// queue when the queue has room for it (it keeps as many as were held at
// once); false when it did not, and the caller removes it.
func (m *Manager) recycle(ctx context.Context, p *pool, sb *Sandbox) bool {
	p.mu.Lock()
	p.held--
	room := len(p.ready)+p.inflight < max(p.size, p.peak)
	p.mu.Unlock()
	ok := room && m.ctx.Err() == nil && sb.alive()
	if ok {
		rctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := sb.Reset(rctx)
		cancel()
		if err != nil {
			m.log.Warn("reset of a released sandbox failed; removing it", "container", short(sb.ID), "error", err)
			ok = false
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if ok {
		select {
		case p.ready <- sb:
			p.recycled++
			return true
		default:
		}
	}
	p.removed++
	return false
}

func (p *pool) poke() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

func (m *Manager) refillLoop(p *pool) {
	for {
		select {
		case <-m.ctx.Done():
			return
		case <-p.wake:
		}
		p.mu.Lock()
		missing := max(p.size-len(p.ready)-p.inflight, 0)
		p.inflight += missing
		p.mu.Unlock()
		for range missing {
			m.wg.Go(func() { m.refillOne(p) })
		}
	}
}

func (m *Manager) refillOne(p *pool) {
	sb, err := m.Create(m.ctx, p.img)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inflight--
	p.lastErr = err
	if err != nil {
		if m.ctx.Err() != nil {
			return
		}
		// Back off so a broken image or engine is not hammered.
		p.backoff = min(max(2*p.backoff, time.Second), time.Minute)
		m.log.Warn("warm pool refill failed", "image", p.img.Ref, "retry_in", p.backoff, "error", err)
		time.AfterFunc(p.backoff, p.poke)
		return
	}
	p.backoff = 0
	p.ready <- sb // never blocks: at most size are ready or in flight
}

// drain empties the ready queue; the manager releases what it returns.
func (p *pool) drain() []*Sandbox {
	var out []*Sandbox
	for {
		select {
		case sb := <-p.ready:
			out = append(out, sb)
		default:
			return out
		}
	}
}

// alive reports whether a warm sandbox's attach stream is still open: the
// daemon closes it when the container's main process (the agent) exits, so
// a killed or crashed sandbox is never handed out. A ping would also catch a
// hung agent but costs a round trip through a busy host on every acquire;
// callers that want it call Ping (the SWE activities do).
func (sb *Sandbox) alive() bool {
	if sb.conn == nil {
		return true
	}
	select {
	case <-sb.conn.done:
		return false
	default:
		return true
	}
}
