package fetcher

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip42"
	"github.com/tidwall/gjson"

	"github.com/grasp-sync/grasp-sync/pkg/relayconn"
)

// authState answers a session's NIP-42 AUTH challenges with the service key
// (when one is configured) and lets subscriptions refused with
// "auth-required:" wait for the answer. Messages arrive on the connection's
// read goroutine and are handed over without blocking it.
type authState struct {
	sk         string
	challenges chan string
	oks        chan okMsg

	mu     sync.Mutex
	authed chan struct{} // closed once the relay accepted our AUTH
	warned bool
}

type okMsg struct {
	id     string
	ok     bool
	reason string
}

func newAuthState(sk string) *authState {
	return &authState{sk: sk, challenges: make(chan string, 1), oks: make(chan okMsg, 8), authed: make(chan struct{})}
}

// challenge receives ["AUTH", <challenge>]; only the newest one matters.
func (a *authState) challenge(raw []byte) {
	ch := gjson.GetBytes(raw, "1").String()
	for {
		select {
		case a.challenges <- ch:
			return
		default:
			select {
			case <-a.challenges:
			default:
			}
		}
	}
}

// ok receives an OK message (the answer to our AUTH event among others).
func (a *authState) ok(raw []byte) {
	select {
	case a.oks <- okMsg{id: gjson.GetBytes(raw, "1").String(), ok: gjson.GetBytes(raw, "2").Bool(), reason: gjson.GetBytes(raw, "3").String()}:
	default:
	}
}

func okReason(raw []byte) string { return gjson.GetBytes(raw, "3").String() }

// answer answers the challenges that are waiting, then returns: it runs
// on demand (session.authing), so a session at rest holds no goroutine
// for authentication (issue 32).
func (a *authState) answer(ctx context.Context, c *relayconn.Conn, url string, log *slog.Logger) {
	for {
		var challenge string
		select {
		case <-ctx.Done():
			return
		case challenge = <-a.challenges:
		default:
			return
		}
		if a.sk == "" {
			a.mu.Lock()
			if !a.warned {
				a.warned = true
				log.Info("relay asks for NIP-42 authentication; no FETCHER_AUTH_KEY configured")
			}
			a.mu.Unlock()
			continue
		}
		pk, _ := nostr.GetPublicKey(a.sk)
		evt := nip42.CreateUnsignedAuthEvent(challenge, pk, url)
		if err := evt.Sign(a.sk); err != nil {
			log.Error("sign AUTH event", "err", err)
			continue
		}
		if err := c.Write(ctx, []any{"AUTH", evt}); err != nil {
			continue
		}
		timeout := time.NewTimer(15 * time.Second)
	wait:
		for {
			select {
			case <-ctx.Done():
				timeout.Stop()
				return
			case <-timeout.C:
				log.Warn("no answer to our AUTH")
				break wait
			case m := <-a.oks:
				if m.id != evt.ID {
					continue
				}
				if m.ok {
					a.mu.Lock()
					select {
					case <-a.authed:
					default:
						close(a.authed)
					}
					a.mu.Unlock()
					log.Info("authenticated with NIP-42", "pubkey", pk)
				} else {
					log.Warn("relay refused our AUTH", "reason", m.reason)
				}
				break wait
			}
		}
		timeout.Stop()
	}
}

// wait returns true once authenticated, false without a key or when ctx
// ends first.
func (a *authState) wait(ctx context.Context) bool {
	if a.sk == "" {
		return false
	}
	select {
	case <-a.authed:
		return true
	case <-ctx.Done():
		return false
	}
}

// onDemand runs a function in a goroutine of the session's tasks while
// there is work for it, instead of a goroutine waiting for work for the
// session's life: ask starts one unless one runs, and one that runs runs
// the function again when asked meanwhile.
type onDemand struct {
	mu             sync.Mutex
	running, again bool
}

// ask has fn run. tasks must be counting a goroutine of the caller's, or
// not be waited on yet (sync.WaitGroup's rule for Add).
func (d *onDemand) ask(tasks *sync.WaitGroup, fn func()) {
	d.mu.Lock()
	if d.running {
		d.again = true
		d.mu.Unlock()
		return
	}
	d.running = true
	tasks.Add(1)
	d.mu.Unlock()
	go func() {
		defer tasks.Done()
		for {
			fn()
			d.mu.Lock()
			if !d.again {
				d.running = false
				d.mu.Unlock()
				return
			}
			d.again = false
			d.mu.Unlock()
		}
	}()
}
