// The serving process's side of the protocol: what its supervisor told it.

package supervise

import (
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gzramd/gzramd/internal/memfd"
)

// Started is what a serving process was told by the supervisor that
// started it, read from its environment (the Env constants above) by
// FromEnv. A standby is told the rest (Takeovers, DiedAt, HandedOver,
// Stopping) with the go on its handover socket (Receive sets them): read
// it again then.
type Started struct {
	// Serving: started by a supervisor (EnvServing); nothing below holds
	// without it.
	Serving bool
	// Supervisor is the supervisor's process ID (EnvSupervisor).
	Supervisor int
	// Standby: started ahead, to wait on its handover socket until a
	// serving process ends (EnvStandby).
	Standby bool
	// Released: the start environment has come (EnvTakeovers is set), at
	// once for a process started after another ended, with the go for a
	// standby.
	Released bool
	// Takeovers is how many serving processes ended before this one
	// (EnvTakeovers).
	Takeovers int
	// DiedAt is when the one before died, zero if none did (EnvDiedAt):
	// this process takes the device over from one that died.
	DiedAt time.Time
	// HandedOver: the one before handed over, an upgrade (EnvHandedOver).
	HandedOver bool
	// Stopping: a stop was asked for while none ran (EnvStopping).
	Stopping bool
	// ParentDeath is the signal this process is to get when the
	// supervisor dies, 0 for none (EnvParentDeath).
	ParentDeath syscall.Signal
	// The handover socket's and the lifeline's descriptors, -1 for none.
	handover, lifeline int
}

// FromEnv reads what the supervisor told this process.
func FromEnv() Started {
	s := Started{
		Serving:    os.Getenv(EnvServing) != "",
		Supervisor: atoi(os.Getenv(EnvSupervisor), 0),
		Standby:    os.Getenv(EnvStandby) != "",
		HandedOver: os.Getenv(EnvHandedOver) != "",
		Stopping:   os.Getenv(EnvStopping) != "",
		handover:   atoi(os.Getenv(EnvHandover), -1),
		lifeline:   atoi(os.Getenv(EnvLifeline), -1),
	}
	if v, ok := os.LookupEnv(EnvTakeovers); ok {
		s.Released, s.Takeovers = true, atoi(v, 0)
	}
	if ns, err := strconv.ParseInt(os.Getenv(EnvDiedAt), 10, 64); err == nil {
		s.DiedAt = time.Unix(0, ns)
	}
	if n := atoi(os.Getenv(EnvParentDeath), 0); n > 0 {
		s.ParentDeath = syscall.Signal(n)
	}
	return s
}

// SupervisorAlive reports whether this process's supervisor is still its
// parent: false without one, and for an orphan whose supervisor died.
func (s Started) SupervisorAlive() bool {
	return s.Serving && s.Supervisor != 0 && s.Supervisor == os.Getppid()
}

// Files takes over the memfds the supervisor passed (Config.Files), one
// for each name, from descriptor 3 on.
func (s Started) Files(names []string) ([]*memfd.File, error) {
	files := make([]*memfd.File, 0, len(names))
	for i, name := range names {
		f, err := memfd.Open(3 + i)
		if err != nil {
			memfd.CloseAll(files...)
			return nil, fmt.Errorf("supervise: the %s file: %w", name, err)
		}
		files = append(files, f)
	}
	return files, nil
}

// SetParentDeath has this serving process get the signal its supervisor
// asked for (ParentDeath) when the supervisor dies: an exec of the
// process's own (a binary with file capabilities) clears it. It reports
// whether the supervisor died already.
func (s Started) SetParentDeath() (supervisorGone bool, err error) {
	if s.ParentDeath == 0 {
		return false, nil
	}
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(s.ParentDeath), 0, 0, 0); err != nil {
		return false, fmt.Errorf("supervise: prctl(PR_SET_PDEATHSIG): %w", err)
	}
	return !s.SupervisorAlive(), nil
}

// HandoverSocket returns the serving process's handover socket, if its
// supervisor gave it one.
func (s Started) HandoverSocket() (*os.File, bool) {
	if s.handover < 3 {
		return nil, false
	}
	unix.CloseOnExec(s.handover)
	return os.NewFile(uintptr(s.handover), "handover"), true
}

// HoldLifeline arms the lifeline the supervisor gave this serving process
// (EnvLifeline), if any: a thread of its own takes the lock in the
// lifeline's page and holds it for as long as the process lives. It must
// come after any exec of the process's own, since an exec releases the
// lock as an exit does.
func (s Started) HoldLifeline() error {
	if s.lifeline < 3 {
		return nil
	}
	return holdLifeline(s.lifeline)
}

func atoi(s string, none int) int {
	n, err := strconv.Atoi(s)
	if err != nil {
		return none
	}
	return n
}
