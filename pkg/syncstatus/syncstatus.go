// Package syncstatus reads how sync stands from what the services keep in
// NATS KV: the planner's per-relay records (<prefix>_relay_state), the
// RepoSyncIndex written by discovery (<prefix>_repo_index), leadership leases
// (<prefix>_leases) and the recent fetcher health reports. graspctl status,
// graspctl explain and the relay's HTML status page all read through here, so
// an operator sees the same numbers whichever tool they open.
package syncstatus

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/leader"
	"github.com/grasp-sync/grasp-sync/pkg/relaylimits"
)

// ErrBucketMissing means a KV bucket the services create does not exist:
// nothing has run against this NATS with this prefix yet.
var ErrBucketMissing = errors.New("bucket missing: start graspd (or the services) against this NATS, or check GRASP_PREFIX")

// ErrUnknownRepo means the RepoSyncIndex has no entry for a repository.
var ErrUnknownRepo = errors.New("repository not in the RepoSyncIndex: its announcement must list this service (check `graspctl repos`)")

// healthScanLimit bounds how many recent fetch reports Read looks at for
// relay health: the report stream keeps hours of reports, and a status read
// must stay cheap enough for a page that refreshes every few seconds.
const healthScanLimit = 512

// Relay is one remote relay as the planner last recorded it.
type Relay struct {
	URL string `json:"url"`
	// Status is the planner's RelayStatus in words (Connected, Syncing, …).
	Status string `json:"status"`
	// StatusCode is ngit-grasp's 0–5 encoding (RelayStatus value − 1).
	StatusCode int  `json:"status_code"`
	Bootstrap  bool `json:"bootstrap"`
	// ListedRepos counts the RepoSyncIndex entries that list this relay.
	ListedRepos    int `json:"listed_repos"`
	ConfirmedRepos int `json:"confirmed_repos"`
	PendingRepos   int `json:"pending_repos"`
	ConfirmedRoots int `json:"confirmed_roots"`
	PendingRoots   int `json:"pending_roots"`
	PendingBatches int `json:"pending_batches"`
	LiveFilters    int `json:"live_filters"`
	// HistoricFailures counts failed batches since the last full sync.
	HistoricFailures int       `json:"historic_failures"`
	LastConnected    time.Time `json:"last_connected,omitzero"`
	// Health, ConsecutiveFailures and LastError come from the newest fetcher
	// Health report among the recent reports; Health is "" when none is
	// recent (a relay that never failed reports no health change).
	Health              string    `json:"health,omitempty"`
	ConsecutiveFailures int       `json:"consecutive_failures,omitempty"`
	LastError           string    `json:"last_error,omitempty"`
	UpdatedAt           time.Time `json:"updated_at,omitzero"`

	// IncompleteBatches counts, among the historic failures, the batches
	// that could not read the relay completely (a one-second slice over its
	// cap); LastIncomplete says what the last one could not read.
	IncompleteBatches int    `json:"incomplete_batches,omitempty"`
	LastIncomplete    string `json:"last_incomplete,omitempty"`

	// ResyncMissed counts the events daily resyncs found on this relay that
	// live subscriptions and catch-ups had missed: each waited up to a day
	// (docs/sync.md, "Counting what the daily resync finds").
	// LastMissedAt is when a resync last found one.
	ResyncMissed uint64    `json:"resync_missed"`
	LastMissedAt time.Time `json:"last_missed_at,omitzero"`

	// Limits is what the fetchers know of the relay's limits (nil when
	// they have recorded nothing yet): docs/sync.md, "What relays allow".
	Limits *Limits `json:"limits,omitempty"`

	state *graspv1.RelayState
}

// Limits are a relay's budgets as the fetchers keep to them: InForce is
// what they send within — Advertised in NIP-11 or the defaults, lowered by
// Learned from the relay's refusals —, Refusals the reads it refuses us.
type Limits struct {
	InForce    relaylimits.Limits `json:"in_force"`
	Advertised relaylimits.Limits `json:"advertised"`
	Learned    relaylimits.Limits `json:"learned"`
	// NIP11Error is why the relay's NIP-11 document could not be read.
	NIP11Error string `json:"nip11_error,omitempty"`
	// LimitRefusals counts refusals of a budget by kind (message_size,
	// subscriptions, filters).
	LimitRefusals map[string]uint64 `json:"limit_refusals,omitempty"`
	Refusals      []ReadRefusal     `json:"refusals,omitempty"`
}

// ReadRefusal is a kind of read the relay refuses us, asked again at
// RetryAt.
type ReadRefusal struct {
	FilterKind string    `json:"filter_kind"`
	Reason     string    `json:"reason"`
	At         time.Time `json:"at"`
	RetryAt    time.Time `json:"retry_at"`
}

// FromRelayLimits turns the fetchers' record into Limits.
func FromRelayLimits(rec *graspv1.RelayLimits) *Limits {
	conv := func(l *graspv1.Limits) relaylimits.Limits {
		return relaylimits.Limits{MaxMessageBytes: int(l.GetMaxMessageBytes()), MaxSubscriptions: int(l.GetMaxSubscriptions()),
			MaxFilters: int(l.GetMaxFilters()), MaxLimit: int(l.GetMaxLimit())}
	}
	l := &Limits{Advertised: conv(rec.GetAdvertised()), Learned: conv(rec.GetLearned()), NIP11Error: rec.GetNip11Error(),
		LimitRefusals: rec.GetLimitRefusals()}
	l.InForce = relaylimits.Effective(l.Advertised, l.Learned)
	for _, rf := range rec.GetRefusals() {
		l.Refusals = append(l.Refusals, ReadRefusal{FilterKind: rf.GetFilterKind(), Reason: rf.GetReason(),
			At: time.UnixMilli(rf.GetAt()).UTC(), RetryAt: time.UnixMilli(rf.GetRetryAt()).UTC()})
	}
	return l
}

// Repo is one RepoSyncIndex entry.
type Repo struct {
	Ref            string    `json:"ref"`
	Relays         []string  `json:"relays"`
	Roots          int       `json:"roots"`
	AnnouncementID string    `json:"announcement_id,omitempty"`
	UpdatedAt      time.Time `json:"updated_at,omitzero"`
	// Archived marks a repository synced as an archive (GRASP-05): its
	// announcement does not list this service.
	Archived bool `json:"archived,omitempty"`
	rootIDs  []string
}

// Lease is who holds an elected role.
type Lease struct {
	Role   string `json:"role"`
	Held   bool   `json:"held"`
	Holder string `json:"holder,omitempty"`
	Epoch  uint64 `json:"epoch,omitempty"`
}

// Snapshot is the whole picture at one moment.
type Snapshot struct {
	Taken     time.Time `json:"taken"`
	Relays    []Relay   `json:"relays"`
	Repos     []Repo    `json:"repos"`
	Bootstrap []string  `json:"bootstrap_relays,omitempty"`
	Leases    []Lease   `json:"leases"`
}

// Progress is the one-line summary of sync work in flight.
type Progress struct {
	Relays         int `json:"relays"`
	Connected      int `json:"connected"`
	Syncing        int `json:"syncing"`
	PendingBatches int `json:"pending_batches"`
	PendingRoots   int `json:"pending_roots"`
	ConfirmedRoots int `json:"confirmed_roots"`
}

// StatusName is the operator's word for a RelayStatus.
func StatusName(s graspv1.RelayStatus) string {
	switch s {
	case graspv1.RelayStatus_RELAY_STATUS_DISCONNECTED:
		return "Disconnected"
	case graspv1.RelayStatus_RELAY_STATUS_CONNECTING:
		return "Connecting"
	case graspv1.RelayStatus_RELAY_STATUS_SYNCING:
		return "Syncing"
	case graspv1.RelayStatus_RELAY_STATUS_CONNECTED:
		return "Connected"
	case graspv1.RelayStatus_RELAY_STATUS_CONNECTED_HISTORIC_SYNC_FAILURES:
		return "ConnectedWithFailures"
	case graspv1.RelayStatus_RELAY_STATUS_DISCONNECTING:
		return "Disconnecting"
	}
	return "Unknown"
}

// HealthName is the operator's word for a fetcher HealthState.
func HealthName(h graspv1.HealthState) string {
	switch h {
	case graspv1.HealthState_HEALTH_STATE_HEALTHY:
		return "healthy"
	case graspv1.HealthState_HEALTH_STATE_BACKING_OFF:
		return "backing-off"
	case graspv1.HealthState_HEALTH_STATE_DEAD:
		return "dead"
	}
	return ""
}

// confirmedRepos counts the repositories whose own history a record says
// was fetched: confirmed[].repo_confirmed, or, in a record of a planner
// before 2026-12-06, the confirmed_repo_refs that repeated them.
func confirmedRepos(st *graspv1.RelayState) int {
	n := 0
	for _, c := range st.GetConfirmed() {
		if c.GetRepoConfirmed() {
			n++
		}
	}
	return max(n, len(st.GetConfirmedRepoRefs()))
}

// FromRelayState turns a planner record into a Relay (health fields empty).
func FromRelayState(st *graspv1.RelayState) Relay {
	code := int(st.GetStatus()) - 1
	if code < 0 {
		code = 0
	}
	r := Relay{
		URL:              st.GetRelayUrl(),
		Status:           StatusName(st.GetStatus()),
		StatusCode:       code,
		Bootstrap:        st.GetBootstrap(),
		ConfirmedRepos:   confirmedRepos(st),
		PendingRepos:     int(st.GetPendingRepos()),
		ConfirmedRoots:   int(st.GetConfirmedRoots()),
		PendingRoots:     int(st.GetPendingRoots()),
		PendingBatches:   int(st.GetPendingBatches()),
		LiveFilters:      int(st.GetLiveFilterCount()),
		HistoricFailures: int(st.GetHistoricFailures()),
		LastConnected:    unix(st.GetLastConnected()),
		UpdatedAt:        unix(st.GetUpdatedAt()),
		state:            st,
	}
	r.IncompleteBatches, r.LastIncomplete = int(st.GetIncompleteBatches()), st.GetLastIncomplete()
	r.ResyncMissed, r.LastMissedAt = st.GetResyncMissed(), unix(st.GetLastMissedAt())
	return r
}

func unix(sec int64) time.Time {
	if sec == 0 {
		return time.Time{}
	}
	return time.Unix(sec, 0).UTC()
}

// Progress sums the relays' work in flight.
func (s *Snapshot) Progress() Progress {
	p := Progress{Relays: len(s.Relays)}
	for _, r := range s.Relays {
		switch r.Status {
		case "Connected", "ConnectedWithFailures":
			p.Connected++
		case "Syncing":
			p.Syncing++
		}
		p.PendingBatches += r.PendingBatches
		p.PendingRoots += r.PendingRoots
		p.ConfirmedRoots += r.ConfirmedRoots
	}
	return p
}

// Relay returns the relay with url, if the planner has a record of it.
func (s *Snapshot) Relay(url string) (Relay, bool) {
	i := slices.IndexFunc(s.Relays, func(r Relay) bool { return r.URL == url })
	if i < 0 {
		return Relay{}, false
	}
	return s.Relays[i], true
}

// ReadRelays takes a Snapshot of the planner's relay records only (no
// index, health or leases): what the progress line needs, cheap enough to
// run every few seconds.
func ReadRelays(ctx context.Context, js jetstream.JetStream, names bus.Names) (*Snapshot, error) {
	s := &Snapshot{Taken: time.Now().UTC()}
	if err := readRelays(ctx, js, names, s); err != nil {
		return nil, err
	}
	return s, nil
}

// Read takes a Snapshot. A missing bucket is ErrBucketMissing (wrapped with
// the bucket's name); a missing lease bucket only leaves Leases unheld.
func Read(ctx context.Context, js jetstream.JetStream, names bus.Names) (*Snapshot, error) {
	s := &Snapshot{Taken: time.Now().UTC()}
	if err := readIndex(ctx, js, names, s); err != nil {
		return nil, err
	}
	if err := readRelays(ctx, js, names, s); err != nil {
		return nil, err
	}
	listed := map[string]int{}
	for _, r := range s.Repos {
		for _, u := range r.Relays {
			listed[u]++
		}
	}
	for i := range s.Relays {
		s.Relays[i].ListedRepos = listed[s.Relays[i].URL]
	}
	health, err := recentHealth(ctx, js, names, healthScanLimit)
	if err == nil {
		for i := range s.Relays {
			if h, ok := health[s.Relays[i].URL]; ok {
				s.Relays[i].Health = HealthName(h.GetState())
				s.Relays[i].ConsecutiveFailures = int(h.GetConsecutiveFailures())
				s.Relays[i].LastError = h.GetLastError()
			}
		}
	}
	if lims, err := readLimits(ctx, js, names); err == nil {
		for i := range s.Relays {
			if rec, ok := lims[s.Relays[i].URL]; ok {
				s.Relays[i].Limits = FromRelayLimits(rec)
			}
		}
	}
	s.Leases = readLeases(ctx, js, names)
	return s, nil
}

// readLimits reads the fetchers' limits records by relay URL; a missing
// bucket (no fetcher has run yet) is ErrBucketMissing.
func readLimits(ctx context.Context, js jetstream.JetStream, names bus.Names) (map[string]*graspv1.RelayLimits, error) {
	out := map[string]*graspv1.RelayLimits{}
	err := eachEntry(ctx, js, names.RelayLimitsBucket(), bus.RelayLimitsKeyPrefix, func(_ string, v []byte) error {
		var rec graspv1.RelayLimits
		if err := proto.Unmarshal(v, &rec); err != nil {
			return err
		}
		out[rec.GetRelayUrl()] = &rec
		return nil
	})
	return out, err
}

func openKV(ctx context.Context, js jetstream.JetStream, bucket string) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, fmt.Errorf("%s: %w", bucket, ErrBucketMissing)
	}
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", bucket, err)
	}
	return kv, nil
}

// keys lists a bucket's keys; an empty bucket is no error.
func keys(ctx context.Context, kv jetstream.KeyValue) ([]string, error) {
	lister, err := kv.ListKeys(ctx)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", kv.Bucket(), err)
	}
	var ks []string
	for k := range lister.Keys() {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks, nil
}

// eachEntry calls fn with every key whose name has prefix in bucket, in key
// order, and its value; keys deleted between listing and reading are
// skipped.
func eachEntry(ctx context.Context, js jetstream.JetStream, bucket, prefix string, fn func(key string, value []byte) error) error {
	kv, err := openKV(ctx, js, bucket)
	if err != nil {
		return err
	}
	ks, err := keys(ctx, kv)
	if err != nil {
		return err
	}
	for _, k := range ks {
		if !strings.HasPrefix(k, prefix) {
			continue
		}
		e, err := kv.Get(ctx, k)
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
			continue
		}
		if err != nil {
			return fmt.Errorf("read %s/%s: %w", kv.Bucket(), k, err)
		}
		if err := fn(k, e.Value()); err != nil {
			return fmt.Errorf("decode %s/%s: %w", kv.Bucket(), k, err)
		}
	}
	return nil
}

func readIndex(ctx context.Context, js jetstream.JetStream, names bus.Names, s *Snapshot) error {
	err := eachEntry(ctx, js, names.RepoIndexBucket(), "", func(k string, v []byte) error {
		if k == bus.BootstrapRelaysKey {
			var b graspv1.BootstrapRelays
			if proto.Unmarshal(v, &b) == nil {
				s.Bootstrap = b.GetRelays()
			}
			return nil
		}
		var needs graspv1.RepoSyncNeeds
		if err := proto.Unmarshal(v, &needs); err != nil {
			return err
		}
		s.Repos = append(s.Repos, Repo{
			Ref: needs.GetRepoRef(), Relays: needs.GetRelays(), Roots: len(needs.GetRootEventIds()),
			AnnouncementID: needs.GetAnnouncementId(), UpdatedAt: unix(needs.GetUpdatedAt()),
			Archived: needs.GetArchived(), rootIDs: needs.GetRootEventIds(),
		})
		return nil
	})
	sort.Slice(s.Repos, func(i, j int) bool { return s.Repos[i].Ref < s.Repos[j].Ref })
	return err
}

func readRelays(ctx context.Context, js jetstream.JetStream, names bus.Names, s *Snapshot) error {
	err := eachEntry(ctx, js, names.RelayStateBucket(), bus.RelayStateKeyPrefix, func(_ string, v []byte) error {
		var st graspv1.RelayState
		if err := proto.Unmarshal(v, &st); err != nil {
			return err
		}
		s.Relays = append(s.Relays, FromRelayState(&st))
		return nil
	})
	sort.Slice(s.Relays, func(i, j int) bool { return s.Relays[i].URL < s.Relays[j].URL })
	return err
}

// LeaseRoles are the elected roles whose holders a Snapshot reports.
var LeaseRoles = []string{"discovery", "planner"}

func readLeases(ctx context.Context, js jetstream.JetStream, names bus.Names) []Lease {
	out := make([]Lease, 0, len(LeaseRoles))
	kv, err := js.KeyValue(ctx, names.LeaseBucket())
	for _, role := range LeaseRoles {
		l := Lease{Role: role}
		if err == nil {
			if cur, ok, lerr := leader.Current(ctx, kv, role); lerr == nil && ok {
				l.Held, l.Holder, l.Epoch = true, cur.Holder, cur.Epoch
			}
		}
		out = append(out, l)
	}
	return out
}

// recentHealth returns the newest Health report per relay among the last
// limit messages of the report stream. It walks backwards by sequence so the
// cost is bounded whatever the stream's age limit.
func recentHealth(ctx context.Context, js jetstream.JetStream, names bus.Names, limit int) (map[string]*graspv1.Health, error) {
	st, err := js.Stream(ctx, names.FetchReportStream())
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", names.FetchReportStream(), err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("info %s: %w", names.FetchReportStream(), err)
	}
	out := map[string]*graspv1.Health{}
	last, first := info.State.LastSeq, info.State.FirstSeq
	for seq, n := last, 0; seq >= first && seq > 0 && n < limit; seq, n = seq-1, n+1 {
		m, err := st.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			return out, fmt.Errorf("read %s #%d: %w", names.FetchReportStream(), seq, err)
		}
		var rep graspv1.FetchReport
		if bus.Decode(m.Data, m.Header, &rep) != nil {
			continue
		}
		if h := rep.GetHealth(); h != nil {
			if _, seen := out[rep.GetRelayUrl()]; !seen {
				out[rep.GetRelayUrl()] = h
			}
		}
	}
	return out, nil
}
