// Package relay is the own relay: the GRASP server's nostr relay (khatru)
// over the shared event store. It applies the GRASP write policy to client
// events, tells other writers' replicas what it stored, and broadcasts what
// they stored (grasp.stored.*) to its own live subscribers.
package relay

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/fiatjaf/khatru"
	"github.com/nats-io/nats.go"
	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip11"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/config"
	"github.com/grasp-sync/grasp-sync/pkg/obs"
	"github.com/grasp-sync/grasp-sync/pkg/policy"
	"github.com/grasp-sync/grasp-sync/pkg/store"
)

// Config is the relay's configuration (GRASP_* variables).
type Config struct {
	// Addr is where the relay listens (HTTP and websocket).
	Addr string `envconfig:"RELAY_ADDR" default:"127.0.0.1:7777"`
	// PublicURL is the relay's public websocket URL; its host and port are
	// what "an announcement lists this service" compares against. Default:
	// ws:// + Addr.
	PublicURL   string `envconfig:"PUBLIC_URL"`
	Name        string `envconfig:"RELAY_NAME" default:"grasp-sync"`
	Description string `envconfig:"RELAY_DESCRIPTION" default:"GRASP relay with proactive sync (GRASP-02)"`
	// MaxMessageBytes bounds one websocket message from a client.
	MaxMessageBytes int64 `envconfig:"RELAY_MAX_MESSAGE_BYTES" default:"512000"`
}

// Validate fills defaults that depend on other fields and checks URLs.
func (c *Config) Validate() error {
	if _, _, err := net.SplitHostPort(c.Addr); err != nil {
		return config.Invalid("RELAY_ADDR", c.Addr, "want host:port")
	}
	if c.PublicURL == "" {
		c.PublicURL = "ws://" + c.Addr
	}
	u, err := url.Parse(c.PublicURL)
	if err != nil || (u.Scheme != "ws" && u.Scheme != "wss") || u.Host == "" {
		return config.Invalid("PUBLIC_URL", c.PublicURL, "want a ws:// or wss:// URL")
	}
	return nil
}

// SupportedGrasps is what NIP-11 advertises under supported_grasps.
var SupportedGrasps = []string{"GRASP-01", "GRASP-02"}

// Relay is the own relay.
type Relay struct {
	cfg    Config
	store  *store.Store
	bus    *bus.Bus
	policy *policy.Policy
	log    *slog.Logger
	origin string
	khatru *khatru.Relay
	// listenersMu is khatru's own clients lock (see clientsMutex).
	listenersMu *sync.Mutex
}

// New builds the relay over a store. b may be nil for a relay that neither
// publishes nor receives stored-event broadcasts (tests of the relay alone).
func New(cfg Config, st *store.Store, b *bus.Bus, log *slog.Logger) *Relay {
	r := &Relay{
		cfg:    cfg,
		store:  st,
		bus:    b,
		log:    log.With("service", "relay"),
		origin: nostr.GeneratePrivateKey()[:16],
		policy: &policy.Policy{ServiceURL: cfg.PublicURL, Store: st, Limits: policy.DefaultLimits()},
	}
	k := khatru.NewRelay()
	k.Info.Name = cfg.Name
	k.Info.Description = cfg.Description
	k.Info.Software = "https://github.com/grasp-sync/grasp-sync"
	k.Info.SupportedNIPs = []any{1, 9, 11, 34}
	k.MaxMessageSize = cfg.MaxMessageBytes
	k.Negentropy = true
	k.Log.SetOutput(obs.LineWriter(r.log, "khatru"))

	k.RejectEvent = append(k.RejectEvent, r.rejectEvent)
	k.StoreEvent = append(k.StoreEvent, func(ctx context.Context, evt *nostr.Event) error {
		_, err := st.Save(ctx, evt)
		return err
	})
	k.ReplaceEvent = append(k.ReplaceEvent, func(ctx context.Context, evt *nostr.Event) error {
		_, err := st.Save(ctx, evt)
		return err
	})
	k.QueryEvents = append(k.QueryEvents, st.QueryEvents)
	k.DeleteEvent = append(k.DeleteEvent, st.Delete)
	k.OnEventSaved = append(k.OnEventSaved, r.announceStored, r.syncWithListeners)
	r.khatru = k
	r.listenersMu = clientsMutex(k)
	if r.listenersMu == nil {
		r.log.Warn("khatru's clients lock not found: broadcasts of other writers' events race with disconnects")
	}
	return r
}

func (r *Relay) rejectEvent(ctx context.Context, evt *nostr.Event) (bool, string) {
	d := r.policy.Evaluate(ctx, evt)
	if d.Accept {
		return false, ""
	}
	r.log.Debug("client event refused", "id", evt.ID, "kind", evt.Kind, "reason", string(d.Reason))
	return true, d.Message
}

// announceStored tells the other writers' relay replicas about an event a
// client just stored here.
func (r *Relay) announceStored(ctx context.Context, evt *nostr.Event) {
	if r.bus == nil {
		return
	}
	msg := nats.NewMsg(r.bus.Names.StoredSubject(evt.Kind))
	msg.Data, _ = json.Marshal(evt)
	msg.Header.Set(bus.HeaderOrigin, r.origin)
	if err := r.bus.Conn.PublishMsg(msg); err != nil {
		r.log.Warn("publish stored event", "id", evt.ID, "err", err)
	}
}

// syncWithListeners runs right before khatru notifies live subscribers of a
// client's event, on the same goroutine. khatru reads its listener list
// there without its lock (see clientsMutex); taking and releasing the lock
// first orders every earlier subscription change before the read, leaving
// only changes that happen during the notification itself unordered.
func (r *Relay) syncWithListeners(context.Context, *nostr.Event) {
	if r.listenersMu != nil {
		r.listenersMu.Lock()
		r.listenersMu.Unlock() //nolint:staticcheck // an ordering point, not a critical section
	}
}

// Handler serves NIP-11 (with supported_grasps), the websocket and a plain
// page.
func (r *Relay) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Header.Get("Upgrade") == "" && req.Header.Get("Accept") == "application/nostr+json" {
			r.serveNIP11(w)
			return
		}
		r.khatru.ServeHTTP(w, req)
	})
}

type infoDocument struct {
	nip11.RelayInformationDocument
	SupportedGrasps []string `json:"supported_grasps"`
}

func (r *Relay) serveNIP11(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/nostr+json")
	w.Header().Set("Access-Control-Allow-Origin", "*")
	info := *r.khatru.Info
	info.SupportedNIPs = []any{1, 9, 11, 34, 77}
	_ = json.NewEncoder(w).Encode(infoDocument{RelayInformationDocument: info, SupportedGrasps: SupportedGrasps})
}

// Run serves on ln and relays other writers' stored events to live
// subscribers until ctx is done.
func (r *Relay) Run(ctx context.Context, ln net.Listener) error {
	if r.bus != nil {
		sub, err := r.bus.Conn.Subscribe(r.bus.Names.StoredSubjects(), r.onStored)
		if err != nil {
			return fmt.Errorf("subscribe %s: %w", r.bus.Names.StoredSubjects(), err)
		}
		defer sub.Unsubscribe()
	}
	// http.Server.Shutdown does not close hijacked (websocket) connections,
	// and khatru's own Shutdown needs its own server: track them here.
	var conns sync.Map
	srv := &http.Server{
		Handler:           r.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		ConnState: func(c net.Conn, s http.ConnState) {
			switch s {
			case http.StateHijacked:
				conns.Store(c, struct{}{})
			case http.StateClosed:
				conns.Delete(c)
			}
		},
	}
	r.log.Info("relay listening", "addr", ln.Addr().String(), "public_url", r.cfg.PublicURL)
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("relay server: %w", err)
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(shutdown)
	conns.Range(func(c, _ any) bool {
		_ = c.(net.Conn).Close()
		return true
	})
	<-errc
	return nil
}

func (r *Relay) onStored(msg *nats.Msg) {
	if msg.Header.Get(bus.HeaderOrigin) == r.origin {
		return
	}
	var evt nostr.Event
	if err := json.Unmarshal(msg.Data, &evt); err != nil {
		r.log.Warn("undecodable stored event", "subject", msg.Subject, "err", err)
		return
	}
	if r.listenersMu != nil {
		r.listenersMu.Lock()
		defer r.listenersMu.Unlock()
	}
	r.khatru.BroadcastEvent(&evt)
}
