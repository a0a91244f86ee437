package main

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

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

	sock := filepath.Join(t.TempDir(), "notify")
	l, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: sock, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	n := &notifier{addr: sock}
	if err := n.storeState(st); err != nil {
		t.Fatal(err)
	}
	// What systemd would do: keep the descriptors, and pass them to the
	// next process from 3 on, with their names.
	var names []string
	var fds []int
	for range pipeline.StateFileNames {
		buf, oob := make([]byte, 256), make([]byte, 64)
		k, oobn, _, _, err := l.ReadMsgUnix(buf, oob)
		if err != nil {
			t.Fatal(err)
		}
		msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil || len(msgs) != 1 {
			t.Fatalf("control messages %v, %v", msgs, err)
		}
		got, err := unix.ParseUnixRights(&msgs[0])
		if err != nil || len(got) != 1 {
			t.Fatalf("rights %v, %v", got, err)
		}
		fds = append(fds, got[0])
		msg := string(buf[:k])
		name, ok := strings.CutPrefix(msg, "FDSTORE=1\nFDNAME=")
		if !ok {
			t.Fatalf("message %q", msg)
		}
		names = append(names, name)
	}
	// Passed in reverse order: the names, not the order, say which is which.
	high := 100
	for i := len(fds) - 1; i >= 0; i-- {
		if err := unix.Dup2(fds[i], high); err != nil {
			t.Fatal(err)
		}
		unix.Close(fds[i])
		fds[i] = high
		high++
	}
	base := 3
	saved := make([]int, len(fds))
	for i := range fds {
		// Keep whatever the test binary has at 3.. to put it back.
		saved[i], _ = unix.FcntlInt(uintptr(base+i), unix.F_DUPFD_CLOEXEC, 200)
	}
	defer func() {
		for i, s := range saved {
			if s >= 0 {
				unix.Dup2(s, base+i)
				unix.Close(s)
			}
		}
	}()
	var passedNames []string
	for i := range fds {
		j := len(fds) - 1 - i
		if err := unix.Dup2(fds[j], base+i); err != nil {
			t.Fatal(err)
		}
		unix.Close(fds[j])
		passedNames = append(passedNames, names[j])
	}
	t.Setenv("LISTEN_PID", strconv.Itoa(os.Getpid()))
	t.Setenv("LISTEN_FDS", strconv.Itoa(len(fds)))
	t.Setenv("LISTEN_FDNAMES", strings.Join(passedNames, ":"))
	back, err := stateFromSystemd()
	if err != nil || back == nil {
		t.Fatalf("state from systemd: %v, %v", back, err)
	}
	mem, err = back.Header.Map(0, 4096)
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
