package main

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gzramd/gzramd/internal/testneeds"
)

// fakeNotify plays systemd's notify socket (sd_notify): it hands on each
// message with the descriptors it carries (FDSTORE=1).
type fakeNotify struct {
	addr string // NOTIFY_SOCKET's value
	msgs chan notifyMsg
}

type notifyMsg struct {
	text  string
	files []*os.File
}

// listenNotify listens on a socket in a temporary directory, or, with
// abstract, on an abstract name (NOTIFY_SOCKET=@name).
func listenNotify(t *testing.T, abstract bool) *fakeNotify {
	t.Helper()
	n := &fakeNotify{addr: filepath.Join(t.TempDir(), "notify"), msgs: make(chan notifyMsg, 64)}
	name := n.addr
	if abstract {
		n.addr = "@gzramd-test-" + filepath.Base(filepath.Dir(name))
		name = "\x00" + n.addr[1:]
	}
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: name, Net: "unixgram"})
	if err != nil {
		if abstract {
			testneeds.Machine(t, "abstract unix sockets (a Linux network namespace has them): %v", err)
		}
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	go func() {
		defer close(n.msgs)
		for {
			buf, oob := make([]byte, 4096), make([]byte, 128)
			k, oobn, _, _, err := conn.ReadMsgUnix(buf, oob)
			if err != nil {
				return
			}
			m := notifyMsg{text: string(buf[:k])}
			cms, _ := unix.ParseSocketControlMessage(oob[:oobn])
			for _, cm := range cms {
				if fds, err := unix.ParseUnixRights(&cm); err == nil {
					for _, fd := range fds {
						m.files = append(m.files, os.NewFile(uintptr(fd), "stored"))
					}
				}
			}
			n.msgs <- m
		}
	}()
	return n
}

// expect returns the next message that starts with prefix, skipping
// others, within timeout; ok is false if none came.
func (n *fakeNotify) expect(prefix string, timeout time.Duration) (notifyMsg, bool) {
	deadline := time.After(timeout)
	for {
		select {
		case m, open := <-n.msgs:
			if !open {
				return notifyMsg{}, false
			}
			if strings.HasPrefix(m.text, prefix) {
				return m, true
			}
			for _, f := range m.files {
				f.Close()
			}
		case <-deadline:
			return notifyMsg{}, false
		}
	}
}

// stored waits for the state's files in the store (FDSTORE=1, one per
// message, named): the files and their names, in the order they came.
func (n *fakeNotify) stored(count int, timeout time.Duration) (files []*os.File, names []string, ok bool) {
	for range count {
		m, ok := n.expect("FDSTORE=1\nFDNAME=", timeout)
		if !ok || len(m.files) != 1 {
			return files, names, false
		}
		files = append(files, m.files[0])
		names = append(names, strings.TrimPrefix(m.text, "FDSTORE=1\nFDNAME="))
	}
	return files, names, true
}
