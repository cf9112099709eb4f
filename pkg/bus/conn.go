package bus

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Bus is one service's connection to NATS JetStream plus the names of the
// deployment it belongs to.
type Bus struct {
	Conn  *nats.Conn
	JS    jetstream.JetStream
	Names Names
	// inProcess: the connection is to a server in this process
	// (ConnectInProcess), which is a single server that lives and dies
	// with it.
	inProcess bool
}

// Security is what a service needs to join a NATS deployment that
// authenticates its clients or uses TLS with a private certificate
// authority. Empty fields are not used; a user and password or a token go in
// the URL (nats://user:pass@host).
type Security struct {
	// Creds is a NATS credentials file (a user JWT and its nkey seed), for servers with decentralised authentication.
	Creds string `envconfig:"NATS_CREDS"`
	// CA is a PEM file of the certificate authorities that sign the NATS servers' TLS certificates (default: the system's).
	CA string `envconfig:"NATS_CA"`
	// Cert and Key are a PEM client certificate and its private key, for servers that require TLS client authentication.
	Cert string `envconfig:"NATS_CERT"`
	// Cert and Key are a PEM client certificate and its private key, for servers that require TLS client authentication.
	Key string `envconfig:"NATS_KEY"`
}

// Check reports a configuration mistake in one line naming the variable: a
// file that cannot be read, or a certificate without its key.
func (s Security) Check() error {
	if (s.Cert == "") != (s.Key == "") {
		return errors.New("GRASP_NATS_CERT and GRASP_NATS_KEY go together: set both or neither")
	}
	for _, f := range []struct{ name, path string }{
		{"GRASP_NATS_CREDS", s.Creds}, {"GRASP_NATS_CA", s.CA}, {"GRASP_NATS_CERT", s.Cert}, {"GRASP_NATS_KEY", s.Key},
	} {
		if f.path == "" {
			continue
		}
		fh, err := os.Open(f.path)
		if err != nil {
			return fmt.Errorf("%s=%s: %w", f.name, f.path, err)
		}
		fh.Close()
	}
	return nil
}

// Options are the nats.go options that apply s, for a caller that dials
// NATS itself (graspctl). Call Check first.
func (s Security) Options() []nats.Option {
	var opts []nats.Option
	if s.Creds != "" {
		opts = append(opts, nats.UserCredentials(s.Creds))
	}
	if s.CA != "" {
		opts = append(opts, nats.RootCAs(s.CA))
	}
	if s.Cert != "" {
		opts = append(opts, nats.ClientCert(s.Cert, s.Key))
	}
	return opts
}

// Connect dials a NATS server by URL. name identifies the service in the
// server's connection list; sec (often empty) says how to authenticate and
// which certificate authorities to trust. It fails fast (no retry on the
// first connect) so a wrong URL is reported at start, and reconnects forever
// afterwards.
func Connect(ctx context.Context, url, name string, names Names, sec Security) (*Bus, error) {
	if err := sec.Check(); err != nil {
		return nil, err
	}
	nc, err := nats.Connect(url, append([]nats.Option{
		nats.Name(name),
		nats.Timeout(5 * time.Second),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(time.Second),
	}, sec.Options()...)...)
	if err != nil {
		return nil, fmt.Errorf("connect to nats %s: %w", RedactURL(url), err)
	}
	return wrap(nc, names)
}

// RedactURL hides the passwords of a NATS URL list ("nats://user:pw@host,
// …") for logs and errors: the Kubernetes manifests put each service's
// password in GRASP_NATS_URL.
func RedactURL(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		u, err := url.Parse(strings.TrimSpace(p))
		if err != nil {
			// Unparsable: keep the scheme and host, drop what may be a
			// user and password.
			if at := strings.LastIndex(p, "@"); at >= 0 {
				if sch := strings.Index(p, "://"); sch >= 0 && sch < at {
					parts[i] = p[:sch+3] + "xxxxx" + p[at:]
				} else {
					parts[i] = "xxxxx" + p[at:]
				}
			}
			continue
		}
		if u.User != nil {
			if _, has := u.User.Password(); has {
				u.User = url.UserPassword(u.User.Username(), "xxxxx")
			} else {
				// A lone user part may be a token.
				u.User = url.User("xxxxx")
			}
			parts[i] = u.String()
		}
	}
	return strings.Join(parts, ",")
}

// ConnectInProcess connects to an embedded server without TCP.
func ConnectInProcess(s *server.Server, name string, names Names) (*Bus, error) {
	nc, err := nats.Connect("", nats.InProcessServer(s), nats.Name(name), nats.MaxReconnects(-1))
	if err != nil {
		return nil, fmt.Errorf("connect to embedded nats: %w", err)
	}
	b, err := wrap(nc, names)
	if err != nil {
		return nil, err
	}
	b.inProcess = true
	return b, nil
}

func wrap(nc *nats.Conn, names Names) (*Bus, error) {
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		nc.Close()
		return nil, fmt.Errorf("jetstream: %w", err)
	}
	return &Bus{Conn: nc, JS: js, Names: names}, nil
}

// Close drains nothing and closes the connection.
func (b *Bus) Close() { b.Conn.Close() }
