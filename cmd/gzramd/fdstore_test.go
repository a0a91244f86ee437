package main

import (
	"github.com/gzramd/gzramd/internal/sdnotify"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gzramd/gzramd/internal/testneeds"
	"github.com/gzramd/gzramd/pkg/pipeline"
)

// TestStateThroughSystemdsStore hands a state to a stand-in for systemd's
// notify socket, and gets it back as systemd would pass it to the next
// process: the same memory, under the same names.
func TestStateThroughSystemdsStore(t *testing.T) {
	st, err := pipeline.NewState("fdstore-test")
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.Header.Grow(4096); err != nil {
		t.Fatal(err)
	}
	mem, err := st.Header.Map(0, 4096)
	if err != nil {
		t.Fatal(err)
	}
	copy(mem, "written before the handover")
	unix.Munmap(mem)

	fake := listenNotify(t, false)
	if err := storeState(sdnotify.New(fake.addr), st); err != nil {
		t.Fatal(err)
	}
	// What systemd would do: keep the descriptors, and pass them to the
	// next process from 3 on, with their names.
	files, names, ok := fake.stored(len(pipeline.StateFileNames), 10*time.Second)
	if !ok {
		t.Fatalf("%d of %d files stored", len(files), len(pipeline.StateFileNames))
	}
	// systemd passes them to the next process from descriptor 3 on, in
	// any order (reversed here): the names say which is which.
	cmd := exec.Command(os.Args[0], "-test.run=^TestStateFromSystemdChild$", "-test.v")
	var passedNames []string
	for i := len(files) - 1; i >= 0; i-- {
		cmd.ExtraFiles = append(cmd.ExtraFiles, files[i])
		passedNames = append(passedNames, names[i])
	}
	cmd.Env = append(os.Environ(), "GZRAMD_TEST_LISTEN_FDS="+strconv.Itoa(len(files)), "LISTEN_FDNAMES="+strings.Join(passedNames, ":"))
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestStateFromSystemdChild") {
		t.Fatalf("the next process: %v\n%s", err, out)
	}
}

// TestStateFromSystemdChild is the process TestStateThroughSystemdsStore
// passes the state to, as systemd would.
func TestStateFromSystemdChild(t *testing.T) {
	n := os.Getenv("GZRAMD_TEST_LISTEN_FDS")
	if n == "" {
		testneeds.Helper(t, "TestStateThroughSystemdsStore")
	}
	t.Setenv("LISTEN_PID", strconv.Itoa(os.Getpid()))
	t.Setenv("LISTEN_FDS", n)
	back, err := stateFromSystemd()
	if err != nil || back == nil {
		t.Fatalf("state from systemd: %v, %v", back, err)
	}
	mem, err := back.Header.Map(0, 4096)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Munmap(mem)
	if !strings.HasPrefix(string(mem), "written before the handover") {
		t.Fatalf("the header passed back reads %q", mem[:32])
	}
	if os.Getenv("LISTEN_FDS") != "" {
		t.Error("LISTEN_FDS left for the serving process")
	}
}
