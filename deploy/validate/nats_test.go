package validate

import (
	"context"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	corev1 "k8s.io/api/core/v1"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
)

var update = flag.Bool("update", false, "rewrite k8s/base/nats/auth.conf from the code")

func authConfPath() string { return filepath.Join(k8sDir(), "base", "nats", "auth.conf") }

// TestNATSAuthConf: the users and permissions in the manifests are exactly
// what the code's use of bus.Names needs — the committed auth.conf is
// regenerated from the code and must not differ.
func TestNATSAuthConf(t *testing.T) {
	perms, usages, err := DerivePermissions(repoRoot, bus.DefaultNames())
	if err != nil {
		t.Fatal(err)
	}
	for _, u := range Users {
		t.Logf("%s: publishes %v, subscribes %v, streams %v, buckets %v, reads streams %v, reads buckets %v", u,
			keys(usages[u].Publish), keys(usages[u].Subscribe), keys(usages[u].Streams), keys(usages[u].Buckets),
			keys(usages[u].ReadStreams), keys(usages[u].ReadBuckets))
	}
	want := AuthConf(perms)
	if *update {
		if err := os.WriteFile(authConfPath(), []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(authConfPath())
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Fatalf("%s is stale: the code now uses different subjects, streams or buckets.\n"+
			"Regenerate it: cd deploy/validate && go test -run TestNATSAuthConf -update\n--- want\n%s", authConfPath(), want)
	}
}

func keys(m map[string]bool) []string { return sorted(m) }

// natsFromManifest starts a NATS server from the nats.conf the dev overlay
// renders (users, passwords from the env, permissions), on a free port, and
// returns its URL and the passwords.
func natsFromManifest(t *testing.T) (string, map[string]string) {
	t.Helper()
	objs, err := Render(filepath.Join(k8sDir(), "overlays", "dev"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	passwords := map[string]string{}
	for _, o := range objs {
		v, err := Decode(o)
		if err != nil {
			t.Fatal(err)
		}
		if cm, ok := v.(*corev1.ConfigMap); ok && strings.HasPrefix(o.Name, "grasp-nats-config") {
			for name, data := range cm.Data {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o600); err != nil {
					t.Fatal(err)
				}
			}
		}
		if sec, ok := v.(*corev1.Secret); ok && strings.HasPrefix(o.Name, "grasp-nats-users") {
			for k, val := range secretValues(sec) {
				passwords[k] = val
			}
		}
	}
	t.Setenv("POD_NAME", "nats-test")
	for _, u := range Users {
		if passwords[u] == "" {
			t.Fatalf("dev Secret grasp-nats-users has no password for %s", u)
		}
		t.Setenv(strings.ToUpper(u)+"_PASSWORD", passwords[u])
	}
	opts, err := server.ProcessConfigFile(filepath.Join(dir, "nats.conf"))
	if err != nil {
		t.Fatalf("nats.conf of the manifests: %v", err)
	}
	// Only the places differ from the pod: a temp store, a free port, no
	// monitoring listener, no pid file.
	opts.Host, opts.Port, opts.HTTPPort, opts.PidFile = "127.0.0.1", -1, 0, ""
	opts.StoreDir = t.TempDir()
	opts.NoLog, opts.NoSigs = true, true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server from the manifests did not start")
	}
	t.Cleanup(s.Shutdown)
	return s.ClientURL(), passwords
}

// permErrors collects a connection's asynchronous permission violations.
type permErrors struct {
	mu   sync.Mutex
	errs []string
}

func (p *permErrors) handler(_ *nats.Conn, _ *nats.Subscription, err error) {
	if errors.Is(err, nats.ErrPermissionViolation) || strings.Contains(err.Error(), "Permissions Violation") {
		p.mu.Lock()
		p.errs = append(p.errs, err.Error())
		p.mu.Unlock()
	}
}

func (p *permErrors) take() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	e := p.errs
	p.errs = nil
	return e
}

// TestNATSPermissionsWork runs, as every service's NATS user of the
// manifests, what that service's code does — bus.Setup, publishing on its
// families, consuming and maintaining its streams, reading and writing its
// buckets — and checks the server refuses what the code does not do.
func TestNATSPermissionsWork(t *testing.T) {
	url, passwords := natsFromManifest(t)
	names := bus.DefaultNames()
	fams, err := Families(names)
	if err != nil {
		t.Fatal(err)
	}
	_, usages, err := DerivePermissions(repoRoot, names)
	if err != nil {
		t.Fatal(err)
	}
	setup, err := SetupFamilies(repoRoot, fams)
	if err != nil {
		t.Fatal(err)
	}
	// Order matters only for the first Setup: any service may come up first.
	for _, user := range Users {
		t.Run(user, func(t *testing.T) {
			// A refused JetStream request is never answered: bound the wait.
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			pe := &permErrors{}
			nc, err := nats.Connect(url, nats.UserInfo(user, passwords[user]), nats.ErrorHandler(pe.handler), nats.Name(user))
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			js, err := jetstream.New(nc)
			if err != nil {
				t.Fatal(err)
			}
			u := usages[user]
			step := func(what string, err error) {
				t.Helper()
				_ = nc.Flush()
				if pv := pe.take(); len(pv) > 0 || err != nil {
					t.Errorf("%s as %s: %v %v", what, user, err, pv)
				}
			}
			if user != "graspctl" {
				step("bus.Setup", bus.Setup(ctx, js, names, bus.DefaultOptions()))
			}
			for f := range u.Streams {
				ensureStream(ctx, t, url, passwords, fams[f]) // what services/ingester/internal/parking creates itself
				exerciseStream(ctx, step, js, fams[f])
			}
			for f := range u.Publish {
				if fams[f].Stream != "" {
					_, err := js.Publish(ctx, fams[f].Sample, []byte("{}"))
					step("publish "+fams[f].Sample, err)
				} else {
					step("publish "+fams[f].Sample, nc.Publish(fams[f].Sample, []byte("{}")))
				}
			}
			for f := range u.Subscribe {
				sub, err := nc.SubscribeSync(fams[f].Wildcard)
				step("subscribe "+fams[f].Wildcard, err)
				if sub != nil {
					_ = sub.Unsubscribe()
				}
			}
			for f := range u.Buckets {
				if !setup.Buckets[f] {
					// A bucket outside bus.Setup is created by the service
					// that uses it (the fetcher's), at every start: create,
					// then update, as bus.EnsureKeyValue does.
					for range 2 {
						_, err := bus.EnsureKeyValue(ctx, js, jetstream.KeyValueConfig{Bucket: fams[f].BucketID})
						step("create or update bucket "+fams[f].BucketID, err)
					}
				}
				exerciseBucket(ctx, step, js, fams[f].BucketID)
			}
			for f := range u.ReadStreams {
				readStream(ctx, step, js, fams[f])
			}
			for f := range u.ReadBuckets {
				readBucket(ctx, step, js, fams[f].BucketID)
			}
			// What the code does not do is refused.
			for name, f := range fams {
				if f.Bucket {
					if !u.Buckets[name] {
						_ = nc.Publish("$KV."+f.BucketID+".probe", nil)
						expectRefused(t, nc, pe, user, "write bucket "+f.BucketID)
					}
					continue
				}
				if !u.Publish[name] && f.Sample != "" {
					_ = nc.Publish(f.Sample, []byte("{}"))
					expectRefused(t, nc, pe, user, "publish "+f.Sample)
				}
				if !u.Subscribe[name] && user != "graspctl" {
					sub, _ := nc.SubscribeSync(f.Wildcard)
					expectRefused(t, nc, pe, user, "subscribe "+f.Wildcard)
					if sub != nil {
						_ = sub.Unsubscribe()
					}
				}
				if f.Stream != "" && !u.Streams[name] && !u.ReadStreams[name] {
					_ = nc.Publish("$JS.API.CONSUMER.CREATE."+f.Stream+".probe", nil)
					expectRefused(t, nc, pe, user, "create a consumer on "+f.Stream)
				}
				if f.Stream != "" && !u.Streams[name] {
					_ = nc.Publish("$JS.API.STREAM.PURGE."+f.Stream, nil)
					expectRefused(t, nc, pe, user, "purge "+f.Stream)
				}
			}
		})
	}
}

func expectRefused(t *testing.T, nc *nats.Conn, pe *permErrors, user, what string) {
	t.Helper()
	_ = nc.Flush()
	deadline := time.Now().Add(2 * time.Second)
	for time.Now().Before(deadline) {
		if len(pe.take()) > 0 {
			return
		}
		_ = nc.Flush() // the -ERR arrives before the PONG of a later flush
	}
	t.Errorf("%s may %s, which its code never does", user, what)
}

// ensureStream creates a stream some package creates on its own (not in
// bus.Setup), with the user that does it, so the exercise below finds it.
func ensureStream(ctx context.Context, t *testing.T, url string, passwords map[string]string, f *Family) {
	t.Helper()
	if slices.Contains([]string{"FetchCmd", "FetchReport", "Events"}, f.Name) {
		return
	}
	nc, err := nats.Connect(url, nats.UserInfo("ingester", passwords["ingester"]))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	_, _ = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: f.Stream, Subjects: []string{f.Wildcard}})
}

func exerciseStream(ctx context.Context, step func(string, error), js jetstream.JetStream, f *Family) {
	s, err := js.Stream(ctx, f.Stream)
	step("stream info "+f.Stream, err)
	if err != nil {
		return
	}
	cons, err := s.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable: "validate", FilterSubject: f.Wildcard, AckPolicy: jetstream.AckExplicitPolicy,
	})
	step("create consumer on "+f.Stream, err)
	if err == nil {
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(300*time.Millisecond))
		step("fetch from "+f.Stream, err)
		if err == nil {
			for m := range batch.Messages() {
				step("ack on "+f.Stream, m.Ack())
			}
		}
	}
	_, err = s.GetLastMsgForSubject(ctx, f.Sample)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		err = nil
	}
	step("get last message of "+f.Sample, err)
	err = s.Purge(ctx, jetstream.WithPurgeSubject(f.Sample))
	step("purge "+f.Sample, err)
}

// readStream does what read-only code does with a stream: its info, the
// last message of a subject, an ordered consumer's first message. A stream
// that does not exist yet is an answer, not a refusal.
func readStream(ctx context.Context, step func(string, error), js jetstream.JetStream, f *Family) {
	s, err := js.Stream(ctx, f.Stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return
	}
	step("stream info "+f.Stream, err)
	if err != nil {
		return
	}
	_, err = s.GetLastMsgForSubject(ctx, f.Wildcard)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		err = nil
	}
	step("get last message of "+f.Wildcard, err)
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		// The server answered (a work-queue stream takes no ordered
		// consumer; graspctl tap then follows live traffic only): the
		// request was allowed.
		return
	}
	step("ordered consumer on "+f.Stream, err)
	if err == nil {
		nctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		_, err := cons.Next(jetstream.FetchContext(nctx))
		cancel()
		if nctx.Err() != nil {
			err = nil // nothing retained
		}
		step("next from "+f.Stream, err)
	}
}

// readBucket does what read-only code does with a bucket: get, list keys,
// watch. A bucket that does not exist yet is an answer, not a refusal.
func readBucket(ctx context.Context, step func(string, error), js jetstream.JetStream, bucket string) {
	kv, err := js.KeyValue(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return
	}
	step("open bucket "+bucket, err)
	if err != nil {
		return
	}
	_, err = kv.Get(ctx, "validate-absent")
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		err = nil
	}
	step("get from "+bucket, err)
	keys, err := kv.ListKeys(ctx)
	step("list "+bucket, err)
	if err == nil {
		for range keys.Keys() {
		}
	}
	w, err := kv.WatchAll(ctx)
	step("watch "+bucket, err)
	if err == nil {
		select {
		case <-w.Updates():
		case <-time.After(time.Second):
		}
		_ = w.Stop()
	}
}

func exerciseBucket(ctx context.Context, step func(string, error), js jetstream.JetStream, bucket string) {
	kv, err := js.KeyValue(ctx, bucket)
	step("open bucket "+bucket, err)
	if err != nil {
		return
	}
	_, err = kv.Put(ctx, "validate", []byte("1"))
	step("put in "+bucket, err)
	e, err := kv.Get(ctx, "validate")
	step("get from "+bucket, err)
	if err == nil {
		_, err = kv.Update(ctx, "validate", []byte("2"), e.Revision())
		step("update in "+bucket, err)
	}
	keys, err := kv.ListKeys(ctx)
	step("list "+bucket, err)
	if err == nil {
		for range keys.Keys() {
		}
	}
	w, err := kv.WatchAll(ctx)
	step("watch "+bucket, err)
	if err == nil {
		select {
		case <-w.Updates():
		case <-time.After(time.Second):
		}
		_ = w.Stop()
	}
	step("delete in "+bucket, kv.Delete(ctx, "validate"))
}
