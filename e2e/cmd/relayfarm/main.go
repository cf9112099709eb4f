// Command relayfarm runs many khatru relays in one process, apart from the
// graspd under test, for `make bench-scale` (issue 23; docs/performance.md, "Design scale"). The relays listen on loopback, each on a port of its
// own; NIP-77 answers on a fraction of them, every REQ filter is capped
// (500 by default, like strfry), and a fraction can match tags by value
// only (plain khatru's quirk). Each relay counts connections, REQs,
// NEG-OPENs (also on relays without NIP-77), events sent and bytes.
//
// The relays can enforce public relays' limits (issue 30; how strfry and
// nostr-rs-relay enforce them is in docs/dependencies.md): -max-message,
// -max-subs and -max-filters, answered in the style of -limit-style, said
// in NIP-11 by the fraction -advertise; -auth-reads makes a fraction refuse
// reads without NIP-42. Their refusals are in the stats.
//
// Once listening it prints one JSON line on stdout:
//
//	{"control":"http://127.0.0.1:PORT","relays":["ws://127.0.0.1:P0", …]}
//
// The control address serves GET /relays, GET /stats (per-relay counts as
// JSON) and POST /seed (JSON lines of {"relays":[i,…],"event":{…}}; see
// testrelay.Farm.Handler). On SIGINT or SIGTERM it prints the final stats as
// one JSON line and exits.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
)

func main() {
	var o testrelay.FarmOptions
	flag.IntVar(&o.Relays, "relays", 100, "how many relays")
	flag.Float64Var(&o.NegentropyFraction, "nip77", 0.5, "fraction of relays answering NIP-77")
	flag.Float64Var(&o.IgnoreTagLetterFraction, "ignore-tag-letter", 0, "fraction of relays matching tags by value only (plain khatru)")
	flag.IntVar(&o.MaxLimit, "max-limit", testrelay.DefaultMaxLimit, "cap of every REQ filter's results")
	flag.StringVar(&o.Host, "host", "127.0.0.1", "loopback address the relays listen on")
	flag.IntVar(&o.Limits.MaxMessageBytes, "max-message", 0, "largest client message in bytes (strfry's default 131072; 0: unlimited)")
	flag.IntVar(&o.Limits.MaxSubscriptions, "max-subs", 0, "open REQ subscriptions (and, apart, NIP-77 sessions) per connection (strfry: 20, now 200; 0: unlimited)")
	flag.IntVar(&o.Limits.MaxFilters, "max-filters", 0, "filters per REQ (strfry: 20, now 200; 0: unlimited)")
	style := flag.String("limit-style", string(testrelay.StyleStrfry), "whose answers the limits give: strfry, nostr-rs-relay or closed")
	flag.Float64Var(&o.AdvertiseFraction, "advertise", 0, "fraction of relays saying their limits in NIP-11")
	flag.Float64Var(&o.AuthReadsFraction, "auth-reads", 0, "fraction of relays refusing reads without NIP-42 authentication")
	control := flag.String("control", "127.0.0.1:0", "address of the control endpoint")
	flag.Parse()
	o.Limits.Style = testrelay.LimitStyle(*style)
	if err := run(o, *control); err != nil {
		fmt.Fprintln(os.Stderr, "relayfarm:", err)
		os.Exit(1)
	}
}

func run(o testrelay.FarmOptions, control string) error {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	f, err := testrelay.StartFarm(o)
	if err != nil {
		return err
	}
	defer f.Close()
	ln, err := net.Listen("tcp", control)
	if err != nil {
		return fmt.Errorf("control listen on %s: %w", control, err)
	}
	srv := &http.Server{Handler: f.Handler(), ReadHeaderTimeout: 5 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	enc := json.NewEncoder(os.Stdout)
	if err := enc.Encode(map[string]any{"control": "http://" + ln.Addr().String(), "relays": f.URLs()}); err != nil {
		return fmt.Errorf("print the relays: %w", err)
	}
	select {
	case <-ctx.Done():
	case err := <-served:
		return fmt.Errorf("control endpoint: %w", err)
	}
	shut, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = srv.Shutdown(shut)
	return enc.Encode(map[string]any{"stats": f.Stats()})
}
