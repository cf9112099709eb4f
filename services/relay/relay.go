// Package relay is the own relay: the GRASP server's nostr relay (khatru)
// over the shared event store. It applies the GRASP write policy to client
// events (NIP-09 deletions only once the policy accepted them), tells other
// writers' replicas what it stored, and broadcasts what they stored
// (grasp.stored.*) to its own live subscribers. It serves NIP-11 with
// supported_grasps and NIP-77 negentropy, caps REQ results (clients page
// with until), and enforces per-connection and per-address limits through a
// websocket frame guard in front of khatru (package frameguard), which also
// sends NIP-77 errors as the standard NEG-ERR.
package relay

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/fiatjaf/eventstore"
	"github.com/fiatjaf/khatru"
	"github.com/nats-io/nats.go"
	"github.com/nbd-wtf/go-nostr"
	"github.com/nbd-wtf/go-nostr/nip11"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/config"
	"github.com/grasp-sync/grasp-sync/pkg/khatrulock"
	"github.com/grasp-sync/grasp-sync/pkg/obs"
	"github.com/grasp-sync/grasp-sync/pkg/policy"
	"github.com/grasp-sync/grasp-sync/pkg/store"
	"github.com/grasp-sync/grasp-sync/services/relay/frameguard"
)

// Config is the relay's configuration (GRASP_* variables). Zero numeric
// fields take the defaults below (New applies them), so a Config built in
// code needs only Addr and PublicURL. Fields tagged ignored:"true" are not
// read from the environment: their default tag is the value, and tests set
// them in code. They are the shape of a REQ and the guard against a client
// that stops reading, the same for every deployment; they were variables
// once (docs/configuration.md, "No longer read").
type Config struct {
	// Addr is where the relay listens (HTTP and websocket).
	Addr string `envconfig:"RELAY_ADDR" default:"127.0.0.1:7777" zero:"off"`
	// PublicURL is the relay's public websocket URL; its host and port are
	// what "an announcement lists this service" compares against. Default:
	// ws:// + Addr.
	PublicURL string `envconfig:"PUBLIC_URL"`
	// Name is the relay's name, shown in NIP-11.
	Name string `envconfig:"RELAY_NAME" default:"grasp-sync"`
	// Description is the relay's description, shown in NIP-11.
	Description string `envconfig:"RELAY_DESCRIPTION" default:"GRASP relay with proactive sync (GRASP-02)" zero:"off"`
	// PubKey is the operator's hex public key, shown in NIP-11.
	PubKey string `envconfig:"RELAY_PUBKEY"`
	// Contact is the operator's contact, shown in NIP-11.
	Contact string `envconfig:"RELAY_CONTACT"`
	// MaxMessageBytes bounds one websocket message from a client; a bigger
	// EVENT is refused with "invalid:" and the connection stays open.
	MaxMessageBytes int64 `envconfig:"RELAY_MAX_MESSAGE_BYTES" default:"512000"`
	// Limits are the write policy's limits (GRASP_POLICY_*), the same the
	// ingester applies to synced events.
	policy.Limits
	// Archive names the repositories held as an archive although their
	// announcements do not list us (GRASP_ARCHIVE_*, GRASP-05), the same
	// settings the ingester, discovery and the planner use.
	policy.Archive
	// ArchiveReadOnly refuses client events about an archived repository (its announcement, states, and events naming it or replying to its events): they reach an archive only through sync from the relays its announcement lists. false lets clients write to archived repositories too.
	ArchiveReadOnly bool `envconfig:"ARCHIVE_READ_ONLY" default:"true" zero:"off"`
	// MaxFilters bounds the filters of one REQ: 20, as strfry's
	// long-standing maxReqFilterSize (docs/sync.md, "What relays allow"),
	// so clients written for common relays fit.
	MaxFilters int `ignored:"true" default:"20"`
	// MaxSubscriptions bounds the open subscriptions of one connection:
	// 200, as current strfry releases. Per-address connection and rate
	// limits, which stay settings, are what bound a client's load.
	MaxSubscriptions int `ignored:"true" default:"200"`
	// MaxLimit caps the stored events one REQ filter returns (newest
	// first; clients page further with until). Negentropy is not capped.
	// 500, strfry's maxFilterLimit and the fetcher's page; discovery's
	// RelayMinCap (100) assumes the own relay returns at least that many
	// (docs/decisions/0021-history-crowded-second.md).
	MaxLimit int `ignored:"true" default:"500"`
	// EventRate and EventBurst bound the EVENTs per second per client
	// address.
	EventRate  float64 `envconfig:"RELAY_EVENT_RATE" default:"20"`
	EventBurst int     `envconfig:"RELAY_EVENT_BURST" default:"200"`
	// ConnectRate and ConnectBurst bound new connections per second per
	// client address; MaxConnsPerAddr bounds its open connections.
	ConnectRate     float64 `envconfig:"RELAY_CONNECT_RATE" default:"2"`
	ConnectBurst    int     `envconfig:"RELAY_CONNECT_BURST" default:"30"`
	MaxConnsPerAddr int     `envconfig:"RELAY_MAX_CONNS_PER_ADDR" default:"50"`
	// WriteTimeout bounds one write to a client. A client that does not
	// read for that long is disconnected: otherwise its full socket would
	// stall every broadcast, which holds khatru's lock over all
	// subscriptions while it writes (docs/decisions/0003-khatru-listener-race.md).
	WriteTimeout time.Duration `ignored:"true" default:"10s"`
	// FeedGapMinInterval is the least time between two drops of every
	// client for a gap in the stored-event feed (feedgap.go): a gap within
	// it is acted on when it has passed, not forgotten.
	FeedGapMinInterval time.Duration `ignored:"true" default:"10s"`
	// TrustedAddresses (IPs and CIDR networks, comma-separated) are exempt
	// from rate and connection limits when they connect directly: our own
	// services, the operator. A forwarded connection (X-Forwarded-For,
	// X-Real-IP or Forwarded present) is never exempt.
	TrustedAddresses string `envconfig:"RELAY_TRUSTED_ADDRESSES" default:"127.0.0.1,::1" zero:"off"`
	// TrustedProxies (IPs and CIDR networks, comma-separated) are the
	// reverse proxies in front of the relay: a request they forward is
	// counted as the client its X-Forwarded-For names. Forwarding headers
	// from other peers are ignored (their clients share the peer's limits).
	// The default trusts a proxy on the same host; behind a Kubernetes
	// ingress, name the pod network (docs/deploy.md).
	TrustedProxies string `envconfig:"RELAY_TRUSTED_PROXIES" default:"127.0.0.1,::1" zero:"off"`
}

// withDefaults fills zero fields from the default tags (config.FillDefaults;
// the fields tagged zero:"off" stay as a Config built in code has them),
// then what depends on other fields.
func (c Config) withDefaults() Config {
	config.FillDefaults(&c)
	if c.PublicURL == "" {
		c.PublicURL = "ws://" + c.Addr
	}
	return c
}

// Validate fills defaults that depend on other fields and checks URLs and
// address lists.
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
	if _, err := parsePrefixes(c.TrustedAddresses); err != nil {
		return config.Invalid("RELAY_TRUSTED_ADDRESSES", c.TrustedAddresses, "want IPs or CIDR networks, comma-separated: "+err.Error())
	}
	if _, err := parsePrefixes(c.TrustedProxies); err != nil {
		return config.Invalid("RELAY_TRUSTED_PROXIES", c.TrustedProxies, "want IPs or CIDR networks, comma-separated: "+err.Error())
	}
	if c.PubKey != "" && !nostr.IsValid32ByteHex(c.PubKey) {
		return config.Invalid("RELAY_PUBKEY", c.PubKey, "want a 64-character hex public key")
	}
	if c.MaxEventBytes > 0 && c.MaxMessageBytes > 0 && int64(c.MaxEventBytes) > c.MaxMessageBytes {
		return config.Invalid("POLICY_MAX_EVENT_BYTES", c.MaxEventBytes, "must not exceed GRASP_RELAY_MAX_MESSAGE_BYTES (the relay could not receive such an event)")
	}
	return nil
}

// SupportedGrasps is what NIP-11 advertises under supported_grasps; GRASP-05
// is added when the relay archives repositories (GRASP_ARCHIVE_*).
var SupportedGrasps = []string{"GRASP-01", "GRASP-02"}

// SupportedNIPs is what NIP-11 advertises under supported_nips: only what
// the relay serves, each with its reason in
// docs/decisions/0024-nip11-advertises-what-is-served.md. Not NIP-40: expired events are
// kept and served.
var SupportedNIPs = []any{1, 9, 11, 34, 77}

// Relay is the own relay.
type Relay struct {
	cfg    Config
	store  *store.Store
	bus    *bus.Bus
	policy *policy.Policy
	log    *slog.Logger
	origin string
	khatru *khatru.Relay

	trusted  prefixList
	proxies  prefixList
	events   *addrLimiter
	connects *addrLimiter
	conns    *connCounter

	refused *prometheus.CounterVec
	stored  prometheus.Counter
	// feedGapDrops counts the times every client was dropped for a gap in
	// the stored-event feed.
	feedGapDrops prometheus.Counter

	// clients are the open client connections (conns.go).
	clients clientConns

	// untrusted remembers peers warned about for forwarding headers.
	untrusted untrustedForwarders
}

// New builds the relay over a store. b may be nil for a relay that neither
// publishes nor receives stored-event broadcasts (tests of the relay alone).
// cfg should have passed Validate; zero limits take their defaults.
func New(cfg Config, st *store.Store, b *bus.Bus, log *slog.Logger) *Relay {
	return newRelay(cfg, st, b, log, time.Now)
}

// newRelay is New with the clock of the rate limiters injected (tests).
func newRelay(cfg Config, st *store.Store, b *bus.Bus, log *slog.Logger, now func() time.Time) *Relay {
	cfg = cfg.withDefaults()
	r := &Relay{
		cfg:    cfg,
		store:  st,
		bus:    b,
		log:    log.With("service", "relay"),
		origin: nostr.GeneratePrivateKey()[:16],
		policy: &policy.Policy{
			ServiceURL: cfg.PublicURL, Store: st, Limits: cfg.Limits, Archive: cfg.Archive,
		},
		events:   newAddrLimiter(cfg.EventRate, cfg.EventBurst, now),
		connects: newAddrLimiter(cfg.ConnectRate, cfg.ConnectBurst, now),
		conns:    &connCounter{max: cfg.MaxConnsPerAddr, count: map[netip.Addr]int{}},
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "grasp_relay_refused_total",
			Help: "Client messages and events the relay refused, by reason (policy reasons, rate and size limits).",
		}, []string{"reason"}),
		stored: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "grasp_relay_stored_total", Help: "Client events the relay stored.",
		}),
		feedGapDrops: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "grasp_relay_feed_gap_drops_total",
			Help: "Times the relay dropped every client because its stored-event feed from NATS may have missed events (a NATS reconnect or messages dropped as a slow consumer), so that their live subscriptions start again from the store.",
		}),
	}
	// Validate has checked the lists; a Config built in code gets what
	// parses.
	r.trusted, _ = parsePrefixes(cfg.TrustedAddresses)
	r.proxies, _ = parsePrefixes(cfg.TrustedProxies)

	k := khatru.NewRelay()
	k.Info.Name = cfg.Name
	k.Info.Description = cfg.Description
	k.Info.PubKey = cfg.PubKey
	k.Info.Contact = cfg.Contact
	k.Info.Software = "https://github.com/grasp-sync/grasp-sync"
	k.Info.SupportedNIPs = SupportedNIPs
	// The guard refuses bigger messages first (with an answer); khatru's
	// own limit, which closes the connection, is only a backstop.
	k.MaxMessageSize = cfg.MaxMessageBytes + 1024
	k.Negentropy = true
	k.Log.SetOutput(obs.LineWriter(r.log, "khatru"))

	k.RejectEvent = append(k.RejectEvent, r.rejectEvent)
	k.RejectFilter = append(k.RejectFilter, rejectFilter)
	k.OverwriteFilter = append(k.OverwriteFilter, r.capLimit, trackSubscription)
	// khatru notifies listeners of a client's event without its lock:
	// the save hook broadcasts under it instead (see pkg/khatrulock), after
	// an accepted deletion is applied and the event announced to other
	// writers.
	save := khatrulock.SaveThenBroadcast(k, r.save)
	k.StoreEvent = append(k.StoreEvent, save)
	k.ReplaceEvent = append(k.ReplaceEvent, save)
	k.QueryEvents = append(k.QueryEvents, st.QueryEvents)
	k.DeleteEvent = append(k.DeleteEvent, r.deleteEvent)
	// khatru applies a client's deletion request before the write policy
	// has seen it, and refuses it by itself when a target is someone
	// else's. Both are the policy's call: khatru's outcome is always
	// "accept", its deletes from a client request are skipped
	// (deleteEvent), and an accepted, stored deletion is applied in save
	// (store.SaveAccepted).
	k.OverwriteDeletionOutcome = append(k.OverwriteDeletionOutcome, func(context.Context, *nostr.Event, *nostr.Event) (bool, string) {
		return true, ""
	})
	r.khatru = k
	if khatrulock.ClientsMutex(k) == nil {
		r.log.Warn("khatru's clients lock not found: broadcasts of other writers' events race with disconnects")
	}
	return r
}

// Collectors returns the relay's metrics, for the process registry.
func (r *Relay) Collectors() []prometheus.Collector {
	return []prometheus.Collector{r.refused, r.stored, r.feedGapDrops}
}

// save stores a client event (khatru's store and replace hooks). A
// duplicate or an outdated version is reported as khatru's ErrDupEvent, so
// the client gets OK true and nothing is broadcast twice.
func (r *Relay) save(ctx context.Context, evt *nostr.Event) error {
	stored, err := store.SaveAccepted(ctx, r.store, evt, func(e *nostr.Event) { r.announceStored(ctx, e) })
	if err != nil && stored {
		// A deletion stored but not fully applied (and so not announced):
		// the client still gets OK, as for any stored event.
		r.log.Error("apply deletion", "deletion", evt.ID, "err", err)
	} else if err != nil {
		if errors.Is(err, store.ErrUnstorable) {
			r.refused.WithLabelValues("unstorable").Inc()
			return fmt.Errorf("invalid: this relay cannot store this event: %w", err)
		}
		r.log.Error("store client event", "id", evt.ID, "kind", evt.Kind, "err", err)
		return errors.New("error: could not store the event")
	}
	if !stored {
		return eventstore.ErrDupEvent
	}
	r.stored.Inc()
	return nil
}

// deleteEvent is khatru's delete hook. Deletes khatru makes while handling a
// client's deletion request (an internal call on a client connection) are
// skipped: save applies the request once the policy has accepted it.
// Other deletes (NIP-40 expiry) go through.
func (r *Relay) deleteEvent(ctx context.Context, evt *nostr.Event) error {
	if khatru.IsInternalCall(ctx) && khatru.GetConnection(ctx) != nil {
		return nil
	}
	return r.store.Delete(ctx, evt)
}

// capLimit caps every REQ filter at MaxLimit results (a filter without a
// limit gets MaxLimit). The store returns the newest first, so a client
// that pages with until = the oldest created_at it got sees everything.
// Negentropy sessions are exempt: reconciliation needs the complete set.
func (r *Relay) capLimit(ctx context.Context, f *nostr.Filter) {
	if f.LimitZero || eventstore.IsNegentropySession(ctx) {
		return
	}
	if f.Limit <= 0 || f.Limit > r.cfg.MaxLimit {
		f.Limit = r.cfg.MaxLimit
	}
}

// rejectFilter refuses what the store cannot answer.
func rejectFilter(_ context.Context, f nostr.Filter) (bool, string) {
	if f.Search != "" {
		return true, frameguard.SearchUnsupported
	}
	return false, ""
}

// rejectEvent applies the write policy to a client's event. Duplicates are
// let through to the store, which reports them to khatru as such, so the
// client gets NIP-01's OK true for an event the relay already has.
func (r *Relay) rejectEvent(ctx context.Context, evt *nostr.Event) (bool, string) {
	d := r.policy.Evaluate(ctx, evt)
	if d.Accept && r.cfg.ArchiveReadOnly {
		d = r.archiveReadOnly(ctx, evt, d)
	}
	if d.Accept || d.Reason == policy.ReasonDuplicate {
		return false, ""
	}
	r.refused.WithLabelValues(string(d.Reason)).Inc()
	if d.Err != nil {
		r.log.Error("client event refused: store error", "id", evt.ID, "kind", evt.Kind, "err", d.Err)
	} else {
		r.log.Debug("client event refused", "id", evt.ID, "kind", evt.Kind, "reason", string(d.Reason))
	}
	return true, d.Message
}

// archiveReadOnly turns the acceptance of a client event about an archived
// repository into a refusal: an archive holds what the repository's own
// relays hold, brought by sync (GRASP_ARCHIVE_READ_ONLY).
func (r *Relay) archiveReadOnly(ctx context.Context, evt *nostr.Event, d policy.Decision) policy.Decision {
	ref, archived, err := r.policy.ArchiveOnly(ctx, evt)
	switch {
	case err != nil:
		return policy.Decision{Reason: policy.ReasonStoreError, Message: "error: could not read the event store",
			Err: fmt.Errorf("archive read-only check: %w", err)}
	case archived:
		return policy.Decision{Reason: policy.ReasonArchiveReadOnly, Message: fmt.Sprintf(
			"blocked: repository %s is archived here (GRASP-05 mirror, read-only): publish to the relays its announcement lists", ref)}
	}
	return d
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

// Handler serves NIP-11 (with supported_grasps), the websocket (through
// the connection limits and the guard) and a plain page.
func (r *Relay) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if strings.EqualFold(req.Header.Get("Upgrade"), "websocket") {
			r.serveWebsocket(w, req)
			return
		}
		if req.Header.Get("Accept") == "application/nostr+json" {
			r.serveNIP11(w)
			return
		}
		if wantsStatusPage(req) {
			r.serveStatus(w, req)
			return
		}
		r.khatru.ServeHTTP(w, req)
	})
}

// InfoDocument is the relay's NIP-11 document: the standard fields plus
// GRASP's supported_grasps.
type InfoDocument struct {
	nip11.RelayInformationDocument
	SupportedGrasps []string `json:"supported_grasps"`
	// Curation says what the relay mirrors besides the repositories that
	// list it (GRASP-05); absent when it archives nothing.
	Curation string `json:"curation,omitempty"`
}

func (r *Relay) serveNIP11(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "application/nostr+json")
	w.Header().Set("Access-Control-Allow-Origin", "*")
	_ = json.NewEncoder(w).Encode(r.Info())
}

// Info is the NIP-11 document the relay serves.
func (r *Relay) Info() InfoDocument {
	info := *r.khatru.Info
	info.SupportedNIPs = SupportedNIPs
	info.Limitation = &nip11.RelayLimitationDocument{
		MaxMessageLength:    int(r.cfg.MaxMessageBytes),
		MaxSubscriptions:    r.cfg.MaxSubscriptions,
		MaxLimit:            r.cfg.MaxLimit,
		DefaultLimit:        r.cfg.MaxLimit,
		MaxSubidLength:      64,
		MaxEventTags:        r.cfg.MaxTags,
		MaxContentLength:    r.cfg.MaxEventBytes,
		CreatedAtUpperLimit: int64(r.cfg.Limits.WithDefaults().MaxFutureSkew / time.Second),
		RestrictedWrites:    true, // the GRASP write policy
	}
	doc := InfoDocument{RelayInformationDocument: info, SupportedGrasps: SupportedGrasps}
	if r.cfg.Archive.Enabled() {
		doc.SupportedGrasps = append(slices.Clone(SupportedGrasps), "GRASP-05")
		doc.Curation = r.cfg.Archive.Curation()
		if r.cfg.ArchiveReadOnly {
			doc.Curation += "; archived repositories are read-only here"
		}
	}
	return doc
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
		wctx, stop := context.WithCancel(ctx)
		watched := make(chan struct{})
		go func() {
			defer close(watched)
			r.watchStoredFeed(wctx, sub)
		}()
		defer func() { stop(); <-watched }()
	}
	srv := &http.Server{
		Handler:           r.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
	}
	r.logClientAddressing()
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
	// http.Server.Shutdown does not close hijacked (websocket) connections,
	// and khatru's own Shutdown needs its own server.
	r.clients.closeAll()
	<-errc
	return nil
}

func (r *Relay) onStored(msg *nats.Msg) {
	if msg.Header.Get(bus.HeaderOrigin) == r.origin {
		return
	}
	// Nobody could want it: skip the decode (every stored event passes
	// here). A subscription opened right after this check reads the event
	// from the store, where it already is.
	if kind, ok := bus.StoredKind(msg.Subject); ok && !khatrulock.ListeningFor(r.khatru, kind) {
		return
	}
	// go-nostr's generated decoder, without encoding/json's validation
	// pass over the whole message.
	var evt nostr.Event
	if err := evt.UnmarshalJSON(msg.Data); err != nil {
		r.log.Warn("undecodable stored event", "subject", msg.Subject, "err", err)
		return
	}
	khatrulock.Broadcast(r.khatru, &evt)
}
