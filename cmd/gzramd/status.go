// `gzramd status` and the /status report.

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/gzramd/gzramd/pkg/serving"
)

func newStatusCmd() *cobra.Command {
	var addr string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the running daemon's device, like zramctl",
		Long: `Show the running daemon's device in a zramctl-like table, read from its
HTTP endpoint (the --metrics address of gzramd serve, which also serves
/status). DATA is the uncompressed size of the stored pages, COMPR their
compressed size, TOTAL the memory the store holds, RATIO is DATA/TOTAL.
SELF is gzramd's own memory: its processes' proportional sets (each page
they share counted once) less TOTAL; the GPU driver's memory in the
kernel is not in it. SAVED is what the device saves net of both: DATA and
the same-filled pages, less TOTAL and SELF.`,
		Example: `  gzramd status
  gzramd status --metrics 127.0.0.1:9829 --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := bindEnv(cmd.Flags()); err != nil {
				return err
			}
			if _, _, err := net.SplitHostPort(addr); err != nil {
				return usageErr(fmt.Errorf("invalid --metrics %q: want HOST:PORT, e.g. 127.0.0.1:9829", addr))
			}
			ctx, cancel := context.WithTimeout(cmd.Context(), 5*time.Second)
			defer cancel()
			rep, raw, err := fetchStatus(ctx, addr)
			if err != nil {
				return err
			}
			if asJSON {
				_, err := cmd.OutOrStdout().Write(raw)
				return err
			}
			return printStatus(cmd.OutOrStdout(), rep)
		},
	}
	cmd.Flags().StringVar(&addr, "metrics", "127.0.0.1:9829", "the daemon's --metrics address")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the daemon's JSON report as it is")
	return cmd
}

func fetchStatus(ctx context.Context, addr string) (*serving.Status, []byte, error) {
	url := "http://" + addr + "/status"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, nil, fmt.Errorf("no gzramd answering at %s (is it running, with --metrics %s?): %w", addr, addr, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, nil, fmt.Errorf("reading %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, nil, fmt.Errorf("%s: %s", url, resp.Status)
	}
	var rep serving.Status
	if err := json.Unmarshal(raw, &rep); err != nil {
		return nil, nil, fmt.Errorf("%s is not a gzramd status report: %w", url, err)
	}
	return &rep, raw, nil
}

func printStatus(w io.Writer, r *serving.Status) error {
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "DEVICE\tEXPORT\tALGORITHM\tDISKSIZE\tDATA\tCOMPR\tTOTAL\tRATIO\tSELF\tSAVED\tBACKEND\tGPU\tSWAP\t")
	dev := r.Device
	if dev == "" && len(r.SwapDevices) > 0 {
		dev = r.SwapDevices[0]
	}
	if dev == "" {
		dev = "-"
	}
	gpu := r.GPU
	if gpu == "" {
		gpu = "-"
	}
	swap := "no"
	if len(r.SwapDevices) > 0 {
		swap = "yes"
	}
	self, saved := "-", "-"
	if len(r.SelfMemory) > 0 {
		self, saved = humanBytes(r.OwnMemoryBytes), signedBytes(r.NetSavedBytes)
	}
	fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n",
		dev, r.Export, r.Algorithm, humanBytes(r.DiskSize), humanBytes(r.OrigDataBytes),
		humanBytes(r.ComprDataBytes), humanBytes(r.MemUsedBytes), strconv.FormatFloat(r.Ratio(), 'f', 2, 64),
		self, saved, r.Backend, gpu, swap)
	if err := tw.Flush(); err != nil {
		return err
	}
	// Who serves, and whether it ever had to be replaced.
	serving := fmt.Sprintf("serving process %d", r.PID)
	if r.SupervisorPID != 0 {
		serving += fmt.Sprintf(", supervisor %d", r.SupervisorPID)
	} else {
		serving += ", no supervisor (--supervise=false): a crash loses what is swapped here"
	}
	serving += fmt.Sprintf("; takeovers %d", r.Takeovers)
	if r.Takeovers > 0 && r.LastTakeoverPause > 0 {
		serving += fmt.Sprintf(" (the last paused the device %s)", time.Duration(r.LastTakeoverPause*float64(time.Second)).Round(time.Millisecond))
	}
	if r.LostPages > 0 {
		serving += fmt.Sprintf("; %d pages lost in a takeover read as I/O errors", r.LostPages)
	}
	if r.Transport != "" { // a daemon before --transport says nothing
		serving += "; transport " + r.Transport
	}
	if _, err := fmt.Fprintln(w, serving); err != nil {
		return err
	}
	if r.PackedObjects > 0 {
		if _, err := fmt.Fprintf(w, "%d of %d stored pages in %d objects of several pages (--object-pages, and the dense tier's)\n", r.PackedPages, r.StoredPages, r.PackedObjects); err != nil {
			return err
		}
	}
	if _, err := fmt.Fprintln(w, denseLine(r)); err != nil {
		return err
	}
	if len(r.SelfMemory) > 0 {
		// What each process holds, its share of what they share.
		var parts []string
		for _, p := range r.SelfMemory {
			parts = append(parts, fmt.Sprintf("%s %s", p.Role, humanBytes(p.PSS)))
		}
		if _, err := fmt.Fprintf(w, "gzramd's processes (proportional sets, the store included): %s\n", strings.Join(parts, ", ")); err != nil {
			return err
		}
	}
	return printConnections(w, r.NBDConnections)
}

// printConnections prints who is connected: a line for the count, then
// one for each connection, oldest first.
func printConnections(w io.Writer, conns []serving.ConnectionStatus) error {
	kernel := 0
	for _, c := range conns {
		if c.Kernel {
			kernel++
		}
	}
	if _, err := fmt.Fprintf(w, "NBD connections: %d (%d the kernel device's, %d other clients)\n", len(conns), kernel, len(conns)-kernel); err != nil {
		return err
	}
	if len(conns) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  TRANSPORT\tREMOTE\tCLIENT\tKERNEL\tOPEN")
	for _, c := range conns {
		client := c.Client
		switch {
		case client != "":
			client = "TLS " + client
		case c.TLS:
			client = "TLS (handshake)"
		case c.PeerUID != nil:
			client = fmt.Sprintf("pid %d uid %d", c.PeerPID, *c.PeerUID)
		default:
			client = "-"
		}
		kernel := "no"
		if c.Kernel {
			kernel = "yes"
		}
		if c.Adopted {
			kernel += " (handed over)"
		}
		open := time.Duration(c.OpenSeconds * float64(time.Second)).Round(time.Second)
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s since %s\n", c.Transport, c.Remote, client, kernel, open, c.Since.Local().Format(time.DateTime))
	}
	return tw.Flush()
}

// signedBytes is humanBytes with a minus sign below zero.
func signedBytes(n int64) string {
	if n < 0 {
		return "-" + humanBytes(-n)
	}
	return humanBytes(n)
}

// humanBytes formats like zramctl: 1024-based units with one decimal.
func humanBytes(n int64) string {
	const units = "KMGTPE"
	if n < 1024 {
		return strconv.FormatInt(n, 10) + "B"
	}
	v := float64(n)
	i := -1
	for v >= 1024 && i < len(units)-1 {
		v /= 1024
		i++
	}
	s := strconv.FormatFloat(v, 'f', 1, 64)
	if len(s) > 2 && s[len(s)-2:] == ".0" {
		s = s[:len(s)-2]
	}
	return s + string(units[i])
}

// denseLine says what the dense tier holds and has done, as zram's mm_stat
// and bd_stat would.
func denseLine(r *serving.Status) string {
	if r.DenseAfter == 0 && r.DensePages == 0 {
		return "dense tier: off (--dense-after 0)"
	}
	var s string
	if r.DensePages == 0 {
		s = fmt.Sprintf("dense tier: none of %d stored pages yet", r.StoredPages)
	} else {
		s = fmt.Sprintf("dense tier: %d of %d stored pages, in %s", r.DensePages, r.StoredPages, formatSize(r.DenseBytes))
	}
	if r.DenseAfter > 0 {
		s += fmt.Sprintf(" (groups idle for %s are recompressed)", time.Duration(r.DenseAfter*float64(time.Second)))
	} else {
		s += " (recompression off: --dense-after 0)"
	}
	if r.DenseGroups > 0 {
		s += fmt.Sprintf("; recompressed %d groups from %s to %s in %s of CPU", r.DenseGroups,
			formatSize(int64(r.DenseBytesIn)), formatSize(int64(r.DenseBytesOut)), time.Duration(r.DenseBusy*float64(time.Second)).Round(time.Millisecond))
		if r.DenseOnGPU > 0 {
			s += fmt.Sprintf(" (%d of them on the GPU)", r.DenseOnGPU)
		}
	}
	return s
}
