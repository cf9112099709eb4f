package syncstatus

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/grasp-sync/grasp-sync/pkg/bus"
)

// NATSCollector exposes JetStream health as Prometheus metrics: messages and
// bytes per stream, and per durable consumer the messages not yet delivered
// (pipeline lag), delivered but unacknowledged, and redelivered. It asks the
// server at scrape time, so the numbers are never stale and nothing runs
// between scrapes. Label values are stream and consumer names, which the
// services choose (a few per shard): cardinality stays bounded.
type NATSCollector struct {
	js      jetstream.JetStream
	streams []string
	timeout time.Duration

	up, msgs, bytes, pending, ackPending, redelivered *prometheus.Desc
}

// NewNATSCollector watches the grasp streams named by names.
func NewNATSCollector(js jetstream.JetStream, names bus.Names) *NATSCollector {
	cl := []string{"stream", "consumer"}
	return &NATSCollector{
		js: js,
		streams: []string{names.FetchCmdStream(), names.FetchReportStream(), names.EventsStream(),
			names.ParkedStream(), names.ParkedWakeStream()},
		timeout:     2 * time.Second,
		up:          prometheus.NewDesc("grasp_nats_up", "1 when the last scrape could read JetStream stream info, else 0.", nil, nil),
		msgs:        prometheus.NewDesc("grasp_nats_stream_messages", "Messages stored in a grasp JetStream stream.", []string{"stream"}, nil),
		bytes:       prometheus.NewDesc("grasp_nats_stream_bytes", "Bytes stored in a grasp JetStream stream.", []string{"stream"}, nil),
		pending:     prometheus.NewDesc("grasp_nats_consumer_pending_messages", "Messages of the stream not yet delivered to the consumer: the pipeline lag.", cl, nil),
		ackPending:  prometheus.NewDesc("grasp_nats_consumer_ack_pending", "Messages delivered to the consumer and not yet acknowledged.", cl, nil),
		redelivered: prometheus.NewDesc("grasp_nats_consumer_redelivered", "Messages currently redelivered to the consumer (handler errors such as store errors, or ack timeouts).", cl, nil),
	}
}

// Describe implements prometheus.Collector.
func (c *NATSCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.up, c.msgs, c.bytes, c.pending, c.ackPending, c.redelivered} {
		ch <- d
	}
}

// Collect implements prometheus.Collector. A stream that does not exist
// (its service not set up yet) is skipped; any other failure sets up to 0.
func (c *NATSCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
	defer cancel()
	up := 1.0
	for _, name := range c.streams {
		st, err := c.js.Stream(ctx, name)
		if err != nil {
			if !errors.Is(err, jetstream.ErrStreamNotFound) {
				up = 0
			}
			continue
		}
		info, err := st.Info(ctx)
		if err != nil {
			up = 0
			continue
		}
		ch <- prometheus.MustNewConstMetric(c.msgs, prometheus.GaugeValue, float64(info.State.Msgs), name)
		ch <- prometheus.MustNewConstMetric(c.bytes, prometheus.GaugeValue, float64(info.State.Bytes), name)
		lister := st.ListConsumers(ctx)
		for ci := range lister.Info() {
			if ci.Config.Durable == "" {
				continue // ephemeral (graspctl tap, ordered readers): not pipeline
			}
			ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(ci.NumPending), name, ci.Name)
			ch <- prometheus.MustNewConstMetric(c.ackPending, prometheus.GaugeValue, float64(ci.NumAckPending), name, ci.Name)
			ch <- prometheus.MustNewConstMetric(c.redelivered, prometheus.GaugeValue, float64(ci.NumRedelivered), name, ci.Name)
		}
		if lister.Err() != nil {
			up = 0
		}
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, up)
}
