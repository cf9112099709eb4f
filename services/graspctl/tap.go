// Package graspctl is the operator's command line: it reads what the
// services say to each other on NATS and what they keep in KV.
package graspctl

import (
	"context"
	"fmt"
	"io"
	"sort"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	graspv1 "github.com/grasp-sync/grasp-sync/proto/grasp/v1"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
	"github.com/grasp-sync/grasp-sync/pkg/nip34"
)

// Render turns one message into a line: control messages (Grasp-Type
// header) as protobuf JSON, anything else (nostr events) as it is.
func Render(subject string, header nats.Header, data []byte) string {
	typ := header.Get(bus.HeaderType)
	if typ == "" {
		return fmt.Sprintf("%s %s", subject, data)
	}
	mt, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(typ))
	if err != nil {
		return fmt.Sprintf("%s [%s: unknown type] %x", subject, typ, data)
	}
	m := mt.New().Interface()
	if err := proto.Unmarshal(data, m); err != nil {
		return fmt.Sprintf("%s [%s: undecodable: %v]", subject, typ, err)
	}
	js, _ := protojson.MarshalOptions{}.Marshal(m)
	return fmt.Sprintf("%s %s %s", subject, typ, js)
}

// Tap prints every message on subject (NATS wildcards allowed) until ctx is
// done.
func Tap(ctx context.Context, nc *nats.Conn, subject string, out io.Writer) error {
	ch := make(chan *nats.Msg, 1024)
	sub, err := nc.ChanSubscribe(subject, ch)
	if err != nil {
		return fmt.Errorf("subscribe %s: %w", subject, err)
	}
	defer sub.Unsubscribe()
	for {
		select {
		case <-ctx.Done():
			return nil
		case m := <-ch:
			fmt.Fprintln(out, Render(m.Subject, m.Header, m.Data))
		}
	}
}

// Repos prints the RepoSyncIndex: one line per repository.
func Repos(ctx context.Context, b *bus.Bus, out io.Writer) error {
	kv, err := b.JS.KeyValue(ctx, b.Names.RepoIndexBucket())
	if err != nil {
		return fmt.Errorf("open %s: %w", b.Names.RepoIndexBucket(), err)
	}
	lister, err := kv.ListKeys(ctx)
	if err != nil {
		return fmt.Errorf("list %s: %w", b.Names.RepoIndexBucket(), err)
	}
	var keys []string
	for k := range lister.Keys() {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		e, err := kv.Get(ctx, k)
		if err != nil {
			continue
		}
		var needs graspv1.RepoSyncNeeds
		if err := proto.Unmarshal(e.Value(), &needs); err != nil {
			fmt.Fprintf(out, "%s undecodable: %v\n", k, err)
			continue
		}
		ref := needs.GetRepoRef()
		if r, ok := nip34.ParseKey(k); ok && ref == "" {
			ref = r.String()
		}
		fmt.Fprintf(out, "%s relays=%v roots=%d\n", ref, needs.GetRelays(), len(needs.GetRootEventIds()))
	}
	return nil
}
