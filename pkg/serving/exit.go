package serving

import (
	"fmt"
	"syscall"
)

// ExitStatus ends gzramd with a status and no message: the process has
// said why already (supervise's Exit statuses).
type ExitStatus int

func (e ExitStatus) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// SupervisorGone is the signal a serving process gets when its supervisor
// dies while systemd keeps the state (PR_SET_PDEATHSIG): it serves on, an
// orphan (orphan.go).
const SupervisorGone = syscall.SIGUSR2
