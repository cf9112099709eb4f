package delayproxy

import (
	"context"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"
)

// Direction is one way through a Proxy.
type Direction int

const (
	// Up is client to server.
	Up Direction = iota
	// Down is server to client.
	Down
)

// Proxy is a TCP proxy between clients and one server that delivers
// bytes late: each chunk read is written on after the delay of its direction
// at the time it was read (plus up to the jitter), in order, and not at all
// while its direction is held. It stands for a loaded or partitioned network
// between a service and its NATS server: a request can be slow, stored with
// its answer late, or not arrive until the hold ends — what a NATS client
// sees when its server or the machine is saturated. The connections stay
// open while held, as they would across a short partition.
type Proxy struct {
	// Addr is the proxy's host:port on 127.0.0.1.
	Addr string

	ln     net.Listener
	target string

	mu      sync.Mutex
	delay   [2]time.Duration
	jitter  [2]time.Duration
	held    [2]bool
	changed chan struct{} // closed and replaced whenever the settings change
	conns   map[net.Conn]struct{}
	closed  bool
	wg      sync.WaitGroup
}

// Start listens on a free loopback port and forwards every
// connection to target (host:port) until the test ends.
func Start(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("delayproxy: delay proxy listen: %v", err)
	}
	p := &Proxy{Addr: ln.Addr().String(), ln: ln, target: target,
		changed: make(chan struct{}), conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	t.Cleanup(p.Close)
	return p
}

// SetDelay sets the delay of one direction: chunks read from now on are
// written on base plus up to jitter later (never before an earlier chunk).
func (p *Proxy) SetDelay(dir Direction, base, jitter time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.delay[dir], p.jitter[dir] = base, jitter
	p.notifyLocked()
}

// Hold stops (true) or resumes (false) delivery in one direction; bytes
// held are delivered, in order, when it resumes.
func (p *Proxy) Hold(dir Direction, hold bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.held[dir] = hold
	p.notifyLocked()
}

// Cut closes every connection through the proxy now and goes on
// accepting new ones: a network blip between one service and its server,
// after which the service reconnects through the proxy.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		_ = c.Close()
		delete(p.conns, c)
	}
}

// Close stops the proxy and closes every connection through it.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	_ = p.ln.Close()
	for c := range p.conns {
		_ = c.Close()
	}
	p.notifyLocked()
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *Proxy) notifyLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = client.Close()
			continue
		}
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			_ = client.Close()
			_ = server.Close()
			return
		}
		p.conns[client], p.conns[server] = struct{}{}, struct{}{}
		p.wg.Add(4)
		p.mu.Unlock()
		for _, d := range []struct {
			dir      Direction
			src, dst net.Conn
		}{{Up, client, server}, {Down, server, client}} {
			chunks := make(chan chunk, 1024) // bounded: a full queue stops the reader, as TCP would
			go p.read(d.dir, d.src, d.dst, chunks)
			go p.write(d.dir, d.src, d.dst, chunks)
		}
	}
}

type chunk struct {
	data []byte
	due  time.Time
}

func (p *Proxy) read(dir Direction, src, dst net.Conn, out chan<- chunk) {
	defer p.wg.Done()
	defer close(out)
	for {
		buf := make([]byte, 32*1024)
		n, err := src.Read(buf)
		if n > 0 {
			p.mu.Lock()
			due := time.Now().Add(p.delay[dir])
			if j := p.jitter[dir]; j > 0 {
				due = due.Add(rand.N(j))
			}
			p.mu.Unlock()
			out <- chunk{data: buf[:n], due: due}
		}
		if err != nil {
			return
		}
	}
}

func (p *Proxy) write(dir Direction, src, dst net.Conn, in <-chan chunk) {
	defer p.wg.Done()
	defer func() {
		_ = src.Close()
		_ = dst.Close()
		for range in { // let the reader finish
		}
	}()
	for c := range in {
		for {
			p.mu.Lock()
			held, closed, changed := p.held[dir], p.closed, p.changed
			p.mu.Unlock()
			if closed {
				return
			}
			wait := time.Until(c.due)
			if !held && wait <= 0 {
				break
			}
			var timer <-chan time.Time
			if !held {
				timer = time.After(wait)
			}
			select {
			case <-changed:
			case <-timer:
			}
		}
		if _, err := dst.Write(c.data); err != nil {
			return
		}
	}
}

// Stalls holds dir every `every` for `length` (a server or client that
// stops answering for a moment, as a saturated process does) until the
// returned stop is called or the test ends.
func (p *Proxy) Stalls(t testing.TB, dir Direction, every, length time.Duration) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(every - length):
			}
			p.Hold(dir, true)
			select {
			case <-ctx.Done():
			case <-time.After(length):
			}
			p.Hold(dir, false)
		}
	}()
	stop = sync.OnceFunc(func() {
		cancel()
		<-done
	})
	t.Cleanup(stop)
	return stop
}
