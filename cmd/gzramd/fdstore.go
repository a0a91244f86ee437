// The state's memfds in systemd's file descriptor store, and back.

package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/gzramd/gzramd/internal/memfd"
	"github.com/gzramd/gzramd/internal/sdnotify"
	"github.com/gzramd/gzramd/pkg/pipeline"
)

// fdNamePrefix names the state's descriptors in systemd's store:
// "gzramd-state-header", "gzramd-state-arenas", ...
const fdNamePrefix = "gzramd-state-"

// listenFDsStart is the first descriptor systemd passes (SD_LISTEN_FDS_START).
const listenFDsStart = 3

// stateFromSystemd returns the state systemd handed back from its file
// descriptor store ($LISTEN_FDS, $LISTEN_FDNAMES, for this process), or
// nil when it handed none. A partial set is an error: the state is whole
// or it is not gzramd's to serve.
func stateFromSystemd() (*pipeline.State, error) {
	if pid, err := strconv.Atoi(os.Getenv("LISTEN_PID")); err != nil || pid != os.Getpid() {
		return nil, nil
	}
	n, err := strconv.Atoi(os.Getenv("LISTEN_FDS"))
	if err != nil || n <= 0 {
		return nil, nil
	}
	names := strings.Split(os.Getenv("LISTEN_FDNAMES"), ":")
	for _, v := range []string{"LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"} {
		os.Unsetenv(v) // not for the serving process
	}
	byName := map[string]int{}
	for i := range n {
		fd := listenFDsStart + i
		unix.CloseOnExec(fd)
		if i < len(names) && strings.HasPrefix(names[i], fdNamePrefix) {
			byName[strings.TrimPrefix(names[i], fdNamePrefix)] = fd
		}
	}
	if len(byName) == 0 {
		return nil, nil
	}
	files := make([]*memfd.File, len(pipeline.StateFileNames))
	for i, name := range pipeline.StateFileNames {
		fd, ok := byName[name]
		if !ok {
			return nil, fmt.Errorf("systemd's file descriptor store holds part of a gzramd state (%v), without %q", names, name)
		}
		f, err := memfd.Open(fd)
		if err != nil {
			return nil, fmt.Errorf("systemd's file descriptor store: %s: %w", name, err)
		}
		files[i] = f
	}
	return pipeline.StateFrom(files)
}

// storeState hands the state's descriptors to systemd's store
// (FDSTORE=1), each named, so that the state outlives the supervisor too
// when the unit allows it (FileDescriptorStoreMax=).
func storeState(n *sdnotify.Notifier, st *pipeline.State) error {
	if !n.Enabled() {
		return nil
	}
	for i, f := range st.Files() {
		msg := "FDSTORE=1\nFDNAME=" + fdNamePrefix + pipeline.StateFileNames[i]
		if err := n.NotifyWithFDs(msg, f.Fd()); err != nil {
			return fmt.Errorf("handing %s to systemd's file descriptor store: %w", f.Name(), err)
		}
	}
	return nil
}
