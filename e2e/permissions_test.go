package e2e

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/grasp-sync/grasp-sync/pkg/testkit"

	"github.com/grasp-sync/grasp-sync/pkg/testkit/testrelay"
)

// TestShippedNATSPermissions runs the deployment as Kubernetes does: the
// service binaries as separate processes, each connected as its own NATS
// user of the generated k8s/base/nats/auth.conf, on nats-server started
// with the manifests' configuration, over PostgreSQL. A repository is
// synced end to end from two remote relays, then graspctl's commands run as
// the graspctl user. Any refusal in any log (nats-server's or a service's)
// fails the test (Deployment.stopAll): the permissions are generated from
// the code, and this is where the generator's blind spots show.
func TestShippedNATSPermissions(t *testing.T) {
	pg := postgresURL(t)
	d := StartDeployment(t, DeploymentOptions{PostgresURL: pg, Auth: true})
	owner, ident, plain, neg := syncUnderShippedPermissions(t, d)

	if leaks := d.LeakedPasswords(); len(leaks) > 0 {
		t.Errorf("NATS passwords in the logs:\n%s", strings.Join(leaks, "\n"))
	}

	t.Run("relay status page", func(t *testing.T) {
		// The relay reads the sync state for its status page as the relay
		// user, with read-only rights on the buckets and streams.
		page := relayStatusPage(t, d)
		if strings.Contains(page, `id="error"`) || !strings.Contains(page, plain.URL) {
			t.Errorf("the relay's status page does not show the sync state:\n%s", page)
		}
	})

	ctl, err := d.NATSUserURL("graspctl")
	if err != nil {
		t.Fatal(err)
	}
	coord := "30617:" + owner.PubKey + ":" + ident
	for _, c := range []struct {
		name string
		args []string
		// must appear in the output: the command really read the cluster.
		want string
	}{
		{"status", []string{"status", "--metrics", "http://" + d.Ingesters[0].MetricsAddr + "/metrics"}, plain.URL},
		{"status --json", []string{"status", "--json", "--metrics", ""}, plain.URL},
		{"repos", []string{"repos"}, ident},
		{"explain", []string{"explain", "--relay-url", d.RelayURL(), "--service-url", d.PublicURL(), coord}, neg.URL},
	} {
		t.Run("graspctl "+c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, d.Bin("graspctl"), append([]string{"--nats", ctl}, c.args...)...)
			cmd.Env = processEnv(nil, nil)
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Run(); err != nil {
				t.Fatalf("graspctl %s as the graspctl user: %v\nstdout:\n%s\nstderr:\n%s", c.name, err, stdout.String(), stderr.String())
			}
			checkCtlOutput(t, c.name, stdout.String(), stderr.String(), c.want)
		})
	}
	t.Run("graspctl tap", func(t *testing.T) {
		// tap follows traffic until interrupted: replay what the streams
		// hold, then stop it as an operator would (Ctrl-C).
		cmd := exec.Command(d.Bin("graspctl"), "--nats", ctl, "tap", "--from-start")
		cmd.Env = processEnv(nil, nil)
		var stdout, stderr testkit.LogBuffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		// The fetch reports of the sync above are retained (limits
		// stream): the replay prints them. Wait for one, at most 20 s.
		deadline := time.After(20 * time.Second)
	wait:
		for !strings.Contains(stdout.String(), "fetch.report") {
			select {
			case err := <-exited:
				t.Fatalf("graspctl tap exited on its own: %v\nstderr:\n%s", err, stderr.String())
			case <-deadline:
				break wait
			case <-time.After(100 * time.Millisecond):
			}
		}
		_ = cmd.Process.Signal(syscall.SIGINT)
		select {
		case err := <-exited:
			if err != nil {
				t.Fatalf("graspctl tap as the graspctl user: %v\nstderr:\n%s", err, stderr.String())
			}
		case <-time.After(20 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
			t.Fatal("graspctl tap did not stop 20 s after SIGINT")
		}
		if e := stderr.String(); e != "" {
			t.Logf("graspctl tap warned:\n%s", e)
		}
		checkCtlOutput(t, "tap", stdout.String(), stderr.String(), "fetch.report")
	})
}

// TestShippedNATSPermissionsCluster is the production overlay's shape under
// the shipped permissions: a 3-node NATS cluster (R3 streams and buckets),
// every node on the manifests' configuration with the overlay's cluster
// block (natsauth.go), 2 fetchers and 2 ingesters, each service its own
// NATS user. A repository syncs end to end; any refusal in any log fails
// the test (Deployment.stopAll).
func TestShippedNATSPermissionsCluster(t *testing.T) {
	long(t)
	pg := postgresURL(t)
	d := StartDeployment(t, DeploymentOptions{PostgresURL: pg, Auth: true, NATSNodes: 3, Fetchers: 2, Ingesters: 2})
	syncUnderShippedPermissions(t, d)
	if denials := d.PermissionDenials(); len(denials) > 0 {
		t.Errorf("NATS refused %d operations on the cluster:\n%s", len(denials), strings.Join(firstN(denials, 20), "\n"))
	}
}

// syncUnderShippedPermissions syncs one repository's issues, comments and
// patches from two remote relays (one NIP-77) into d and fails unless all
// arrive within a minute.
func syncUnderShippedPermissions(t *testing.T, d *Deployment) (owner testkit.Key, ident string, plain, neg *testrelay.Relay) {
	t.Helper()
	plain = testrelay.Start(t, testrelay.Options{})
	neg = testrelay.Start(t, testrelay.Options{Negentropy: true})
	owner, contributor := testkit.NewKey(), testkit.NewKey()
	ident = "shipped-acl"
	repo := testkit.RepoRef(owner.PubKey, ident)
	var want []*nostrEvent
	for _, r := range []*testrelay.Relay{plain, neg} {
		issue := contributor.Issue(repo, "seen on "+r.URL)
		comment := owner.Comment(issue, issue, "looking")
		patch := contributor.Patch(repo)
		r.Add(t, issue, comment, patch)
		want = append(want, issue, comment, patch)
	}
	ann := ourAnnouncement(owner, d, ident, []string{plain.URL, neg.URL}, nil)
	began := time.Now()
	announce(t, d, ann)
	mustArrive(t, d, 60*time.Second, want...)
	t.Logf("synced %d events from 2 remote relays under the shipped permissions in %s", len(want), time.Since(began).Round(time.Millisecond))
	return owner, ident, plain, neg
}

// checkCtlOutput fails when a graspctl command's output lacks want or says
// NATS refused something.
func checkCtlOutput(t *testing.T, name, stdout, stderr, want string) {
	t.Helper()
	if !strings.Contains(stdout, want) {
		t.Errorf("graspctl %s printed no %q:\nstdout:\n%s\nstderr:\n%s", name, want, stdout, stderr)
	}
	for _, out := range []string{stdout, stderr} {
		for _, line := range strings.Split(out, "\n") {
			if permissionDenial.MatchString(line) {
				t.Errorf("graspctl %s: %s", name, line)
			}
		}
	}
}

// relayStatusPage fetches the own relay's status page as a browser does.
func relayStatusPage(t *testing.T, d *Deployment) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+strings.TrimPrefix(d.RelayURL(), "ws://")+"/", nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "text/html")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("relay status page: %v", err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("relay status page: %s %v\n%s", resp.Status, err, body)
	}
	return string(body)
}
