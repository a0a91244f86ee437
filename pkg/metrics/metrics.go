// Package metrics exports gzramd's statistics to Prometheus. Hot paths
// (NBD requests, batches) only add to atomic counters; everything else is
// read as a snapshot when /metrics is scraped.
package metrics

import (
	"log/slog"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// NewRegistry returns a registry holding cs plus the Go runtime and
// process collectors (resident memory, threads, GC), which matter for a
// daemon whose own memory must stay bounded.
func NewRegistry(cs ...prometheus.Collector) (*prometheus.Registry, error) {
	reg := prometheus.NewRegistry()
	cs = append(cs, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return reg, nil
}

// Handler serves reg in the Prometheus text format; scrape errors go to log.
func Handler(reg *prometheus.Registry, log *slog.Logger) http.Handler {
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{
		ErrorLog:      slogAdapter{log},
		ErrorHandling: promhttp.ContinueOnError,
		Registry:      reg, // promhttp_metric_handler_errors_total
	})
}

type slogAdapter struct{ log *slog.Logger }

func (a slogAdapter) Println(v ...any) {
	if a.log != nil {
		a.log.Warn("metrics: scrape error", "err", v)
	}
}
