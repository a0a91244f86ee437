// The command that reads a running daemon's status, for its log.

package serving

import (
	"log/slog"
	"net"
)

// defaultMetrics is the address `gzramd status` reads unless told another
// (cmd/gzramd/status.go), which is also --metrics's default.
const defaultMetrics = "127.0.0.1:9829"

// statusAttr names the command that reads this daemon's status where it
// is not `gzramd status` alone: a daemon on another --metrics is
// otherwise not found. It is empty, and the log leaves it out, for the
// default address, without --metrics, and for port 0, which the
// "serving metrics" line names once it is chosen.
func statusAttr(metrics string) slog.Attr {
	host, port, err := net.SplitHostPort(metrics)
	if err != nil || port == "0" {
		return slog.Attr{}
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		// Every address, loopback among them (IPv4 too for "::": Go
		// listens on both).
		host = "127.0.0.1"
	}
	addr := net.JoinHostPort(host, port)
	if addr == defaultMetrics {
		return slog.Attr{}
	}
	return slog.String("status", "gzramd status --metrics "+addr)
}
