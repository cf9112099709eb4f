package bus

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Creating or updating a stream in a JetStream cluster is a request to the
// meta leader, which answers once the stream's own group has formed. When
// several services run Setup at the same moment, or a node is restarting, that
// answer can be lost or late (the stream is created, the caller times out), or
// the meta group can be briefly without a leader. Every such failure is
// transient: the call is idempotent, so it is retried with backoff, each try
// bounded, until it succeeds or the caller's context ends. An update of a
// stream that now exists with the wanted configuration answers at once, which
// is how a retry "finds" the stream a lost answer created.
const (
	// ensureAttemptTimeout bounds one try, so a lost answer costs this long
	// rather than the caller's whole deadline.
	ensureAttemptTimeout = 3 * time.Second
	// ensureBackoffMin and ensureBackoffMax shape the wait between tries.
	ensureBackoffMin = 100 * time.Millisecond
	ensureBackoffMax = 2 * time.Second
)

// EnsureStream creates or updates a stream, retrying transient failures (see
// above) until ctx ends. A configuration the server refuses is returned at
// once.
func EnsureStream(ctx context.Context, js jetstream.JetStream, cfg jetstream.StreamConfig) (jetstream.Stream, error) {
	var s jetstream.Stream
	err := retryTransient(ctx, func(ctx context.Context) error {
		var err error
		s, err = js.CreateOrUpdateStream(ctx, cfg)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("create stream %s: %w", cfg.Name, err)
	}
	return s, nil
}

// EnsureKeyValue creates or updates a KV bucket, retrying transient failures
// like EnsureStream.
func EnsureKeyValue(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	var kv jetstream.KeyValue
	err := retryTransient(ctx, func(ctx context.Context) error {
		var err error
		kv, err = js.CreateOrUpdateKeyValue(ctx, cfg)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("create kv bucket %s: %w", cfg.Bucket, err)
	}
	return kv, nil
}

// EnsureConsumer creates or updates a durable consumer, retrying transient
// failures like EnsureStream (replicas of one service create the same
// durable at once). The server never changes an existing consumer's storage
// (MemoryStorage): a durable created before that setting changed keeps the
// storage it has, so an upgraded service attaches to it instead of failing
// (docs/decisions/0064-cluster-consumer-state-in-memory.md).
func EnsureConsumer(ctx context.Context, js jetstream.JetStream, stream string, cfg jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	var c jetstream.Consumer
	err := retryTransient(ctx, func(ctx context.Context) error {
		var err error
		c, err = js.CreateOrUpdateConsumer(ctx, stream, cfg)
		if storageNotUpdatable(err) {
			keep := cfg
			keep.MemoryStorage = !cfg.MemoryStorage
			c, err = js.CreateOrUpdateConsumer(ctx, stream, keep)
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("consumer %s on %s: %w", cfg.Durable, stream, err)
	}
	return c, nil
}

// WorkQueueStateInMemory is whether a durable consumer of a work-queue
// stream with this many replicas keeps its state (delivered and acked
// sequences) in memory rather than in files: yes when replicated. Every
// replica of such a consumer writes its state to a file after each change,
// up to 10 times a second, which cost a 3-node cluster a fifth of its CPU
// (docs/decisions/0064-cluster-consumer-state-in-memory.md); replicated, the
// state survives the loss of a node without the files, and what a work queue
// has acknowledged is gone from its stream, so a consumer that lost its
// state with every node at once only delivers the unacknowledged messages
// again. A single node keeps files: there the state has no other copy.
func WorkQueueStateInMemory(replicas int) bool { return replicas > 1 }

// storageNotUpdatable reports the server refusing to change an existing
// consumer's storage type.
func storageNotUpdatable(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeConsumerCreate &&
		strings.Contains(apiErr.Description, "storage type can not be updated")
}

// retryTransient runs op, each try under its own timeout within ctx, until it
// succeeds, fails permanently, or ctx ends. The error returned when ctx ends
// carries the last try's error, which says what was wrong.
func retryTransient(ctx context.Context, op func(context.Context) error) error {
	wait := ensureBackoffMin
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, ensureAttemptTimeout)
		err := op(actx)
		cancel()
		if err == nil {
			return nil
		}
		if !Transient(err) {
			return err
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%w after %d attempts, last: %w", ctx.Err(), attempt, err)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w after %d attempts, last: %w", ctx.Err(), attempt, err)
		case <-t.C:
		}
		wait = min(2*wait, ensureBackoffMax)
	}
}

// Transient reports whether a JetStream request that failed (a stream or
// bucket create/update, a publish) may succeed when repeated: timeouts,
// missing responders (a server restarting, a stream being recreated), a
// cluster without a leader, and the race where a concurrent caller created
// the stream between our update and our create. Requests the server rejects
// as bad (4xx, a payload over the limit) and the client's own validation
// errors are permanent.
func Transient(err error) bool {
	switch {
	case errors.Is(err, context.Canceled):
		return false
	case errors.Is(err, context.DeadlineExceeded),
		errors.Is(err, nats.ErrTimeout),
		errors.Is(err, nats.ErrNoResponders),
		errors.Is(err, jetstream.ErrNoStreamResponse),
		errors.Is(err, jetstream.ErrJetStreamNotEnabled),
		errors.Is(err, jetstream.ErrStreamNameAlreadyInUse),
		errors.Is(err, nats.ErrConnectionReconnecting),
		errors.Is(err, nats.ErrDisconnected):
		return true
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		// 503: JetStream or the cluster temporarily unavailable; 500:
		// e.g. a stream leader lost mid-request. 4xx: our request is wrong.
		return apiErr.Code >= 500
	}
	return false
}
