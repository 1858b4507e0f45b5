package sandbox

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/warren-sandbox/warren/internal/image"
	"github.com/warren-sandbox/warren/internal/node"
	"github.com/warren-sandbox/warren/internal/steptrace"
)

// pool keeps a template's warm sandboxes. Only its filler goroutine
// starts them and sends them to ready; Create takes them out.
type pool struct {
	m          *Manager
	templateID string
	size       int
	ready      chan *warm
	kick       chan struct{}
	building   int // guarded by m.mu
}

// warm is a started sandbox nobody has claimed yet.
type warm struct {
	inst   *node.Instance
	token  string   // envd's private token until /init
	layers []string // the template's layers it was started from
}

// count is the pool's share of the node: ready and being started. The
// caller holds m.mu.
func (p *pool) count() int { return len(p.ready) + p.building }

// claimWarm takes a warm sandbox of tmpl, if one is ready and was started
// from the template as it is now.
func (m *Manager) claimWarm(tmpl *image.Template) *warm {
	m.mu.Lock()
	p := m.pools[tmpl.ID]
	m.mu.Unlock()
	if p == nil {
		return nil
	}
	for {
		var w *warm
		select {
		case w = <-p.ready:
		default:
			return nil
		}
		p.refill()
		if slices.Equal(w.layers, tmpl.Layers) {
			return w
		}
		m.discard(w.inst) // the template was rebuilt since
	}
}

func (p *pool) refill() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// fill keeps the pool full, within the node's capacity, until the
// manager stops. Failures back off exponentially up to 30 s.
func (p *pool) fill() {
	m := p.m
	defer m.wg.Done()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-m.stop
		cancel()
	}()
	backoff := time.Second
	wait := func(d time.Duration) bool {
		t := time.NewTimer(d)
		defer t.Stop()
		select {
		case <-m.stop:
			return false
		case <-p.kick:
		case <-t.C:
		}
		return true
	}
	for {
		if len(p.ready) >= p.size {
			if !wait(time.Minute) {
				return
			}
			continue
		}
		m.mu.Lock()
		fits := m.fitsLocked(m.cfg.Resources) == nil
		if fits {
			p.building++
		}
		m.mu.Unlock()
		if !fits {
			if !wait(time.Second) {
				return
			}
			continue
		}
		w, err := p.start(ctx)
		m.mu.Lock()
		p.building--
		m.mu.Unlock()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			m.log.Warn("starting a warm sandbox failed", "template", p.templateID, "err", err, "retry_in", backoff)
			if !wait(backoff) {
				return
			}
			backoff = min(2*backoff, 30*time.Second)
			continue
		}
		backoff = time.Second
		select {
		case <-m.stop:
			m.discard(w.inst)
			return
		default:
		}
		p.ready <- w // never blocks: only this goroutine sends, and it checked the length
	}
}

func (p *pool) start(ctx context.Context) (*warm, error) {
	m := p.m
	tmpl, err := m.cfg.Images.Template(p.templateID)
	if err != nil {
		return nil, err
	}
	layers, err := m.cfg.Images.LayerDirs(tmpl)
	if err != nil {
		return nil, err
	}
	token := newToken()
	r := m.cfg.Resources
	tr := steptrace.New()
	ctx = steptrace.With(ctx, tr)
	inst, err := m.cfg.Node.Create(ctx, node.CreateRequest{
		ID: NewID(), Layers: layers, CPUCount: r.CPUCount, MemoryMB: r.MemoryMB, DiskSizeMB: r.DiskSizeMB,
		AccessToken: token, User: tmpl.User, Workdir: tmpl.Workdir,
	})
	if err != nil {
		return nil, err
	}
	if err := warmUp(ctx, inst, token, tmpl.User, m.warmTransport); err != nil {
		m.discard(inst)
		return nil, err
	}
	tr.Mark("warm-up")
	m.log.Debug("warm sandbox ready", "sandbox", inst.ID, "template", p.templateID, "steps", tr.String())
	return &warm{inst: inst, token: token, layers: tmpl.Layers}, nil
}

// drain removes the ready warm sandboxes; the filler has stopped.
func (p *pool) drain() error {
	var errs []error
	for {
		select {
		case w := <-p.ready:
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			errs = append(errs, p.m.cfg.Node.Delete(ctx, w.inst))
			cancel()
		default:
			return errors.Join(errs...)
		}
	}
}
