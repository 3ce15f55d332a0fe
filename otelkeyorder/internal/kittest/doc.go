// Package kittest tests the observability kit for otelkeyorder's metrics
// as exported to Prometheus: otelkeyorder/kit/dashboard.json (a Grafana
// dashboard) and otelkeyorder/kit/alerts.yml (Prometheus alerting rules),
// with the reasoning for each threshold in docs/observability.md.
//
// The package has no code. Its test runs a publisher and a subscriber on
// the in-memory backend through otelkeyorder and OpenTelemetry's
// Prometheus exporter, and checks that every metric and label the
// dashboard and the rules name is one the exporter serves, with the unit
// its name says (a _seconds suffix from the instrument's unit "s"), and
// that rate() and increase() are applied to counters only. The metric
// names a Prometheus user sees are the exporter's translation of the
// OpenTelemetry names (dots to underscores, _total on counters, units as
// suffixes); the test uses the real exporter so that a translation change
// fails here rather than on a dashboard.
package kittest
