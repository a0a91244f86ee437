// The /status report, and the reporter that reads the daemon for it and for the metrics.

package serving

import (
	"encoding/json"
	"net/http"
	"os"
	"time"

	"github.com/gzramd/gzramd/pkg/metrics"
	"github.com/gzramd/gzramd/pkg/swapsafe"
)

// Status is what /status serves and `gzramd status` prints: the
// figures zramctl shows, taken from the same snapshots as /metrics.
type Status struct {
	Version string `json:"version"`
	PID     int    `json:"pid"` // the serving process
	// SupervisorPID is the process that holds the state and restarts the
	// serving process when it dies; 0 without one (--supervise=false).
	SupervisorPID int `json:"supervisor_pid,omitempty"`
	// Takeovers counts serving processes that took the state over from
	// one that died; LastTakeoverPause is how long the kernel
	// device went unserved then (0 if unknown); LostPages are pages a takeover could
	// not trust, which read as I/O errors until rewritten.
	Takeovers         uint64  `json:"takeovers"`
	LastTakeoverPause float64 `json:"last_takeover_pause_seconds,omitempty"`
	LostPages         int64   `json:"lost_pages"`
	Export            string  `json:"export"`
	Socket            string  `json:"socket,omitempty"`
	TCP               string  `json:"tcp,omitempty"`
	Device            string  `json:"device,omitempty"` // /dev/nbdN or /dev/ublkbN gzramd attached itself
	// Transport is how the kernel device is served: "nbd" or "ublk"
	// (--transport); "nbd" too without a kernel device, for the export.
	Transport      string   `json:"transport"`
	SwapDevices    []string `json:"swap_devices"` // active swap backed by this export
	Algorithm      string   `json:"algorithm"`
	Backend        string   `json:"backend"`
	GPU            string   `json:"gpu,omitempty"`
	DiskSize       int64    `json:"disksize_bytes"`
	OrigDataBytes  int64    `json:"orig_data_bytes"`
	ComprDataBytes int64    `json:"compr_data_bytes"`
	MemUsedBytes   int64    `json:"mem_used_bytes"`
	MemLimitBytes  int64    `json:"mem_limit_bytes"`
	SamePages      int64    `json:"same_pages"`
	HugePages      int64    `json:"huge_pages"`
	StoredPages    int64    `json:"stored_pages"`
	PackedPages    int64    `json:"packed_pages"`   // of StoredPages, in objects of several pages
	PackedObjects  int64    `json:"packed_objects"` // those objects
	// The dense tier (--dense-after): its pages (of StoredPages) and their
	// compressed bytes (of ComprDataBytes), the groups recompressed, and
	// the bytes those took before and after.
	DensePages    int64   `json:"dense_pages"`
	DenseBytes    int64   `json:"dense_bytes"`
	DenseGroups   uint64  `json:"dense_recompressed_groups"`
	DenseBytesIn  uint64  `json:"dense_recompressed_bytes_before"`
	DenseBytesOut uint64  `json:"dense_recompressed_bytes_after"`
	DenseBusy     float64 `json:"dense_busy_seconds"`
	DenseOnGPU    uint64  `json:"dense_gpu_groups"`    // of DenseGroups, compressed on the GPU
	DenseAfter    float64 `json:"dense_after_seconds"` // 0: the tier is off
	Connections   int     `json:"connections"`
	// NBDConnections are the NBD connections open, oldest first: who is
	// connected.
	NBDConnections []ConnectionStatus `json:"nbd_connections"`
	UptimeSeconds  float64            `json:"uptime_seconds"`
	// Holdings is what the daemon holds ahead of need (docs/DESIGN.md).
	Holdings []swapsafe.Holding `json:"holdings"`
	// SelfMemory is the memory of gzramd's processes, by role;
	// OwnMemoryBytes their proportional sets summed less the store's
	// memory in use, NetSavedBytes what the device saves net of both
	// (metrics.SelfMemory). Absent when /proc could not be read.
	SelfMemory     []metrics.ProcessMemory `json:"self_memory,omitempty"`
	OwnMemoryBytes int64                   `json:"own_memory_bytes"`
	NetSavedBytes  int64                   `json:"net_saved_bytes"`
}

// ConnectionStatus is one open NBD connection in the /status report.
type ConnectionStatus struct {
	Transport string `json:"transport"` // "unix" or "tcp"
	// Remote is the peer's address; a Unix socket's peers are unnamed,
	// and it names the socket ("unix:PATH").
	Remote string `json:"remote"`
	// Client is the name of a TLS client's certificate ("anonymous"
	// without one), once its TLS handshake is done.
	Client string `json:"client,omitempty"`
	TLS    bool   `json:"tls,omitempty"`
	// PeerPID and PeerUID are a Unix socket peer's (SO_PEERCRED, as it
	// connected); absent over TCP.
	PeerPID int  `json:"peer_pid,omitempty"`
	PeerUID *int `json:"peer_uid,omitempty"`
	// Kernel says it is the kernel device's own connection, which no
	// limit counts or refuses.
	Kernel bool `json:"kernel"`
	// Adopted says the serving process before this one handed it over.
	Adopted bool `json:"adopted,omitempty"`
	// Label is the connection's client label in gzramd_nbd_connections.
	Label string `json:"metrics_client"`
	// Since is when it was accepted (or adopted), and OpenSeconds how
	// long ago that was at the report.
	Since       time.Time `json:"since"`
	OpenSeconds float64   `json:"open_seconds"`
}

// Ratio is orig_data_size / mem_used_total, zramctl's view of what the
// memory buys; 0 when nothing is stored.
func (r *Status) Ratio() float64 {
	if r.MemUsedBytes == 0 {
		return 0
	}
	return float64(r.OrigDataBytes) / float64(r.MemUsedBytes)
}

// reporter answers for the daemon: /status, the metrics that read the
// daemon when scraped, and the holdings logged at start. It owns nothing:
// every figure is the daemon's, read as it is asked for.
type reporter struct{ d *daemon }

// gpuName is the GPU's name, once it is open.
func (rp reporter) gpuName() string {
	_, info, _ := rp.d.accel.current()
	return info.Name
}

// status is the /status report but for the memory of gzramd's processes,
// which serveStatus adds: the metrics read that on their own.
func (rp reporter) status() Status {
	d := rp.d
	st := d.dev.Stats()
	r := Status{
		Version: d.version, PID: os.Getpid(), Export: d.cfg.Export, Socket: d.cfg.Socket, TCP: d.cfg.TCP,
		Transport: d.cfg.Transport,
		Algorithm: d.cfg.Algorithm, Backend: d.accel.name(), GPU: rp.gpuName(),
		DiskSize: int64(d.cfg.Size), OrigDataBytes: st.OrigDataSize, ComprDataBytes: st.ComprDataSize,
		MemUsedBytes: st.MemUsedTotal, MemLimitBytes: st.MemLimit, SamePages: st.SamePages,
		HugePages: st.HugePages, StoredPages: st.StoredPages, PackedPages: st.PackedPages, PackedObjects: st.PackedObjects,
		Connections:   d.tracker.Count(),
		UptimeSeconds: time.Since(d.started).Seconds(), SwapDevices: []string{},
		Holdings: rp.holdings(), Takeovers: d.takeovers, LastTakeoverPause: time.Duration(d.pause.Load()).Seconds(),
		LostPages:  st.LostPages,
		DensePages: st.DensePages, DenseBytes: st.DenseBytes, DenseGroups: st.Dense.Groups,
		DenseBytesIn: st.Dense.BytesIn, DenseBytesOut: st.Dense.BytesOut, DenseBusy: st.Dense.Busy.Seconds(),
		DenseOnGPU: st.Dense.OnGPU,
		DenseAfter: d.cfg.DenseAfter.Seconds(),
	}
	if d.start.Serving {
		r.SupervisorPID = os.Getppid()
	}
	r.NBDConnections = rp.connections(time.Now())
	r.Device = d.kernelPath()
	if swaps, err := d.host.Ours(r.Device, &d.tracker); err == nil {
		for _, s := range swaps {
			r.SwapDevices = append(r.SwapDevices, s.Path)
		}
	}
	return r
}

// connections describes the open NBD connections as of now.
func (rp reporter) connections(now time.Time) []ConnectionStatus {
	d := rp.d
	if d.srv == nil || d.conns == nil {
		return []ConnectionStatus{}
	}
	open := d.srv.Connections()
	out := make([]ConnectionStatus, 0, len(open))
	for _, c := range open {
		cs := ConnectionStatus{
			Transport: c.Transport, Remote: c.Remote, Client: c.Client, TLS: c.TLS,
			PeerPID: c.PeerPID, Kernel: c.Own, Adopted: c.Adopted, Label: d.conns.Label(c),
			Since: c.Since, OpenSeconds: now.Sub(c.Since).Seconds(),
		}
		if c.PeerUID >= 0 {
			uid := c.PeerUID
			cs.PeerUID = &uid
		}
		out = append(out, cs)
	}
	return out
}

// kernelState is what `gzramd status` reports of the kernel's use of the
// export, for the metrics that alert when swap is gone.
func (rp reporter) kernelState() metrics.KernelState {
	d := rp.d
	r := rp.status()
	return metrics.KernelState{
		SwapActive: len(r.SwapDevices) > 0, SwapExpected: d.cfg.Swap,
		Device: d.cfg.Device != "", Attached: rp.attached(r.Device),
	}
}

// serveStatus serves /status.
func (rp reporter) serveStatus(w http.ResponseWriter, _ *http.Request) {
	rep := rp.status()
	if s, err := rp.selfMemory(); err != nil {
		rp.d.log.Warn("status: reading gzramd's own memory", "err", err)
	} else {
		rep.SelfMemory, rep.OwnMemoryBytes, rep.NetSavedBytes = s.Processes, s.Own(), s.NetSaved()
	}
	w.Header().Set("Content-Type", "application/json")
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(rep)
}

// attached reports whether the kernel device at path is served: an NBD
// device with a server, or the ublk device while its queues serve.
func (rp reporter) attached(path string) bool {
	if u := rp.d.ublk.current(); u != nil {
		select {
		case <-u.stopped:
			return false
		default:
			return true
		}
	}
	return path != "" && rp.d.host.NBDPID(path) != 0
}
