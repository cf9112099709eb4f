package e2e

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/grasp-sync/grasp-sync/pkg/store"
	"github.com/grasp-sync/grasp-sync/services/graspd"
)

// Target is a running grasp-sync deployment as the scenarios see it: where
// to publish, what announcements must list, the own store, and the metrics
// of every service. graspd in-process (Graspd) and the multi-process
// Deployment both implement it, so one scenario body runs in both modes.
type Target interface {
	// RelayURL is where clients (and the tests) reach the own relay.
	RelayURL() string
	// PublicURL is the URL announcements must list to be hosted here.
	PublicURL() string
	// Store is the own event store, read directly to check what arrived.
	Store() *store.Store
	// Metrics returns every sample of every running service as
	// "name{labels}" → value; samples with the same key in several
	// processes (two fetchers) are summed.
	Metrics(ctx context.Context) (map[string]float64, error)
}

// Graspd is graspd running in this process as a Target.
type Graspd struct{ *graspd.App }

// Metrics scrapes graspd's /metrics.
func (g Graspd) Metrics(ctx context.Context) (map[string]float64, error) {
	out := map[string]float64{}
	return out, scrapeInto(ctx, g.MetricsAddr(), out)
}

// scrapeInto adds every sample served at http://addr/metrics to out
// (labels as printed by the Prometheus text format).
func scrapeInto(ctx context.Context, addr string, out map[string]float64) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("scrape metrics at %s: %w", addr, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("scrape metrics at %s: %s", addr, resp.Status)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		out[line[:i]] += v
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("scrape metrics at %s: %w", addr, err)
	}
	return nil
}
