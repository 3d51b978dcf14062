package sandbox

import (
	"context"
	"errors"
	"sync"
	"time"
)

// pool keeps up to size started sandboxes of one image ready, so Acquire is
// a channel receive instead of a ~1 s create+start. Refills run in the
// background through the manager's bounded provisioning slots.
type pool struct {
	img   Image
	size  int
	ready chan *Sandbox
	wake  chan struct{}

	mu       sync.Mutex
	inflight int
	lastErr  error
	backoff  time.Duration
}

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
	p := &pool{img: img, size: size, ready: make(chan *Sandbox, size), wake: make(chan struct{}, 1)}
	m.pools[img.Ref] = p
	m.wg.Go(func() { m.refillLoop(p) })
	p.poke()
	return nil
}

// PoolStats says how full a pool is.
type PoolStats struct {
	Ready, Provisioning, Size int
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
	return PoolStats{Ready: len(p.ready), Provisioning: p.inflight, Size: p.size, LastError: p.lastErr}
}

// Acquire returns a started sandbox of img: a warm one when its pool has
// one, else a freshly created one. The caller owns it and must Release it.
func (m *Manager) Acquire(ctx context.Context, img Image) (*Sandbox, error) {
	m.mu.Lock()
	p := m.pools[img.Ref]
	m.mu.Unlock()
	if p != nil {
		defer p.poke()
		for {
			select {
			case sb := <-p.ready:
				if sb.alive() {
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
	return m.Create(ctx, img)
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
