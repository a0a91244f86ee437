// gzramd's own processes and their memory, for /status and the metrics.

package serving

import (
	"os"

	"github.com/gzramd/gzramd/internal/procmem"
	"github.com/gzramd/gzramd/pkg/codec"
	"github.com/gzramd/gzramd/pkg/metrics"
	"github.com/gzramd/gzramd/pkg/supervise"
)

// selfMemory reads the memory of this serving process, its supervisor and
// the supervisor's standby, with the device's figures the net saving is
// made of.
func (rp reporter) selfMemory() (metrics.SelfMemory, error) {
	d := rp.d
	st := d.dev.Stats()
	s := metrics.SelfMemory{Saved: st.OrigDataSize + st.SamePages*codec.PageSize, MemUsed: st.MemUsedTotal}
	for _, p := range selfProcesses(d.start) {
		u, err := procmem.Read(p.PID)
		if err != nil {
			if p.Role == "serving" {
				return s, err
			}
			continue // it ended since it was found
		}
		p.RSS, p.PSS, p.Anon, p.Locked, p.Pinned = u.RSS, u.PSS, u.Anon, u.Locked, u.Pinned
		s.Processes = append(s.Processes, p)
	}
	return s, nil
}

// selfProcesses is gzramd's processes for this export: this serving
// process and, under a supervisor that is still its parent, the
// supervisor and its other children (the standby).
func selfProcesses(start supervise.Started) []metrics.ProcessMemory {
	me := os.Getpid()
	procs := []metrics.ProcessMemory{{Role: "serving", PID: me}}
	if !start.SupervisorAlive() {
		return procs // no supervisor, or an orphan whose supervisor died
	}
	sup := start.Supervisor
	procs = append(procs, metrics.ProcessMemory{Role: "supervisor", PID: sup})
	kids, _ := procmem.Children(sup)
	for _, k := range kids {
		if k != me {
			procs = append(procs, metrics.ProcessMemory{Role: "standby", PID: k})
		}
	}
	return procs
}
